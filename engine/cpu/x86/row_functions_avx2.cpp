// Row functions at the avx2 level with the float operations of llama.cpp's AVX2 CPU
// build (8 lanes per vector from the start of a row, leftovers one by one), so that
// pico's activations round as llama.cpp's: SiLU and the softmax exponentials with its
// AVX2 e^x, and LayerNorm's sum of squares.
//
// The e^x: n = round(x / ln 2) by the 1.5 * 2^23 shift trick, b = x - n ln 2 in two
// parts, e^b - 1 as a degree-5 polynomial, then 2^n put into the exponent field (or,
// for |n| > 126, built from two factors so that it neither overflows nor flushes too
// early). About 1.5 ulp from the true value; what matters here is that it is the same.
#include <immintrin.h>

#include <math.h>
#include <cstdint>

#include "cpu/kernels.hpp"

namespace pico::cpu {
namespace {

__m256 exp_as_llama(__m256 x) {
  const __m256 shift = _mm256_set1_ps(0x1.8p23f);
  const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), shift);
  const __m256 n = _mm256_sub_ps(z, shift);
  const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                    _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
  const __m256i exponent = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
  const __m256 two_to_n = _mm256_castsi256_ps(_mm256_add_epi32(exponent, _mm256_castps_si256(_mm256_set1_ps(1.0f))));
  const __m256 abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
  const __m256 large = _mm256_cmp_ps(abs_n, _mm256_set1_ps(126.0f), _CMP_GT_OQ);
  const __m256 u = _mm256_mul_ps(b, b);
  const __m256 j = _mm256_fmadd_ps(
      _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
                      _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
      u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
  const __m256 normal = _mm256_fmadd_ps(j, two_to_n, two_to_n);
  if (_mm256_movemask_ps(large) == 0) return normal;
  // 2^n = s1 * s2 with s1 = 2^+-125-ish, so that the product rounds once, near the end.
  const __m256i sign_step = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                                             _mm256_set1_epi32(static_cast<int>(0x82000000u)));
  const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(sign_step, _mm256_set1_epi32(0x7f000000)));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(exponent, sign_step));
  const __m256 huge = _mm256_cmp_ps(abs_n, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
  const __m256 scaled = _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1);
  const __m256 finite = _mm256_or_ps(_mm256_and_ps(large, scaled), _mm256_andnot_ps(large, normal));
  return _mm256_or_ps(_mm256_and_ps(huge, _mm256_mul_ps(s1, s1)), _mm256_andnot_ps(huge, finite));
}

void silu_row_avx2(const float* x, int64_t n, float* y) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 e = exp_as_llama(_mm256_sub_ps(_mm256_setzero_ps(), v));
    _mm256_storeu_ps(y + i, _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), e)));
  }
  // libm's expf, not std::exp: an ISA file must not instantiate inline library code.
  for (; i < n; ++i) y[i] = x[i] / (1.0f + expf(-x[i]));
}

// Lanes (0+4, 1+5, 2+6, 3+7), then (0+2, 1+3), then their sum: llama.cpp's order.
float sum_lanes(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

double exp_row_avx2(const float* x, int64_t n, float max, float* y) {
  int64_t i = 0;
  double sum = 0.0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp_as_llama(_mm256_sub_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(max)));
    _mm256_storeu_ps(y + i, e);
    sum += static_cast<double>(sum_lanes(e));
  }
  for (; i < n; ++i) {
    y[i] = expf(x[i] - max);
    sum += static_cast<double>(y[i]);
  }
  return sum;
}

double centered_squares_row_avx2(const float* x, int64_t n, float mean, float* y) {
  int64_t i = 0;
  double sum = 0.0;
  for (; i + 8 <= n; i += 8) {
    const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(mean));
    _mm256_storeu_ps(y + i, d);
    sum += static_cast<double>(sum_lanes(_mm256_mul_ps(d, d)));
  }
  for (; i < n; ++i) {
    y[i] = x[i] - mean;
    sum += static_cast<double>(y[i] * y[i]);
  }
  return sum;
}

float fused(float a, float b, float c) {  // a * b + c, one rounding
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

// ggml_vec_dot_f32 at AVX2: four accumulators over 32-float steps (acc[j] takes the
// floats 8j..8j+7 of each step), reduced (0+2, 1+3, their sum, the halves, then two
// horizontal adds: GGML_F32x8_REDUCE), then the leftovers from `steps` on: products a
// vector at a time added in lane order, the last few fused (as GCC compiles ggml's
// `sumf += x[i]*y[i]` tail). dot_steps_end is where the 32-float steps end.
int64_t dot_steps_end(int64_t n) { return n & ~int64_t{31}; }

float finish_dot(const __m256 acc[4], int64_t n, const float* x, const float* y) {
  const __m256 all = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
  const __m128 halves = _mm_add_ps(_mm256_castps256_ps128(all), _mm256_extractf128_ps(all, 1));
  const __m128 pairs = _mm_hadd_ps(halves, halves);
  float sum = _mm_cvtss_f32(_mm_hadd_ps(pairs, pairs));
  int64_t i = dot_steps_end(n);
  alignas(32) float lanes[8];
  for (; i + 8 <= n; i += 8) {
    _mm256_store_ps(lanes, _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (float lane : lanes) sum += lane;
  }
  if (i + 4 <= n) {
    _mm_store_ps(lanes, _mm_mul_ps(_mm_loadu_ps(x + i), _mm_loadu_ps(y + i)));
    for (int l = 0; l < 4; ++l) sum += lanes[l];
    i += 4;
  }
  for (; i < n; ++i) sum = fused(x[i], y[i], sum);
  return sum;
}

float dot_as_ggml(int64_t n, const float* x, const float* y) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t i = 0; i < dot_steps_end(n); i += 32) {
    for (int j = 0; j < 4; ++j) {
      acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8 * j), _mm256_loadu_ps(y + i + 8 * j), acc[j]);
    }
  }
  return finish_dot(acc, n, x, y);
}

// Per state row: decay it, dot it with k, add k * u, dot it with q. The decay and the
// first dot share one pass over the row, the update and the second dot another: the
// same float operations in the same order as the four passes they replace (each dot
// reads the row as just stored), in half the loads and stores.
void delta_rule_step_avx2(int64_t d, float* state, const float* q, const float* k, const float* v, float decay,
                          float beta, float scale, float* out) {
  const __m256 decay_v = _mm256_set1_ps(decay);
  const int64_t steps_end = dot_steps_end(d);
  for (int64_t j = 0; j < d; ++j) {
    float* row = state + j * d;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i < steps_end; i += 32) {
      for (int p = 0; p < 4; ++p) {
        const __m256 decayed = _mm256_mul_ps(_mm256_loadu_ps(row + i + 8 * p), decay_v);
        _mm256_storeu_ps(row + i + 8 * p, decayed);
        acc[p] = _mm256_fmadd_ps(decayed, _mm256_loadu_ps(k + i + 8 * p), acc[p]);
      }
    }
    for (; i + 8 <= d; i += 8) _mm256_storeu_ps(row + i, _mm256_mul_ps(_mm256_loadu_ps(row + i), decay_v));
    for (; i < d; ++i) row[i] *= decay;
    const float u = (v[j] - finish_dot(acc, d, row, k)) * beta;
    const __m256 u_v = _mm256_set1_ps(u);
    for (int p = 0; p < 4; ++p) acc[p] = _mm256_setzero_ps();
    for (i = 0; i < steps_end; i += 32) {
      for (int p = 0; p < 4; ++p) {
        const __m256 updated =
            _mm256_fmadd_ps(_mm256_loadu_ps(k + i + 8 * p), u_v, _mm256_loadu_ps(row + i + 8 * p));
        _mm256_storeu_ps(row + i + 8 * p, updated);
        acc[p] = _mm256_fmadd_ps(updated, _mm256_loadu_ps(q + i + 8 * p), acc[p]);
      }
    }
    for (; i + 8 <= d; i += 8) {
      _mm256_storeu_ps(row + i, _mm256_fmadd_ps(_mm256_loadu_ps(k + i), u_v, _mm256_loadu_ps(row + i)));
    }
    for (; i < d; ++i) row[i] = fused(k[i], u, row[i]);
    out[j] = finish_dot(acc, d, row, q) * scale;
  }
}

// llama.cpp's haswell build compiles ssm_conv's tap loop into 8 products at a time,
// then 4, each added in lane order, and fuses the last taps (objdump of
// libggml-cpu-haswell.so): every product of the first multiple of 4 taps is rounded.
void conv_row_avx2(int64_t channels, int64_t taps, const float* window, const float* weights, int64_t stride,
                   float* y) {
  const int64_t rounded = taps / 4 * 4;  // taps whose products are rounded before the sum
  int64_t c = 0;
  for (; c + 8 <= channels; c += 8) {
    __m256 sum = _mm256_setzero_ps();
    for (int64_t i = 0; i < taps; ++i) {
      const __m256 x = _mm256_loadu_ps(window + i * stride + c), w = _mm256_loadu_ps(weights + i * stride + c);
      sum = i < rounded ? _mm256_add_ps(sum, _mm256_mul_ps(x, w)) : _mm256_fmadd_ps(x, w, sum);
    }
    _mm256_storeu_ps(y + c, sum);
  }
  for (; c < channels; ++c) {
    float sum = 0.0f;
    for (int64_t i = 0; i < taps; ++i) {
      const float x = window[i * stride + c], w = weights[i * stride + c];
      sum = i < rounded ? sum + x * w : fused(x, w, sum);
    }
    y[c] = sum;
  }
}

}  // namespace

void fill_avx2_row_functions(KernelTable& table) {
  set_row_functions(table, silu_row_avx2, exp_row_avx2, centered_squares_row_avx2);
  set_recurrent_functions(table, delta_rule_step_avx2, conv_row_avx2, dot_as_ggml);
}

}  // namespace pico::cpu
