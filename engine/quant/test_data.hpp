// Test inputs shared by quant_test and ggml_crosscheck_test.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace pico::quant_test {

// test-quantize-fns' data: n values of 0.1 + 2 cos(i + offset).
inline std::vector<float> synthetic_data(float offset, size_t n = 32 * 128) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.1f + 2 * std::cos(static_cast<float>(i) + offset);
  return v;
}

// Libm-free pseudo-random data (so every host computes the same floats): a 64-bit
// LCG, values in (-1, 1) times a per-32 power of two in [2^-6, 2^3], with an
// occasional outlier, all-zero and constant block.
inline std::vector<float> portable_data(size_t n = 8192, uint64_t seed = 0x9e3779b97f4a7c15ull) {
  std::vector<float> v(n);
  uint64_t state = seed;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(state >> 32);
  };
  float scale = 1;
  for (size_t i = 0; i < n; ++i) {
    if (i % 32 == 0) scale = static_cast<float>(1u << (next() % 10)) / 64.0f;
    const float unit = static_cast<float>(static_cast<int32_t>(next() >> 8) - (1 << 23)) / static_cast<float>(1 << 23);
    v[i] = unit * scale;
    if (next() % 97 == 0) v[i] *= 16.0f;
  }
  for (size_t i = 512; i < 768 && i < n; ++i) v[i] = 0.0f;
  for (size_t i = 1024; i < 1280 && i < n; ++i) v[i] = 0.375f;
  return v;
}

// FNV-1a, the digest of test_digests.inc.
inline uint64_t fnv1a(const std::vector<uint8_t>& bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint8_t b : bytes) h = (h ^ b) * 0x100000001b3ull;
  return h;
}

}  // namespace pico::quant_test
