// Sequence state in device memory (the Vulkan backend's stores). The KV cache: what
// store_kv puts there is the F16 the host cache stores, bit for bit (ties, subnormals,
// overflow, NaN), over many pages (the pools grow); snapshots, restores and truncation
// behave as on the host; attention over it matches the CPU's over host pages; its
// pages are not host memory; a cache may outlive its backend. The recurrent state: the
// conv and delta rule update it on the device as the CPU updates host state, and
// checkpoints, truncation and snapshots keep their exact bits. With no usable device
// every test reports itself skipped, saying why.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "backend/vulkan/vulkan_backend.hpp"
#include "backend/vulkan/vulkan_test_support.hpp"

namespace pico::backend {
namespace {


constexpr int64_t kHeads = 2, kDimK = 16, kDimV = 8, kRowK = kHeads * kDimK;
constexpr int64_t kStride = kRowK + 3;  // rows of the inputs sit apart, as in a fused QKV

state::KvConfig config() {
  state::KvConfig c;
  c.first_layer = 4;
  c.last_layer = 6;
  c.n_kv_heads = kHeads;
  c.head_dim_k = kDimK;
  c.head_dim_v = kDimV;
  c.page_positions = 4;
  return c;
}

// Values for rows; with specials, a few of every row are ones F16 rounding must get
// right: ties to even, the subnormal range and its ties, overflow, infinities, NaN.
std::vector<float> values(size_t n, uint32_t seed, bool specials) {
  const float tiny = std::ldexp(1.0f, -24);  // the smallest F16 subnormal
  const float special[] = {0.0f,
                           -0.0f,
                           65504.0f,
                           65519.0f,
                           65520.0f,
                           -70000.0f,
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(),
                           1.0f + std::ldexp(1.0f, -11),
                           1.0f + 3 * std::ldexp(1.0f, -11),
                           tiny / 2,
                           3 * tiny / 2,
                           5 * tiny / 2,
                           -tiny * 0.75f,
                           std::ldexp(1.0f, -14) * 0.999f,
                           std::ldexp(1.0f, -14),
                           1e-40f,
                           std::ldexp(1.0f, -25) * 1.0001f};
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = specials && i % 5 == 0 ? special[(i / 5 + seed) % std::size(special)] : dist(rng);
  return v;
}

// Stores `positions` positions of sequences 3 and 8 (interleaved in each batch of 5
// slots per sequence) in both layers of both caches: the device's through `be`, the
// host's through the CPU backend.
void fill(Backend& be, state::KvCache& device, state::KvCache& host, int32_t positions, bool specials, uint32_t seed,
          int32_t from = 0) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend(1);
  for (int32_t start = from; start < positions; start += 5) {
    std::vector<KvSlot> slots;
    for (int32_t p = start; p < std::min(positions, start + 5); ++p) {
      slots.push_back({3, p});
      slots.push_back({8, p});
    }
    for (int32_t layer = 4; layer < 6; ++layer) {
      const auto n = static_cast<size_t>(slots.size());
      const std::vector<float> k = values(n * kStride, seed++, specials), v = values(n * kStride, seed++, specials);
      be.store_kv(device, layer, slots, k.data(), kStride, v.data(), kStride);
      cpu->store_kv(host, layer, slots, k.data(), kStride, v.data(), kStride);
    }
  }
}

TEST(VulkanKvCache, StoresTheBitsTheHostStoresOverManyPages) {
  REQUIRE_BACKEND(be);
  state::KvCache host(config()), device(config(), std::nullopt, state_stores_of(*be));
  ASSERT_TRUE(host.page_store().host_memory());
  ASSERT_FALSE(device.page_store().host_memory());
  // 2 sequences x 2 layers x 11 pages: past the first pool of 16 pages and the second of 32.
  fill(*be, device, host, 41, true, 1);
  for (const int32_t seq : {3, 8}) {
    EXPECT_EQ(device.positions(seq), 41);
    EXPECT_EQ(device.bytes_used(seq), host.bytes_used(seq));
    EXPECT_EQ(*device.snapshot(seq), *host.snapshot(seq)) << "sequence " << seq;
  }
}

TEST(VulkanKvCache, SnapshotRestoreAndTruncateAsOnTheHost) {
  REQUIRE_BACKEND(be);
  state::KvCache host(config()), device(config(), std::nullopt, state_stores_of(*be));
  fill(*be, device, host, 13, false, 7);
  const std::vector<uint8_t> snapshot = *host.snapshot(3);
  state::KvCache restored(config(), std::nullopt, state_stores_of(*be));
  restored.restore(3, snapshot);
  EXPECT_EQ(*restored.snapshot(3), snapshot);

  device.truncate(3, 6);
  host.truncate(3, 6);
  device.truncate(8, 8);
  host.truncate(8, 8);
  EXPECT_EQ(device.bytes_used(), host.bytes_used());
  EXPECT_EQ(device.positions(3), 6);
  fill(*be, device, host, 17, false, 50, 6);  // sequence 8's positions 6 and 7 rewritten
  for (const int32_t seq : {3, 8}) EXPECT_EQ(*device.snapshot(seq), *host.snapshot(seq)) << "sequence " << seq;
}

TEST(VulkanKvCache, AttentionOverItMatchesTheCpusOverHostPages) {
  REQUIRE_BACKEND(be);
  state::KvCache host(config()), device(config(), std::nullopt, state_stores_of(*be));
  fill(*be, device, host, 23, false, 11);
  const std::unique_ptr<Backend> cpu = make_cpu_backend(1);
  for (const int32_t window : {0, 6}) {
    AttentionParams params;
    params.n_head = 4;
    params.n_head_kv = kHeads;
    params.head_dim_k = kDimK;
    params.head_dim_v = kDimV;
    params.scale = 0.25f;
    params.window = window;
    std::vector<AttentionQuery> on_device, on_host;
    for (const auto& [seq, pos] : {std::pair{3, 22}, std::pair{8, 5}, std::pair{3, 0}, std::pair{8, 17}}) {
      on_device.push_back({pos, device.sequence(seq).layer(5)});
      on_host.push_back({pos, host.sequence(seq).layer(5)});
    }
    const int64_t q_stride = params.n_head * kDimK + 5;
    const std::vector<float> q = values(on_device.size() * q_stride, 99, false);
    const size_t out_n = on_device.size() * params.n_head * kDimV;
    std::vector<float> got(out_n), want(out_n);
    be->attention(q.data(), q_stride, on_device, params, got.data());
    cpu->attention(q.data(), q_stride, on_host, params, want.data());
    double error = 0, norm = 0;
    for (size_t i = 0; i < out_n; ++i) {
      error += (got[i] - want[i]) * (got[i] - want[i]);
      norm += want[i] * want[i];
    }
    EXPECT_LE(error / norm, 5e-4) << "window " << window;
  }
}

TEST(VulkanKvCache, OutlivesItsBackend) {
  REQUIRE_BACKEND(be);
  state::KvCache host(config());
  auto device = std::make_unique<state::KvCache>(config(), std::nullopt, state_stores_of(*be));
  fill(*be, *device, host, 9, false, 3);
  be.reset();
  EXPECT_EQ(*device->snapshot(8), *host.snapshot(8));
  device.reset();
}

double nmse(const std::vector<float>& got, const std::vector<float>& want) {
  double error = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    error += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return norm > 0 ? error / norm : error;
}

std::vector<float> state_floats(const state::RecurrentState& s) {
  const std::vector<uint8_t> snapshot = s.snapshot();
  std::vector<float> floats((snapshot.size() - 56) / sizeof(float));  // after its 7-word header
  std::memcpy(floats.data(), snapshot.data() + 56, floats.size() * sizeof(float));
  return floats;
}

TEST(VulkanRecurrentState, UpdatedOnTheDeviceAsTheCpuUpdatesHostState) {
  REQUIRE_BACKEND(be);
  state::RecurrentConfig c;
  c.first_layer = 2;
  c.last_layer = 5;
  c.recurrent = {true, false, true};
  c.conv_taps = 4;
  c.n_v_heads = 4;
  c.head_dim = 8;
  c.conv_channels = 2 * 2 * 8 + 4 * 8;  // 2 key heads
  const size_t block = state::recurrent_bytes_per_sequence(c) / sizeof(float);
  const auto store = be->state_block_store(block);
  ASSERT_FALSE(store->host_memory());
  const std::unique_ptr<Backend> cpu = make_cpu_backend(1);
  // Three sequences on the device and on the host.
  std::vector<std::unique_ptr<state::RecurrentState>> device, host;
  for (int i = 0; i < 3; ++i) {
    device.push_back(std::make_unique<state::RecurrentState>(c, store));
    host.push_back(std::make_unique<state::RecurrentState>(c));
  }
  DeltaRuleParams params;
  params.n_k_heads = 2;
  params.n_v_heads = 4;
  params.head_dim = 8;
  const int64_t channels = c.conv_channels, rows = 9;  // sequence rows 4, 2, 3
  const int64_t row_lengths[3] = {4, 2, 3};
  // The conv's taps are a model weight, which a backend uploads once per address.
  const std::vector<float> layer_taps[2] = {values(static_cast<size_t>(4 * channels), 70, false),
                                            values(static_cast<size_t>(4 * channels), 71, false)};
  std::vector<float> at_four;
  for (int step = 0; step < 2; ++step) {
    for (const int32_t layer : {2, 4}) {
      std::vector<RecurrentSequence> on_device, on_host;
      int64_t first = 0;
      for (int i = 0; i < 3; ++i) {
        on_device.push_back({first, row_lengths[i], device[i]->conv(layer), device[i]->ssm(layer), &device[i]->store()});
        on_host.push_back({first, row_lengths[i], host[i]->conv(layer), host[i]->ssm(layer), &host[i]->store()});
        first += row_lengths[i];
      }
      const auto seed = static_cast<uint32_t>(10 * step + layer);
      const std::vector<float> x = values(static_cast<size_t>(rows * channels), seed, false);
      const std::vector<float>& taps = layer_taps[layer == 2 ? 0 : 1];
      std::vector<float> got(static_cast<size_t>(rows * channels)), want(got.size());
      be->ssm_conv(x.data(), channels, taps.data(), 4, on_device, got.data());
      cpu->ssm_conv(x.data(), channels, taps.data(), 4, on_host, want.data());
      EXPECT_LE(nmse(got, want), 1e-10) << "conv, layer " << layer;
      // The delta rule over the conv's output as q, k, v (rows of `channels`), with
      // a decay and beta per value head.
      std::vector<float> g = values(static_cast<size_t>(rows * 4), seed + 2, false), beta = g;
      for (float& v : g) v = -std::fabs(v) * 0.1f;
      for (float& v : beta) v = 1.0f / (1.0f + std::exp(-v));
      std::vector<float> out_device(static_cast<size_t>(rows * 4 * 8)), out_host(out_device.size());
      std::vector<float> q = want, k = want, v = want;
      for (float& f : q) f *= 0.1f;
      for (float& f : k) f *= 0.1f;
      be->delta_rule(q.data(), k.data() + 16, v.data() + 32, channels, g.data(), beta.data(), on_device, params,
                     out_device.data());
      cpu->delta_rule(q.data(), k.data() + 16, v.data() + 32, channels, g.data(), beta.data(), on_host, params,
                      out_host.data());
      EXPECT_LE(nmse(out_device, out_host), 5e-4) << "delta rule, layer " << layer;
    }
    for (int i = 0; i < 3; ++i) {
      EXPECT_LE(nmse(state_floats(*device[i]), state_floats(*host[i])), 5e-4) << "sequence " << i << ", step " << step;
      device[i]->set_n_pos(4 * (step + 1));
      if (step == 0) device[i]->checkpoint(2);  // a copy on the device, at position 4
    }
    if (step == 0) at_four = state_floats(*device[1]);
  }
  // Back to the checkpoint: the state after step 0, bit for bit; then to nothing.
  const std::vector<float> after_two = state_floats(*device[1]);
  EXPECT_EQ(device[1]->bytes_used(), 2 * block * sizeof(float));
  std::vector<uint8_t> snapshot = device[1]->snapshot();
  device[1]->truncate(4);
  EXPECT_EQ(device[1]->n_pos(), 4);
  EXPECT_EQ(state_floats(*device[1]), at_four);
  EXPECT_NE(at_four, after_two);
  device[0]->truncate(0);
  EXPECT_EQ(state_floats(*device[0]), std::vector<float>(block, 0.0f));
  device[0]->restore(snapshot);  // a snapshot in, exactly
  EXPECT_EQ(state_floats(*device[0]), after_two);
  EXPECT_EQ(device[0]->n_pos(), 8);
}

TEST(VulkanKvCacheDeathTest, ItsPagesAreNotHostMemory) {
  REQUIRE_BACKEND(be);
  state::KvCache host(config()), device(config(), std::nullopt, state_stores_of(*be));
  fill(*be, device, host, 2, false, 5);
  const state::KvLayerView view = device.sequence(3).layer(4);
  EXPECT_DEATH(
      {
        volatile const uint8_t* p = view.k_row(0);
        (void)p[0];
      },
      "");
}

}  // namespace
}  // namespace pico::backend
