// vec_dot of every type and level: scalar against a float reference, SIMD against
// scalar, and gemm bit-identical to vec_dot (batch invariance).
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "cpu/kernels.hpp"
#include "cpu/test_support.hpp"

namespace pico::cpu {
namespace {

using test::block_unit;
using test::nmse;
using test::partner;
using test::random_rows;
using test::row_bytes;
using test::weight_types;

std::string label(GgmlType type, CpuLevel level) {
  return std::string(type_traits(type).name) + " @ " + std::string(level_name(level));
}

TEST(CpuKernels, EveryWeightTypeHasAScalarKernel) {
  const KernelTable& scalar = kernels_for(CpuLevel::scalar);
  for (GgmlType type : weight_types()) {
    EXPECT_NE(scalar.vec_dot[slot(type)], nullptr) << type_traits(type).name;
    EXPECT_NE(scalar.gemm[slot(type)], nullptr) << type_traits(type).name;
    EXPECT_NE(scalar.quantize[slot(partner(type))], nullptr) << type_traits(type).name;
  }
}

TEST(CpuKernels, ScalarMatchesFloatReference) {
  const KernelTable& scalar = kernels_for(CpuLevel::scalar);
  for (GgmlType type : weight_types()) {
    const int64_t k = 1024, rows = 24;
    const auto w = random_rows(type, rows, k, 1);
    const auto a = random_rows(partner(type), rows, k, 2);
    std::vector<float> wf(static_cast<size_t>(k)), af(static_cast<size_t>(k));
    std::vector<double> want, got;
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* wr = w.data() + r * row_bytes(type, k);
      const uint8_t* ar = a.data() + r * row_bytes(partner(type), k);
      dequantize_row(type, wr, wf.data(), k);
      dequantize_row(partner(type), ar, af.data(), k);
      double ref = 0.0;
      for (int64_t i = 0; i < k; ++i) ref += static_cast<double>(wf[i]) * af[i];
      want.push_back(ref);
      got.push_back(scalar.vec_dot[slot(type)](k, wr, ar));
    }
    EXPECT_LE(nmse(want, got), 5e-4) << type_traits(type).name;
    // Far closer than the bound in practice (Q8_1 rounds its sum term to f16: ~3e-7).
    EXPECT_LE(nmse(want, got), 1e-6) << type_traits(type).name;
  }
}

// k values at block edges: 1, 2, 3 and 5 units; plain types also odd lengths.
std::vector<int64_t> lengths(GgmlType type) {
  const int64_t unit = block_unit(type);
  std::vector<int64_t> ks = {unit, 2 * unit, 3 * unit, 5 * unit};
  if (unit == 1) ks = {1, 7, 8, 9, 15, 16, 17, 33, 100, 1000};
  return ks;
}

TEST(CpuKernels, SimdMatchesScalar) {
  const KernelTable& scalar = kernels_for(CpuLevel::scalar);
  for (CpuLevel level : supported_levels()) {
    const KernelTable& table = kernels_for(level);
    for (GgmlType type : weight_types()) {
      for (int64_t k : lengths(type)) {
        const int64_t rows = 16;
        const auto w = random_rows(type, rows, k, 3);
        const auto a = random_rows(partner(type), rows, k, 4);
        std::vector<double> want, got;
        for (int64_t r = 0; r < rows; ++r) {
          const uint8_t* wr = w.data() + r * row_bytes(type, k);
          const uint8_t* ar = a.data() + r * row_bytes(partner(type), k);
          want.push_back(scalar.vec_dot[slot(type)](k, wr, ar));
          got.push_back(table.vec_dot[slot(type)](k, wr, ar));
        }
        EXPECT_LE(nmse(want, got), 5e-4) << label(type, level) << " k=" << k;
        EXPECT_LE(nmse(want, got), 1e-9) << label(type, level) << " k=" << k;
      }
    }
  }
}

// gemm over `rows` weight rows x `tokens` activation rows, each output compared bit
// for bit with vec_dot of the same row and token.
void expect_gemm_equals_vec_dot(const KernelTable& table, GgmlType type, CpuLevel level, int64_t k,
                                const std::vector<uint8_t>& w, int64_t rows, const std::vector<uint8_t>& a,
                                int64_t tokens) {
  const size_t wb = row_bytes(type, k), ab = row_bytes(partner(type), k);
  std::vector<float> y(static_cast<size_t>(rows * tokens), -1.0f);
  table.gemm[slot(type)](k, w.data(), wb, rows, a.data(), ab, tokens, y.data(), rows);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      const float want = table.vec_dot[slot(type)](k, w.data() + r * wb, a.data() + t * ab);
      const float got = y[static_cast<size_t>(t * rows + r)];
      ASSERT_EQ(std::memcmp(&want, &got, sizeof(float)), 0)
          << label(type, level) << " rows=" << rows << " tokens=" << tokens << " r=" << r << " t=" << t
          << " want " << want << " got " << got;
    }
  }
}

TEST(CpuKernels, GemmIsBitIdenticalToVecDot) {
  for (CpuLevel level : supported_levels()) {
    const KernelTable& table = kernels_for(level);
    for (GgmlType type : weight_types()) {
      const int64_t k = 2 * block_unit(type) + (block_unit(type) == 1 ? 13 : 0);
      const int64_t max_rows = 33, max_tokens = 17;
      const auto w = random_rows(type, max_rows, k, 5);
      const auto a = random_rows(partner(type), max_tokens, k, 6);
      for (int64_t rows : {1, 2, 7, 33}) {
        for (int64_t tokens = 1; tokens <= max_tokens; ++tokens) {
          expect_gemm_equals_vec_dot(table, type, level, k, w, rows, a, tokens);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// Long rows: the GEMM decodes its weights in blocks of rows sized to the cache
// (tile_driver.hpp), so here several blocks, one ending mid-tile, and full token
// groups plus a rest (21 tokens: at least the 16 below which the AVX-512 Q4_0/Q8_0
// GEMM goes row by row); every output still bit-identical to vec_dot.
TEST(CpuKernels, GemmOverSeveralWeightBlocksIsBitIdenticalToVecDot) {
  const int64_t k = 8192, rows = 70, tokens = 21;
  for (GgmlType type : weight_types()) {
    if (k % block_unit(type) != 0) continue;
    const auto w = random_rows(type, rows, k, 7);
    const auto a = random_rows(partner(type), tokens, k, 8);
    for (CpuLevel level : supported_levels()) {
      const KernelTable& table = kernels_for(level);
      expect_gemm_equals_vec_dot(table, type, level, k, w, rows, a, tokens);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(CpuKernels, ReportsWhichLevelServesEachType) {
  for (CpuLevel level : supported_levels()) {
    const KernelTable& table = kernels_for(level);
    EXPECT_EQ(table.level, level);
    std::string served;
    for (GgmlType type : weight_types()) {
      served += std::string(type_traits(type).name) + ":" + std::string(level_name(table.vec_dot_level[slot(type)])) + " ";
    }
    std::printf("[%s] %s\n", std::string(level_name(level)).c_str(), served.c_str());
  }
}

// The ARM levels' own kernels are the ones selected (not a silent scalar fallback).
// Only ARM builds have ARM kernels to check (x86 builds run the same check for their
// levels through the SIMD-vs-scalar tests above).
#if defined(__aarch64__) || defined(__arm__)
TEST(CpuKernels, ArmLevelsServeTheirOwnKernels) {
  // pico's ARM builds target NEON hosts (aarch64 always has it; armv7 is built with -mfpu=neon).
  ASSERT_TRUE(level_supported(CpuLevel::neon));
  const KernelTable& neon = kernels_for(CpuLevel::neon);
  for (GgmlType type : {GgmlType::F32, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::IQ4_NL, GgmlType::Q4_K, GgmlType::Q6_K,
                        GgmlType::Q4_1, GgmlType::Q5_1, GgmlType::Q1_0, GgmlType::Q2_0, GgmlType::Q2_K, GgmlType::Q3_K,
                        GgmlType::Q5_K}) {
    EXPECT_EQ(neon.vec_dot_level[slot(type)], CpuLevel::neon) << type_traits(type).name;
  }
#if defined(__aarch64__)
  EXPECT_EQ(neon.vec_dot_level[slot(GgmlType::F16)], CpuLevel::neon);
  for (CpuLevel level : {CpuLevel::dotprod, CpuLevel::i8mm}) {
    if (!level_supported(level)) continue;
    const KernelTable& table = kernels_for(level);
    // i8mm has its own Q8_0 and Q4_0 (SMMLA gemm tiles); dotprod's serve the rest.
    EXPECT_EQ(table.vec_dot_level[slot(GgmlType::Q8_0)], level) << level_name(level);
    EXPECT_EQ(table.vec_dot_level[slot(GgmlType::Q4_0)], level) << level_name(level);
    EXPECT_EQ(table.vec_dot_level[slot(GgmlType::Q4_K)], CpuLevel::dotprod) << level_name(level);
    EXPECT_EQ(table.vec_dot_level[slot(GgmlType::Q6_K)], CpuLevel::dotprod) << level_name(level);
    for (GgmlType type : {GgmlType::Q4_1, GgmlType::Q5_1, GgmlType::Q1_0, GgmlType::Q2_0, GgmlType::Q2_K,
                          GgmlType::Q3_K, GgmlType::Q5_K}) {
      EXPECT_EQ(table.vec_dot_level[slot(type)], CpuLevel::dotprod) << type_traits(type).name << " @ " << level_name(level);
    }
    EXPECT_EQ(table.vec_dot_level[slot(GgmlType::F32)], CpuLevel::neon) << level_name(level);
  }
#endif
}
#endif

TEST(CpuFeatures, LevelNamesRoundTrip) {
  for (CpuLevel level : {CpuLevel::scalar, CpuLevel::avx2, CpuLevel::avx512, CpuLevel::neon, CpuLevel::dotprod,
                         CpuLevel::i8mm}) {
    EXPECT_EQ(parse_level(level_name(level)), level);
  }
  EXPECT_FALSE(parse_level("sse9"));
  EXPECT_EQ(supported_levels().front(), CpuLevel::scalar);
  EXPECT_TRUE(level_supported(best_level()));
}

}  // namespace
}  // namespace pico::cpu
