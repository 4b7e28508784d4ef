// A model's vocabulary as its GGUF metadata describes it (tokenizer.ggml.*): token
// texts, scores, types and merges, the special tokens, and the flags that steer
// tokenization, with the defaults and derived values llama.cpp uses (its special
// token ids per tokenizer model, the end-of-generation set found from token texts,
// the pre-tokenizer from `tokenizer.ggml.pre`).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gguf/value.hpp"
#include "tokenizer/pretokenizer.hpp"

namespace pico::tokenizer {

constexpr int32_t kNoToken = -1;

enum class VocabType {
  Spm,  // "llama": SentencePiece BPE by scores with byte fallback
  Bpe,  // "gpt2" (byte-level BPE by merge rank), "gemma4" (SPM-style BPE by rank)
};

// Token attributes (llama.cpp's llama_token_attr bits).
enum TokenAttr : uint32_t {
  kAttrUndefined = 0,
  kAttrUnknown = 1 << 0,
  kAttrUnused = 1 << 1,
  kAttrNormal = 1 << 2,
  kAttrControl = 1 << 3,
  kAttrUserDefined = 1 << 4,
  kAttrByte = 1 << 5,
  kAttrNormalized = 1 << 6,
  kAttrLstrip = 1 << 7,
  kAttrRstrip = 1 << 8,
  kAttrSingleWord = 1 << 9,
};

// GGUF token types (tokenizer.ggml.token_type).
enum class TokenType : int32_t { Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

struct TokenData {
  std::string text;
  float score = 0.0f;
  uint32_t attr = kAttrNormal;
};

struct SpecialTokens {
  int32_t bos = kNoToken, eos = kNoToken, eot = kNoToken, eom = kNoToken, unk = kNoToken;
  int32_t sep = kNoToken, pad = kNoToken, mask = kNoToken, newline = kNoToken;
  int32_t fim_pre = kNoToken, fim_suf = kNoToken, fim_mid = kNoToken;
  int32_t fim_pad = kNoToken, fim_rep = kNoToken, fim_sep = kNoToken;
};

class VocabError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Vocabulary {
 public:
  // Throws VocabError for a missing or malformed key, an unknown tokenizer model or an
  // unsupported pre-tokenizer.
  static Vocabulary from_metadata(const gguf::Metadata& metadata);

  VocabType type() const { return type_; }
  const std::string& model_name() const { return model_; }      // tokenizer.ggml.model
  const std::string& pre_name() const { return pre_name_; }     // tokenizer.ggml.pre
  const PreTokenizerConfig& pretokenizer() const { return pre_; }

  size_t size() const { return tokens_.size(); }
  bool valid(int32_t id) const { return id >= 0 && static_cast<size_t>(id) < tokens_.size(); }
  const TokenData& token(int32_t id) const { return tokens_.at(static_cast<size_t>(id)); }
  uint32_t attr(int32_t id) const { return token(id).attr; }
  // The id of the token with exactly this text (the last one, for duplicates), or kNoToken.
  int32_t find(std::string_view text) const;
  // Rank of the merge "left right" (BPE), or -1.
  int32_t merge_rank(std::string_view left, std::string_view right) const;
  // The token for one byte: SPM "<0xXX>" (or the byte itself as text), BPE the byte's
  // GPT-2 character; kNoToken if the vocabulary has none.
  int32_t byte_token(uint8_t byte) const;
  // The byte a byte token ("<0xXX>") stands for.
  uint8_t token_byte(int32_t id) const;

  const SpecialTokens& special() const { return special_; }
  bool is_eog(int32_t id) const;
  const std::vector<int32_t>& eog_tokens() const { return eog_; }
  // Control, user-defined and unknown tokens, longest text first (the order in which
  // the text is searched for them).
  const std::vector<int32_t>& special_tokens() const { return special_by_length_; }

  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  bool add_space_prefix() const { return add_space_prefix_; }
  bool remove_extra_whitespaces() const { return remove_extra_whitespaces_; }
  bool escape_whitespace() const { return escape_whitespace_; }  // spaces become U+2581
  bool clean_spaces() const { return clean_spaces_; }

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using StringMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

  void read_tokens(const gguf::Metadata& metadata);
  void read_merges(const gguf::Metadata& metadata);
  void read_special(const gguf::Metadata& metadata);
  void derive_special_from_texts();
  void derive_eog();
  void apply_model_attributes(const gguf::Metadata& metadata);

  VocabType type_ = VocabType::Spm;
  std::string model_, pre_name_;
  PreTokenizerConfig pre_;
  std::vector<TokenData> tokens_;
  StringMap ids_;
  StringMap merges_;  // "left right" -> rank
  SpecialTokens special_;
  std::vector<int32_t> eog_;  // sorted
  std::vector<int32_t> special_by_length_;
  bool add_bos_ = false, add_eos_ = false, add_space_prefix_ = false, remove_extra_whitespaces_ = false;
  bool escape_whitespace_ = true, clean_spaces_ = false;
};

}  // namespace pico::tokenizer
