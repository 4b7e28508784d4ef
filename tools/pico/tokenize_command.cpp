// pico tokenize / pico detokenize: text <-> token ids with a model's vocabulary.
//
//   pico tokenize -m M.gguf -p "Hello" [--ids] [--special] [--no-bos]
//   pico tokenize -m M.gguf -f text.txt --ids
//   pico detokenize -m M.gguf --ids 1,15043 [--special]
//
// tokenize prints one token per line ("id <tab> piece", the piece JSON-escaped), or
// with --ids a JSON array of the ids. The file is used byte for byte.
#include <fmt/format.h>

#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.hpp"
#include "gguf/reader.hpp"
#include "tokenizer/tokenizer.hpp"

namespace pico::cli {
namespace {

struct TokenizeOptions {
  std::string model_path;
  std::string prompt;
  std::string file;
  bool ids_only = false;
  bool parse_special = false;
  bool no_bos = false;
};

struct DetokenizeOptions {
  std::string model_path;
  std::string ids;
  bool show_special = false;
};

std::unique_ptr<tokenizer::Tokenizer> load_tokenizer(const std::string& path) {
  gguf::ReadOptions read;
  read.open_splits = false;  // the vocabulary is in the first file
  const auto model = gguf::Model::open(path, read);
  return tokenizer::Tokenizer::from_metadata(model->metadata());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// JSON string literal; bytes that are not valid UTF-8 are written as \u00XX of the byte.
std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F) {
      out += fmt::format("\\u{:04x}", c);
    } else if (c < 0x80) {
      out += static_cast<char>(c);
    } else {
      size_t n = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
      bool valid = n > 0 && i + n <= s.size();
      for (size_t k = 1; valid && k < n; ++k) valid = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
      if (valid) {
        out.append(s.substr(i, n));
        i += n - 1;
      } else {
        out += fmt::format("\\u{:04x}", c);
      }
    }
  }
  return out + "\"";
}

void run_tokenize(const TokenizeOptions& options) {
  if (options.prompt.empty() == options.file.empty()) throw std::runtime_error("give exactly one of -p and -f");
  const auto tok = load_tokenizer(options.model_path);
  const std::string text = options.file.empty() ? options.prompt : read_file(options.file);
  const std::vector<int32_t> ids = tok->encode(text, !options.no_bos, options.parse_special);
  if (options.ids_only) {
    std::string out = "[";
    for (size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
    std::cout << out << "]\n";
    return;
  }
  for (int32_t id : ids) std::cout << id << "\t" << json_string(tok->piece(id, true)) << "\n";
}

std::vector<int32_t> parse_ids(const std::string& list) {
  std::vector<int32_t> ids;
  std::string cleaned;
  for (char c : list) cleaned += (c == '[' || c == ']' || c == ',') ? ' ' : c;
  std::istringstream in(cleaned);
  long long value = 0;
  while (in >> value) {
    if (value < 0 || value > INT32_MAX) throw std::runtime_error("bad token id " + std::to_string(value));
    ids.push_back(static_cast<int32_t>(value));
  }
  if (!in.eof()) throw std::runtime_error("--ids must be a list of token ids like 1,2,3");
  return ids;
}

void run_detokenize(const DetokenizeOptions& options) {
  const auto tok = load_tokenizer(options.model_path);
  const std::vector<int32_t> ids = parse_ids(options.ids);
  for (int32_t id : ids) {
    if (static_cast<size_t>(id) >= tok->vocab_size()) {
      throw std::runtime_error(fmt::format("token id {} outside the vocabulary ({} tokens)", id, tok->vocab_size()));
    }
  }
  std::cout << tok->decode(ids, options.show_special);
  std::cout.flush();
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto options = std::make_shared<TokenizeOptions>();
  CLI::App* command = app.add_subcommand("tokenize", "Print the token ids of a text");
  command->add_option("-m,--model", options->model_path, "GGUF model (its vocabulary)")->required();
  command->add_option("-p,--prompt", options->prompt, "Text to tokenize");
  command->add_option("-f,--file", options->file, "File whose bytes to tokenize");
  command->add_flag("--ids", options->ids_only, "Print only a JSON array of the ids");
  command->add_flag("--special", options->parse_special, "Parse special-token texts (<|im_start|>) into their tokens");
  command->add_flag("--no-bos", options->no_bos, "Do not add BOS/EOS");
  command->callback([options] { run_tokenize(*options); });

  auto detok = std::make_shared<DetokenizeOptions>();
  CLI::App* detokenize = app.add_subcommand("detokenize", "Print the text of token ids");
  detokenize->add_option("-m,--model", detok->model_path, "GGUF model (its vocabulary)")->required();
  detokenize->add_option("--ids", detok->ids, "Token ids: 1,2,3 or [1, 2, 3]")->required();
  detokenize->add_flag("--special", detok->show_special, "Show control tokens (<s>, <|im_end|>)");
  detokenize->callback([detok] { run_detokenize(*detok); });
}

}  // namespace pico::cli
