// Generated models: tensors, shapes, types and metadata as llama.cpp expects them
// (read back with the GGUF reader), scales, and determinism.
#include "synthetic/synthetic_model.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <unistd.h>

#include "backend/recording_backend.hpp"
#include "gguf/reader.hpp"
#include "model/model.hpp"
#include "quant/float_convert.hpp"
#include "state/kv_cache.hpp"

namespace pico::synthetic {
namespace {

namespace fs = std::filesystem;
const fs::path kNodeModules = PICO_NODE_MODULES_DIR;

const Vocabulary& vocab(VocabKind kind) {
  static std::map<VocabKind, std::unique_ptr<Vocabulary>> cache;
  auto& slot = cache[kind];
  if (!slot) slot = std::make_unique<Vocabulary>(load_vocabulary(kind, kNodeModules));
  return *slot;
}

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("pico_synthetic_test_" + std::to_string(::getpid()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return std::move(s).str();
}

SyntheticSpec small_spec(Architecture arch, VocabKind kind) {
  SyntheticSpec spec;
  spec.architecture = arch;
  spec.vocab = kind;
  spec.node_modules = kNodeModules;
  spec.n_layers = 2;
  spec.n_embd = 32;
  spec.n_ff = 64;
  spec.n_head = 4;
  spec.n_head_kv = arch == Architecture::gpt2 ? 4 : 2;
  spec.n_ctx_train = 64;
  return spec;
}

std::unique_ptr<gguf::Model> build_and_open(const SyntheticSpec& spec, const fs::path& path) {
  build_synthetic_model(spec, vocab(spec.vocab)).write(path);
  return gguf::Model::open(path);
}

std::vector<float> tensor_floats(const gguf::Model& model, const std::string& name) {
  const gguf::TensorInfo* info = model.find_tensor(name);
  if (!info) throw std::runtime_error("no tensor " + name);
  std::span<const uint8_t> bytes = model.tensor_data(*info);
  std::vector<float> out(info->elements);
  for (size_t i = 0; i < out.size(); ++i) {
    if (info->type == GgmlType::F32) {
      std::memcpy(&out[i], bytes.data() + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      out[i] = info->type == GgmlType::F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
    }
  }
  return out;
}

void expect_tensor(const gguf::Model& model, const std::string& name, GgmlType type, std::vector<uint64_t> shape) {
  const gguf::TensorInfo* info = model.find_tensor(name);
  ASSERT_NE(info, nullptr) << name;
  EXPECT_EQ(info->type, type) << name;
  EXPECT_EQ(info->shape, shape) << name;
}

std::pair<double, double> mean_std(const std::vector<float>& v) {
  double sum = 0, sq = 0;
  for (float x : v) sum += x;
  const double mean = sum / static_cast<double>(v.size());
  for (float x : v) sq += (x - mean) * (x - mean);
  return {mean, std::sqrt(sq / static_cast<double>(v.size()))};
}

TEST(Architecture, NamesRoundTrip) {
  for (Architecture a : {Architecture::llama, Architecture::qwen2, Architecture::qwen3, Architecture::qwen3moe,
                         Architecture::gpt2, Architecture::gemma3}) {
    EXPECT_EQ(parse_architecture(architecture_name(a)), a);
  }
  EXPECT_FALSE(parse_architecture("mamba").has_value());
}

TEST(SyntheticSpec, Validation) {
  SyntheticSpec spec = small_spec(Architecture::llama, VocabKind::gpt2);
  EXPECT_NO_THROW(validate(spec));
  spec.n_head_kv = 3;
  EXPECT_THROW(validate(spec), std::invalid_argument);
  spec = small_spec(Architecture::gpt2, VocabKind::gpt2);
  spec.n_head_kv = 2;
  EXPECT_THROW(validate(spec), std::invalid_argument);
  spec = small_spec(Architecture::qwen2, VocabKind::gpt2);
  spec.head_dim = 16;  // 4 heads * 16 != 32
  EXPECT_THROW(validate(spec), std::invalid_argument);
  spec = small_spec(Architecture::qwen3, VocabKind::gpt2);
  spec.head_dim = 16;  // fine: qwen3 writes key_length
  EXPECT_NO_THROW(validate(spec));
  spec.weight_type = GgmlType::Q4_0;
  EXPECT_THROW(validate(spec), std::invalid_argument);
}

TEST(SyntheticModel, LlamaTensorsAndMetadata) {
  TempDir dir;
  const SyntheticSpec spec = small_spec(Architecture::llama, VocabKind::llama2);
  auto model = build_and_open(spec, dir / "llama.gguf");
  const gguf::Metadata& md = model->metadata();
  EXPECT_EQ(md.get_string("general.architecture"), "llama");
  EXPECT_EQ(md.get_string("general.name"), "synthetic-llama-llama2");
  EXPECT_EQ(md.get_int("llama.block_count"), 2);
  EXPECT_EQ(md.get_int("llama.context_length"), 64);
  EXPECT_EQ(md.get_int("llama.embedding_length"), 32);
  EXPECT_EQ(md.get_int("llama.feed_forward_length"), 64);
  EXPECT_EQ(md.get_int("llama.attention.head_count"), 4);
  EXPECT_EQ(md.get_int("llama.attention.head_count_kv"), 2);
  EXPECT_EQ(md.get_int("llama.rope.dimension_count"), 8);
  EXPECT_FLOAT_EQ(static_cast<float>(*md.get_float("llama.rope.freq_base")), 10000.0f);
  EXPECT_FLOAT_EQ(static_cast<float>(*md.get_float("llama.attention.layer_norm_rms_epsilon")), 1e-5f);
  EXPECT_EQ(md.find("llama.context_length")->type(), gguf::ValueType::UInt32);
  EXPECT_EQ(md.find("llama.rope.freq_base")->type(), gguf::ValueType::Float32);
  EXPECT_FALSE(md.contains("llama.attention.key_length"));
  EXPECT_EQ(md.get_int("general.file_type"), 0);
  EXPECT_EQ(md.get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(md.get_array("tokenizer.ggml.tokens")->items.size(), 32000u);

  EXPECT_EQ(model->tensors().size(), 2u + 2u * 9u + 1u);
  expect_tensor(*model, "token_embd.weight", GgmlType::F32, {32, 32000});
  expect_tensor(*model, "output_norm.weight", GgmlType::F32, {32});
  expect_tensor(*model, "output.weight", GgmlType::F32, {32, 32000});
  for (int i = 0; i < 2; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    expect_tensor(*model, b + "attn_norm.weight", GgmlType::F32, {32});
    expect_tensor(*model, b + "attn_q.weight", GgmlType::F32, {32, 32});
    expect_tensor(*model, b + "attn_k.weight", GgmlType::F32, {32, 16});
    expect_tensor(*model, b + "attn_v.weight", GgmlType::F32, {32, 16});
    expect_tensor(*model, b + "attn_output.weight", GgmlType::F32, {32, 32});
    expect_tensor(*model, b + "ffn_norm.weight", GgmlType::F32, {32});
    expect_tensor(*model, b + "ffn_gate.weight", GgmlType::F32, {32, 64});
    expect_tensor(*model, b + "ffn_up.weight", GgmlType::F32, {32, 64});
    expect_tensor(*model, b + "ffn_down.weight", GgmlType::F32, {64, 32});
  }
}

TEST(SyntheticModel, RopeScalingKeys) {
  TempDir dir;
  SyntheticSpec spec = small_spec(Architecture::llama, VocabKind::llama2);
  EXPECT_FALSE(build_and_open(spec, dir / "plain.gguf")->metadata().contains("llama.rope.scaling.type"));
  spec.rope_scaling = "yarn";
  spec.rope_scaling_factor = 4.0f;
  spec.rope_original_context = 16;
  auto model = build_and_open(spec, dir / "yarn.gguf");
  const gguf::Metadata& md = model->metadata();
  EXPECT_EQ(md.get_string("llama.rope.scaling.type"), "yarn");
  EXPECT_FLOAT_EQ(static_cast<float>(*md.get_float("llama.rope.scaling.factor")), 4.0f);
  EXPECT_EQ(md.get_int("llama.rope.scaling.original_context_length"), 16);
  spec.rope_scaling = "ntk";
  EXPECT_THROW(validate(spec), std::invalid_argument);
  spec = small_spec(Architecture::gpt2, VocabKind::gpt2);
  spec.rope_scaling = "linear";
  EXPECT_THROW(validate(spec), std::invalid_argument);  // no rope to scale
}

TEST(SyntheticModel, Qwen2HasQkvBiases) {
  TempDir dir;
  auto model = build_and_open(small_spec(Architecture::qwen2, VocabKind::gpt2), dir / "qwen2.gguf");
  EXPECT_EQ(model->metadata().get_string("general.architecture"), "qwen2");
  EXPECT_FLOAT_EQ(static_cast<float>(*model->metadata().get_float("qwen2.rope.freq_base")), 1e6f);
  expect_tensor(*model, "blk.1.attn_q.bias", GgmlType::F32, {32});
  expect_tensor(*model, "blk.1.attn_k.bias", GgmlType::F32, {16});
  expect_tensor(*model, "blk.1.attn_v.bias", GgmlType::F32, {16});
  EXPECT_EQ(model->find_tensor("blk.0.attn_q_norm.weight"), nullptr);
  EXPECT_EQ(model->tensors().size(), 2u + 2u * 12u + 1u);
}

TEST(SyntheticModel, Qwen3HeadDimAndQkNorms) {
  TempDir dir;
  SyntheticSpec spec = small_spec(Architecture::qwen3, VocabKind::gpt2);
  spec.head_dim = 16;  // 4 heads * 16 = 64 != n_embd 32, as in real Qwen3
  auto model = build_and_open(spec, dir / "qwen3.gguf");
  const gguf::Metadata& md = model->metadata();
  EXPECT_EQ(md.get_int("qwen3.attention.key_length"), 16);
  EXPECT_EQ(md.get_int("qwen3.attention.value_length"), 16);
  EXPECT_EQ(md.get_int("qwen3.rope.dimension_count"), 16);
  expect_tensor(*model, "blk.0.attn_q.weight", GgmlType::F32, {32, 64});
  expect_tensor(*model, "blk.0.attn_k.weight", GgmlType::F32, {32, 32});
  expect_tensor(*model, "blk.0.attn_output.weight", GgmlType::F32, {64, 32});
  expect_tensor(*model, "blk.0.attn_q_norm.weight", GgmlType::F32, {16});
  expect_tensor(*model, "blk.0.attn_k_norm.weight", GgmlType::F32, {16});
  EXPECT_EQ(model->find_tensor("blk.0.attn_q.bias"), nullptr);
}

TEST(SyntheticModel, Qwen3MoeExpertsAndRouter) {
  TempDir dir;
  SyntheticSpec spec = small_spec(Architecture::qwen3moe, VocabKind::gpt2);
  spec.head_dim = 16;
  spec.n_expert = 4;
  spec.n_expert_used = 2;
  spec.n_ff_exp = 48;
  spec.weight_type = GgmlType::F16;
  auto model = build_and_open(spec, dir / "qwen3moe.gguf");
  const gguf::Metadata& md = model->metadata();
  EXPECT_EQ(md.get_int("qwen3moe.expert_count"), 4);
  EXPECT_EQ(md.get_int("qwen3moe.expert_used_count"), 2);
  EXPECT_EQ(md.get_int("qwen3moe.expert_feed_forward_length"), 48);
  EXPECT_EQ(md.get_int("qwen3moe.attention.key_length"), 16);
  expect_tensor(*model, "blk.0.attn_q_norm.weight", GgmlType::F32, {16});
  expect_tensor(*model, "blk.1.ffn_gate_inp.weight", GgmlType::F32, {32, 4});  // routers stay F32
  expect_tensor(*model, "blk.1.ffn_gate_exps.weight", GgmlType::F16, {32, 48, 4});
  expect_tensor(*model, "blk.1.ffn_up_exps.weight", GgmlType::F16, {32, 48, 4});
  expect_tensor(*model, "blk.1.ffn_down_exps.weight", GgmlType::F16, {48, 32, 4});
  EXPECT_EQ(model->find_tensor("blk.0.ffn_gate.weight"), nullptr);
  spec.n_expert_used = 5;
  EXPECT_THROW(validate(spec), std::invalid_argument);
}

// The router's scale makes routing neither degenerate nor flat: over 48 tokens and 2
// layers every expert gets a share of the choices, tokens pick many different expert
// pairs, and the first expert's renormalised weight is well above 1/2 but never ~1.
TEST(SyntheticModel, Qwen3MoeRoutingIsVaried) {
  TempDir dir;
  SyntheticSpec spec = small_spec(Architecture::qwen3moe, VocabKind::gpt2);
  spec.n_embd = 64;
  spec.n_expert = 8;
  spec.n_expert_used = 2;
  auto file = build_and_open(spec, dir / "qwen3moe.gguf");
  auto model = model::Model::load(*file);
  auto cpu = backend::make_cpu_backend(2);
  backend::RecordingBackend be(*cpu);
  state::KvCache cache(model->kv_config(model->all_layers()), model->recurrent_config(model->all_layers()));
  std::vector<model::BatchToken> batch;
  for (int32_t i = 0; i < 48; ++i) batch.push_back({0, i, (i * 7919 + 13) % 50000, true});
  model->forward(be, batch, nullptr, model->all_layers(), cache);
  ASSERT_EQ(be.routes.size(), 2u * batch.size());
  std::map<int32_t, int> per_expert;
  std::set<std::vector<int32_t>> pairs;
  std::vector<float> first_weights;
  for (size_t r = 0; r < be.routes.size(); ++r) {
    for (int32_t e : be.routes[r]) ++per_expert[e];
    std::vector<int32_t> pair = be.routes[r];
    std::sort(pair.begin(), pair.end());
    pairs.insert(pair);
    first_weights.push_back(be.route_weights[r][0]);
  }
  for (int32_t e = 0; e < 8; ++e) EXPECT_GE(per_expert[e], 5) << "expert " << e << " is (almost) never chosen";
  EXPECT_GE(pairs.size(), 12u);
  std::sort(first_weights.begin(), first_weights.end());
  EXPECT_LT(first_weights.back(), 0.99f);
  const float median = first_weights[first_weights.size() / 2];
  EXPECT_GT(median, 0.55f);
  EXPECT_LT(median, 0.9f);
  std::printf("qwen3moe routing: %zu distinct pairs of 28, first weight median %.3f, max %.3f\n", pairs.size(), median,
              first_weights.back());
}

TEST(SyntheticModel, Gpt2FusedQkvAndBiases) {
  TempDir dir;
  auto model = build_and_open(small_spec(Architecture::gpt2, VocabKind::gpt2), dir / "gpt2.gguf");
  const gguf::Metadata& md = model->metadata();
  EXPECT_TRUE(md.contains("gpt2.attention.layer_norm_epsilon"));
  EXPECT_FALSE(md.contains("gpt2.attention.layer_norm_rms_epsilon"));
  EXPECT_FALSE(md.contains("gpt2.rope.freq_base"));
  expect_tensor(*model, "position_embd.weight", GgmlType::F32, {32, 64});
  expect_tensor(*model, "blk.0.attn_qkv.weight", GgmlType::F32, {32, 96});
  expect_tensor(*model, "blk.0.attn_qkv.bias", GgmlType::F32, {96});
  expect_tensor(*model, "blk.0.attn_output.bias", GgmlType::F32, {32});
  expect_tensor(*model, "blk.0.attn_norm.bias", GgmlType::F32, {32});
  expect_tensor(*model, "blk.0.ffn_norm.bias", GgmlType::F32, {32});
  expect_tensor(*model, "blk.0.ffn_up.bias", GgmlType::F32, {64});
  expect_tensor(*model, "blk.0.ffn_down.bias", GgmlType::F32, {32});
  expect_tensor(*model, "output_norm.bias", GgmlType::F32, {32});
  EXPECT_EQ(model->find_tensor("blk.0.ffn_gate.weight"), nullptr);
  EXPECT_EQ(model->tensors().size(), 3u + 2u * 12u + 2u);
}

TEST(SyntheticModel, Gemma3PostNorms) {
  TempDir dir;
  SyntheticSpec spec = small_spec(Architecture::gemma3, VocabKind::gpt2);
  spec.tied_embeddings = true;
  auto model = build_and_open(spec, dir / "gemma3.gguf");
  const gguf::Metadata& md = model->metadata();
  EXPECT_EQ(md.get_int("gemma3.attention.sliding_window"), 512);
  EXPECT_EQ(md.get_int("gemma3.attention.key_length"), 8);
  expect_tensor(*model, "blk.1.post_attention_norm.weight", GgmlType::F32, {32});
  expect_tensor(*model, "blk.1.post_ffw_norm.weight", GgmlType::F32, {32});
  expect_tensor(*model, "blk.1.attn_q_norm.weight", GgmlType::F32, {8});
  EXPECT_EQ(model->find_tensor("output.weight"), nullptr);
}

TEST(SyntheticModel, HalfTypesOnlyForMatrices) {
  TempDir dir;
  for (GgmlType type : {GgmlType::F16, GgmlType::BF16}) {
    SyntheticSpec spec = small_spec(Architecture::qwen2, VocabKind::gpt2);
    spec.weight_type = type;
    auto model = build_and_open(spec, dir / "half.gguf");
    EXPECT_EQ(model->metadata().get_int("general.file_type"), type == GgmlType::F16 ? 1 : 32);
    for (const gguf::TensorInfo& t : model->tensors()) {
      EXPECT_EQ(t.type, t.shape.size() == 2 ? type : GgmlType::F32) << t.name;
    }
    // The half weights are the f32 weights rounded.
    SyntheticSpec f32 = spec;
    f32.weight_type = GgmlType::F32;
    auto reference = build_and_open(f32, dir / "f32.gguf");
    const std::vector<float> a = tensor_floats(*model, "blk.0.ffn_up.weight");
    const std::vector<float> b = tensor_floats(*reference, "blk.0.ffn_up.weight");
    for (size_t i = 0; i < a.size(); ++i) {
      const float rounded = type == GgmlType::F16 ? fp16_to_fp32(fp32_to_fp16(b[i])) : bf16_to_fp32(fp32_to_bf16(b[i]));
      ASSERT_EQ(a[i], rounded);
    }
  }
}

TEST(SyntheticModel, TiedEmbeddingsOmitOutput) {
  TempDir dir;
  SyntheticSpec spec = small_spec(Architecture::llama, VocabKind::gpt2);
  spec.tied_embeddings = true;
  auto model = build_and_open(spec, dir / "tied.gguf");
  EXPECT_EQ(model->find_tensor("output.weight"), nullptr);
  // Tied: token_embd is the head, std kLogitStd / sqrt(n_embd).
  auto [mean, std_dev] = mean_std(tensor_floats(*model, "token_embd.weight"));
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(std_dev, kLogitStd / std::sqrt(32.0), 0.01);
}

TEST(SyntheticModel, WeightScales) {
  TempDir dir;
  auto model = build_and_open(small_spec(Architecture::llama, VocabKind::gpt2), dir / "scales.gguf");
  auto check = [&](const std::string& name, double mean, double std_dev) {
    auto [m, s] = mean_std(tensor_floats(*model, name));
    EXPECT_NEAR(m, mean, 0.05 * std::max(std_dev, 0.1)) << name;
    EXPECT_NEAR(s, std_dev, 0.05 * std_dev) << name;
  };
  check("token_embd.weight", 0.0, 1.0);
  check("output.weight", 0.0, kLogitStd / std::sqrt(32.0));
  check("blk.0.ffn_up.weight", 0.0, 1.0 / std::sqrt(32.0));
  check("blk.0.ffn_down.weight", 0.0, 1.0 / std::sqrt(64.0) / 2.0);  // sqrt(2 * 2 layers)
  check("blk.0.attn_output.weight", 0.0, 1.0 / std::sqrt(32.0) / 2.0);
  const std::vector<float> norm = tensor_floats(*model, "blk.1.ffn_norm.weight");
  for (float x : norm) {
    EXPECT_GT(x, 0.6f);
    EXPECT_LT(x, 1.4f);
  }
}

TEST(SyntheticModel, DeterministicBytes) {
  TempDir dir;
  SyntheticSpec spec = small_spec(Architecture::qwen3, VocabKind::gpt2);
  build_synthetic_model(spec, vocab(spec.vocab)).write(dir / "a.gguf");
  build_synthetic_model(spec, vocab(spec.vocab)).write(dir / "b.gguf");
  spec.seed = 2;
  build_synthetic_model(spec, vocab(spec.vocab)).write(dir / "c.gguf");
  const std::string a = file_bytes(dir / "a.gguf");
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, file_bytes(dir / "b.gguf"));
  const std::string c = file_bytes(dir / "c.gguf");
  EXPECT_EQ(a.size(), c.size());
  EXPECT_NE(a, c);
}

TEST(SyntheticModel, PinnedValues) {
  // The generator is platform-independent: these values must never change (tests
  // elsewhere may rely on the models a seed gives).
  TempDir dir;
  auto model = build_and_open(small_spec(Architecture::llama, VocabKind::gpt2), dir / "pinned.gguf");
  const std::vector<float> embd = tensor_floats(*model, "token_embd.weight");
  const std::vector<float> norm = tensor_floats(*model, "blk.0.attn_norm.weight");
  const uint32_t expected_embd[] = {0x3f4f54f7, 0xbf64bb71, 0xbde59ae0, 0xbf6e9a81};
  const uint32_t expected_norm[] = {0x3f51560c, 0x3f899f7f, 0x3f8594af, 0x3f380036};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(embd[i]), expected_embd[i]) << i << ": " << embd[i];
    EXPECT_EQ(std::bit_cast<uint32_t>(norm[i]), expected_norm[i]) << i << ": " << norm[i];
  }
}

TEST(SyntheticModel, WritesFileWithVocabularyFromNodeModules) {
  TempDir dir;
  SyntheticSpec spec = small_spec(Architecture::llama, VocabKind::gpt2);
  write_synthetic_model(spec, dir / "direct.gguf");
  auto model = gguf::Model::open(dir / "direct.gguf");
  EXPECT_EQ(model->metadata().get_string("tokenizer.ggml.pre"), "gpt-2");
  spec.node_modules = "/nonexistent";
  EXPECT_THROW(write_synthetic_model(spec, dir / "missing.gguf"), std::runtime_error);
}

}  // namespace
}  // namespace pico::synthetic
