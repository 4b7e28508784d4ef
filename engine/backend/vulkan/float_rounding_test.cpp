// shaders/float_rounding.glsl compiled as C++ (its GLSL is also valid C++ given the few
// built-ins below) and checked on the host against IEEE arithmetic: the division
// against the CPU's correctly rounded one, the F16 rounding against
// quant/float_convert.hpp's. The shaders run the same text; vulkan_ops_test checks it
// on the device, where lavapipe's own division is exact too, so only this test can
// tell a wrong rounding branch from a right one on a machine without a GPU.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "quant/float_convert.hpp"

namespace pico::backend::vulkan::glsl {
using uint = uint32_t;
inline uint floatBitsToUint(float f) { return std::bit_cast<uint32_t>(f); }
inline float uintBitsToFloat(uint u) { return std::bit_cast<float>(u); }
inline int findMSB(uint u) { return u == 0 ? -1 : static_cast<int>(std::bit_width(u)) - 1; }
struct vec2 {
  float x, y;
};
inline vec2 unpackHalf2x16(uint u) {
  return {fp16_to_fp32(static_cast<uint16_t>(u & 0xffffu)), fp16_to_fp32(static_cast<uint16_t>(u >> 16))};
}
#include "shaders/float_rounding.glsl"
}  // namespace pico::backend::vulkan::glsl

namespace pico::backend::vulkan {
namespace {

bool same_bits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

// Finite floats of every kind: zeros, subnormals, normals near 1, the extremes.
std::vector<float> edge_floats() {
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, 127.0f, -127.0f, 3.0f, 0.1f, 1e-45f, 1e-40f, 1.17549435e-38f,
                          1.1754942e-38f, 3.4028235e38f, 1e38f, 65504.0f, 65519.99f, 65520.0f, 6.1035156e-05f,
                          5.9604645e-08f, 2.9802322e-08f, 2.9802326e-08f, 1.0000001f, 0.99999994f};
  for (uint32_t bits : {0x00000001u, 0x00000002u, 0x007fffffu, 0x00400000u, 0x00800000u, 0x00800001u,
                        0x7f7fffffu, 0x7f000000u, 0x3f800001u, 0x3fffffffu})
    v.push_back(std::bit_cast<float>(bits));
  const size_t n = v.size();
  for (size_t i = 0; i < n; ++i) v.push_back(-v[i]);
  return v;
}

TEST(FloatRounding, DivisionIsTheCorrectlyRoundedQuotient) {
  const std::vector<float> edges = edge_floats();
  for (float a : edges)
    for (float b : edges) {
      if (b == 0.0f) continue;
      EXPECT_TRUE(same_bits(glsl::divide_exact(a, b), a / b)) << a << " / " << b;
    }
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> any_bits;
  size_t wrong = 0;
  for (int i = 0; i < 2'000'000; ++i) {
    // Random finite bit patterns (every exponent, so overflow, underflow and
    // subnormals come up), then quotients near 1 and exact ones (ties are exact halves).
    float a = std::bit_cast<float>(any_bits(rng) & 0xff7fffffu);
    float b = std::bit_cast<float>(any_bits(rng) & 0xff7fffffu);
    if (i % 4 == 1) b = std::nextafter(a, 0.0f);
    if (i % 4 == 2) a = b * static_cast<float>(any_bits(rng) % 4096);
    if (b == 0.0f || !std::isfinite(a) || !std::isfinite(b)) continue;
    if (!same_bits(glsl::divide_exact(a, b), a / b) && ++wrong <= 10)
      ADD_FAILURE() << std::hexfloat << a << " / " << b << ": " << glsl::divide_exact(a, b) << " want " << a / b;
  }
  EXPECT_EQ(wrong, 0u);
}

TEST(FloatRounding, HalfRoundingIsTheCpusOnEveryFloat) {
  size_t wrong = 0;
  // Every 61st bit pattern (NaNs and infinities included), and every pattern near the
  // F16 boundaries: subnormal halves, the smallest normal, the largest finite half.
  auto check = [&](uint32_t bits) {
    const float f = std::bit_cast<float>(bits);
    if (glsl::to_half_bits(f) != fp32_to_fp16(f) && ++wrong <= 10)
      ADD_FAILURE() << std::hex << "0x" << bits << ": 0x" << glsl::to_half_bits(f) << " want 0x" << fp32_to_fp16(f);
  };
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 61) check(static_cast<uint32_t>(bits));
  for (uint32_t centre : {0x33000000u, 0x33800000u, 0x38800000u, 0x477fe000u, 0x477ff000u, 0x7f800000u})
    for (uint32_t d = 0; d < 0x4000u; ++d) {
      check(centre + d), check(centre - d);
      check((centre + d) | 0x80000000u), check((centre - d) | 0x80000000u);
    }
  EXPECT_EQ(wrong, 0u);
  EXPECT_TRUE(same_bits(glsl::round_to_half(0.1f), fp16_to_fp32(fp32_to_fp16(0.1f))));
}

}  // namespace
}  // namespace pico::backend::vulkan
