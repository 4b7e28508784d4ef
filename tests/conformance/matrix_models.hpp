// The synthetic models and the text that the conformance matrix and the op trace
// (quantized_matrix_test.cpp, ggml_op_trace_test.cpp) evaluate with both engines:
// 2 layers, embd 256, ff 512, real vocabularies, per architecture.
#pragma once

#include "synthetic/synthetic_model.hpp"

namespace pico::conformance {

inline constexpr const char* kText =
    "The quick brown fox jumps over the lazy dog. 1234 + 5678 = 6912; naïve café, 日本語のテキスト! "
    "Once upon a time there was a little girl who lived in a village near the forest. Whenever she "
    "went out, the little girl wore a red riding cloak, so everyone in the village called her Little "
    "Red Riding Hood. One morning, she asked her mother if she could go to visit her grandmother.";

inline synthetic::SyntheticSpec matrix_model_spec(synthetic::Architecture arch) {
  synthetic::SyntheticSpec spec;
  spec.architecture = arch;
  spec.node_modules = PICO_NODE_MODULES_DIR;
  spec.seed = 7;
  spec.n_layers = 2;
  spec.n_embd = 256;  // K-quant super-blocks are 256 wide
  spec.n_ff = 512;
  spec.n_head = 4;
  spec.n_head_kv = 2;
  spec.weight_type = GgmlType::F32;
  switch (arch) {
    case synthetic::Architecture::llama: spec.vocab = synthetic::VocabKind::llama2; break;
    // Tied, as the small Qwen2.5/Qwen3 models are: one vocabulary-sized matrix
    // (llama keeps a separate head), which halves the quantizing of 152k rows.
    case synthetic::Architecture::qwen2:
      spec.vocab = synthetic::VocabKind::qwen3;
      spec.tied_embeddings = true;
      break;
    case synthetic::Architecture::qwen3:
      spec.vocab = synthetic::VocabKind::qwen3;
      spec.tied_embeddings = true;
      break;
    case synthetic::Architecture::qwen3moe:
      spec.vocab = synthetic::VocabKind::qwen3;
      spec.tied_embeddings = true;
      // 8 experts of 256 (K-quant rows of ffn_down_exps are the expert width), 2 per token.
      spec.n_expert = 8;
      spec.n_expert_used = 2;
      spec.n_ff_exp = 256;
      break;
    case synthetic::Architecture::gpt2:
      spec.vocab = synthetic::VocabKind::gpt2;
      spec.n_head_kv = 4;
      spec.tied_embeddings = true;
      break;
    case synthetic::Architecture::gemma3:
      spec.vocab = synthetic::VocabKind::gemma3;
      spec.tied_embeddings = true;
      // A window of 16 over ~100 positions: layer 0 slides, and so does layer 1
      // (of a pattern of 6, only the 6th is global).
      spec.sliding_window = 16;
      break;
    // Gated DeltaNet layer 0, full attention layer 1; every row a whole number of 256-blocks (value dim 4 x 64).
    case synthetic::Architecture::qwen35:
    case synthetic::Architecture::qwen35moe:
    case synthetic::Architecture::qwen3next:
      spec.vocab = synthetic::VocabKind::qwen3;
      spec.tied_embeddings = true;
      spec.head_dim = 64;
      spec.full_attention_interval = 2;
      spec.ssm_state = 64;
      spec.ssm_groups = 2;
      spec.ssm_value_heads = 4;
      spec.n_expert = 8;
      spec.n_expert_used = 2;
      spec.n_ff_exp = 256;
      spec.n_ff_shexp = 256;
      break;
  }
  return spec;
}

}  // namespace pico::conformance
