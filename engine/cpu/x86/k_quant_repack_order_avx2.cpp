// The avx2 Q4_K kernel in llama.cpp's repacked-GEMM float order (see
// k_quant_repack_order_kernels.hpp; llama.cpp repacks Q4_K on any AVX2 CPU). Each
// output's step computes the four chunk sums of a super-block with 256-bit integer
// products, then runs the two float chains in scalar FMAs: the operations of the
// avx512 kernel's lanes, so both levels give the same bits.
//
// Q2_K: an AVX2-only llama.cpp does not repack it, so here it follows
// ggml_vec_dot_q2_K_q8_K's AVX2 code instead (8 float lanes, mins term first).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

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

}  // namespace

void set_k_quant_repack_order_kernels_avx2(KernelTable& table) {
  set_kernel(table, GgmlType::Q4_K, tiled_vec_dot<Q4_KRepackOrderKernel>, tiled_gemm<Q4_KRepackOrderKernel>);
  set_kernel(table, GgmlType::Q2_K, tiled_vec_dot<Q2_KVecDotOrderKernel>, tiled_gemm<Q2_KVecDotOrderKernel>);
}

}  // namespace pico::cpu
