// Seeded random GGUF models with real vocabularies: small transformers whose
// tensors, shapes and metadata are exactly what llama.cpp loads for the
// architecture, so that pico and llama.cpp can be compared on them token by token.
//
// Weights (all streams seeded per tensor from the seed and the tensor name, so a
// tensor's values do not depend on which other tensors exist):
//   projections (q, k, v, qkv, gate, up)  N(0, 1/fan_in)
//   attn_output, ffn_down                 N(0, 1/fan_in) / (2 n_layers)     (GPT-2 style)
//   output (untied)                       N(0, 1/n_embd) * kLogitStd^2
//   token_embd                            N(0, 1) untied; tied: as output
//   position_embd (gpt2)                  half the token_embd std
//   norm weights                          1 + N(0, 0.1^2)
//   output_norm when tied                 +-(1 + N(0, 0.1^2)), random signs
//   biases                                N(0, 0.1^2)
//   ffn_gate_inp (MoE router, F32)        N(0, 1/n_embd) * kRouterLogitStd^2
//   ffn_{gate,up,down}_exps               as ffn_{gate,up,down}, per expert
// The head's logits then have a standard deviation of about kLogitStd (3) over the
// vocabulary whatever n_embd is: the final norm makes the hidden state's RMS 1.
// With tied embeddings the final hidden state still points partly along the input
// token's own embedding, which (with norm weights ~1) gives that token a logit of
// ~kLogitStd * sqrt(n_embd) * cos: gemma3 (its input is scaled by sqrt(n_embd))
// repeated the input token with p > 0.99. Random signs on the final norm's weights
// cancel that self-alignment in expectation and keep the spread.
//
// Tuned against llama.cpp (tests/conformance/check_llama_loads.sh: 2 layers, embd
// 64-128, 34-46 positions of a mixed English/digits/accents/CJK text): per case the
// median max next-token probability is 0.034-0.086 (1000-9000x uniform), the range
// 0.009-0.76, never above 0.99; mean entropies are 6.1-8.1 nats against a uniform
// 10.4 (32k vocabulary) to 12.5 (262k); no position predicts its own input token.
// The hybrids (3-4 layers, embd 64, qwen3 vocabulary) land in the same band: median
// 0.034-0.043, range 0.014-0.40, mean entropy 7.6-7.7 nats (uniform 11.9); so do the
// benchmark shapes (24 layers embd 1024 qwen35, 12 layers 64 experts qwen35moe: 0.046).
// kLogitStd 3 was chosen for that: a larger spread makes distributions peaked (and
// greedy decoding brittle under quantization), a smaller one makes them flat.
//
// "N" is an Irwin-Hall approximation (sum of four 16-bit uniforms, integer
// arithmetic, one float multiply), bit-identical on every platform and compiler:
// std::normal_distribution differs between standard libraries.
//
// Hybrids (qwen35: dense FFN; qwen35moe, qwen3next: MoE + shared expert). Layer i is
// full (gated) attention iff (i + 1) % full_attention_interval == 0, else a Gated
// DeltaNet (linear attention) layer; attn_norm before the mixer, post_attention_norm
// before the FFN (no ffn_norm). What each gate and decay does decides its scale (the
// mixer's input is RMS normalised, so a row of std s/sqrt(n_embd) gives outputs of
// std s):
//   attn_q (query | gate per head)        query rows N(0, 1/n_embd) (RMS-normalised per head
//                                         afterwards: scale irrelevant); gate rows
//                                         N(0, kGateLogitStd^2/n_embd): sigmoid(gate) spans (0, 1)
//   attn_k, attn_v; attn_output           as above; attn_output / depth
//   attn_qkv (linear layer's q | k | v)   N(0, 1/n_embd): unit-variance conv inputs
//   attn_gate (z, the SiLU output gate)   N(0, kGateLogitStd^2/n_embd): about half the channels
//                                         closed (z < 0), the others open up to ~2-3x
//   ssm_conv1d {K, conv_dim} (F32)        N(0, 1/K): every tap counts alike and the conv output
//                                         (then SiLU, q/k L2-normalised) has variance ~1
//   ssm_beta (qwen3next: ssm_ba's b rows) N(0, kGateLogitStd^2/n_embd): beta = sigmoid(.) mean 0.5,
//                                         from ~0.02 (keep the state) to ~0.98 (overwrite)
//   ssm_alpha (ssm_ba's a rows)           N(0, kAlphaStd^2/n_embd): the per-token part of the decay,
//                                         softplus(alpha + dt_bias) moves by ~e^(+-1)
//   ssm_a (F32, A < 0), ssm_dt.bias (F32) per value head a base decay rate r = softplus(dt_bias)*|A|
//                                         log-uniform in [kDecayRateMin, kDecayRateMax], stratified
//                                         over the heads of a layer (each head its own slice of the
//                                         range, in seeded order), so decays exp(-r) span 0.998
//                                         (memory of ~500 tokens) to 0.02 (almost none) even with 2
//                                         heads; |A| = exp(U(log kAMin, log kAMax)) and
//                                         dt_bias = softplus^-1(r/|A|) (from ~-9 to ~+8)
//   ssm_norm (shared by the heads)        1 + N(0, 0.1^2) (gated RMSNorm: the delta rule's output is
//                                         tiny, the norm rescales it)
//   ssm_out                               N(0, 1/value_dim) / depth
//   ffn_gate_inp_shexp {n_embd} (F32)     N(0, kGateLogitStd^2/n_embd): the shared expert's scalar
//                                         sigmoid gate per token spans (0, 1)
//   ffn_{gate,up,down}_shexp              as ffn_{gate,up,down}
// The uniforms are 24-bit exact; ssm_a and ssm_dt.bias go through exp/log in double
// precision and are rounded once to float (identical on any libm unless a double result
// lies within an ulp of a float rounding boundary).
// qwen35/qwen35moe: rope.dimension_sections [s0, s1, s2, 0] with s0 + s1 + s2 = n_rot/2
// and s0 >= s1 >= s2 >= s0 - 1, under which llama.cpp's IMROPE rotates every pair of
// the first n_rot dims by the text position: plain NEOX partial rope, as qwen3next.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "gguf/writer.hpp"
#include "quant/type_traits.hpp"
#include "synthetic/vocabulary.hpp"

namespace pico::synthetic {

enum class Architecture { llama, qwen2, qwen3, qwen3moe, gpt2, gemma3, qwen35, qwen35moe, qwen3next };

// qwen35, qwen35moe, qwen3next: Gated DeltaNet layers between gated-attention layers.
bool is_hybrid(Architecture arch);
// qwen3moe, qwen35moe, qwen3next: routed experts in every layer.
bool has_experts(Architecture arch);

std::string_view architecture_name(Architecture arch);
std::optional<Architecture> parse_architecture(std::string_view name);

// Standard deviation of the head's logits over the vocabulary.
inline constexpr double kLogitStd = 3.0;
// Standard deviation of a MoE router's logits over the experts (its input is RMS
// normalised): wide enough that tokens choose different experts with clearly
// different weights, not so wide that one expert takes all the weight.
inline constexpr double kRouterLogitStd = 1.5;
// Hybrids (see the header): std of the logits of the sigmoid gates (attention output
// gate, beta, shared-expert gate) and of the SiLU output gate z.
inline constexpr double kGateLogitStd = 2.0;
// Std of the per-token part of the decay (alpha, added to ssm_dt.bias before softplus).
inline constexpr double kAlphaStd = 1.0;
// Base decay rates -log(decay) per token of the value heads (at alpha = 0), and |A|.
inline constexpr double kDecayRateMin = 0.002;
inline constexpr double kDecayRateMax = 4.0;
inline constexpr double kAMin = 0.5;
inline constexpr double kAMax = 16.0;

struct SyntheticSpec {
  Architecture architecture = Architecture::llama;
  std::string name;  // general.name; empty: "synthetic-<arch>-<vocab>"
  uint32_t n_layers = 2;
  uint32_t n_embd = 64;
  uint32_t n_ff = 128;
  uint32_t n_head = 4;
  uint32_t n_head_kv = 2;    // gpt2: must equal n_head
  uint32_t head_dim = 0;     // 0: n_embd / n_head (llama, qwen3, gemma3 may differ)
  uint32_t n_ctx_train = 256;
  float rope_freq_base = 0;  // 0: the architecture's usual value (10000 llama, 1e6 qwen/gemma3)
  float norm_eps = 0;        // 0: 1e-5 (llama, gpt2) or 1e-6 (qwen2, qwen3, gemma3)
  // RoPE context scaling ({arch}.rope.scaling.*): "" (none), "linear" or "yarn", by
  // `rope_scaling_factor`, from a trained context of `rope_original_context`
  // (0: n_ctx_train).
  std::string rope_scaling;
  float rope_scaling_factor = 1.0f;
  uint32_t rope_original_context = 0;
  uint32_t sliding_window = 512;  // gemma3 only (every 6th layer is global, llama.cpp's default)
  // qwen3moe, qwen35moe, qwen3next: experts per layer, experts per token, expert FFN
  // width (0: n_ff).
  uint32_t n_expert = 8;
  uint32_t n_expert_used = 2;
  uint32_t n_ff_exp = 0;
  // qwen35moe, qwen3next: the shared expert's FFN width (0: the experts' width).
  uint32_t n_ff_shexp = 0;
  // Hybrids only. Layer i is full attention iff (i + 1) % full_attention_interval == 0,
  // else Gated DeltaNet. 2 <= interval <= n_layers: at least one layer of each kind
  // (llama.cpp fails to allocate an empty recurrent state). 0: 4 (llama.cpp's default
  // and the real models'), or n_layers when there are fewer.
  uint32_t full_attention_interval = 0;
  // rope.dimension_count: the rotated dims of each head. 0: head dim, and for the
  // hybrids head dim / 4 (even, at least 2: partial rope as the real models). Only the
  // hybrids may rotate fewer than head dim.
  uint32_t rope_dims = 0;
  // Gated DeltaNet layers: conv taps K (ssm.conv_kernel), key/value head dim d_state
  // (ssm.state_size), key heads H_k (ssm.group_count), value heads H_v
  // (ssm.time_step_rank, a multiple of H_k); ssm.inner_size = d_state * H_v (0: that;
  // llama.cpp accepts nothing else).
  uint32_t ssm_conv_kernel = 4;
  uint32_t ssm_state = 32;
  uint32_t ssm_groups = 2;
  uint32_t ssm_value_heads = 4;
  uint32_t ssm_inner = 0;
  VocabKind vocab = VocabKind::llama2;
  std::filesystem::path node_modules;  // where the vocabulary packages are
  uint64_t seed = 1;
  GgmlType weight_type = GgmlType::F32;  // F32, F16 or BF16: every matrix; norms and biases stay F32
  bool tied_embeddings = false;          // omit output.weight (the head reuses token_embd)
};

// Throws std::invalid_argument for an inconsistent spec (heads not dividing, gpt2
// with grouped-query attention, an unsupported weight type, ...).
void validate(const SyntheticSpec& spec);

uint32_t head_dim_of(const SyntheticSpec& spec);
// rope.dimension_count as written (see SyntheticSpec::rope_dims).
uint32_t rope_dims_of(const SyntheticSpec& spec);
// full_attention_interval as written (see SyntheticSpec::full_attention_interval).
uint32_t full_attention_interval_of(const SyntheticSpec& spec);
// Hybrids: whether layer i is a full (gated) attention layer; other architectures: true.
bool is_full_attention_layer(const SyntheticSpec& spec, uint32_t layer);

// The whole model in memory (metadata and tensors), from an already loaded vocabulary.
gguf::Writer build_synthetic_model(const SyntheticSpec& spec, const Vocabulary& vocab);

// Loads spec.vocab from spec.node_modules, builds the model and writes it to `out`.
void write_synthetic_model(const SyntheticSpec& spec, const std::filesystem::path& out);

}  // namespace pico::synthetic
