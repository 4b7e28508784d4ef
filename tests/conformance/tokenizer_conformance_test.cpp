// pico's tokenizer against llama.cpp's, on real vocabularies.
//
// Per vocabulary (llama2, gemma3, qwen3, llama3, gpt2): writes a one-layer synthetic
// GGUF with that vocabulary (tools/synthetic), has llama.cpp (node-llama-cpp, through
// tokenizer_reference.mjs) tokenize and detokenize every file of tokenizer_corpus/,
// and requires the same result from pico, file by file:
//   - ids with BOS/EOS as the metadata asks, special-token texts left as text;
//   - the same with special-token texts parsed;
//   - the text of both id lists (llama_detokenize, special tokens hidden / shown);
// and that the text round-trips: the pieces of encode(text) add up to the text.
//
// Files named *.invalid.txt hold invalid UTF-8. The reference reads files as
// JavaScript strings, which replaces each bad byte with U+FFFD before llama.cpp sees
// it; llama.cpp's BPE tokenizers make the same replacement themselves, so such files
// are compared for BPE vocabularies only (SPM tokenizes the raw bytes).
//
// Fails, never skips, when node or the vocabulary packages are missing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "gguf/reader.hpp"
#include "synthetic/synthetic_model.hpp"
#include "tokenizer/chat_template.hpp"
#include "tokenizer/tokenizer.hpp"
#include "tokenizer/unicode.hpp"

namespace {

namespace fs = std::filesystem;
using pico::tokenizer::Tokenizer;

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// PICO_TOKENIZER_CORPUS names another folder of .txt files to compare on.
std::vector<fs::path> corpus_files() {
  std::vector<fs::path> files;
  const char* env = std::getenv("PICO_TOKENIZER_CORPUS");
  const fs::path dir = env && *env ? fs::path(env) : fs::path(PICO_TOKENIZER_CORPUS_DIR);
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_regular_file() && entry.path().extension() == ".txt") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// Runs `command`, returns its standard output; fails the test on a non-zero exit.
std::string run(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) {
    ADD_FAILURE() << "cannot run: " << command;
    return out;
  }
  char buffer[1 << 16];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  const int status = pclose(pipe);
  EXPECT_EQ(status, 0) << "command failed: " << command;
  return out;
}

std::string quote(const fs::path& p) { return "'" + p.string() + "'"; }

// First position where two id lists differ, with a little context of both.
std::string describe_difference(const std::vector<int32_t>& got, const std::vector<int32_t>& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  auto slice = [i](const std::vector<int32_t>& v) {
    std::string s;
    for (size_t k = i >= 3 ? i - 3 : 0; k < std::min(v.size(), i + 5); ++k) s += std::to_string(v[k]) + " ";
    return s;
  };
  return "first difference at " + std::to_string(i) + " of " + std::to_string(got.size()) + "/" +
         std::to_string(want.size()) + ": pico [" + slice(got) + "] llama.cpp [" + slice(want) + "]";
}

// Seeded random texts: pieces that stress the pre-tokenizers and special-token
// matching (spaces, newlines, contractions, digit runs, scripts, marks, emoji,
// special-token texts) strung together, and runs of random code points from every
// plane. std::mt19937 is the same everywhere, so the texts are too.
std::vector<std::string> random_texts(size_t pieces_count, size_t codepoint_count) {
  static const char* const kPieces[] = {
      " ", "  ", "\n", "\t", "\r\n", "\r", "\u00a0", "\u3000", "\u2009", "\u0085", "\x0b", "\x0c",
      "a", "b", "e", "s", "t", "hello", "World", "THE", "x", "Z", "'", "'s", "'S", "'ll", "'re", "'ve", "'d", "'m",
      "'t", "''", "0", "1", "12", "345", "6789", "\u0663", "\u00bd", "\u00b2", "\u2167", ".", ",", "!", "?", "...",
      "-", "_", "(", ")", "[", "]", "{", "}", "<", ">", "/", "\\", "|", "$", "+", "=", "^", "~", "`", "@", "#", "%",
      "&", "*", ";", ":", "\"", "\u4f60", "\u597d", "\u4e16\u754c", "\u3053\u3093\u306b\u3061\u306f",
      "\ud55c\uad6d\uc5b4", "\u041f\u0440\u0438\u0432\u0435\u0442", "\u03b1\u03b2\u03b3",
      "\u0645\u0631\u062d\u0628\u0627", "\u05e9\u05dc\u05d5\u05dd", "\u0928\u092e\u0938\u094d\u0924\u0947",
      "\u0e2a\u0e27\u0e31\u0e2a", "\u00e9", "e\u0301", "\u0301", "\u0308", "\u00df", "\ufb01",
      "\U0001f600", "\U0001f44d\U0001f3fd", "\U0001f468\u200d\U0001f469\u200d\U0001f467",
      "\U0001f1fa\U0001f1f8", "1\ufe0f\u20e3", "\u200d", "\ufe0f", "\u200b", "\ufeff", "\ue000", "\u0378",
      "\ufffd", "\U0001d573", "\u2581", "\u2581\u2581", "\u0120", "\u010a", "<s>", "</s>", "<|im_start|>",
      "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<start_of_turn>", "<end_of_turn>", "<unk>", "[INST]", "<0x0A>",
      "<|begin_of_text|>", "<unused5>", "<think>", "<|fim_prefix|>", "<bos>", "<eos>", "<pad>",
  };
  std::mt19937 rng(20240229);
  auto below = [&rng](size_t n) { return static_cast<size_t>(rng() % n); };
  std::vector<std::string> texts;
  for (size_t i = 0; i < pieces_count; ++i) {
    std::string text;
    for (size_t k = 1 + below(60); k > 0; --k) text += kPieces[below(std::size(kPieces))];
    texts.push_back(std::move(text));
  }
  for (size_t i = 0; i < codepoint_count; ++i) {
    std::string text;
    for (size_t k = 1 + below(80); k > 0; --k) {
      const size_t kind = below(10);
      uint32_t cp;
      if (kind < 3) {
        cp = 0x20 + static_cast<uint32_t>(below(0x5F));
      } else if (kind < 4) {
        static const uint32_t kBlanks[] = {0x20, 0x20, 0x0A, 0x09, 0x0D, 0xA0, 0x3000, 0x2581};
        cp = kBlanks[below(std::size(kBlanks))];
      } else if (kind < 7) {
        cp = 0x80 + static_cast<uint32_t>(below(0x10000 - 0x80));
      } else {
        cp = 0x10000 + static_cast<uint32_t>(below(0x110000 - 0x10000));
      }
      if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'A';  // no surrogates: the text stays valid UTF-8
      text += pico::tokenizer::encode_utf8(cp);
    }
    texts.push_back(std::move(text));
  }
  return texts;
}

class TokenizerConformance : public ::testing::TestWithParam<pico::synthetic::VocabKind> {};

TEST_P(TokenizerConformance, MatchesLlamaCpp) {
  const auto kind = GetParam();
  const std::string name(pico::synthetic::vocab_kind_name(kind));
  const fs::path dir = fs::temp_directory_path() / ("pico-tokenizer-conformance-" + name + "-" + std::to_string(getpid()));
  fs::create_directories(dir);
  struct Cleanup {
    fs::path dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{dir};

  pico::synthetic::SyntheticSpec spec;
  spec.vocab = kind;
  spec.n_layers = 1;
  spec.n_embd = 32;
  spec.n_ff = 64;
  spec.n_head = 2;
  spec.n_head_kv = 1;
  spec.node_modules = PICO_NODE_MODULES_DIR;
  const fs::path model_path = dir / (name + ".gguf");
  pico::synthetic::write_synthetic_model(spec, model_path);

  std::vector<fs::path> files = corpus_files();
  ASSERT_FALSE(files.empty());
  const size_t corpus_count = files.size();
  if (!std::getenv("PICO_TOKENIZER_CORPUS")) {
    const std::vector<std::string> texts = random_texts(150, 100);
    for (size_t i = 0; i < texts.size(); ++i) {
      char file_name[32];
      std::snprintf(file_name, sizeof(file_name), "random_%03zu.txt", i);
      std::ofstream(dir / file_name, std::ios::binary) << texts[i];
      files.push_back(dir / file_name);
    }
  }
  std::string command = std::string(PICO_NODE_EXECUTABLE) + " " + quote(PICO_TOKENIZER_REFERENCE_SCRIPT) + " " + quote(model_path);
  for (const auto& f : files) command += " " + quote(f);
  const nlohmann::json reference = nlohmann::json::parse(run(command), nullptr, false);
  ASSERT_TRUE(reference.is_object() && reference.contains("files")) << "no reference output";

  const auto model = pico::gguf::Model::open(model_path);
  const auto tok = Tokenizer::from_metadata(model->metadata());
  const bool spm = tok->vocab().type() == pico::tokenizer::VocabType::Spm;

  size_t compared = 0, matched = 0, random_compared = 0, random_matched = 0;
  for (size_t index = 0; index < files.size(); ++index) {
    const fs::path& file = files[index];
    const bool is_random = index >= corpus_count;
    const std::string file_name = file.filename().string();
    const bool invalid_utf8 = file_name.find(".invalid.") != std::string::npos;
    if (invalid_utf8 && spm) continue;
    SCOPED_TRACE(name + " / " + file_name);
    const auto& ref = reference["files"][file.string()];
    const std::string text = read_bytes(file);
    bool all_match = true;

    for (const bool special : {false, true}) {
      const auto want = ref[special ? "special" : "plain"].get<std::vector<int32_t>>();
      const auto got = tok->encode(text, true, special);
      EXPECT_EQ(got, want) << (special ? "parse_special: " : "") << describe_difference(got, want);
      all_match = all_match && got == want;
      const std::string want_text = ref[special ? "detok_special" : "detok_plain"].get<std::string>();
      const std::string got_text = tok->decode(want, special);
      EXPECT_EQ(got_text, want_text) << "detokenize" << (special ? " (special shown)" : "");
      all_match = all_match && got_text == want_text;
    }

    // Lossless: the pieces of the ids add up to the text, with the space SPM puts in
    // front and with U+2581 read back as a space (SPM's space marker; a literal one in
    // the text cannot be told from it).
    if (!invalid_utf8) {
      std::string pieces;
      for (int32_t id : tok->encode(text, false, false)) pieces += tok->piece(id);
      std::string expected = (tok->vocab().add_space_prefix() ? " " : "") + text;
      if (tok->vocab().escape_whitespace()) {
        for (size_t at; (at = expected.find("\xE2\x96\x81")) != std::string::npos;) expected.replace(at, 3, " ");
      }
      EXPECT_TRUE(pieces == expected) << "pieces do not add up to the text";
      all_match = all_match && pieces == expected;
    }
    (is_random ? random_compared : compared) += 1;
    (is_random ? random_matched : matched) += all_match ? 1 : 0;
  }
  std::printf("[ %s ] %zu of %zu corpus files and %zu of %zu random texts match llama.cpp exactly\n", name.c_str(),
              matched, compared, random_matched, random_compared);
}

// The chat format each real vocabulary's metadata selects (tokenizer.chat_template
// from its tokenizer_config.json: qwen3's is Qwen3's thinking template; llama2 and gpt2
// have none, and fall back to ChatML as llama.cpp does).
TEST_P(TokenizerConformance, ChatFormatFromMetadata) {
  using pico::synthetic::VocabKind;
  using pico::tokenizer::ChatFormat;
  const auto kind = GetParam();
  pico::gguf::Metadata metadata;
  pico::synthetic::load_vocabulary(kind, PICO_NODE_MODULES_DIR).write_metadata(metadata);
  const auto vocab = pico::tokenizer::Vocabulary::from_metadata(metadata);
  const ChatFormat want = kind == VocabKind::gemma3   ? ChatFormat::Gemma
                          : kind == VocabKind::llama3 ? ChatFormat::Llama3
                          : kind == VocabKind::qwen3  ? ChatFormat::Qwen3
                                                      : ChatFormat::ChatML;
  EXPECT_EQ(pico::tokenizer::ChatTemplate::from_metadata(metadata, &vocab).format(), want);
}

INSTANTIATE_TEST_SUITE_P(Vocab, TokenizerConformance,
                         ::testing::Values(pico::synthetic::VocabKind::llama2, pico::synthetic::VocabKind::gemma3,
                                           pico::synthetic::VocabKind::qwen3, pico::synthetic::VocabKind::llama3,
                                           pico::synthetic::VocabKind::gpt2),
                         [](const auto& param_info) { return std::string(pico::synthetic::vocab_kind_name(param_info.param)); });

}  // namespace
