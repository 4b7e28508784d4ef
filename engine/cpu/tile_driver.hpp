// The loop shared by every SIMD kernel: a tile of R weight rows x C activation rows,
// one accumulator per (row, token), each fed the same sequence of steps. vec_dot is
// the 1 x 1 tile, so gemm and vec_dot perform, per output, the same float operations
// in the same order: batch invariance holds by construction.
//
// A kernel K provides:
//   using Acc, W, A;                 accumulator; one step of a weight / activation row
//   static constexpr int64_t kStep;  elements per step (the last step may be partial)
//   static constexpr int kRows, kCols, kGemvRows;  tile shapes (gemm, and gemm with 1 token;
//                                                  kGemvRows 1: gemv_one_row_tiles)
//   static Acc zero();
//   static W load_w(const uint8_t* row, int64_t step, int64_t k);
//   static A load_a(const uint8_t* row, int64_t step, int64_t k);
//   static void step(Acc& acc, const W& w, const A& a);
//   static float reduce(const Acc& acc);
//   (optional) step2x2, see has_step2x2.
//
// Include only from ISA kernel files: everything here has internal linkage, so each
// file gets its own copy compiled with its own target flags (an inline function with
// external linkage could be merged across files and run AVX-512 code on an AVX2 CPU).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pico::cpu {
namespace {

// Weight rows stream from memory once per GEMV: prefetching this far ahead of each
// row keeps enough reads in flight (the hardware prefetcher alone falls behind on
// several interleaved streams). Only a hint: no effect on results. (x86 AVX-512,
// 1 GiB GEMV: 4096 beat 1024 and 2048 by 10-15% for Q8_0 and Q6_K.)
constexpr int64_t kPrefetchBytes = 4096;
constexpr uintptr_t kLine = 64;

// Fully unrolls a loop over a tile's rows or columns, so that its accumulators stay in
// registers (GCC kept them on the stack for kernels with large weight steps).
#if defined(__GNUC__) && !defined(__clang__)
#define PICO_UNROLL _Pragma("GCC unroll 16")
#elif defined(__clang__)
#define PICO_UNROLL _Pragma("unroll")
#else
#define PICO_UNROLL
#endif

// Every cache line of the `step_bytes` at `p`, kPrefetchBytes ahead, each line once
// over consecutive steps (a K-quant step spans two to four lines; several float or
// Q4_0 steps share one).
inline void prefetch_step(const uint8_t* p, int64_t step_bytes) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(kPrefetchBytes);
  const uintptr_t end = begin + static_cast<uintptr_t>(step_bytes);
  for (uintptr_t line = (begin + kLine - 1) & ~(kLine - 1); line < end; line += kLine) {
    __builtin_prefetch(reinterpret_cast<const void*>(line));
  }
}

// Optional: a kernel may provide
//   static void step2x2(Acc& r0c0, Acc& r0c1, Acc& r1c0, Acc& r1c1, const W& w0, const W& w1, const A& a0, const A& a1);
// used for tiles of even R and C; it must do, per output, exactly what step does
// (e.g. the same exact integer sums from a 2 x 2 matrix multiply, then step's float
// operations), so results stay identical to vec_dot.
template <class K>
concept has_step2x2 = requires(typename K::Acc& acc, const typename K::W& w, const typename K::A& a) {
  K::step2x2(acc, acc, acc, acc, w, w, a, a);
};

template <class K, int R, int C>
inline void run_tile(int64_t k, const uint8_t* w, size_t w_row_bytes, const uint8_t* a, size_t a_row_bytes, float* out,
                     int64_t out_stride) {
  typename K::Acc acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = K::zero();
  const int64_t steps = (k + K::kStep - 1) / K::kStep;
  const int64_t step_bytes = static_cast<int64_t>(w_row_bytes) / steps;
  for (int64_t s = 0; s < steps; ++s) {
    if (step_bytes != 0) {
      for (int r = 0; r < R; ++r) prefetch_step(w + r * w_row_bytes + s * step_bytes, step_bytes);
    }
    typename K::W wv[R];
    typename K::A av[C];
    for (int r = 0; r < R; ++r) wv[r] = K::load_w(w + r * w_row_bytes, s, k);
    for (int c = 0; c < C; ++c) av[c] = K::load_a(a + c * a_row_bytes, s, k);
    if constexpr (R % 2 == 0 && C % 2 == 0 && has_step2x2<K>) {
      for (int r = 0; r < R; r += 2)
        for (int c = 0; c < C; c += 2)
          K::step2x2(acc[r][c], acc[r][c + 1], acc[r + 1][c], acc[r + 1][c + 1], wv[r], wv[r + 1], av[c], av[c + 1]);
    } else {
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) K::step(acc[r][c], wv[r], av[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[c * out_stride + r] = K::reduce(acc[r][c]);
}

template <class K>
float tiled_vec_dot(int64_t k, const void* w, const void* a) {
  float out = 0.0f;
  run_tile<K, 1, 1>(k, static_cast<const uint8_t*>(w), 0, static_cast<const uint8_t*>(a), 0, &out, 1);
  return out;
}

// GEMV with kGemvRows == 1: one weight row at a time, so the weights are read as one
// sequential stream (several interleaved row streams ran 1.5-4x slower from memory
// on x86), with the activation steps decoded once per call instead of once per row.
// Per output the same steps in the same order as run_tile: identical results.
template <class K>
void gemv_one_row_tiles(int64_t k, const uint8_t* w, size_t w_row_bytes, int64_t rows, const uint8_t* a, float* out) {
  struct Slot {
    typename K::A a;
  };
  thread_local std::vector<Slot> activation;
  const int64_t steps = (k + K::kStep - 1) / K::kStep;
  activation.resize(static_cast<size_t>(steps));
  Slot* av = activation.data();
  for (int64_t s = 0; s < steps; ++s) av[s].a = K::load_a(a, s, k);
  const int64_t step_bytes = steps == 0 ? 0 : static_cast<int64_t>(w_row_bytes) / steps;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = w + r * static_cast<int64_t>(w_row_bytes);
    typename K::Acc acc = K::zero();
    for (int64_t s = 0; s < steps; ++s) {
      prefetch_step(row + s * step_bytes, step_bytes);
      K::step(acc, K::load_w(row, s, k), av[s].a);
    }
    out[r] = K::reduce(acc);
  }
}

// Decoded weight and activation steps, as the GEMM keeps them (see tiled_gemm).
template <class K>
struct WeightSlot {
  typename K::W w;
};
template <class K>
struct ActivationSlot {
  typename K::A a;
};

// run_tile on decoded steps: row r's steps at w + r * steps, column c's at
// a + c * steps. Per output the same steps in the same order as run_tile.
template <class K, int R, int C>
inline void run_panel_tile(const WeightSlot<K>* w, const ActivationSlot<K>* a, int64_t steps, float* out,
                           int64_t out_stride) {
  typename K::Acc acc[R][C];
  PICO_UNROLL for (int r = 0; r < R; ++r)
    PICO_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = K::zero();
  for (int64_t s = 0; s < steps; ++s) {
    if constexpr (R % 2 == 0 && C % 2 == 0 && has_step2x2<K>) {
      PICO_UNROLL for (int r = 0; r < R; r += 2)
        PICO_UNROLL for (int c = 0; c < C; c += 2)
          K::step2x2(acc[r][c], acc[r][c + 1], acc[r + 1][c], acc[r + 1][c + 1], w[r * steps + s].w,
                     w[(r + 1) * steps + s].w, a[c * steps + s].a, a[(c + 1) * steps + s].a);
    } else {
      PICO_UNROLL for (int r = 0; r < R; ++r)
        PICO_UNROLL for (int c = 0; c < C; ++c) K::step(acc[r][c], w[r * steps + s].w, a[c * steps + s].a);
    }
  }
  PICO_UNROLL for (int r = 0; r < R; ++r)
    PICO_UNROLL for (int c = 0; c < C; ++c) out[c * out_stride + r] = K::reduce(acc[r][c]);
}

// Decoded weights kept per block of rows: about half an L2 cache.
constexpr size_t kWeightPanelBytes = size_t{256} << 10;

// GEMM as a packed matrix multiply: the weight rows are decoded block by block into
// a per-thread panel (kWeightPanelBytes), the activations of each group of C columns
// into a small one, and the register tiles run over the two panels. Each weight step
// is decoded once per block instead of once per tile and token group, each
// activation step once per block instead of once per row tile.
template <class K>
void tiled_gemm(int64_t k, const void* w, size_t w_row_bytes, int64_t rows, const void* a, size_t a_row_bytes,
                int64_t cols, float* out, int64_t out_stride) {
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* ab = static_cast<const uint8_t*>(a);
  if constexpr (K::kGemvRows == 1) {
    if (cols == 1) {
      gemv_one_row_tiles<K>(k, wb, w_row_bytes, rows, ab, out);
      return;
    }
  }
  if (cols == 1) {
    constexpr int R = K::kGemvRows;
    int64_t r = 0;
    for (; r + R <= rows; r += R) run_tile<K, R, 1>(k, wb + r * w_row_bytes, w_row_bytes, ab, 0, out + r, out_stride);
    for (; r < rows; ++r) run_tile<K, 1, 1>(k, wb + r * w_row_bytes, w_row_bytes, ab, 0, out + r, out_stride);
    return;
  }
  constexpr int R = K::kRows;
  constexpr int C = K::kCols;
  thread_local std::vector<WeightSlot<K>> weights;
  thread_local std::vector<ActivationSlot<K>> activations;
  const int64_t steps = (k + K::kStep - 1) / K::kStep;
  const int64_t step_bytes = steps == 0 ? 0 : static_cast<int64_t>(w_row_bytes) / steps;
  // A block's decoded steps, or its raw rows where those are larger (kernels whose
  // steps are pointers into the rows), stay in cache over all the token groups.
  const auto slot_bytes = static_cast<int64_t>(sizeof(WeightSlot<K>));
  const int64_t row_panel_bytes = steps * (slot_bytes > step_bytes ? slot_bytes : step_bytes);
  int64_t block_rows = static_cast<int64_t>(kWeightPanelBytes) / (row_panel_bytes == 0 ? 1 : row_panel_bytes) / R * R;
  if (block_rows < R) block_rows = R;
  if (block_rows > rows) block_rows = rows;
  weights.resize(static_cast<size_t>(block_rows * steps));
  activations.resize(static_cast<size_t>(C * steps));
  for (int64_t r0 = 0; r0 < rows; r0 += block_rows) {
    const int64_t nr = rows - r0 < block_rows ? rows - r0 : block_rows;
    for (int64_t i = 0; i < nr; ++i) {
      const uint8_t* row = wb + (r0 + i) * static_cast<int64_t>(w_row_bytes);
      for (int64_t s = 0; s < steps; ++s) {
        prefetch_step(row + s * step_bytes, step_bytes);
        weights[static_cast<size_t>(i * steps + s)].w = K::load_w(row, s, k);
      }
    }
    for (int64_t c = 0; c < cols; c += C) {
      const int64_t n = cols - c < C ? cols - c : C;
      for (int64_t j = 0; j < n; ++j)
        for (int64_t s = 0; s < steps; ++s)
          activations[static_cast<size_t>(j * steps + s)].a = K::load_a(ab + (c + j) * a_row_bytes, s, k);
      float* oc = out + c * out_stride + r0;
      const WeightSlot<K>* wp = weights.data();
      const ActivationSlot<K>* ap = activations.data();
      int64_t i = 0;
      for (; i + R <= nr; i += R) {
        if (n == C) {
          run_panel_tile<K, R, C>(wp + i * steps, ap, steps, oc + i, out_stride);
        } else {
          for (int64_t j = 0; j < n; ++j)
            run_panel_tile<K, R, 1>(wp + i * steps, ap + j * steps, steps, oc + j * out_stride + i, out_stride);
        }
      }
      for (; i < nr; ++i) {
        if (n == C) {
          run_panel_tile<K, 1, C>(wp + i * steps, ap, steps, oc + i, out_stride);
        } else {
          for (int64_t j = 0; j < n; ++j)
            run_panel_tile<K, 1, 1>(wp + i * steps, ap + j * steps, steps, oc + j * out_stride + i, out_stride);
        }
      }
    }
  }
}

}  // namespace
}  // namespace pico::cpu
