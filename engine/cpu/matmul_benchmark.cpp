// GEMV over a weight set far larger than the caches (GB/s of weights read, against
// a streaming-read baseline over the same bytes) and GEMM throughput (GFLOP/s).
//
//   matmul_benchmark --benchmark_min_time=0.5s
#include <benchmark/benchmark.h>

#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "cpu/matmul.hpp"
#include "quant/quantize.hpp"

namespace {

using pico::GgmlType;
using pico::cpu::ThreadPool;

constexpr int64_t kRowLength = 4096;
constexpr size_t kGemvBytes = size_t{1} << 30;  // 1 GiB of weights

const ThreadPool& pool(int threads) {
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  auto& p = pools[threads];
  if (!p) p = std::make_unique<ThreadPool>(threads);
  return *p;
}

size_t row_bytes(GgmlType type, int64_t k) {
  const auto& t = pico::type_traits(type);
  return static_cast<size_t>(k / t.block_size) * t.block_bytes;
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t s = seed;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(static_cast<int32_t>(s >> 8) - (1 << 23)) / static_cast<float>(1 << 23);
  }
  return v;
}

// `bytes` of weights: 64 properly quantized rows repeated (quantizing 1 GiB with the
// reference quantizers would take minutes). One weight set alive at a time.
struct Weights {
  GgmlType type;
  int64_t rows;
  std::vector<uint8_t> data;
};
const Weights& weights(GgmlType type, size_t bytes) {
  static std::unique_ptr<Weights> current;
  if (current && current->type == type && current->data.size() >= bytes) return *current;
  current.reset();
  const size_t rb = row_bytes(type, kRowLength);
  const int64_t rows = static_cast<int64_t>(bytes / rb);
  auto w = std::make_unique<Weights>(Weights{type, rows, std::vector<uint8_t>(static_cast<size_t>(rows) * rb)});
  const int64_t seed_rows = 64;
  const auto x = random_floats(static_cast<size_t>(seed_rows * kRowLength), 7);
  std::vector<uint8_t> seed(rb * seed_rows);
  pico::quantize_tensor(type, x.data(), seed.data(), seed_rows, kRowLength);
  for (int64_t r = 0; r < rows; r += seed_rows) {
    const int64_t n = std::min(seed_rows, rows - r);
    std::memcpy(w->data.data() + static_cast<size_t>(r) * rb, seed.data(), static_cast<size_t>(n) * rb);
  }
  current = std::move(w);
  return *current;
}

void BM_Gemv(benchmark::State& state, GgmlType type) {
  const int threads = static_cast<int>(state.range(0));
  const Weights& w = weights(type, kGemvBytes);
  const auto x = random_floats(kRowLength, 9);
  std::vector<float> y(static_cast<size_t>(w.rows));
  for (auto _ : state) {
    pico::cpu::matmul(pool(threads), type, w.data.data(), w.rows, kRowLength, x.data(), 1, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(w.data.size()));
  state.counters["level"] = static_cast<double>(pico::cpu::cpu_level());
}

// The same over 512 KiB of weights (in L2), one thread: the kernels' compute rate,
// which has to exceed the memory bandwidth for the large GEMV to be memory bound.
void BM_GemvCached(benchmark::State& state, GgmlType type) {
  const size_t rb = row_bytes(type, kRowLength);
  const int64_t rows = static_cast<int64_t>((size_t{512} << 10) / rb);
  std::vector<uint8_t> w(rb * static_cast<size_t>(rows));
  const auto xw = random_floats(static_cast<size_t>(rows * kRowLength), 5);
  pico::quantize_tensor(type, xw.data(), w.data(), rows, kRowLength);
  const auto x = random_floats(kRowLength, 9);
  std::vector<float> y(static_cast<size_t>(rows));
  for (auto _ : state) {
    pico::cpu::matmul(pool(1), type, w.data(), rows, kRowLength, x.data(), 1, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(w.size()));
}

// Streaming read of the same number of bytes, split like the GEMV: the bandwidth the
// GEMV is measured against.
void BM_ReadBandwidth(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  static std::vector<uint64_t> buffer(kGemvBytes / 8, 1);
  const int64_t n = static_cast<int64_t>(buffer.size());
  const int64_t tasks = 64;
  std::vector<uint64_t> sums(static_cast<size_t>(tasks));
  for (auto _ : state) {
    pool(threads).parallel_for(tasks, [&](int64_t task, int) {
      const int64_t first = n * task / tasks, last = n * (task + 1) / tasks;
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (int64_t i = first; i + 4 <= last; i += 4) {
        s0 += buffer[i];
        s1 += buffer[i + 1];
        s2 += buffer[i + 2];
        s3 += buffer[i + 3];
      }
      sums[static_cast<size_t>(task)] = s0 + s1 + s2 + s3;
    });
    benchmark::DoNotOptimize(sums.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(kGemvBytes));
}

void BM_Gemm(benchmark::State& state, GgmlType type) {
  const int64_t tokens = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  const int64_t rows = 2048;
  const size_t rb = row_bytes(type, kRowLength);
  std::vector<uint8_t> w(rb * rows);
  const auto xw = random_floats(static_cast<size_t>(rows * kRowLength), 3);
  pico::quantize_tensor(type, xw.data(), w.data(), rows, kRowLength);
  const auto x = random_floats(static_cast<size_t>(tokens * kRowLength), 4);
  std::vector<float> y(static_cast<size_t>(rows * tokens));
  for (auto _ : state) {
    pico::cpu::matmul(pool(threads), type, w.data(), rows, kRowLength, x.data(), tokens, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * 2.0 * static_cast<double>(rows * kRowLength * tokens) / 1e9,
      benchmark::Counter::kIsRate);
}

BENCHMARK(BM_ReadBandwidth)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
#define PICO_GEMV(T) BENCHMARK_CAPTURE(BM_Gemv, T, GgmlType::T)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond)
PICO_GEMV(Q4_0);
PICO_GEMV(Q8_0);
PICO_GEMV(Q4_K);
PICO_GEMV(Q6_K);
PICO_GEMV(F16);
PICO_GEMV(Q5_K);
PICO_GEMV(IQ4_NL);
#define PICO_GEMV_CACHED(T) BENCHMARK_CAPTURE(BM_GemvCached, T, GgmlType::T)->Unit(benchmark::kMicrosecond)
PICO_GEMV_CACHED(Q4_0);
PICO_GEMV_CACHED(Q8_0);
PICO_GEMV_CACHED(Q4_K);
PICO_GEMV_CACHED(Q6_K);
PICO_GEMV_CACHED(F16);
PICO_GEMV_CACHED(Q5_K);
PICO_GEMV_CACHED(Q2_K);
PICO_GEMV_CACHED(Q3_K);
PICO_GEMV_CACHED(IQ4_NL);
#define PICO_GEMM(T) \
  BENCHMARK_CAPTURE(BM_Gemm, T, GgmlType::T)->Args({1, 1})->Args({4, 1})->Args({8, 1})->Args({16, 1})->Args({64, 2})->Args({256, 2})->Args({256, 1})->UseRealTime()->Unit(benchmark::kMillisecond)
PICO_GEMM(Q4_0);
PICO_GEMM(Q8_0);
PICO_GEMM(Q4_K);
PICO_GEMM(Q6_K);
PICO_GEMM(Q5_K);
PICO_GEMM(Q3_K);
PICO_GEMM(F16);
PICO_GEMM(IQ4_NL);

}  // namespace

BENCHMARK_MAIN();
