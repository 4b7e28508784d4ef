// llama.cpp's horizontal sum of 8 float lanes (hsum_float_8's tree: halves, then
// pairs of halves of those), shared by the 256-bit kernels that end in it.
#pragma once

#include <immintrin.h>

namespace pico::cpu {
namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace
}  // namespace pico::cpu
