// The CPU backend's mixture-of-experts ops against plain loops: routing (softmax,
// top-k, renormalisation) and the experts' FFNs for every weight type the dense path
// has; a token's result does not depend on its batch; experts nobody chose are never
// read (their pages are made inaccessible).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "quant/quantize.hpp"

namespace pico::backend {
namespace {

// Deterministic values in [-1, 1).
std::vector<float> noise(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (float& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(static_cast<int64_t>(s >> 40) - (1 << 23)) / static_cast<float>(1 << 23);
  }
  return v;
}

// ---- routing -----------------------------------------------------------------

struct Route {
  std::vector<int32_t> experts;
  std::vector<double> weights;
};

// softmax in double, experts sorted by probability (then index), the first k.
Route reference_route(const float* logits, int64_t n_expert, int64_t k, bool normalize) {
  double max = logits[0];
  for (int64_t e = 1; e < n_expert; ++e) max = std::max(max, static_cast<double>(logits[e]));
  std::vector<double> p(static_cast<size_t>(n_expert));
  double sum = 0;
  for (int64_t e = 0; e < n_expert; ++e) {
    p[static_cast<size_t>(e)] = std::exp(logits[e] - max);
    sum += p[static_cast<size_t>(e)];
  }
  for (double& v : p) v /= sum;
  std::vector<int32_t> order(static_cast<size_t>(n_expert));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[static_cast<size_t>(a)] > p[static_cast<size_t>(b)]; });
  Route r;
  double chosen = 0;
  for (int64_t j = 0; j < k; ++j) {
    r.experts.push_back(order[static_cast<size_t>(j)]);
    r.weights.push_back(p[static_cast<size_t>(order[static_cast<size_t>(j)])]);
    chosen += r.weights.back();
  }
  if (normalize) {
    for (double& w : r.weights) w /= chosen;
  }
  return r;
}

TEST(MoeRoute, SoftmaxTopKAndRenormalisationMatchAPlainLoop) {
  auto be = make_cpu_backend(2);
  constexpr int64_t kExperts = 16, kTokens = 9;
  const std::vector<float> logits = noise(kExperts * kTokens, 3);
  for (const int64_t k : {int64_t{1}, int64_t{4}, kExperts}) {
    for (const bool normalize : {true, false}) {
      SCOPED_TRACE("k " + std::to_string(k) + (normalize ? " normalised" : " raw"));
      std::vector<int32_t> experts(static_cast<size_t>(kTokens * k));
      std::vector<float> weights(experts.size());
      be->moe_route(logits.data(), kExperts, kTokens, k, normalize, experts.data(), weights.data());
      for (int64_t t = 0; t < kTokens; ++t) {
        const Route want = reference_route(logits.data() + t * kExperts, kExperts, k, normalize);
        double sum = 0;
        for (int64_t j = 0; j < k; ++j) {
          EXPECT_EQ(experts[static_cast<size_t>(t * k + j)], want.experts[static_cast<size_t>(j)]) << "token " << t;
          EXPECT_NEAR(weights[static_cast<size_t>(t * k + j)], want.weights[static_cast<size_t>(j)], 1e-6);
          sum += weights[static_cast<size_t>(t * k + j)];
        }
        if (normalize) {
          EXPECT_NEAR(sum, 1.0, 1e-6);
        }
      }
    }
  }
}

TEST(MoeRoute, TiesGoToTheLowerExpertAndRowsAreIndependent) {
  auto be = make_cpu_backend(1);
  // Token 0: experts 1 and 3 tie for first; token 1: all equal.
  const std::vector<float> logits = {0.0f, 2.0f, 1.0f, 2.0f, 0.5f, 0.5f, 0.5f, 0.5f};
  std::vector<int32_t> experts(4);
  std::vector<float> weights(4);
  be->moe_route(logits.data(), 4, 2, 2, true, experts.data(), weights.data());
  EXPECT_EQ(experts, (std::vector<int32_t>{1, 3, 0, 1}));
  EXPECT_FLOAT_EQ(weights[0], 0.5f);
  EXPECT_FLOAT_EQ(weights[2], 0.5f);
  // The second row alone gives what it gave next to the first.
  std::vector<int32_t> alone(2);
  std::vector<float> alone_weights(2);
  be->moe_route(logits.data() + 4, 4, 1, 2, true, alone.data(), alone_weights.data());
  EXPECT_EQ(alone, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(alone_weights[0], weights[2]);
}

// ---- expert FFNs --------------------------------------------------------------

// One stack of n_expert matrices of a type, with its float originals dequantized back
// (what the reference multiplies by).
struct Stack {
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // dequantized
  ExpertStack view;
};

Stack make_stack(GgmlType type, int64_t cols, int64_t rows, int64_t n_expert, uint64_t seed) {
  Stack s;
  const int64_t n = cols * rows * n_expert;
  std::vector<float> original = noise(static_cast<size_t>(n), seed);
  for (float& v : original) v *= 2.0f / std::sqrt(static_cast<float>(cols));
  s.bytes.resize(static_cast<size_t>(bytes_of(type_traits(type), static_cast<uint64_t>(n)).value()));
  if (type == GgmlType::F32) {
    std::memcpy(s.bytes.data(), original.data(), s.bytes.size());
  } else {
    quantize_row(type, original.data(), s.bytes.data(), n);
  }
  s.values.resize(static_cast<size_t>(n));
  if (type == GgmlType::F32) {
    s.values = original;
  } else {
    dequantize_row(type, s.bytes.data(), s.values.data(), n);
  }
  s.view = ExpertStack{type, s.bytes.data(), cols, rows, n_expert};
  return s;
}

// y = W_e x in double over the dequantized weights.
std::vector<double> reference_matvec(const Stack& s, int64_t e, const std::vector<double>& x) {
  const int64_t cols = s.view.cols, rows = s.view.rows;
  std::vector<double> y(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const float* w = s.values.data() + (e * rows + r) * cols;
    double sum = 0;
    for (int64_t c = 0; c < cols; ++c) sum += static_cast<double>(w[c]) * x[static_cast<size_t>(c)];
    y[static_cast<size_t>(r)] = sum;
  }
  return y;
}

std::vector<double> reference_moe(const Stack& gate, const Stack& up, const Stack& down, const float* x, int64_t n_embd,
                                  const int32_t* experts, const float* weights, int64_t k) {
  const std::vector<double> xd(x, x + n_embd);
  std::vector<double> out(static_cast<size_t>(n_embd), 0.0);
  for (int64_t j = 0; j < k; ++j) {
    const std::vector<double> g = reference_matvec(gate, experts[j], xd), u = reference_matvec(up, experts[j], xd);
    std::vector<double> h(g.size());
    for (size_t i = 0; i < h.size(); ++i) h[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
    const std::vector<double> y = reference_matvec(down, experts[j], h);
    for (int64_t i = 0; i < n_embd; ++i) out[static_cast<size_t>(i)] += weights[j] * y[static_cast<size_t>(i)];
  }
  return out;
}

struct Experts {
  Stack gate, up, down;
  ExpertWeights view() const { return {gate.view, up.view, down.view}; }
};

Experts make_experts(GgmlType type, int64_t n_embd, int64_t n_ff, int64_t n_expert) {
  return {make_stack(type, n_embd, n_ff, n_expert, 11), make_stack(type, n_embd, n_ff, n_expert, 12),
          make_stack(type, n_ff, n_embd, n_expert, 13)};
}

// Routes that use most experts, some by several tokens, in varied slots.
void make_routes(int64_t tokens, int64_t k, int64_t n_expert, std::vector<int32_t>& experts, std::vector<float>& weights) {
  experts.resize(static_cast<size_t>(tokens * k));
  weights.resize(experts.size());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      experts[static_cast<size_t>(t * k + j)] = static_cast<int32_t>((t * 5 + j * 3 + t * j) % n_expert);
      weights[static_cast<size_t>(t * k + j)] = 0.6f / static_cast<float>(j + 1) + 0.05f * static_cast<float>(t);
    }
  }
}

class MoeFfnTypes : public ::testing::TestWithParam<GgmlType> {};

TEST_P(MoeFfnTypes, MatchesAPlainLoopOverTheChosenExperts) {
  const GgmlType type = GetParam();
  auto be = make_cpu_backend(2);
  ASSERT_TRUE(be->supports(Op::moe_ffn, type));
  constexpr int64_t kEmbd = 256, kFf = 256, kExperts = 6, kUsed = 2, kTokens = 7;  // K-quants: 256-wide rows
  const Experts w = make_experts(type, kEmbd, kFf, kExperts);
  const std::vector<float> x = noise(kTokens * kEmbd, 21);
  std::vector<int32_t> experts;
  std::vector<float> weights;
  make_routes(kTokens, kUsed, kExperts, experts, weights);
  std::vector<float> out(kTokens * kEmbd);
  be->moe_ffn(w.view(), x.data(), kTokens, experts.data(), weights.data(), kUsed, out.data());
  // Activations are rounded to the weight type's dot partner (F32 for F32 weights,
  // 8-bit for the quantized ones), before both the gate/up and the down matmul: the
  // error's RMS stays about 1% of the output's; a wrong expert would be off by ~140%.
  const double tolerance = type == GgmlType::F32 ? 1e-6 : type == GgmlType::F16 ? 2e-3 : 2.5e-2;
  for (int64_t t = 0; t < kTokens; ++t) {
    const std::vector<double> want = reference_moe(w.gate, w.up, w.down, x.data() + t * kEmbd, kEmbd,
                                                   experts.data() + t * kUsed, weights.data() + t * kUsed, kUsed);
    double rms = 0, error = 0;
    for (int64_t i = 0; i < kEmbd; ++i) {
      const double d = out[static_cast<size_t>(t * kEmbd + i)] - want[static_cast<size_t>(i)];
      rms += want[static_cast<size_t>(i)] * want[static_cast<size_t>(i)];
      error += d * d;
    }
    rms = std::sqrt(rms / kEmbd);
    error = std::sqrt(error / kEmbd);
    ASSERT_GT(rms, 1e-2);
    EXPECT_LE(error, tolerance * rms) << "token " << t << " rms " << rms;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, MoeFfnTypes,
                         ::testing::Values(GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0,
                                           GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q2_K, GgmlType::Q3_K,
                                           GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_NL),
                         [](const ::testing::TestParamInfo<GgmlType>& param_info) {
                           return std::string(type_traits(param_info.param).name);
                         });

// Token 3 alone, and among 6 others with other routes (some sharing its experts),
// at every place in the batch: bit-identical output.
TEST(MoeFfn, ATokensResultDoesNotDependOnItsBatch) {
  for (const GgmlType type : {GgmlType::F32, GgmlType::Q8_0, GgmlType::Q4_K}) {
    SCOPED_TRACE(type_traits(type).name);
    auto be = make_cpu_backend(2);
    constexpr int64_t kEmbd = 256, kFf = 512, kExperts = 8, kUsed = 3, kTokens = 7;
    const Experts w = make_experts(type, kEmbd, kFf, kExperts);
    const std::vector<float> x = noise(kTokens * kEmbd, 5);
    std::vector<int32_t> experts;
    std::vector<float> weights;
    make_routes(kTokens, kUsed, kExperts, experts, weights);
    constexpr int64_t kToken = 3;
    std::vector<float> alone(kEmbd);
    be->moe_ffn(w.view(), x.data() + kToken * kEmbd, 1, experts.data() + kToken * kUsed,
                weights.data() + kToken * kUsed, kUsed, alone.data());
    for (int64_t place = 0; place < kTokens; ++place) {
      // The batch with token kToken moved to `place`.
      std::vector<int64_t> order(kTokens);
      std::iota(order.begin(), order.end(), 0);
      order.erase(order.begin() + kToken);
      order.insert(order.begin() + place, kToken);
      std::vector<float> bx, bw;
      std::vector<int32_t> be_experts;
      for (const int64_t t : order) {
        bx.insert(bx.end(), x.begin() + t * kEmbd, x.begin() + (t + 1) * kEmbd);
        be_experts.insert(be_experts.end(), experts.begin() + t * kUsed, experts.begin() + (t + 1) * kUsed);
        bw.insert(bw.end(), weights.begin() + t * kUsed, weights.begin() + (t + 1) * kUsed);
      }
      std::vector<float> out(kTokens * kEmbd);
      be->moe_ffn(w.view(), bx.data(), kTokens, be_experts.data(), bw.data(), kUsed, out.data());
      EXPECT_EQ(0, std::memcmp(out.data() + place * kEmbd, alone.data(), kEmbd * sizeof(float))) << "at " << place;
    }
  }
}

// The slots are added in their order (w_0 y_0 + w_1 y_1 + ..., llama.cpp's), not by
// expert index: exactly the left-to-right float sum of the rounded products.
TEST(MoeFfn, AddsTheWeightedExpertsInSlotOrder) {
  auto be = make_cpu_backend(1);
  constexpr int64_t kEmbd = 64, kFf = 64, kExperts = 4, kUsed = 3;
  const Experts w = make_experts(GgmlType::F32, kEmbd, kFf, kExperts);
  const std::vector<float> x = noise(kEmbd, 8);
  const std::vector<int32_t> experts = {3, 0, 2};
  const std::vector<float> weights = {0.5f, 0.3f, 0.2f};
  std::vector<float> out(kEmbd);
  be->moe_ffn(w.view(), x.data(), 1, experts.data(), weights.data(), kUsed, out.data());
  // Each expert alone with weight 1 gives its unweighted output.
  std::vector<std::vector<float>> single(kUsed, std::vector<float>(kEmbd));
  const float one = 1.0f;
  for (int64_t j = 0; j < kUsed; ++j) {
    be->moe_ffn(w.view(), x.data(), 1, &experts[static_cast<size_t>(j)], &one, 1, single[static_cast<size_t>(j)].data());
  }
  for (int64_t i = 0; i < kEmbd; ++i) {
    volatile float sum = single[0][static_cast<size_t>(i)] * weights[0];
    for (int64_t j = 1; j < kUsed; ++j) {
      volatile float product = single[static_cast<size_t>(j)][static_cast<size_t>(i)] * weights[static_cast<size_t>(j)];
      sum = sum + product;
    }
    EXPECT_EQ(out[static_cast<size_t>(i)], sum) << i;
  }
}

// Experts nobody chose are never read: every unchosen expert's matrices lie on pages
// without access rights (a read would crash the test).
TEST(MoeFfn, ReadsOnlyTheChosenExperts) {
  auto be = make_cpu_backend(2);
  const auto page = static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  const int64_t n_embd = 64, n_ff = page / (n_embd * 4);  // one page per F32 expert matrix
  ASSERT_GE(n_ff, 1);
  constexpr int64_t kExperts = 8, kUsed = 2, kTokens = 5;
  const Experts source = make_experts(GgmlType::F32, n_embd, n_ff, kExperts);
  const std::vector<int32_t> experts = {1, 6, 6, 1, 1, 6, 6, 6, 1, 1};
  const std::vector<float> weights = {0.7f, 0.3f, 0.6f, 0.4f, 0.9f, 0.1f, 0.5f, 0.5f, 0.8f, 0.2f};
  const std::vector<float> x = noise(kTokens * n_embd, 4);
  std::vector<float> want(kTokens * n_embd), got(kTokens * n_embd);
  be->moe_ffn(source.view(), x.data(), kTokens, experts.data(), weights.data(), kUsed, want.data());

  const size_t stack_bytes = static_cast<size_t>(page * kExperts);
  ExpertStack* stacks[3] = {nullptr, nullptr, nullptr};
  Experts guarded = source;
  ExpertWeights view = guarded.view();
  stacks[0] = &view.gate;
  stacks[1] = &view.up;
  stacks[2] = &view.down;
  const Stack* originals[3] = {&source.gate, &source.up, &source.down};
  std::vector<void*> maps;
  for (int s = 0; s < 3; ++s) {
    void* map = mmap(nullptr, stack_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(map, MAP_FAILED);
    maps.push_back(map);
    std::memcpy(map, originals[s]->bytes.data(), stack_bytes);
    for (int64_t e = 0; e < kExperts; ++e) {
      if (e == 1 || e == 6) continue;
      ASSERT_EQ(0, mprotect(static_cast<uint8_t*>(map) + e * page, static_cast<size_t>(page), PROT_NONE));
    }
    stacks[s]->data = map;
  }
  be->moe_ffn(view, x.data(), kTokens, experts.data(), weights.data(), kUsed, got.data());
  EXPECT_EQ(got, want);
  for (void* map : maps) munmap(map, stack_bytes);
}

}  // namespace
}  // namespace pico::backend
