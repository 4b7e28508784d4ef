#include "quant/float_convert.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

namespace pico {
namespace {

float f32(uint32_t bits) { return std::bit_cast<float>(bits); }
bool is_f16_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0; }

TEST(Fp16, EveryBitPatternRoundTrips) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float f = fp16_to_fp32(h);
    if (is_f16_nan(h)) {
      EXPECT_TRUE(std::isnan(f)) << i;
      EXPECT_TRUE(is_f16_nan(fp32_to_fp16(f))) << i;
      continue;
    }
    ASSERT_EQ(fp32_to_fp16(f), h) << "f16 bits " << i << " -> " << f;
  }
}

TEST(Fp16, DecodesKnownValues) {
  EXPECT_EQ(fp16_to_fp32(0x3c00), 1.0f);
  EXPECT_EQ(fp16_to_fp32(0xc000), -2.0f);
  EXPECT_EQ(fp16_to_fp32(0x7bff), 65504.0f);
  EXPECT_EQ(fp16_to_fp32(0x0400), std::ldexp(1.0f, -14));   // smallest normal
  EXPECT_EQ(fp16_to_fp32(0x0001), std::ldexp(1.0f, -24));   // smallest subnormal
  EXPECT_EQ(fp16_to_fp32(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(fp16_to_fp32(0x3555), 0.333251953125f);
  EXPECT_EQ(fp16_to_fp32(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(fp16_to_fp32(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(std::bit_cast<uint32_t>(fp16_to_fp32(0x8000)), 0x80000000u);
  EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7e00)));
}

TEST(Fp16, RoundsToNearestTiesToEven) {
  const float ulp = std::ldexp(1.0f, -10);  // f16 spacing in [1, 2)
  EXPECT_EQ(fp32_to_fp16(1.0f + ulp / 2), 0x3c00);                          // tie, 0x3c00 even
  EXPECT_EQ(fp32_to_fp16(1.0f + 3 * ulp / 2), 0x3c02);                      // tie, 0x3c02 even
  EXPECT_EQ(fp32_to_fp16(std::nextafter(1.0f + ulp / 2, 2.0f)), 0x3c01);    // just above the tie
  EXPECT_EQ(fp32_to_fp16(std::nextafter(1.0f + 3 * ulp / 2, 0.0f)), 0x3c01);  // just below
  EXPECT_EQ(fp32_to_fp16(-(1.0f + ulp / 2)), 0xbc00);
  EXPECT_EQ(fp32_to_fp16(2047.0f / 1024.0f + ulp / 2), 0x4000);  // tie that carries into the exponent
  // Overflow: 65520 is the tie between 65504 (odd mantissa) and 65536 -> infinity.
  EXPECT_EQ(fp32_to_fp16(65519.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);
  EXPECT_EQ(fp32_to_fp16(1e10f), 0x7c00);
  EXPECT_EQ(fp32_to_fp16(-std::numeric_limits<float>::infinity()), 0xfc00);
  // Subnormals, in units of 2^-24.
  const float unit = std::ldexp(1.0f, -24);
  EXPECT_EQ(fp32_to_fp16(unit / 2), 0x0000);                        // tie to even (0)
  EXPECT_EQ(fp32_to_fp16(std::nextafter(unit / 2, 1.0f)), 0x0001);
  EXPECT_EQ(fp32_to_fp16(3 * unit / 2), 0x0002);                    // tie to even (2)
  EXPECT_EQ(fp32_to_fp16(5 * unit / 2), 0x0002);
  EXPECT_EQ(fp32_to_fp16(1023.5f * unit), 0x0400);                  // tie rounds up into the normals
  EXPECT_EQ(fp32_to_fp16(1e-10f), 0x0000);
  EXPECT_EQ(fp32_to_fp16(-1e-10f), 0x8000);
  EXPECT_EQ(fp32_to_fp16(f32(0x00000001)), 0x0000);  // float subnormal
  EXPECT_EQ(fp32_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(fp32_to_fp16(std::numeric_limits<float>::quiet_NaN()), 0x7e00);
  EXPECT_EQ(fp32_to_fp16(0.1f), 0x2e66);
}

TEST(Bf16, EveryBitPatternRoundTrips) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float f = bf16_to_fp32(h);
    if (std::isnan(f)) {
      EXPECT_EQ(fp32_to_bf16(f), h | 0x40) << i;  // made quiet
      continue;
    }
    ASSERT_EQ(fp32_to_bf16(f), h) << i;
  }
}

TEST(Bf16, RoundsToNearestTiesToEven) {
  EXPECT_EQ(fp32_to_bf16(f32(0x3f808000)), 0x3f80);  // tie, even below
  EXPECT_EQ(fp32_to_bf16(f32(0x3f818000)), 0x3f82);  // tie, even above
  EXPECT_EQ(fp32_to_bf16(f32(0x3f808001)), 0x3f81);
  EXPECT_EQ(fp32_to_bf16(f32(0x3f807fff)), 0x3f80);
  EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // overflows to infinity
  EXPECT_EQ(fp32_to_bf16(f32(0x7f800001)), 0x7fc0);                    // signalling NaN made quiet
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_fp32(0xc040), -3.0f);
}

TEST(BlockScales, E8M0Halved) {
  EXPECT_EQ(e8m0_to_fp32_half(127), 0.5f);
  EXPECT_EQ(e8m0_to_fp32_half(128), 1.0f);
  EXPECT_EQ(e8m0_to_fp32_half(130), 4.0f);
  EXPECT_EQ(e8m0_to_fp32_half(1), std::ldexp(1.0f, -127));
  EXPECT_EQ(e8m0_to_fp32_half(0), std::ldexp(1.0f, -128));
  EXPECT_EQ(e8m0_to_fp32_half(254), std::ldexp(1.0f, 126));
  EXPECT_EQ(e8m0_to_fp32_half(255), std::ldexp(1.0f, 127));
}

TEST(BlockScales, Ue4m3) {
  EXPECT_EQ(ue4m3_to_fp32_half(0x38), 0.5f);           // exponent 7 (2^0), mantissa 0
  EXPECT_EQ(ue4m3_to_fp32_half(0x7e), 448.0f * 0.5f);  // largest finite: 1.75 * 2^8
  EXPECT_EQ(ue4m3_to_fp32_half(0x01), std::ldexp(1.0f, -10));  // subnormal 2^-9, halved
  EXPECT_EQ(ue4m3_to_fp32_half(0x7f), 0.0f);  // the NaN code
  EXPECT_EQ(ue4m3_to_fp32_half(0x00), 0.0f);
  EXPECT_EQ(ue4m3_to_fp32_half(0x3c), 0.75f);  // 1.5 * 2^0, halved
  for (int code = 1; code < 0x78; ++code) {
    EXPECT_EQ(fp32_to_ue4m3(2 * ue4m3_to_fp32_half(static_cast<uint8_t>(code))), code) << code;
  }
  // As ggml's encoder, everything from 2^8 up saturates to 448 (0x7e).
  for (int code = 0x78; code < 0x7f; ++code) {
    EXPECT_EQ(fp32_to_ue4m3(2 * ue4m3_to_fp32_half(static_cast<uint8_t>(code))), 0x7e) << code;
  }
  EXPECT_EQ(fp32_to_ue4m3(1e9f), 0x7e);
  EXPECT_EQ(fp32_to_ue4m3(-1.0f), 0);
  EXPECT_EQ(fp32_to_ue4m3(0.0f), 0);
}

}  // namespace
}  // namespace pico
