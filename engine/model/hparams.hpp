// Hyperparameters of a model, read from its GGUF metadata ({arch}.* keys), with
// llama.cpp's defaults for keys a file leaves out.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gguf/value.hpp"

namespace pico::model {

enum class Arch { llama, qwen2, qwen3, qwen3moe, qwen35, qwen35moe, qwen3next, gpt2, gemma3 };
enum class RopeScaling { none, linear, yarn };

struct Hparams {
  std::string arch_name;
  Arch arch = Arch::llama;
  int64_t n_layer = 0;
  int64_t n_embd = 0;
  int64_t n_ff = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim_k = 0;  // attention.key_length, else n_embd / n_head
  int64_t head_dim_v = 0;
  int64_t n_vocab = 0;     // rows of token_embd
  int64_t n_ctx_train = 0;
  float norm_eps = 1e-5f;  // layer_norm_rms_epsilon or layer_norm_epsilon
  bool rope_neox = false;
  int32_t n_rot = 0;       // rope.dimension_count, else head_dim_k
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;  // 1 / rope.scaling.factor
  RopeScaling rope_scaling = RopeScaling::none;
  int32_t rope_n_ctx_orig = 0;
  float yarn_ext_factor = 0.0f;
  float yarn_attn_factor = 1.0f;
  float yarn_beta_fast = 32.0f;
  float yarn_beta_slow = 1.0f;
  float attn_scale = 0.0f;       // q.k scale; 0: 1/sqrt(head_dim_k)
  float final_logit_softcap = 0.0f;
  // Sliding-window attention (gemma3): window size, and which layers use it.
  int32_t n_swa = 0;
  std::vector<bool> swa_layers;
  float rope_freq_base_swa = 10000.0f;
  float rope_freq_scale_swa = 1.0f;
  // Mixture of experts (qwen3moe): experts per layer, experts each token uses, their
  // FFN width, and whether the chosen experts' weights are renormalised to sum 1.
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t n_ff_exp = 0;
  bool expert_weights_norm = false;
  int64_t n_ff_shexp = 0;  // the shared expert's width (qwen35moe, qwen3next); 0: none
  // Hybrid models (qwen35, qwen35moe, qwen3next): which layers are linear attention
  // (Gated DeltaNet) and that layer's shape; the others are gated full attention.
  std::vector<bool> recurrent_layers;
  int64_t ssm_conv_kernel = 0;  // taps of the causal conv
  int64_t ssm_d_state = 0;      // head dim of the linear layers' keys and values
  int64_t ssm_n_k_heads = 0;    // ssm.group_count
  int64_t ssm_n_v_heads = 0;    // ssm.time_step_rank
  int64_t ssm_d_inner = 0;      // ssm_d_state * ssm_n_v_heads

  bool is_recurrent(int64_t layer) const {
    return layer >= 0 && static_cast<size_t>(layer) < recurrent_layers.size() && recurrent_layers[static_cast<size_t>(layer)];
  }
  bool is_hybrid() const { return !recurrent_layers.empty(); }
  int64_t ssm_conv_channels() const { return 2 * ssm_n_k_heads * ssm_d_state + ssm_d_inner; }

  bool is_swa(int64_t layer) const {
    return n_swa > 0 && layer >= 0 && static_cast<size_t>(layer) < swa_layers.size() && swa_layers[static_cast<size_t>(layer)];
  }
};

// Throws std::invalid_argument for an unsupported architecture or missing keys.
// n_vocab is taken from the token embedding (the caller passes it).
Hparams read_hparams(const gguf::Metadata& metadata, int64_t n_vocab);

}  // namespace pico::model
