// The activation quantizers of every level write the bytes of quant's reference.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "cpu/kernels.hpp"
#include "cpu/test_support.hpp"

namespace pico::cpu {
namespace {

// Rows that hit the rounding edges: exact .5 ties (amax 127 makes d = 1), zero
// blocks, a negative extreme, huge and tiny magnitudes.
std::vector<std::vector<float>> tricky_rows(int64_t k) {
  std::vector<std::vector<float>> rows;
  rows.push_back(test::random_floats(static_cast<size_t>(k), 11));
  rows.push_back(test::random_floats(static_cast<size_t>(k), 12, 1e-3f));
  rows.push_back(test::random_floats(static_cast<size_t>(k), 13, 3e4f));
  std::vector<float> ties(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) ties[i] = (i % 32 == 0) ? 127.0f : static_cast<float>(i % 17) - 8.5f;
  rows.push_back(ties);
  for (int64_t i = 0; i < k; ++i) ties[i] = (i % 256 == 3) ? -127.0f : static_cast<float>(i % 23) * 0.5f - 5.5f;
  rows.push_back(ties);
  std::vector<float> zeros(static_cast<size_t>(k), 0.0f);
  for (int64_t i = k / 2; i < k; ++i) zeros[i] = static_cast<float>(i % 5) - 2.0f;
  rows.push_back(zeros);
  std::vector<float> specials = test::random_floats(static_cast<size_t>(k), 14);
  specials[1] = 65519.0f;
  specials[2] = 65520.0f;
  specials[3] = -1e-8f;
  specials[4] = 5.96e-8f;
  specials[5] = std::numeric_limits<float>::infinity();
  specials[6] = 3.3895314e38f;
  rows.push_back(specials);  // only for f16 / bf16
  return rows;
}

TEST(ActivationQuantizers, MatchReferenceBytes) {
  using T = GgmlType;
  const int64_t k = 512;
  for (CpuLevel level : supported_levels()) {
    const KernelTable& table = kernels_for(level);
    for (T type : {T::F32, T::F16, T::BF16, T::Q8_0, T::Q8_1, T::Q8_K}) {
      const auto rows = tricky_rows(k);
      for (size_t i = 0; i < rows.size(); ++i) {
        const bool plain = type_traits(type).block_size == 1;
        if (i + 1 == rows.size() && !plain) continue;
        std::vector<uint8_t> want(test::row_bytes(type, k)), got(want.size(), 0xcd);
        quantize_row(type, rows[i].data(), want.data(), k);
        table.quantize[slot(type)](rows[i].data(), got.data(), k);
        EXPECT_EQ(want, got) << type_traits(type).name << " @ " << level_name(level) << " row " << i;
      }
    }
  }
}

TEST(ActivationQuantizers, OddLengthsOfPlainTypes) {
  using T = GgmlType;
  for (CpuLevel level : supported_levels()) {
    const KernelTable& table = kernels_for(level);
    for (T type : {T::F16, T::BF16}) {
      for (int64_t k : {1, 7, 9, 31, 33}) {
        auto x = test::random_floats(static_cast<size_t>(k), 15);
        x[0] = std::numeric_limits<float>::quiet_NaN();
        std::vector<uint8_t> want(test::row_bytes(type, k)), got(want.size());
        quantize_row(type, x.data(), want.data(), k);
        table.quantize[slot(type)](x.data(), got.data(), k);
        EXPECT_EQ(want, got) << type_traits(type).name << " @ " << level_name(level) << " k=" << k;
      }
    }
  }
}

}  // namespace
}  // namespace pico::cpu
