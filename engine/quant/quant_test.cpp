// Round trips of every type with a quantizer, measured as llama.cpp's
// test-quantize-fns measures them, and the contracts of quant/quantize.hpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "quant/quantize.hpp"
#include "quant/test_data.hpp"

namespace pico {
namespace {

using quant_test::portable_data;
using quant_test::synthetic_data;

// test-quantize-fns' "absolute quantization error": sqrt(sum of squared
// differences) / n.
float total_error(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double diff = a[i] - b[i];
    sum += diff * diff;
  }
  return std::sqrt(static_cast<float>(sum)) / static_cast<float>(a.size());
}

struct Bound {
  GgmlType type;
  float max_error;
};

// test-quantize-fns' limits: 0.002 for 4 bits and more, 0.004 at 3 bits, 0.0075 at
// 2 bits, 0.01 for the ternary formats (ggml counts Q2_0, whose quantizer uses only
// three of its four codes, among them), 0.025 binary, 0.003 for NVFP4.
const std::vector<Bound>& bounds() {
  using T = GgmlType;
  static const std::vector<Bound> b = {
      {T::F16, 0.002f},   {T::BF16, 0.002f},  {T::Q4_0, 0.002f},   {T::Q4_1, 0.002f},   {T::Q5_0, 0.002f},
      {T::Q5_1, 0.002f},  {T::Q8_0, 0.002f},  {T::Q8_1, 0.002f},   {T::Q6_0, 0.002f},   {T::Q2_K, 0.0075f},
      {T::Q3_K, 0.004f},  {T::Q4_K, 0.002f},  {T::Q5_K, 0.002f},   {T::Q6_K, 0.002f},   {T::Q8_K, 0.002f},
      {T::IQ4_NL, 0.002f}, {T::IQ4_XS, 0.002f}, {T::MXFP4, 0.002f}, {T::NVFP4, 0.003f},  {T::TQ1_0, 0.01f},
      {T::TQ2_0, 0.01f},  {T::Q2_0, 0.01f},   {T::Q1_0, 0.025f},
  };
  return b;
}

float round_trip_error(GgmlType type, const std::vector<float>& x) {
  const TypeTraits& row = type_traits(type);
  std::vector<uint8_t> q(*bytes_of(row, x.size()));
  std::vector<float> y(x.size());
  quantize_row(type, x.data(), q.data(), static_cast<int64_t>(x.size()));
  dequantize_row(type, q.data(), y.data(), static_cast<int64_t>(x.size()));
  return total_error(x, y);
}

class RoundTrip : public testing::TestWithParam<Bound> {};

TEST_P(RoundTrip, ErrorWithinTestQuantizeFnsBound) {
  const Bound& b = GetParam();
  EXPECT_LT(round_trip_error(b.type, synthetic_data(0.0f)), b.max_error);
  EXPECT_LT(round_trip_error(b.type, synthetic_data(1.0f)), b.max_error);
}

INSTANTIATE_TEST_SUITE_P(EveryQuantizer, RoundTrip, testing::ValuesIn(bounds()),
                         [](const testing::TestParamInfo<Bound>& param_info) {
                           return std::string(type_traits(param_info.param.type).name);
                         });

TEST(RoundTrip, EveryTypeWithAQuantizerHasABound) {
  for (const TypeTraits& row : all_types()) {
    if (!row.quantize || row.type == GgmlType::F32) continue;
    bool found = false;
    for (const Bound& b : bounds()) found |= b.type == row.type;
    EXPECT_TRUE(found) << row.name;
  }
}

// Always prints the measured errors, for the record.
TEST(RoundTrip, PrintErrorTable) {
  std::printf("\n%-8s %6s %12s %10s  %s\n", "type", "bpw", "error", "bound", "(sqrt(sum sq diff)/n, 0.1+2cos(i), n=4096)");
  for (const Bound& b : bounds()) {
    const TypeTraits& row = type_traits(b.type);
    const float err = round_trip_error(b.type, synthetic_data(0.0f));
    const double bpw = 8.0 * row.block_bytes / row.block_size;
    std::printf("%-8s %6.3f %12.6f %10.4f  %s\n", std::string(row.name).c_str(), bpw, err, b.max_error,
                err < b.max_error ? "ok" : "FAILED");
    EXPECT_LT(err, b.max_error) << row.name;
  }
}

TEST(RoundTrip, ZerosStayZeros) {
  for (const TypeTraits& row : all_types()) {
    if (!row.quantize) continue;
    const size_t n = 1024;
    std::vector<float> x(n, 0.0f), y(n, 1.0f);
    std::vector<uint8_t> q(*bytes_of(row, n), 0xAB);
    quantize_row(row.type, x.data(), q.data(), n);
    dequantize_row(row.type, q.data(), y.data(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(y[i], 0.0f) << row.name << " element " << i;
  }
}

TEST(RoundTrip, QuantizersWriteExactlyTheirBlocks) {
  const std::vector<float> x = synthetic_data(0.5f, 1024);
  for (const TypeTraits& row : all_types()) {
    if (!row.quantize) continue;
    const size_t bytes = *bytes_of(row, x.size());
    std::vector<uint8_t> q(bytes + 64, 0x5A);
    quantize_row(row.type, x.data(), q.data(), static_cast<int64_t>(x.size()));
    for (size_t i = bytes; i < q.size(); ++i) ASSERT_EQ(q[i], 0x5A) << row.name << " wrote past its blocks";
  }
}

TEST(RoundTrip, QuantizersAreDeterministic) {
  const std::vector<float> x = synthetic_data(2.0f, 2048);
  for (const TypeTraits& row : all_types()) {
    if (!row.quantize) continue;
    std::vector<uint8_t> a(*bytes_of(row, x.size()), 0), b(a.size(), 0xFF);
    quantize_row(row.type, x.data(), a.data(), static_cast<int64_t>(x.size()));
    quantize_row(row.type, x.data(), b.data(), static_cast<int64_t>(x.size()));
    EXPECT_EQ(a, b) << row.name << " depends on the previous contents of its output";
  }
}

TEST(TypeTable, KernelsAndDotPartners) {
  for (const TypeTraits& row : all_types()) {
    if (row.quantize) {
      EXPECT_NE(row.dequantize, nullptr) << row.name;
    }
    if (!row.is_quantized) continue;
    EXPECT_NE(row.dequantize, nullptr) << row.name << " has no dequantizer";
    if (row.type == GgmlType::Q8_K) {
      EXPECT_FALSE(row.dot_partner.has_value());
      continue;
    }
    ASSERT_TRUE(row.dot_partner.has_value()) << row.name;
    // The activation side of every dot product must be producible.
    EXPECT_NE(type_traits(*row.dot_partner).quantize, nullptr) << row.name;
  }
  EXPECT_EQ(type_traits(GgmlType::Q4_0).dot_partner, GgmlType::Q8_0);
  EXPECT_EQ(type_traits(GgmlType::Q4_1).dot_partner, GgmlType::Q8_1);
  EXPECT_EQ(type_traits(GgmlType::Q5_1).dot_partner, GgmlType::Q8_1);
  EXPECT_EQ(type_traits(GgmlType::IQ4_NL).dot_partner, GgmlType::Q8_0);
  EXPECT_EQ(type_traits(GgmlType::IQ4_XS).dot_partner, GgmlType::Q8_K);
  EXPECT_EQ(type_traits(GgmlType::Q6_0).dot_partner, GgmlType::Q8_0);
  EXPECT_EQ(type_traits(GgmlType::MXFP4).dot_partner, GgmlType::Q8_0);
  EXPECT_EQ(type_traits(GgmlType::NVFP4).dot_partner, GgmlType::Q8_0);
  EXPECT_EQ(type_traits(GgmlType::Q1_0).dot_partner, GgmlType::Q8_0);
  EXPECT_EQ(type_traits(GgmlType::Q2_0).dot_partner, GgmlType::Q8_0);
  EXPECT_EQ(type_traits(GgmlType::TQ1_0).dot_partner, GgmlType::Q8_K);
  EXPECT_EQ(type_traits(GgmlType::Q6_K).dot_partner, GgmlType::Q8_K);
  EXPECT_EQ(type_traits(GgmlType::F16).dot_partner, GgmlType::F16);
  EXPECT_EQ(type_traits(GgmlType::BF16).dot_partner, GgmlType::BF16);
  EXPECT_EQ(type_traits(GgmlType::F32).dot_partner, GgmlType::F32);
  EXPECT_TRUE(has_quantizer(GgmlType::Q4_K));
  EXPECT_FALSE(has_quantizer(GgmlType::IQ2_XXS));
  EXPECT_TRUE(has_dequantizer(GgmlType::IQ2_XXS));
}

TEST(QuantizeApi, RefusesTypesWithoutAQuantizer) {
  std::vector<float> x(256, 1.0f);
  std::vector<uint8_t> q(1024);
  try {
    quantize_row(GgmlType::IQ2_XXS, x.data(), q.data(), 256);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("iq2_xxs has no quantizer"), std::string::npos) << e.what();
  }
  EXPECT_THROW(quantize_tensor(GgmlType::IQ1_S, x.data(), q.data(), 1, 256), std::invalid_argument);
  EXPECT_THROW(dequantize_row(GgmlType::I32, q.data(), x.data(), 4), std::invalid_argument);
}

TEST(QuantizeApi, RefusesPartialBlocks) {
  std::vector<float> x(512, 1.0f);
  std::vector<uint8_t> q(1024);
  try {
    quantize_row(GgmlType::Q4_0, x.data(), q.data(), 33);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("33 elements of q4_0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(dequantize_row(GgmlType::Q4_K, q.data(), x.data(), 128), std::invalid_argument);
  EXPECT_THROW(quantize_tensor(GgmlType::Q6_K, x.data(), q.data(), 2, 128), std::invalid_argument);
  EXPECT_NO_THROW(quantize_row(GgmlType::Q4_0, x.data(), q.data(), 0));
}

TEST(QuantizeApi, TensorQuantizesRowByRow) {
  const int64_t rows = 3, row_length = 512;
  std::vector<float> x = synthetic_data(0.25f, rows * row_length);
  for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::IQ4_XS, GgmlType::F16}) {
    const TypeTraits& row = type_traits(type);
    const size_t row_bytes = *bytes_of(row, row_length);
    std::vector<uint8_t> whole(rows * row_bytes), one(row_bytes);
    EXPECT_EQ(quantize_tensor(type, x.data(), whole.data(), rows, row_length), rows * row_bytes);
    for (int64_t r = 0; r < rows; ++r) {
      quantize_row(type, x.data() + r * row_length, one.data(), row_length);
      EXPECT_TRUE(std::equal(one.begin(), one.end(), whole.begin() + r * row_bytes)) << row.name << " row " << r;
    }
  }
}

// FNV-1a of the quantized bytes of portable_data() for every quantizer. The values
// were recorded on x86-64, where ggml_crosscheck_test shows the same input quantizes
// to ggml's bytes; other hosts (aarch64 with FMA, armv7, big-endian s390x after
// swapping to file order) must produce the very same files. A mismatch prints the
// table as this host computes it.

TEST(Digest, QuantizedBytesAreTheSameOnEveryHost) {
  struct Expected {
    GgmlType type;
    uint64_t digest;
  };
  const Expected expected[] = {
#include "quant/test_digests.inc"
  };
  const std::vector<float> x = portable_data();
  std::string table;  // the current digests, in test_digests.inc's format
  bool all_match = true;
  for (const TypeTraits& row : all_types()) {
    if (!row.quantize || row.type == GgmlType::Q6_0) continue;  // Q6_0: ggml has no such type to pin it to
    std::vector<uint8_t> q(*bytes_of(row, x.size()));
    quantize_row(row.type, x.data(), q.data(), static_cast<int64_t>(x.size()));
    if constexpr (std::endian::native == std::endian::big) byteswap_blocks(row, q.data(), q.size() / row.block_bytes);
    const uint64_t digest = quant_test::fnv1a(q);
    std::string name(row.name);
    for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    char line[96];
    std::snprintf(line, sizeof line, "    {GgmlType::%s, 0x%016llxull},\n", name.c_str(),
                  static_cast<unsigned long long>(digest));
    table += line;
    const Expected* e = std::find_if(std::begin(expected), std::end(expected),
                                     [&](const Expected& candidate) { return candidate.type == row.type; });
    if (e == std::end(expected)) {
      ADD_FAILURE() << row.name << " has no recorded digest";
      all_match = false;
    } else if (e->digest != digest) {
      ADD_FAILURE() << row.name << " quantizes differently from the recorded bytes";
      all_match = false;
    }
  }
  if (!all_match) std::printf("Digests on this host (test_digests.inc's format):\n%s", table.c_str());
}

}  // namespace
}  // namespace pico
