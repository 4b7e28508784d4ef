// The linear-attention kernels (delta rule step, causal conv row) of every level the
// host runs: bit for bit against a scalar model of the level's float order (ggml's
// ggml_vec_dot_f32 at that vector width, the compiled ssm_conv), and within the
// matmul NMSE bound of the scalar level (llama.cpp's non-SIMD order, sums in double).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/cpu_features.hpp"
#include "cpu/kernels.hpp"
#include "cpu/test_support.hpp"

namespace pico::cpu {
namespace {

// ggml_vec_dot_f32 with `lanes`-wide vectors: 4 accumulators over steps of 4 vectors,
// fused; reduced (0+2, 1+3, then those), then lanes as the level's reduction tree,
// then the leftovers: a vector (then a half vector) of rounded products at a time,
// each added in lane order, the rest fused.
float model_dot(int64_t n, const float* x, const float* y, int lanes) {
  const int64_t step = 4 * lanes, steps = n / step * step;
  std::vector<float> acc(static_cast<size_t>(step), 0.0f);
  for (int64_t i = 0; i < steps; i += step) {
    for (int64_t l = 0; l < step; ++l) acc[l] = std::fma(x[i + l], y[i + l], acc[l]);
  }
  std::vector<float> v(static_cast<size_t>(lanes));
  for (int l = 0; l < lanes; ++l) v[l] = (acc[l] + acc[2 * lanes + l]) + (acc[lanes + l] + acc[3 * lanes + l]);
  float sum;
  if (lanes == 16) {  // halves (8, then 4), then (0+2, 1+3), then their sum
    for (int l = 0; l < 8; ++l) v[l] += v[l + 8];
    for (int l = 0; l < 4; ++l) v[l] += v[l + 4];
    sum = (v[0] + v[2]) + (v[1] + v[3]);
  } else {  // halves, then two horizontal adds: (0+1) + (2+3)
    for (int l = 0; l < 4; ++l) v[l] += v[l + 4];
    sum = (v[0] + v[1]) + (v[2] + v[3]);
  }
  int64_t i = steps;
  for (; i + lanes <= n; i += lanes) {
    for (int l = 0; l < lanes; ++l) sum += x[i + l] * y[i + l];
  }
  if (i + lanes / 2 <= n) {
    for (int l = 0; l < lanes / 2; ++l) sum += x[i + l] * y[i + l];
    i += lanes / 2;
  }
  for (; i < n; ++i) sum = std::fma(x[i], y[i], sum);
  return sum;
}

void model_step(int64_t d, float* state, const float* q, const float* k, const float* v, float decay, float beta,
                float scale, float* out, int lanes) {
  for (int64_t j = 0; j < d; ++j) {
    float* row = state + j * d;
    for (int64_t i = 0; i < d; ++i) row[i] *= decay;
    const float u = (v[j] - model_dot(d, row, k, lanes)) * beta;
    for (int64_t i = 0; i < d; ++i) row[i] = std::fma(k[i], u, row[i]);
    out[j] = model_dot(d, row, q, lanes) * scale;
  }
}

int lanes_of(CpuLevel level) { return level == CpuLevel::avx512 ? 16 : level == CpuLevel::avx2 ? 8 : 0; }

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Runs `tokens` steps of one head from a zero state; returns every output and the state.
template <class Step>
std::vector<float> run_steps(Step&& step, int64_t d, int tokens, std::vector<float>& state) {
  state.assign(static_cast<size_t>(d * d), 0.0f);
  std::vector<float> outputs;
  for (int t = 0; t < tokens; ++t) {
    const auto q = test::random_floats(static_cast<size_t>(d), 100 + t, 0.1f);
    const auto k = test::random_floats(static_cast<size_t>(d), 200 + t, 0.1f);
    const auto v = test::random_floats(static_cast<size_t>(d), 300 + t);
    const float decay = std::exp(-0.05f * static_cast<float>(t % 7)), beta = 0.2f + 0.1f * static_cast<float>(t % 5);
    std::vector<float> out(static_cast<size_t>(d));
    step(d, state.data(), q.data(), k.data(), v.data(), decay, beta, 1.0f / std::sqrt(static_cast<float>(d)),
         out.data());
    outputs.insert(outputs.end(), out.begin(), out.end());
  }
  return outputs;
}

TEST(DeltaRuleStep, EveryLevelFollowsItsOrderModelBitForBit) {
  for (CpuLevel level : supported_levels()) {
    const int lanes = lanes_of(level);
    if (lanes == 0) continue;  // scalar and ARM levels: the scalar code (checked below)
    for (int64_t d : {128, 64, 37, 16, 8, 3}) {
      std::vector<float> state, model_state;
      const auto got = run_steps(kernels_for(level).delta_rule_step, d, 9, state);
      const auto want = run_steps(
          [lanes](int64_t dd, float* s, const float* q, const float* k, const float* v, float decay, float beta,
                  float scale, float* out) { model_step(dd, s, q, k, v, decay, beta, scale, out, lanes); },
          d, 9, model_state);
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
          << level_name(level) << " d " << d << ": outputs differ from the order model";
      EXPECT_EQ(0, std::memcmp(state.data(), model_state.data(), state.size() * sizeof(float)))
          << level_name(level) << " d " << d << ": state differs from the order model";
    }
  }
}

TEST(DeltaRuleStep, EveryLevelIsCloseToTheScalarReference) {
  const KernelTable& scalar = kernels_for(CpuLevel::scalar);
  for (CpuLevel level : supported_levels()) {
    for (int64_t d : {128, 37}) {
      std::vector<float> s_ref, s_got;
      const auto want = run_steps(scalar.delta_rule_step, d, 12, s_ref);
      const auto got = run_steps(kernels_for(level).delta_rule_step, d, 12, s_got);
      EXPECT_LE(test::nmse(widen(want), widen(got)), 5e-4) << level_name(level) << " d " << d;
      EXPECT_LE(test::nmse(widen(s_ref), widen(s_got)), 5e-4) << level_name(level) << " d " << d;
    }
  }
}

TEST(DeltaRuleStep, ScalarReferenceIsTheDeltaRule) {
  // One step from a known state, written out: S *= decay; u = beta (v - S^T k);
  // S += k u^T; out = S^T q * scale, with d = 2 and row j = column j of S.
  float state[4] = {1, 2, 3, 4};  // S = [[1, 3], [2, 4]]
  const float q[2] = {1, -1}, k[2] = {0.5f, 0.25f}, v[2] = {1, 2};
  float out[2];
  kernels_for(CpuLevel::scalar).delta_rule_step(2, state, q, k, v, 0.5f, 2.0f, 0.5f, out);
  // decayed rows: (0.5, 1), (1.5, 2); S^T k: 0.5, 1.25; u = 2 (1 - 0.5, 2 - 1.25) = (1, 1.5)
  // rows += k u: (1, 1.25), (2.25, 2.375); out = 0.5 (1 - 1.25, 2.25 - 2.375)
  EXPECT_FLOAT_EQ(state[0], 1.0f);
  EXPECT_FLOAT_EQ(state[1], 1.25f);
  EXPECT_FLOAT_EQ(state[2], 2.25f);
  EXPECT_FLOAT_EQ(state[3], 2.375f);
  EXPECT_FLOAT_EQ(out[0], -0.125f);
  EXPECT_FLOAT_EQ(out[1], -0.0625f);
}

TEST(ConvRow, EveryLevelFollowsTheCompiledOrder) {
  for (int64_t taps : {4, 2, 1, 5, 7, 8, 11, 13, 16}) {
    const int64_t channels = 45, stride = 50;
    const auto window = test::random_floats(static_cast<size_t>(taps * stride), 7);
    const auto weights = test::random_floats(static_cast<size_t>(taps * stride), 8);
    for (CpuLevel level : supported_levels()) {
      std::vector<float> got(static_cast<size_t>(channels));
      kernels_for(level).conv_row(channels, taps, window.data(), weights.data(), stride, got.data());
      // Rounded products up to a multiple of 8 taps (AVX-512) or 4 (AVX2), then fused.
      const int64_t rounded = level == CpuLevel::avx512 ? taps / 8 * 8 : level == CpuLevel::avx2 ? taps / 4 * 4 : taps;
      for (int64_t c = 0; c < channels; ++c) {
        float want = 0.0f;
        for (int64_t i = 0; i < taps; ++i) {
          const float x = window[i * stride + c], w = weights[i * stride + c];
          want = i < rounded ? want + x * w : std::fma(x, w, want);
        }
        ASSERT_EQ(got[c], want) << level_name(level) << " taps " << taps << " channel " << c;
      }
    }
  }
}

}  // namespace
}  // namespace pico::cpu
