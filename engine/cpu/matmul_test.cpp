// matmul: every output equals the kernel's vec_dot bit for bit, for any token count,
// row count and thread count; forced scalar level works.
#include "cpu/matmul.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <string>

#include "cpu/test_support.hpp"

namespace pico::cpu {
namespace {

using test::partner;
using test::row_bytes;

// Restores the active level after a test changes it.
struct LevelGuard {
  CpuLevel saved = cpu_level();
  ~LevelGuard() { set_cpu_level(saved); }
};

void expect_matmul_matches_vec_dot(const ThreadPool& pool, GgmlType type, int64_t rows, int64_t k, int64_t tokens) {
  const auto w = test::random_rows(type, rows, k, 21);
  const auto x = test::random_floats(static_cast<size_t>(tokens * k), 22);
  std::vector<float> y(static_cast<size_t>(rows * tokens));
  matmul(pool, type, w.data(), rows, k, x.data(), tokens, y.data());

  const KernelTable& table = active_kernels();
  std::vector<uint8_t> a(row_bytes(partner(type), k));
  for (int64_t t = 0; t < tokens; ++t) {
    quantize_row(partner(type), x.data() + t * k, a.data(), k);
    for (int64_t r = 0; r < rows; ++r) {
      const float want = table.vec_dot[slot(type)](k, w.data() + r * row_bytes(type, k), a.data());
      const float got = y[static_cast<size_t>(t * rows + r)];
      ASSERT_EQ(std::memcmp(&want, &got, 4), 0) << type_traits(type).name << " @ " << level_name(cpu_level())
                                                 << " rows=" << rows << " tokens=" << tokens << " r=" << r
                                                 << " t=" << t;
    }
  }
}

TEST(Matmul, MatchesVecDotForAllShapesLevelsAndThreadCounts) {
  LevelGuard guard;
  ThreadPool one(1), two(2);
  for (CpuLevel level : supported_levels()) {
    set_cpu_level(level);
    for (GgmlType type : test::weight_types()) {
      const int64_t k = 2 * test::block_unit(type) + (test::block_unit(type) == 1 ? 5 : 0);
      for (int64_t rows : {1, 7, 33}) {
        for (int64_t tokens : {1, 2, 3, 5, 8, 17}) {
          expect_matmul_matches_vec_dot(one, type, rows, k, tokens);
          expect_matmul_matches_vec_dot(two, type, rows, k, tokens);
        }
      }
    }
  }
}

TEST(Matmul, OneAndTwoThreadsGiveIdenticalBytes) {
  ThreadPool one(1), two(2);
  for (GgmlType type : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::F16}) {
    const int64_t rows = 300, k = 512, tokens = 9;
    const auto w = test::random_rows(type, rows, k, 31);
    const auto x = test::random_floats(static_cast<size_t>(tokens * k), 32);
    std::vector<float> y1(static_cast<size_t>(rows * tokens)), y2(y1.size()), y_single(static_cast<size_t>(rows));
    matmul(one, type, w.data(), rows, k, x.data(), tokens, y1.data());
    matmul(two, type, w.data(), rows, k, x.data(), tokens, y2.data());
    EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * 4), 0) << type_traits(type).name;
    // Each token alone (GEMV) gives the same bytes as inside the batch.
    for (int64_t t = 0; t < tokens; ++t) {
      matmul(two, type, w.data(), rows, k, x.data() + t * k, 1, y_single.data());
      EXPECT_EQ(std::memcmp(y_single.data(), y1.data() + t * rows, static_cast<size_t>(rows) * 4), 0)
          << type_traits(type).name << " token " << t;
    }
  }
}

TEST(Matmul, QuantizedVariantMatches) {
  ThreadPool pool(2);
  const GgmlType type = GgmlType::Q4_K;
  const int64_t rows = 40, k = 768, tokens = 4;
  const auto w = test::random_rows(type, rows, k, 41);
  const auto x = test::random_floats(static_cast<size_t>(tokens * k), 42);
  std::vector<uint8_t> xq(activation_row_bytes(type, k) * tokens);
  quantize_activations(pool, type, x.data(), k, tokens, xq.data());
  std::vector<float> y1(static_cast<size_t>(rows * tokens)), y2(y1.size());
  matmul_quantized(pool, type, w.data(), rows, k, xq.data(), tokens, y1.data());
  matmul(pool, type, w.data(), rows, k, x.data(), tokens, y2.data());
  EXPECT_EQ(y1, y2);
}

TEST(Matmul, ForcedScalarLevel) {
  LevelGuard guard;
  set_cpu_level(CpuLevel::scalar);
  EXPECT_EQ(cpu_level(), CpuLevel::scalar);
  EXPECT_EQ(active_kernels().vec_dot_level[slot(GgmlType::Q4_0)], CpuLevel::scalar);
  ThreadPool pool(2);
  expect_matmul_matches_vec_dot(pool, GgmlType::Q4_0, 19, 256, 3);
  expect_matmul_matches_vec_dot(pool, GgmlType::Q6_K, 19, 512, 3);
}

TEST(Matmul, RejectsBadInput) {
  ThreadPool pool(1);
  std::vector<uint8_t> w(1024);
  std::vector<float> x(64), y(4);
  EXPECT_THROW(matmul(pool, GgmlType::Q4_K, w.data(), 1, 64, x.data(), 1, y.data()), std::invalid_argument);
  EXPECT_THROW(matmul(pool, GgmlType::IQ2_XXS, w.data(), 1, 256, x.data(), 1, y.data()), std::invalid_argument);
  // A level of the other architecture: never supported here.
#if defined(__aarch64__) || defined(__arm__)
  EXPECT_THROW(set_cpu_level(CpuLevel::avx512), std::invalid_argument);
#else
  EXPECT_THROW(set_cpu_level(CpuLevel::i8mm), std::invalid_argument);
#endif
}

}  // namespace
}  // namespace pico::cpu
