// Text <-> token ids for a model's vocabulary, with the ids llama.cpp produces:
// SentencePiece BPE ("llama" vocabularies: Llama 2, Gemma, Mistral v1) and byte-level
// BPE ("gpt2" vocabularies: GPT-2, Llama 3, Qwen, ...; pre-tokenizer chosen by
// tokenizer.ggml.pre), special tokens, and detokenization.
//
//   auto tok = pico::tokenizer::Tokenizer::from_metadata(model->metadata());
//   std::vector<int32_t> ids = tok->encode("Hello", /*add_special=*/true, /*parse_special=*/false);
//   std::string text = tok->decode(ids);
//
// A Tokenizer is immutable after construction; its const methods may be called from
// several threads at once.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/value.hpp"
#include "tokenizer/vocab.hpp"

namespace pico::tokenizer {

namespace detail {
class SpecialMatcher;
}

class Tokenizer {
 public:
  // Throws VocabError when the metadata holds no usable vocabulary.
  static std::unique_ptr<Tokenizer> from_metadata(const gguf::Metadata& metadata);
  explicit Tokenizer(Vocabulary vocab);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // add_special: add BOS/EOS as the vocabulary asks (tokenizer.ggml.add_bos_token ...).
  // parse_special: control tokens written in the text ("<|im_start|>") become those
  // tokens; otherwise they are tokenized as plain text. User-defined tokens are
  // always matched.
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;

  // Text of a sequence of tokens, as llama.cpp's llama_detokenize(remove_special =
  // false, unparse_special = show_special): control and unknown tokens only when
  // show_special; SPM drops the space the encoder added before the first word; BPE
  // vocabularies that ask for it get llama.cpp's clean-up of spaces before
  // punctuation. The result may end inside a UTF-8 sequence.
  std::string decode(std::span<const int32_t> ids, bool show_special = false) const;

  // The bytes one token stands for ("" for control tokens unless show_special).
  std::string piece(int32_t id, bool show_special = false) const;
  // The token's text as stored in the vocabulary ("▁Hello", "ĠHello", "<0x0A>").
  const std::string& token_text(int32_t id) const { return vocab_.token(id).text; }

  bool is_eog(int32_t id) const { return vocab_.is_eog(id); }
  bool is_control(int32_t id) const { return vocab_.valid(id) && (vocab_.attr(id) & kAttrControl); }
  int32_t bos() const { return vocab_.special().bos; }
  int32_t eos() const { return vocab_.special().eos; }
  int32_t eot() const { return vocab_.special().eot; }
  bool add_bos() const { return vocab_.add_bos(); }
  size_t vocab_size() const { return vocab_.size(); }
  const Vocabulary& vocab() const { return vocab_; }

 private:
  Vocabulary vocab_;
  std::vector<std::string> pieces_;  // per token, control tokens shown
  std::unique_ptr<detail::SpecialMatcher> specials_;
};

// Incremental detokenization for streaming output: feed tokens one at a time and get
// back only whole UTF-8 characters; the bytes of a character split across tokens
// wait for the rest.
class StreamDecoder {
 public:
  // shown: control tokens whose text is written all the same (a chat format's tool-call
  // and thinking tags: llama-server's preserved tokens).
  explicit StreamDecoder(const Tokenizer& tokenizer, bool show_special = false, std::vector<int32_t> shown = {})
      : tokenizer_(tokenizer), show_special_(show_special), shown_(std::move(shown)) {
    std::sort(shown_.begin(), shown_.end());
  }

  // The text completed by this token (may be empty).
  std::string push(int32_t id);
  // Whatever is held back (an incomplete sequence at the end of the stream), as is.
  std::string flush();
  void reset() { pending_.clear(); }
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tokenizer_;
  bool show_special_;
  std::vector<int32_t> shown_;  // sorted
  std::string pending_;
};

}  // namespace pico::tokenizer
