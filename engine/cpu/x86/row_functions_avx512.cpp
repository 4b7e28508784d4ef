// Row functions at the avx512 level with the float operations of llama.cpp's AVX-512
// CPU builds (16 lanes per vector from the start of a row, leftovers one by one), so
// that pico's activations round as llama.cpp's: SiLU and the softmax exponentials with
// its AVX-512 e^x (row_functions_avx2.cpp's polynomial with 2^n applied by vscalefps,
// and 0 / infinity past |n| > 192), and LayerNorm's sum of squares.
#include "cpu/x86/avx512_intrinsics.hpp"

#include <math.h>
#include <cstdint>

#include "cpu/kernels.hpp"

namespace pico::cpu {
namespace {

__m512 exp_as_llama(__m512 x) {
  const __m512 shift = _mm512_set1_ps(0x1.8p23f);
  const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), shift);
  const __m512 n = _mm512_sub_ps(z, shift);
  const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f),
                                    _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
  const __mmask16 huge = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192.0f), _CMP_GT_OQ);
  const __m512 u = _mm512_mul_ps(b, b);
  const __m512 j = _mm512_fmadd_ps(
      _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f)), u,
                      _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f))),
      u, _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.0f)));
  const __m512 result = _mm512_scalef_ps(j, n);
  if (huge == 0) return result;
  const __m512 zero = _mm512_setzero_ps();
  const __m512 limit =
      _mm512_mask_blend_ps(_mm512_cmp_ps_mask(n, zero, _CMP_LE_OQ), _mm512_set1_ps(INFINITY), zero);
  return _mm512_mask_blend_ps(huge, result, limit);
}

void silu_row_avx512(const float* x, int64_t n, float* y) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __m512 e = exp_as_llama(_mm512_sub_ps(_mm512_setzero_ps(), v));
    _mm512_storeu_ps(y + i, _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0f), e)));
  }
  // libm's expf, not std::exp: an ISA file must not instantiate inline library code.
  for (; i < n; ++i) y[i] = x[i] / (1.0f + expf(-x[i]));
}

// The halves of the vector added (8, then 4), then (0+2, 1+3), then their sum: the
// compiler's _mm512_reduce_add_ps, which llama.cpp uses, written out so that it cannot
// depend on the compiler.
float sum_lanes(__m512 v) {
  const __m256 halves = _mm256_add_ps(_mm512_extractf32x8_ps(v, 1), _mm512_castps512_ps256(v));
  const __m128 quarters = _mm_add_ps(_mm256_extractf128_ps(halves, 1), _mm256_castps256_ps128(halves));
  const __m128 pairs = _mm_add_ps(quarters, _mm_shuffle_ps(quarters, quarters, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehdup_ps(pairs)));
}

double exp_row_avx512(const float* x, int64_t n, float max, float* y) {
  int64_t i = 0;
  double sum = 0.0;
  for (; i + 16 <= n; i += 16) {
    const __m512 e = exp_as_llama(_mm512_sub_ps(_mm512_loadu_ps(x + i), _mm512_set1_ps(max)));
    _mm512_storeu_ps(y + i, e);
    sum += static_cast<double>(sum_lanes(e));
  }
  for (; i < n; ++i) {
    y[i] = expf(x[i] - max);
    sum += static_cast<double>(y[i]);
  }
  return sum;
}

double centered_squares_row_avx512(const float* x, int64_t n, float mean, float* y) {
  int64_t i = 0;
  double sum = 0.0;
  for (; i + 16 <= n; i += 16) {
    const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(x + i), _mm512_set1_ps(mean));
    _mm512_storeu_ps(y + i, d);
    sum += static_cast<double>(sum_lanes(_mm512_mul_ps(d, d)));
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

// Leftover products one vector at a time, each vector's lanes added to the sum in
// order; the last few fused: how GCC compiles ggml's `sumf += x[i]*y[i]` tail.
float add_products_in_order(int64_t& i, int64_t n, const float* x, const float* y, float sum) {
  alignas(64) float lanes[16];
  for (; i + 16 <= n; i += 16) {
    _mm512_store_ps(lanes, _mm512_mul_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    for (float lane : lanes) sum += lane;
  }
  if (i + 8 <= n) {
    _mm256_store_ps(lanes, _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (int l = 0; l < 8; ++l) sum += lanes[l];
    i += 8;
  }
  for (; i < n; ++i) sum = fused(x[i], y[i], sum);
  return sum;
}

// ggml_vec_dot_f32 at AVX-512: four accumulators over 64-float steps, reduced
// (0+2, 1+3, then their sum, then _mm512_reduce_add_ps), then the leftovers.
float dot_as_ggml(int64_t n, const float* x, const float* y) {
  const int64_t steps = n & ~int64_t{63};
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t i = 0; i < steps; i += 64) {
    for (int j = 0; j < 4; ++j) {
      acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16 * j), _mm512_loadu_ps(y + i + 16 * j), acc[j]);
    }
  }
  const float sum = sum_lanes(_mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3])));
  int64_t i = steps;
  return add_products_in_order(i, n, x, y, sum);
}

void delta_rule_step_avx512(int64_t d, float* state, const float* q, const float* k, const float* v, float decay,
                            float beta, float scale, float* out) {
  const __m512 decay_v = _mm512_set1_ps(decay);
  for (int64_t j = 0; j < d; ++j) {
    float* row = state + j * d;
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) _mm512_storeu_ps(row + i, _mm512_mul_ps(_mm512_loadu_ps(row + i), decay_v));
    for (; i < d; ++i) row[i] *= decay;
    const float u = (v[j] - dot_as_ggml(d, row, k)) * beta;
    const __m512 u_v = _mm512_set1_ps(u);
    for (i = 0; i + 16 <= d; i += 16) {
      _mm512_storeu_ps(row + i, _mm512_fmadd_ps(_mm512_loadu_ps(k + i), u_v, _mm512_loadu_ps(row + i)));
    }
    for (; i < d; ++i) row[i] = fused(k[i], u, row[i]);
    out[j] = dot_as_ggml(d, row, q) * scale;
  }
}

void conv_row_avx512(int64_t channels, int64_t taps, const float* window, const float* weights, int64_t stride,
                   float* y) {
  // The zen4 / skylakex builds: 16 products at a time, then 8, then the last taps
  // fused (objdump of libggml-cpu-zen4.so).
  const int64_t rounded = taps / 8 * 8;  // taps whose products are rounded before the sum
  int64_t c = 0;
  for (; c + 16 <= channels; c += 16) {
    __m512 sum = _mm512_setzero_ps();
    for (int64_t i = 0; i < taps; ++i) {
      const __m512 x = _mm512_loadu_ps(window + i * stride + c), w = _mm512_loadu_ps(weights + i * stride + c);
      sum = i < rounded ? _mm512_add_ps(sum, _mm512_mul_ps(x, w)) : _mm512_fmadd_ps(x, w, sum);
    }
    _mm512_storeu_ps(y + c, sum);
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

void fill_avx512_row_functions(KernelTable& table) {
  set_row_functions(table, silu_row_avx512, exp_row_avx512, centered_squares_row_avx512);
  set_recurrent_functions(table, delta_rule_step_avx512, conv_row_avx512, dot_as_ggml);
}

}  // namespace pico::cpu
