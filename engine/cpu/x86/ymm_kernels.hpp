// 256-bit kernels shared by the avx2 and avx512 levels: included by
// avx2_kernels.cpp (-mavx2 -mfma -mf16c) and avx512_kernels.cpp (AVX-512 flags),
// where the int8 dot product uses VNNI (vpdpbusd) instead of vpmaddubsw + vpmaddwd.
// Internal linkage throughout (see tile_driver.hpp).
//
// Every kernel keeps 8 float lanes per output, adds each step's 8 per-lane partial
// sums into them (scale products first, then one FMA per step), and reduces the 8
// lanes in one fixed order at the end.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/kernels.hpp"
#include "cpu/tile_driver.hpp"
#include "cpu/x86/k4_scales.hpp"
#include "cpu/x86/ymm_hsum.hpp"
#include "quant/blocks.hpp"

namespace pico::cpu {
namespace {

using quant::BlockIQ4_NL;
using quant::BlockMXFP4;
using quant::BlockQ1_0;
using quant::BlockQ2_0;
using quant::BlockQ2_K;
using quant::BlockQ3_K;
using quant::BlockQ4_0;
using quant::BlockQ4_1;
using quant::BlockQ4_K;
using quant::BlockQ5_0;
using quant::BlockQ5_1;
using quant::BlockQ5_K;
using quant::BlockQ6_K;
using quant::BlockQ8_0;
using quant::BlockQ8_1;
using quant::BlockQ8_K;

// ---------------------------------------------------------------- primitives
inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }
inline uint16_t float_to_half(float f) {
  const __m128i h = _mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT);
  return static_cast<uint16_t>(_mm_extract_epi16(h, 0));
}

template <class Block>
inline const Block* block_at(const uint8_t* row, int64_t index) {
  return reinterpret_cast<const Block*>(row) + index;
}

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

// 16 bytes of packed nibbles -> 32 bytes: low nibbles first, then high nibbles.
inline __m256i unpack_nibbles(const uint8_t* p) {
  const __m128i raw = load128(p);
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

// Sums of 4 adjacent products u8 x s8 into 8 int32 lanes. (vpmaddubsw saturates at
// int16; every caller keeps |u * s| pairs below 2^15.)
inline __m256i dot_u8_s8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// Same for two signed operands (|x| <= 128, |y| <= 127): move x's sign onto y.
inline __m256i dot_s8_s8(__m256i x, __m256i y) { return dot_u8_s8(_mm256_abs_epi8(x), _mm256_sign_epi8(y, x)); }

// Pairwise u8 x s8 products summed to int16, then weighted by int16 `scales` and
// summed in pairs to int32 (the K-quant sub-block scale step).
inline __m256i scaled_dot_u8_s8(__m256i u, __m256i s, __m256i scales16) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), scales16);
}

inline int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// Bit j of the 32-bit little-endian mask at `p` -> byte j = 0xff or 0.
inline __m256i expand_bits(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)),
                                             _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                               0x0101010101010101, 0x0000000000000000));
  const __m256i select = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
}

// ---------------------------------------------------------------- kernels with one 32-element block per step
// Weight and activation decoded to signed int8 codes plus their float scale, kept
// broadcast: a tile step then multiplies two vectors instead of forming a scalar
// product and broadcasting it per output (the same float product, so the same results;
// +16% for the Q8_0 prompt GEMM on an AVX2 Zen host). A step takes 64 bytes either way.
struct Codes {
  __m256i q;
  __m256 d;
};

struct LegacyTiles {
  static constexpr int64_t kStep = 32;
  static constexpr int kRows = 4, kCols = 4, kGemvRows = 1;
  using Acc = __m256;
  static Acc zero() { return _mm256_setzero_ps(); }
  static float reduce(const Acc& acc) { return hsum(acc); }
};

struct Q8_0Activation {
  using A = Codes;
  static A load_a(const uint8_t* row, int64_t s, int64_t) {
    const BlockQ8_0* b = block_at<BlockQ8_0>(row, s);
    return {load256(b->qs), _mm256_set1_ps(half_to_float(b->d))};
  }
};

// Signed weight codes against Q8_0: acc += (d_w * d_a) * sum(q_w * q_a).
struct SignedCodesStep {
  using W = Codes;
  static void step(__m256& acc, const W& w, const Codes& a) {
    acc = _mm256_fmadd_ps(_mm256_mul_ps(w.d, a.d), _mm256_cvtepi32_ps(dot_s8_s8(w.q, a.q)), acc);
  }
};

struct Q8_0Kernel : LegacyTiles, Q8_0Activation, SignedCodesStep {
  static W load_w(const uint8_t* row, int64_t s, int64_t k) { return load_a(row, s, k); }
};

struct Q5_0Kernel : LegacyTiles, Q8_0Activation, SignedCodesStep {
  static W load_w(const uint8_t* row, int64_t s, int64_t) {
    const BlockQ5_0* b = block_at<BlockQ5_0>(row, s);
    const __m256i high = _mm256_and_si256(expand_bits(b->qh), _mm256_set1_epi8(0x10));
    const __m256i q = _mm256_or_si256(unpack_nibbles(b->qs), high);
    return {_mm256_sub_epi8(q, _mm256_set1_epi8(16)), _mm256_set1_ps(half_to_float(b->d))};
  }
};

inline __m256i lookup16(const int8_t* table, __m256i index) {
  const __m128i t = load128(table);
  return _mm256_shuffle_epi8(_mm256_set_m128i(t, t), index);
}


// E8M0 scale, halved (pairs with the doubled e2m1 code values).
inline float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e - 1) << 23);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

struct MXFP4Kernel : LegacyTiles, Q8_0Activation, SignedCodesStep {
  static W load_w(const uint8_t* row, int64_t s, int64_t) {
    const BlockMXFP4* b = block_at<BlockMXFP4>(row, s);
    return {lookup16(quant::kFp4Values, unpack_nibbles(b->qs)), _mm256_set1_ps(e8m0_half(b->e))};
  }
};

// Q4_1 / Q5_1 against Q8_1: unsigned codes, plus the offset term m_w * s_a, which
// is summed in a float of its own.
struct OffsetAcc {
  __m256 v;
  float offset;
};
struct OffsetCodes {
  __m256i q;
  float d, m;
};

struct Q8_1Tiles {
  static constexpr int64_t kStep = 32;
  static constexpr int kRows = 4, kCols = 4, kGemvRows = 1;
  using Acc = OffsetAcc;
  using W = OffsetCodes;
  using A = OffsetCodes;
  static Acc zero() { return {_mm256_setzero_ps(), 0.0f}; }
  static float reduce(const Acc& acc) { return hsum(acc.v) + acc.offset; }
  static A load_a(const uint8_t* row, int64_t s, int64_t) {
    const BlockQ8_1* b = block_at<BlockQ8_1>(row, s);
    return {load256(b->qs), half_to_float(b->d), half_to_float(b->s)};
  }
  static void step(Acc& acc, const W& w, const A& a) {
    const __m256 d = _mm256_set1_ps(w.d * a.d);
    acc.v = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_u8_s8(w.q, a.q)), acc.v);
    acc.offset += w.m * a.m;
  }
};

struct Q4_1Kernel : Q8_1Tiles {
  static W load_w(const uint8_t* row, int64_t s, int64_t) {
    const BlockQ4_1* b = block_at<BlockQ4_1>(row, s);
    return {unpack_nibbles(b->qs), half_to_float(b->d), half_to_float(b->m)};
  }
};

struct Q5_1Kernel : Q8_1Tiles {
  static W load_w(const uint8_t* row, int64_t s, int64_t) {
    const BlockQ5_1* b = block_at<BlockQ5_1>(row, s);
    const __m256i high = _mm256_and_si256(expand_bits(b->qh), _mm256_set1_epi8(0x10));
    return {_mm256_or_si256(unpack_nibbles(b->qs), high), half_to_float(b->d), half_to_float(b->m)};
  }
};

// ---------------------------------------------------------------- Q1_0 / Q2_0: one weight block spans several Q8_0 blocks
// acc += d_w * (sum over the Q8_0 blocks s of d_s * sum_s), the inner sum per lane.
template <int kSub>
struct MultiBlockTiles {
  static constexpr int64_t kStep = 32 * kSub;
  static constexpr int kRows = 4, kCols = 4, kGemvRows = 1;
  using Acc = __m256;
  struct W {
    __m256i q[kSub];  // signed codes per Q8_0 block
    float d;
  };
  using A = const BlockQ8_0*;
  static Acc zero() { return _mm256_setzero_ps(); }
  static float reduce(const Acc& acc) { return hsum(acc); }
  static A load_a(const uint8_t* row, int64_t s, int64_t) { return block_at<BlockQ8_0>(row, s * kSub); }
  static void step(Acc& acc, const W& w, const A& a) {
    __m256 block = _mm256_setzero_ps();
    for (int i = 0; i < kSub; ++i) {
      const __m256i p = dot_s8_s8(w.q[i], load256(a[i].qs));
      block = _mm256_fmadd_ps(_mm256_set1_ps(half_to_float(a[i].d)), _mm256_cvtepi32_ps(p), block);
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(w.d), block, acc);
  }
};

struct Q1_0Kernel : MultiBlockTiles<4> {
  static W load_w(const uint8_t* row, int64_t s, int64_t) {
    const BlockQ1_0* b = block_at<BlockQ1_0>(row, s);
    W w;
    for (int i = 0; i < 4; ++i) {
      // bit set -> +1, clear -> -1
      const __m256i set = expand_bits(b->qs + 4 * i);
      w.q[i] = _mm256_sub_epi8(_mm256_and_si256(set, _mm256_set1_epi8(2)), _mm256_set1_epi8(1));
    }
    w.d = half_to_float(b->d);
    return w;
  }
};

struct Q2_0Kernel : MultiBlockTiles<2> {
  static W load_w(const uint8_t* row, int64_t s, int64_t) {
    const BlockQ2_0* b = block_at<BlockQ2_0>(row, s);
    W w;
    // Element j of a Q8_0 block: byte j / 4, bits 2 * (j % 4).
    const __m256i spread_index = _mm256_set_epi64x(0x0707070706060606, 0x0505050504040404,
                                                   0x0303030302020202, 0x0101010100000000);
    const __m256i low_bit = _mm256_set1_epi32(0x40100401);
    const __m256i high_bit = _mm256_set1_epi32(static_cast<int>(0x80200802u));
    for (int i = 0; i < 2; ++i) {
      int64_t bytes;
      std::memcpy(&bytes, b->qs + 8 * i, 8);
      const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi64x(bytes), spread_index);
      const __m256i b0 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, low_bit), low_bit),
                                          _mm256_set1_epi8(1));
      const __m256i b1 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, high_bit), high_bit),
                                          _mm256_set1_epi8(2));
      w.q[i] = _mm256_sub_epi8(_mm256_or_si256(b0, b1), _mm256_set1_epi8(1));
    }
    w.d = half_to_float(b->d);
    return w;
  }
};

// ---------------------------------------------------------------- K-quants: one 256-element super-block per step
// The weight and activation blocks are read in place (no decoding ahead), so a tile
// reuses the activation block from cache rather than from registers.
template <class Block>
struct SuperBlockTiles {
  static constexpr int64_t kStep = 256;
  static constexpr int kRows = 2, kCols = 4, kGemvRows = 1;
  using Acc = __m256;
  using W = const Block*;
  using A = const BlockQ8_K*;
  static Acc zero() { return _mm256_setzero_ps(); }
  static float reduce(const Acc& acc) { return hsum(acc); }
  static W load_w(const uint8_t* row, int64_t s, int64_t) { return block_at<Block>(row, s); }
  static A load_a(const uint8_t* row, int64_t s, int64_t) { return block_at<BlockQ8_K>(row, s); }
};

inline __m256i bsums16(const BlockQ8_K* a) { return load256(a->bsums); }

// Q4_K / Q5_K six-bit scales and mins, bytes 0-7 scales, 8-15 mins (32-bit
// arithmetic on the 12 packed bytes, no per-value loop).
inline __m128i decode_scales_k4(const uint8_t* q) {
  const K4Scales k = unpack_k4_scales(q);
  return _mm_set_epi32(static_cast<int>(k.mins_hi), static_cast<int>(k.mins_lo), static_cast<int>(k.scales_hi),
                       static_cast<int>(k.scales_lo));
}

// Byte `index` of `bytes` (unsigned) in all 16 int16 lanes.
inline __m256i broadcast_u8(__m128i bytes, int index) {
  return _mm256_cvtepu8_epi16(_mm_shuffle_epi8(bytes, _mm_set1_epi8(static_cast<char>(index))));
}

// Int8 scales `index` (lanes 0-7) and `index + 1` (lanes 8-15) as int16.
inline __m256i pair_i8(__m128i bytes, int index) {
  const auto ones = static_cast<int64_t>(0x0101010101010101ull);
  return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(bytes, _mm_set_epi64x(ones * (index + 1), ones * index)));
}

// The 8 mins (bytes 8-15), each repeated for its two groups of 16, times the bsums.
inline __m256i weighted_mins(const BlockQ8_K* a, __m128i scales_mins) {
  const __m128i mins = _mm_cvtepu8_epi16(_mm_srli_si128(scales_mins, 8));
  const __m256i per16 = _mm256_set_m128i(_mm_unpackhi_epi16(mins, mins), _mm_unpacklo_epi16(mins, mins));
  return _mm256_madd_epi16(bsums16(a), per16);
}

// Q5_K: Q4_K's nibbles plus a fifth bit (16) from qh, bit 2j for the low nibbles and
// 2j + 1 for the high ones.
struct Q5_KCodes {
  __m256i qh;
  explicit Q5_KCodes(const BlockQ5_K* w) : qh(load256(w->qh)) {}
  void unpack(const BlockQ5_K* w, int j, __m256i& lo, __m256i& hi) const {
    const __m256i mask = _mm256_set1_epi8(0x0f);
    const __m256i q = load256(w->qs + 32 * j);
    const __m256i bit_lo = _mm256_set1_epi8(static_cast<char>(1 << (2 * j)));
    const __m256i bit_hi = _mm256_set1_epi8(static_cast<char>(1 << (2 * j + 1)));
    const __m256i h_lo = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit_lo), bit_lo), _mm256_set1_epi8(16));
    const __m256i h_hi = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit_hi), bit_hi), _mm256_set1_epi8(16));
    lo = _mm256_or_si256(_mm256_and_si256(q, mask), h_lo);
    hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), mask), h_hi);
  }
};

// Q5_K in llama.cpp's float order (ggml_vec_dot_q5_K_q8_K, AVX2): the scaled code
// sums in 8 lanes, acc = fma(d_w * d_a, sum, acc) per super-block; the mins apart, as
// one exact integer per super-block, fma'd with -(d_a * dmin_w) into a float of their
// own (llama.cpp's build contracts `summs += dmin * sum` into one fma: checked bit for
// bit by ggml_matmul_crosscheck_test); the lanes' sum plus that float at the end.
struct Q5_KKernel : SuperBlockTiles<BlockQ5_K> {
  using Acc = OffsetAcc;
  // Decoded once per weight step (see Q6_KKernel).
  struct W {
    __m256i u[8];       // sub-block i's 32 five-bit codes
    __m256i scales[8];  // sub-block i's scale in every int16
    __m128i scales_mins;
    float d, dmin;
  };
  static Acc zero() { return {_mm256_setzero_ps(), 0.0f}; }
  static float reduce(const Acc& acc) { return hsum(acc.v) + acc.offset; }
  static W load_w(const uint8_t* row, int64_t s, int64_t) {
    const BlockQ5_K* b = block_at<BlockQ5_K>(row, s);
    W w;
    w.scales_mins = decode_scales_k4(b->scales);
    const Q5_KCodes codes(b);
    for (int j = 0; j < 4; ++j) {
      codes.unpack(b, j, w.u[2 * j], w.u[2 * j + 1]);
      w.scales[2 * j] = broadcast_u8(w.scales_mins, 2 * j);
      w.scales[2 * j + 1] = broadcast_u8(w.scales_mins, 2 * j + 1);
    }
    w.d = half_to_float(b->d);
    w.dmin = half_to_float(b->dmin);
    return w;
  }
  static void step(Acc& acc, const W& w, A a) {
    __m256i sumi = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      const __m256i p_lo = scaled_dot_u8_s8(w.u[2 * j], load256(a->qs + 64 * j), w.scales[2 * j]);
      const __m256i p_hi = scaled_dot_u8_s8(w.u[2 * j + 1], load256(a->qs + 64 * j + 32), w.scales[2 * j + 1]);
      sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p_lo, p_hi));
    }
    const float d = a->d * w.d;
    const float dmin = -a->d * w.dmin;
    const float mins = static_cast<float>(hsum_i32(weighted_mins(a, w.scales_mins)));
    acc.offset = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(dmin), _mm_set_ss(mins), _mm_set_ss(acc.offset)));
    acc.v = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc.v);
  }
};

// Q6_K: unsigned 6-bit codes u, value u - 32; the -32 is applied through the bsums:
// sum s_j (u - 32) a = sum s_j u a - 32 sum_j s_j bsum_j. The codes and scales are
// decoded once per weight step (load_w), so a GEMM panel decodes each block once
// instead of once per token; step's integer and float operations are unchanged.
struct Q6_KKernel : SuperBlockTiles<BlockQ6_K> {
  struct W {
    __m256i u[8];            // group 4h + g: codes of sub-blocks 8h + 2g, 8h + 2g + 1
    __m256i pair_scales[8];  // group 4h + g: those two sub-blocks' scales as int16
    __m256i scales16;        // the 16 scales as int16 (for the bsums offset)
    float d;
  };
  static W load_w(const uint8_t* row, int64_t s, int64_t) {
    const BlockQ6_K* b = block_at<BlockQ6_K>(row, s);
    const __m256i mask = _mm256_set1_epi8(0x0f);
    const __m256i two = _mm256_set1_epi8(3);
    const __m128i scales8 = load128(b->scales);
    W w;
    for (int h = 0; h < 2; ++h) {
      const __m256i ql_a = load256(b->ql + 64 * h);
      const __m256i ql_b = load256(b->ql + 64 * h + 32);
      const __m256i qh = load256(b->qh + 32 * h);
      __m256i* u = w.u + 4 * h;
      u[0] = _mm256_or_si256(_mm256_and_si256(ql_a, mask), _mm256_slli_epi16(_mm256_and_si256(qh, two), 4));
      u[1] = _mm256_or_si256(_mm256_and_si256(ql_b, mask),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), two), 4));
      u[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql_a, 4), mask),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), two), 4));
      u[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql_b, 4), mask),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), two), 4));
      for (int g = 0; g < 4; ++g) w.pair_scales[4 * h + g] = pair_i8(scales8, 8 * h + 2 * g);
    }
    w.scales16 = _mm256_cvtepi8_epi16(scales8);
    w.d = half_to_float(b->d);
    return w;
  }
  static void step(Acc& acc, const W& w, A a) {
    __m256i sumi = _mm256_setzero_si256();
    for (int i = 0; i < 8; ++i) {
      const __m256i p = scaled_dot_u8_s8(w.u[i], load256(a->qs + 32 * i), w.pair_scales[i]);
      sumi = _mm256_add_epi32(sumi, p);
    }
    const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(bsums16(a), w.scales16), 5);
    const float d = w.d * a->d;
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi, offset)), acc);
  }
};


// Q3_K in llama.cpp's float order (ggml_vec_dot_q3_K_q8_K, AVX2): unsigned u = low 2
// bits + 4 * hmask bit (0..7), value u - 4, the -4 taken per pair of codes (int16
// u * a - 4 * a, exact) so that each of the 8 int32 lanes holds exactly llama.cpp's
// integer sum; then acc = fma(d_a * d_w, sum, acc) per super-block.
struct Q3_KKernel : SuperBlockTiles<BlockQ3_K> {
  // Decoded once per weight step (see Q6_KKernel).
  struct W {
    __m256i u[8];            // group 4h + g: its 32 codes u (0..7)
    __m256i pair_scales[8];  // group 4h + g: its two sub-blocks' scales minus 32, as int16
    float d;
  };
  static W load_w(const uint8_t* row, int64_t s, int64_t) {
    const BlockQ3_K* b = block_at<BlockQ3_K>(row, s);
    // 16 six-bit scales minus 32: low nibbles in bytes 0-7, high 2 bits in bytes 8-11.
    uint32_t packed[3];
    std::memcpy(packed, b->scales, 12);
    const uint32_t low4 = 0x0f0f0f0f, two = 0x03030303;
    const __m128i scales8 = _mm_sub_epi8(
        _mm_set_epi32(static_cast<int>(((packed[1] >> 4) & low4) | (((packed[2] >> 6) & two) << 4)),
                      static_cast<int>(((packed[0] >> 4) & low4) | (((packed[2] >> 4) & two) << 4)),
                      static_cast<int>((packed[1] & low4) | (((packed[2] >> 2) & two) << 4)),
                      static_cast<int>((packed[0] & low4) | ((packed[2] & two) << 4))),
        _mm_set1_epi8(32));
    const __m256i three = _mm256_set1_epi8(3);
    const __m256i four = _mm256_set1_epi8(4);
    const __m256i hmask = load256(b->hmask);
    W w;
    for (int h = 0; h < 2; ++h) {
      const __m256i q = load256(b->qs + 32 * h);
      for (int g = 0; g < 4; ++g) {
        const int group = 4 * h + g;
        const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << group));
        const __m256i high = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hmask, bit), bit), four);
        w.u[group] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2 * g), three), high);
        w.pair_scales[group] = pair_i8(scales8, 2 * group);
      }
    }
    w.d = half_to_float(b->d);
    return w;
  }
  static void step(Acc& acc, const W& w, A a) {
    const __m256i four = _mm256_set1_epi8(4);
    __m256i sumi = _mm256_setzero_si256();
    for (int group = 0; group < 8; ++group) {
      const __m256i av = load256(a->qs + 32 * group);
      const __m256i pairs = _mm256_sub_epi16(_mm256_maddubs_epi16(w.u[group], av), _mm256_maddubs_epi16(four, av));
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(pairs, w.pair_scales[group]));
    }
    const float d = a->d * w.d;
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
  }
};

// ---------------------------------------------------------------- float rows
// Partial last step: the tail is copied into a zeroed buffer (zeros add nothing).
template <class Convert>
struct FloatTiles {
  static constexpr int64_t kStep = 8;
  static constexpr int kRows = 4, kCols = 4, kGemvRows = 1;
  using Acc = __m256;
  using W = __m256;
  using A = __m256;
  static Acc zero() { return _mm256_setzero_ps(); }
  static float reduce(const Acc& acc) { return hsum(acc); }
  static __m256 load(const uint8_t* row, int64_t s, int64_t k) {
    const int64_t first = s * 8;
    if (first + 8 <= k) return Convert::load8(row + first * Convert::kBytes);
    alignas(32) uint8_t tail[32] = {};
    std::memcpy(tail, row + first * Convert::kBytes, static_cast<size_t>((k - first) * Convert::kBytes));
    return Convert::load8(tail);
  }
  static W load_w(const uint8_t* row, int64_t s, int64_t k) { return load(row, s, k); }
  static A load_a(const uint8_t* row, int64_t s, int64_t k) { return load(row, s, k); }
  static void step(Acc& acc, const W& w, const A& a) { acc = _mm256_fmadd_ps(w, a, acc); }
};

struct HalfToFloat8 {
  static constexpr int64_t kBytes = 2;
  static __m256 load8(const uint8_t* p) { return _mm256_cvtph_ps(load128(p)); }
};
struct BFloatToFloat8 {
  static constexpr int64_t kBytes = 2;
  static __m256 load8(const uint8_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load128(p)), 16));
  }
};
struct Float8 {
  static constexpr int64_t kBytes = 4;
  static __m256 load8(const uint8_t* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
};

using F16Kernel = FloatTiles<HalfToFloat8>;
using BF16Kernel = FloatTiles<BFloatToFloat8>;
using F32Kernel = FloatTiles<Float8>;

// ---------------------------------------------------------------- activation quantizers
// Same bytes as the scalar level's quantizers: Q8_0/Q8_1 as llama.cpp's x86
// activation quantizer (d = amax / 127, id = 127 / amax, x * id rounded half to
// even), Q8_K as the reference quantizer (max by magnitude, round away from zero).

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// 4 x 8 int32 -> 32 int8 in element order.
inline __m256i pack_32(__m256i i0, __m256i i1, __m256i i2, __m256i i3) {
  const __m256i p01 = _mm256_packs_epi32(i0, i1);
  const __m256i p23 = _mm256_packs_epi32(i2, i3);
  const __m256i bytes = _mm256_packs_epi16(p01, p23);
  return _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// One 32-element block: the codes and d (as float). Returns the int codes' sum.
inline int quantize_block32(const float* x, int8_t* qs, float& d_out) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  __m256 v[4];
  __m256 amax = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(x + 8 * i);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_mask, v[i]));
  }
  const float max_scalar = hmax(amax);
  const float d = max_scalar / 127;
  const float id = max_scalar != 0.0f ? 127.0f / max_scalar : 0.0f;
  const __m256 scale = _mm256_set1_ps(id);
  __m256i q[4];
  for (int i = 0; i < 4; ++i) {
    const __m256 scaled = _mm256_mul_ps(v[i], scale);
    q[i] = _mm256_cvttps_epi32(_mm256_round_ps(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs), pack_32(q[0], q[1], q[2], q[3]));
  d_out = d;
  return hsum_i32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
}

void quantize_q8_0_simd(const float* x, void* out, int64_t k) {
  auto* b = static_cast<BlockQ8_0*>(out);
  for (int64_t i = 0; i < k / 32; ++i) {
    float d;
    quantize_block32(x + 32 * i, b[i].qs, d);
    b[i].d = float_to_half(d);
  }
}

void quantize_q8_1_simd(const float* x, void* out, int64_t k) {
  auto* b = static_cast<BlockQ8_1*>(out);
  for (int64_t i = 0; i < k / 32; ++i) {
    float d;
    const int sum = quantize_block32(x + 32 * i, b[i].qs, d);
    b[i].d = float_to_half(d);
    b[i].s = float_to_half(static_cast<float>(sum) * d);
  }
}

void quantize_q8_K_simd(const float* x, void* out, int64_t k) {
  auto* b = static_cast<BlockQ8_K*>(out);
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  for (int64_t i = 0; i < k / 256; ++i, x += 256) {
    __m256 amax_v = _mm256_setzero_ps();
    for (int j = 0; j < 256; j += 8) amax_v = _mm256_max_ps(amax_v, _mm256_andnot_ps(sign_mask, _mm256_loadu_ps(x + j)));
    const float amax = hmax(amax_v);
    if (amax == 0.0f) {
      std::memset(&b[i], 0, sizeof(BlockQ8_K));
      continue;
    }
    // The signed value of the first element of largest magnitude (the reference's tie rule).
    float max = 0.0f;
    for (int j = 0; j < 256; j += 8) {
      const __m256 hit = _mm256_cmp_ps(_mm256_andnot_ps(sign_mask, _mm256_loadu_ps(x + j)), _mm256_set1_ps(amax), _CMP_EQ_OQ);
      const int bits = _mm256_movemask_ps(hit);
      if (bits != 0) {
        max = x[j + __builtin_ctz(static_cast<unsigned>(bits))];
        break;
      }
    }
    const float iscale = -127.f / max;
    const __m256 scale = _mm256_set1_ps(iscale);
    for (int j = 0; j < 256; j += 32) {
      __m256i q[4];
      for (int t = 0; t < 4; ++t) {
        // nearest_int: ties to even (the MXCSR default), then at most 127.
        q[t] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(scale, _mm256_loadu_ps(x + j + 8 * t))),
                                _mm256_set1_epi32(127));
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(b[i].qs + j), pack_32(q[0], q[1], q[2], q[3]));
    }
    for (int g = 0; g < 16; ++g) {
      const __m128i q16 = load128(b[i].qs + 16 * g);
      const __m256i wide = _mm256_cvtepi8_epi16(q16);
      const __m256i pairs = _mm256_madd_epi16(wide, _mm256_set1_epi16(1));
      b[i].bsums[g] = static_cast<int16_t>(hsum_i32(pairs));
    }
    b[i].d = 1 / iscale;
  }
}

void quantize_f16_simd(const float* x, void* out, int64_t k) {
  auto* h = static_cast<uint16_t*>(out);
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    // NaN: the reference writes 0x7e00 with the sign kept; the hardware keeps payload bits.
    const __m256 is_nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    __m128i half = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
    if (_mm256_movemask_ps(is_nan) != 0) {
      alignas(16) uint16_t tmp[8];
      _mm_store_si128(reinterpret_cast<__m128i*>(tmp), half);
      for (int j = 0; j < 8; ++j) {
        if (x[i + j] != x[i + j]) tmp[j] = static_cast<uint16_t>((tmp[j] & 0x8000u) | 0x7e00u);
      }
      half = _mm_load_si128(reinterpret_cast<const __m128i*>(tmp));
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i), half);
  }
  for (; i < k; ++i) {
    const float f = x[i];
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    h[i] = f != f ? static_cast<uint16_t>(((bits >> 16) & 0x8000u) | 0x7e00u) : float_to_half(f);
  }
}

inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

void quantize_bf16_simd(const float* x, void* out, int64_t k) {
  auto* h = static_cast<uint16_t*>(out);
  int64_t i = 0;
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i inf = _mm256_set1_epi32(0x7f800000);
  for (; i + 8 <= k; i += 8) {
    const __m256i bits = _mm256_castps_si256(_mm256_loadu_ps(x + i));
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), odd), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, abs_mask), inf);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
    rounded = _mm256_blendv_epi8(rounded, quiet, nan);
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(rounded), _mm256_extracti128_si256(rounded, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i), packed);
  }
  for (; i < k; ++i) h[i] = float_to_bf16(x[i]);
}

void quantize_f32_copy(const float* x, void* out, int64_t k) { std::memcpy(out, x, static_cast<size_t>(k) * 4); }

// ---------------------------------------------------------------- table entries
template <class K>
void put_kernel(KernelTable& table, GgmlType type) {
  set_kernel(table, type, tiled_vec_dot<K>, tiled_gemm<K>);
}

void fill_ymm_kernels(KernelTable& table) {
  using T = GgmlType;
  put_kernel<F32Kernel>(table, T::F32);
  put_kernel<F16Kernel>(table, T::F16);
  put_kernel<BF16Kernel>(table, T::BF16);
  put_kernel<Q4_1Kernel>(table, T::Q4_1);
  put_kernel<Q5_0Kernel>(table, T::Q5_0);
  put_kernel<Q5_1Kernel>(table, T::Q5_1);
  put_kernel<Q8_0Kernel>(table, T::Q8_0);
  put_kernel<MXFP4Kernel>(table, T::MXFP4);
  put_kernel<Q1_0Kernel>(table, T::Q1_0);
  put_kernel<Q2_0Kernel>(table, T::Q2_0);
  put_kernel<Q3_KKernel>(table, T::Q3_K);
  put_kernel<Q5_KKernel>(table, T::Q5_K);
  put_kernel<Q6_KKernel>(table, T::Q6_K);
  set_quantizer(table, T::F32, quantize_f32_copy);
  set_quantizer(table, T::F16, quantize_f16_simd);
  set_quantizer(table, T::BF16, quantize_bf16_simd);
  set_quantizer(table, T::Q8_0, quantize_q8_0_simd);
  set_quantizer(table, T::Q8_1, quantize_q8_1_simd);
  set_quantizer(table, T::Q8_K, quantize_q8_K_simd);
}

}  // namespace
}  // namespace pico::cpu
