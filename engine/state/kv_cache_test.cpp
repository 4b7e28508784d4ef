#include "state/kv_cache.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "quant/float_convert.hpp"

// The largest single allocation while `g_track` is set: restore must not allocate for
// what a snapshot claims before it has checked the claim against its bytes.
namespace {
std::atomic<bool> g_track{false};
std::atomic<size_t> g_largest{0};
}  // namespace

void* operator new(size_t size) {
  if (g_track.load(std::memory_order_relaxed) && size > g_largest.load(std::memory_order_relaxed)) g_largest = size;
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t size) { return operator new(size); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }

namespace pico::state {
namespace {

KvConfig config(GgmlType type = GgmlType::F16, int64_t page_positions = 256) {
  KvConfig c;
  c.first_layer = 1;
  c.last_layer = 3;
  c.n_kv_heads = 2;
  c.head_dim_k = 32;
  c.head_dim_v = 32;
  c.k_type = type;
  c.v_type = type;
  c.page_positions = page_positions;
  return c;
}

// Bytes of one position over the config's two layers: 2 heads x 32 F16 values, K and V.
constexpr size_t kPositionBytes = 2 * (2 * 32 * 2) * 2;

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
  EXPECT_EQ(s.bytes_used(), 256 * kPositionBytes);  // one whole page
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
  EXPECT_EQ(cache.bytes_used(), 256 * kPositionBytes);
}

TEST(KvPages, GrowByWholePagesAndTruncateFreesThem) {
  KvState s(config(GgmlType::F16, 4));
  EXPECT_EQ(s.bytes_used(), 0u);
  fill(s, 0, 1);
  EXPECT_EQ(s.bytes_used(), 4 * kPositionBytes);
  fill(s, 1, 4);
  EXPECT_EQ(s.bytes_used(), 4 * kPositionBytes);
  fill(s, 4, 5);
  EXPECT_EQ(s.bytes_used(), 8 * kPositionBytes);
  EXPECT_EQ(s.bytes_used(), kv_bytes_for_positions(s.config(), 5));
  fill(s, 5, 13);
  EXPECT_EQ(s.bytes_used(), 16 * kPositionBytes);
  s.truncate(4);
  EXPECT_EQ(s.bytes_used(), 4 * kPositionBytes);
  s.truncate(0);
  EXPECT_EQ(s.bytes_used(), 0u);
  EXPECT_EQ(kv_bytes_per_position(s.config()), kPositionBytes);
  EXPECT_EQ(kv_bytes_for_positions(s.config(), 0), 0u);
  EXPECT_EQ(kv_bytes_for_positions(s.config(), 9), 12 * kPositionBytes);
}

TEST(KvPages, GrowingNeverMovesRowsAlreadyWritten) {
  KvState s(config(GgmlType::F16, 4));
  fill(s, 0, 3);
  const uint8_t* first = s.layer(1).k_row(0);
  const uint8_t* last = s.layer(2).v_row(2);
  fill(s, 3, 40);
  EXPECT_EQ(s.layer(1).k_row(0), first);
  EXPECT_EQ(s.layer(2).v_row(2), last);
}

TEST(KvPages, RowsAreTheSameWhateverThePageSize) {
  for (GgmlType type : {GgmlType::F16, GgmlType::Q8_0}) {
    KvState paged(config(type, 4)), flat(config(type, 1024));
    fill(paged, 0, 23);
    fill(flat, 0, 23);
    std::vector<float> a(32), b(32);
    for (int32_t layer = 1; layer < 3; ++layer) {
      for (int64_t p = 0; p < 23; ++p) {
        for (int64_t head = 0; head < 2; ++head) {
          read_k(paged.layer(layer), p, head, a.data());
          read_k(flat.layer(layer), p, head, b.data());
          EXPECT_EQ(a, b) << "K layer " << layer << " pos " << p;
          read_v(paged.layer(layer), p, head, a.data());
          read_v(flat.layer(layer), p, head, b.data());
          EXPECT_EQ(a, b) << "V layer " << layer << " pos " << p;
        }
      }
    }
    // The rows of every page boundary as stored (F16: the rounded values).
    if (type == GgmlType::F16) {
      read_k(paged.layer(2), 4, 1, a.data());
      const std::vector<float> want = row(42);
      for (int i = 0; i < 32; ++i)
        EXPECT_EQ(a[static_cast<size_t>(i)], fp16_to_fp32(fp32_to_fp16(want[32 + static_cast<size_t>(i)])));
    }
    // The snapshot does not depend on pages: each restores into the other.
    EXPECT_EQ(paged.snapshot(), flat.snapshot());
    KvState back(config(type, 8));
    back.restore(paged.snapshot());
    EXPECT_EQ(back.snapshot(), flat.snapshot());
    EXPECT_EQ(back.bytes_used(), kv_bytes_for_positions(back.config(), 23));
  }
}

// A snapshot of `n` positions in each of the two layers, then edited by the test.
std::vector<uint8_t> snapshot_of(int64_t n) {
  KvState s(config());
  fill(s, 0, n);
  return s.snapshot();
}

constexpr size_t kHeaderBytes = 8 * 8;

void set_word(std::vector<uint8_t>& bytes, size_t offset, uint64_t value) {
  std::memcpy(bytes.data() + offset, &value, 8);
}

// Restores a bad snapshot into a state holding 3 positions: refused, the state as it
// was, and no allocation on the way bigger than `most` bytes.
void expect_refused(const std::vector<uint8_t>& bad, size_t most) {
  KvState s(config());
  fill(s, 0, 3);
  const auto before = s.snapshot();
  g_largest = 0;
  g_track = true;
  EXPECT_THROW(s.restore(bad), std::invalid_argument);
  EXPECT_THROW(s.snapshot_positions(bad), std::invalid_argument);
  g_track = false;
  EXPECT_LE(g_largest.load(), most);
  EXPECT_EQ(s.snapshot(), before);
}

TEST(KvRestore, RefusesMorePositionsThanItsBytesHold) {
  // 1 MB of rows claiming a million positions: refused before anything is sized by n.
  auto snap = snapshot_of(1000 * 1024 / kPositionBytes);
  set_word(snap, kHeaderBytes, 1000000);
  expect_refused(snap, 4096);
}

TEST(KvRestore, RefusesAHugeLength) {
  auto snap = snapshot_of(2);
  set_word(snap, kHeaderBytes, UINT64_MAX / 2);
  expect_refused(snap, 4096);
  // A length whose byte count overflows to something small.
  set_word(snap, kHeaderBytes, (UINT64_MAX / (kPositionBytes / 2)) + 1);
  expect_refused(snap, 4096);
}

TEST(KvRestore, RefusesTruncatedAndTrailingBytes) {
  auto snap = snapshot_of(5);
  for (size_t cut : {size_t{1}, size_t{100}, snap.size() - kHeaderBytes, snap.size() - 10}) {
    expect_refused(std::vector<uint8_t>(snap.begin(), snap.end() - static_cast<ptrdiff_t>(cut)), 4096);
  }
  auto longer = snap;
  longer.push_back(0);
  expect_refused(longer, 4096);
}

TEST(KvRestore, RefusesAnotherFormatOrConfiguration) {
  const auto snap = snapshot_of(2);
  for (size_t word = 0; word < 8; ++word) {
    auto bad = snap;
    set_word(bad, word * 8, 77);
    expect_refused(bad, 4096);
  }
  EXPECT_EQ(KvState(config()).snapshot_positions(snap), (std::vector<int64_t>{2, 2}));
}

TEST(KvConfig, ParseAndValidate) {
  EXPECT_EQ(parse_kv_type("Q8_0"), GgmlType::Q8_0);
  EXPECT_EQ(parse_kv_type("f16"), GgmlType::F16);
  EXPECT_FALSE(parse_kv_type("q5_k").has_value());
  KvConfig c = config(GgmlType::Q8_0);
  c.head_dim_k = 16;  // a head is not whole blocks of 32
  EXPECT_THROW(validate(c), std::invalid_argument);
  KvConfig pages = config(GgmlType::F16, 48);  // not a power of two
  EXPECT_THROW(validate(pages), std::invalid_argument);
}

}  // namespace
}  // namespace pico::state
