// 128-bit NEON kernels shared by the neon and dotprod levels: included by
// neon_kernels.cpp (aarch64: baseline flags; 32-bit arm: -mfpu=neon) and
// dotprod_kernels.cpp (-march=armv8.2-a+dotprod), where the int8 dot product uses
// SDOT (vdotq_s32) instead of widening multiplies. Internal linkage throughout (see
// tile_driver.hpp).
//
// The float kernels and Q4_0 / Q8_0 / Q5_0 / IQ4_NL keep 4 float lanes per output,
// add each step's 4 per-lane partial sums into them (scale product first, then one
// multiply-add per step), and reduce the 4 lanes in one fixed order at the end. The
// others (Q4_1, Q5_1, Q1_0, Q2_0 and the K-quants) compute each block's integer sums
// in SIMD and then do the scalar reference's float steps on one float per output, so
// they match scalar_kernels.cpp bit for bit.
#pragma once

#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "cpu/kernels.hpp"
#include "cpu/tile_driver.hpp"
#include "quant/blocks.hpp"

namespace pico::cpu {
namespace {

using quant::BlockIQ4_NL;
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
// IEEE half -> float, exact, in plain integer code (no fp16 extension needed).
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {
      float f = static_cast<float>(mantissa) * (1.0f / 16777216.0f);  // exact: mantissa * 2^-24
      std::memcpy(&bits, &f, 4);
      bits |= sign;
    }
  } else if (exponent == 31) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

template <class Block>
inline const Block* block_at(const uint8_t* row, int64_t index) {
  return reinterpret_cast<const Block*>(row) + index;
}

// acc + x * y: fused on aarch64; on 32-bit NEON (no VFPv4 assumed) a separate
// multiply and add. Either way the same instruction in every instantiation.
inline float32x4_t mul_add(float32x4_t acc, float32x4_t x, float32x4_t y) {
#if defined(__aarch64__)
  return vfmaq_f32(acc, x, y);
#else
  return vaddq_f32(acc, vmulq_f32(x, y));
#endif
}

// Fixed-order horizontal sum: (l0 + l2) + (l1 + l3).
inline float hsum(float32x4_t v) {
  const float32x2_t s = vadd_f32(vget_low_f32(v), vget_high_f32(v));
  return vget_lane_f32(vpadd_f32(s, s), 0);
}

// Sum of the 32 products x[i] * y[i] of two signed int8 vectors pairs, spread over 4
// int32 lanes (the integer sum is exact, whatever the lanes).
inline int32x4_t dot32_s8(int8x16_t x0, int8x16_t x1, int8x16_t y0, int8x16_t y1) {
#if defined(__ARM_FEATURE_DOTPROD)
  return vdotq_s32(vdotq_s32(vdupq_n_s32(0), x0, y0), x1, y1);
#else
  // |x * y| <= 128 * 128 fits int16; pairs of products are widened before adding.
  int32x4_t s = vpaddlq_s16(vmull_s8(vget_low_s8(x0), vget_low_s8(y0)));
  s = vpadalq_s16(s, vmull_s8(vget_high_s8(x0), vget_high_s8(y0)));
  s = vpadalq_s16(s, vmull_s8(vget_low_s8(x1), vget_low_s8(y1)));
  s = vpadalq_s16(s, vmull_s8(vget_high_s8(x1), vget_high_s8(y1)));
  return s;
#endif
}

// Sum of the 16 products x[i] * y[i], spread over 4 int32 lanes.
inline int32x4_t dot16_s8(int8x16_t x, int8x16_t y) {
#if defined(__ARM_FEATURE_DOTPROD)
  return vdotq_s32(vdupq_n_s32(0), x, y);
#else
  return vpadalq_s16(vpaddlq_s16(vmull_s8(vget_low_s8(x), vget_low_s8(y))), vmull_s8(vget_high_s8(x), vget_high_s8(y)));
#endif
}

// Integer horizontal sum (exact, so any order).
inline int32_t hsum_i32(int32x4_t v) {
  const int32x2_t s = vadd_s32(vget_low_s32(v), vget_high_s32(v));
  return vget_lane_s32(vpadd_s32(s, s), 0);
}

// ---------------------------------------------------------------- kernels with one 32-element block per step
// A block decoded to 32 signed int8 codes (elements 0..15, 16..31) plus a float scale.
struct Codes {
  int8x16_t lo, hi;
  float d;
};

struct LegacyTiles {
  static constexpr int64_t kStep = 32;
#if defined(__aarch64__)
  static constexpr int kRows = 4, kCols = 4, kGemvRows = 4;
#else
  static constexpr int kRows = 2, kCols = 2, kGemvRows = 2;  // 16 q registers
#endif
  using Acc = float32x4_t;
  static Acc zero() { return vdupq_n_f32(0.0f); }
  static float reduce(const Acc& acc) { return hsum(acc); }
};

struct Q8_0Activation {
  using A = Codes;
  static A load_a(const uint8_t* row, int64_t s, int64_t) {
    const BlockQ8_0* b = block_at<BlockQ8_0>(row, s);
    return {vld1q_s8(b->qs), vld1q_s8(b->qs + 16), half_to_float(b->d)};
  }
};

// Signed weight codes against Q8_0: acc += (d_w * d_a) * sum(q_w * q_a).
struct SignedCodesStep {
  using W = Codes;
  static void step(float32x4_t& acc, const W& w, const Codes& a) {
    const float32x4_t d = vdupq_n_f32(w.d * a.d);
    acc = mul_add(acc, d, vcvtq_f32_s32(dot32_s8(w.lo, w.hi, a.lo, a.hi)));
  }
};

struct Q8_0Kernel : LegacyTiles, Q8_0Activation, SignedCodesStep {
  static W load_w(const uint8_t* row, int64_t s, int64_t) {
    const BlockQ8_0* b = block_at<BlockQ8_0>(row, s);
    return {vld1q_s8(b->qs), vld1q_s8(b->qs + 16), half_to_float(b->d)};
  }
};

struct Q4_0Kernel : LegacyTiles, Q8_0Activation, SignedCodesStep {
  static W load_w(const uint8_t* row, int64_t s, int64_t) {
    const BlockQ4_0* b = block_at<BlockQ4_0>(row, s);
    const uint8x16_t raw = vld1q_u8(b->qs);
    const int8x16_t eight = vdupq_n_s8(8);
    const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0x0f))), eight);
    const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(raw, 4)), eight);
    return {lo, hi, half_to_float(b->d)};
  }
};

// Bits 8i..8i+15 of the little-endian mask at `p` (bytes p[2i], p[2i+1]) -> 16 bytes
// of `value` where the bit is set, 0 elsewhere.
inline uint8x16_t expand_bits16(const uint8_t* p, uint8_t value) {
  static const uint8_t kBit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  const uint8x16_t spread = vcombine_u8(vdup_n_u8(p[0]), vdup_n_u8(p[1]));
  return vandq_u8(vtstq_u8(spread, vld1q_u8(kBit)), vdupq_n_u8(value));
}

struct Q5_0Kernel : LegacyTiles, Q8_0Activation, SignedCodesStep {
  static W load_w(const uint8_t* row, int64_t s, int64_t) {
    const BlockQ5_0* b = block_at<BlockQ5_0>(row, s);
    const uint8x16_t raw = vld1q_u8(b->qs);
    const int8x16_t sixteen = vdupq_n_s8(16);
    const uint8x16_t lo = vorrq_u8(vandq_u8(raw, vdupq_n_u8(0x0f)), expand_bits16(b->qh, 0x10));
    const uint8x16_t hi = vorrq_u8(vshrq_n_u8(raw, 4), expand_bits16(b->qh + 2, 0x10));
    return {vsubq_s8(vreinterpretq_s8_u8(lo), sixteen), vsubq_s8(vreinterpretq_s8_u8(hi), sixteen), half_to_float(b->d)};
  }
};

// 16-entry int8 table lookup of 16 indices in [0, 16).
inline int8x16_t lookup16(const int8_t* table, uint8x16_t index) {
#if defined(__aarch64__)
  return vqtbl1q_s8(vld1q_s8(table), index);
#else
  int8x8x2_t t;
  t.val[0] = vld1_s8(table);
  t.val[1] = vld1_s8(table + 8);
  return vcombine_s8(vtbl2_s8(t, vreinterpret_s8_u8(vget_low_u8(index))),
                     vtbl2_s8(t, vreinterpret_s8_u8(vget_high_u8(index))));
#endif
}

struct IQ4_NLKernel : LegacyTiles, Q8_0Activation, SignedCodesStep {
  static W load_w(const uint8_t* row, int64_t s, int64_t) {
    const BlockIQ4_NL* b = block_at<BlockIQ4_NL>(row, s);
    const uint8x16_t raw = vld1q_u8(b->qs);
    return {lookup16(quant::kIq4nlValues, vandq_u8(raw, vdupq_n_u8(0x0f))),
            lookup16(quant::kIq4nlValues, vshrq_n_u8(raw, 4)), half_to_float(b->d)};
  }
};

// ---------------------------------------------------------------- Q4_1 / Q5_1 against Q8_1
// One float accumulator per output, the scalar reference's formula per block:
// acc += (d_w * d_a) * sumi + m_w * s_a.
struct CodesWithOffset {
  int8x16_t lo, hi;
  float d, m;  // weights: scale and min; activations: scale and d * sum(qs)
};

struct OffsetTiles {
  static constexpr int64_t kStep = 32;
#if defined(__aarch64__)
  static constexpr int kRows = 4, kCols = 4, kGemvRows = 4;
#else
  static constexpr int kRows = 2, kCols = 2, kGemvRows = 2;
#endif
  using Acc = float;
  using W = CodesWithOffset;
  using A = CodesWithOffset;
  static Acc zero() { return 0.0f; }
  static float reduce(const Acc& acc) { return acc; }
  static A load_a(const uint8_t* row, int64_t s, int64_t) {
    const BlockQ8_1* b = block_at<BlockQ8_1>(row, s);
    return {vld1q_s8(b->qs), vld1q_s8(b->qs + 16), half_to_float(b->d), half_to_float(b->s)};
  }
  static void step(float& acc, const W& w, const A& a) {
    const int sumi = hsum_i32(dot32_s8(w.lo, w.hi, a.lo, a.hi));
    acc += (w.d * a.d) * static_cast<float>(sumi) + w.m * a.m;
  }
};

struct Q4_1Kernel : OffsetTiles {
  static W load_w(const uint8_t* row, int64_t s, int64_t) {
    const BlockQ4_1* b = block_at<BlockQ4_1>(row, s);
    const uint8x16_t raw = vld1q_u8(b->qs);
    return {vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0x0f))), vreinterpretq_s8_u8(vshrq_n_u8(raw, 4)),
            half_to_float(b->d), half_to_float(b->m)};
  }
};

struct Q5_1Kernel : OffsetTiles {
  static W load_w(const uint8_t* row, int64_t s, int64_t) {
    const BlockQ5_1* b = block_at<BlockQ5_1>(row, s);
    const uint8x16_t raw = vld1q_u8(b->qs);
    const uint8x16_t lo = vorrq_u8(vandq_u8(raw, vdupq_n_u8(0x0f)), expand_bits16(b->qh, 0x10));
    const uint8x16_t hi = vorrq_u8(vshrq_n_u8(raw, 4), expand_bits16(b->qh + 2, 0x10));
    return {vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi), half_to_float(b->d), half_to_float(b->m)};
  }
};

// ---------------------------------------------------------------- Q1_0 / Q2_0 against several Q8_0 blocks
// One step per weight block; the reference's float steps: a float sum over the
// activation blocks of d_a * sumi, then acc += d_w * that sum.
template <int64_t Elements>
struct LowBitTiles {
  static constexpr int64_t kStep = Elements;
#if defined(__aarch64__)
  static constexpr int kRows = 4, kCols = 4, kGemvRows = 4;
#else
  static constexpr int kRows = 2, kCols = 2, kGemvRows = 2;
#endif
  using Acc = float;
  using A = const BlockQ8_0*;
  static Acc zero() { return 0.0f; }
  static float reduce(const Acc& acc) { return acc; }
  static A load_a(const uint8_t* row, int64_t s, int64_t) { return block_at<BlockQ8_0>(row, s * (Elements / 32)); }
};

struct Q1_0Kernel : LowBitTiles<128> {
  using W = const BlockQ1_0*;
  static W load_w(const uint8_t* row, int64_t s, int64_t) { return block_at<BlockQ1_0>(row, s); }
  static void step(float& acc, W w, A a) {
    const int8x16_t one = vdupq_n_s8(1);
    float block_sum = 0.0f;
    for (int s = 0; s < 4; ++s) {
      // bit set: +1, clear: -1
      const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(expand_bits16(w->qs + 4 * s, 2)), one);
      const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(expand_bits16(w->qs + 4 * s + 2, 2)), one);
      const int sumi = hsum_i32(dot32_s8(lo, hi, vld1q_s8(a[s].qs), vld1q_s8(a[s].qs + 16)));
      block_sum += half_to_float(a[s].d) * static_cast<float>(sumi);
    }
    acc += half_to_float(w->d) * block_sum;
  }
};

struct Q2_0Kernel : LowBitTiles<64> {
  using W = const BlockQ2_0*;
  static W load_w(const uint8_t* row, int64_t s, int64_t) { return block_at<BlockQ2_0>(row, s); }
  // Element e of the 4 bytes at p: bits 2 * (e % 4) of p[e / 4], as code - 1.
  static int8x16_t decode16(const uint8_t* p) {
    static const uint8_t kIndex[16] = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};
    static const int8_t kShift[16] = {0, -2, -4, -6, 0, -2, -4, -6, 0, -2, -4, -6, 0, -2, -4, -6};
    uint8_t bytes[8] = {p[0], p[1], p[2], p[3], 0, 0, 0, 0};
    const uint8x8_t t = vld1_u8(bytes);
    const uint8x16_t spread = vcombine_u8(vtbl1_u8(t, vld1_u8(kIndex)), vtbl1_u8(t, vld1_u8(kIndex + 8)));
    const uint8x16_t code = vandq_u8(vshlq_u8(spread, vld1q_s8(kShift)), vdupq_n_u8(3));
    return vsubq_s8(vreinterpretq_s8_u8(code), vdupq_n_s8(1));
  }
  static void step(float& acc, W w, A a) {
    float block_sum = 0.0f;
    for (int s = 0; s < 2; ++s) {
      const int sumi =
          hsum_i32(dot32_s8(decode16(w->qs + 8 * s), decode16(w->qs + 8 * s + 4), vld1q_s8(a[s].qs), vld1q_s8(a[s].qs + 16)));
      block_sum += half_to_float(a[s].d) * static_cast<float>(sumi);
    }
    acc += half_to_float(w->d) * block_sum;
  }
};

// ---------------------------------------------------------------- K-quants against Q8_K, one super-block per step
// The integer sums of a super-block with NEON, then the scalar reference's float
// formula on one float accumulator.
struct SuperBlockTiles {
  static constexpr int64_t kStep = 256;
#if defined(__aarch64__)
  static constexpr int kRows = 4, kCols = 4, kGemvRows = 4;
#else
  static constexpr int kRows = 2, kCols = 2, kGemvRows = 2;
#endif
  using Acc = float;
  using A = const BlockQ8_K*;
  static Acc zero() { return 0.0f; }
  static float reduce(const Acc& acc) { return acc; }
  static A load_a(const uint8_t* row, int64_t s, int64_t) { return block_at<BlockQ8_K>(row, s); }
};

inline void scale_min_k4(int j, const uint8_t* q, int& scale, int& min) {
  if (j < 4) {
    scale = q[j] & 63;
    min = q[j + 4] & 63;
  } else {
    scale = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
    min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

struct Q4_KKernel : SuperBlockTiles {
  using W = const BlockQ4_K*;
  static W load_w(const uint8_t* row, int64_t s, int64_t) { return block_at<BlockQ4_K>(row, s); }
  static void step(float& acc, W w, A a) {
    int scales[8];
    int sum_mins = 0;
    for (int s = 0; s < 8; ++s) {
      int min = 0;
      scale_min_k4(s, w->scales, scales[s], min);
      sum_mins += min * (a->bsums[2 * s] + a->bsums[2 * s + 1]);
    }
    const uint8x16_t mask = vdupq_n_u8(0x0f);
    int32x4_t sumv = vdupq_n_s32(0);
    for (int j = 0; j < 4; ++j) {  // sub-blocks 2j (low nibbles) and 2j + 1 (high)
      const uint8x16_t q0 = vld1q_u8(w->qs + 32 * j);
      const uint8x16_t q1 = vld1q_u8(w->qs + 32 * j + 16);
      const int8_t* y = a->qs + 64 * j;
      const int32x4_t low = dot32_s8(vreinterpretq_s8_u8(vandq_u8(q0, mask)), vreinterpretq_s8_u8(vandq_u8(q1, mask)),
                                     vld1q_s8(y), vld1q_s8(y + 16));
      const int32x4_t high = dot32_s8(vreinterpretq_s8_u8(vshrq_n_u8(q0, 4)), vreinterpretq_s8_u8(vshrq_n_u8(q1, 4)),
                                      vld1q_s8(y + 32), vld1q_s8(y + 48));
      sumv = vmlaq_n_s32(sumv, low, scales[2 * j]);
      sumv = vmlaq_n_s32(sumv, high, scales[2 * j + 1]);
    }
    const int sumi = hsum_i32(sumv);
    acc += (half_to_float(w->d) * a->d) * static_cast<float>(sumi) -
           (half_to_float(w->dmin) * a->d) * static_cast<float>(sum_mins);
  }
};

struct Q6_KKernel : SuperBlockTiles {
  using W = const BlockQ6_K*;
  static W load_w(const uint8_t* row, int64_t s, int64_t) { return block_at<BlockQ6_K>(row, s); }
  static void step(float& acc, W w, A a) {
    const uint8x16_t mask4 = vdupq_n_u8(0x0f);
    const uint8x16_t mask2 = vdupq_n_u8(0x03);
    const int8x16_t offset = vdupq_n_s8(32);
    int32x4_t sumv = vdupq_n_s32(0);
    for (int h = 0; h < 2; ++h) {
      for (int half16 = 0; half16 < 2; ++half16) {  // l in [0, 16) or [16, 32)
        const int l0 = 16 * half16;
        const uint8x16_t ql0 = vld1q_u8(w->ql + 64 * h + l0);       // quarters 0 and 2
        const uint8x16_t ql1 = vld1q_u8(w->ql + 64 * h + 32 + l0);  // quarters 1 and 3
        const uint8x16_t qh = vld1q_u8(w->qh + 32 * h + l0);
        for (int g = 0; g < 4; ++g) {
          const uint8x16_t ql = (g & 1) ? ql1 : ql0;
          const uint8x16_t low = (g < 2) ? vandq_u8(ql, mask4) : vshrq_n_u8(ql, 4);
          uint8x16_t high;
          switch (g) {
            case 0: high = vandq_u8(qh, mask2); break;
            case 1: high = vandq_u8(vshrq_n_u8(qh, 2), mask2); break;
            case 2: high = vandq_u8(vshrq_n_u8(qh, 4), mask2); break;
            default: high = vshrq_n_u8(qh, 6); break;
          }
          const int8x16_t code = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(low, vshlq_n_u8(high, 4))), offset);
          const int e = 128 * h + 32 * g + l0;
          sumv = vmlaq_n_s32(sumv, dot16_s8(code, vld1q_s8(a->qs + e)), w->scales[e / 16]);
        }
      }
    }
    const int sumi = hsum_i32(sumv);
    acc += (half_to_float(w->d) * a->d) * static_cast<float>(sumi);
  }
};

struct Q5_KKernel : SuperBlockTiles {
  using W = const BlockQ5_K*;
  static W load_w(const uint8_t* row, int64_t s, int64_t) { return block_at<BlockQ5_K>(row, s); }
  static void step(float& acc, W w, A a) {
    int scales[8];
    int sum_mins = 0;
    for (int s = 0; s < 8; ++s) {
      int min = 0;
      scale_min_k4(s, w->scales, scales[s], min);
      sum_mins += min * (a->bsums[2 * s] + a->bsums[2 * s + 1]);
    }
    const uint8x16_t mask = vdupq_n_u8(0x0f);
    const uint8x16_t five = vdupq_n_u8(0x10);
    const uint8x16_t qh0 = vld1q_u8(w->qh);
    const uint8x16_t qh1 = vld1q_u8(w->qh + 16);
    int32x4_t sumv = vdupq_n_s32(0);
    for (int j = 0; j < 4; ++j) {  // sub-blocks 2j (low nibbles, qh bit 2j) and 2j + 1 (high, bit 2j + 1)
      const uint8x16_t q0 = vld1q_u8(w->qs + 32 * j);
      const uint8x16_t q1 = vld1q_u8(w->qs + 32 * j + 16);
      const uint8x16_t bit_lo = vdupq_n_u8(static_cast<uint8_t>(1u << (2 * j)));
      const uint8x16_t bit_hi = vdupq_n_u8(static_cast<uint8_t>(1u << (2 * j + 1)));
      const int8_t* y = a->qs + 64 * j;
      const uint8x16_t l0 = vorrq_u8(vandq_u8(q0, mask), vandq_u8(vtstq_u8(qh0, bit_lo), five));
      const uint8x16_t l1 = vorrq_u8(vandq_u8(q1, mask), vandq_u8(vtstq_u8(qh1, bit_lo), five));
      const uint8x16_t h0 = vorrq_u8(vshrq_n_u8(q0, 4), vandq_u8(vtstq_u8(qh0, bit_hi), five));
      const uint8x16_t h1 = vorrq_u8(vshrq_n_u8(q1, 4), vandq_u8(vtstq_u8(qh1, bit_hi), five));
      const int32x4_t low = dot32_s8(vreinterpretq_s8_u8(l0), vreinterpretq_s8_u8(l1), vld1q_s8(y), vld1q_s8(y + 16));
      const int32x4_t high =
          dot32_s8(vreinterpretq_s8_u8(h0), vreinterpretq_s8_u8(h1), vld1q_s8(y + 32), vld1q_s8(y + 48));
      sumv = vmlaq_n_s32(sumv, low, scales[2 * j]);
      sumv = vmlaq_n_s32(sumv, high, scales[2 * j + 1]);
    }
    const int sumi = hsum_i32(sumv);
    acc += (half_to_float(w->d) * a->d) * static_cast<float>(sumi) -
           (half_to_float(w->dmin) * a->d) * static_cast<float>(sum_mins);
  }
};

struct Q2_KKernel : SuperBlockTiles {
  using W = const BlockQ2_K*;
  static W load_w(const uint8_t* row, int64_t s, int64_t) { return block_at<BlockQ2_K>(row, s); }
  static void step(float& acc, W w, A a) {
    int sum_mins = 0;
    for (int j = 0; j < 16; ++j) sum_mins += a->bsums[j] * (w->scales[j] >> 4);
    const uint8x16_t mask2 = vdupq_n_u8(0x03);
    int32x4_t sumv = vdupq_n_s32(0);
    for (int h = 0; h < 2; ++h) {
      for (int half16 = 0; half16 < 2; ++half16) {
        const int l0 = 16 * half16;
        const uint8x16_t q = vld1q_u8(w->qs + 32 * h + l0);
        for (int g = 0; g < 4; ++g) {
          uint8x16_t code;
          switch (g) {
            case 0: code = vandq_u8(q, mask2); break;
            case 1: code = vandq_u8(vshrq_n_u8(q, 2), mask2); break;
            case 2: code = vandq_u8(vshrq_n_u8(q, 4), mask2); break;
            default: code = vshrq_n_u8(q, 6); break;
          }
          const int e = 128 * h + 32 * g + l0;
          sumv = vmlaq_n_s32(sumv, dot16_s8(vreinterpretq_s8_u8(code), vld1q_s8(a->qs + e)), w->scales[e / 16] & 0x0f);
        }
      }
    }
    const int sumi = hsum_i32(sumv);
    const float dall = a->d * half_to_float(w->d);
    const float dmin = a->d * half_to_float(w->dmin);
    acc += dall * static_cast<float>(sumi) - dmin * static_cast<float>(sum_mins);
  }
};

struct Q3_KKernel : SuperBlockTiles {
  using W = const BlockQ3_K*;
  static W load_w(const uint8_t* row, int64_t s, int64_t) { return block_at<BlockQ3_K>(row, s); }
  static void step(float& acc, W w, A a) {
    int scales[16];
    for (int j = 0; j < 16; ++j) {
      const int low = (j < 8 ? w->scales[j] : w->scales[j - 8] >> 4) & 0x0f;
      const int high = (w->scales[8 + j % 4] >> (2 * (j / 4))) & 3;
      scales[j] = (low | (high << 4)) - 32;
    }
    const uint8x16_t mask2 = vdupq_n_u8(0x03);
    const uint8x16_t four = vdupq_n_u8(0x04);
    int32x4_t sumv = vdupq_n_s32(0);
    for (int half16 = 0; half16 < 2; ++half16) {
      const int l0 = 16 * half16;
      const uint8x16_t hm = vld1q_u8(w->hmask + l0);
      for (int h = 0; h < 2; ++h) {
        const uint8x16_t q = vld1q_u8(w->qs + 32 * h + l0);
        for (int g = 0; g < 4; ++g) {
          uint8x16_t code;
          switch (g) {
            case 0: code = vandq_u8(q, mask2); break;
            case 1: code = vandq_u8(vshrq_n_u8(q, 2), mask2); break;
            case 2: code = vandq_u8(vshrq_n_u8(q, 4), mask2); break;
            default: code = vshrq_n_u8(q, 6); break;
          }
          const int group = 4 * h + g;
          // hmask bit clear: code - 4
          const uint8x16_t minus = vbicq_u8(four, vtstq_u8(hm, vdupq_n_u8(static_cast<uint8_t>(1u << group))));
          const int8x16_t value = vsubq_s8(vreinterpretq_s8_u8(code), vreinterpretq_s8_u8(minus));
          const int e = 128 * h + 32 * g + l0;
          sumv = vmlaq_n_s32(sumv, dot16_s8(value, vld1q_s8(a->qs + e)), scales[e / 16]);
        }
      }
    }
    const int sumi = hsum_i32(sumv);
    acc += (half_to_float(w->d) * a->d) * static_cast<float>(sumi);
  }
};

// ---------------------------------------------------------------- float rows
// Partial last step: the tail is copied into a zeroed buffer (zeros add nothing).
template <class Convert>
struct FloatTiles {
  static constexpr int64_t kStep = 4;
#if defined(__aarch64__)
  static constexpr int kRows = 4, kCols = 4, kGemvRows = 4;
#else
  static constexpr int kRows = 2, kCols = 2, kGemvRows = 2;
#endif
  using Acc = float32x4_t;
  using W = float32x4_t;
  using A = float32x4_t;
  static Acc zero() { return vdupq_n_f32(0.0f); }
  static float reduce(const Acc& acc) { return hsum(acc); }
  static float32x4_t load(const uint8_t* row, int64_t s, int64_t k) {
    const int64_t first = s * 4;
    if (first + 4 <= k) return Convert::load4(row + first * Convert::kBytes);
    alignas(16) uint8_t tail[16] = {};
    std::memcpy(tail, row + first * Convert::kBytes, static_cast<size_t>((k - first) * Convert::kBytes));
    return Convert::load4(tail);
  }
  static W load_w(const uint8_t* row, int64_t s, int64_t k) { return load(row, s, k); }
  static A load_a(const uint8_t* row, int64_t s, int64_t k) { return load(row, s, k); }
  static void step(Acc& acc, const W& w, const A& a) { acc = mul_add(acc, w, a); }
};

struct Float4 {
  static constexpr int64_t kBytes = 4;
  static float32x4_t load4(const uint8_t* p) { return vld1q_f32(reinterpret_cast<const float*>(p)); }
};

// bf16 -> f32 is a 16-bit shift, exact.
struct BFloatToFloat4 {
  static constexpr int64_t kBytes = 2;
  static float32x4_t load4(const uint8_t* p) {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(reinterpret_cast<const uint16_t*>(p)), 16));
  }
};

#if defined(__aarch64__)
struct HalfToFloat4 {
  static constexpr int64_t kBytes = 2;
  static float32x4_t load4(const uint8_t* p) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const uint16_t*>(p))));
  }
};
using F16Kernel = FloatTiles<HalfToFloat4>;
#endif

using F32Kernel = FloatTiles<Float4>;
using BF16Kernel = FloatTiles<BFloatToFloat4>;

// ---------------------------------------------------------------- table entries
template <class K>
void put_kernel(KernelTable& table, GgmlType type) {
  set_kernel(table, type, tiled_vec_dot<K>, tiled_gemm<K>);
}

// The int8 kernels: the only ones that differ between neon and dotprod.
[[maybe_unused]] void fill_neon_int8_kernels(KernelTable& table) {
  put_kernel<Q4_0Kernel>(table, GgmlType::Q4_0);
  put_kernel<Q8_0Kernel>(table, GgmlType::Q8_0);
  put_kernel<Q5_0Kernel>(table, GgmlType::Q5_0);
  put_kernel<IQ4_NLKernel>(table, GgmlType::IQ4_NL);
  put_kernel<Q4_KKernel>(table, GgmlType::Q4_K);
  put_kernel<Q6_KKernel>(table, GgmlType::Q6_K);
  put_kernel<Q5_KKernel>(table, GgmlType::Q5_K);
  put_kernel<Q4_1Kernel>(table, GgmlType::Q4_1);
  put_kernel<Q2_KKernel>(table, GgmlType::Q2_K);
  put_kernel<Q3_KKernel>(table, GgmlType::Q3_K);
  put_kernel<Q5_1Kernel>(table, GgmlType::Q5_1);
  put_kernel<Q1_0Kernel>(table, GgmlType::Q1_0);
  put_kernel<Q2_0Kernel>(table, GgmlType::Q2_0);
}

[[maybe_unused]] void fill_neon_float_kernels(KernelTable& table) {
  put_kernel<F32Kernel>(table, GgmlType::F32);
  put_kernel<BF16Kernel>(table, GgmlType::BF16);
#if defined(__aarch64__)
  put_kernel<F16Kernel>(table, GgmlType::F16);
#endif
}

}  // namespace
}  // namespace pico::cpu
