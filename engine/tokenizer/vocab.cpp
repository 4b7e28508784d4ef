#include "tokenizer/vocab.hpp"

#include <algorithm>
#include <cctype>
#include <initializer_list>

#include "tokenizer/unicode.hpp"

namespace pico::tokenizer {

namespace {

constexpr std::string_view kKeyModel = "tokenizer.ggml.model";
constexpr std::string_view kKeyPre = "tokenizer.ggml.pre";
constexpr std::string_view kKeyTokens = "tokenizer.ggml.tokens";
constexpr std::string_view kKeyScores = "tokenizer.ggml.scores";
constexpr std::string_view kKeyTokenType = "tokenizer.ggml.token_type";
constexpr std::string_view kKeyMerges = "tokenizer.ggml.merges";

bool one_of(std::string_view text, std::initializer_list<std::string_view> candidates) {
  return std::find(candidates.begin(), candidates.end(), text) != candidates.end();
}

uint32_t attr_of_type(int64_t type) {
  switch (static_cast<TokenType>(type)) {
    case TokenType::Unknown: return kAttrUnknown;
    case TokenType::Unused: return kAttrUnused;
    case TokenType::Normal: return kAttrNormal;
    case TokenType::Control: return kAttrControl;
    case TokenType::UserDefined: return kAttrUserDefined;
    case TokenType::Byte: return kAttrByte;
    case TokenType::Undefined: return kAttrUndefined;
  }
  return kAttrUndefined;
}

const gguf::Array* typed_array(const gguf::Metadata& metadata, std::string_view key,
                               std::initializer_list<gguf::ValueType> element_types) {
  const gguf::Value* value = metadata.find(key);
  if (!value) return nullptr;
  const gguf::Array* array = value->array();
  if (!array || std::find(element_types.begin(), element_types.end(), array->element_type) == element_types.end()) {
    throw VocabError("invalid GGUF type for " + std::string(key));
  }
  return array;
}

}  // namespace

Vocabulary Vocabulary::from_metadata(const gguf::Metadata& metadata) {
  Vocabulary v;
  const auto model = metadata.get_string(kKeyModel);
  if (!model) throw VocabError("no tokenizer in the model (" + std::string(kKeyModel) + " missing)");
  v.model_ = std::string(*model);
  v.pre_name_ = std::string(metadata.get_string(kKeyPre).value_or(""));

  // Defaults per tokenizer model, as llama.cpp sets them before reading the keys.
  if (v.model_ == "llama") {
    v.type_ = VocabType::Spm;
    v.special_.bos = 1;
    v.special_.eos = 2;
    v.special_.unk = 0;
    v.add_space_prefix_ = true;
    v.clean_spaces_ = false;
    v.add_bos_ = true;
    v.add_eos_ = false;
    v.escape_whitespace_ = true;
  } else if (v.model_ == "gpt2" || v.model_ == "gemma4") {
    v.type_ = VocabType::Bpe;
    if (v.model_ == "gemma4") {
      v.pre_name_ = "gemma4";
    } else {
      v.special_.bos = 11;
      v.special_.eos = 11;
    }
    auto pre = pretokenizer_for_name(v.pre_name_);
    if (!pre) throw VocabError("unsupported pre-tokenizer '" + v.pre_name_ + "'");
    v.pre_ = *pre;
    v.add_space_prefix_ = false;
    v.escape_whitespace_ = v.pre_.escape_whitespace;
    v.clean_spaces_ = v.pre_.clean_spaces;
    v.add_bos_ = v.pre_.add_bos;
    if (v.pre_.no_bos) v.special_.bos = kNoToken;
    v.read_merges(metadata);
  } else {
    throw VocabError("unsupported tokenizer model '" + v.model_ + "'");
  }
  if (auto flag = metadata.get_bool("tokenizer.ggml.add_space_prefix")) v.add_space_prefix_ = *flag;
  if (auto flag = metadata.get_bool("tokenizer.ggml.remove_extra_whitespaces")) v.remove_extra_whitespaces_ = *flag;

  v.read_tokens(metadata);
  v.read_special(metadata);
  v.derive_special_from_texts();
  v.derive_eog();

  // Tokens found by text in the input: control, user-defined and unknown ones, the
  // longest first. std::sort with llama.cpp's comparator over ids in ascending order,
  // so that tokens of equal length come in the same order as there.
  for (int32_t id = 0; id < static_cast<int32_t>(v.tokens_.size()); ++id) {
    if (v.tokens_[static_cast<size_t>(id)].attr & (kAttrControl | kAttrUserDefined | kAttrUnknown)) {
      v.special_by_length_.push_back(id);
    }
  }
  std::sort(v.special_by_length_.begin(), v.special_by_length_.end(), [&](int32_t a, int32_t b) {
    return v.tokens_[static_cast<size_t>(a)].text.size() > v.tokens_[static_cast<size_t>(b)].text.size();
  });

  v.apply_model_attributes(metadata);

  // The newline token (informational).
  if (v.type_ == VocabType::Spm) {
    v.special_.newline = v.byte_token('\n');
  } else {
    v.special_.newline = v.find(v.pre_.byte_encode ? byte_to_utf8('\n') : std::string("\n"));
  }
  return v;
}

void Vocabulary::read_merges(const gguf::Metadata& metadata) {
  const gguf::Array* merges = typed_array(metadata, kKeyMerges, {gguf::ValueType::String});
  if (!merges) throw VocabError("no tokenizer merges in the model (" + std::string(kKeyMerges) + " missing)");
  merges_.reserve(merges->items.size());
  for (size_t i = 0; i < merges->items.size(); ++i) {
    const std::string& line = *merges->items[i].string();
    // Split at the first space after the first character, as llama.cpp does; a line
    // without one is kept under the key " " (it can never match).
    const size_t space = line.find(' ', 1);
    std::string key = space == std::string::npos ? std::string(" ") : line;
    merges_.emplace(std::move(key), static_cast<int32_t>(i));
  }
}

void Vocabulary::read_tokens(const gguf::Metadata& metadata) {
  const gguf::Array* texts = typed_array(metadata, kKeyTokens, {gguf::ValueType::String});
  if (!texts) throw VocabError("no token list in the model (" + std::string(kKeyTokens) + " missing)");
  const size_t n = texts->items.size();
  if (n == 0 || n > static_cast<size_t>(INT32_MAX)) throw VocabError("bad token count");
  const gguf::Array* scores = typed_array(metadata, kKeyScores, {gguf::ValueType::Float32, gguf::ValueType::Int32});
  if (scores && scores->items.size() < n) throw VocabError("fewer scores than tokens");
  const gguf::Array* types = typed_array(metadata, kKeyTokenType, {gguf::ValueType::Int32});
  if (types && types->items.size() < n) throw VocabError("fewer token types than tokens");

  tokens_.resize(n);
  ids_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    TokenData& t = tokens_[i];
    t.text = *texts->items[i].string();
    if (t.text.empty()) t.text = "[EMPTY_" + std::to_string(i) + "]";
    ids_[t.text] = static_cast<int32_t>(i);
    if (scores) t.score = static_cast<float>(scores->items[i].as_float().value_or(0.0));
    t.attr = types ? attr_of_type(types->items[i].as_int().value_or(0)) : kAttrNormal;
  }
}

void Vocabulary::read_special(const gguf::Metadata& metadata) {
  struct Key {
    std::string_view name;
    int32_t* id;
  };
  const Key keys[] = {
      {"tokenizer.ggml.bos_token_id", &special_.bos},
      {"tokenizer.ggml.eos_token_id", &special_.eos},
      {"tokenizer.ggml.eot_token_id", &special_.eot},
      {"tokenizer.ggml.eom_token_id", &special_.eom},
      {"tokenizer.ggml.unknown_token_id", &special_.unk},
      {"tokenizer.ggml.seperator_token_id", &special_.sep},
      {"tokenizer.ggml.padding_token_id", &special_.pad},
      {"tokenizer.ggml.mask_token_id", &special_.mask},
      {"tokenizer.ggml.fim_pre_token_id", &special_.fim_pre},
      {"tokenizer.ggml.fim_suf_token_id", &special_.fim_suf},
      {"tokenizer.ggml.fim_mid_token_id", &special_.fim_mid},
      {"tokenizer.ggml.fim_pad_token_id", &special_.fim_pad},
      {"tokenizer.ggml.fim_rep_token_id", &special_.fim_rep},
      {"tokenizer.ggml.fim_sep_token_id", &special_.fim_sep},
      {"tokenizer.ggml.prefix_token_id", &special_.fim_pre},  // deprecated names
      {"tokenizer.ggml.suffix_token_id", &special_.fim_suf},
      {"tokenizer.ggml.middle_token_id", &special_.fim_mid},
  };
  for (const Key& key : keys) {
    if (*key.id != kNoToken && !valid(*key.id)) *key.id = kNoToken;  // a default past the vocabulary
    const auto value = metadata.get_int(key.name);
    if (value && *value >= 0 && *value < static_cast<int64_t>(tokens_.size())) *key.id = static_cast<int32_t>(*value);
  }
  if (auto flag = metadata.get_bool("tokenizer.ggml.add_bos_token")) add_bos_ = *flag;
  if (auto flag = metadata.get_bool("tokenizer.ggml.add_eos_token")) add_eos_ = *flag;
  if (pre_name_ == "gemma4") add_bos_ = true;  // llama.cpp's workaround for Gemma 4
}

// Special tokens the metadata does not name, found by their text as llama.cpp finds
// them (it walks a hash map, so with several candidates of one kind which one wins is
// unspecified there; here the lowest id wins). A token found so is made a control token.
void Vocabulary::derive_special_from_texts() {
  struct Rule {
    int32_t* id;
    std::initializer_list<std::string_view> texts;
  };
  const Rule rules[] = {
      {&special_.eot,
       {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>",
        "[EOT]", "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", "<end_of_utterance>"}},
      {&special_.eom, {"<|eom_id|>"}},
      {&special_.fim_pre,
       {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "begin\xEF\xBD\x9C>", "<PRE>",
        "\xE2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>"}},
      {&special_.fim_suf,
       {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81hole\xEF\xBD\x9C>", "<SUF>",
        "\xE2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>"}},
      {&special_.fim_mid,
       {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "end\xEF\xBD\x9C>", "<MID>",
        "\xE2\x96\x81<MID>", "<|code_middle|>", "<|middle|>"}},
      {&special_.fim_pad, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"}},
      {&special_.fim_rep, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"}},
      {&special_.fim_sep, {"<|file_sep|>"}},
  };
  for (const Rule& rule : rules) {
    if (*rule.id != kNoToken) continue;
    for (int32_t id = 0; id < static_cast<int32_t>(tokens_.size()); ++id) {
      TokenData& t = tokens_[static_cast<size_t>(id)];
      if (one_of(t.text, rule.texts)) {
        *rule.id = id;
        t.attr |= kAttrControl;
        break;
      }
    }
  }
  // Control tokens named "unused" are unused.
  for (TokenData& t : tokens_) {
    if ((t.attr & kAttrControl) && t.text.find("unused") != std::string::npos) t.attr |= kAttrUnused;
  }
}

void Vocabulary::derive_eog() {
  std::vector<int32_t> eog;
  for (int32_t id : {special_.fim_pad, special_.fim_rep, special_.fim_sep}) {
    if (id != kNoToken) eog.push_back(id);
  }
  for (int32_t id = 0; id < static_cast<int32_t>(tokens_.size()); ++id) {
    TokenData& t = tokens_[static_cast<size_t>(id)];
    if (one_of(t.text, {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
                        "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
                        "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
                        "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", "[e~["})) {
      eog.push_back(id);
      t.attr |= kAttrControl;
    }
  }
  // gpt-oss: these always render.
  for (TokenData& t : tokens_) {
    if (one_of(t.text, {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"})) t.attr = kAttrUserDefined;
  }
  for (int32_t id : {special_.eos, special_.eot, special_.eom}) {
    if (id != kNoToken) eog.push_back(id);
  }
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());

  const auto find_in = [&](std::string_view text) -> int32_t {
    for (int32_t id : eog) {
      if (tokens_[static_cast<size_t>(id)].text == text) return id;
    }
    return kNoToken;
  };
  // o200k_harmony and solar-open: "<|end|>" ends a message, not the generation.
  const int32_t end = find_in("<|end|>");
  const bool has_return = find_in("<|return|>") != kNoToken;
  const bool has_call = find_in("<|call|>") != kNoToken || find_in("<|calls|>") != kNoToken;
  const bool has_flush = find_in("<|flush|>") != kNoToken;
  if (end != kNoToken && ((has_return && has_call) || (has_call && has_flush))) {
    eog.erase(std::find(eog.begin(), eog.end(), end));
    tokens_[static_cast<size_t>(end)].attr = kAttrUserDefined;
  }
  // gemma4 and paddleocr: "</s>" is no end of generation next to "<|tool_response>".
  const int32_t s = find_in("</s>");
  if (s != kNoToken && find_in("<|tool_response>") != kNoToken) {
    eog.erase(std::find(eog.begin(), eog.end(), s));
    tokens_[static_cast<size_t>(s)].attr = kAttrNormal;
  }
  eog_ = std::move(eog);
}

// Per-token strip attributes llama.cpp sets from the model's name or architecture.
void Vocabulary::apply_model_attributes(const gguf::Metadata& metadata) {
  std::string name(metadata.get_string("general.name").value_or(""));
  std::transform(name.begin(), name.end(), name.begin(), [](char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); });
  const std::string arch(metadata.get_string("general.architecture").value_or(""));
  const auto contains_any = [](const std::string& text, std::initializer_list<std::string_view> parts) {
    return std::any_of(parts.begin(), parts.end(), [&](std::string_view p) { return text.find(p) != std::string::npos; });
  };
  const auto set = [&](std::string_view text, uint32_t attr, bool on) {
    const int32_t id = find(text);
    if (id == kNoToken) return;
    auto& a = tokens_[static_cast<size_t>(id)].attr;
    a = on ? (a | attr) : (a & ~attr);
  };
  if (contains_any(pre_name_, {"jina-v2-de", "jina-v2-es", "jina-v2-code"}) ||
      contains_any(arch, {"nomic-bert-moe", "jina-bert-v3"})) {
    set("<mask>", kAttrLstrip, true);
  } else if (contains_any(name, {"phi-3", "phi3"})) {
    for (int32_t id : special_by_length_) tokens_[static_cast<size_t>(id)].attr |= kAttrRstrip;
    set("</s>", kAttrRstrip, true);
    for (std::string_view t : {"<unk>", "<s>", "<|endoftext|>"}) set(t, kAttrRstrip, false);
  } else if (contains_any(name, {"modern-bert"})) {
    set("[MASK]", kAttrLstrip, true);
  }
}

int32_t Vocabulary::find(std::string_view text) const {
  const auto it = ids_.find(text);
  return it == ids_.end() ? kNoToken : it->second;
}

int32_t Vocabulary::merge_rank(std::string_view left, std::string_view right) const {
  std::string key;
  key.reserve(left.size() + 1 + right.size());
  key.append(left).push_back(' ');
  key.append(right);
  const auto it = merges_.find(key);
  return it == merges_.end() ? -1 : it->second;
}

int32_t Vocabulary::byte_token(uint8_t byte) const {
  static constexpr char kHex[] = "0123456789ABCDEF";
  if (type_ == VocabType::Spm || !pre_.byte_encode) {
    const char name[] = {'<', '0', 'x', kHex[byte >> 4], kHex[byte & 15], '>'};
    const int32_t id = find(std::string_view(name, sizeof(name)));
    if (id != kNoToken || type_ != VocabType::Spm) return id;
    return find(std::string_view(reinterpret_cast<const char*>(&byte), 1));
  }
  return find(byte_to_utf8(byte));
}

uint8_t Vocabulary::token_byte(int32_t id) const {
  const std::string& text = token(id).text;
  if (text.size() != 6) return 0;
  const auto nibble = [](char c) -> unsigned {
    if (c >= '0' && c <= '9') return static_cast<unsigned>(c - '0');
    if (c >= 'a' && c <= 'f') return static_cast<unsigned>(c - 'a' + 10);
    if (c >= 'A' && c <= 'F') return static_cast<unsigned>(c - 'A' + 10);
    return 0;
  };
  return static_cast<uint8_t>(nibble(text[3]) << 4 | nibble(text[4]));
}

bool Vocabulary::is_eog(int32_t id) const { return id != kNoToken && std::binary_search(eog_.begin(), eog_.end(), id); }

}  // namespace pico::tokenizer
