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
                         Architecture::gpt2, Architecture::gemma3, Architecture::qwen35, Architecture::qwen35moe,
                         Architecture::qwen3next}) {
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

// ---- hybrids (qwen35, qwen35moe, qwen3next) ------------------------------------
// The expected tensors are written out from llama.cpp's load_arch_tensors
// (src/models/qwen35.cpp, qwen35moe.cpp, qwen3next.cpp) for these sizes, not derived
// from the generator: embd 64, 4 heads of 32 (2 kv heads), 4 layers, full attention
// every 2nd (layers 1 and 3), linear layers with conv 4, state 16, 2 key heads, 4
// value heads: key_dim 32, value_dim 64, conv_dim 2*32 + 64 = 128.
SyntheticSpec hybrid_spec(Architecture arch) {
  SyntheticSpec spec = small_spec(arch, VocabKind::gpt2);
  spec.n_layers = 4;
  spec.n_embd = 64;
  spec.n_ff = 96;
  spec.n_head = 4;
  spec.n_head_kv = 2;
  spec.head_dim = 32;
  spec.full_attention_interval = 2;
  spec.rope_dims = 16;
  spec.ssm_conv_kernel = 4;
  spec.ssm_state = 16;
  spec.ssm_groups = 2;
  spec.ssm_value_heads = 4;
  spec.n_expert = 4;
  spec.n_expert_used = 2;
  spec.n_ff_exp = 48;
  spec.n_ff_shexp = 80;
  spec.weight_type = GgmlType::F16;
  return spec;
}

using Shapes = std::map<std::string, std::pair<GgmlType, std::vector<uint64_t>>>;

Shapes expected_hybrid_tensors(Architecture arch) {
  const GgmlType H = GgmlType::F16, F = GgmlType::F32;
  Shapes t;
  t["token_embd.weight"] = {H, {64, 50257}};
  t["output_norm.weight"] = {F, {64}};
  t["output.weight"] = {H, {64, 50257}};
  for (int i = 0; i < 4; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    t[b + "attn_norm.weight"] = {F, {64}};
    t[b + "post_attention_norm.weight"] = {F, {64}};
    if (i == 1 || i == 3) {
      t[b + "attn_q.weight"] = {H, {64, 2 * 4 * 32}};
      t[b + "attn_k.weight"] = {H, {64, 2 * 32}};
      t[b + "attn_v.weight"] = {H, {64, 2 * 32}};
      t[b + "attn_output.weight"] = {H, {4 * 32, 64}};
      t[b + "attn_q_norm.weight"] = {F, {32}};
      t[b + "attn_k_norm.weight"] = {F, {32}};
    } else {
      t[b + "attn_qkv.weight"] = {H, {64, 128}};
      t[b + "attn_gate.weight"] = {H, {64, 64}};
      t[b + "ssm_conv1d.weight"] = {F, {4, 128}};
      t[b + "ssm_dt.bias"] = {F, {4}};
      t[b + "ssm_a"] = {F, {4}};
      if (arch == Architecture::qwen3next) {
        t[b + "ssm_ba.weight"] = {H, {64, 8}};
      } else {
        t[b + "ssm_beta.weight"] = {H, {64, 4}};
        t[b + "ssm_alpha.weight"] = {H, {64, 4}};
      }
      t[b + "ssm_norm.weight"] = {F, {16}};
      t[b + "ssm_out.weight"] = {H, {64, 64}};
    }
    if (arch == Architecture::qwen35) {
      t[b + "ffn_gate.weight"] = {H, {64, 96}};
      t[b + "ffn_up.weight"] = {H, {64, 96}};
      t[b + "ffn_down.weight"] = {H, {96, 64}};
    } else {
      t[b + "ffn_gate_inp.weight"] = {F, {64, 4}};
      t[b + "ffn_gate_exps.weight"] = {H, {64, 48, 4}};
      t[b + "ffn_up_exps.weight"] = {H, {64, 48, 4}};
      t[b + "ffn_down_exps.weight"] = {H, {48, 64, 4}};
      t[b + "ffn_gate_inp_shexp.weight"] = {F, {64}};
      t[b + "ffn_gate_shexp.weight"] = {H, {64, 80}};
      t[b + "ffn_up_shexp.weight"] = {H, {64, 80}};
      t[b + "ffn_down_shexp.weight"] = {H, {80, 64}};
    }
  }
  return t;
}

class HybridModel : public ::testing::TestWithParam<Architecture> {};

TEST_P(HybridModel, TensorsExactlyAsLlamaCppLoadsThem) {
  TempDir dir;
  const Architecture arch = GetParam();
  auto model = build_and_open(hybrid_spec(arch), dir / "hybrid.gguf");
  const Shapes expected = expected_hybrid_tensors(arch);
  // Every tensor llama.cpp creates, and nothing else ("wrong number of tensors").
  EXPECT_EQ(model->tensors().size(), expected.size());
  for (const auto& [name, type_shape] : expected) expect_tensor(*model, name, type_shape.first, type_shape.second);
  for (const gguf::TensorInfo& t : model->tensors()) EXPECT_TRUE(expected.count(t.name)) << "unexpected " << t.name;
}

TEST_P(HybridModel, Metadata) {
  TempDir dir;
  const Architecture arch = GetParam();
  const std::string a(architecture_name(arch));
  auto model = build_and_open(hybrid_spec(arch), dir / "hybrid.gguf");
  const gguf::Metadata& md = model->metadata();
  EXPECT_EQ(md.get_string("general.architecture"), a);
  EXPECT_EQ(md.get_int(a + ".block_count"), 4);
  EXPECT_EQ(md.get_int(a + ".embedding_length"), 64);
  EXPECT_EQ(md.get_int(a + ".attention.head_count"), 4);
  EXPECT_EQ(md.get_int(a + ".attention.head_count_kv"), 2);
  EXPECT_EQ(md.get_int(a + ".attention.key_length"), 32);
  EXPECT_EQ(md.get_int(a + ".attention.value_length"), 32);
  EXPECT_EQ(md.get_int(a + ".rope.dimension_count"), 16);
  EXPECT_FLOAT_EQ(static_cast<float>(*md.get_float(a + ".rope.freq_base")), 1e7f);
  EXPECT_TRUE(md.contains(a + ".attention.layer_norm_rms_epsilon"));
  EXPECT_EQ(md.get_int(a + ".ssm.conv_kernel"), 4);
  EXPECT_EQ(md.get_int(a + ".ssm.inner_size"), 64);
  EXPECT_EQ(md.get_int(a + ".ssm.state_size"), 16);
  EXPECT_EQ(md.get_int(a + ".ssm.time_step_rank"), 4);
  EXPECT_EQ(md.get_int(a + ".ssm.group_count"), 2);
  EXPECT_EQ(md.get_int(a + ".full_attention_interval"), 2);
  EXPECT_FALSE(md.contains(a + ".attention.recurrent_layers"));
  EXPECT_FALSE(md.contains(a + ".nextn_predict_layers"));
  const gguf::Array* sections = md.get_array(a + ".rope.dimension_sections");
  if (arch == Architecture::qwen3next) {
    EXPECT_EQ(sections, nullptr);  // NEOX rope_ext: no sections
  } else {
    ASSERT_NE(sections, nullptr);
    // 8 rotated pairs: [3, 3, 2, 0] (s0 + s1 + s2 = 8, s0 >= s1 >= s2 >= s0 - 1).
    ASSERT_EQ(sections->items.size(), 4u);
    EXPECT_EQ(sections->element_type, gguf::ValueType::Int32);
    const int64_t want[] = {3, 3, 2, 0};
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(sections->items[i].as_int(), want[i]) << i;
  }
  if (arch == Architecture::qwen35) {
    EXPECT_FALSE(md.contains(a + ".expert_count"));
  } else {
    EXPECT_EQ(md.get_int(a + ".expert_count"), 4);
    EXPECT_EQ(md.get_int(a + ".expert_used_count"), 2);
    EXPECT_EQ(md.get_int(a + ".expert_feed_forward_length"), 48);
    EXPECT_EQ(md.get_int(a + ".expert_shared_feed_forward_length"), 80);
  }
}

TEST_P(HybridModel, DeterministicAndPerTensorStreams) {
  TempDir dir;
  SyntheticSpec spec = hybrid_spec(GetParam());
  build_synthetic_model(spec, vocab(spec.vocab)).write(dir / "a.gguf");
  build_synthetic_model(spec, vocab(spec.vocab)).write(dir / "b.gguf");
  const std::string a = file_bytes(dir / "a.gguf");
  EXPECT_EQ(a, file_bytes(dir / "b.gguf"));
  spec.seed = 2;
  build_synthetic_model(spec, vocab(spec.vocab)).write(dir / "c.gguf");
  EXPECT_NE(a, file_bytes(dir / "c.gguf"));
  // A tensor's values depend on the seed and its name only, not on other sizes.
  auto one = build_and_open(hybrid_spec(GetParam()), dir / "one.gguf");
  SyntheticSpec other = hybrid_spec(GetParam());
  other.n_ff = 128;
  other.n_expert = 8;
  other.n_ff_shexp = 32;
  other.full_attention_interval = 4;  // layer 1 becomes linear, layer 3 stays full attention
  auto two = build_and_open(other, dir / "two.gguf");
  for (const char* name : {"blk.0.attn_qkv.weight", "blk.0.ssm_conv1d.weight", "blk.0.ssm_a", "blk.0.ssm_dt.bias",
                           "blk.3.attn_q.weight", "blk.2.ssm_out.weight"}) {
    EXPECT_EQ(tensor_floats(*one, name), tensor_floats(*two, name)) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Arch, HybridModel,
                         ::testing::Values(Architecture::qwen35, Architecture::qwen35moe, Architecture::qwen3next),
                         [](const ::testing::TestParamInfo<Architecture>& param_info) {
                           return std::string(architecture_name(param_info.param));
                         });

TEST(SyntheticSpec, HybridValidation) {
  auto refused = [](const SyntheticSpec& spec, const std::string& words) {
    try {
      validate(spec);
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted a spec that should be refused (" << words << ")";
  };
  for (Architecture arch : {Architecture::qwen35, Architecture::qwen35moe, Architecture::qwen3next}) {
    SCOPED_TRACE(std::string(architecture_name(arch)));
    const SyntheticSpec good = hybrid_spec(arch);
    EXPECT_NO_THROW(validate(good));
    SyntheticSpec s = good;
    s.ssm_value_heads = 3;  // not a multiple of 2 key heads
    refused(s, "multiple of ssm groups");
    s = good;
    s.ssm_inner = 48;  // != 16 * 4
    refused(s, "ssm inner size");
    s.ssm_inner = 64;
    EXPECT_NO_THROW(validate(s));
    s = good;
    s.rope_dims = 15;
    refused(s, "rope dims");
    s.rope_dims = 34;  // > head dim 32
    refused(s, "rope dims");
    s.rope_dims = 32;  // full rope is allowed
    EXPECT_NO_THROW(validate(s));
    s = good;
    s.full_attention_interval = 1;  // no Gated DeltaNet layer
    refused(s, "full attention interval");
    s.full_attention_interval = 5;  // > 4 layers: no attention layer
    refused(s, "full attention interval");
    s.full_attention_interval = 4;
    EXPECT_NO_THROW(validate(s));
    s.full_attention_interval = 0;  // 4
    EXPECT_NO_THROW(validate(s));
    s.n_layers = 1;  // 0 gives 1: too few layers for a hybrid
    refused(s, "2 layers or more");
    s = good;
    s.ssm_conv_kernel = 1;
    refused(s, "conv kernel");
    s = good;
    s.ssm_state = 0;
    refused(s, "positive");
    s = good;
    s.head_dim = 0;
    s.n_head = 3;  // 64 not a multiple of 3
    s.n_head_kv = 1;
    refused(s, "multiple of heads");
    if (arch != Architecture::qwen35) {
      s = good;
      s.n_expert_used = 5;
      refused(s, "experts used");
      s.n_expert = 0;
      refused(s, "experts used");
    }
  }
  // Partial rope and ssm sizes are for the hybrids only.
  SyntheticSpec q3 = small_spec(Architecture::qwen3, VocabKind::gpt2);
  q3.rope_dims = 4;
  refused(q3, "partial rope");
  q3.rope_dims = 8;  // = head dim
  EXPECT_NO_THROW(validate(q3));
  q3.ssm_inner = 64;
  refused(q3, "ssm inner");
}

TEST(SyntheticSpec, HybridDefaults) {
  SyntheticSpec spec = hybrid_spec(Architecture::qwen35);
  spec.rope_dims = 0;
  EXPECT_EQ(rope_dims_of(spec), 8u);  // head dim 32 / 4
  spec.head_dim = 20;
  EXPECT_EQ(rope_dims_of(spec), 4u);  // 5, made even
  spec.head_dim = 4;
  EXPECT_EQ(rope_dims_of(spec), 2u);  // at least 2
  spec = hybrid_spec(Architecture::qwen35);
  for (uint32_t i = 0; i < 4; ++i) EXPECT_EQ(is_full_attention_layer(spec, i), i == 1 || i == 3) << i;
  spec.full_attention_interval = 4;
  for (uint32_t i = 0; i < 4; ++i) EXPECT_EQ(is_full_attention_layer(spec, i), i == 3) << i;
  spec.full_attention_interval = 0;  // 4, as llama.cpp's default
  EXPECT_EQ(full_attention_interval_of(spec), 4u);
  spec.n_layers = 8;
  for (uint32_t i = 0; i < 8; ++i) EXPECT_EQ(is_full_attention_layer(spec, i), i == 3 || i == 7) << i;
  spec.n_layers = 3;  // fewer than 4 layers: the last one is full attention
  EXPECT_EQ(full_attention_interval_of(spec), 3u);
  EXPECT_NO_THROW(validate(spec));
  EXPECT_TRUE(is_full_attention_layer(small_spec(Architecture::qwen3, VocabKind::gpt2), 0));
}

// x / rms(x) (the mixers' and FFNs' input, norm weights ~1).
std::vector<double> rms_normalised(const float* x, size_t n) {
  double sq = 0;
  for (size_t i = 0; i < n; ++i) sq += double(x[i]) * x[i];
  const double scale = 1.0 / std::sqrt(sq / static_cast<double>(n));
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = x[i] * scale;
  return out;
}

double dot_row(const std::vector<float>& w, size_t row, const std::vector<double>& h) {
  double sum = 0;
  for (size_t i = 0; i < h.size(); ++i) sum += w[row * h.size() + i] * h[i];
  return sum;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double softplus(double x) { return x > 20 ? x : std::log1p(std::exp(x)); }

struct Spread {
  std::vector<double> values;
  double fraction_below(double x) const {
    return static_cast<double>(std::count_if(values.begin(), values.end(), [x](double v) { return v < x; })) /
           static_cast<double>(values.size());
  }
  double fraction_above(double x) const {
    return static_cast<double>(std::count_if(values.begin(), values.end(), [x](double v) { return v > x; })) /
           static_cast<double>(values.size());
  }
  double mean() const {
    double s = 0;
    for (double v : values) s += v;
    return s / static_cast<double>(values.size());
  }
  double min() const { return *std::min_element(values.begin(), values.end()); }
  double max() const { return *std::max_element(values.begin(), values.end()); }
};

// The gates and decays cover their ranges on unit-RMS inputs (RMS-normalised token
// embeddings of 256 tokens as the probe: with random weights any unit-RMS input gives
// the same statistics): sigmoid gates (beta, attention output gate, shared-expert
// gate) spread over (0, 1) around 0.5, decays from ~1 to small, per head and per token.
TEST_P(HybridModel, GatesAndDecaysCoverTheirRanges) {
  TempDir dir;
  const Architecture arch = GetParam();
  SyntheticSpec spec = hybrid_spec(arch);
  spec.weight_type = GgmlType::F32;
  spec.ssm_value_heads = 8;  // 4 per key head
  auto model = build_and_open(spec, dir / "gates.gguf");
  const std::vector<float> embd = tensor_floats(*model, "token_embd.weight");
  std::vector<std::vector<double>> probes;
  for (size_t t = 0; t < 256; ++t) probes.push_back(rms_normalised(embd.data() + (t * 193 + 7) * 64, 64));

  Spread beta, decay, alpha, attn_gate, shared_gate;
  std::vector<double> head_median_decay;
  for (int layer : {0, 2}) {
    const std::string b = "blk." + std::to_string(layer) + ".";
    const std::vector<float> a = tensor_floats(*model, b + "ssm_a");
    const std::vector<float> dt = tensor_floats(*model, b + "ssm_dt.bias");
    ASSERT_EQ(a.size(), 8u);
    // Base decay rates softplus(dt_bias) * |A|: one per stratum of [0.002, 4] (log scale).
    std::set<int> strata;
    for (size_t h = 0; h < 8; ++h) {
      EXPECT_LT(a[h], -0.5f + 1e-6f);
      EXPECT_GT(a[h], -16.0f - 1e-4f);
      const double rate = softplus(dt[h]) * -a[h];
      const double u = (std::log(rate) - std::log(0.002)) / (std::log(4.0) - std::log(0.002));
      EXPECT_GT(u, -1e-6);
      EXPECT_LT(u, 1 + 1e-6);
      strata.insert(std::min(7, static_cast<int>(u * 8)));
    }
    EXPECT_EQ(strata.size(), 8u) << "heads do not cover the decay range";
    std::vector<float> wb, wa;
    if (arch == Architecture::qwen3next) {
      // ssm_ba rows per key group g: 4 beta rows then 4 alpha rows; v head g*4 + j.
      const std::vector<float> ba = tensor_floats(*model, b + "ssm_ba.weight");
      for (size_t g = 0; g < 2; ++g) {
        for (size_t j = 0; j < 4; ++j) {
          wb.insert(wb.end(), ba.begin() + (g * 8 + j) * 64, ba.begin() + (g * 8 + j + 1) * 64);
        }
        for (size_t j = 0; j < 4; ++j) {
          wa.insert(wa.end(), ba.begin() + (g * 8 + 4 + j) * 64, ba.begin() + (g * 8 + 5 + j) * 64);
        }
      }
    } else {
      wb = tensor_floats(*model, b + "ssm_beta.weight");
      wa = tensor_floats(*model, b + "ssm_alpha.weight");
    }
    for (size_t h = 0; h < 8; ++h) {
      std::vector<double> per_head;
      for (const auto& x : probes) {
        beta.values.push_back(sigmoid(dot_row(wb, h, x)));
        const double al = dot_row(wa, h, x);
        alpha.values.push_back(al);
        const double d = std::exp(softplus(al + dt[h]) * a[h]);
        decay.values.push_back(d);
        per_head.push_back(d);
      }
      std::sort(per_head.begin(), per_head.end());
      head_median_decay.push_back(per_head[per_head.size() / 2]);
    }
  }
  const std::vector<float> q = tensor_floats(*model, "blk.1.attn_q.weight");
  for (const auto& x : probes) {
    for (size_t head = 0; head < 4; ++head) {
      for (size_t d = 0; d < 32; d += 4) attn_gate.values.push_back(sigmoid(dot_row(q, head * 64 + 32 + d, x)));
    }
  }
  if (arch != Architecture::qwen35) {
    for (int layer = 0; layer < 4; ++layer) {
      const std::vector<float> w = tensor_floats(*model, "blk." + std::to_string(layer) + ".ffn_gate_inp_shexp.weight");
      for (const auto& x : probes) shared_gate.values.push_back(sigmoid(dot_row(w, 0, x)));
    }
  }
  std::printf("%s: beta mean %.2f (<0.1: %.2f, >0.9: %.2f); decay %.4f..%.4f, head medians", architecture_name(arch).data(),
              beta.mean(), beta.fraction_below(0.1), beta.fraction_above(0.9), decay.min(), decay.max());
  for (double m : head_median_decay) std::printf(" %.3f", m);
  std::printf("; attention gate mean %.2f (<0.1: %.2f, >0.9: %.2f)\n", attn_gate.mean(), attn_gate.fraction_below(0.1),
              attn_gate.fraction_above(0.9));
  for (const Spread* gate : {&beta, &attn_gate, &shared_gate}) {
    if (gate->values.empty()) continue;
    EXPECT_NEAR(gate->mean(), 0.5, 0.1);
    EXPECT_GT(gate->fraction_below(0.1), 0.05);
    EXPECT_GT(gate->fraction_above(0.9), 0.05);
    EXPECT_GT(gate->fraction_below(0.5), 0.35);
    EXPECT_GT(gate->fraction_above(0.5), 0.35);
  }
  // alpha: std ~kAlphaStd.
  double sq = 0;
  for (double v : alpha.values) sq += v * v;
  EXPECT_NEAR(std::sqrt(sq / static_cast<double>(alpha.values.size())), kAlphaStd, 0.2);
  // Decays: from ~1 (long memory) to small, and heads differ: some keep > 0.98 per
  // token typically, some < 0.3.
  EXPECT_GT(decay.max(), 0.995);
  EXPECT_LT(decay.min(), 0.05);
  std::sort(head_median_decay.begin(), head_median_decay.end());
  EXPECT_GT(head_median_decay.back(), 0.98);
  EXPECT_LT(head_median_decay.front(), 0.3);
}

TEST(SyntheticModel, HybridWeightScales) {
  TempDir dir;
  SyntheticSpec spec = hybrid_spec(Architecture::qwen35moe);
  spec.weight_type = GgmlType::F32;
  auto model = build_and_open(spec, dir / "scales.gguf");
  // Within 4 standard errors of the sample mean and std.
  auto check = [&](const std::string& name, double std_dev) {
    const std::vector<float> v = tensor_floats(*model, name);
    const double n = static_cast<double>(v.size());
    auto [m, s] = mean_std(v);
    EXPECT_NEAR(m, 0.0, 4 * std_dev / std::sqrt(n)) << name;
    EXPECT_NEAR(s, std_dev, 4 * std_dev / std::sqrt(2 * n)) << name;
  };
  const double depth = std::sqrt(8.0);  // sqrt(2 * 4 layers)
  check("blk.0.attn_qkv.weight", 1 / 8.0);
  check("blk.0.attn_gate.weight", 2 / 8.0);               // z: kGateLogitStd / sqrt(64)
  check("blk.0.ssm_conv1d.weight", 0.5);                   // 1 / sqrt(K = 4)
  check("blk.0.ssm_beta.weight", 2 / 8.0);
  check("blk.0.ssm_alpha.weight", 1 / 8.0);
  check("blk.0.ssm_out.weight", 1 / 8.0 / depth);          // 1 / sqrt(value_dim 64) / depth
  check("blk.1.attn_output.weight", 1 / std::sqrt(128.0) / depth);
  check("blk.1.ffn_gate_inp_shexp.weight", 2 / 8.0);
  check("blk.1.ffn_up_shexp.weight", 1 / 8.0);
  check("blk.1.ffn_down_shexp.weight", 1 / std::sqrt(80.0) / depth);
  check("blk.1.ffn_down_exps.weight", 1 / std::sqrt(48.0) / depth);
  // attn_q: per head 32 query rows of std 1/8, then 32 gate rows of std 2/8.
  const std::vector<float> q = tensor_floats(*model, "blk.1.attn_q.weight");
  for (size_t head = 0; head < 4; ++head) {
    for (size_t half = 0; half < 2; ++half) {
      const size_t first = (head * 64 + half * 32) * 64;
      auto [m, s] = mean_std(std::vector<float>(q.begin() + first, q.begin() + first + 32 * 64));
      EXPECT_NEAR(s, half == 0 ? 1 / 8.0 : 2 / 8.0, 0.015) << head << " " << half;
    }
  }
  const std::vector<float> norm = tensor_floats(*model, "blk.0.ssm_norm.weight");
  for (float x : norm) EXPECT_NEAR(x, 1.0f, 0.4f);
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
