#include "state/recurrent_state.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "state/kv_cache.hpp"

namespace pico::state {
namespace {

RecurrentConfig config() {
  RecurrentConfig c;
  c.first_layer = 4;
  c.last_layer = 8;
  c.recurrent = {true, true, false, true};  // layer 6 is an attention layer
  c.conv_taps = 4;
  c.conv_channels = 6;
  c.n_v_heads = 2;
  c.head_dim = 3;
  return c;
}

// Writes `value` over every float of the state (as if a forward had run to n_pos).
void fill(RecurrentState& s, float value, int64_t n_pos) {
  for (int32_t layer : {4, 5, 7}) {
    for (int64_t i = 0; i < s.config().conv_floats(); ++i) s.conv(layer)[i] = value;
    for (int64_t i = 0; i < s.config().ssm_floats(); ++i) s.ssm(layer)[i] = value + 0.5f;
  }
  s.set_n_pos(n_pos);
}

TEST(RecurrentState, SizesCountOnlyTheLinearLayers) {
  const RecurrentConfig c = config();
  EXPECT_EQ(c.layers(), 3);
  EXPECT_EQ(c.conv_floats(), 18);  // (4 - 1) * 6
  EXPECT_EQ(c.ssm_floats(), 18);   // 2 * 3 * 3
  EXPECT_EQ(recurrent_bytes_per_sequence(c), 3u * 36u * 4u);
  RecurrentState s(c);
  EXPECT_EQ(s.bytes_used(), 3u * 36u * 4u);
  EXPECT_THROW(s.conv(6), std::out_of_range);
  EXPECT_THROW(s.ssm(3), std::out_of_range);
  EXPECT_EQ(s.conv(4)[0], 0.0f);  // a fresh sequence starts from zeros
}

TEST(RecurrentState, GoesBackOnlyToACheckpointOrToNothing) {
  RecurrentState s(config());
  fill(s, 1.0f, 10);
  s.checkpoint(3);
  fill(s, 2.0f, 20);
  EXPECT_TRUE(s.can_truncate(10));
  EXPECT_TRUE(s.can_truncate(0));
  EXPECT_TRUE(s.can_truncate(25));  // past the end: nothing to do
  EXPECT_FALSE(s.can_truncate(15));
  EXPECT_THROW(s.truncate(15), std::invalid_argument);
  EXPECT_EQ(s.n_pos(), 20);  // a refused truncate changes nothing
  EXPECT_EQ(s.conv(5)[2], 2.0f);
  s.truncate(10);
  EXPECT_EQ(s.n_pos(), 10);
  EXPECT_EQ(s.conv(5)[2], 1.0f);
  EXPECT_EQ(s.ssm(7)[17], 1.5f);
  EXPECT_EQ(s.checkpoint_positions(), (std::vector<int64_t>{10}));  // kept for the next reuse
  s.truncate(0);
  EXPECT_EQ(s.n_pos(), 0);
  EXPECT_EQ(s.conv(4)[0], 0.0f);
  EXPECT_EQ(s.checkpoint_count(), 0u);
}

TEST(RecurrentState, CheckpointsAreCountedAndEvictedKeepingTheirSpread) {
  RecurrentState s(config());
  const size_t state_bytes = s.bytes_used();
  for (int64_t pos : {256, 512, 768, 1024, 1100}) {
    fill(s, static_cast<float>(pos), pos);
    s.checkpoint(3);
  }
  // 256 | 512 | 768, then at 1024 every one leaves a gap of 512 (0..512, 256..768,
  // 512..1024): the oldest goes; at 1100 the gaps are 0..768, 512..1024, 768..1100:
  // 1024 goes, the newest stays.
  EXPECT_EQ(s.checkpoint_positions(), (std::vector<int64_t>{512, 768, 1100}));
  EXPECT_EQ(s.checkpoint_bytes(), 3 * state_bytes);
  EXPECT_EQ(s.bytes_used(), 4 * state_bytes);
}

TEST(RecurrentState, EvictionDropsTheMostCrowdedCheckpoint) {
  EXPECT_EQ(checkpoint_to_evict(std::vector<int64_t>{200, 210, 400}), 1u);  // 200..400 without it
  EXPECT_EQ(checkpoint_to_evict(std::vector<int64_t>{100, 110, 400}), 0u);  // 0..110 without it
  EXPECT_EQ(checkpoint_to_evict(std::vector<int64_t>{10, 300, 600}), 0u);   // 0..300 is the narrowest
  EXPECT_EQ(checkpoint_to_evict(std::vector<int64_t>{64, 128}), 0u);        // the newest always stays
  EXPECT_THROW(checkpoint_to_evict(std::vector<int64_t>{64}), std::invalid_argument);
}

TEST(RecurrentState, SnapshotRoundTripAndRefusals) {
  RecurrentState s(config());
  fill(s, 3.0f, 42);
  const std::vector<uint8_t> bytes = s.snapshot();
  RecurrentState t(config());
  EXPECT_EQ(t.snapshot_positions(bytes), 42);
  t.restore(bytes);
  EXPECT_EQ(t.n_pos(), 42);
  EXPECT_EQ(t.ssm(7)[0], 3.5f);
  EXPECT_EQ(t.snapshot(), bytes);

  std::vector<uint8_t> short_one(bytes.begin(), bytes.end() - 4);
  EXPECT_THROW(t.restore(short_one), std::invalid_argument);
  RecurrentConfig other = config();
  other.head_dim = 4;
  RecurrentState u(other);
  EXPECT_THROW(u.restore(bytes), std::invalid_argument);
  std::vector<uint8_t> bad_magic = bytes;
  bad_magic[0] ^= 1;
  EXPECT_THROW(t.restore(bad_magic), std::invalid_argument);
  EXPECT_EQ(t.n_pos(), 42);  // refused restores change nothing
}

TEST(HybridCache, KeepsKvForAttentionLayersAndStateForLinearOnes) {
  KvConfig kv;
  kv.first_layer = 4;
  kv.last_layer = 8;
  kv.n_kv_heads = 1;
  kv.head_dim_k = kv.head_dim_v = 4;
  kv.k_type = kv.v_type = GgmlType::F32;
  kv.attention = {false, false, true, false};
  EXPECT_EQ(kv_bytes_per_position(kv), 32u);  // one layer of K and V
  KvCache cache(kv, config());
  EXPECT_EQ(cache.fixed_bytes_per_sequence(), 3u * 36u * 4u);
  const float row[4] = {1, 2, 3, 4};
  EXPECT_THROW(cache.sequence(1).write(4, 0, row, row), std::out_of_range);
  for (int64_t p = 0; p < 6; ++p) cache.sequence(1).write(6, p, row, row);
  fill(cache.recurrent(1), 1.0f, 6);
  EXPECT_EQ(cache.positions(1), 6);
  cache.recurrent(1).checkpoint(2);
  EXPECT_FALSE(cache.can_truncate(1, 3));
  EXPECT_THROW(cache.truncate(1, 3), std::invalid_argument);
  EXPECT_EQ(cache.sequence(1).n_pos(), 6);  // the KV was left as it was

  const auto snapshot = cache.snapshot(1);
  ASSERT_TRUE(snapshot);
  KvCache other(kv, config());
  other.restore(9, *snapshot);
  EXPECT_EQ(other.positions(9), 6);
  EXPECT_EQ(other.recurrent(9).conv(5)[0], 1.0f);
  EXPECT_EQ(other.sequence(9).layer(6).n_pos, 6);
  EXPECT_THROW(other.split_snapshot(std::span<const uint8_t>(snapshot->data(), 8)), std::invalid_argument);
  EXPECT_EQ(cache.bytes_used(), other.bytes_used() + 3u * 36u * 4u);  // the checkpoint is not carried

  // Malformed hybrid snapshots are refused, naming what is wrong, and change nothing.
  std::vector<uint8_t> lying = *snapshot;
  const uint64_t huge = uint64_t{1} << 60;
  std::memcpy(lying.data() + 8, &huge, 8);
  EXPECT_THROW(other.restore(9, lying), std::invalid_argument);
  std::vector<uint8_t> cut(snapshot->begin(), snapshot->end() - 1);  // the recurrent part one byte short
  EXPECT_THROW(other.restore(9, cut), std::invalid_argument);
  std::vector<uint8_t> kv_only = cache.sequence(1).snapshot();  // a plain KV snapshot on a hybrid stage
  EXPECT_THROW(other.restore(9, kv_only), std::invalid_argument);
  EXPECT_EQ(other.positions(9), 6);
  EXPECT_EQ(other.recurrent(9).conv(5)[0], 1.0f);
}

}  // namespace
}  // namespace pico::state
