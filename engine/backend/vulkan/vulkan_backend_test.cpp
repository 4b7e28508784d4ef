// The Vulkan backend's activation memory: ops on it record work and wait only when the
// host asks for a result (one submission for a chain of ops), give the same bits as
// the same ops handed host memory, cope with views at offsets the device does not bind,
// and are not host memory (touching them faults). With no usable device every test
// reports itself skipped, saying why.
#include <gtest/gtest.h>

#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "backend/vulkan/vulkan_backend.hpp"
#include "backend/vulkan/vulkan_test_support.hpp"
#include "quant/quantize.hpp"

namespace pico::backend {
namespace {


std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

constexpr int64_t kTokens = 5, kCols = 64, kRows = 48;

struct Weights {
  std::vector<uint8_t> q8;  // kRows x kCols, Q8_0
  std::vector<float> f32;   // kRows x kCols
  std::vector<float> norm;  // kCols
  Weight quantized() const { return {GgmlType::Q8_0, q8.data(), kCols, kRows}; }
  Weight plain() const { return {GgmlType::F32, f32.data(), kCols, kRows}; }
};

Weights make_weights() {
  Weights w;
  w.f32 = random_floats(kRows * kCols, 2);
  w.q8.resize(static_cast<size_t>(kRows * (kCols / 32) * 34));
  const std::vector<float> values = random_floats(kRows * kCols, 3);
  quantize_row(GgmlType::Q8_0, values.data(), w.q8.data(), kRows * kCols);
  w.norm = random_floats(kCols, 4);
  return w;
}

// A chain of ops as a layer does them, over buffers from `alloc` (activation memory or
// host vectors); returns what the host reads at the end.
template <class Alloc>
std::vector<float> chain(Backend& be, const Weights& w, const std::vector<float>& input, Alloc&& alloc) {
  float* x = alloc(kTokens * kCols);
  be.upload(input.data(), kTokens * kCols, x);
  float* xn = alloc(kTokens * kCols);
  be.rms_norm(x, w.norm.data(), kCols, kTokens, 1e-5f, xn);
  float* a = alloc(kTokens * kRows);
  float* b = alloc(kTokens * kRows);
  const Weight ws[2] = {w.quantized(), w.plain()};
  float* const ys[2] = {a, b};
  be.matmul_many(ws, xn, kTokens, ys);
  be.silu(a, kRows, kTokens, a);
  be.mul(a, b, kRows, kTokens, kTokens, a);
  // A view one float in: an offset no device binds, so it goes through an aligned copy.
  be.rms_norm(a + 1, nullptr, kRows - 1, 1, 1e-5f, a + 1);
  const int32_t pos[kTokens] = {3, 4, 5, 6, 7};
  RopeParams rope;
  rope.n_dims = 16;
  be.rope(a, kTokens, kRows, 3, 16, pos, rope);
  float* c = alloc(kTokens * kRows);
  be.copy_rows(a, kRows, kTokens, kRows / 2, c, kRows);
  be.copy_rows(b + kRows / 2, kRows, kTokens, kRows / 2, c + kRows / 2, kRows);
  const int32_t order[kTokens] = {4, 0, 3, 1, 2};
  float* d = alloc(kTokens * kRows);
  be.gather_rows(c, kRows, order, kTokens, d);
  be.softmax(d, kRows, kTokens);
  be.scale_rows(d, kRows, kTokens, b + 7);  // per-row factors from an activation
  be.scale(d, kTokens * kRows, 3.0f);
  be.add(d, c, kRows, kTokens, kTokens, d);
  std::vector<float> out(static_cast<size_t>(kTokens * kRows));
  be.download(d, kTokens * kRows, out.data());
  return out;
}

TEST(VulkanActivations, AChainOfOpsWaitsOnceAndEqualsTheSameOpsOnHostMemory) {
  REQUIRE_BACKEND(be);
  const Weights w = make_weights();
  const std::vector<float> input = random_floats(kTokens * kCols, 1);
  std::vector<std::vector<float>> host_buffers;
  const std::vector<float> on_host = chain(*be, w, input, [&](int64_t n) {
    return host_buffers.emplace_back(static_cast<size_t>(n)).data();
  });
  const ActivationScope scope(*be);
  const uint64_t before = be->submissions();
  const std::vector<float> on_device = chain(*be, w, input, [&](int64_t n) { return be->activations(n); });
  EXPECT_EQ(be->submissions() - before, 1u);  // the download at the end
  EXPECT_EQ(on_device, on_host);
}

TEST(VulkanActivations, AnOpLeftOnTheCpuWaitsForItsInputsOnly) {
  REQUIRE_BACKEND(be);
  const ActivationScope scope(*be);
  const std::vector<float> input = random_floats(8 * 12, 5);
  float* x = be->activations(8 * 12);
  be->upload(input.data(), 8 * 12, x);
  std::vector<float> conv_state(3 * 12, 0.0f);
  const RecurrentSequence with_state{0, 8, conv_state.data(), nullptr};
  const std::vector<float> taps = random_floats(4 * 12, 6);
  float* y = be->activations(8 * 12);
  const uint64_t before = be->submissions();
  be->ssm_conv(x, 12, taps.data(), 4, {&with_state, 1}, y);  // the CPU's: x comes down
  EXPECT_EQ(be->submissions() - before, 1u);
  be->silu(y, 12, 8, y);  // its result went back up without a wait
  std::vector<float> got(8 * 12);
  be->download(y, 8 * 12, got.data());
  EXPECT_EQ(be->submissions() - before, 2u);

  std::vector<float> want(8 * 12), state(3 * 12, 0.0f);
  const RecurrentSequence host_sequence{0, 8, state.data(), nullptr};
  const std::unique_ptr<Backend> cpu = make_cpu_backend(1);
  cpu->ssm_conv(input.data(), 12, taps.data(), 4, {&host_sequence, 1}, want.data());
  be->silu(want.data(), 12, 8, want.data());
  EXPECT_EQ(got, want);
}

TEST(VulkanActivations, RowOpsEqualTheCpusBitForBit) {
  REQUIRE_BACKEND(be);
  const std::unique_ptr<Backend> cpu = make_cpu_backend(1);
  const std::vector<float> x = random_floats(7 * 33, 8), factors = random_floats(7, 9);
  std::vector<float> want = x, got = x;
  cpu->scale_rows(want.data(), 33, 7, factors.data());
  be->scale_rows(got.data(), 33, 7, factors.data());
  EXPECT_EQ(got, want);
  const int32_t ids[4] = {6, 0, 6, 3};
  std::vector<float> want_rows(4 * 33), got_rows(4 * 33);
  cpu->gather_rows(x.data(), 33, ids, 4, want_rows.data());
  be->gather_rows(x.data(), 33, ids, 4, got_rows.data());
  EXPECT_EQ(got_rows, want_rows);
}

// The arg max of rows as sample::first_argmax picks it: ties to the first, -0 equal to
// +0, NaNs passed over unless one leads the row, all -inf; on activation memory, one
// download.
TEST(VulkanActivations, ReducedRowsEqualsTheCpusBitForBit) {
  REQUIRE_BACKEND(be);
  const std::unique_ptr<Backend> cpu = make_cpu_backend(1);
  constexpr int64_t kN = 300, kArgRows = 6;
  std::vector<float> x = random_floats(kN * kArgRows, 12);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  x[0 * kN + 17] = 9.0f;  // row 0: a tie, the first wins
  x[0 * kN + 230] = 9.0f;
  x[1 * kN + 0] = nan;  // row 1: a leading NaN is index 0
  x[2 * kN + 5] = nan;  // row 2: a NaN elsewhere is passed over
  x[2 * kN + 250] = 20.0f;
  for (int64_t i = 0; i < kN; ++i) x[3 * kN + i] = -inf;  // row 3: all -inf: index 0
  for (int64_t i = 0; i < kN; ++i) x[4 * kN + i] = i % 2 ? -0.0f : 0.0f;  // row 4: -0 == +0: index 0
  x[5 * kN + kN - 1] = 50.0f;  // row 5: the last value
  const int32_t rows[] = {5, 0, 1, 2, 3, 4, 0};
  constexpr int64_t kCount = std::size(rows);
  std::vector<float> want(2 * kCount), got(2 * kCount);
  cpu->argmax_rows(x.data(), kN, rows, kCount, want.data());
  {
    const ActivationScope scope(*be);
    float* dx = be->activations(kN * kArgRows);
    be->upload(x.data(), kN * kArgRows, dx);
    float* out = be->activations(2 * kCount);
    const uint64_t before = be->submissions();
    be->argmax_rows(dx, kN, rows, kCount, out);
    be->download(out, 2 * kCount, got.data());
    EXPECT_EQ(be->submissions() - before, 1u);
  }
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  int32_t first;
  std::memcpy(&first, want.data() + 1, sizeof first);
  EXPECT_EQ(first, 17);  // the CPU's answer is first_argmax's (checked in sample_test)
}

TEST(VulkanActivations, MemoryIsGivenBackToAMarkAndReused) {
  REQUIRE_BACKEND(be);
  const size_t mark = be->activation_mark();
  float* first = be->activations(1000);
  be->activations(1000);
  be->release_activations(mark);
  EXPECT_EQ(be->activations(1000), first);
  be->release_activations(mark);
  EXPECT_THROW(be->release_activations(mark + (1 << 20)), std::logic_error);
}

TEST(VulkanActivationsDeathTest, TheHostCannotTouchThem) {
  REQUIRE_BACKEND(be);
  float* x = be->activations(16);
  EXPECT_DEATH(
      {
        volatile float* p = x;
        p[0] = 1.0f;
      },
      "");
}

}  // namespace
}  // namespace pico::backend
