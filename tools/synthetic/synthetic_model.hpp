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
// kLogitStd 3 was chosen for that: a larger spread makes distributions peaked (and
// greedy decoding brittle under quantization), a smaller one makes them flat.
//
// "N" is an Irwin-Hall approximation (sum of four 16-bit uniforms, integer
// arithmetic, one float multiply), bit-identical on every platform and compiler:
// std::normal_distribution differs between standard libraries.
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

enum class Architecture { llama, qwen2, qwen3, qwen3moe, gpt2, gemma3 };

std::string_view architecture_name(Architecture arch);
std::optional<Architecture> parse_architecture(std::string_view name);

// Standard deviation of the head's logits over the vocabulary.
inline constexpr double kLogitStd = 3.0;
// Standard deviation of a MoE router's logits over the experts (its input is RMS
// normalised): wide enough that tokens choose different experts with clearly
// different weights, not so wide that one expert takes all the weight.
inline constexpr double kRouterLogitStd = 1.5;

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
  // qwen3moe only: experts per layer, experts per token, expert FFN width (0: n_ff).
  uint32_t n_expert = 8;
  uint32_t n_expert_used = 2;
  uint32_t n_ff_exp = 0;
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

// The whole model in memory (metadata and tensors), from an already loaded vocabulary.
gguf::Writer build_synthetic_model(const SyntheticSpec& spec, const Vocabulary& vocab);

// Loads spec.vocab from spec.node_modules, builds the model and writes it to `out`.
void write_synthetic_model(const SyntheticSpec& spec, const std::filesystem::path& out);

}  // namespace pico::synthetic
