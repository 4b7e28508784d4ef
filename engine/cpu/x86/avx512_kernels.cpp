// The avx512 level (F, BW, DQ, VL, VNNI): the shared 256-bit kernels recompiled with
// VNNI int8 products (ymm_kernels.hpp), replaced by 512-bit kernels for the types
// whose speed matters most (Q4_0, Q8_0: two blocks per step; F16, BF16, F32: 16
// elements per step).
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
  static constexpr int kRows = 4, kCols = 4, kGemvRows = 4;
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
inline __m512i quarters_pattern() { return _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1); }

inline bool second_block(int64_t s, int64_t k) { return 64 * s + 64 <= k; }

// Q4_0 x Q8_0, two blocks per step. Weights as unsigned nibbles u, laid out
// [low nibbles of block 0, of block 1, high nibbles of block 0, of block 1]; the
// activations permuted to match. sum (u - 8) a = sum u a - 8 sum a, the second term
// precomputed per activation block as the dot product's starting value.
struct Q4_0x2Kernel : ZmmTiles {
  static constexpr int64_t kStep = 64;
  using W = Codes2;
  using A = Activation2;
  static W load_w(const uint8_t* row, int64_t s, int64_t k) {
    const BlockQ4_0* b = block_at<BlockQ4_0>(row, 2 * s);
    const bool two = second_block(s, k);
    const __m128i q0 = load128(b[0].qs);
    const __m128i q1 = two ? load128(b[1].qs) : _mm_setzero_si128();
    const __m256i pair = _mm256_set_m128i(q1, q0);
    const __m512i both = _mm512_inserti64x4(_mm512_zextsi256_si512(pair), _mm256_srli_epi16(pair, 4), 1);
    const float d1 = two ? half_to_float(b[1].d) : 0.0f;
    return {_mm512_and_si512(both, _mm512_set1_epi8(0x0f)), spread_scales(half_to_float(b[0].d), d1, quarters_pattern())};
  }
  static A load_a(const uint8_t* row, int64_t s, int64_t k) {
    const BlockQ8_0* b = block_at<BlockQ8_0>(row, 2 * s);
    const bool two = second_block(s, k);
    const __m256i a0 = load256(b[0].qs);
    const __m256i a1 = two ? load256(b[1].qs) : _mm256_setzero_si256();
    const __m512i both = _mm512_inserti64x4(_mm512_zextsi256_si512(a0), a1, 1);
    const __m512i q = _mm512_shuffle_i64x2(both, both, _MM_SHUFFLE(3, 1, 2, 0));
    const __m512i bias = _mm512_sub_epi32(_mm512_setzero_si512(),
                                          _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(8), q));
    const float d1 = two ? half_to_float(b[1].d) : 0.0f;
    return {q, bias, spread_scales(half_to_float(b[0].d), d1, quarters_pattern())};
  }
  static void step(Acc& acc, const W& w, const A& a) {
    const __m512i p = _mm512_dpbusd_epi32(a.bias, w.q, a.q);
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

// Float rows, 16 elements per step; the tail is a masked load (zeros beyond k).
template <class Convert>
struct Float16Tiles : ZmmTiles {
  static constexpr int64_t kStep = 16;
  using W = __m512;
  using A = __m512;
  static __m512 load(const uint8_t* row, int64_t s, int64_t k) {
    const int64_t first = 16 * s;
    const int64_t n = k - first < 16 ? k - first : 16;
    const auto mask = static_cast<__mmask16>((1u << n) - 1u);
    return Convert::load16(row + first * Convert::kBytes, mask);
  }
  static W load_w(const uint8_t* row, int64_t s, int64_t k) { return load(row, s, k); }
  static A load_a(const uint8_t* row, int64_t s, int64_t k) { return load(row, s, k); }
  static void step(Acc& acc, const W& w, const A& a) { acc = _mm512_fmadd_ps(w, a, acc); }
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
  put_kernel<Q4_0x2Kernel>(table, GgmlType::Q4_0);
  put_kernel<Q8_0x2Kernel>(table, GgmlType::Q8_0);
  put_kernel<Float16Tiles<HalfToFloat16>>(table, GgmlType::F16);
  put_kernel<Float16Tiles<BFloatToFloat16>>(table, GgmlType::BF16);
  put_kernel<Float16Tiles<Float16>>(table, GgmlType::F32);
}

}  // namespace pico::cpu
