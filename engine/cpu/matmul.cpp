#include "cpu/matmul.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace pico::cpu {
namespace {

// Row ranges handed to threads start at multiples of this (every kernel's row tile
// divides it).
constexpr int64_t kRowAlign = 8;
// Tasks per thread: several, so that a thread slowed by another process does not hold
// up the rest for long.
constexpr int64_t kTasksPerThread = 8;
// But at least this many rows per task with several tokens: each task decodes the
// activations again (see tile_driver.hpp).
constexpr int64_t kMinGemmRows = 32;

size_t row_bytes(GgmlType type, int64_t k) {
  const TypeTraits& t = type_traits(type);
  if (k % t.block_size != 0) {
    throw std::invalid_argument("row length " + std::to_string(k) + " is not a multiple of the " +
                                std::string(t.name) + " block size");
  }
  return static_cast<size_t>(k / t.block_size) * t.block_bytes;
}

const KernelTable& checked_kernels(GgmlType w_type) {
  const KernelTable& table = active_kernels();
  if (slot(w_type) >= kTypeSlots || table.gemm[slot(w_type)] == nullptr) {
    throw std::invalid_argument("no CPU kernels for type " + std::string(type_traits(w_type).name));
  }
  return table;
}

}  // namespace

GgmlType activation_type(GgmlType w_type) {
  const auto partner = type_traits(w_type).dot_partner;
  if (!partner) throw std::invalid_argument("type " + std::string(type_traits(w_type).name) + " has no dot partner");
  return *partner;
}

size_t activation_row_bytes(GgmlType w_type, int64_t k) { return row_bytes(activation_type(w_type), k); }

void quantize_activations(const ThreadPool& pool, GgmlType w_type, const float* x, int64_t k, int64_t tokens,
                          void* out) {
  const GgmlType a_type = activation_type(w_type);
  const size_t a_bytes = row_bytes(a_type, k);
  row_bytes(w_type, k);  // validates k against the weight's block size too
  const QuantizeRowFn quantize = active_kernels().quantize[slot(a_type)];
  auto* dst = static_cast<uint8_t*>(out);
  pool.parallel_for(tokens, [&](int64_t t, int) { quantize(x + t * k, dst + static_cast<size_t>(t) * a_bytes, k); });
}

void matmul_quantized(const ThreadPool& pool, GgmlType w_type, const void* w, int64_t rows, int64_t k,
                      const void* x_quantized, int64_t tokens, float* y) {
  if (rows <= 0 || tokens <= 0) return;
  const KernelTable& table = checked_kernels(w_type);
  const GemmFn gemm = table.gemm[slot(w_type)];
  const size_t w_bytes = row_bytes(w_type, k);
  const size_t a_bytes = activation_row_bytes(w_type, k);
  const auto* wb = static_cast<const uint8_t*>(w);

  // Split rows into aligned chunks: enough of them to keep every thread busy.
  const int64_t threads = pool.size();
  const int64_t wanted_tasks = threads == 1 ? 1 : threads * kTasksPerThread;
  int64_t chunk = (rows + wanted_tasks - 1) / wanted_tasks;
  chunk = std::max<int64_t>(tokens > 1 ? kMinGemmRows : kRowAlign, (chunk + kRowAlign - 1) / kRowAlign * kRowAlign);
  const int64_t n_tasks = (rows + chunk - 1) / chunk;
  pool.parallel_for(n_tasks, [&](int64_t task, int) {
    const int64_t first = task * chunk;
    const int64_t count = std::min(chunk, rows - first);
    gemm(k, wb + static_cast<size_t>(first) * w_bytes, w_bytes, count, x_quantized, a_bytes, tokens, y + first, rows);
  });
}

void matmul(const ThreadPool& pool, GgmlType w_type, const void* w, int64_t rows, int64_t k, const float* x,
            int64_t tokens, float* y) {
  checked_kernels(w_type);
  if (activation_type(w_type) == GgmlType::F32) {
    row_bytes(w_type, k);
    matmul_quantized(pool, w_type, w, rows, k, x, tokens, y);
    return;
  }
  thread_local std::vector<uint8_t> scratch;
  const size_t bytes = activation_row_bytes(w_type, k) * static_cast<size_t>(tokens);
  if (scratch.size() < bytes) scratch.resize(bytes);
  quantize_activations(pool, w_type, x, k, tokens, scratch.data());
  matmul_quantized(pool, w_type, w, rows, k, scratch.data(), tokens, y);
}

}  // namespace pico::cpu
