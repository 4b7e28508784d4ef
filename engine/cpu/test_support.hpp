// Shared helpers of the engine/cpu tests: random rows in any type, and the list of
// weight types with kernels.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cpu/kernels.hpp"
#include "quant/quantize.hpp"
#include "quant/type_traits.hpp"

namespace pico::cpu::test {

inline const std::vector<GgmlType>& weight_types() {
  using T = GgmlType;
  static const std::vector<GgmlType> types = {T::F32,  T::F16,  T::BF16,   T::Q4_0,  T::Q4_1,  T::Q5_0,  T::Q5_1,
                                              T::Q8_0, T::Q2_K, T::Q3_K,   T::Q4_K,  T::Q5_K,  T::Q6_K,  T::IQ4_NL,
                                              T::IQ4_XS, T::Q1_0, T::Q2_0, T::Q6_0, T::TQ1_0, T::TQ2_0, T::MXFP4};
  return types;
}

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

inline size_t row_bytes(GgmlType type, int64_t k) {
  const TypeTraits& t = type_traits(type);
  return static_cast<size_t>(k / t.block_size) * t.block_bytes;
}

// `rows` rows of length k in `type`, from normal random floats.
inline std::vector<uint8_t> random_rows(GgmlType type, int64_t rows, int64_t k, uint32_t seed) {
  const auto x = random_floats(static_cast<size_t>(rows * k), seed);
  std::vector<uint8_t> out(row_bytes(type, k) * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row(type, x.data() + r * k, out.data() + static_cast<size_t>(r) * row_bytes(type, k), k);
  }
  return out;
}

inline GgmlType partner(GgmlType w) { return *type_traits(w).dot_partner; }

// Smallest k that is a whole number of blocks of both the weight and its partner.
inline int64_t block_unit(GgmlType w) {
  const int64_t a = type_traits(w).block_size;
  const int64_t b = type_traits(partner(w)).block_size;
  return a > b ? a : b;
}

// Normalized mean squared error of `got` against `want`.
inline double nmse(const std::vector<double>& want, const std::vector<double>& got) {
  double err = 0.0, norm = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    err += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return norm == 0.0 ? err : err / norm;
}

}  // namespace pico::cpu::test
