// Dequantization checked against values derived here, by hand, from the format
// definitions: blocks are built byte by byte as a GGUF file stores them (little
// endian), and the expected floats are computed element by element from what the
// format says element e is. Nothing here calls the code under test except to decode.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <vector>

#include "quant/quantize.hpp"

namespace pico {
namespace {

// Appends an f16 (given as its bits) little-endian, as files store it.
void put_f16(std::vector<uint8_t>& bytes, uint16_t bits) {
  bytes.push_back(static_cast<uint8_t>(bits & 0xff));
  bytes.push_back(static_cast<uint8_t>(bits >> 8));
}

// Decodes file bytes: swap the multi-byte fields first on a big-endian host, as the
// GGUF reader does.
std::vector<float> decode(GgmlType type, std::vector<uint8_t> bytes) {
  const TypeTraits& row = type_traits(type);
  EXPECT_EQ(bytes.size() % row.block_bytes, 0u) << row.name;
  const uint64_t blocks = bytes.size() / row.block_bytes;
  if constexpr (std::endian::native == std::endian::big) byteswap_blocks(row, bytes.data(), blocks);
  std::vector<float> out(blocks * row.block_size);
  dequantize_row(type, bytes.data(), out.data(), static_cast<int64_t>(out.size()));
  return out;
}

// f16 bit patterns of exactly representable values.
constexpr uint16_t kHalf0_25 = 0x3400, kHalf0_5 = 0x3800, kHalf0_75 = 0x3a00, kHalf1 = 0x3c00, kHalf2 = 0x4000;

TEST(Golden, Q4_0) {
  // d = 0.5; byte j holds element j (low nibble) and element j+16 (high nibble);
  // value = d * (nibble - 8).
  std::vector<uint8_t> b;
  put_f16(b, kHalf0_5);
  for (int j = 0; j < 16; ++j) b.push_back(static_cast<uint8_t>(j | ((15 - j) << 4)));
  const std::vector<float> y = decode(GgmlType::Q4_0, b);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * static_cast<float>(j - 8)) << j;
    EXPECT_EQ(y[j + 16], 0.5f * static_cast<float>(7 - j)) << j + 16;
  }
  EXPECT_EQ(y[0], -4.0f);
  EXPECT_EQ(y[15], 3.5f);
  EXPECT_EQ(y[16], 3.5f);
}

TEST(Golden, Q8_0) {
  // Two blocks: d = 0.25 and d = 2; value = d * (int8) qs[j].
  std::vector<uint8_t> b;
  put_f16(b, kHalf0_25);
  for (int j = 0; j < 32; ++j) b.push_back(static_cast<uint8_t>(j * 8));  // -128 .. 120 as int8
  put_f16(b, kHalf2);
  for (int j = 0; j < 32; ++j) b.push_back(static_cast<uint8_t>(127 - j));
  const std::vector<float> y = decode(GgmlType::Q8_0, b);
  for (int j = 0; j < 32; ++j) {
    const int q0 = j * 8 < 128 ? j * 8 : j * 8 - 256;
    EXPECT_EQ(y[j], 0.25f * static_cast<float>(q0)) << j;
    EXPECT_EQ(y[32 + j], 2.0f * static_cast<float>(127 - j)) << j;
  }
  EXPECT_EQ(y[16], -32.0f);  // 128 as int8 is -128
}

TEST(Golden, Q4_K) {
  // Super-block of 8 sub-blocks of 32: value = d*scale[s]*q - dmin*min[s].
  const int scale[8] = {1, 2, 3, 63, 17, 33, 48, 5};
  const int min[8] = {0, 1, 10, 63, 20, 40, 7, 62};
  std::vector<uint8_t> b;
  put_f16(b, kHalf1);    // d
  put_f16(b, kHalf0_5);  // dmin
  // 12 scale bytes: sub-blocks 0-3 keep scale/min in the low 6 bits of bytes 0-3/4-7;
  // sub-blocks 4-7 keep their low 4 bits in bytes 8-11 (scale low nibble, min high
  // nibble) and their top 2 bits in the top 2 bits of bytes 0-3 (scale) / 4-7 (min).
  uint8_t s[12];
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>(scale[j] | ((scale[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<uint8_t>(min[j] | ((min[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<uint8_t>((scale[j + 4] & 0xf) | ((min[j + 4] & 0xf) << 4));
  }
  b.insert(b.end(), s, s + 12);
  // Quants: 4 groups of 32 bytes; byte l of group g = element 64g+l (low nibble) and
  // element 64g+32+l (high nibble).
  int code[256];
  for (int e = 0; e < 256; ++e) code[e] = (e * 7 + 3) % 16;
  for (int g = 0; g < 4; ++g) {
    for (int l = 0; l < 32; ++l) b.push_back(static_cast<uint8_t>(code[64 * g + l] | (code[64 * g + 32 + l] << 4)));
  }
  const std::vector<float> y = decode(GgmlType::Q4_K, b);
  for (int e = 0; e < 256; ++e) {
    const int sb = e / 32;
    const float expected = 1.0f * static_cast<float>(scale[sb] * code[e]) - 0.5f * static_cast<float>(min[sb]);
    EXPECT_EQ(y[e], expected) << e;
  }
}

TEST(Golden, Q6_K) {
  // 16 sub-blocks of 16: value = d * scale[e/16] * (q - 32), q 6 bits. Each half of
  // 128 elements has 64 ql bytes and 32 qh bytes; element 128h + 32k + l (k = 0..3):
  // low 4 bits in ql[64h + l + 32*(k%2)] (low nibble for k < 2, high for k >= 2),
  // high 2 bits at bit 2k of qh[32h + l].
  const int8_t scale[16] = {1, -2, 3, -4, 5, -6, 7, -8, 127, -128, 64, -64, 0, 9, -10, 11};
  int code[256];
  for (int e = 0; e < 256; ++e) code[e] = (e * 37 + 11) % 64;
  uint8_t ql[128] = {}, qh[64] = {};
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, k = (e % 128) / 32, l = e % 32;
    uint8_t& low = ql[64 * h + l + 32 * (k % 2)];
    low = static_cast<uint8_t>(low | ((code[e] & 0xf) << (k < 2 ? 0 : 4)));
    uint8_t& high = qh[32 * h + l];
    high = static_cast<uint8_t>(high | ((code[e] >> 4) << (2 * k)));
  }
  std::vector<uint8_t> b(ql, ql + 128);
  b.insert(b.end(), qh, qh + 64);
  for (int8_t sc : scale) b.push_back(static_cast<uint8_t>(sc));
  put_f16(b, kHalf0_5);
  const std::vector<float> y = decode(GgmlType::Q6_K, b);
  for (int e = 0; e < 256; ++e) {
    EXPECT_EQ(y[e], 0.5f * static_cast<float>(scale[e / 16] * (code[e] - 32))) << e;
  }
}

TEST(Golden, IQ4_NL) {
  // value = d * table[nibble], with the format's non-linear table.
  const int table[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  std::vector<uint8_t> b;
  put_f16(b, kHalf2);
  for (int j = 0; j < 16; ++j) b.push_back(static_cast<uint8_t>(j | ((15 - j) << 4)));
  const std::vector<float> y = decode(GgmlType::IQ4_NL, b);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 2.0f * static_cast<float>(table[j])) << j;
    EXPECT_EQ(y[j + 16], 2.0f * static_cast<float>(table[15 - j])) << j + 16;
  }
  EXPECT_EQ(y[0], -254.0f);
  EXPECT_EQ(y[16], 226.0f);
}

// OCP microscaling e2m1: sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0;
// exponent 0 is subnormal (0 or 0.5).
float e2m1(int code) {
  const int exponent = (code >> 1) & 3, mantissa = code & 1;
  const float magnitude = exponent == 0 ? 0.5f * static_cast<float>(mantissa)
                                        : (1.0f + 0.5f * static_cast<float>(mantissa)) * std::ldexp(1.0f, exponent - 1);
  return (code & 8) ? -magnitude : magnitude;
}

TEST(Golden, MXFP4) {
  // Block: E8M0 exponent byte (scale 2^(e-127)), then nibbles as Q4_0.
  std::vector<uint8_t> b;
  b.push_back(128);  // scale 2
  for (int j = 0; j < 16; ++j) b.push_back(static_cast<uint8_t>(j | ((15 - j) << 4)));
  b.push_back(120);  // scale 2^-7
  for (int j = 0; j < 16; ++j) b.push_back(static_cast<uint8_t>((j * 5) % 16 | (j << 4)));
  const std::vector<float> y = decode(GgmlType::MXFP4, b);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 2.0f * e2m1(j)) << j;
    EXPECT_EQ(y[j + 16], 2.0f * e2m1(15 - j)) << j;
    EXPECT_EQ(y[32 + j], std::ldexp(e2m1((j * 5) % 16), -7)) << j;
    EXPECT_EQ(y[48 + j], std::ldexp(e2m1(j), -7)) << j;
  }
  EXPECT_EQ(y[7], 12.0f);   // code 7 = +6, times 2
  EXPECT_EQ(y[17], -8.0f);  // code 14 = -4, times 2
}

TEST(Golden, Q1_0) {
  // 128 sign bits, bit j%8 of byte j/8: set = +d, clear = -d.
  std::vector<uint8_t> b;
  put_f16(b, kHalf0_75);
  for (int j = 0; j < 16; ++j) b.push_back(static_cast<uint8_t>(0xA5 ^ (j * 17)));
  const std::vector<float> y = decode(GgmlType::Q1_0, b);
  for (int e = 0; e < 128; ++e) {
    const bool set = ((0xA5 ^ ((e / 8) * 17)) >> (e % 8)) & 1;
    EXPECT_EQ(y[e], set ? 0.75f : -0.75f) << e;
  }
}

TEST(Golden, Q6_0) {
  // ik_llama.cpp's Q6_0: value = d * (q - 32). Low 4 bits of element e in the nibbles
  // of qs[e % 16] (low for e < 16); its top 2 bits in qh[e % 8] at bit
  // 4*((e/8) % 2) + 2*(e/16).
  int code[32];
  for (int e = 0; e < 32; ++e) code[e] = (e * 29 + 5) % 64;
  uint8_t qh[8] = {}, qs[16] = {};
  for (int e = 0; e < 32; ++e) {
    qs[e % 16] = static_cast<uint8_t>(qs[e % 16] | ((code[e] & 0xf) << (e < 16 ? 0 : 4)));
    qh[e % 8] = static_cast<uint8_t>(qh[e % 8] | ((code[e] >> 4) << (4 * ((e / 8) % 2) + 2 * (e / 16))));
  }
  std::vector<uint8_t> b;
  put_f16(b, kHalf0_25);
  b.insert(b.end(), qh, qh + 8);
  b.insert(b.end(), qs, qs + 16);
  const std::vector<float> y = decode(GgmlType::Q6_0, b);
  for (int e = 0; e < 32; ++e) EXPECT_EQ(y[e], 0.25f * static_cast<float>(code[e] - 32)) << e;
}

}  // namespace
}  // namespace pico
