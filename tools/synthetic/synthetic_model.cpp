#include "synthetic/synthetic_model.hpp"

#include <algorithm>
#include <cmath>
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

float default_freq_base(Architecture arch) {
  switch (arch) {
    case Architecture::llama: return 10000.0f;
    case Architecture::qwen2:
    case Architecture::qwen3:
    case Architecture::qwen3moe:
    case Architecture::gemma3: return 1000000.0f;
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
  }
  return "unknown";
}

std::optional<Architecture> parse_architecture(std::string_view name) {
  for (Architecture arch : {Architecture::llama, Architecture::qwen2, Architecture::qwen3, Architecture::qwen3moe,
                            Architecture::gpt2, Architecture::gemma3}) {
    if (architecture_name(arch) == name) return arch;
  }
  return std::nullopt;
}

uint32_t head_dim_of(const SyntheticSpec& spec) {
  return spec.head_dim != 0 ? spec.head_dim : (spec.n_head ? spec.n_embd / spec.n_head : 0);
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
                             spec.architecture == Architecture::qwen3moe || spec.architecture == Architecture::gemma3;
  if (!free_head_dim && head_dim * spec.n_head != spec.n_embd) {
    fail(std::string(architecture_name(spec.architecture)) + " needs head dim = embd / heads");
  }
  if (spec.architecture == Architecture::gpt2 && spec.n_head_kv != spec.n_head) fail("gpt2 has no grouped-query attention (kv heads = heads)");
  if (!spec.rope_scaling.empty()) {
    if (!uses_rope(spec.architecture)) fail("rope scaling needs an architecture with rope");
    if (spec.rope_scaling != "linear" && spec.rope_scaling != "yarn") fail("rope scaling must be linear or yarn");
    if (!(spec.rope_scaling_factor > 0)) fail("rope scaling factor must be positive");
  }
  if (spec.architecture == Architecture::qwen3moe &&
      (spec.n_expert == 0 || spec.n_expert_used == 0 || spec.n_expert_used > spec.n_expert)) {
    fail("qwen3moe needs 1 <= experts used <= experts");
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
  if (uses_rope(arch)) {
    md.set(a + ".rope.freq_base", freq_base);
    md.set(a + ".rope.dimension_count", head_dim);
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
  if (arch == Architecture::qwen3moe) {
    md.set(a + ".expert_count", spec.n_expert);
    md.set(a + ".expert_used_count", spec.n_expert_used);
    md.set(a + ".expert_feed_forward_length", static_cast<uint32_t>(n_ff_exp));
  }
  if (qwen3_attention || arch == Architecture::gemma3 || head_dim * spec.n_head != spec.n_embd) {
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
