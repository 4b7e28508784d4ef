// The activation quantizers of every level write the same bytes: quant's reference
// for the plain types and Q8_K, llama.cpp's x86 activation quantizer for Q8_0/Q8_1
// (checked here against a re-derivation from its definition, and in
// ggml_activation_crosscheck_test against ggml-cpu's own function).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>

#include "cpu/kernels.hpp"
#include "cpu/test_support.hpp"
#include "quant/float_convert.hpp"
#include "quant/quantize.hpp"

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

// llama.cpp's x86 Q8_0 activation quantizer, re-derived from its definition: d =
// amax / 127 stored as f16, codes round(x * (127 / amax)) half to even.
std::vector<uint8_t> llama_x86_q8_0(const std::vector<float>& x) {
  std::vector<uint8_t> out;
  for (size_t b = 0; b < x.size() / 32; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    const uint16_t d = fp32_to_fp16(amax / 127.0f);
    out.push_back(static_cast<uint8_t>(d & 0xff));
    out.push_back(static_cast<uint8_t>(d >> 8));
    const float id = amax != 0 ? 127.0f / amax : 0.0f;
    for (int i = 0; i < 32; ++i) {
      const float v = x[b * 32 + i] * id;
      float r = std::floor(v);
      const float fraction = v - r;
      if (fraction > 0.5f || (fraction == 0.5f && std::fmod(r, 2.0f) != 0.0f)) r += 1.0f;
      out.push_back(static_cast<uint8_t>(static_cast<int8_t>(r)));
    }
  }
  return out;
}

TEST(ActivationQuantizers, Q8_0IsLlamaCppsX86Quantizer) {
  static_assert(std::endian::native == std::endian::little || std::endian::native == std::endian::big);
  const int64_t k = 512;
  const auto rows = tricky_rows(k);
  for (CpuLevel level : supported_levels()) {
    for (size_t i = 0; i + 1 < rows.size(); ++i) {
      std::vector<uint8_t> want = llama_x86_q8_0(rows[i]), got(want.size());
      kernels_for(level).quantize[slot(GgmlType::Q8_0)](rows[i].data(), got.data(), k);
      if constexpr (std::endian::native == std::endian::big) {
        for (size_t b = 0; b < got.size(); b += 34) std::swap(got[b], got[b + 1]);
      }
      EXPECT_EQ(want, got) << level_name(level) << " row " << i;
    }
  }
}

TEST(ActivationQuantizers, EveryLevelWritesTheScalarLevelsBytes) {
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
        kernels_for(CpuLevel::scalar).quantize[slot(type)](rows[i].data(), want.data(), k);
        table.quantize[slot(type)](rows[i].data(), got.data(), k);
        if (type != T::Q8_0 && type != T::Q8_1) {  // the others are quant's reference quantizers
          std::vector<uint8_t> reference(want.size());
          quantize_row(type, rows[i].data(), reference.data(), k);
          EXPECT_EQ(reference, want) << type_traits(type).name << " row " << i;
        }
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
