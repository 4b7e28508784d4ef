#include "synthetic/synthetic_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "quant/float_convert.hpp"

namespace pico::synthetic {
namespace {

// ---- deterministic random numbers ---------------------------------------------

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(std::string_view text) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (char c : text) {
    hash ^= static_cast<uint8_t>(c);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

// Approximately N(mean, std^2): the sum of four 16-bit uniforms (Irwin-Hall), in
// integers, times one float. Bounded at +-sqrt(12)/2*2 = +-3.46 std.
class NormalStream {
 public:
  NormalStream(uint64_t seed, std::string_view tensor_name) : state_(seed ^ fnv1a(tensor_name)) {
    splitmix64(state_);  // decorrelate nearby seeds
  }

  // Values of std 1 come out as k * kUnit with k an integer of |k| < 2^18.
  void fill(std::vector<float>& out, double mean, double std_dev) {
    // Sum of four uniforms on [0, 65535]: mean 131070, variance 4 (65536^2 - 1) / 12.
    // 2*sum - 262140 is an integer with mean 0 and std 2 * sqrt((65536^2 - 1) / 3).
    const double unit_std = 2.0 * std::sqrt((65536.0 * 65536.0 - 1.0) / 3.0);
    const float scale = static_cast<float>(std_dev / unit_std);
    const float offset = static_cast<float>(mean);
    for (float& value : out) {
      const uint64_t bits = splitmix64(state_);
      const int64_t sum = static_cast<int64_t>(bits & 0xffff) + static_cast<int64_t>((bits >> 16) & 0xffff) +
                          static_cast<int64_t>((bits >> 32) & 0xffff) + static_cast<int64_t>(bits >> 48);
      const float k = static_cast<float>(2 * sum - 262140);  // exact: |k| < 2^24
      const float noise = k * scale;                        // one rounding
      value = offset + noise;                               // one rounding (built with -ffp-contract=off)
    }
  }

 private:
  uint64_t state_;
};

// Uniform on [0, 1): 24 random bits, exact in float and double.
class UniformStream {
 public:
  UniformStream(uint64_t seed, std::string_view name) : state_(seed ^ fnv1a(name)) { splitmix64(state_); }
  double next() { return static_cast<double>(splitmix64(state_) >> 40) * 0x1p-24; }
  // A seeded permutation of 0..n-1 (Fisher-Yates).
  std::vector<uint32_t> permutation(uint32_t n) {
    std::vector<uint32_t> order(n);
    for (uint32_t i = 0; i < n; ++i) order[i] = i;
    for (uint32_t i = n; i > 1; --i) std::swap(order[i - 1], order[splitmix64(state_) % i]);
    return order;
  }

 private:
  uint64_t state_;
};

// ---- tensors -------------------------------------------------------------------

std::vector<uint8_t> encode(const std::vector<float>& values, GgmlType type) {
  std::vector<uint8_t> bytes;
  switch (type) {
    case GgmlType::F32:
      bytes.resize(values.size() * 4);
      std::memcpy(bytes.data(), values.data(), bytes.size());
      break;
    case GgmlType::F16:
    case GgmlType::BF16: {
      bytes.resize(values.size() * 2);
      for (size_t i = 0; i < values.size(); ++i) {
        const uint16_t half = type == GgmlType::F16 ? fp32_to_fp16(values[i]) : fp32_to_bf16(values[i]);
        std::memcpy(bytes.data() + 2 * i, &half, 2);  // host order, as Writer::add_tensor takes it
      }
      break;
    }
    default:
      throw std::invalid_argument("synthetic models are written as f32, f16 or bf16");
  }
  return bytes;
}

class Builder {
 public:
  Builder(const SyntheticSpec& spec, gguf::Writer& writer) : spec_(spec), writer_(writer) {}

  // A matrix {cols, rows} (ggml order: cols is the row length) in the spec's type.
  void matrix(const std::string& name, uint64_t cols, uint64_t rows, double std_dev) {
    add(name, spec_.weight_type, {cols, rows}, 0.0, std_dev);
  }
  // n_expert matrices {cols, rows} as one 3-D tensor {cols, rows, n_expert}.
  void experts(const std::string& name, uint64_t cols, uint64_t rows, uint64_t n_expert, double std_dev) {
    add(name, spec_.weight_type, {cols, rows, n_expert}, 0.0, std_dev);
  }
  // A matrix kept in F32 whatever the spec's type (llama.cpp keeps MoE routers F32).
  void f32_matrix(const std::string& name, uint64_t cols, uint64_t rows, double std_dev) {
    add(name, GgmlType::F32, {cols, rows}, 0.0, std_dev);
  }
  void norm(const std::string& name, uint64_t n) { add(name, GgmlType::F32, {n}, 1.0, kNormNoise); }
  // A norm whose weights have random signs: +-(1 + noise).
  void signed_norm(const std::string& name, uint64_t n) {
    std::vector<float> values(n);
    NormalStream(spec_.seed, name).fill(values, 1.0, kNormNoise);
    uint64_t state = spec_.seed ^ fnv1a(name + "#sign");
    for (size_t i = 0; i < values.size(); i += 64) {
      const uint64_t bits = splitmix64(state);
      for (size_t j = i; j < std::min(values.size(), i + 64); ++j) {
        if ((bits >> (j - i)) & 1) values[j] = -values[j];
      }
    }
    writer_.add_tensor(name, GgmlType::F32, {n}, encode(values, GgmlType::F32));
  }
  void bias(const std::string& name, uint64_t n) { add(name, GgmlType::F32, {n}, 0.0, kBiasStd); }
  // An F32 vector N(0, std^2) (a gate's weights, not a norm or a bias).
  void f32_vector(const std::string& name, uint64_t n, double std_dev) { add(name, GgmlType::F32, {n}, 0.0, std_dev); }
  // An F32 tensor of given values.
  void f32_values(const std::string& name, std::vector<uint64_t> shape, const std::vector<float>& values) {
    writer_.add_tensor(name, GgmlType::F32, std::move(shape), encode(values, GgmlType::F32));
  }
  // A matrix {cols, rows} in the spec's type whose row r has std std_of_row(r); the
  // rows come one after the other from the tensor's stream.
  template <typename StdOfRow>
  void matrix_by_rows(const std::string& name, uint64_t cols, uint64_t rows, StdOfRow std_of_row) {
    std::vector<float> values(cols * rows), row(cols);
    NormalStream stream(spec_.seed, name);
    for (uint64_t r = 0; r < rows; ++r) {
      stream.fill(row, 0.0, std_of_row(r));
      std::copy(row.begin(), row.end(), values.begin() + static_cast<std::ptrdiff_t>(r * cols));
    }
    writer_.add_tensor(name, spec_.weight_type, {cols, rows}, encode(values, spec_.weight_type));
  }

  static constexpr double kNormNoise = 0.1;
  static constexpr double kBiasStd = 0.1;

 private:
  void add(const std::string& name, GgmlType type, std::vector<uint64_t> shape, double mean, double std_dev) {
    uint64_t elements = 1;
    for (uint64_t d : shape) elements *= d;
    std::vector<float> values(elements);
    NormalStream(spec_.seed, name).fill(values, mean, std_dev);
    writer_.add_tensor(name, type, std::move(shape), encode(values, type));
  }

  const SyntheticSpec& spec_;
  gguf::Writer& writer_;
};

std::string blk(uint32_t layer, std::string_view tensor) {
  return "blk." + std::to_string(layer) + "." + std::string(tensor);
}

uint32_t file_type_of(GgmlType type) {
  switch (type) {
    case GgmlType::F32: return 0;    // LLAMA_FTYPE_ALL_F32
    case GgmlType::F16: return 1;    // LLAMA_FTYPE_MOSTLY_F16
    case GgmlType::BF16: return 32;  // LLAMA_FTYPE_MOSTLY_BF16
    default: throw std::invalid_argument("synthetic models are written as f32, f16 or bf16");
  }
}

bool uses_rope(Architecture arch) { return arch != Architecture::gpt2; }

// ssm_a (A < 0) and ssm_dt.bias of one Gated DeltaNet layer, per value head (see the
// header): base decay rates r = softplus(dt_bias) * |A| log-uniform over
// [kDecayRateMin, kDecayRateMax], one stratum of that range per head in seeded order.
void gdn_decay_parameters(uint64_t seed, const std::string& layer_prefix, uint32_t n_heads, std::vector<float>& a,
                          std::vector<float>& dt_bias) {
  UniformStream strata(seed, layer_prefix + "ssm_dt#strata");
  UniformStream magnitudes(seed, layer_prefix + "ssm_a#magnitude");
  const std::vector<uint32_t> order = strata.permutation(n_heads);
  a.resize(n_heads);
  dt_bias.resize(n_heads);
  const double log_rate_min = std::log(kDecayRateMin), log_rate_max = std::log(kDecayRateMax);
  const double log_a_min = std::log(kAMin), log_a_max = std::log(kAMax);
  for (uint32_t h = 0; h < n_heads; ++h) {
    const double u = (static_cast<double>(order[h]) + strata.next()) / static_cast<double>(n_heads);
    const double rate = std::exp(log_rate_min + u * (log_rate_max - log_rate_min));
    const double magnitude = std::exp(log_a_min + magnitudes.next() * (log_a_max - log_a_min));
    const double dt = rate / magnitude;                 // softplus(dt_bias)
    a[h] = static_cast<float>(-magnitude);              // A = -exp(A_log)
    dt_bias[h] = static_cast<float>(std::log(std::expm1(dt)));  // softplus^-1
  }
}

// [s0, s1, s2, 0] with s0 + s1 + s2 = pairs and s0 >= s1 >= s2 >= s0 - 1: IMROPE then
// gives every rotated pair the text position (see the header).
std::vector<gguf::Value> rope_sections(uint32_t pairs) {
  const uint32_t q = pairs / 3, rem = pairs % 3;
  return {int32_t(q + (rem > 0)), int32_t(q + (rem > 1)), int32_t(q), int32_t(0)};
}

float default_freq_base(Architecture arch) {
  switch (arch) {
    case Architecture::llama: return 10000.0f;
    case Architecture::qwen2:
    case Architecture::qwen3:
    case Architecture::qwen3moe:
    case Architecture::gemma3: return 1000000.0f;
    case Architecture::qwen35:
    case Architecture::qwen35moe:
    case Architecture::qwen3next: return 10000000.0f;  // Qwen3.5 and Qwen3-Next: rope_theta 1e7
    case Architecture::gpt2: return 0.0f;
  }
  return 10000.0f;
}

float default_norm_eps(Architecture arch) {
  switch (arch) {
    case Architecture::llama:
    case Architecture::gpt2: return 1e-5f;
    default: return 1e-6f;
  }
}

}  // namespace

std::string_view architecture_name(Architecture arch) {
  switch (arch) {
    case Architecture::llama: return "llama";
    case Architecture::qwen2: return "qwen2";
    case Architecture::qwen3: return "qwen3";
    case Architecture::qwen3moe: return "qwen3moe";
    case Architecture::gpt2: return "gpt2";
    case Architecture::gemma3: return "gemma3";
    case Architecture::qwen35: return "qwen35";
    case Architecture::qwen35moe: return "qwen35moe";
    case Architecture::qwen3next: return "qwen3next";
  }
  return "unknown";
}

std::optional<Architecture> parse_architecture(std::string_view name) {
  for (Architecture arch : {Architecture::llama, Architecture::qwen2, Architecture::qwen3, Architecture::qwen3moe,
                            Architecture::gpt2, Architecture::gemma3, Architecture::qwen35, Architecture::qwen35moe,
                            Architecture::qwen3next}) {
    if (architecture_name(arch) == name) return arch;
  }
  return std::nullopt;
}

bool is_hybrid(Architecture arch) {
  return arch == Architecture::qwen35 || arch == Architecture::qwen35moe || arch == Architecture::qwen3next;
}

bool has_experts(Architecture arch) {
  return arch == Architecture::qwen3moe || arch == Architecture::qwen35moe || arch == Architecture::qwen3next;
}

uint32_t head_dim_of(const SyntheticSpec& spec) {
  return spec.head_dim != 0 ? spec.head_dim : (spec.n_head ? spec.n_embd / spec.n_head : 0);
}

uint32_t rope_dims_of(const SyntheticSpec& spec) {
  if (spec.rope_dims != 0) return spec.rope_dims;
  const uint32_t head_dim = head_dim_of(spec);
  if (!is_hybrid(spec.architecture)) return head_dim;
  return std::max<uint32_t>(2, (head_dim / 4) & ~1u);
}

uint32_t full_attention_interval_of(const SyntheticSpec& spec) {
  return spec.full_attention_interval != 0 ? spec.full_attention_interval : std::min<uint32_t>(4, spec.n_layers);
}

bool is_full_attention_layer(const SyntheticSpec& spec, uint32_t layer) {
  if (!is_hybrid(spec.architecture)) return true;
  const uint32_t interval = full_attention_interval_of(spec);
  return interval != 0 && (layer + 1) % interval == 0;
}

void validate(const SyntheticSpec& spec) {
  auto fail = [](const std::string& why) { throw std::invalid_argument("synthetic model: " + why); };
  if (spec.n_layers == 0 || spec.n_embd == 0 || spec.n_ff == 0 || spec.n_head == 0 || spec.n_head_kv == 0 ||
      spec.n_ctx_train == 0) {
    fail("layers, embd, ff, heads, kv heads and ctx must be positive");
  }
  if (spec.n_head % spec.n_head_kv != 0) fail("heads must be a multiple of kv heads");
  if (spec.head_dim == 0 && spec.n_embd % spec.n_head != 0) fail("embd must be a multiple of heads");
  const uint32_t head_dim = head_dim_of(spec);
  if (uses_rope(spec.architecture) && head_dim % 2 != 0) fail("head dim must be even (rope)");
  const bool free_head_dim = spec.architecture == Architecture::llama || spec.architecture == Architecture::qwen3 ||
                             spec.architecture == Architecture::qwen3moe || spec.architecture == Architecture::gemma3 ||
                             is_hybrid(spec.architecture);
  if (!free_head_dim && head_dim * spec.n_head != spec.n_embd) {
    fail(std::string(architecture_name(spec.architecture)) + " needs head dim = embd / heads");
  }
  if (spec.architecture == Architecture::gpt2 && spec.n_head_kv != spec.n_head) fail("gpt2 has no grouped-query attention (kv heads = heads)");
  if (!spec.rope_scaling.empty()) {
    if (!uses_rope(spec.architecture)) fail("rope scaling needs an architecture with rope");
    if (spec.rope_scaling != "linear" && spec.rope_scaling != "yarn") fail("rope scaling must be linear or yarn");
    if (!(spec.rope_scaling_factor > 0)) fail("rope scaling factor must be positive");
  }
  const std::string arch(architecture_name(spec.architecture));
  if (has_experts(spec.architecture) &&
      (spec.n_expert == 0 || spec.n_expert_used == 0 || spec.n_expert_used > spec.n_expert)) {
    fail(arch + " needs 1 <= experts used <= experts");
  }
  if (spec.rope_dims != 0 && !is_hybrid(spec.architecture) && spec.rope_dims != head_dim) {
    fail("rope dims must equal the head dim (" + std::to_string(head_dim) + ") for " + arch +
         "; partial rope is for qwen35, qwen35moe, qwen3next");
  }
  if (is_hybrid(spec.architecture)) {
    const uint32_t n_rot = rope_dims_of(spec);
    if (n_rot == 0 || n_rot % 2 != 0 || n_rot > head_dim) {
      fail("rope dims (" + std::to_string(n_rot) + ") must be even and at most the head dim (" +
           std::to_string(head_dim) + ")");
    }
    const uint32_t interval = full_attention_interval_of(spec);
    if (interval < 2 || interval > spec.n_layers) {
      fail("full attention interval (" + std::to_string(interval) + ") must be 2.." + std::to_string(spec.n_layers) +
           " (layers): layer i is full attention iff (i + 1) % interval == 0, and there must be at least one full "
           "attention and one Gated DeltaNet layer (" + arch + " needs 2 layers or more)");
    }
    if (spec.ssm_conv_kernel < 2) fail("ssm conv kernel must be at least 2 (the conv state keeps K - 1 tokens)");
    if (spec.ssm_state == 0 || spec.ssm_groups == 0 || spec.ssm_value_heads == 0) {
      fail("ssm state, groups (key heads) and value heads must be positive");
    }
    if (spec.ssm_value_heads % spec.ssm_groups != 0) {
      fail("ssm value heads (" + std::to_string(spec.ssm_value_heads) + ") must be a multiple of ssm groups (" +
           std::to_string(spec.ssm_groups) + ", the key heads)");
    }
    if (spec.ssm_inner != 0 && uint64_t{spec.ssm_inner} != uint64_t{spec.ssm_state} * spec.ssm_value_heads) {
      fail("ssm inner size (" + std::to_string(spec.ssm_inner) + ") must be ssm state x value heads (" +
           std::to_string(uint64_t{spec.ssm_state} * spec.ssm_value_heads) +
           "): llama.cpp's value head dim is the state size");
    }
  } else if (spec.ssm_inner != 0) {
    fail("ssm inner size is for qwen35, qwen35moe, qwen3next");
  }
  file_type_of(spec.weight_type);
}

gguf::Writer build_synthetic_model(const SyntheticSpec& spec, const Vocabulary& vocab) {
  validate(spec);
  const Architecture arch = spec.architecture;
  const std::string a(architecture_name(arch));
  const uint32_t head_dim = head_dim_of(spec);
  const uint64_t n_vocab = vocab.size();
  const uint64_t n_embd = spec.n_embd, n_ff = spec.n_ff;
  const uint64_t n_q = uint64_t{spec.n_head} * head_dim;
  const uint64_t n_kv = uint64_t{spec.n_head_kv} * head_dim;
  const float freq_base = spec.rope_freq_base > 0 ? spec.rope_freq_base : default_freq_base(arch);
  const float eps = spec.norm_eps > 0 ? spec.norm_eps : default_norm_eps(arch);

  gguf::Writer writer;
  gguf::Metadata& md = writer.metadata();
  md.set("general.architecture", a);
  md.set("general.name", spec.name.empty() ? "synthetic-" + a + "-" + std::string(vocab_kind_name(vocab.kind)) : spec.name);
  md.set(a + ".block_count", spec.n_layers);
  md.set(a + ".context_length", spec.n_ctx_train);
  md.set(a + ".embedding_length", spec.n_embd);
  md.set(a + ".feed_forward_length", spec.n_ff);
  md.set(a + ".attention.head_count", spec.n_head);
  md.set(a + ".attention.head_count_kv", spec.n_head_kv);
  const bool hybrid = is_hybrid(arch);
  const uint32_t n_rot = rope_dims_of(spec);
  if (uses_rope(arch)) {
    md.set(a + ".rope.freq_base", freq_base);
    md.set(a + ".rope.dimension_count", n_rot);
    if (arch == Architecture::qwen35 || arch == Architecture::qwen35moe) {
      md.set(a + ".rope.dimension_sections", gguf::make_array(gguf::ValueType::Int32, rope_sections(n_rot / 2)));
    }
    if (!spec.rope_scaling.empty()) {
      md.set(a + ".rope.scaling.type", spec.rope_scaling);
      md.set(a + ".rope.scaling.factor", spec.rope_scaling_factor);
      md.set(a + ".rope.scaling.original_context_length",
             spec.rope_original_context > 0 ? spec.rope_original_context : spec.n_ctx_train);
    }
  }
  if (arch == Architecture::gpt2) {
    md.set(a + ".attention.layer_norm_epsilon", eps);
  } else {
    md.set(a + ".attention.layer_norm_rms_epsilon", eps);
  }
  const bool qwen3_attention = arch == Architecture::qwen3 || arch == Architecture::qwen3moe;
  const uint64_t n_expert = spec.n_expert, n_ff_exp = spec.n_ff_exp > 0 ? spec.n_ff_exp : spec.n_ff;
  const uint64_t n_ff_shexp = spec.n_ff_shexp > 0 ? spec.n_ff_shexp : n_ff_exp;
  const bool shared_expert = arch == Architecture::qwen35moe || arch == Architecture::qwen3next;
  if (has_experts(arch)) {
    md.set(a + ".expert_count", spec.n_expert);
    md.set(a + ".expert_used_count", spec.n_expert_used);
    md.set(a + ".expert_feed_forward_length", static_cast<uint32_t>(n_ff_exp));
  }
  if (shared_expert) md.set(a + ".expert_shared_feed_forward_length", static_cast<uint32_t>(n_ff_shexp));
  // Gated DeltaNet sizes (llama.cpp: head_k_dim = head_v_dim = state size).
  const uint64_t d_state = spec.ssm_state, n_k_heads = spec.ssm_groups, n_v_heads = spec.ssm_value_heads;
  const uint64_t key_dim = n_k_heads * d_state, value_dim = n_v_heads * d_state;
  const uint64_t conv_dim = 2 * key_dim + value_dim;
  if (hybrid) {
    md.set(a + ".ssm.conv_kernel", spec.ssm_conv_kernel);
    md.set(a + ".ssm.inner_size", static_cast<uint32_t>(value_dim));
    md.set(a + ".ssm.state_size", spec.ssm_state);
    md.set(a + ".ssm.time_step_rank", spec.ssm_value_heads);
    md.set(a + ".ssm.group_count", spec.ssm_groups);
    md.set(a + ".full_attention_interval", full_attention_interval_of(spec));
  }
  if (qwen3_attention || hybrid || arch == Architecture::gemma3 || head_dim * spec.n_head != spec.n_embd) {
    md.set(a + ".attention.key_length", head_dim);
    md.set(a + ".attention.value_length", head_dim);
  }
  if (arch == Architecture::gemma3 && spec.sliding_window > 0) {
    md.set(a + ".attention.sliding_window", spec.sliding_window);
  }
  md.set("general.file_type", file_type_of(spec.weight_type));
  md.set("general.quantization_version", uint32_t{2});
  vocab.write_metadata(md);

  // Scales (see the header). The head's logits have std kLogitStd: the final norm
  // gives the hidden state RMS 1, so a head of std s has logits of std s*sqrt(n_embd).
  const double depth = std::sqrt(2.0 * spec.n_layers);
  const double head_std = kLogitStd / std::sqrt(static_cast<double>(n_embd));
  const double embd_std = spec.tied_embeddings ? head_std : 1.0;
  const double in_std = 1.0 / std::sqrt(static_cast<double>(n_embd));

  Builder b(spec, writer);
  b.matrix("token_embd.weight", n_embd, n_vocab, embd_std);
  if (arch == Architecture::gpt2) b.matrix("position_embd.weight", n_embd, spec.n_ctx_train, embd_std / 2);

  for (uint32_t i = 0; i < spec.n_layers; ++i) {
    b.norm(blk(i, "attn_norm.weight"), n_embd);
    if (hybrid) {
      const double gate_std = kGateLogitStd * in_std;
      if (is_full_attention_layer(spec, i)) {
        // attn_q: per head hd query rows then hd gate rows.
        b.matrix_by_rows(blk(i, "attn_q.weight"), n_embd, 2 * n_q,
                         [&](uint64_t r) { return (r / head_dim) % 2 == 0 ? in_std : gate_std; });
        b.matrix(blk(i, "attn_k.weight"), n_embd, n_kv, in_std);
        b.matrix(blk(i, "attn_v.weight"), n_embd, n_kv, in_std);
        b.norm(blk(i, "attn_q_norm.weight"), head_dim);
        b.norm(blk(i, "attn_k_norm.weight"), head_dim);
        b.matrix(blk(i, "attn_output.weight"), n_q, n_embd, 1.0 / std::sqrt(static_cast<double>(n_q)) / depth);
      } else {
        const uint64_t K = spec.ssm_conv_kernel;
        b.matrix(blk(i, "attn_qkv.weight"), n_embd, conv_dim, in_std);
        b.matrix(blk(i, "attn_gate.weight"), n_embd, value_dim, gate_std);
        b.f32_matrix(blk(i, "ssm_conv1d.weight"), K, conv_dim, 1.0 / std::sqrt(static_cast<double>(K)));
        std::vector<float> ssm_a, dt_bias;
        gdn_decay_parameters(spec.seed, blk(i, ""), spec.ssm_value_heads, ssm_a, dt_bias);
        b.f32_values(blk(i, "ssm_dt.bias"), {n_v_heads}, dt_bias);
        b.f32_values(blk(i, "ssm_a"), {n_v_heads}, ssm_a);
        const double alpha_std = kAlphaStd * in_std;
        if (arch == Architecture::qwen3next) {
          // Per key group: r beta rows, then r alpha rows (r = value heads per key head).
          const uint64_t r = n_v_heads / n_k_heads;
          b.matrix_by_rows(blk(i, "ssm_ba.weight"), n_embd, 2 * n_v_heads,
                           [&](uint64_t row) { return row % (2 * r) < r ? gate_std : alpha_std; });
        } else {
          b.matrix(blk(i, "ssm_beta.weight"), n_embd, n_v_heads, gate_std);
          b.matrix(blk(i, "ssm_alpha.weight"), n_embd, n_v_heads, alpha_std);
        }
        b.norm(blk(i, "ssm_norm.weight"), d_state);
        b.matrix(blk(i, "ssm_out.weight"), value_dim, n_embd,
                 1.0 / std::sqrt(static_cast<double>(value_dim)) / depth);
      }
      b.norm(blk(i, "post_attention_norm.weight"), n_embd);
      if (arch == Architecture::qwen35) {
        b.matrix(blk(i, "ffn_gate.weight"), n_embd, n_ff, in_std);
        b.matrix(blk(i, "ffn_up.weight"), n_embd, n_ff, in_std);
        b.matrix(blk(i, "ffn_down.weight"), n_ff, n_embd, 1.0 / std::sqrt(static_cast<double>(n_ff)) / depth);
        continue;
      }
      b.f32_matrix(blk(i, "ffn_gate_inp.weight"), n_embd, n_expert, kRouterLogitStd * in_std);
      b.experts(blk(i, "ffn_gate_exps.weight"), n_embd, n_ff_exp, n_expert, in_std);
      b.experts(blk(i, "ffn_up_exps.weight"), n_embd, n_ff_exp, n_expert, in_std);
      b.experts(blk(i, "ffn_down_exps.weight"), n_ff_exp, n_embd, n_expert,
                1.0 / std::sqrt(static_cast<double>(n_ff_exp)) / depth);
      b.f32_vector(blk(i, "ffn_gate_inp_shexp.weight"), n_embd, gate_std);
      b.matrix(blk(i, "ffn_gate_shexp.weight"), n_embd, n_ff_shexp, in_std);
      b.matrix(blk(i, "ffn_up_shexp.weight"), n_embd, n_ff_shexp, in_std);
      b.matrix(blk(i, "ffn_down_shexp.weight"), n_ff_shexp, n_embd,
               1.0 / std::sqrt(static_cast<double>(n_ff_shexp)) / depth);
      continue;
    }
    if (arch == Architecture::gpt2) {
      b.bias(blk(i, "attn_norm.bias"), n_embd);
      b.matrix(blk(i, "attn_qkv.weight"), n_embd, n_q + 2 * n_kv, in_std);
      b.bias(blk(i, "attn_qkv.bias"), n_q + 2 * n_kv);
      b.matrix(blk(i, "attn_output.weight"), n_q, n_embd, 1.0 / std::sqrt(static_cast<double>(n_q)) / depth);
      b.bias(blk(i, "attn_output.bias"), n_embd);
      b.norm(blk(i, "ffn_norm.weight"), n_embd);
      b.bias(blk(i, "ffn_norm.bias"), n_embd);
      b.matrix(blk(i, "ffn_up.weight"), n_embd, n_ff, in_std);
      b.bias(blk(i, "ffn_up.bias"), n_ff);
      b.matrix(blk(i, "ffn_down.weight"), n_ff, n_embd, 1.0 / std::sqrt(static_cast<double>(n_ff)) / depth);
      b.bias(blk(i, "ffn_down.bias"), n_embd);
      continue;
    }
    b.matrix(blk(i, "attn_q.weight"), n_embd, n_q, in_std);
    b.matrix(blk(i, "attn_k.weight"), n_embd, n_kv, in_std);
    b.matrix(blk(i, "attn_v.weight"), n_embd, n_kv, in_std);
    if (arch == Architecture::qwen2) {
      b.bias(blk(i, "attn_q.bias"), n_q);
      b.bias(blk(i, "attn_k.bias"), n_kv);
      b.bias(blk(i, "attn_v.bias"), n_kv);
    }
    if (qwen3_attention || arch == Architecture::gemma3) {
      b.norm(blk(i, "attn_q_norm.weight"), head_dim);
      b.norm(blk(i, "attn_k_norm.weight"), head_dim);
    }
    b.matrix(blk(i, "attn_output.weight"), n_q, n_embd, 1.0 / std::sqrt(static_cast<double>(n_q)) / depth);
    if (arch == Architecture::gemma3) b.norm(blk(i, "post_attention_norm.weight"), n_embd);
    b.norm(blk(i, "ffn_norm.weight"), n_embd);
    if (arch == Architecture::qwen3moe) {
      b.f32_matrix(blk(i, "ffn_gate_inp.weight"), n_embd, n_expert, kRouterLogitStd * in_std);
      b.experts(blk(i, "ffn_gate_exps.weight"), n_embd, n_ff_exp, n_expert, in_std);
      b.experts(blk(i, "ffn_up_exps.weight"), n_embd, n_ff_exp, n_expert, in_std);
      b.experts(blk(i, "ffn_down_exps.weight"), n_ff_exp, n_embd, n_expert,
                1.0 / std::sqrt(static_cast<double>(n_ff_exp)) / depth);
      continue;
    }
    b.matrix(blk(i, "ffn_gate.weight"), n_embd, n_ff, in_std);
    b.matrix(blk(i, "ffn_up.weight"), n_embd, n_ff, in_std);
    b.matrix(blk(i, "ffn_down.weight"), n_ff, n_embd, 1.0 / std::sqrt(static_cast<double>(n_ff)) / depth);
    if (arch == Architecture::gemma3) b.norm(blk(i, "post_ffw_norm.weight"), n_embd);
  }

  // Tied: the head is token_embd, and the final hidden state still leans towards the
  // input token's own embedding, so with plain norm weights the head would mostly
  // repeat the input token (the more so the larger n_embd). Random signs on the final
  // norm's weights take that self-alignment away and leave the logits' spread as is.
  if (spec.tied_embeddings) {
    b.signed_norm("output_norm.weight", n_embd);
  } else {
    b.norm("output_norm.weight", n_embd);
  }
  if (arch == Architecture::gpt2) b.bias("output_norm.bias", n_embd);
  if (!spec.tied_embeddings) b.matrix("output.weight", n_embd, n_vocab, head_std);
  return writer;
}

void write_synthetic_model(const SyntheticSpec& spec, const std::filesystem::path& out) {
  validate(spec);
  const Vocabulary vocab = load_vocabulary(spec.vocab, spec.node_modules);
  build_synthetic_model(spec, vocab).write(out);
}

}  // namespace pico::synthetic
