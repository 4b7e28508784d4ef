// pico's activation-side CPU functions against llama.cpp's own, loaded at run time
// from node-llama-cpp's prebuilt x86-64 CPU backends in $PICO_GGML_LIB_DIR (ctest sets
// it, and the tests fail without it): the AVX2 build ("haswell") for pico's avx2 level
// and the AVX-512 build llama.cpp picks on AVX-512 hosts ("zen4") for pico's avx512
// level, when the host runs it.
//  - quantize_row_q8_0 / q8_1 / q8_K: what llama.cpp rounds activations with before its
//    integer dot products; pico must write the very same bytes.
//  - ggml_vec_silu_f32, ggml_vec_soft_max_f32 (SiLU and softmax's exponentials with
//    llama.cpp's vector e^x) and ggml_vec_cvar_f32 (LayerNorm's centered squares):
//    pico's silu_row / exp_row / centered_squares_row must give the same floats.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/kernels.hpp"
#include "cpu/test_support.hpp"

namespace pico::cpu {
namespace {

using GgmlQuantizeRow = void (*)(const float*, void*, int64_t);
using GgmlSilu = void (*)(int n, float* y, const float* x);
using GgmlSoftMax = double (*)(int n, float* y, const float* x, float max);
using GgmlCenteredVariance = double (*)(int n, float* y, const float* x, float mean);
using GgmlScore = int (*)();

// One libggml-cpu-<name>.so, or null (with the reason in `why`) when it is missing or
// the host cannot run it.
void* ggml_cpu_library(const std::string& name, std::string& why) {
  const char* dir = std::getenv("PICO_GGML_LIB_DIR");
  if (!dir) {
    why = "PICO_GGML_LIB_DIR is not set";
    return nullptr;
  }
  const std::string path = std::string(dir) + "/libggml-cpu-" + name + ".so";
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    why = dlerror();
    return nullptr;
  }
  auto score = reinterpret_cast<GgmlScore>(dlsym(handle, "ggml_backend_score"));
  if (!score || score() <= 0) {
    why = path + " does not run on this host";
    return nullptr;
  }
  return handle;
}

struct LevelAndBuild {
  CpuLevel level;
  const char* build;
};

// The (pico level, llama.cpp build) pairs this host can compare.
std::vector<LevelAndBuild> pairs_to_compare() {
  std::vector<LevelAndBuild> pairs = {{CpuLevel::avx2, "haswell"}};
  if (level_supported(CpuLevel::avx512)) pairs.push_back({CpuLevel::avx512, "zen4"});
  return pairs;
}

template <class Fn>
Fn symbol(void* handle, const char* name) {
  return reinterpret_cast<Fn>(dlsym(handle, name));
}

TEST(GgmlActivationCrosscheck, SameBytesAsGgmlCpu) {
  std::string why;
  void* haswell = ggml_cpu_library("haswell", why);
  ASSERT_NE(haswell, nullptr) << why;
  struct Case {
    GgmlType type;
    const char* symbol;
  };
  for (const Case& c : {Case{GgmlType::Q8_0, "quantize_row_q8_0"}, Case{GgmlType::Q8_1, "quantize_row_q8_1"},
                        Case{GgmlType::Q8_K, "quantize_row_q8_K"}}) {
    auto theirs = symbol<GgmlQuantizeRow>(haswell, c.symbol);
    ASSERT_NE(theirs, nullptr) << c.symbol << ": " << dlerror();
    const int64_t k = 4096;
    for (uint32_t seed = 1; seed <= 8; ++seed) {
      std::vector<float> x = test::random_floats(static_cast<size_t>(k), seed, seed % 2 ? 1.0f : 37.0f);
      if (seed == 3) {
        for (int64_t i = 0; i < k; ++i) x[static_cast<size_t>(i)] = static_cast<float>(i % 17) - 8.5f;  // ties
        for (int64_t i = 0; i < k; i += 32) x[static_cast<size_t>(i)] = 127.0f;
      }
      std::vector<uint8_t> want(test::row_bytes(c.type, k)), got(want.size());
      theirs(x.data(), want.data(), k);
      for (CpuLevel level : supported_levels()) {
        kernels_for(level).quantize[slot(c.type)](x.data(), got.data(), k);
        EXPECT_EQ(want, got) << type_traits(c.type).name << " @ " << level_name(level) << " seed " << seed;
      }
    }
  }
}

// Rows of several lengths (whole vectors, leftovers, a model's FFN width) over values
// from tiny to past e^x's overflow and underflow limits (|x / ln 2| > 126 and > 192
// take the vector exp's other paths).
std::vector<std::vector<float>> exp_test_rows() {
  std::vector<std::vector<float>> rows;
  uint32_t seed = 11;
  for (int64_t n : {1, 7, 8, 15, 16, 17, 33, 100, 256, 5632}) {
    for (float spread : {0.5f, 4.0f, 30.0f, 150.0f}) {
      rows.push_back(test::random_floats(static_cast<size_t>(n), seed++, spread));
    }
  }
  std::vector<float> edges = {0.0f, -0.0f, 88.0f, 88.7f, 89.0f, -87.0f, -103.0f, -104.0f, -140.0f, 200.0f, -200.0f,
                              1e-30f, -1e-30f, 0.693147f, -0.693147f, 87.3f};
  rows.push_back(edges);
  return rows;
}

// Values equal bit for bit (NaN never expected here).
::testing::AssertionResult same_floats(const std::vector<float>& want, const std::vector<float>& got) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::memcmp(&want[i], &got[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure() << "element " << i << " of " << want.size() << ": llama.cpp " << want[i]
                                           << ", pico " << got[i];
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(GgmlActivationCrosscheck, SiluIsGgmlVecSilu) {
  for (const LevelAndBuild& pair : pairs_to_compare()) {
    std::string why;
    void* library = ggml_cpu_library(pair.build, why);
    ASSERT_NE(library, nullptr) << why;
    auto theirs = symbol<GgmlSilu>(library, "ggml_vec_silu_f32");
    ASSERT_NE(theirs, nullptr) << dlerror();
    for (const std::vector<float>& x : exp_test_rows()) {
      const int n = static_cast<int>(x.size());
      std::vector<float> want(x.size()), got(x.size());
      theirs(n, want.data(), x.data());
      kernels_for(pair.level).silu_row(x.data(), n, got.data());
      EXPECT_TRUE(same_floats(want, got)) << level_name(pair.level) << " vs " << pair.build << ", n " << n;
    }
  }
}

TEST(GgmlActivationCrosscheck, SoftmaxExponentialsAreGgmlVecSoftMax) {
  for (const LevelAndBuild& pair : pairs_to_compare()) {
    std::string why;
    void* library = ggml_cpu_library(pair.build, why);
    ASSERT_NE(library, nullptr) << why;
    auto theirs = symbol<GgmlSoftMax>(library, "ggml_vec_soft_max_f32");
    ASSERT_NE(theirs, nullptr) << dlerror();
    for (std::vector<float> x : exp_test_rows()) {
      // Masked cells as llama.cpp's attention has them (-inf), in a few rows.
      if (x.size() % 3 == 1) {
        for (size_t i = x.size() / 2 + 1; i < x.size(); i += 2) x[i] = -INFINITY;
      }
      float max = -INFINITY;
      for (float v : x) max = std::max(max, v);
      const int n = static_cast<int>(x.size());
      std::vector<float> want(x.size()), got(x.size());
      const double want_sum = theirs(n, want.data(), x.data(), max);
      const double got_sum = kernels_for(pair.level).exp_row(x.data(), n, max, got.data());
      EXPECT_TRUE(same_floats(want, got)) << level_name(pair.level) << " vs " << pair.build << ", n " << n;
      EXPECT_EQ(want_sum, got_sum) << level_name(pair.level) << " vs " << pair.build << ", n " << n;
    }
  }
}

TEST(GgmlActivationCrosscheck, CenteredSquaresAreGgmlVecCvar) {
  for (const LevelAndBuild& pair : pairs_to_compare()) {
    std::string why;
    void* library = ggml_cpu_library(pair.build, why);
    ASSERT_NE(library, nullptr) << why;
    auto theirs = symbol<GgmlCenteredVariance>(library, "ggml_vec_cvar_f32");
    ASSERT_NE(theirs, nullptr) << dlerror();
    for (const std::vector<float>& x : exp_test_rows()) {
      double sum = 0.0;
      for (float v : x) sum += static_cast<double>(v);
      const float mean = static_cast<float>(sum) / static_cast<float>(x.size());
      const int n = static_cast<int>(x.size());
      std::vector<float> want(x.size()), got(x.size());
      const double want_variance = theirs(n, want.data(), x.data(), mean);  // the sum over n
      const double got_sum = kernels_for(pair.level).centered_squares_row(x.data(), n, mean, got.data());
      EXPECT_TRUE(same_floats(want, got)) << level_name(pair.level) << " vs " << pair.build << ", n " << n;
      EXPECT_EQ(want_variance, got_sum / n) << level_name(pair.level) << " vs " << pair.build << ", n " << n;
    }
  }
}

}  // namespace
}  // namespace pico::cpu
