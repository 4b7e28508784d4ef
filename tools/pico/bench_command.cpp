// pico bench: prefill and decode speed on a model, measured as
// tests/conformance/llama_bench.mjs measures llama.cpp's (scripts/bench-vs-llamacpp
// prints both): a P-token prompt evaluated in one batch, then N tokens generated one
// by one greedily. The best of --repeat runs is reported; logs go to stderr.
//
//   pico bench -m M.gguf [-p 512] [-n 128] [-t N] [--repeat 2] [--json]
#include <fmt/format.h>

#include <chrono>
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "session.hpp"

namespace pico::cli {
namespace {

struct BenchOptions {
  EngineOptions engine;
  int prompt = 512;
  int generate = 128;
  int repeat = 2;
  bool json = false;
};

// The benchmark prompt: ordinary tokens, the same sequence llama_bench.mjs uses.
std::vector<int32_t> bench_prompt(int64_t n_vocab, int n) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>(1000 + (static_cast<int64_t>(i) * 7919) % (n_vocab - 2000)));
  return ids;
}

void run_bench(BenchOptions o) {
  o.engine.batch = std::max(o.engine.batch, o.prompt);  // the prompt is one batch, as llama.cpp's is
  double best_prefill = 0, best_decode = 0, submissions_per_token = 0, dispatches_per_token = 0,
         barriers_per_token = 0;
  for (int r = 0; r < o.repeat; ++r) {
    Session s(o.engine);
    if (s.n_vocab() <= 2000) throw std::invalid_argument("bench needs a vocabulary of more than 2000 tokens");
    const std::vector<int32_t> prompt = bench_prompt(s.n_vocab(), o.prompt);
    const int64_t nv = s.n_vocab();
    int32_t next = 0;
    const auto t0 = std::chrono::steady_clock::now();
    s.eval(prompt, false, [&](size_t, const float* row) { next = argmax(row, nv); });
    const auto t1 = std::chrono::steady_clock::now();
    const uint64_t submissions_before = s.be->submissions(), dispatches_before = s.be->dispatches(),
                   barriers_before = s.be->barriers();
    for (int i = 0; i < o.generate; ++i) {
      s.eval({next}, false, [&](size_t, const float* row) { next = argmax(row, nv); });
    }
    const auto t2 = std::chrono::steady_clock::now();
    submissions_per_token = static_cast<double>(s.be->submissions() - submissions_before) / o.generate;
    dispatches_per_token = static_cast<double>(s.be->dispatches() - dispatches_before) / o.generate;
    barriers_per_token = static_cast<double>(s.be->barriers() - barriers_before) / o.generate;
    best_prefill = std::max(best_prefill, o.prompt / std::chrono::duration<double>(t1 - t0).count());
    best_decode = std::max(best_decode, o.generate / std::chrono::duration<double>(t2 - t1).count());
  }
  if (o.json) {
    std::cout << fmt::format(
        "{{\"prefill_tps\": {:.3f}, \"decode_tps\": {:.3f}, \"prompt\": {}, \"generated\": {}, "
        "\"submissions_per_token\": {:.2f}, \"dispatches_per_token\": {:.1f}, \"barriers_per_token\": {:.1f}}}\n",
        best_prefill, best_decode, o.prompt, o.generate, submissions_per_token, dispatches_per_token,
        barriers_per_token);
  } else {
    std::cout << fmt::format("prefill: {} tokens, {:.1f} tok/s\ndecode: {} tokens, {:.2f} tok/s\n", o.prompt,
                             best_prefill, o.generate, best_decode);
  }
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto options = std::make_shared<BenchOptions>();
  CLI::App* command = app.add_subcommand("bench", "Prefill and decode tok/s on a model");
  add_engine_options(command, options->engine);
  command->add_option("-p,--prompt-tokens", options->prompt, "prompt length (one batch)")->check(CLI::PositiveNumber);
  command->add_option("-n,--generate", options->generate, "tokens generated one by one")->check(CLI::PositiveNumber);
  command->add_option("--repeat", options->repeat, "runs; the best is reported")->check(CLI::PositiveNumber);
  command->add_flag("--json", options->json, "print one JSON line {\"prefill_tps\": ..., \"decode_tps\": ...}");
  command->callback([options] { run_bench(*options); });
}

}  // namespace pico::cli
