// The avx512 level (F, BW, DQ, VL, VNNI): the shared 256-bit kernels recompiled with
// VNNI int8 products (ymm_kernels.hpp), replaced by 512-bit kernels for the types
// whose speed matters most (Q4_0: four blocks per step; Q8_0: two blocks per step;
// Q4_K: 512-bit products; F16, BF16, F32: 32 elements per step).
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics pass an "undefined" vector as the unused merge operand
// and then warn about it (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "cpu/x86/ymm_kernels.hpp"

namespace pico::cpu {
namespace {

// Fixed-order sum of 16 lanes: halves, then the 8-lane sum.
inline float hsum512(__m512 v) {
  return hsum(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

struct ZmmTiles {
  static constexpr int kRows = 4, kCols = 4, kGemvRows = 1;
  using Acc = __m512;
  static Acc zero() { return _mm512_setzero_ps(); }
  static float reduce(const Acc& acc) { return hsum512(acc); }
};

// Codes of two 32-element blocks and their scales, lane-aligned with the int32 sums
// that vpdpbusd produces from them. `bias` (activations only) starts those sums.
struct Codes2 {
  __m512i q;
  __m512 d;
};
struct Activation2 {
  __m512i q;
  __m512i bias;
  __m512 d;
};

inline __m512 spread_scales(float d0, float d1, __m512i pattern) {
  return _mm512_permutexvar_ps(pattern, _mm512_zextps128_ps512(_mm_setr_ps(d0, d1, 0.0f, 0.0f)));
}
// int32 lane i sums bytes 4i..4i+3: which of the two blocks each lane belongs to.
inline __m512i halves_pattern() { return _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1); }

inline bool second_block(int64_t s, int64_t k) { return 64 * s + 64 <= k; }

// Q4_0 x Q8_0, four blocks per step. Weights as unsigned nibbles u in two vectors,
// [low nibbles of blocks 0, 1, 2, 3] and [high nibbles of blocks 0, 1, 2, 3], the
// activations split to match, so that int32 lane i of both products belongs to block
// i / 4: both products go into one integer sum (from the bias -8 sum a, as in
// Q4_0x2), and the float accumulator takes one FMA per 128 elements. (With two
// blocks per step, the one-row GEMV was bound by the FMA dependency chain.) Blocks
// beyond k in the last step are zero codes with scale 0.
struct Codes4 {
  __m512i lo, hi;
  __m512 d;
};
struct Activation4 {
  __m512i lo, hi;
  __m512i bias;
  __m512 d;
};

inline __m512 spread_scales4(__m128 d) {
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3), _mm512_zextps128_ps512(d));
}
inline int64_t blocks_in_step4(int64_t s, int64_t k) {
  const int64_t n = (k - 128 * s) / 32;
  return n < 4 ? n : 4;
}
// The f16 scales of blocks 0-3 (0 beyond n), spread over their int32 lanes.
template <class Block>
inline __m512 scales4(const Block* b, int64_t n) {
  const auto d = [&](int i) { return i < n ? static_cast<uint32_t>(b[i].d) : 0u; };
  const __m128i h = _mm_set_epi32(0, 0, static_cast<int>(d(2) | (d(3) << 16)), static_cast<int>(d(0) | (d(1) << 16)));
  return spread_scales4(_mm_cvtph_ps(h));
}
// The last step's codes: blocks 0..n-1, zeros after.
[[gnu::noinline]] __m512i partial_codes(const BlockQ4_0* b, int64_t n) {
  alignas(64) uint8_t q[64] = {};
  for (int64_t i = 0; i < n; ++i) std::memcpy(q + 16 * i, b[i].qs, 16);
  return _mm512_load_si512(q);
}
// Blocks first, first + 1 of the last step (zeros from block n on).
[[gnu::noinline]] __m512i partial_codes(const BlockQ8_0* b, int64_t n, int64_t first) {
  alignas(64) int8_t q[64] = {};
  for (int64_t i = first; i < n && i < first + 2; ++i) std::memcpy(q + 32 * (i - first), b[i].qs, 32);
  return _mm512_load_si512(q);
}

struct Q4_0x4Kernel : ZmmTiles {
  static constexpr int64_t kStep = 128;
  using W = Codes4;
  using A = Activation4;
  static W load_w(const uint8_t* row, int64_t s, int64_t k) {
    const BlockQ4_0* b = block_at<BlockQ4_0>(row, 4 * s);
    const int64_t n = blocks_in_step4(s, k);
    __m512i raw;
    if (n == 4) [[likely]] {
      raw = _mm512_inserti32x4(_mm512_castsi128_si512(load128(b[0].qs)), load128(b[1].qs), 1);
      raw = _mm512_inserti32x4(raw, load128(b[2].qs), 2);
      raw = _mm512_inserti32x4(raw, load128(b[3].qs), 3);
    } else {
      raw = partial_codes(b, n);
    }
    const __m512i mask = _mm512_set1_epi8(0x0f);
    return {_mm512_and_si512(raw, mask), _mm512_and_si512(_mm512_srli_epi16(raw, 4), mask), scales4(b, n)};
  }
  static A load_a(const uint8_t* row, int64_t s, int64_t k) {
    const BlockQ8_0* b = block_at<BlockQ8_0>(row, 4 * s);
    const int64_t n = blocks_in_step4(s, k);
    __m512i a01, a23;
    if (n == 4) [[likely]] {
      a01 = _mm512_inserti64x4(_mm512_castsi256_si512(load256(b[0].qs)), load256(b[1].qs), 1);
      a23 = _mm512_inserti64x4(_mm512_castsi256_si512(load256(b[2].qs)), load256(b[3].qs), 1);
    } else {
      a01 = partial_codes(b, n, 0);
      a23 = partial_codes(b, n, 2);
    }
    // 128-bit lanes: a01 = [b0 0-15, b0 16-31, b1 0-15, b1 16-31], a23 likewise.
    const __m512i lo = _mm512_shuffle_i64x2(a01, a23, _MM_SHUFFLE(2, 0, 2, 0));
    const __m512i hi = _mm512_shuffle_i64x2(a01, a23, _MM_SHUFFLE(3, 1, 3, 1));
    const __m512i eight = _mm512_set1_epi8(8);
    const __m512i sum8 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), eight, lo), eight, hi);
    return {lo, hi, _mm512_sub_epi32(_mm512_setzero_si512(), sum8),
            scales4(b, n)};
  }
  static void step(Acc& acc, const W& w, const A& a) {
    const __m512i p = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(a.bias, w.lo, a.lo), w.hi, a.hi);
    acc = _mm512_fmadd_ps(_mm512_mul_ps(w.d, a.d), _mm512_cvtepi32_ps(p), acc);
  }
};

// Q8_0 x Q8_0, two blocks per step: weights offset by 128 to make them unsigned,
// sum (w + 128) a - 128 sum a.
struct Q8_0x2Kernel : ZmmTiles {
  static constexpr int64_t kStep = 64;
  using W = Codes2;
  using A = Activation2;
  static W load_w(const uint8_t* row, int64_t s, int64_t k) {
    const BlockQ8_0* b = block_at<BlockQ8_0>(row, 2 * s);
    const bool two = second_block(s, k);
    const __m256i w0 = load256(b[0].qs);
    const __m256i w1 = two ? load256(b[1].qs) : _mm256_set1_epi8(static_cast<char>(0x80));
    const __m512i both = _mm512_inserti64x4(_mm512_zextsi256_si512(w0), w1, 1);
    const float d1 = two ? half_to_float(b[1].d) : 0.0f;
    return {_mm512_xor_si512(both, _mm512_set1_epi8(static_cast<char>(0x80))),
            spread_scales(half_to_float(b[0].d), d1, halves_pattern())};
  }
  static A load_a(const uint8_t* row, int64_t s, int64_t k) {
    const BlockQ8_0* b = block_at<BlockQ8_0>(row, 2 * s);
    const bool two = second_block(s, k);
    const __m256i a0 = load256(b[0].qs);
    const __m256i a1 = two ? load256(b[1].qs) : _mm256_setzero_si256();
    const __m512i q = _mm512_inserti64x4(_mm512_zextsi256_si512(a0), a1, 1);
    const __m512i bias = _mm512_sub_epi32(
        _mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(static_cast<char>(0x80)), q));
    const float d1 = two ? half_to_float(b[1].d) : 0.0f;
    return {q, bias, spread_scales(half_to_float(b[0].d), d1, halves_pattern())};
  }
  static void step(Acc& acc, const W& w, const A& a) {
    const __m512i p = _mm512_dpbusd_epi32(a.bias, w.q, a.q);
    acc = _mm512_fmadd_ps(_mm512_mul_ps(w.d, a.d), _mm512_cvtepi32_ps(p), acc);
  }
};

// Q4_K x Q8_K with 512-bit products: each 32 bytes of codes become one vector of
// [low nibbles (sub-block 2j), high nibbles (sub-block 2j + 1)], matching 64
// consecutive activations, weighted by the two sub-block scales in one vpermw. The
// integer sums (exact) are folded to 8 lanes, then the same float steps as the
// 256-bit kernel: 4 product instructions per super-block instead of 16, and no
// per-sub-block broadcasts.
struct Q4_KZmmKernel : SuperBlockTiles<BlockQ4_K> {
  static void step(Acc& acc, W w, A a) {
    const __m128i sm = decode_scales_k4(w->scales);
    const __m512i scales16 = _mm512_cvtepu8_epi16(_mm256_zextsi128_si256(sm));  // lanes 0-7: the scales
    const __m512i upper_half = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(1), 1);
    const __m512i mask = _mm512_set1_epi8(0x0f);
    __m512i sumi = _mm512_setzero_si512();
    for (int j = 0; j < 4; ++j) {
      const __m256i q = load256(w->qs + 32 * j);
      const __m512i u = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1), mask);
      const __m512i scales = _mm512_permutexvar_epi16(_mm512_add_epi16(upper_half, _mm512_set1_epi16(static_cast<short>(2 * j))), scales16);
      const __m512i p = _mm512_madd_epi16(_mm512_maddubs_epi16(u, _mm512_loadu_si512(a->qs + 64 * j)), scales);
      sumi = _mm512_add_epi32(sumi, p);
    }
    const __m256i sum8 = _mm256_add_epi32(_mm512_castsi512_si256(sumi), _mm512_extracti64x4_epi64(sumi, 1));
    const float d = half_to_float(w->d) * a->d;
    const float dmin = half_to_float(w->dmin) * a->d;
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sum8), acc);
    acc = _mm256_fnmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(weighted_mins(a, sm)), acc);
  }
};

// Float rows, 32 elements per step into two accumulators (elements 0-15 and 16-31
// of each step), summed at the end: the one-row GEMV was bound by the latency of a
// single FMA chain. The tail is a masked load (zeros beyond k).
template <class Convert>
struct Float16Tiles : ZmmTiles {
  static constexpr int64_t kStep = 32;
  static constexpr int kRows = 4, kCols = 4;
  struct Acc {
    __m512 even, odd;
  };
  struct W {
    __m512 v0, v1;
  };
  using A = W;
  static Acc zero() { return {_mm512_setzero_ps(), _mm512_setzero_ps()}; }
  static float reduce(const Acc& acc) { return hsum512(_mm512_add_ps(acc.even, acc.odd)); }
  static __m512 load16(const uint8_t* row, int64_t first, int64_t k) {
    const int64_t n = k - first;
    const auto mask = n >= 16  ? static_cast<__mmask16>(0xffff)
                      : n <= 0 ? static_cast<__mmask16>(0)
                               : static_cast<__mmask16>((1u << n) - 1u);
    return Convert::load16(row + first * Convert::kBytes, mask);
  }
  static W load(const uint8_t* row, int64_t s, int64_t k) { return {load16(row, 32 * s, k), load16(row, 32 * s + 16, k)}; }
  static W load_w(const uint8_t* row, int64_t s, int64_t k) { return load(row, s, k); }
  static A load_a(const uint8_t* row, int64_t s, int64_t k) { return load(row, s, k); }
  static void step(Acc& acc, const W& w, const A& a) {
    acc.even = _mm512_fmadd_ps(w.v0, a.v0, acc.even);
    acc.odd = _mm512_fmadd_ps(w.v1, a.v1, acc.odd);
  }
};

struct HalfToFloat16 {
  static constexpr int64_t kBytes = 2;
  static __m512 load16(const uint8_t* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
};
struct BFloatToFloat16 {
  static constexpr int64_t kBytes = 2;
  static __m512 load16(const uint8_t* p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
  }
};
struct Float16 {
  static constexpr int64_t kBytes = 4;
  static __m512 load16(const uint8_t* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
};

}  // namespace

void fill_avx512_kernels(KernelTable& table) {
  fill_ymm_kernels(table);
  put_kernel<Q4_0x4Kernel>(table, GgmlType::Q4_0);
  put_kernel<Q8_0x2Kernel>(table, GgmlType::Q8_0);
  put_kernel<Q4_KZmmKernel>(table, GgmlType::Q4_K);
  put_kernel<Float16Tiles<HalfToFloat16>>(table, GgmlType::F16);
  put_kernel<Float16Tiles<BFloatToFloat16>>(table, GgmlType::BF16);
  put_kernel<Float16Tiles<Float16>>(table, GgmlType::F32);
}

}  // namespace pico::cpu
