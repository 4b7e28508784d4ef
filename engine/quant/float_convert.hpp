// Scalar conversions between float and the narrow floating formats that GGUF
// tensors carry: IEEE half (f16), bfloat16, and the block scales of MXFP4 (E8M0) and
// NVFP4 (UE4M3). Rounding is to nearest, ties to even, as ggml rounds, so a value
// converted here has the same bits as one ggml converted. Table-free and exact;
// header-only so that kernels inline them.
#pragma once

#include <bit>
#include <cstdint>

namespace pico {

// f16 -> f32 is exact. NaN keeps its payload (quietened by the widening).
inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  if (exponent == 0) {
    // Zero or subnormal: mantissa units of 2^-24, exact in a float.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13));
}

// f32 -> f16, round to nearest even; overflow gives infinity, NaN gives the quiet
// NaN 0x7e00 with the sign kept (what ggml's reference conversion yields).
inline uint16_t fp32_to_fp16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  // 65520 = halfway between the largest half (65504) and 65536; the tie goes to the
  // even neighbour, which is the overflow.
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (magnitude < 0x38800000u) {
    // Below the smallest normal half (2^-14): the result counts units of 2^-24.
    // Adding 0.5 puts those units in the last place of the float, so the FPU's own
    // round-to-nearest-even does the rounding.
    const float shifted = std::bit_cast<float>(magnitude) + 0.5f;
    return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(shifted) - 0x3f000000u));
  }
  // Normal: drop 13 mantissa bits with ties to even (a carry may bump the exponent),
  // then rebias the exponent from 127 to 15.
  const uint32_t odd = (magnitude >> 13) & 1u;
  const uint32_t rounded = magnitude + 0xfffu + odd - ((127u - 15u) << 23);
  return static_cast<uint16_t>(sign | (rounded >> 13));
}

inline float bf16_to_fp32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// f32 -> bf16, round to nearest even; NaN is kept and made quiet.
inline uint16_t fp32_to_bf16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  const uint32_t odd = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7fffu + odd) >> 16);
}

// E8M0 block scale of MXFP4, halved: 2^(e - 128). The halving pairs it with the
// doubled e2m1 values of kFp4Values. e = 0 and 1 give subnormal floats; no NaN.
inline float e8m0_to_fp32_half(uint8_t e) {
  const uint32_t bits = e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e - 1) << 23);
  return std::bit_cast<float>(bits);
}

// UE4M3 sub-block scale of NVFP4 (4 exponent bits, bias 7, 3 mantissa bits), halved
// for the same reason. 0x00 and 0x7f (the NaN code) decode to 0; bit 7 is ignored.
inline float ue4m3_to_fp32_half(uint8_t x) {
  if (x == 0 || x == 0x7f) return 0.0f;
  const int exponent = (x >> 3) & 0xf;
  const int mantissa = x & 0x7;
  float value;
  if (exponent == 0) {
    value = static_cast<float>(mantissa) * 0x1p-9f;
  } else {
    const float significand = 1.0f + static_cast<float>(mantissa) * 0.125f;
    value = significand * std::bit_cast<float>(static_cast<uint32_t>(exponent - 7 + 127) << 23);
  }
  return value * 0.5f;
}

// f32 -> UE4M3 as ggml's NVFP4 quantizer encodes a scale: non-positive -> 0, clamp to
// 448, round half up on the first dropped mantissa bit, and saturate to 0x7e (448)
// from 2^8 up (so the codes 0x78..0x7d are never produced).
inline uint8_t fp32_to_ue4m3(float x) {
  if (!(x > 0.0f)) return 0;
  if (x > 448.0f) x = 448.0f;
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  int exponent = static_cast<int>((bits >> 23) & 0xffu) - 127 + 7;
  if (exponent <= 0) {
    int mantissa = static_cast<int>(x * 512.0f + 0.5f);
    if (mantissa > 7) mantissa = 7;
    return mantissa < 1 ? uint8_t{0} : static_cast<uint8_t>(mantissa);
  }
  if (exponent >= 15) return 0x7e;
  int mantissa = static_cast<int>((bits >> 20) & 0x7u) + static_cast<int>((bits >> 19) & 1u);
  if (mantissa > 7) {
    mantissa = 0;
    if (++exponent >= 15) return 0x7e;
  }
  return static_cast<uint8_t>((exponent << 3) | mantissa);
}

}  // namespace pico
