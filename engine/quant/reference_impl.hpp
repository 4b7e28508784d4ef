// Internal to engine/quant: the per-type reference (scalar) dequantizers and
// quantizers that type_traits.cpp puts into the type table. Everyone else goes
// through TypeTraits or quant/quantize.hpp.
//
// Every dequantizer yields, from the same bytes, the same floats as ggml's
// dequantize_row_* (same operations in the same order). Quantizers follow ggml's
// reference algorithms; `count` is a multiple of the block size in all of them.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace pico::quant {

// Round to nearest, ties to even, as ggml's nearest_int: adding 1.5 * 2^23 leaves
// the rounded integer in the low mantissa bits (the FPU rounds the sum). Valid for
// |x| < 2^22, which every caller guarantees (codes and scales of at most 8 bits);
// beyond that the plain (slower) library rounding is used.
inline int nearest_int(float x) {
  if (!(std::fabs(x) < 4194304.0f)) return static_cast<int>(std::lrint(x));
  const float shifted = x + 12582912.0f;
  return static_cast<int>(std::bit_cast<uint32_t>(shifted) & 0x007fffffu) - 0x00400000;
}

#define PICO_QUANT_DECLARE(name)                                  \
  void dequantize_##name(const void* blocks, float* out, int64_t count); \
  void quantize_##name(const float* in, void* blocks, int64_t count)

// float_types.cpp
PICO_QUANT_DECLARE(f32);
PICO_QUANT_DECLARE(f16);
PICO_QUANT_DECLARE(bf16);
// legacy_quants.cpp
PICO_QUANT_DECLARE(q4_0);
PICO_QUANT_DECLARE(q4_1);
PICO_QUANT_DECLARE(q5_0);
PICO_QUANT_DECLARE(q5_1);
PICO_QUANT_DECLARE(q8_0);
PICO_QUANT_DECLARE(q8_1);
// k_quants.cpp
PICO_QUANT_DECLARE(q2_K);
PICO_QUANT_DECLARE(q3_K);
PICO_QUANT_DECLARE(q4_K);
PICO_QUANT_DECLARE(q5_K);
PICO_QUANT_DECLARE(q6_K);
PICO_QUANT_DECLARE(q8_K);
// iq_quants.cpp
PICO_QUANT_DECLARE(iq4_nl);
PICO_QUANT_DECLARE(iq4_xs);
void dequantize_iq2_xxs(const void* blocks, float* out, int64_t count);
void dequantize_iq2_xs(const void* blocks, float* out, int64_t count);
void dequantize_iq2_s(const void* blocks, float* out, int64_t count);
void dequantize_iq3_xxs(const void* blocks, float* out, int64_t count);
void dequantize_iq3_s(const void* blocks, float* out, int64_t count);
void dequantize_iq1_s(const void* blocks, float* out, int64_t count);
void dequantize_iq1_m(const void* blocks, float* out, int64_t count);
// low_bit_quants.cpp
PICO_QUANT_DECLARE(tq1_0);
PICO_QUANT_DECLARE(tq2_0);
PICO_QUANT_DECLARE(mxfp4);
PICO_QUANT_DECLARE(nvfp4);
PICO_QUANT_DECLARE(q1_0);
PICO_QUANT_DECLARE(q2_0);
PICO_QUANT_DECLARE(q6_0);

#undef PICO_QUANT_DECLARE

}  // namespace pico::quant
