// The avx2 Q4_K kernel in llama.cpp's repacked-GEMM float order (see
// k_quant_repack_order_kernels.hpp; llama.cpp repacks Q4_K on any AVX2 CPU). Each
// output's step computes the four chunk sums of a super-block with 256-bit integer
// products, then runs the two float chains in scalar FMAs: the operations of the
// avx512 kernel's lanes, so both levels give the same bits.
//
// Q2_K: an AVX2-only llama.cpp does not repack it, so here it follows
// ggml_vec_dot_q2_K_q8_K's AVX2 code instead (8 float lanes, mins term first).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu/tile_driver.hpp"
#include "cpu/x86/k4_scales.hpp"
#include "cpu/x86/ymm_hsum.hpp"
#include "cpu/x86/k_quant_repack_order_kernels.hpp"
#include "quant/blocks.hpp"

namespace pico::cpu {
namespace {

using quant::BlockQ2_K;
using quant::BlockQ4_K;
using quant::BlockQ8_K;

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Element c of `v` in element 0.
inline __m128 element(__m128 v, int c) {
  switch (c) {
    case 0: return v;
    case 1: return _mm_movehdup_ps(v);
    case 2: return _mm_movehl_ps(v, v);
    default: return _mm_shuffle_ps(v, v, _MM_SHUFFLE(3, 3, 3, 3));
  }
}

// Q4_K x Q8_K: chunk g = sub-blocks 2g (low nibbles of qs[32g, +32), activations
// 64g ..) and 2g + 1 (high nibbles, activations 64g + 32 ..).
struct Q4_KRepackOrderKernel {
  static constexpr int64_t kStep = 256;
  static constexpr int kRows = 2, kCols = 4, kGemvRows = 1;
  struct Acc {
    __m128 sums, min_sums;  // element 0
  };
  struct W {
    __m256i codes[8];   // sub-block i: 32 codes (u8)
    __m256i scales[8];  // sub-block i: its scale in every int16
    __m128i min_pairs;  // int32 g: int16 (min 2g, min 2g + 1)
    float d, dmin;
  };
  struct A {
    const int8_t* qs;
    __m128i bsum_pairs;  // int32 g: int16 (sum of sub-block 2g, of 2g + 1)
    float d;
  };

  static Acc zero() { return {_mm_setzero_ps(), _mm_setzero_ps()}; }
  static float reduce(const Acc& acc) { return _mm_cvtss_f32(_mm_sub_ss(acc.sums, acc.min_sums)); }

  static W load_w(const uint8_t* row, int64_t s, int64_t) {
    const BlockQ4_K* b = reinterpret_cast<const BlockQ4_K*>(row) + s;
    const K4Scales k = unpack_k4_scales(b->scales);
    uint8_t scales[8];
    std::memcpy(scales, &k.scales_lo, 4);
    std::memcpy(scales + 4, &k.scales_hi, 4);
    W w;
    for (int i = 0; i < 8; ++i) w.scales[i] = _mm256_set1_epi16(static_cast<short>(scales[i]));
    w.min_pairs = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, static_cast<int>(k.mins_hi), static_cast<int>(k.mins_lo)));
    const __m256i mask = _mm256_set1_epi8(0x0f);
    for (int g = 0; g < 4; ++g) {
      const __m256i q = load256(b->qs + 32 * g);
      w.codes[2 * g] = _mm256_and_si256(q, mask);
      w.codes[2 * g + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
    }
    w.d = _cvtsh_ss(b->d);
    w.dmin = _cvtsh_ss(b->dmin);
    return w;
  }

  static A load_a(const uint8_t* row, int64_t s, int64_t) {
    const BlockQ8_K* b = reinterpret_cast<const BlockQ8_K*>(row) + s;
    int16_t sums32[8];
    for (int i = 0; i < 8; ++i) sums32[i] = static_cast<int16_t>(b->bsums[2 * i] + b->bsums[2 * i + 1]);
    A a;
    a.qs = b->qs;
    a.bsum_pairs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sums32));
    a.d = b->d;
    return a;
  }

  static void step(Acc& acc, const W& w, const A& a) {
    __m256i chunk[4];
    for (int g = 0; g < 4; ++g) {
      const __m256i lo = _mm256_madd_epi16(_mm256_maddubs_epi16(w.codes[2 * g], load256(a.qs + 64 * g)), w.scales[2 * g]);
      const __m256i hi =
          _mm256_madd_epi16(_mm256_maddubs_epi16(w.codes[2 * g + 1], load256(a.qs + 64 * g + 32)), w.scales[2 * g + 1]);
      chunk[g] = _mm256_add_epi32(lo, hi);
    }
    // Exact integer sums: element g = all 8 lanes of chunk[g].
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(chunk[0], chunk[1]), _mm256_hadd_epi32(chunk[2], chunk[3]));
    const __m128 sums = _mm_cvtepi32_ps(_mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
    const __m128 mins = _mm_cvtepi32_ps(_mm_madd_epi16(w.min_pairs, a.bsum_pairs));
    const __m128 d = _mm_set_ss(w.d * a.d);
    const __m128 dmin = _mm_set_ss(w.dmin * a.d);
    for (int c = 0; c < 4; ++c) {
      acc.sums = _mm_fmadd_ss(element(sums, c), d, acc.sums);
      acc.min_sums = _mm_fmadd_ss(element(mins, c), dmin, acc.min_sums);
    }
  }
};

// Q2_K x Q8_K as llama.cpp's AVX2 vec_dot: per super-block, 8 lanes of exact integer
// sums (lane l: its 4 bytes of each 32-code group, weighted by the group's scales),
// then acc += (-(d_a * dmin_w)) * mins, acc += (d_a * d_w) * sums; the lanes summed at
// the end as ggml's hsum_float_8.
struct Q2_KVecDotOrderKernel {
  static constexpr int64_t kStep = 256;
  static constexpr int kRows = 2, kCols = 4, kGemvRows = 1;
  using Acc = __m256;
  using W = const BlockQ2_K*;
  using A = const BlockQ8_K*;
  static Acc zero() { return _mm256_setzero_ps(); }
  static float reduce(const Acc& acc) { return hsum(acc); }
  static W load_w(const uint8_t* row, int64_t s, int64_t) { return reinterpret_cast<const BlockQ2_K*>(row) + s; }
  static A load_a(const uint8_t* row, int64_t s, int64_t) { return reinterpret_cast<const BlockQ8_K*>(row) + s; }

  static void step(Acc& acc, W w, A a) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w->scales));
    const __m128i low4 = _mm_set1_epi8(0x0f);
    const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), low4));
    const __m256i mins = _mm256_madd_epi16(mins16, load256(a->bsums));
    const float d = a->d * _cvtsh_ss(w->d);
    const float neg_dmin = -a->d * _cvtsh_ss(w->dmin);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(neg_dmin), _mm256_cvtepi32_ps(mins), acc);

    const __m256i three = _mm256_set1_epi8(3);
    __m256i sums = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i q = load256(w->qs + 32 * h);
      for (int g = 0; g < 4; ++g) {
        // int16 lanes 0-7: the scale of sub-block 8h + 2g, lanes 8-15: of 8h + 2g + 1.
        const int sub = 8 * h + 2 * g;
        const __m128i lo = _mm_set1_epi16(static_cast<short>(w->scales[sub] & 0x0f));
        const __m128i hi = _mm_set1_epi16(static_cast<short>(w->scales[sub + 1] & 0x0f));
        const __m256i scale = _mm256_set_m128i(hi, lo);
        const __m256i codes = _mm256_and_si256(_mm256_srli_epi16(q, 2 * g), three);
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(codes, load256(a->qs + 128 * h + 32 * g)), scale);
        sums = _mm256_add_epi32(sums, p);
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sums), acc);
  }
};

// ---------------------------------------------------------------- Q4_K GEMM, 8 rows in lanes
// The same operations per output as Q4_KRepackOrderKernel, arranged as llama.cpp's own
// AVX2 Q4_K GEMM arranges them: lane r of every vector is weight row r of an 8-row
// tile, so an output's integer sums never need a horizontal add and its two float
// chains run as vector FMAs, 8 rows at a time. Per 4 values of a sub-block the 8 rows'
// codes sit side by side (32 bytes), multiplied by the token's 4 activation bytes
// broadcast; the 8 such int16 pair sums of a sub-block add up in int16 exactly
// (|sum| <= 8 * 2 * 15 * 128 < 2^15) before the sub-block's scale (madd).

// One super-block of an 8-row tile, decoded.
struct alignas(32) Q4_KEightRows {
  __m256i codes[8][8];   // [sub-block i][values 4q .. 4q + 3]: row r's 4 codes at bytes 4r ..
  __m256i scales[8];     // sub-block i: row r's scale in int16 lanes 2r and 2r + 1
  __m256i min_pairs[4];  // chunk g: row r's (min 2g, min 2g + 1) in int16 lanes 2r, 2r + 1
  __m256 d, dmin;
};

// v[r] holds 8 int32 words of row r; afterwards v[q] holds word q of rows 0..7.
inline void transpose_eight_words(__m256i v[8]) {
  __m256i t[8], s[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    s[4 * i] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    s[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    s[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    s[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int q = 0; q < 4; ++q) {
    v[q] = _mm256_permute2x128_si256(s[q], s[q + 4], 0x20);
    v[q + 4] = _mm256_permute2x128_si256(s[q], s[q + 4], 0x31);
  }
}

void decode_eight_rows(const uint8_t* w, size_t w_row_bytes, int64_t blocks, Q4_KEightRows* out) {
  const __m256i low_nibbles = _mm256_set1_epi8(0x0f);
  for (int64_t b = 0; b < blocks; ++b) {
    Q4_KEightRows& t = out[b];
    const BlockQ4_K* blk[8];
    for (int r = 0; r < 8; ++r) blk[r] = reinterpret_cast<const BlockQ4_K*>(w + static_cast<size_t>(r) * w_row_bytes) + b;
    // Codes: word q of row r's 32 bytes of chunk g goes to int32 lane r of codes[.][q],
    // an 8 x 8 transpose of 32-bit words; low nibbles are sub-block 2g, high 2g + 1.
    for (int g = 0; g < 4; ++g) {
      __m256i v[8];
      for (int r = 0; r < 8; ++r) v[r] = load256(blk[r]->qs + 32 * g);
      transpose_eight_words(v);
      for (int q = 0; q < 8; ++q) {
        t.codes[2 * g][q] = _mm256_and_si256(v[q], low_nibbles);
        t.codes[2 * g + 1][q] = _mm256_and_si256(_mm256_srli_epi16(v[q], 4), low_nibbles);
      }
    }
    alignas(32) int16_t scales[8][16], mins[4][16];
    alignas(32) float d[8], dmin[8];
    for (int r = 0; r < 8; ++r) {
      const K4Scales k = unpack_k4_scales(blk[r]->scales);
      uint8_t sc[8], mn[8];
      std::memcpy(sc, &k.scales_lo, 4);
      std::memcpy(sc + 4, &k.scales_hi, 4);
      std::memcpy(mn, &k.mins_lo, 4);
      std::memcpy(mn + 4, &k.mins_hi, 4);
      for (int i = 0; i < 8; ++i) scales[i][2 * r] = scales[i][2 * r + 1] = sc[i];
      for (int g = 0; g < 4; ++g) {
        mins[g][2 * r] = mn[2 * g];
        mins[g][2 * r + 1] = mn[2 * g + 1];
      }
      d[r] = _cvtsh_ss(blk[r]->d);
      dmin[r] = _cvtsh_ss(blk[r]->dmin);
    }
    for (int i = 0; i < 8; ++i) t.scales[i] = _mm256_load_si256(reinterpret_cast<const __m256i*>(scales[i]));
    for (int g = 0; g < 4; ++g) t.min_pairs[g] = _mm256_load_si256(reinterpret_cast<const __m256i*>(mins[g]));
    t.d = _mm256_load_ps(d);
    t.dmin = _mm256_load_ps(dmin);
  }
}

// The int32 (sum of sub-block 2g's activations) | (sum of 2g + 1's) << 16 of chunk g.
inline int32_t bsum_pair(const BlockQ8_K* a, int g) {
  const auto lo = static_cast<uint16_t>(a->bsums[4 * g] + a->bsums[4 * g + 1]);
  const auto hi = static_cast<uint16_t>(a->bsums[4 * g + 2] + a->bsums[4 * g + 3]);
  return static_cast<int32_t>(static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16);
}

// TOKENS tokens (1 or 2) against one 8-row tile: the 8 outputs of each token.
template <int TOKENS>
inline void eight_rows_tile(const Q4_KEightRows* w, int64_t blocks, const uint8_t* const token[TOKENS], float* out[TOKENS]) {
  __m256 sums[TOKENS], min_sums[TOKENS];
  for (int t = 0; t < TOKENS; ++t) sums[t] = min_sums[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const Q4_KEightRows& tile = w[b];
    const BlockQ8_K* a[TOKENS];
    __m256 d[TOKENS], dmin[TOKENS];
    for (int t = 0; t < TOKENS; ++t) {
      a[t] = reinterpret_cast<const BlockQ8_K*>(token[t]) + b;
      d[t] = _mm256_mul_ps(tile.d, _mm256_set1_ps(a[t]->d));
      dmin[t] = _mm256_mul_ps(tile.dmin, _mm256_set1_ps(a[t]->d));
    }
    for (int g = 0; g < 4; ++g) {
      __m256i chunk[TOKENS];
      for (int t = 0; t < TOKENS; ++t) chunk[t] = _mm256_setzero_si256();
      for (int half = 0; half < 2; ++half) {
        const int i = 2 * g + half;
        __m256i pairs[TOKENS];
        for (int t = 0; t < TOKENS; ++t) pairs[t] = _mm256_setzero_si256();
        for (int q = 0; q < 8; ++q) {
          const __m256i codes = tile.codes[i][q];
          for (int t = 0; t < TOKENS; ++t) {
            int32_t four;
            std::memcpy(&four, a[t]->qs + 32 * i + 4 * q, 4);
            pairs[t] = _mm256_add_epi16(pairs[t], _mm256_maddubs_epi16(codes, _mm256_set1_epi32(four)));
          }
        }
        for (int t = 0; t < TOKENS; ++t) chunk[t] = _mm256_add_epi32(chunk[t], _mm256_madd_epi16(pairs[t], tile.scales[i]));
      }
      for (int t = 0; t < TOKENS; ++t) {
        sums[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(chunk[t]), d[t], sums[t]);
        const __m256i mins = _mm256_madd_epi16(tile.min_pairs[g], _mm256_set1_epi32(bsum_pair(a[t], g)));
        min_sums[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins), dmin[t], min_sums[t]);
      }
    }
  }
  for (int t = 0; t < TOKENS; ++t) _mm256_storeu_ps(out[t], _mm256_sub_ps(sums[t], min_sums[t]));
}

void q4_k_gemm_eight_rows(int64_t k, const void* w, size_t w_row_bytes, int64_t rows, const void* a, size_t a_row_bytes,
                          int64_t cols, float* out, int64_t out_stride) {
  using Kernel = Q4_KRepackOrderKernel;
  if (cols == 1 || rows < 8) {
    tiled_gemm<Kernel>(k, w, w_row_bytes, rows, a, a_row_bytes, cols, out, out_stride);
    return;
  }
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* ab = static_cast<const uint8_t*>(a);
  const int64_t blocks = k / Kernel::kStep;
  // Decoded tiles kept per block of rows (about half an L2 cache), run against every token.
  const auto tile_bytes = static_cast<int64_t>(sizeof(Q4_KEightRows)) * blocks;
  const int64_t tiles_per_block = std::max<int64_t>(1, static_cast<int64_t>(kWeightPanelBytes) / tile_bytes);
  thread_local std::vector<Q4_KEightRows> panel;
  const int64_t full_rows = rows / 8 * 8;
  for (int64_t r0 = 0; r0 < full_rows; r0 += 8 * tiles_per_block) {
    const int64_t tiles = std::min(tiles_per_block, (full_rows - r0) / 8);
    panel.resize(static_cast<size_t>(tiles * blocks));
    for (int64_t i = 0; i < tiles; ++i) {
      decode_eight_rows(wb + static_cast<size_t>(r0 + 8 * i) * w_row_bytes, w_row_bytes, blocks, panel.data() + i * blocks);
    }
    int64_t c = 0;
    for (; c + 2 <= cols; c += 2) {
      const uint8_t* token[2] = {ab + c * a_row_bytes, ab + (c + 1) * a_row_bytes};
      for (int64_t i = 0; i < tiles; ++i) {
        float* o[2] = {out + c * out_stride + r0 + 8 * i, out + (c + 1) * out_stride + r0 + 8 * i};
        eight_rows_tile<2>(panel.data() + i * blocks, blocks, token, o);
      }
    }
    for (; c < cols; ++c) {
      const uint8_t* token[1] = {ab + c * a_row_bytes};
      for (int64_t i = 0; i < tiles; ++i) {
        float* o[1] = {out + c * out_stride + r0 + 8 * i};
        eight_rows_tile<1>(panel.data() + i * blocks, blocks, token, o);
      }
    }
  }
  // The rows past the last whole tile: the same outputs through the per-row kernel.
  if (full_rows < rows) {
    tiled_gemm<Kernel>(k, wb + static_cast<size_t>(full_rows) * w_row_bytes, w_row_bytes, rows - full_rows, a,
                       a_row_bytes, cols, out + full_rows, out_stride);
  }
}

}  // namespace

void set_k_quant_repack_order_kernels_avx2(KernelTable& table) {
  set_kernel(table, GgmlType::Q4_K, tiled_vec_dot<Q4_KRepackOrderKernel>, q4_k_gemm_eight_rows);
  set_kernel(table, GgmlType::Q2_K, tiled_vec_dot<Q2_KVecDotOrderKernel>, tiled_gemm<Q2_KVecDotOrderKernel>);
}

}  // namespace pico::cpu
