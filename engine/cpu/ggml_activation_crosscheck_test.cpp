// The activation quantizers against llama.cpp's own: ggml-cpu's quantize_row_q8_0,
// quantize_row_q8_1 and quantize_row_q8_K, loaded at run time from node-llama-cpp's
// prebuilt x86-64 CPU backend ($PICO_GGML_CPU_LIB; ctest sets it, and the test fails
// without it). These are what llama.cpp rounds activations with before its integer
// dot products, so pico must write the very same bytes.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "cpu/kernels.hpp"
#include "cpu/test_support.hpp"

namespace pico::cpu {
namespace {

using GgmlQuantizeRow = void (*)(const float*, void*, int64_t);

void* ggml_cpu_symbol(const char* name) {
  static void* handle = [] {
    const char* path = std::getenv("PICO_GGML_CPU_LIB");
    return path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : nullptr;
  }();
  return handle ? dlsym(handle, name) : nullptr;
}

TEST(GgmlActivationCrosscheck, SameBytesAsGgmlCpu) {
  ASSERT_NE(std::getenv("PICO_GGML_CPU_LIB"), nullptr) << "PICO_GGML_CPU_LIB: path of a libggml-cpu-*.so";
  struct Case {
    GgmlType type;
    const char* symbol;
  };
  for (const Case& c : {Case{GgmlType::Q8_0, "quantize_row_q8_0"}, Case{GgmlType::Q8_1, "quantize_row_q8_1"},
                        Case{GgmlType::Q8_K, "quantize_row_q8_K"}}) {
    auto theirs = reinterpret_cast<GgmlQuantizeRow>(ggml_cpu_symbol(c.symbol));
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

}  // namespace
}  // namespace pico::cpu
