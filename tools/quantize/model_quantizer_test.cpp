#include "quantize/model_quantizer.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "gguf/reader.hpp"
#include "quant/quantize.hpp"
#include "synthetic/synthetic_model.hpp"

namespace pico::tools {
namespace {

namespace fs = std::filesystem;

class QuantizeModel : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("pico_quantize_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    synthetic::SyntheticSpec spec;
    spec.architecture = synthetic::Architecture::llama;
    spec.vocab = synthetic::VocabKind::llama2;
    spec.node_modules = PICO_NODE_MODULES_DIR;
    spec.n_layers = 8;
    spec.n_embd = 256;
    spec.n_ff = 512;
    spec.n_head = 4;
    spec.n_head_kv = 2;
    spec.weight_type = GgmlType::F16;
    source_ = dir_ / "f16.gguf";
    synthetic::write_synthetic_model(spec, source_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Mean squared difference between two tensors, both read as floats.
  static double mean_squared_difference(const gguf::Model& a, const gguf::Model& b, const std::string& name) {
    const gguf::TensorInfo* ta = a.find_tensor(name);
    const gguf::TensorInfo* tb = b.find_tensor(name);
    std::vector<float> fa(ta->elements), fb(tb->elements);
    dequantize_row(ta->type, a.tensor_data(*ta).data(), fa.data(), static_cast<int64_t>(fa.size()));
    dequantize_row(tb->type, b.tensor_data(*tb).data(), fb.data(), static_cast<int64_t>(fb.size()));
    double sum = 0, norm = 0;
    for (size_t i = 0; i < fa.size(); ++i) {
      sum += (fa[i] - fb[i]) * (fa[i] - fb[i]);
      norm += fa[i] * fa[i];
    }
    return sum / norm;
  }

  fs::path dir_;
  fs::path source_;
};

TEST_F(QuantizeModel, PlainTypeQuantizesEveryMatrixAndKeepsVectors) {
  for (const char* name : {"q8_0", "q4_0", "q6_K", "iq4_nl"}) {
    SCOPED_TRACE(name);
    const auto plan = parse_quantize_type(name);
    ASSERT_TRUE(plan);
    const fs::path out = dir_ / (std::string(name) + ".gguf");
    const QuantizeReport report = quantize_model(source_, out, *plan);
    auto in = gguf::Model::open(source_);
    auto q = gguf::Model::open(out);
    ASSERT_EQ(q->tensors().size(), in->tensors().size());
    EXPECT_EQ(q->metadata().get_int("general.file_type"), plan->file_type);
    EXPECT_EQ(q->metadata().get_string("tokenizer.ggml.model"), in->metadata().get_string("tokenizer.ggml.model"));
    for (const gguf::TensorInfo& tensor : q->tensors()) {
      if (tensor.shape.size() == 1) {
        EXPECT_EQ(tensor.type, GgmlType::F32) << tensor.name;
      } else {
        EXPECT_EQ(tensor.type, plan->base_type) << tensor.name;
        // 8-bit keeps the weights within 1e-4 relative error, 4-bit within 1e-2.
        const double bound = plan->base_type == GgmlType::Q8_0 ? 1e-4 : 1.5e-2;
        EXPECT_LT(mean_squared_difference(*in, *q, tensor.name), bound) << tensor.name;
      }
    }
    EXPECT_LT(report.bytes_out, report.bytes_in);
  }
}

TEST_F(QuantizeModel, Q4KMGivesMoreBitsToOutputAndSomeLayers) {
  const auto plan = parse_quantize_type("Q4_K_M");
  ASSERT_TRUE(plan);
  const fs::path out = dir_ / "q4_k_m.gguf";
  quantize_model(source_, out, *plan);
  auto q = gguf::Model::open(out);
  EXPECT_EQ(q->find_tensor("output.weight")->type, GgmlType::Q6_K);
  EXPECT_EQ(q->find_tensor("blk.0.attn_q.weight")->type, GgmlType::Q4_K);
  // With 8 layers: layer 0 and 7 (the first and last eighth) and 3, 6 (every third
  // after the first eighth) get Q6_K for attn_v and ffn_down.
  std::map<int, GgmlType> expected = {{0, GgmlType::Q6_K}, {1, GgmlType::Q4_K}, {2, GgmlType::Q4_K}, {3, GgmlType::Q6_K},
                                      {4, GgmlType::Q4_K}, {5, GgmlType::Q4_K}, {6, GgmlType::Q6_K}, {7, GgmlType::Q6_K}};
  for (const auto& [layer, type] : expected) {
    EXPECT_EQ(q->find_tensor("blk." + std::to_string(layer) + ".attn_v.weight")->type, type) << layer;
    // ffn_down rows are n_ff = 512 long: a whole number of 256-blocks.
    EXPECT_EQ(q->find_tensor("blk." + std::to_string(layer) + ".ffn_down.weight")->type, type) << layer;
  }
}

TEST(ChooseTensorType, FallsBackWhenRowsDoNotFitTheBlock) {
  const auto q4k = *parse_quantize_type("q4_k");
  EXPECT_EQ(choose_tensor_type(q4k, "blk.0.attn_q.weight", 2, 64, 0, 2, GgmlType::F32), GgmlType::Q5_0);
  const auto q6k = *parse_quantize_type("q6_k");
  EXPECT_EQ(choose_tensor_type(q6k, "blk.0.attn_q.weight", 2, 96, 0, 2, GgmlType::F32), GgmlType::Q8_0);
  const auto q40 = *parse_quantize_type("q4_0");
  EXPECT_EQ(choose_tensor_type(q40, "blk.0.attn_q.weight", 2, 48, 0, 2, GgmlType::F32), GgmlType::F16);
  EXPECT_EQ(choose_tensor_type(q40, "blk.0.attn_norm.weight", 1, 64, 0, 2, GgmlType::F32), GgmlType::F32);
  EXPECT_EQ(choose_tensor_type(q40, "blk.0.attn_q.bias", 1, 64, 0, 2, GgmlType::F32), GgmlType::F32);
}

TEST(ChooseTensorType, KeepsPositionAndTokenTypeEmbeddingsAsLlamaCpp) {
  const auto q80 = *parse_quantize_type("q8_0");
  EXPECT_EQ(choose_tensor_type(q80, "position_embd.weight", 2, 256, -1, 2, GgmlType::F32), GgmlType::F32);
  EXPECT_EQ(choose_tensor_type(q80, "token_types.weight", 2, 256, -1, 2, GgmlType::F16), GgmlType::F16);
  EXPECT_EQ(choose_tensor_type(q80, "token_embd.weight", 2, 256, -1, 2, GgmlType::F32), GgmlType::Q8_0);
}

TEST(ChooseTensorType, KeepsMoeRoutersAndQuantizesExpertsAsLlamaCpp) {
  const auto q4k = *parse_quantize_type("q4_K");
  EXPECT_EQ(choose_tensor_type(q4k, "blk.0.ffn_gate_inp.weight", 2, 256, 0, 2, GgmlType::F32), GgmlType::F32);
  EXPECT_EQ(choose_tensor_type(q4k, "blk.0.ffn_gate_exps.weight", 3, 256, 0, 2, GgmlType::F32), GgmlType::Q4_K);
  EXPECT_EQ(choose_tensor_type(q4k, "blk.0.ffn_down_exps.weight", 3, 256, 0, 2, GgmlType::F32), GgmlType::Q4_K);
}

TEST(ParseQuantizeType, KnowsLlamaCppNamesAndRefusesOthers) {
  EXPECT_EQ(parse_quantize_type("Q4_K_M")->file_type, 15u);
  EXPECT_EQ(parse_quantize_type("q8_0")->base_type, GgmlType::Q8_0);
  EXPECT_FALSE(parse_quantize_type("q9_9"));
}

}  // namespace
}  // namespace pico::tools
