// The CPU backend: matmul through engine/cpu, the other ops written here, each row on
// its own (batch invariance). Built with -ffp-contract=off (see CMakeLists.txt): the
// fused multiply-adds that llama.cpp's compiler makes (RoPE, YaRN, the GELU table) are
// written out.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>
#include <numbers>
#include <stdexcept>
#include <utility>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// GCC 12's AVX-512 intrinsics pass an "undefined" vector as the unused merge operand
// and then warn about it (GCC bug 105593): silenced for the header only.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#define PICO_ATTENTION_AVX512 1
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "backend/attention_sums.hpp"
#include "backend/backend.hpp"
#include "cpu/cpu_features.hpp"
#include "cpu/kernels.hpp"
#include "cpu/matmul.hpp"
#include "cpu/thread_pool.hpp"
#include "quant/float_convert.hpp"
#include "quant/quantize.hpp"
#include "sample/argmax.hpp"

namespace pico::backend {
namespace {

size_t row_bytes(GgmlType type, int64_t n) {
  const auto bytes = bytes_of(type_traits(type), static_cast<uint64_t>(n));
  if (!bytes) throw std::invalid_argument("row length is not whole blocks of its type");
  return static_cast<size_t>(*bytes);
}

// ggml's GELU table: gelu of every F16 value, stored as F16.
const std::vector<uint16_t>& gelu_table() {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t(65536);
    constexpr float kCoefA = 0.044715f;
    constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
    for (uint32_t i = 0; i < 65536; ++i) {
      const float x = fp16_to_fp32(static_cast<uint16_t>(i));
      // 1 + a x^2 as one fused multiply-add, as llama.cpp's compiler contracts it.
      const float g = 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * std::fma(kCoefA * x, x, 1.0f)));
      t[i] = fp32_to_fp16(g);
    }
    return t;
  }();
  return table;
}

float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
  return static_cast<float>(n_dims) * std::log(static_cast<float>(n_ctx_orig) / (n_rot * 2.0f * std::numbers::pi_v<float>)) /
         (2.0f * std::log(base));
}

float yarn_ramp(float low, float high, int64_t i0) {
  const float y = (static_cast<float>(i0 / 2) - low) / std::max(0.001f, high - low);
  return 1.0f - std::min(1.0f, std::max(0.0f, y));
}

// RoPE's rotation of `heads` heads by the (cos, sin) pairs in `cache`. llama.cpp's
// CPU builds let the compiler contract it into fused multiply-adds (x0 * c and x0 * s
// exact, the other product rounded); ggml_op_trace_test requires the same floats.
[[gnu::always_inline]] inline void rotate_heads(float* x, int64_t heads, int64_t head_dim, int64_t n_dims, bool neox,
                                                const float* cache) {
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * head_dim;
    for (int64_t i0 = 0; i0 < n_dims; i0 += 2) {
      const float c = cache[i0], s = cache[i0 + 1];
      const int64_t a = neox ? i0 / 2 : i0;
      const int64_t b = neox ? i0 / 2 + n_dims / 2 : i0 + 1;
      const float x0 = v[a], x1 = v[b];
      v[a] = __builtin_fmaf(x0, c, -(x1 * s));
      v[b] = __builtin_fmaf(x0, s, x1 * c);
    }
  }
}

#if defined(PICO_ATTENTION_AVX512)
// The same with FMA instructions (every x86 level above scalar has them) instead of
// libm's fmaf calls.
[[gnu::target("fma")]] void rotate_heads_fma(float* x, int64_t heads, int64_t head_dim, int64_t n_dims, bool neox,
                                             const float* cache) {
  rotate_heads(x, heads, head_dim, n_dims, neox, cache);
}

// attention_sums.hpp's batched order with vectors: one fused multiply-add chain per
// lane (the products are exact, so fma is the scalar add of the product), then the
// same lane tree. 16 lanes (AVX-512) and 8 (AVX2).
[[gnu::target("avx512f,avx512dq,avx512vl,fma")]] float dot_batched_avx512(const float* a, const float* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  const __m256 halves = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
  const __m128 quarters = _mm_add_ps(_mm256_castps256_ps128(halves), _mm256_extractf128_ps(halves, 1));
  const __m128 pairs = _mm_add_ps(quarters, _mm_movehl_ps(quarters, quarters));
  return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehdup_ps(pairs)));
}

[[gnu::target("avx2,fma")]] float dot_batched_avx2(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  const __m128 quarters = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  const __m128 pairs = _mm_add_ps(quarters, _mm_movehl_ps(quarters, quarters));
  return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehdup_ps(pairs)));
}

// weighted_sum_in_order's batched order: slot l (KV cells c with c % lanes == l) holds
// one vector chain per output value, then add_slot_rows. n a multiple of the width.
[[gnu::target("avx512f,avx512dq,avx512vl,fma")]] void weighted_sum_batched_avx512(const float* weights, const float* values,
                                                                               int64_t count, int64_t n, int64_t first,
                                                                               float* sums, float* out) {
  std::memset(sums, 0, static_cast<size_t>(16 * n) * sizeof(float));
  for (int64_t j = 0; j < count; ++j) {
    float* slot = sums + ((first + j) % 16) * n;
    const float* v = values + j * n;
    const __m512 w = _mm512_set1_ps(weights[j]);
    for (int64_t i = 0; i < n; i += 16) {
      _mm512_storeu_ps(slot + i, _mm512_fmadd_ps(w, _mm512_loadu_ps(v + i), _mm512_loadu_ps(slot + i)));
    }
  }
  add_slot_rows(sums, n, SumOrder{16, 1, false}, out);
}

[[gnu::target("avx2,fma")]] void weighted_sum_batched_avx2(const float* weights, const float* values, int64_t count,
                                                           int64_t n, int64_t first, float* sums, float* out) {
  std::memset(sums, 0, static_cast<size_t>(8 * n) * sizeof(float));
  for (int64_t j = 0; j < count; ++j) {
    float* slot = sums + ((first + j) % 8) * n;
    const float* v = values + j * n;
    const __m256 w = _mm256_set1_ps(weights[j]);
    for (int64_t i = 0; i < n; i += 8) {
      _mm256_storeu_ps(slot + i, _mm256_fmadd_ps(w, _mm256_loadu_ps(v + i), _mm256_loadu_ps(slot + i)));
    }
  }
  add_slot_rows(sums, n, SumOrder{8, 1, false}, out);
}

// AVX-512 versions of CpuBackend's dot_in_double and weighted_sum (used at the avx512
// kernel level): the same partial sums and operations per output, eight or sixteen
// lanes at a time, so the results equal theirs.
[[gnu::target("avx512f,avx512dq,avx512vl")]] float dot_in_double_avx512(const float* a, const float* b, int64_t n) {
  __m512d sums = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    sums = _mm512_add_pd(sums, _mm512_cvtps_pd(_mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i))));
  }
  double s[8];
  _mm512_storeu_pd(s, sums);
  for (; i < n; ++i) s[0] += static_cast<double>(a[i] * b[i]);
  return static_cast<float>(((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7])));
}

// out[i] = fp16_to_fp32(fp32_to_fp16(in[i] * factor)) with F16C (round to nearest
// even, as the scalar conversion); a group holding a NaN takes the scalar path (the
// two keep different NaN payloads).
// F16 -> F32 of n halves (exact either way; the scalar conversion is a bit-twiddling
// function that made converting the KV cache a third of a batched decode step).
[[gnu::target("avx512f,f16c")]] void f16_to_f32_avx512(const uint8_t* in, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 2 * i))));
  }
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    out[i] = fp16_to_fp32(h);
  }
}

[[gnu::target("avx512f,avx512dq,avx512vl,f16c")]] void scale_round_f16_avx512(const float* in, float factor,
                                                                            int64_t n, float* out) {
  int64_t i = 0;
  const __m512 f = _mm512_set1_ps(factor);
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(in + i), f);
    if (_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q) != 0) {
      for (int64_t j = i; j < i + 16; ++j) out[j] = fp16_to_fp32(fp32_to_fp16(in[j] * factor));
      continue;
    }
    _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
  }
  for (; i < n; ++i) out[i] = fp16_to_fp32(fp32_to_fp16(in[i] * factor));
}

[[gnu::target("avx512f,avx512dq,avx512vl")]] void weighted_sum_avx512(const float* weights, const float* values,
                                                                     int64_t count, int64_t n, float* out) {
  int64_t i0 = 0;
  for (; i0 + 64 <= n; i0 += 64) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
    for (int64_t j = 0; j < count; ++j) {
      const float* v = values + j * n + i0;
      const __m512 w = _mm512_set1_ps(weights[j]);
      s0 = _mm512_add_ps(s0, _mm512_mul_ps(w, _mm512_loadu_ps(v)));
      s1 = _mm512_add_ps(s1, _mm512_mul_ps(w, _mm512_loadu_ps(v + 16)));
      s2 = _mm512_add_ps(s2, _mm512_mul_ps(w, _mm512_loadu_ps(v + 32)));
      s3 = _mm512_add_ps(s3, _mm512_mul_ps(w, _mm512_loadu_ps(v + 48)));
    }
    _mm512_storeu_ps(out + i0, s0);
    _mm512_storeu_ps(out + i0 + 16, s1);
    _mm512_storeu_ps(out + i0 + 32, s2);
    _mm512_storeu_ps(out + i0 + 48, s3);
  }
  for (; i0 + 16 <= n; i0 += 16) {
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < count; ++j) {
      sum = _mm512_add_ps(sum, _mm512_mul_ps(_mm512_set1_ps(weights[j]), _mm512_loadu_ps(values + j * n + i0)));
    }
    _mm512_storeu_ps(out + i0, sum);
  }
  for (; i0 < n; ++i0) {
    float sum = 0.0f;
    for (int64_t j = 0; j < count; ++j) sum = sum + weights[j] * values[j * n + i0];
    out[i0] = sum;
  }
}
#endif

class CpuBackend final : public Backend {
 public:
  CpuBackend(int threads, BatchNumerics numerics) : numerics_(numerics), pool_(threads) {}

  const char* name() const override { return "cpu"; }

  // Activation memory is host memory, kept between forward passes.
  float* activations(int64_t count) override {
    const Arena::Place at = arena_.allocate(static_cast<size_t>(count) * sizeof(float), [&](size_t bytes) {
      chunks_.emplace_back(static_cast<uint8_t*>(::operator new[](bytes, std::align_val_t{Arena::kAlignment})));
      return bytes;
    });
    return reinterpret_cast<float*>(chunks_[at.chunk].get() + at.offset);
  }
  size_t activation_mark() const override { return arena_.mark(); }
  void release_activations(size_t mark) override { arena_.release(mark); }
  void upload(const float* host, int64_t count, float* to) override {
    if (to != host) std::memcpy(to, host, static_cast<size_t>(count) * sizeof(float));
  }
  void download(const float* from, int64_t count, float* host) override {
    if (from != host) std::memcpy(host, from, static_cast<size_t>(count) * sizeof(float));
  }
  void copy_rows(const float* x, int64_t x_stride, int64_t rows, int64_t n, float* y, int64_t y_stride) override {
    for (int64_t r = 0; r < rows; ++r) std::memcpy(y + r * y_stride, x + r * x_stride, static_cast<size_t>(n) * sizeof(float));
  }
  void gather_rows(const float* x, int64_t n, const int32_t* ids, int64_t count, float* y) override {
    for (int64_t i = 0; i < count; ++i) std::memcpy(y + i * n, x + ids[i] * n, static_cast<size_t>(n) * sizeof(float));
  }
  void argmax_rows(const float* x, int64_t n, const int32_t* rows, int64_t count, float* out) override {
    for (int64_t i = 0; i < count; ++i) {
      const float* row = x + rows[i] * n;
      const auto best = static_cast<int32_t>(sample::first_argmax(row, static_cast<size_t>(n)));
      std::memcpy(out + i, &best, sizeof best);
      out[count + i] = row[best];
    }
  }
  void scale_rows(float* x, int64_t n, int64_t rows, const float* factors) override {
    for (int64_t r = 0; r < rows; ++r) scale(x + r * n, n, factors[r]);
  }
  void store_kv(state::KvCache& cache, int32_t layer, std::span<const KvSlot> slots, const float* k, int64_t k_stride,
                const float* v, int64_t v_stride) override {
    for (size_t t = 0; t < slots.size(); ++t) {
      const auto row = static_cast<int64_t>(t);
      cache.sequence(slots[t].seq_id).write(layer, slots[t].pos, k + row * k_stride, v + row * v_stride);
    }
  }

  bool supports(Op op, GgmlType type) const override {
    if (op == Op::matmul || op == Op::moe_ffn) {
      try {
        return type_traits(type).dot_partner.has_value();
      } catch (const std::exception&) {
        return false;
      }
    }
    if (op == Op::get_rows) return has_dequantizer(type) || type == GgmlType::F32;
    return type == GgmlType::F32;
  }

  void matmul(const Weight& w, const float* x, int64_t tokens, float* y) override {
    if (f32_by_rows_as_ggml(w, tokens)) return matmul_f32_by_rows(w, x, tokens, y);
    cpu::matmul(pool_, w.type, w.data, w.rows, w.cols, x, tokens, y);
  }

  void matmul_many(std::span<const Weight> ws, const float* x, int64_t tokens, std::span<float* const> ys) override {
    if (ws.size() != ys.size()) throw std::invalid_argument("matmul_many: weights and outputs differ in count");
    for (size_t i = 0; i < ws.size(); ++i) {
      const Weight& w = ws[i];
      const GgmlType a_type = cpu::activation_type(w.type);
      bool shared = a_type != GgmlType::F32;
      for (size_t j = 0; j < i && shared; ++j) {
        if (cpu::activation_type(ws[j].type) == a_type && ws[j].cols == w.cols) shared = false;  // done already
      }
      if (!shared) {
        if (a_type == GgmlType::F32) matmul(w, x, tokens, ys[i]);
        continue;
      }
      // Quantize once for every weight of this activation type and width.
      const size_t bytes = cpu::activation_row_bytes(w.type, w.cols) * static_cast<size_t>(tokens);
      if (scratch_.size() < bytes) scratch_.resize(bytes);
      cpu::quantize_activations(pool_, w.type, x, w.cols, tokens, scratch_.data());
      for (size_t j = i; j < ws.size(); ++j) {
        if (cpu::activation_type(ws[j].type) == a_type && ws[j].cols == w.cols) {
          cpu::matmul_quantized(pool_, ws[j].type, ws[j].data, ws[j].rows, ws[j].cols, scratch_.data(), tokens, ys[j]);
        }
      }
    }
  }

  // llama.cpp multiplies an F32 matrix through llamafile's sgemm only for two tokens or
  // more, rows in multiples of 4 and a width of whole vectors (8 floats, 16 with
  // AVX-512); otherwise row by row with ggml_vec_dot_f32, which adds in another order.
  // The shape rule holds here for every batch (so batch invariance stays: a router of
  // 6 experts or a one-row gate always goes by rows); the one-token rule only with
  // as_llama_cpp, as for attention. Quantized models keep their routers and gates in
  // F32, where a last-bit difference can move a later activation onto another code.
  bool f32_by_rows_as_ggml(const Weight& w, int64_t tokens) const {
    if (w.type != GgmlType::F32) return false;
    const int64_t lanes = cpu::active_kernels().level == cpu::CpuLevel::avx512 ? 16 : 8;
    return w.rows % 4 != 0 || w.cols % lanes != 0 || (numerics_ == BatchNumerics::as_llama_cpp && tokens == 1);
  }
  void matmul_f32_by_rows(const Weight& w, const float* x, int64_t tokens, float* y) const {
    const cpu::DotF32Fn dot = cpu::active_kernels().dot_f32_as_ggml;
    const auto* rows = static_cast<const float*>(w.data);
    for_ranges(tokens * w.rows, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t t = i / w.rows, r = i % w.rows;
        y[i] = dot(w.cols, rows + r * w.cols, x + t * w.cols);
      }
    });
  }

  void get_rows(const Weight& table, const int32_t* ids, int64_t count, float* out) override {
    const size_t bytes = row_bytes(table.type, table.cols);
    const auto* base = static_cast<const uint8_t*>(table.data);
    for (int64_t i = 0; i < count; ++i) {
      if (ids[i] < 0 || ids[i] >= table.rows) throw std::out_of_range("get_rows: id " + std::to_string(ids[i]) + " out of range");
      const uint8_t* row = base + static_cast<size_t>(ids[i]) * bytes;
      if (table.type == GgmlType::F32) {
        std::memcpy(out + i * table.cols, row, static_cast<size_t>(table.cols) * 4);
      } else {
        dequantize_row(table.type, row, out + i * table.cols, table.cols);
      }
    }
  }

  void rms_norm(const float* x, const float* w, int64_t n, int64_t rows, float eps, float* y) override {
    for_rows(rows, n, [&](int64_t r) {
      const float* xr = x + r * n;
      float* yr = y + r * n;
      double sum = 0.0;
      for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(xr[i] * xr[i]);
      const float mean = static_cast<float>(sum / static_cast<double>(n));
      const float scale = 1.0f / std::sqrt(mean + eps);
      for (int64_t i = 0; i < n; ++i) yr[i] = w ? xr[i] * scale * w[i] : xr[i] * scale;
    });
  }

  void layer_norm(const float* x, const float* w, const float* b, int64_t n, int64_t rows, float eps,
                  float* y) override {
    const cpu::CenteredSquaresRowFn centered_squares_row = cpu::active_kernels().centered_squares_row;
    for_rows(rows, n, [&](int64_t r) {
      const float* xr = x + r * n;
      float* yr = y + r * n;
      double sum = 0.0;
      for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(xr[i]);
      const float mean = static_cast<float>(sum) / static_cast<float>(n);
      const double var = centered_squares_row(xr, n, mean, yr);
      const float variance = static_cast<float>(var / static_cast<double>(n));
      const float scale = 1.0f / std::sqrt(variance + eps);
      for (int64_t i = 0; i < n; ++i) {
        float v = yr[i] * scale;
        if (w) v = v * w[i];
        if (b) v = v + b[i];
        yr[i] = v;
      }
    });
  }

  void rope(float* x, int64_t tokens, int64_t row_stride, int64_t heads, int64_t head_dim, const int32_t* pos,
            const RopeParams& p) override {
    const int64_t n_dims = p.n_dims;
    if (n_dims <= 0 || n_dims > head_dim || n_dims % 2 != 0) throw std::invalid_argument("rope: bad n_dims");
    const float theta_scale = std::pow(p.freq_base, -2.0f / static_cast<float>(n_dims));
    float corr[2] = {0.0f, 0.0f};
    if (p.ext_factor != 0.0f) {
      const float start = std::floor(yarn_corr_dim(static_cast<int>(n_dims), p.n_ctx_orig, p.beta_fast, p.freq_base));
      const float end = std::ceil(yarn_corr_dim(static_cast<int>(n_dims), p.n_ctx_orig, p.beta_slow, p.freq_base));
      corr[0] = std::max(0.0f, start);
      corr[1] = std::min(static_cast<float>(n_dims - 1), end);
    }
    for_rows(tokens, heads * head_dim, [&](int64_t t) {
      thread_local std::vector<float> cache;
      cache.resize(static_cast<size_t>(n_dims));
      float theta = static_cast<float>(pos[t]);
      for (int64_t i0 = 0; i0 < n_dims; i0 += 2) {
        const float theta_extrap = theta;
        const float theta_interp = p.freq_scale * theta_extrap;
        float th = theta_interp;
        float mscale = p.attn_factor;
        if (p.ext_factor != 0.0f) {
          const float ramp_mix = yarn_ramp(corr[0], corr[1], i0) * p.ext_factor;
          // Fused multiply-adds where llama.cpp's compiler contracts (see the rotation).
          th = std::fma(theta_interp, 1 - ramp_mix, theta_extrap * ramp_mix);
          mscale *= std::fma(0.1f, std::log(1.0f / p.freq_scale), 1.0f);
        }
        cache[static_cast<size_t>(i0)] = std::cos(th) * mscale;
        cache[static_cast<size_t>(i0) + 1] = std::sin(th) * mscale;
        theta *= theta_scale;
      }
      float* row = x + t * row_stride;
#if defined(PICO_ATTENTION_AVX512)
      if (cpu::cpu_level() != cpu::CpuLevel::scalar) {
        rotate_heads_fma(row, heads, head_dim, n_dims, p.neox, cache.data());
        return;
      }
#endif
      rotate_heads(row, heads, head_dim, n_dims, p.neox, cache.data());
    });
  }

  void attention(const float* q, int64_t q_row_stride, std::span<const AttentionQuery> queries,
                 const AttentionParams& p, float* out) override {
    if (p.n_head_kv <= 0 || p.n_head % p.n_head_kv != 0) throw std::invalid_argument("attention: bad head counts");
    // A task is one KV head of a block of consecutive queries reading the same cache
    // (a prompt's tokens): each K and V row is dequantized once per task instead of
    // once per query. Every query is still computed on its own, the same way whatever
    // its block (batch invariance).
    std::vector<std::pair<int64_t, int64_t>> blocks;  // [begin, end) of queries
    const auto n_queries = static_cast<int64_t>(queries.size());
    for (int64_t begin = 0; begin < n_queries;) {
      int64_t end = begin + 1;
      while (end < n_queries && end - begin < kQueryBlock &&
             queries[static_cast<size_t>(end)].kv.same_rows(queries[static_cast<size_t>(begin)].kv)) {
        ++end;
      }
      blocks.emplace_back(begin, end);
      begin = end;
    }
    const auto n_tasks = static_cast<int64_t>(blocks.size()) * p.n_head_kv;
    const bool avx512 = cpu::cpu_level() == cpu::CpuLevel::avx512;
    const bool one_token_order = numerics_ == BatchNumerics::as_llama_cpp && n_queries == 1;
    pool_.parallel_for(n_tasks, [&](int64_t task, int) {
      const auto [begin, end] = blocks[static_cast<size_t>(task / p.n_head_kv)];
      attend_block(q, q_row_stride, queries.subspan(static_cast<size_t>(begin), static_cast<size_t>(end - begin)),
                   begin, task % p.n_head_kv, p, avx512, one_token_order, out);
    });
  }

  void add(const float* a, const float* b, int64_t n, int64_t rows, int64_t b_rows, float* y) override {
    for_rows(rows, n, [&](int64_t r) {
      const float* br = b + (b_rows == 1 ? 0 : r * n);
      for (int64_t i = 0; i < n; ++i) y[r * n + i] = a[r * n + i] + br[i];
    });
  }

  void mul(const float* a, const float* b, int64_t n, int64_t rows, int64_t b_rows, float* y) override {
    for_rows(rows, n, [&](int64_t r) {
      const float* br = b + (b_rows == 1 ? 0 : r * n);
      for (int64_t i = 0; i < n; ++i) y[r * n + i] = a[r * n + i] * br[i];
    });
  }

  void scale(float* x, int64_t count, float factor) override {
    for (int64_t i = 0; i < count; ++i) x[i] *= factor;
  }

  void silu(const float* x, int64_t n, int64_t rows, float* y) override {
    const cpu::SiluRowFn silu_row = cpu::active_kernels().silu_row;
    for_rows(rows, n, [&](int64_t r) { silu_row(x + r * n, n, y + r * n); });
  }

  void gelu(const float* x, int64_t count, float* y) override {
    const std::vector<uint16_t>& table = gelu_table();
    for_ranges(count, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        if (x[i] <= -10.0f) {
          y[i] = 0.0f;
        } else if (x[i] >= 10.0f) {
          y[i] = x[i];
        } else {
          y[i] = fp16_to_fp32(table[fp32_to_fp16(x[i])]);
        }
      }
    });
  }

  void gelu_erf(const float* x, int64_t count, float* y) override {
    constexpr float kSqrt2Inv = 0.70710678118654752440084436210484f;
    for_ranges(count, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * kSqrt2Inv));
    });
  }

  void softmax(float* x, int64_t n, int64_t rows) override {
    for (int64_t r = 0; r < rows; ++r) {
      float* xr = x + r * n;
      const float inv = static_cast<float>(1.0 / exponentiate_from_max(xr, n, xr));
      for (int64_t i = 0; i < n; ++i) xr[i] *= inv;
    }
  }

  void sigmoid(const float* x, int64_t count, float* y) override {
    for_ranges(count, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) y[i] = 1.0f / (1.0f + expf(-x[i]));
    });
  }

  void softplus(const float* x, int64_t count, float* y) override {
    for_ranges(count, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) y[i] = x[i] > 20.0f ? x[i] : logf(1.0f + expf(x[i]));
    });
  }

  void l2_norm(const float* x, int64_t n, int64_t rows, float eps, float* y) override {
    for_rows(rows, n, [&](int64_t r) {
      const float* xr = x + r * n;
      float* yr = y + r * n;
      double sum = 0.0;
      for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(xr[i] * xr[i]);
      const float scale = 1.0f / std::max(std::sqrt(static_cast<float>(sum)), eps);
      for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * scale;
    });
  }

  void ssm_conv(const float* x, int64_t channels, const float* weights, int64_t taps,
                std::span<const RecurrentSequence> sequences, float* y) override {
    if (taps < 1) throw std::invalid_argument("ssm_conv: no taps");
    const cpu::ConvRowFn conv_row = cpu::active_kernels().conv_row;
    const int64_t held = taps - 1;
    // Each sequence's window: its state's rows, then its own rows; split over the
    // channels in blocks so that one long prompt still uses every thread.
    std::vector<std::vector<float>> windows(sequences.size());
    for (size_t s = 0; s < sequences.size(); ++s) {
      const RecurrentSequence& seq = sequences[s];
      std::vector<float>& window = windows[s];
      window.resize(static_cast<size_t>((held + seq.rows) * channels));
      std::memcpy(window.data(), seq.conv_state, static_cast<size_t>(held * channels) * sizeof(float));
      std::memcpy(window.data() + held * channels, x + seq.first_row * channels,
                  static_cast<size_t>(seq.rows * channels) * sizeof(float));
    }
    constexpr int64_t kChannelBlock = 256;
    const int64_t blocks = (channels + kChannelBlock - 1) / kChannelBlock;
    const auto tasks = static_cast<int64_t>(sequences.size()) * blocks;
    auto run = [&](int64_t task) {
      const RecurrentSequence& seq = sequences[static_cast<size_t>(task / blocks)];
      const float* window = windows[static_cast<size_t>(task / blocks)].data();
      const int64_t c0 = task % blocks * kChannelBlock, width = std::min(kChannelBlock, channels - c0);
      for (int64_t t = 0; t < seq.rows; ++t) {
        conv_row(width, taps, window + t * channels + c0, weights + c0, channels, y + (seq.first_row + t) * channels + c0);
      }
    };
    if (tasks < 2) {
      for (int64_t t = 0; t < tasks; ++t) run(t);
    } else {
      pool_.parallel_for(tasks, [&](int64_t task, int) { run(task); });
    }
    for (size_t s = 0; s < sequences.size(); ++s) {
      std::memcpy(sequences[s].conv_state, windows[s].data() + sequences[s].rows * channels,
                  static_cast<size_t>(held * channels) * sizeof(float));
    }
  }

  void delta_rule(const float* q, const float* k, const float* v, int64_t row_stride, const float* log_decay,
                  const float* beta, std::span<const RecurrentSequence> sequences, const DeltaRuleParams& p,
                  float* out) override {
    if (p.n_k_heads <= 0 || p.n_v_heads % p.n_k_heads != 0 || p.head_dim <= 0) {
      throw std::invalid_argument("delta_rule: bad head counts");
    }
    const cpu::DeltaRuleStepFn step = cpu::active_kernels().delta_rule_step;
    const int64_t d = p.head_dim, heads = p.n_v_heads, group = p.n_v_heads / p.n_k_heads;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    // One task per (sequence, value head): its tokens in order.
    const auto tasks = static_cast<int64_t>(sequences.size()) * heads;
    auto run = [&](int64_t task) {
      const RecurrentSequence& seq = sequences[static_cast<size_t>(task / heads)];
      const int64_t h = task % heads, kh = p.grouped_heads ? h / group : h % p.n_k_heads;
      float* state = seq.ssm_state + h * d * d;
      for (int64_t t = seq.first_row; t < seq.first_row + seq.rows; ++t) {
        const float decay = expf(log_decay[t * heads + h]);
        step(d, state, q + t * row_stride + kh * d, k + t * row_stride + kh * d, v + t * row_stride + h * d, decay,
             beta[t * heads + h], scale, out + (t * heads + h) * d);
      }
    };
    if (tasks < 2) {
      for (int64_t t = 0; t < tasks; ++t) run(t);
    } else {
      pool_.parallel_for(tasks, [&](int64_t task, int) { run(task); });
    }
  }

  void moe_route(const float* logits, int64_t n_expert, int64_t tokens, int64_t k, bool normalize, int32_t* experts,
                 float* weights) override {
    if (k <= 0 || k > n_expert) throw std::invalid_argument("moe_route: k must be in 1..n_expert");
    std::vector<float> probs(static_cast<size_t>(n_expert));
    std::vector<int32_t> order(static_cast<size_t>(n_expert));
    for (int64_t t = 0; t < tokens; ++t) {
      std::memcpy(probs.data(), logits + t * n_expert, probs.size() * sizeof(float));
      softmax(probs.data(), n_expert, 1);
      for (int32_t e = 0; e < n_expert; ++e) order[static_cast<size_t>(e)] = e;
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        const float pa = probs[static_cast<size_t>(a)], pb = probs[static_cast<size_t>(b)];
        return pa > pb || (pa == pb && a < b);
      });
      double sum = 0.0;  // ggml's sum_rows adds in double
      for (int64_t j = 0; j < k; ++j) sum += static_cast<double>(probs[static_cast<size_t>(order[static_cast<size_t>(j)])]);
      const float divisor = std::max(static_cast<float>(sum), 6.103515625e-5f);
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = order[static_cast<size_t>(j)];
        experts[t * k + j] = e;
        weights[t * k + j] = normalize ? probs[static_cast<size_t>(e)] / divisor : probs[static_cast<size_t>(e)];
      }
    }
  }

  void moe_ffn(const ExpertWeights& w, const float* x, int64_t tokens, const int32_t* experts, const float* weights,
               int64_t k, float* out) override {
    const int64_t n_embd = w.gate.cols, n_ff = w.gate.rows, n_expert = w.gate.n_expert;
    if (w.up.cols != n_embd || w.up.rows != n_ff || w.down.cols != n_ff || w.down.rows != n_embd ||
        w.up.n_expert != n_expert || w.down.n_expert != n_expert) {
      throw std::invalid_argument("moe_ffn: expert matrices of mismatched shapes");
    }
    // The (token, slot) pairs routed to each expert, in token order.
    std::vector<std::vector<int64_t>> routed(static_cast<size_t>(n_expert));
    for (int64_t i = 0; i < tokens * k; ++i) {
      const int32_t e = experts[i];
      if (e < 0 || e >= n_expert) throw std::out_of_range("moe_ffn: expert " + std::to_string(e) + " out of range");
      routed[static_cast<size_t>(e)].push_back(i);
    }
    // Each pair's expert output before weighting: rows of n_embd by (token, slot).
    thread_local std::vector<float> expert_out;
    expert_out.resize(static_cast<size_t>(tokens * k * n_embd));
    float* const all_pairs = expert_out.data();
    std::vector<int64_t> active;
    for (int64_t e = 0; e < n_expert; ++e) {
      if (!routed[static_cast<size_t>(e)].empty()) active.push_back(e);  // an expert nobody chose is never read
    }
    // One expert's SwiGLU over its rows. `across`: called from a pool task (one expert
    // per thread), so its matmuls run on that thread alone; else each matmul uses the pool.
    auto run_expert = [&](int64_t e, bool across) {
      const std::vector<int64_t>& pairs = routed[static_cast<size_t>(e)];
      const auto m = static_cast<int64_t>(pairs.size());
      thread_local std::vector<float> rows_in, gate, up, rows_out;
      rows_in.resize(static_cast<size_t>(m * n_embd));
      for (int64_t r = 0; r < m; ++r) {
        std::memcpy(rows_in.data() + r * n_embd, x + (pairs[static_cast<size_t>(r)] / k) * n_embd,
                    static_cast<size_t>(n_embd) * sizeof(float));
      }
      gate.resize(static_cast<size_t>(m * n_ff));
      up.resize(static_cast<size_t>(m * n_ff));
      rows_out.resize(static_cast<size_t>(m * n_embd));
      const Weight gate_w = w.gate.expert(e), up_w = w.up.expert(e), down_w = w.down.expert(e);
      // llama.cpp's MUL_MAT_ID multiplies F32 experts row by row with ggml_vec_dot_f32
      // (never its sgemm), at any token count. Matmuls are batch- and thread-invariant,
      // so both paths below give the same numbers; from a pool task they run inline.
      const auto expert_matmul = [&](const Weight& ew, const float* in, float* product) {
        if (ew.type == GgmlType::F32) return matmul_f32_by_rows(ew, in, m, product);
        cpu::matmul(pool_, ew.type, ew.data, ew.rows, ew.cols, in, m, product);
      };
      if (across || gate_w.type == GgmlType::F32) {
        expert_matmul(gate_w, rows_in.data(), gate.data());
        expert_matmul(up_w, rows_in.data(), up.data());
        for (int64_t r = 0; r < m; ++r) cpu::active_kernels().silu_row(gate.data() + r * n_ff, n_ff, gate.data() + r * n_ff);
        for (int64_t i = 0; i < m * n_ff; ++i) gate[static_cast<size_t>(i)] *= up[static_cast<size_t>(i)];
      } else {
        const Weight gate_up[2] = {gate_w, up_w};
        float* const gate_up_out[2] = {gate.data(), up.data()};
        matmul_many(gate_up, rows_in.data(), m, gate_up_out);
        silu(gate.data(), n_ff, m, gate.data());
        mul(gate.data(), up.data(), n_ff, m, m, gate.data());
      }
      expert_matmul(down_w, gate.data(), rows_out.data());
      for (int64_t r = 0; r < m; ++r) {
        std::memcpy(all_pairs + pairs[static_cast<size_t>(r)] * n_embd, rows_out.data() + r * n_embd,
                    static_cast<size_t>(n_embd) * sizeof(float));
      }
    };
    // Decoding (a few rows per expert): one expert per thread, instead of splitting
    // each small matmul over the pool; a prompt's big per-expert matmuls split instead.
    const auto n_active = static_cast<int64_t>(active.size());
    if (n_active >= 2 && pool_.size() > 1 && tokens * k <= kRowsPerExpertAcross * n_active) {
      pool_.parallel_for(n_active, [&](int64_t i, int) { run_expert(active[static_cast<size_t>(i)], true); });
    } else {
      for (int64_t e : active) run_expert(e, false);
    }
    // Weighted sum in slot order, w_0 y_0 + w_1 y_1 + ..., each product rounded (as
    // llama.cpp multiplies, then adds its per-slot views). The pool's threads have
    // their own thread_locals: they get this thread's buffer by pointer.
    const float* all_out = all_pairs;
    for_rows(tokens, n_embd * k, [&](int64_t t) {
      float* o = out + t * n_embd;
      const float* y = all_out + t * k * n_embd;
      const float w0 = weights[t * k];
      for (int64_t i = 0; i < n_embd; ++i) o[i] = y[i] * w0;
      for (int64_t j = 1; j < k; ++j) {
        const float wj = weights[t * k + j];
        const float* yj = y + j * n_embd;
        for (int64_t i = 0; i < n_embd; ++i) o[i] = o[i] + yj[i] * wj;
      }
    });
  }

 private:
  // moe_ffn runs one expert per thread when its experts average at most this many rows.
  static constexpr int64_t kRowsPerExpertAcross = 8;
  // Elementwise work below this many values runs on the calling thread (decode steps).
  static constexpr int64_t kParallelMin = 16384;

  // fn(r) for every row, rows split over the pool when there is enough work. Each row
  // is computed the same way wherever it runs.
  template <class Fn>
  void for_rows(int64_t rows, int64_t n, Fn&& fn) const {
    if (rows < 2 || rows * n < kParallelMin) {
      for (int64_t r = 0; r < rows; ++r) fn(r);
      return;
    }
    pool_.parallel_for(rows, [&](int64_t r, int) { fn(r); });
  }

  // fn(begin, end) over [0, count) in chunks, in parallel when there is enough work.
  template <class Fn>
  void for_ranges(int64_t count, Fn&& fn) const {
    if (count < kParallelMin) {
      fn(int64_t{0}, count);
      return;
    }
    const int64_t chunks = (count + kParallelMin - 1) / kParallelMin;
    pool_.parallel_for(chunks, [&](int64_t c, int) { fn(c * kParallelMin, std::min(count, (c + 1) * kParallelMin)); });
  }

  // Queries per attention task (see attention).
  static constexpr int64_t kQueryBlock = 16;
  // Lanes of llama.cpp's widest softmax vector (AVX-512; a multiple of AVX2's and NEON's).
  static constexpr int64_t kSoftmaxVector = 16;

  // sum of a[i] * b[i], each product rounded to float and summed in double: eight
  // interleaved partial sums (the latency of one chain dominated attention), added in
  // a fixed tree.
  static float dot_in_double(const float* a, const float* b, int64_t n, bool avx512) {
#if defined(PICO_ATTENTION_AVX512)
    if (avx512) return dot_in_double_avx512(a, b, n);
#else
    (void)avx512;
#endif
    int64_t i = 0;
#if defined(__SSE2__)
    // The same partial sums as below, two per register: (s0, s1) (s2, s3) (s4, s5) (s6, s7).
    __m128d s01 = _mm_setzero_pd(), s23 = _mm_setzero_pd(), s45 = _mm_setzero_pd(), s67 = _mm_setzero_pd();
    for (; i + 8 <= n; i += 8) {
      const __m128 p0 = _mm_mul_ps(_mm_loadu_ps(a + i), _mm_loadu_ps(b + i));
      const __m128 p1 = _mm_mul_ps(_mm_loadu_ps(a + i + 4), _mm_loadu_ps(b + i + 4));
      s01 = _mm_add_pd(s01, _mm_cvtps_pd(p0));
      s23 = _mm_add_pd(s23, _mm_cvtps_pd(_mm_movehl_ps(p0, p0)));
      s45 = _mm_add_pd(s45, _mm_cvtps_pd(p1));
      s67 = _mm_add_pd(s67, _mm_cvtps_pd(_mm_movehl_ps(p1, p1)));
    }
    double s[8];
    _mm_storeu_pd(s, s01);
    _mm_storeu_pd(s + 2, s23);
    _mm_storeu_pd(s + 4, s45);
    _mm_storeu_pd(s + 6, s67);
#else
    double s[8] = {};
    for (; i + 8 <= n; i += 8) {
      for (int j = 0; j < 8; ++j) s[j] += static_cast<double>(a[i + j] * b[i + j]);
    }
#endif
    for (; i < n; ++i) s[0] += static_cast<double>(a[i] * b[i]);
    return static_cast<float>(((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7])));
  }

  // out[i] = fp16_to_fp32(fp32_to_fp16(in[i] * factor)); in may be out.
  // Head `head` of K (or V) row `pos` as floats: state::read_k/read_v, with F16 rows
  // converted by the AVX-512 code at that level.
  static void read_head(const state::KvLayerView& kv, bool value, int64_t pos, int64_t head, float* out,
                        bool avx512) {
#if defined(PICO_ATTENTION_AVX512)
    const GgmlType type = value ? kv.v_type : kv.k_type;
    if (avx512 && type == GgmlType::F16) {
      const int64_t dim = value ? kv.head_dim_v : kv.head_dim_k;
      const uint8_t* row = value ? kv.v_row(pos) : kv.k_row(pos);
      f16_to_f32_avx512(row + head * dim * 2, dim, out);
      return;
    }
#else
    (void)avx512;
#endif
    if (value) {
      state::read_v(kv, pos, head, out);
    } else {
      state::read_k(kv, pos, head, out);
    }
  }

  // y[i] = exp(x[i] - max x) (y may be x); returns their sum in double, added up as
  // ggml's soft_max does before its one scale.
  static double exponentiate_from_max(const float* x, int64_t n, float* y) {
    float max = -INFINITY;
    for (int64_t i = 0; i < n; ++i) max = std::max(max, x[i]);
    return cpu::active_kernels().exp_row(x, n, max, y);
  }

  static void scale_round_f16(const float* in, float factor, int64_t n, float* out, bool avx512) {
#if defined(PICO_ATTENTION_AVX512)
    if (avx512) {
      scale_round_f16_avx512(in, factor, n, out);
      return;
    }
#else
    (void)avx512;
#endif
    for (int64_t i = 0; i < n; ++i) out[i] = fp16_to_fp32(fp32_to_fp16(in[i] * factor));
  }

  // out[i] = sum over j in order of weights[j] * values[j * n + i], from 0: sixteen
  // outputs at a time held in registers over all j (the same operations per output as
  // a loop over j outside).
  static void weighted_sum(const float* weights, const float* values, int64_t count, int64_t n, float* out,
                           bool avx512) {
#if defined(PICO_ATTENTION_AVX512)
    if (avx512) {
      weighted_sum_avx512(weights, values, count, n, out);
      return;
    }
#else
    (void)avx512;
#endif
    constexpr int64_t kWidth = 16;
    int64_t i0 = 0;
    for (; i0 + kWidth <= n; i0 += kWidth) {
#if defined(__SSE2__)
      __m128 sum[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()};
      for (int64_t j = 0; j < count; ++j) {
        const float* v = values + j * n + i0;
        const __m128 weight = _mm_set1_ps(weights[j]);
        for (int q = 0; q < 4; ++q) sum[q] = _mm_add_ps(sum[q], _mm_mul_ps(weight, _mm_loadu_ps(v + 4 * q)));
      }
      for (int q = 0; q < 4; ++q) _mm_storeu_ps(out + i0 + 4 * q, sum[q]);
#else
      float sum[kWidth] = {};
      for (int64_t j = 0; j < count; ++j) {
        const float* v = values + j * n + i0;
        for (int64_t i = 0; i < kWidth; ++i) sum[i] = sum[i] + weights[j] * v[i];
      }
      std::memcpy(out + i0, sum, sizeof(sum));
#endif
    }
    for (; i0 < n; ++i0) {
      float sum = 0.0f;
      for (int64_t j = 0; j < count; ++j) sum = sum + weights[j] * values[j * n + i0];
      out[i0] = sum;
    }
  }

  // attention_sums.hpp's orders, the batched one with vectors where the level has them.
  static float dot_ordered(const float* a, const float* b, int64_t n, const SumOrder& order, cpu::CpuLevel level) {
#if defined(PICO_ATTENTION_AVX512)
    if (order.accumulators == 1 && n % order.lanes == 0) {
      if (level == cpu::CpuLevel::avx512 && order.lanes == 16) return dot_batched_avx512(a, b, n);
      if (level == cpu::CpuLevel::avx2 && order.lanes == 8) return dot_batched_avx2(a, b, n);
    }
#else
    (void)level;
#endif
    return dot_in_order(a, b, n, order);
  }

  static void weighted_sum_ordered(const float* weights, const float* values, int64_t count, int64_t n, int64_t first,
                                   const SumOrder& order, cpu::CpuLevel level, float* out) {
#if defined(PICO_ATTENTION_AVX512)
    const bool avx512 = level == cpu::CpuLevel::avx512 && order.lanes == 16;
    const bool avx2 = level == cpu::CpuLevel::avx2 && order.lanes == 8;
    if (order.accumulators == 1 && n % order.lanes == 0 && (avx512 || avx2)) {
      thread_local std::vector<float> sums;
      sums.resize(static_cast<size_t>(order.lanes * n));
      if (avx512) {
        weighted_sum_batched_avx512(weights, values, count, n, first, sums.data(), out);
      } else {
        weighted_sum_batched_avx2(weights, values, count, n, first, sums.data(), out);
      }
      return;
    }
#else
    (void)level;
#endif
    weighted_sum_in_order(weights, values, count, n, first, order, out);
  }

  // One KV head for queries [first_query, first_query + block.size()), all reading the
  // same cache.
  static void attend_block(const float* q, int64_t q_row_stride, std::span<const AttentionQuery> block,
                           int64_t first_query, int64_t kvh, const AttentionParams& p, bool avx512,
                           bool one_token_order, float* out) {
    const int64_t group = p.n_head / p.n_head_kv;
    const int64_t dk = p.head_dim_k, dv = p.head_dim_v;
    const state::KvLayerView& kv = block.front().kv;
    // An F16 cache is multiplied in llama.cpp's order (attention_sums.hpp): its batched
    // one for every batch, or, as llama.cpp, its one-token order when the batch is one
    // token (BatchNumerics::as_llama_cpp). Its AVX2 build sums in 8 lanes, the others
    // (AVX-512) in 16.
    const cpu::CpuLevel level = cpu::cpu_level();
    const int64_t lanes = level == cpu::CpuLevel::avx2 ? 8 : 16;
    const SumOrder batched{lanes, 1, false}, one_token{lanes, 4, lanes == 8};
    const SumOrder& order = one_token_order ? one_token : batched;
    // llama.cpp's batched path needs whole vectors of K; it takes the one-token path else.
    const SumOrder& k_order = dk % lanes == 0 ? order : one_token;
    const bool k_in_order = kv.k_type == GgmlType::F16, v_in_order = kv.v_type == GgmlType::F16;
    // Keys any query of the block sees.
    int64_t keys_begin = INT64_MAX, keys_end = 0;
    for (const AttentionQuery& query : block) {
      const int64_t last = std::min<int64_t>(query.pos, kv.n_pos - 1);
      const int64_t first = p.window > 0 ? std::max<int64_t>(0, query.pos - p.window + 1) : 0;
      if (first <= last) {
        keys_begin = std::min(keys_begin, first);
        keys_end = std::max(keys_end, last + 1);
      }
    }
    thread_local std::vector<float> scores, keys, values, qbuf;
    const int64_t n_cached = std::max<int64_t>(0, keys_end - keys_begin);
    keys.resize(static_cast<size_t>(std::max<int64_t>(n_cached, 1) * dk));
    values.resize(static_cast<size_t>(std::max<int64_t>(n_cached, 1) * dv));
    for (int64_t j = 0; j < n_cached; ++j) {
      read_head(kv, false, keys_begin + j, kvh, keys.data() + j * dk, avx512);
      read_head(kv, true, keys_begin + j, kvh, values.data() + j * dv, avx512);
    }
    qbuf.resize(static_cast<size_t>(group * dk));
    for (size_t b = 0; b < block.size(); ++b) {
      const AttentionQuery& query = block[b];
      const int64_t t = first_query + static_cast<int64_t>(b);
      const int64_t last = std::min<int64_t>(query.pos, kv.n_pos - 1);
      const int64_t first = p.window > 0 ? std::max<int64_t>(0, query.pos - p.window + 1) : 0;
      const int64_t n_keys = std::max<int64_t>(0, last - first + 1);
      // llama.cpp's softmax row starts at KV cell 0 (cell = position here) and its vector
      // e^x sums 16 lanes at a time: the row below starts `lead` masked (-inf) cells
      // before `first` and is padded with masked cells to whole vectors, so that the
      // sums group as llama.cpp's.
      const int64_t lead = n_keys > 0 ? first % kSoftmaxVector : 0;
      const int64_t row = n_keys > 0 ? (lead + n_keys + kSoftmaxVector - 1) / kSoftmaxVector * kSoftmaxVector : 0;
      scores.assign(static_cast<size_t>(group * std::max<int64_t>(row, 1)), -INFINITY);
      // Q as the K dot sees it: llama.cpp converts Q to F16 for an F16 K.
      for (int64_t g = 0; g < group; ++g) {
        const float* qh = q + t * q_row_stride + (kvh * group + g) * dk;
        float* qg = qbuf.data() + g * dk;
        if (kv.k_type != GgmlType::F16) {
          std::memcpy(qg, qh, static_cast<size_t>(dk) * 4);
        } else {
          scale_round_f16(qh, 1.0f, dk, qg, avx512);  // x * 1 is x: only the rounding
        }
      }
      for (int64_t j = 0; j < n_keys; ++j) {
        const float* key = keys.data() + (first + j - keys_begin) * dk;
        for (int64_t g = 0; g < group; ++g) {
          float s = (k_in_order ? dot_ordered(qbuf.data() + g * dk, key, dk, k_order, level)
                                : dot_in_double(qbuf.data() + g * dk, key, dk, avx512)) *
                    p.scale;
          if (p.softcap > 0.0f) s = p.softcap * std::tanh(s / p.softcap);
          scores[static_cast<size_t>(g * row + lead + j)] = s;
        }
      }
      // Softmax per head (max, exp, sum in double, one scale), as ggml's soft_max.
      for (int64_t g = 0; g < group; ++g) {
        const double sum = exponentiate_from_max(scores.data() + g * row, row, scores.data() + g * row);
        float* sg = scores.data() + g * row + lead;
        const float inv = n_keys > 0 ? static_cast<float>(1.0 / sum) : 0.0f;
        if (kv.v_type == GgmlType::F16) {
          // llama.cpp multiplies F16 V by the probabilities converted to F16.
          scale_round_f16(sg, inv, n_keys, sg, avx512);
        } else {
          for (int64_t j = 0; j < n_keys; ++j) sg[j] = sg[j] * inv;
        }
      }
      const float* v_first = values.data() + (first - keys_begin) * dv;
      for (int64_t g = 0; g < group; ++g) {
        float* out_head = out + t * p.n_head * dv + (kvh * group + g) * dv;
        if (v_in_order) {
          weighted_sum_ordered(scores.data() + g * row + lead, v_first, n_keys, dv, first, order, level, out_head);
          continue;
        }
        weighted_sum(scores.data() + g * row + lead, v_first, n_keys, dv, out_head,
                     avx512);
      }
    }
  }

  struct AlignedDelete {
    void operator()(uint8_t* p) const { ::operator delete[](p, std::align_val_t{Arena::kAlignment}); }
  };

  BatchNumerics numerics_;
  cpu::ThreadPool pool_;
  std::vector<uint8_t> scratch_;
  Arena arena_;
  std::vector<std::unique_ptr<uint8_t[], AlignedDelete>> chunks_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads, BatchNumerics numerics) {
  return std::make_unique<CpuBackend>(threads, numerics);
}

}  // namespace pico::backend
