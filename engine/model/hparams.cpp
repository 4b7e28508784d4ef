#include "model/hparams.hpp"

#include <cmath>
#include <stdexcept>

namespace pico::model {
namespace {

struct Keys {
  const gguf::Metadata& md;
  std::string prefix;

  std::optional<int64_t> i(const std::string& key) const { return md.get_int(prefix + key); }
  std::optional<double> f(const std::string& key) const { return md.get_float(prefix + key); }
  int64_t need_i(const std::string& key) const {
    const auto v = i(key);
    if (!v) throw std::invalid_argument("model metadata lacks " + prefix + key);
    return *v;
  }
};

// The linear-attention layers' keys, as llama.cpp's qwen35 / qwen35moe / qwen3next
// loaders read them, with the constraints their graphs assert.
void read_hybrid(const Keys& k, Hparams& hp) {
  hp.ssm_conv_kernel = k.need_i("ssm.conv_kernel");
  hp.ssm_d_inner = k.need_i("ssm.inner_size");
  hp.ssm_d_state = k.need_i("ssm.state_size");
  hp.ssm_n_v_heads = k.need_i("ssm.time_step_rank");
  hp.ssm_n_k_heads = k.need_i("ssm.group_count");
  if (hp.ssm_conv_kernel < 1 || hp.ssm_d_state <= 0 || hp.ssm_n_k_heads <= 0 || hp.ssm_n_v_heads <= 0 ||
      hp.ssm_n_v_heads % hp.ssm_n_k_heads != 0 || hp.ssm_d_inner != hp.ssm_d_state * hp.ssm_n_v_heads) {
    throw std::invalid_argument(
        "model metadata: the linear-attention shape needs ssm.inner_size = ssm.state_size * ssm.time_step_rank and "
        "ssm.time_step_rank a multiple of ssm.group_count");
  }
  if (!k.f("attention.layer_norm_rms_epsilon")) {
    throw std::invalid_argument("model metadata lacks " + k.prefix + "attention.layer_norm_rms_epsilon");
  }
  if (hp.head_dim_k != hp.head_dim_v) throw std::invalid_argument("model metadata: key and value heads differ in size");
  if (k.i("nextn_predict_layers").value_or(0) != 0) {
    throw std::invalid_argument("model metadata: multi-token prediction layers (nextn_predict_layers) are not supported");
  }
  hp.recurrent_layers.assign(static_cast<size_t>(hp.n_layer), false);
  if (const gguf::Array* layers = k.md.get_array(k.prefix + "attention.recurrent_layers")) {
    if (layers->items.size() != static_cast<size_t>(hp.n_layer)) {
      throw std::invalid_argument("model metadata: attention.recurrent_layers does not have one entry per layer");
    }
    for (size_t i = 0; i < layers->items.size(); ++i) hp.recurrent_layers[i] = layers->items[i].as_int().value_or(0) != 0;
  } else {
    const int64_t interval = k.i("full_attention_interval").value_or(4);
    if (interval <= 0) throw std::invalid_argument("model metadata: full_attention_interval must be positive");
    for (int64_t i = 0; i < hp.n_layer; ++i) hp.recurrent_layers[static_cast<size_t>(i)] = (i + 1) % interval != 0;
  }
  if (hp.n_rot <= 0 || hp.n_rot > hp.head_dim_k || hp.n_rot % 2 != 0) {
    throw std::invalid_argument("model metadata: rope.dimension_count must be even and at most the head size");
  }
  if (hp.arch == Arch::qwen35 || hp.arch == Arch::qwen35moe) {
    // IMROPE: pair p, sector p mod (sum of sections), rotates by the position of stream
    // sector mod 3 while the sector is within 3 times that section, else by position 0
    // (no rotation). For text every stream but
    // the fourth holds the token's position, so the rotation is NEOX's exactly when the
    // sections cover every pair that way; other sections are refused, not approximated.
    const gguf::Array* sections = k.md.get_array(k.prefix + "rope.dimension_sections");
    if (!sections || sections->items.size() != 4) {
      throw std::invalid_argument("model metadata lacks " + k.prefix + "rope.dimension_sections (4 integers)");
    }
    int64_t s[4], sum = 0;
    for (int i = 0; i < 4; ++i) sum += s[i] = sections->items[static_cast<size_t>(i)].as_int().value_or(-1);
    if (sum <= 0 || s[0] < 0 || s[1] < 0 || s[2] < 0 || s[3] < 0) {
      throw std::invalid_argument("model metadata: bad rope.dimension_sections");
    }
    for (int64_t p = 0; p < hp.n_rot / 2; ++p) {
      const int64_t sector = p % sum, stream = sector % 3;
      if (sector >= 3 * s[stream]) {
        throw std::invalid_argument("model metadata: rope.dimension_sections leave rotary pair " + std::to_string(p) +
                                    " without a text position (multimodal sections are not supported)");
      }
    }
  }
}

}  // namespace

Hparams read_hparams(const gguf::Metadata& md, int64_t n_vocab) {
  Hparams hp;
  const auto arch = md.get_string("general.architecture");
  if (!arch) throw std::invalid_argument("model metadata lacks general.architecture");
  hp.arch_name = std::string(*arch);
  if (hp.arch_name == "llama" || hp.arch_name == "mistral") {
    hp.arch = Arch::llama;
  } else if (hp.arch_name == "qwen2") {
    hp.arch = Arch::qwen2;
  } else if (hp.arch_name == "qwen3") {
    hp.arch = Arch::qwen3;
  } else if (hp.arch_name == "qwen3moe") {
    hp.arch = Arch::qwen3moe;
  } else if (hp.arch_name == "qwen35") {
    hp.arch = Arch::qwen35;
  } else if (hp.arch_name == "qwen35moe") {
    hp.arch = Arch::qwen35moe;
  } else if (hp.arch_name == "qwen3next") {
    hp.arch = Arch::qwen3next;
  } else if (hp.arch_name == "gpt2") {
    hp.arch = Arch::gpt2;
  } else if (hp.arch_name == "gemma3") {
    hp.arch = Arch::gemma3;
  } else {
    throw std::invalid_argument("architecture '" + hp.arch_name + "' is not supported");
  }
  const Keys k{md, hp.arch_name + "."};
  hp.n_layer = k.need_i("block_count");
  hp.n_embd = k.need_i("embedding_length");
  // A MoE's dense width only provides the experts' default width.
  const bool moe = hp.arch == Arch::qwen3moe || hp.arch == Arch::qwen35moe || hp.arch == Arch::qwen3next;
  const bool hybrid = hp.arch == Arch::qwen35 || hp.arch == Arch::qwen35moe || hp.arch == Arch::qwen3next;
  hp.n_ff = moe ? k.i("feed_forward_length").value_or(0) : k.need_i("feed_forward_length");
  hp.n_head = k.need_i("attention.head_count");
  hp.n_head_kv = k.i("attention.head_count_kv").value_or(hp.n_head);
  hp.n_ctx_train = k.i("context_length").value_or(0);
  hp.n_vocab = n_vocab;
  if (hp.n_layer <= 0 || hp.n_embd <= 0 || hp.n_head <= 0 || hp.n_head_kv <= 0 || hp.n_head % hp.n_head_kv != 0) {
    throw std::invalid_argument("model metadata: bad layer or head counts");
  }
  hp.head_dim_k = k.i("attention.key_length").value_or(hp.n_embd / hp.n_head);
  hp.head_dim_v = k.i("attention.value_length").value_or(hp.n_embd / hp.n_head);

  const auto rms_eps = k.f("attention.layer_norm_rms_epsilon");
  const auto ln_eps = k.f("attention.layer_norm_epsilon");
  if (hp.arch == Arch::gpt2) {
    hp.norm_eps = static_cast<float>(ln_eps.value_or(1e-5));
  } else {
    hp.norm_eps = static_cast<float>(rms_eps.value_or(ln_eps.value_or(1e-5)));
  }

  // qwen35 / qwen35moe name IMROPE, which for text equals NEOX (checked below).
  hp.rope_neox = hp.arch == Arch::qwen2 || hp.arch == Arch::qwen3 || moe || hybrid || hp.arch == Arch::gemma3;
  hp.n_rot = static_cast<int32_t>(k.i("rope.dimension_count").value_or(hp.head_dim_k));
  hp.rope_freq_base = static_cast<float>(k.f("rope.freq_base").value_or(10000.0));
  float factor = static_cast<float>(k.f("rope.scale_linear").value_or(1.0));
  const auto scaling = md.get_string(k.prefix + "rope.scaling.type");
  if (const auto f = k.f("rope.scaling.factor"); f && *f > 0) factor = static_cast<float>(*f);
  if (scaling && *scaling == "yarn") {
    hp.rope_scaling = RopeScaling::yarn;
  } else if ((scaling && *scaling == "linear") || (!scaling && factor != 1.0f)) {
    hp.rope_scaling = RopeScaling::linear;
  }
  if (hp.rope_scaling != RopeScaling::none && factor > 0) hp.rope_freq_scale = 1.0f / factor;
  hp.rope_n_ctx_orig = static_cast<int32_t>(k.i("rope.scaling.original_context_length").value_or(hp.n_ctx_train));
  if (hp.rope_scaling == RopeScaling::yarn) {
    // As llama.cpp derives them for these architectures (it reads no yarn_* keys for
    // them): full extrapolation mix, betas 32 and 1, and a magnitude factor of
    // mscale(s) / (1 + 0.1 ln s), which the rope op's own (1 + 0.1 ln s) then
    // cancels, both rounded in float as llama.cpp rounds them.
    const float s = 1.0f / hp.rope_freq_scale;
    const float mscale = s <= 1.0f ? 1.0f : 0.1f * std::log(s) + 1.0f;
    hp.yarn_ext_factor = 1.0f;
    hp.yarn_attn_factor = mscale * (1.0f / (1.0f + 0.1f * std::log(s)));
    hp.yarn_beta_fast = 32.0f;
    hp.yarn_beta_slow = 1.0f;
  }
  // rope.scaling.attn_factor scales the rotation's magnitude under any scaling.
  hp.yarn_attn_factor *= static_cast<float>(k.f("rope.scaling.attn_factor").value_or(1.0));

  hp.final_logit_softcap = static_cast<float>(k.f("final_logit_softcapping").value_or(0.0));
  if (hp.arch == Arch::gemma3) {
    hp.n_swa = static_cast<int32_t>(k.i("attention.sliding_window").value_or(0));
    if (hp.n_swa > 0) {
      const int64_t period = k.i("attention.sliding_window_pattern").value_or(6);
      hp.swa_layers.resize(static_cast<size_t>(hp.n_layer));
      for (int64_t il = 0; il < hp.n_layer; ++il) {
        hp.swa_layers[static_cast<size_t>(il)] = period == 0 || (il % period < period - 1);
      }
      hp.rope_freq_base_swa = static_cast<float>(k.f("rope.freq_base_swa").value_or(10000.0));
    }
    hp.attn_scale = hp.n_layer == 62 ? 1.0f / std::sqrt(static_cast<float>(hp.n_embd / hp.n_head))
                                     : 1.0f / std::sqrt(static_cast<float>(hp.head_dim_k));
  }
  if (moe) {
    // As llama.cpp: both counts required and positive, the expert width defaulting to
    // n_ff / n_expert_used; routing always renormalises (it reads no
    // expert_weights_norm key for this architecture).
    hp.n_expert = k.need_i("expert_count");
    hp.n_expert_used = k.need_i("expert_used_count");
    if (hp.n_expert <= 0 || hp.n_expert_used <= 0 || hp.n_expert_used > hp.n_expert) {
      throw std::invalid_argument("model metadata: bad expert counts");
    }
    hp.n_ff_exp = k.i("expert_feed_forward_length").value_or(0);
    if (hp.n_ff_exp == 0) hp.n_ff_exp = hp.n_ff / hp.n_expert_used;
    if (hp.n_ff_exp <= 0) throw std::invalid_argument("model metadata: no expert feed-forward length");
    hp.expert_weights_norm = true;
    if (hp.arch != Arch::qwen3moe) {
      // The shared expert: qwen35moe defaults to n_ff, qwen3next to n_ff too (per layer).
      hp.n_ff_shexp = k.i("expert_shared_feed_forward_length").value_or(hp.n_ff);
    }
    if (!rms_eps) {
      throw std::invalid_argument("model metadata lacks " + k.prefix + "attention.layer_norm_rms_epsilon");
    }
  }
  if (hybrid) read_hybrid(k, hp);
  if (hp.attn_scale == 0.0f) hp.attn_scale = 1.0f / std::sqrt(static_cast<float>(hp.head_dim_k));
  return hp;
}

}  // namespace pico::model
