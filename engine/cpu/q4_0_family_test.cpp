// Q4_0 and IQ4_NL at the x86 SIMD levels follow llama.cpp's repacked kernels
// (ggml-cpu/arch/x86/repack.cpp, the q4_b32 8x8 gemv/gemm): per output, the exact
// integer sum s_b of each block, then acc = fma(float(s_b), d_w[b] * d_a[b], acc) from
// 0 over the blocks in order. Checked here bit for bit against that rule written out
// independently (codes read from the blocks, values from the type's own table), for
// vec_dot and for gemm with token counts on both sides of the kernels' token chunk.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/kernels.hpp"
#include "cpu/test_support.hpp"
#include "quant/blocks.hpp"
#include "quant/float_convert.hpp"

namespace pico::cpu {
namespace {

using test::random_rows;
using test::row_bytes;

// The value of code u (0..15) in each type.
int code_value(GgmlType type, int u) { return type == GgmlType::Q4_0 ? u - 8 : quant::kIq4nlValues[u]; }

// llama.cpp's order for one output, from the raw blocks.
float llama_order_dot(GgmlType type, int64_t k, const uint8_t* w, const uint8_t* a) {
  const auto* wb = reinterpret_cast<const quant::BlockQ4_0*>(w);  // IQ4_NL: same layout
  const auto* ab = reinterpret_cast<const quant::BlockQ8_0*>(a);
  float acc = 0.0f;
  for (int64_t b = 0; b < k / 32; ++b) {
    int64_t sum = 0;
    for (int j = 0; j < 32; ++j) {
      const int u = j < 16 ? (wb[b].qs[j] & 0x0f) : (wb[b].qs[j - 16] >> 4);
      sum += code_value(type, u) * ab[b].qs[j];
    }
    const float scale = fp16_to_fp32(wb[b].d) * fp16_to_fp32(ab[b].d);
    acc = std::fma(static_cast<float>(sum), scale, acc);
  }
  return acc;
}

std::vector<CpuLevel> x86_simd_levels() {
  std::vector<CpuLevel> levels;
  for (CpuLevel level : {CpuLevel::avx2, CpuLevel::avx512}) {
    if (level_supported(level)) levels.push_back(level);
  }
  return levels;
}

// Every output of gemm (rows x tokens) and of vec_dot against llama_order_dot.
void expect_llama_order(GgmlType type, int64_t k, const std::vector<uint8_t>& w, int64_t rows,
                        const std::vector<uint8_t>& a, int64_t tokens) {
  const size_t wb = row_bytes(type, k), ab = row_bytes(GgmlType::Q8_0, k);
  for (CpuLevel level : x86_simd_levels()) {
    const KernelTable& table = kernels_for(level);
    std::vector<float> y(static_cast<size_t>(rows * tokens), -1.0f);
    table.gemm[slot(type)](k, w.data(), wb, rows, a.data(), ab, tokens, y.data(), rows);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* wr = w.data() + r * wb;
        const uint8_t* ar = a.data() + t * ab;
        const float want = llama_order_dot(type, k, wr, ar);
        const float got_gemm = y[static_cast<size_t>(t * rows + r)];
        const float got_dot = table.vec_dot[slot(type)](k, wr, ar);
        const std::string where = std::string(type_traits(type).name) + " @ " + std::string(level_name(level)) +
                                  " k=" + std::to_string(k) + " rows=" + std::to_string(rows) +
                                  " tokens=" + std::to_string(tokens) + " r=" + std::to_string(r) +
                                  " t=" + std::to_string(t);
        ASSERT_EQ(std::memcmp(&want, &got_gemm, 4), 0) << where << " gemm " << got_gemm << " want " << want;
        ASSERT_EQ(std::memcmp(&want, &got_dot, 4), 0) << where << " vec_dot " << got_dot << " want " << want;
      }
    }
  }
}

TEST(Q4Family, EveryOutputInLlamaCppOrder) {
  if (x86_simd_levels().empty()) GTEST_SKIP() << "no x86 SIMD level on this host";
  for (GgmlType type : {GgmlType::Q4_0, GgmlType::IQ4_NL}) {
    // Short rows: partial row groups and every token count up to two chunks and a rest.
    {
      const int64_t k = 96, rows = 37, tokens = 19;
      const auto w = random_rows(type, rows, k, 11);
      const auto a = random_rows(GgmlType::Q8_0, tokens, k, 12);
      for (int64_t n = 1; n <= tokens; ++n) {
        expect_llama_order(type, k, w, rows, a, n);
        if (HasFatalFailure()) return;
      }
    }
    // Long rows: the multi-token GEMM decodes its weights in panels of several row
    // groups (more than one panel here), the single-chunk one streams them.
    {
      const int64_t k = 8192, rows = 72, tokens = 12;
      const auto w = random_rows(type, rows, k, 13);
      const auto a = random_rows(GgmlType::Q8_0, tokens, k, 14);
      for (int64_t n : {1, 3, 8, 12}) {
        expect_llama_order(type, k, w, rows, a, n);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// The largest integer sums the codes allow (every weight at its extreme value, every
// activation at +-127, the range of the Q8_0 quantizer, signs aligned or not): no
// 16-bit intermediate may saturate (the AVX2 kernels add vpmaddubsw pairs in int16).
TEST(Q4Family, ExtremeCodesDoNotSaturate) {
  if (x86_simd_levels().empty()) GTEST_SKIP() << "no x86 SIMD level on this host";
  const int64_t k = 64, rows = 16, tokens = 10;  // over one token chunk at every level
  for (GgmlType type : {GgmlType::Q4_0, GgmlType::IQ4_NL}) {
    std::vector<uint8_t> w(row_bytes(type, k) * rows);
    auto* wb = reinterpret_cast<quant::BlockQ4_0*>(w.data());
    std::mt19937 rng(21);
    for (int64_t i = 0; i < rows * k / 32; ++i) {
      wb[i].d = 0x3c00;  // 1.0
      // Rows alternate between the lowest and the highest code; some blocks mixed.
      const int64_t row = i / (k / 32);
      for (uint8_t& q : wb[i].qs) q = row % 3 == 0 ? 0x00 : row % 3 == 1 ? 0xff : static_cast<uint8_t>(rng());
    }
    std::vector<uint8_t> a(row_bytes(GgmlType::Q8_0, k) * tokens);
    auto* ab = reinterpret_cast<quant::BlockQ8_0*>(a.data());
    for (int64_t i = 0; i < tokens * k / 32; ++i) {
      ab[i].d = 0x3c00;
      const int64_t token = i / (k / 32);
      for (int j = 0; j < 32; ++j) {
        const int8_t extremes[] = {127, -127};
        ab[i].qs[j] = token < 2 ? extremes[token] : extremes[(j + token) % 2];
      }
    }
    expect_llama_order(type, k, w, rows, a, tokens);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace pico::cpu
