// The i8mm level (aarch64, Armv8.6-A Int8 matrix multiply, -march=armv8.2-a+i8mm+dotprod):
// Q8_0 and Q4_0 with SMMLA (vmmlaq_s32) for gemm tiles, which gives the exact int32
// block sums of 2 weight rows x 2 tokens in one instruction chain. Every other type
// comes from the dotprod / neon levels.
//
// Per output these kernels do the scalar reference's float steps on one float
// accumulator (Q8_0: acc += sumi * (d_w * d_a); Q4_0: acc += sumi * d_w * d_a), so
// vec_dot (1 x 1 tile, SDOT + an integer horizontal sum) and the 2 x 2 SMMLA tiles
// produce bit-identical results (and match the scalar reference exactly).
#include "cpu/arm/neon_common.hpp"

#if !defined(__ARM_FEATURE_MATMUL_INT8) || !defined(__ARM_FEATURE_DOTPROD)
#error "i8mm_kernels.cpp must be compiled with +i8mm+dotprod"
#endif

namespace pico::cpu {
namespace {

// 64-bit halves: [x.low, y.low] and [x.high, y.high].
inline int8x16_t zip_low(int8x16_t x, int8x16_t y) {
  return vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(x), vreinterpretq_s64_s8(y)));
}
inline int8x16_t zip_high(int8x16_t x, int8x16_t y) {
  return vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(x), vreinterpretq_s64_s8(y)));
}

// {w0 . a0, w0 . a1, w1 . a0, w1 . a1} over the 32 codes of each, exact.
inline int32x4_t block_sums_2x2(const Codes& w0, const Codes& w1, const Codes& a0, const Codes& a1) {
  int32x4_t s = vdupq_n_s32(0);
  s = vmmlaq_s32(s, zip_low(w0.lo, w1.lo), zip_low(a0.lo, a1.lo));
  s = vmmlaq_s32(s, zip_high(w0.lo, w1.lo), zip_high(a0.lo, a1.lo));
  s = vmmlaq_s32(s, zip_low(w0.hi, w1.hi), zip_low(a0.hi, a1.hi));
  s = vmmlaq_s32(s, zip_high(w0.hi, w1.hi), zip_high(a0.hi, a1.hi));
  return s;
}

// Weights from Base (a 32-element kernel of neon_common.hpp), activations Q8_0,
// Combine: the reference's float step for one block.
template <class Base, class Combine>
struct MatmulKernel : Q8_0Activation {
  static constexpr int64_t kStep = 32;
  static constexpr int kRows = 4, kCols = 4, kGemvRows = 4;
  using Acc = float;
  using W = Codes;
  static Acc zero() { return 0.0f; }
  static float reduce(const Acc& acc) { return acc; }
  static W load_w(const uint8_t* row, int64_t s, int64_t k) { return Base::load_w(row, s, k); }
  static void step(float& acc, const W& w, const A& a) {
    Combine::add(acc, hsum_i32(dot32_s8(w.lo, w.hi, a.lo, a.hi)), w.d, a.d);
  }
  static void step2x2(float& r0c0, float& r0c1, float& r1c0, float& r1c1, const W& w0, const W& w1, const A& a0,
                      const A& a1) {
    const int32x4_t s = block_sums_2x2(w0, w1, a0, a1);
    Combine::add(r0c0, vgetq_lane_s32(s, 0), w0.d, a0.d);
    Combine::add(r0c1, vgetq_lane_s32(s, 1), w0.d, a1.d);
    Combine::add(r1c0, vgetq_lane_s32(s, 2), w1.d, a0.d);
    Combine::add(r1c1, vgetq_lane_s32(s, 3), w1.d, a1.d);
  }
};

struct Q8_0Combine {  // dot_q8_0: sum += sumi * (d_w * d_a)
  static void add(float& acc, int sumi, float dw, float da) { acc += static_cast<float>(sumi) * (dw * da); }
};
struct Q4_0Combine {  // dot_q4_0: sum += sumi * d_w * d_a
  static void add(float& acc, int sumi, float dw, float da) { acc += static_cast<float>(sumi) * dw * da; }
};

using Q8_0MatmulKernel = MatmulKernel<Q8_0Kernel, Q8_0Combine>;
using Q4_0MatmulKernel = MatmulKernel<Q4_0Kernel, Q4_0Combine>;

}  // namespace

void fill_i8mm_kernels(KernelTable& table) {
  put_kernel<Q8_0MatmulKernel>(table, GgmlType::Q8_0);
  put_kernel<Q4_0MatmulKernel>(table, GgmlType::Q4_0);
}

}  // namespace pico::cpu
