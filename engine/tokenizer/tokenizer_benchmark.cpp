// Tokenizer throughput on the real vocabularies (tools/synthetic reads them from
// tests/conformance/node_modules): encode inputs of 64 KiB .. 1 MiB made of the
// conformance corpus repeated, so that time per byte can be seen to stay flat.
//
//   build/engine/tokenizer/tokenizer_benchmark [--benchmark_filter=llama3]
//
// PICO_NODE_MODULES overrides where the vocabulary packages are looked for;
// PICO_TOKENIZER_CORPUS the folder of text files (tests/conformance/tokenizer_corpus).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>

#include "synthetic/vocabulary.hpp"
#include "tokenizer/tokenizer.hpp"

namespace {

namespace fs = std::filesystem;

fs::path source_root() { return fs::path(__FILE__).parent_path().parent_path().parent_path(); }

fs::path node_modules() {
  if (const char* env = std::getenv("PICO_NODE_MODULES"); env && *env) return env;
  return source_root() / "tests" / "conformance" / "node_modules";
}

const std::string& corpus() {
  static const std::string text = [] {
    fs::path dir = source_root() / "tests" / "conformance" / "tokenizer_corpus";
    if (const char* env = std::getenv("PICO_TOKENIZER_CORPUS"); env && *env) dir = env;
    std::string all;
    std::error_code ec;
    std::map<std::string, fs::path> files;  // sorted, for a stable input
    for (const auto& entry : fs::directory_iterator(dir, ec)) files.emplace(entry.path().filename().string(), entry.path());
    for (const auto& [name, path] : files) {
      std::ifstream in(path, std::ios::binary);
      all.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    if (all.empty()) all = "The quick brown fox jumps over the lazy dog. 1234567890\n";
    return all;
  }();
  return text;
}

std::string input_of_size(size_t bytes) {
  std::string text;
  while (text.size() < bytes) text += corpus();
  text.resize(bytes);
  // Do not end inside a UTF-8 sequence.
  while (!text.empty() && (static_cast<unsigned char>(text.back()) & 0xC0) == 0x80) text.pop_back();
  if (!text.empty() && static_cast<unsigned char>(text.back()) >= 0xC0) text.pop_back();
  return text;
}

const pico::tokenizer::Tokenizer* tokenizer_for(pico::synthetic::VocabKind kind) {
  static std::map<pico::synthetic::VocabKind, std::unique_ptr<pico::tokenizer::Tokenizer>> cache;
  auto it = cache.find(kind);
  if (it == cache.end()) {
    pico::gguf::Metadata metadata;
    pico::synthetic::load_vocabulary(kind, node_modules()).write_metadata(metadata);
    it = cache.emplace(kind, pico::tokenizer::Tokenizer::from_metadata(metadata)).first;
  }
  return it->second.get();
}

void BM_Encode(benchmark::State& state, pico::synthetic::VocabKind kind) {
  const pico::tokenizer::Tokenizer* tok = nullptr;
  try {
    tok = tokenizer_for(kind);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  const std::string text = input_of_size(static_cast<size_t>(state.range(0)));
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = tok->encode(text, true, false);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(text.size()));
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["ns_per_byte"] = benchmark::Counter(static_cast<double>(text.size()),
                                                     benchmark::Counter::kIsIterationInvariantRate |
                                                         benchmark::Counter::kInvert);
}

void BM_Decode(benchmark::State& state, pico::synthetic::VocabKind kind) {
  const pico::tokenizer::Tokenizer* tok = nullptr;
  try {
    tok = tokenizer_for(kind);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  const std::string text = input_of_size(static_cast<size_t>(state.range(0)));
  const auto ids = tok->encode(text, false, false);
  for (auto _ : state) {
    std::string out = tok->decode(ids);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(text.size()));
}

using pico::synthetic::VocabKind;

#define PICO_TOKENIZER_BENCH(kind)                                                                     \
  BENCHMARK_CAPTURE(BM_Encode, kind, VocabKind::kind)->RangeMultiplier(4)->Range(64 << 10, 1 << 20)  \
      ->Unit(benchmark::kMillisecond);                                                                 \
  BENCHMARK_CAPTURE(BM_Decode, kind, VocabKind::kind)->Arg(1 << 20)->Unit(benchmark::kMillisecond)

PICO_TOKENIZER_BENCH(llama2);
PICO_TOKENIZER_BENCH(gemma3);
PICO_TOKENIZER_BENCH(qwen3);
PICO_TOKENIZER_BENCH(llama3);
PICO_TOKENIZER_BENCH(gpt2);

}  // namespace

BENCHMARK_MAIN();
