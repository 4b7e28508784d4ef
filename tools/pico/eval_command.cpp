// pico eval: the model's logits for a given list of token ids (conformance runs).
//
//   pico eval -m M.gguf --tokens ids.json --logits out.bin [-t N] [-b N] [--ctk f16] [--ctv f16]
//             [--greedy N]
//
// The ids are evaluated exactly as given (no BOS added), in batches of -b tokens.
// out.bin gets one row of n_vocab little-endian float32 per input token (row i: the
// logits after token i). --greedy N then generates N tokens by argmax and prints them
// as a JSON array on stdout.
//
// pico run: generate text from a prompt, streaming only the generated text on stdout.
//
//   pico run -m M.gguf -p "Once upon a time" [-n 128] [--temp 0.8] [--top-k 40]
//            [--top-p 0.95] [--min-p 0.05] [--seed S] [--ctx N] [-t N] [-b N] [--ctk f16]
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.hpp"
#include "session.hpp"
#include "sample/sampler.hpp"
#include "tokenizer/tokenizer.hpp"

namespace pico::cli {
namespace {

std::vector<int32_t> parse_ids(const std::string& text) {
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, false);
  if (!json.is_array()) throw std::invalid_argument("token file is not a JSON array");
  std::vector<int32_t> ids;
  for (const nlohmann::json& id : json) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      throw std::invalid_argument("token file: every item must be a token id (a non-negative integer)");
    }
    ids.push_back(id.get<int32_t>());
  }
  return ids;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

struct EvalOptions {
  EngineOptions engine;
  std::string tokens_path;
  std::string logits_path;
  int greedy = 0;
};

void run_eval(const EvalOptions& o) {
  Session s(o.engine);
  const std::vector<int32_t> ids = parse_ids(read_text(o.tokens_path));
  if (ids.empty()) throw std::invalid_argument("no token ids in " + o.tokens_path);
  std::FILE* out = nullptr;
  if (!o.logits_path.empty()) {
    out = std::fopen(o.logits_path.c_str(), "wb");
    if (!out) throw std::runtime_error("cannot write " + o.logits_path);
  }
  const int64_t nv = s.n_vocab();
  int32_t next = 0;
  s.eval(ids, out != nullptr, [&](size_t i, const float* row) {
    if (out && std::fwrite(row, sizeof(float), static_cast<size_t>(nv), out) != static_cast<size_t>(nv)) {
      throw std::runtime_error("write failed: " + o.logits_path);
    }
    if (i + 1 == ids.size()) next = argmax(row, nv);
  });
  if (out && std::fclose(out) != 0) throw std::runtime_error("write failed: " + o.logits_path);
  if (o.greedy > 0) {
    std::vector<int32_t> generated{next};
    while (static_cast<int>(generated.size()) < o.greedy) {
      s.eval({generated.back()}, false, [&](size_t, const float* row) { generated.push_back(argmax(row, nv)); });
    }
    std::string json = "[";
    for (size_t i = 0; i < generated.size(); ++i) json += (i ? ", " : "") + std::to_string(generated[i]);
    std::cout << json << "]\n";
  }
}

struct RunOptions {
  EngineOptions engine;
  std::string prompt;
  int n_predict = 128;
  int ctx = 0;
  sample::SamplingParams sampling;
};

void run_generate(const RunOptions& o) {
  Session s(o.engine);
  s.progress = worker::progress_bar("prompt", worker::ProgressUnit::Tokens);
  const auto tok = tokenizer::Tokenizer::from_metadata(s.file->metadata());
  std::vector<int32_t> ids = tok->encode(o.prompt, true, true);
  if (ids.empty()) throw std::invalid_argument("the prompt tokenizes to nothing");
  const int64_t ctx = context_length(s, o.ctx);
  sample::Sampler sampler(o.sampling);
  for (int32_t id : ids) sampler.remember(id);
  std::vector<float> last;
  std::vector<int32_t> cached;
  const auto t0 = std::chrono::steady_clock::now();
  evaluate_reusing_prefix(s, cached, ids, last);
  const auto t1 = std::chrono::steady_clock::now();
  const auto generated_ids = generate(s, *tok, sampler, last, o.n_predict, ctx, std::cout);
  std::cout << std::endl;
  const auto generated = static_cast<int>(generated_ids.size());
  const auto t2 = std::chrono::steady_clock::now();
  const double prefill = std::chrono::duration<double>(t1 - t0).count();
  const double decode = std::chrono::duration<double>(t2 - t1).count();
  spdlog::info("prompt: {} tokens in {:.3f} s ({:.1f} t/s); generated {} tokens in {:.3f} s ({:.1f} t/s)", ids.size(),
               prefill, static_cast<double>(ids.size()) / std::max(prefill, 1e-9), generated, decode,
               generated / std::max(decode, 1e-9));
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto eval_opts = std::make_shared<EvalOptions>();
  CLI::App* eval = app.add_subcommand("eval", "write the model's logits for a list of token ids");
  add_engine_options(eval, eval_opts->engine);
  eval->add_option("--tokens", eval_opts->tokens_path, "JSON array of token ids (evaluated as given)")->required();
  eval->add_option("--logits", eval_opts->logits_path, "output: raw float32 rows of n_vocab, one per token");
  eval->add_option("--greedy", eval_opts->greedy, "then generate N tokens by argmax; print them as JSON");
  eval->callback([eval_opts] { run_eval(*eval_opts); });

  auto run_opts = std::make_shared<RunOptions>();
  CLI::App* run = app.add_subcommand("run", "generate text from a prompt (text on stdout, logs on stderr)");
  add_engine_options(run, run_opts->engine);
  run->add_option("-p,--prompt", run_opts->prompt, "prompt text")->required();
  run->add_option("-n,--n-predict", run_opts->n_predict, "tokens to generate");
  run->add_option("-c,--ctx", run_opts->ctx, "context length (default: the model's)");
  add_sampling_options(run, run_opts->sampling);
  run->callback([run_opts] { run_generate(*run_opts); });
}

}  // namespace pico::cli
