// The CPU backend's ops against straightforward float references.
#include "backend/backend.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/attention_sums.hpp"
#include "cpu/cpu_features.hpp"
#include "cpu/kernels.hpp"
#include "quant/float_convert.hpp"

namespace pico::backend {
namespace {

std::vector<float> wave(size_t n, float a, float b = 0.0f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::sin(a * static_cast<float>(i) + b) * 1.5f;
  return v;
}

TEST(CpuBackend, RmsNormAndLayerNorm) {
  auto be = make_cpu_backend(2);
  const int64_t n = 48, rows = 3;
  const auto x = wave(static_cast<size_t>(n * rows), 0.7f), w = wave(static_cast<size_t>(n), 0.3f, 1.0f);
  std::vector<float> y(x.size()), z(x.size());
  be->rms_norm(x.data(), w.data(), n, rows, 1e-5f, y.data());
  be->layer_norm(x.data(), w.data(), w.data(), n, rows, 1e-5f, z.data());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0, s = 0;
    for (int64_t i = 0; i < n; ++i) {
      ss += x[static_cast<size_t>(r * n + i)] * x[static_cast<size_t>(r * n + i)];
      s += x[static_cast<size_t>(r * n + i)];
    }
    const double mean = s / n;
    double var = 0;
    for (int64_t i = 0; i < n; ++i) var += std::pow(x[static_cast<size_t>(r * n + i)] - mean, 2);
    var /= n;
    for (int64_t i = 0; i < n; ++i) {
      const size_t k = static_cast<size_t>(r * n + i);
      EXPECT_NEAR(y[k], x[k] / std::sqrt(ss / n + 1e-5) * w[static_cast<size_t>(i)], 1e-5);
      EXPECT_NEAR(z[k], (x[k] - mean) / std::sqrt(var + 1e-5) * w[static_cast<size_t>(i)] + w[static_cast<size_t>(i)], 1e-5);
    }
  }
}

TEST(CpuBackend, RopeNormalAndNeox) {
  auto be = make_cpu_backend(1);
  const int64_t d = 16, heads = 2;
  for (bool neox : {false, true}) {
    auto x = wave(static_cast<size_t>(heads * d), 0.9f);
    const auto orig = x;
    const int32_t pos = 7;
    RopeParams p;
    p.n_dims = 16;
    p.neox = neox;
    p.freq_base = 10000.0f;
    be->rope(x.data(), 1, heads * d, heads, d, &pos, p);
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < d / 2; ++i) {
        const double theta = pos * std::pow(10000.0, -2.0 * static_cast<double>(i) / d);
        const int64_t a = neox ? i : 2 * i, b = neox ? i + d / 2 : 2 * i + 1;
        const double x0 = orig[static_cast<size_t>(h * d + a)], x1 = orig[static_cast<size_t>(h * d + b)];
        EXPECT_NEAR(x[static_cast<size_t>(h * d + a)], x0 * std::cos(theta) - x1 * std::sin(theta), 1e-4);
        EXPECT_NEAR(x[static_cast<size_t>(h * d + b)], x0 * std::sin(theta) + x1 * std::cos(theta), 1e-4);
      }
    }
  }
}

TEST(CpuBackend, SoftmaxGeluSilu) {
  auto be = make_cpu_backend(1);
  auto x = wave(10, 1.1f);
  const auto orig = x;
  be->softmax(x.data(), 10, 1);
  double sum = 0;
  for (float v : orig) sum += std::exp(v);
  for (size_t i = 0; i < 10; ++i) EXPECT_NEAR(x[i], std::exp(orig[i]) / sum, 1e-6);
  std::vector<float> g(10), s(10), e(10);
  be->gelu(orig.data(), 10, g.data());
  be->silu(orig.data(), 10, 1, s.data());
  be->gelu_erf(orig.data(), 10, e.data());
  for (size_t i = 0; i < 10; ++i) {
    const double v = orig[i];
    EXPECT_NEAR(g[i], 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))), 2e-3);  // via F16
    EXPECT_NEAR(e[i], 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))), 1e-6);
    EXPECT_NEAR(s[i], v / (1 + std::exp(-v)), 1e-6);
  }
}

// Attention over an F32 cache against a direct softmax(q k^T) v, with GQA and a window.
TEST(CpuBackend, AttentionMatchesReference) {
  auto be = make_cpu_backend(2);
  state::KvConfig c;
  c.last_layer = 1;
  c.n_kv_heads = 2;
  c.head_dim_k = 8;
  c.head_dim_v = 8;
  c.k_type = c.v_type = GgmlType::F32;
  state::KvState kv(c);
  const int64_t n_pos = 6, n_head = 4;
  for (int64_t p = 0; p < n_pos; ++p) {
    kv.write(0, p, wave(16, 0.5f, static_cast<float>(p)).data(), wave(16, 0.8f, static_cast<float>(-p)).data());
  }
  const auto q = wave(static_cast<size_t>(2 * n_head * 8), 0.31f);
  for (int32_t window : {0, 3}) {
    std::vector<AttentionQuery> queries = {{4, kv.layer(0)}, {5, kv.layer(0)}};
    AttentionParams p{n_head, 2, 8, 8, 0.35f, window, 0.0f};
    std::vector<float> out(static_cast<size_t>(2 * n_head * 8));
    be->attention(q.data(), n_head * 8, queries, p, out.data());
    for (int64_t t = 0; t < 2; ++t) {
      const int64_t pos = queries[static_cast<size_t>(t)].pos;
      for (int64_t h = 0; h < n_head; ++h) {
        const int64_t kvh = h / 2;
        std::vector<double> w;
        const int64_t first = window ? pos - window + 1 : 0;
        for (int64_t j = first; j <= pos; ++j) {
          const auto k = wave(16, 0.5f, static_cast<float>(j));
          double dot = 0;
          for (int64_t i = 0; i < 8; ++i) dot += q[static_cast<size_t>(t * n_head * 8 + h * 8 + i)] * k[static_cast<size_t>(kvh * 8 + i)];
          w.push_back(std::exp(dot * 0.35));
        }
        double sum = 0;
        for (double v : w) sum += v;
        for (int64_t i = 0; i < 8; ++i) {
          double want = 0;
          for (int64_t j = first; j <= pos; ++j) {
            want += w[static_cast<size_t>(j - first)] / sum * wave(16, 0.8f, static_cast<float>(-j))[static_cast<size_t>(kvh * 8 + i)];
          }
          EXPECT_NEAR(out[static_cast<size_t>(t * n_head * 8 + h * 8 + i)], want, 1e-5) << "window " << window;
        }
      }
    }
  }
}

// A prompt's queries (computed in blocks sharing the dequantized K and V) against
// each query alone, at every CPU level (SIMD paths for the dot products, the
// weighted sums of V and the F16 rounding): the same bytes everywhere.
// At each CPU level, a query's output does not depend on the batch it comes in; the
// levels differ only by their e^x (each level's as llama.cpp's build for it), so by
// far less than the F16 rounding of the probabilities.
TEST(CpuBackend, AttentionIsTheSameForAnyBatchAtEveryCpuLevel) {
  auto be = make_cpu_backend(2);
  for (GgmlType type : {GgmlType::F16, GgmlType::F32}) {
    for (int32_t window : {0, 7}) {
      state::KvConfig c;
      c.last_layer = 1;
      c.n_kv_heads = 2;
      c.head_dim_k = 72;  // 64-, 16- and 8-wide groups plus a rest
      c.head_dim_v = 88;
      c.k_type = c.v_type = type;
      state::KvState kv(c);
      const int64_t n_pos = 40, n_head = 8;
      for (int64_t p = 0; p < n_pos; ++p) {
        kv.write(0, p, wave(2 * 72, 0.37f, static_cast<float>(p)).data(), wave(2 * 88, 0.73f, static_cast<float>(-p)).data());
      }
      const auto q = wave(static_cast<size_t>(n_pos * n_head * 72), 0.11f);
      std::vector<AttentionQuery> queries;
      for (int32_t p = 0; p < n_pos; ++p) queries.push_back({p, kv.layer(0)});
      const AttentionParams params{n_head, 2, 72, 88, 0.12f, window, 0.0f};
      const auto row = static_cast<size_t>(n_head * 88);
      std::vector<float> scalar(static_cast<size_t>(n_pos) * row);
      cpu::set_cpu_level(cpu::CpuLevel::scalar);
      be->attention(q.data(), n_head * 72, queries, params, scalar.data());
      for (cpu::CpuLevel level : cpu::supported_levels()) {
        cpu::set_cpu_level(level);
        std::vector<float> batch(scalar.size()), alone(scalar.size());
        be->attention(q.data(), n_head * 72, queries, params, batch.data());
        for (int64_t t = 0; t < n_pos; ++t) {
          be->attention(q.data() + t * n_head * 72, n_head * 72, std::span(queries).subspan(static_cast<size_t>(t), 1),
                        params, alone.data() + static_cast<size_t>(t) * row);
        }
        const std::string where = std::string(cpu::level_name(level)) + " window " + std::to_string(window);
        EXPECT_EQ(std::memcmp(alone.data(), batch.data(), batch.size() * 4), 0) << where;
        for (size_t i = 0; i < batch.size(); ++i) ASSERT_NEAR(batch[i], scalar[i], 2e-3f * (1.0f + std::fabs(scalar[i]))) << where;
      }
      cpu::set_cpu_level(cpu::best_level());
    }
  }
}

// attention_sums.hpp against ggml's operations written out as its code does them
// (tinyBLAS: one accumulator vector over the k loop, then its horizontal sum;
// ggml_vec_dot_f16: 4 accumulator vectors, GGML_F32x16/x8_REDUCE, leftovers in double),
// on products of F16 values spread over many magnitudes.
float ggml_like_hsum(std::vector<float> v, bool avx2_one_token) {
  // _mm512_reduce_add_ps / tinyBLAS hsum: halves, then (0+2)+(1+3); GGML_F32x8_REDUCE's
  // two _mm_hadd_ps: (0+1)+(2+3).
  size_t n = v.size();
  while (n > 4) {
    n /= 2;
    for (size_t l = 0; l < n; ++l) v[l] = v[l] + v[l + n];
  }
  return avx2_one_token ? (v[0] + v[1]) + (v[2] + v[3]) : (v[0] + v[2]) + (v[1] + v[3]);
}

float ggml_like_batched_dot(const std::vector<float>& a, const std::vector<float>& b, size_t lanes) {
  std::vector<float> acc(lanes, 0.0f);
  for (size_t i = 0; i < a.size(); i += lanes)
    for (size_t l = 0; l < lanes; ++l) acc[l] = std::fma(a[i + l], b[i + l], acc[l]);
  return ggml_like_hsum(acc, false);
}

float ggml_like_one_token_dot(const std::vector<float>& a, const std::vector<float>& b, size_t lanes) {
  std::vector<std::vector<float>> sum(4, std::vector<float>(lanes, 0.0f));
  const size_t step = 4 * lanes, np = a.size() - a.size() % step;
  for (size_t i = 0; i < np; i += step)
    for (size_t j = 0; j < 4; ++j)
      for (size_t l = 0; l < lanes; ++l) sum[j][l] = std::fma(a[i + j * lanes + l], b[i + j * lanes + l], sum[j][l]);
  for (size_t l = 0; l < lanes; ++l) sum[0][l] = sum[0][l] + sum[2][l], sum[1][l] = sum[1][l] + sum[3][l];
  for (size_t l = 0; l < lanes; ++l) sum[0][l] = sum[0][l] + sum[1][l];
  double total = ggml_like_hsum(sum[0], lanes == 8);
  for (size_t i = np; i < a.size(); ++i) total += static_cast<double>(a[i] * b[i]);
  return static_cast<float>(total);
}

std::vector<float> f16_values(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t x = seed;
  for (float& f : v) {
    x = x * 1664525u + 1013904223u;
    const float mantissa = static_cast<float>(x >> 8) / 16777216.0f - 0.5f;
    f = fp16_to_fp32(fp32_to_fp16(std::ldexp(mantissa, static_cast<int>((x >> 3) % 16) - 8)));
  }
  return v;
}

TEST(AttentionSums, DotsAreGgmlsBatchedAndOneTokenOrders) {
  int orders_differ = 0;
  for (int64_t lanes : {16, 8}) {
    const SumOrder batched{lanes, 1, false}, one_token{lanes, 4, lanes == 8};
    for (size_t n : {64u, 128u, 80u, 256u}) {
      for (uint32_t seed = 1; seed <= 20; ++seed) {
        const auto a = f16_values(n, seed), b = f16_values(n, seed + 100);
        const float got_one = dot_in_order(a.data(), b.data(), static_cast<int64_t>(n), one_token);
        EXPECT_EQ(got_one, ggml_like_one_token_dot(a, b, static_cast<size_t>(lanes))) << lanes << " lanes, n " << n;
        if (n % static_cast<size_t>(lanes) == 0) {
          const float got_batched = dot_in_order(a.data(), b.data(), static_cast<int64_t>(n), batched);
          EXPECT_EQ(got_batched, ggml_like_batched_dot(a, b, static_cast<size_t>(lanes))) << lanes << " lanes, n " << n;
          orders_differ += got_batched != got_one;
        }
      }
    }
  }
  EXPECT_GT(orders_differ, 0) << "the inputs do not tell the two orders apart";
}

TEST(AttentionSums, WeightedSumsCountLanesFromKvCellZero) {
  // Outputs of n = 3 values over keys at cells first .. first + count - 1: the same as
  // a dot over the whole padded row whose other cells weigh 0.
  for (int64_t lanes : {16, 8}) {
    for (const SumOrder& order : {SumOrder{lanes, 1, false}, SumOrder{lanes, 4, lanes == 8}}) {
      const int64_t first = 5, count = 150, n = 3, padded = 256;
      const auto weights = f16_values(static_cast<size_t>(count), 7), values = f16_values(static_cast<size_t>(count * n), 9);
      std::vector<float> out(static_cast<size_t>(n));
      weighted_sum_in_order(weights.data(), values.data(), count, n, first, order, out.data());
      for (int64_t i = 0; i < n; ++i) {
        std::vector<float> w(static_cast<size_t>(padded), 0.0f), v(static_cast<size_t>(padded), 0.0f);
        for (int64_t j = 0; j < count; ++j) {
          w[static_cast<size_t>(first + j)] = weights[static_cast<size_t>(j)];
          v[static_cast<size_t>(first + j)] = values[static_cast<size_t>(j * n + i)];
        }
        const float want = order.accumulators == 1 ? ggml_like_batched_dot(w, v, static_cast<size_t>(lanes))
                                                   : ggml_like_one_token_dot(w, v, static_cast<size_t>(lanes));
        EXPECT_EQ(out[static_cast<size_t>(i)], want) << lanes << " lanes, accumulators " << order.accumulators;
      }
    }
  }
}

TEST(CpuBackend, MatmulManyEqualsMatmul) {
  auto be = make_cpu_backend(2);
  const auto w1 = wave(64 * 5, 0.13f), w2 = wave(64 * 3, 0.29f), x = wave(64 * 4, 0.41f);
  const Weight ws[2] = {{GgmlType::F32, w1.data(), 64, 5}, {GgmlType::F32, w2.data(), 64, 3}};
  std::vector<float> a(20), b(12), a2(20), b2(12);
  float* const ys[2] = {a.data(), b.data()};
  be->matmul_many(ws, x.data(), 4, ys);
  be->matmul(ws[0], x.data(), 4, a2.data());
  be->matmul(ws[1], x.data(), 4, b2.data());
  EXPECT_EQ(a, a2);
  EXPECT_EQ(b, b2);
  EXPECT_TRUE(be->supports(Op::matmul, GgmlType::Q4_K));
}

// llama.cpp's F32 matrix times activations: llamafile's sgemm for two tokens or more
// when the rows come in multiples of 4 and the width in whole vectors, else
// ggml_vec_dot_f32 per row. pico goes by rows where sgemm would not run (the same for
// every batch, so a token's result never depends on it) and, with as_llama_cpp, for one
// token as well.
TEST(CpuBackend, F32MatmulGoesByRowsWhereLlamaCppDoes) {
  for (cpu::CpuLevel level : cpu::supported_levels()) {
    cpu::set_cpu_level(level);
    const cpu::DotF32Fn dot = cpu::active_kernels().dot_f32_as_ggml;
    auto invariant = make_cpu_backend(2);
    auto as_llama = make_cpu_backend(2, BatchNumerics::as_llama_cpp);
    const int64_t cols = 256, tokens = 5;
    const auto x = wave(static_cast<size_t>(cols * tokens), 0.41f);
    for (int64_t rows : {1, 6, 8}) {
      const auto w = wave(static_cast<size_t>(cols * rows), 0.13f, static_cast<float>(rows));
      const Weight weight{GgmlType::F32, w.data(), cols, rows};
      std::vector<float> batch(static_cast<size_t>(rows * tokens)), one(static_cast<size_t>(rows));
      invariant->matmul(weight, x.data(), tokens, batch.data());
      for (int64_t t = 0; t < tokens; ++t) {
        invariant->matmul(weight, x.data() + t * cols, 1, one.data());
        for (int64_t r = 0; r < rows; ++r) {
          const float by_row = dot(cols, w.data() + r * cols, x.data() + t * cols);
          // Invariant numerics: a token alone is the token in its batch, by rows or not.
          EXPECT_EQ(one[static_cast<size_t>(r)], batch[static_cast<size_t>(t * rows + r)]) << rows << " rows";
          if (rows % 4 != 0) {
            EXPECT_EQ(batch[static_cast<size_t>(t * rows + r)], by_row) << rows << " rows";
          }
        }
        as_llama->matmul(weight, x.data() + t * cols, 1, one.data());
        for (int64_t r = 0; r < rows; ++r) {
          EXPECT_EQ(one[static_cast<size_t>(r)], dot(cols, w.data() + r * cols, x.data() + t * cols)) << rows << " rows";
        }
      }
    }
  }
  cpu::set_cpu_level(cpu::supported_levels().back());
}

}  // namespace
}  // namespace pico::backend
