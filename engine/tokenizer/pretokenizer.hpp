// Pre-tokenizers of byte-level BPE vocabularies: split text into the words BPE merges
// within, as the regexes of the Hugging Face tokenizers do. Each family is an explicit
// state machine over code points (no regex engine). The name in the GGUF key
// `tokenizer.ggml.pre` selects the family, with the same names and the same splits as
// llama.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace pico::tokenizer {

enum class PreTokenizer {
  // [\p{P}$+<=>^~|]+ , then GPT-2's, then \p{N}+ , then [0-9]{3} (llama.cpp's fallback)
  Default,
  // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  Gpt2,
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  Llama3,
  // as Llama3 with \p{N} (one digit per word)
  Qwen2,
  // as Qwen2 with [\p{L}\p{M}]+ for letters
  Qwen35,
  // \p{N} isolated, then GPT-2's
  StarCoder,
  // [\p{P}$+<=>^~|`]+ , then GPT-2's, then [0-9]{3}
  Falcon,
  // [^\n]+|[\n]+ , then Qwen2's (laguna)
  NewlinesQwen2,
  // [^\n]+|[\n]+ only (SPM-style BPE: gemma4)
  Newlines,
};

struct PreTokenizerConfig {
  PreTokenizer kind = PreTokenizer::Default;
  bool ignore_merges = false;      // a word that is a token is taken whole
  bool clean_spaces = true;        // detokenize removes " ." " ," ... as llama.cpp does
  bool add_bos = false;            // llama.cpp forces add_bos on for these (before the GGUF key)
  bool byte_encode = true;         // GPT-2 byte-to-unicode encoding of words
  bool escape_whitespace = false;  // spaces become U+2581 (SPM-style BPE)
  bool no_bos = false;             // no BOS token unless the GGUF names one (chatglm)
};

// The configuration llama.cpp derives from a `tokenizer.ggml.pre` name; an empty name
// is "default". nullopt for a name it does not know or pico does not implement.
std::optional<PreTokenizerConfig> pretokenizer_for_name(std::string_view name);

// Splits `cps` into words; returns their lengths in code points (they add up to
// cps.size(); none is 0).
std::vector<size_t> pretokenize(PreTokenizer kind, std::span<const uint32_t> cps);

}  // namespace pico::tokenizer
