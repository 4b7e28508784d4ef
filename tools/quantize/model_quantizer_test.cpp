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
  EXPECT_EQ(choose_tensor_type(q4k, "blk.0.attn_q.weight", 2, 64, 0, {2}, GgmlType::F32), GgmlType::Q5_0);
  const auto q6k = *parse_quantize_type("q6_k");
  EXPECT_EQ(choose_tensor_type(q6k, "blk.0.attn_q.weight", 2, 96, 0, {2}, GgmlType::F32), GgmlType::Q8_0);
  const auto q40 = *parse_quantize_type("q4_0");
  EXPECT_EQ(choose_tensor_type(q40, "blk.0.attn_q.weight", 2, 48, 0, {2}, GgmlType::F32), GgmlType::F16);
  EXPECT_EQ(choose_tensor_type(q40, "blk.0.attn_norm.weight", 1, 64, 0, {2}, GgmlType::F32), GgmlType::F32);
  EXPECT_EQ(choose_tensor_type(q40, "blk.0.attn_q.bias", 1, 64, 0, {2}, GgmlType::F32), GgmlType::F32);
}

TEST(ChooseTensorType, KeepsPositionAndTokenTypeEmbeddingsAsLlamaCpp) {
  const auto q80 = *parse_quantize_type("q8_0");
  EXPECT_EQ(choose_tensor_type(q80, "position_embd.weight", 2, 256, -1, {2}, GgmlType::F32), GgmlType::F32);
  EXPECT_EQ(choose_tensor_type(q80, "token_types.weight", 2, 256, -1, {2}, GgmlType::F16), GgmlType::F16);
  EXPECT_EQ(choose_tensor_type(q80, "token_embd.weight", 2, 256, -1, {2}, GgmlType::F32), GgmlType::Q8_0);
}

TEST(ChooseTensorType, KeepsMoeRoutersAndQuantizesExpertsAsLlamaCpp) {
  const auto q4k = *parse_quantize_type("q4_K");
  EXPECT_EQ(choose_tensor_type(q4k, "blk.0.ffn_gate_inp.weight", 2, 256, 0, {2}, GgmlType::F32), GgmlType::F32);
  EXPECT_EQ(choose_tensor_type(q4k, "blk.0.ffn_gate_exps.weight", 3, 256, 0, {2}, GgmlType::F32), GgmlType::Q4_K);
  EXPECT_EQ(choose_tensor_type(q4k, "blk.0.ffn_down_exps.weight", 3, 256, 0, {2}, GgmlType::F32), GgmlType::Q4_K);
}

// A hybrid (qwen35moe: Gated DeltaNet layers 0 and 2, full attention 1 and 3; MoE +
// shared expert; 4 experts) with every row a whole number of 256-blocks.
fs::path write_hybrid(const fs::path& dir, synthetic::Architecture arch, bool tied = false) {
  synthetic::SyntheticSpec spec;
  spec.architecture = arch;
  spec.vocab = synthetic::VocabKind::llama2;
  spec.node_modules = PICO_NODE_MODULES_DIR;
  spec.n_layers = 4;
  spec.n_embd = 256;
  spec.n_ff = 256;
  spec.n_head = 4;
  spec.n_head_kv = 2;
  spec.head_dim = 64;
  spec.full_attention_interval = 2;
  spec.ssm_state = 64;
  spec.ssm_groups = 2;
  spec.ssm_value_heads = 4;
  spec.n_expert = 4;
  spec.n_expert_used = 2;
  spec.n_ff_exp = 256;
  spec.n_ff_shexp = 256;
  spec.tied_embeddings = tied;
  spec.weight_type = GgmlType::F16;
  const fs::path path = dir / (std::string(synthetic::architecture_name(arch)) + (tied ? "_tied" : "") + ".gguf");
  synthetic::write_synthetic_model(spec, path);
  return path;
}

// Tensors llama.cpp never quantizes (llama-quant.cpp tensor_allows_quantization: 1-D,
// *_norm.weight, ffn_gate_inp.weight, ssm_conv1d; not ending in "weight").
bool kept_as_is(const std::string& name) {
  for (const char* part : {"_norm.weight", "ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "ssm_conv1d.weight",
                           "ssm_dt.bias"}) {
    if (name.find(part) != std::string::npos) return true;
  }
  return name.ends_with(".ssm_a");
}

class QuantizeHybrid : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("pico_quantize_hybrid_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(QuantizeHybrid, PlainTypesKeepTheF32TensorsLlamaCppKeeps) {
  for (synthetic::Architecture arch : {synthetic::Architecture::qwen35moe, synthetic::Architecture::qwen3next}) {
    const fs::path source = write_hybrid(dir_, arch);
    auto in = gguf::Model::open(source);
    for (const char* name : {"q8_0", "q4_0", "q6_K", "iq4_nl"}) {
      SCOPED_TRACE(std::string(synthetic::architecture_name(arch)) + " " + name);
      const auto plan = parse_quantize_type(name);
      const fs::path out = dir_ / (std::string(name) + ".gguf");
      quantize_model(source, out, *plan);
      auto q = gguf::Model::open(out);
      ASSERT_EQ(q->tensors().size(), in->tensors().size());
      int conv = 0, matrices = 0;
      for (const gguf::TensorInfo& t : q->tensors()) {
        if (kept_as_is(t.name)) {
          EXPECT_EQ(t.type, GgmlType::F32) << t.name;
          conv += t.name.find("ssm_conv1d") != std::string::npos;
        } else {
          // attn_qkv, attn_gate, ssm_beta/ssm_alpha/ssm_ba, ssm_out, experts, shared
          // expert, attention: all quantized.
          EXPECT_EQ(t.type, plan->base_type) << t.name;
          ++matrices;
        }
      }
      EXPECT_EQ(conv, 2);
      EXPECT_GE(matrices, 30);
    }
  }
}

TEST_F(QuantizeHybrid, Q4KMCountsAttnQkvAsAttnV) {
  const fs::path source = write_hybrid(dir_, synthetic::Architecture::qwen35moe);
  const fs::path out = dir_ / "q4_k_m.gguf";
  quantize_model(source, out, *parse_quantize_type("Q4_K_M"));
  auto q = gguf::Model::open(out);
  auto type = [&](const std::string& name) {
    const gguf::TensorInfo* t = q->find_tensor(name);
    EXPECT_NE(t, nullptr) << name;
    return t ? t->type : GgmlType::F16;  // (never expected here)
  };
  // use_more_bits over 4 layers: layers 2 (every third after the first eighth) and 3
  // (the last eighth). llama.cpp counts attn_v and attn_qkv tensors in layer order:
  // one per layer, attn_qkv in the linear layers 0 and 2, attn_v in 1 and 3.
  EXPECT_EQ(type("blk.0.attn_qkv.weight"), GgmlType::Q4_K);
  EXPECT_EQ(type("blk.1.attn_v.weight"), GgmlType::Q4_K);
  EXPECT_EQ(type("blk.2.attn_qkv.weight"), GgmlType::Q6_K);
  EXPECT_EQ(type("blk.3.attn_v.weight"), GgmlType::Q6_K);
  for (int layer = 0; layer < 4; ++layer) {
    const std::string b = "blk." + std::to_string(layer) + ".";
    const GgmlType down = layer >= 2 ? GgmlType::Q6_K : GgmlType::Q4_K;
    EXPECT_EQ(type(b + "ffn_down_exps.weight"), down) << layer;
    EXPECT_EQ(type(b + "ffn_down_shexp.weight"), down) << layer;
    EXPECT_EQ(type(b + "ffn_gate_exps.weight"), GgmlType::Q4_K);
    EXPECT_EQ(type(b + "ffn_up_shexp.weight"), GgmlType::Q4_K);
    EXPECT_EQ(type(b + "ffn_gate_inp.weight"), GgmlType::F32);
    EXPECT_EQ(type(b + "ffn_gate_inp_shexp.weight"), GgmlType::F32);
  }
  for (const char* name : {"blk.0.attn_gate.weight", "blk.0.ssm_beta.weight", "blk.0.ssm_alpha.weight",
                           "blk.0.ssm_out.weight", "blk.1.attn_q.weight", "blk.1.attn_k.weight",
                           "blk.1.attn_output.weight", "token_embd.weight"}) {
    EXPECT_EQ(type(name), GgmlType::Q4_K) << name;
  }
  for (const char* name : {"blk.0.ssm_conv1d.weight", "blk.0.ssm_a", "blk.0.ssm_dt.bias", "blk.0.ssm_norm.weight",
                           "blk.1.attn_q_norm.weight"}) {
    EXPECT_EQ(type(name), GgmlType::F32) << name;
  }
  EXPECT_EQ(type("output.weight"), GgmlType::Q6_K);
}

TEST_F(QuantizeHybrid, TiedEmbeddingsGetTheHeadsTypeInMixes) {
  const fs::path source = write_hybrid(dir_, synthetic::Architecture::qwen35, /*tied=*/true);
  quantize_model(source, dir_ / "mix.gguf", *parse_quantize_type("Q4_K_M"));
  EXPECT_EQ(gguf::Model::open(dir_ / "mix.gguf")->find_tensor("token_embd.weight")->type, GgmlType::Q6_K);
  quantize_model(source, dir_ / "plain.gguf", *parse_quantize_type("q4_0"));
  EXPECT_EQ(gguf::Model::open(dir_ / "plain.gguf")->find_tensor("token_embd.weight")->type, GgmlType::Q4_0);
}

TEST(ChooseTensorType, EightExpertModelsGetMoreBitsForAttentionInMixes) {
  const auto q4km = *parse_quantize_type("Q4_K_M");
  const QuantizeModelInfo eight{4, 8, false}, four{4, 4, false};
  EXPECT_EQ(choose_tensor_type(q4km, "blk.0.attn_qkv.weight", 2, 256, 0, eight, GgmlType::F16), GgmlType::Q8_0);
  EXPECT_EQ(choose_tensor_type(q4km, "blk.1.attn_v.weight", 2, 256, 1, eight, GgmlType::F16), GgmlType::Q8_0);
  EXPECT_EQ(choose_tensor_type(q4km, "blk.1.attn_k.weight", 2, 256, 1, eight, GgmlType::F16), GgmlType::Q8_0);
  EXPECT_EQ(choose_tensor_type(q4km, "blk.1.attn_output.weight", 2, 256, 1, eight, GgmlType::F16), GgmlType::Q5_K);
  EXPECT_EQ(choose_tensor_type(q4km, "blk.1.attn_q.weight", 2, 256, 1, eight, GgmlType::F16), GgmlType::Q4_K);
  EXPECT_EQ(choose_tensor_type(q4km, "blk.1.attn_k.weight", 2, 256, 1, four, GgmlType::F16), GgmlType::Q4_K);
  EXPECT_EQ(choose_tensor_type(q4km, "blk.1.attn_output.weight", 2, 256, 1, four, GgmlType::F16), GgmlType::Q4_K);
  // Q5_K_M keeps attn_output; plain types are pure.
  const auto q5km = *parse_quantize_type("Q5_K_M");
  EXPECT_EQ(choose_tensor_type(q5km, "blk.1.attn_output.weight", 2, 256, 1, eight, GgmlType::F16), GgmlType::Q5_K);
  const auto q40 = *parse_quantize_type("q4_0");
  EXPECT_EQ(choose_tensor_type(q40, "blk.1.attn_k.weight", 2, 256, 1, eight, GgmlType::F16), GgmlType::Q4_0);
}

TEST(ChooseTensorType, MixRulesForFfnDownFollowLlamaCpp) {
  // Q3_K_M: ffn_down Q5_K in the first sixteenth of the layers, else Q4_K; Q4_K_S:
  // Q5_K in the first eighth.
  const auto q3km = *parse_quantize_type("Q3_K_M");
  const auto q4ks = *parse_quantize_type("Q4_K_S");
  const QuantizeModelInfo layers32{32, 0, false};
  EXPECT_EQ(choose_tensor_type(q3km, "blk.1.ffn_down.weight", 2, 256, 1, layers32, GgmlType::F16), GgmlType::Q5_K);
  EXPECT_EQ(choose_tensor_type(q3km, "blk.2.ffn_down.weight", 2, 256, 2, layers32, GgmlType::F16), GgmlType::Q4_K);
  EXPECT_EQ(choose_tensor_type(q3km, "blk.2.attn_output.weight", 2, 256, 2, layers32, GgmlType::F16), GgmlType::Q4_K);
  EXPECT_EQ(choose_tensor_type(q4ks, "blk.3.ffn_down.weight", 2, 256, 3, layers32, GgmlType::F16), GgmlType::Q5_K);
  EXPECT_EQ(choose_tensor_type(q4ks, "blk.4.ffn_down.weight", 2, 256, 4, layers32, GgmlType::F16), GgmlType::Q4_K);
}

TEST(ChooseTensorType, HybridRowsThatDoNotFillBlocksFallBackAsLlamaCpp) {
  const QuantizeModelInfo info{4, 0, false};
  auto choose = [&](const char* type, const char* name, uint64_t row) {
    return choose_tensor_type(*parse_quantize_type(type), name, 2, row, 0, info, GgmlType::F16);
  };
  // ssm_out rows are value_dim long: 96 = 3 x 32.
  EXPECT_EQ(choose("q4_K", "blk.0.ssm_out.weight", 96), GgmlType::Q5_0);
  EXPECT_EQ(choose("q6_K", "blk.0.ssm_out.weight", 96), GgmlType::Q8_0);
  EXPECT_EQ(choose("q5_K", "blk.0.ssm_out.weight", 96), GgmlType::Q5_1);
  EXPECT_EQ(choose("q2_K", "blk.0.ssm_out.weight", 96), GgmlType::Q4_0);
  EXPECT_EQ(choose("q3_K", "blk.0.ssm_out.weight", 96), GgmlType::Q4_0);
  EXPECT_EQ(choose("iq4_xs", "blk.0.ssm_out.weight", 96), GgmlType::IQ4_NL);
  EXPECT_EQ(choose("tq2_0", "blk.0.ssm_out.weight", 96), GgmlType::Q4_0);
  EXPECT_EQ(choose("q2_0", "blk.0.ssm_out.weight", 96), GgmlType::Q4_0);
  // 48: no 32-block fits either.
  EXPECT_EQ(choose("q4_K", "blk.0.ssm_out.weight", 48), GgmlType::F16);
  EXPECT_EQ(choose("iq4_nl", "blk.0.ssm_beta.weight", 48), GgmlType::F16);
  EXPECT_EQ(choose("q8_0", "blk.0.ssm_out.weight", 48), GgmlType::F16);
  // The conv kernel (rows of K = 4 taps) is never quantized, whatever the type.
  for (const char* type : {"q8_0", "q4_0", "q6_K", "iq4_nl", "Q4_K_M"}) {
    EXPECT_EQ(choose_tensor_type(*parse_quantize_type(type), "blk.0.ssm_conv1d.weight", 2, 4, 0, info, GgmlType::F32),
              GgmlType::F32)
        << type;
  }
  // 1-D: ssm_a (no .weight suffix), ssm_dt.bias, ssm_norm, the shared-expert gate.
  for (const char* name : {"blk.0.ssm_a", "blk.0.ssm_dt.bias", "blk.0.ssm_norm.weight", "blk.0.ffn_gate_inp_shexp.weight"}) {
    EXPECT_EQ(choose_tensor_type(*parse_quantize_type("q8_0"), name, 1, 256, 0, info, GgmlType::F32), GgmlType::F32)
        << name;
  }
}

TEST(ChooseTensorType, Gpt2AttnQkvGetsTheAttnVRule) {
  const auto q4km = *parse_quantize_type("Q4_K_M");
  const QuantizeModelInfo info{8, 0, false};
  EXPECT_EQ(choose_tensor_type(q4km, "blk.0.attn_qkv.weight", 2, 256, 0, info, GgmlType::F16), GgmlType::Q6_K);
  EXPECT_EQ(choose_tensor_type(q4km, "blk.1.attn_qkv.weight", 2, 256, 1, info, GgmlType::F16), GgmlType::Q4_K);
}

TEST(ParseQuantizeType, KnowsLlamaCppNamesAndRefusesOthers) {
  EXPECT_EQ(parse_quantize_type("Q4_K_M")->file_type, 15u);
  EXPECT_EQ(parse_quantize_type("q8_0")->base_type, GgmlType::Q8_0);
  EXPECT_FALSE(parse_quantize_type("q9_9"));
}

}  // namespace
}  // namespace pico::tools
