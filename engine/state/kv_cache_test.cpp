#include "state/kv_cache.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "quant/float_convert.hpp"

namespace pico::state {
namespace {

KvConfig config(GgmlType type = GgmlType::F16) {
  KvConfig c;
  c.first_layer = 1;
  c.last_layer = 3;
  c.n_kv_heads = 2;
  c.head_dim_k = 32;
  c.head_dim_v = 32;
  c.k_type = type;
  c.v_type = type;
  return c;
}

std::vector<float> row(int seed) {
  std::vector<float> r(64);
  for (size_t i = 0; i < r.size(); ++i) r[i] = std::sin(0.37f * static_cast<float>(i) + static_cast<float>(seed));
  return r;
}

void fill(KvState& s, int64_t from, int64_t to) {
  for (int64_t p = from; p < to; ++p) {
    for (int32_t l = 1; l < 3; ++l) s.write(l, p, row(static_cast<int>(p * 10 + l)).data(), row(-static_cast<int>(p)).data());
  }
}

TEST(KvState, StoresF16RoundedRows) {
  KvState s(config());
  fill(s, 0, 5);
  EXPECT_EQ(s.n_pos(), 5);
  const KvLayerView v = s.layer(2);
  EXPECT_EQ(v.n_pos, 5);
  std::vector<float> out(32);
  read_k(v, 3, 1, out.data());
  const std::vector<float> want = row(32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(out[static_cast<size_t>(i)], fp16_to_fp32(fp32_to_fp16(want[32 + static_cast<size_t>(i)])));
  EXPECT_EQ(s.bytes_used(), 5u * 2 * 2 * 64 * 2);
}

TEST(KvState, TruncateThenRewrite) {
  KvState s(config());
  fill(s, 0, 8);
  s.truncate(3);
  EXPECT_EQ(s.n_pos(), 3);
  EXPECT_EQ(s.layer(1).n_pos, 3);
  EXPECT_THROW(s.write(1, 5, row(0).data(), row(0).data()), std::out_of_range);  // a gap
  fill(s, 3, 6);
  EXPECT_EQ(s.n_pos(), 6);
  EXPECT_THROW(s.layer(0), std::out_of_range);  // not this stage's layer
}

TEST(KvState, SnapshotRestore) {
  KvState s(config());
  fill(s, 0, 4);
  const auto snap = s.snapshot();
  fill(s, 4, 9);
  s.restore(snap);
  EXPECT_EQ(s.n_pos(), 4);
  KvState fresh(config());
  fill(fresh, 0, 4);
  EXPECT_EQ(s.snapshot(), fresh.snapshot());
  KvState other(config(GgmlType::Q8_0));
  EXPECT_THROW(other.restore(snap), std::invalid_argument);
}

TEST(KvState, QuantizedTypesRoundTripClosely) {
  for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::F32}) {
    KvState s(config(type));
    fill(s, 0, 2);
    std::vector<float> out(32);
    read_v(s.layer(1), 1, 0, out.data());
    const std::vector<float> want = row(-1);
    const float tol = type == GgmlType::Q4_0 ? 0.15f : type == GgmlType::Q8_0 ? 0.01f : 0.0f;
    for (int i = 0; i < 32; ++i) EXPECT_NEAR(out[static_cast<size_t>(i)], want[static_cast<size_t>(i)], tol);
  }
}

TEST(KvCache, SequencesById) {
  KvCache cache(config());
  fill(cache.sequence(7), 0, 3);
  fill(cache.sequence(2), 0, 5);
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.sequence(7).n_pos(), 3);
  cache.truncate(2, 1);
  EXPECT_EQ(cache.sequence(2).n_pos(), 1);
  cache.remove(7);
  EXPECT_FALSE(cache.contains(7));
  EXPECT_EQ(cache.bytes_used(), 1u * 2 * 2 * 64 * 2);
}

TEST(KvConfig, ParseAndValidate) {
  EXPECT_EQ(parse_kv_type("Q8_0"), GgmlType::Q8_0);
  EXPECT_EQ(parse_kv_type("f16"), GgmlType::F16);
  EXPECT_FALSE(parse_kv_type("q5_k").has_value());
  KvConfig c = config(GgmlType::Q8_0);
  c.head_dim_k = 16;  // a head is not whole blocks of 32
  EXPECT_THROW(validate(c), std::invalid_argument);
}

}  // namespace
}  // namespace pico::state
