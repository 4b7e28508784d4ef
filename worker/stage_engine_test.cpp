// StageEngine's limits: each refused before anything changes, the stage as it was.
#include "stage_engine.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "synthetic/synthetic_model.hpp"

namespace pico::worker {
namespace {

class StageLimitsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::filesystem::temp_directory_path() / ("pico-stage-limits-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    model_ = (dir_ / "m.gguf").string();
    synthetic::SyntheticSpec spec;
    spec.n_layers = 2;
    spec.n_ctx_train = 1024;
    spec.node_modules = PICO_NODE_MODULES_DIR;
    synthetic::write_synthetic_model(spec, model_);
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }

  static StageEngine engine(StageLimitOptions limits) {
    if (!limits.kv_memory) limits.kv_memory = uint64_t{1} << 30;
    return StageEngine(model_, std::nullopt, 1, limits);
  }
  // Positions [from, to) of seq_id.
  static std::vector<model::BatchToken> tokens(int32_t seq_id, int32_t from, int32_t to) {
    std::vector<model::BatchToken> b;
    for (int32_t p = from; p < to; ++p) b.push_back({seq_id, p, 1 + p % 50, p + 1 == to});
    return b;
  }
  static std::vector<model::BatchToken> join(std::vector<model::BatchToken> a,
                                             const std::vector<model::BatchToken>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }
  // What the engine holds, to compare before and after a refusal.
  static std::vector<std::vector<uint8_t>> held(const StageEngine& e, std::initializer_list<int32_t> seqs) {
    std::vector<std::vector<uint8_t>> out;
    for (int32_t s : seqs) {
      auto snap = e.snapshot(s);
      out.push_back(snap ? snap->bytes : std::vector<uint8_t>{});
    }
    return out;
  }
  static void expect_limit(const std::function<void()>& call, const std::string& text) {
    try {
      call();
      ADD_FAILURE() << "not refused; wanted: " << text;
    } catch (const LimitError& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  }

  static inline std::filesystem::path dir_;
  static inline std::string model_;
};

TEST_F(StageLimitsTest, ResolvesTheDefaults) {
  StageLimitOptions o;
  o.kv_memory = 12345678;
  StageEngine e(model_, std::nullopt, 1, o);
  const StageLimits& l = e.limits();
  EXPECT_EQ(l.max_rows, 4096);
  EXPECT_EQ(l.max_positions, 1024);  // the model's context
  EXPECT_EQ(l.max_sequences, 256);
  EXPECT_EQ(l.state_budget_bytes, 12345678u);
  // 2 layers x (K + V) x 2 KV heads x 16 dims x 2 bytes (F16).
  EXPECT_EQ(l.kv_bytes_per_position, 2u * 2 * 2 * 16 * 2);
  EXPECT_EQ(l.page_positions, 256);
  EXPECT_GE(l.max_message_bytes, 4096u * 64 * 4);  // max_rows hidden states of n_embd F32
  // The default budget: from the machine's memory, less a margin.
  StageEngine d(model_, std::nullopt, 1, {});
  EXPECT_GT(d.memory_budget().available, 0u);
  EXPECT_EQ(d.limits().state_budget_bytes, d.memory_budget().budget);
  EXPECT_LT(d.limits().state_budget_bytes, d.memory_budget().available);
  const MemoryBudget& m = d.memory_budget();
  EXPECT_EQ(m.margin, m.available / 10);
  EXPECT_EQ(m.budget, m.available - m.weights - m.margin);
  // Every stage's weight bytes, resident or not: all tensors for the whole model; the
  // last layer's stage reads neither layer 0 nor the embeddings (the model has an
  // output matrix).
  uint64_t all = 0, last_stage = 0;
  for (const auto& t : d.file().tensors()) {
    all += t.bytes;
    if (t.name.rfind("blk.0.", 0) != 0 && t.name.rfind("token_embd.", 0) != 0) last_stage += t.bytes;
  }
  EXPECT_EQ(m.weights, all);
  EXPECT_EQ(default_state_budget(d.file(), {1, 2}, 2).weights, last_stage);
  EXPECT_LT(last_stage, all);
}

TEST_F(StageLimitsTest, RefusesTooManyRows) {
  StageLimitOptions o;
  o.max_rows = 4;
  StageEngine e = engine(o);
  EXPECT_NO_THROW(e.forward(tokens(1, 0, 4), nullptr));
  const auto before = held(e, {1, 2});
  expect_limit([&] { e.forward(join(tokens(1, 4, 6), tokens(2, 0, 3)), nullptr); },
               "forward of 5 rows exceeds --max-rows 4");
  EXPECT_EQ(held(e, {1, 2}), before);
  EXPECT_EQ(e.sequences(), 1u);
}

TEST_F(StageLimitsTest, RefusesPositionsBeyondTheContext) {
  StageLimitOptions o;
  o.ctx = 8;
  StageEngine e = engine(o);
  e.forward(tokens(1, 0, 6), nullptr);
  const auto before = held(e, {1, 2});
  expect_limit([&] { e.forward(join(tokens(2, 0, 2), tokens(1, 6, 9)), nullptr); },
               "sequence 1: position 8 exceeds --ctx 8");
  EXPECT_EQ(held(e, {1, 2}), before);
  EXPECT_NO_THROW(e.forward(tokens(1, 6, 8), nullptr));  // up to the last position
  EXPECT_EQ(e.snapshot(1)->n_pos, 8);
}

TEST_F(StageLimitsTest, RefusesMoreSequences) {
  StageLimitOptions o;
  o.max_sequences = 2;
  StageEngine e = engine(o);
  e.forward(join(tokens(1, 0, 3), tokens(2, 0, 3)), nullptr);
  const auto before = held(e, {1, 2, 3});
  expect_limit([&] { e.forward(join(tokens(1, 3, 4), tokens(3, 0, 1)), nullptr); },
               "forward would hold 3 sequences (1 new), exceeding --max-sequences 2");
  EXPECT_EQ(held(e, {1, 2, 3}), before);
  EXPECT_EQ(e.sequences(), 2u);
  e.close(2);
  EXPECT_NO_THROW(e.forward(join(tokens(1, 3, 4), tokens(3, 0, 1)), nullptr));
}

TEST_F(StageLimitsTest, RefusesWhatTheBudgetCannotHoldAsAWhole) {
  StageLimitOptions o;
  o.kv_memory = 2 * 256 * (2 * 2 * 2 * 16 * 2);  // two pages of 256 positions
  StageEngine e = engine(o);
  e.forward(tokens(1, 0, 256), nullptr);
  e.forward(tokens(2, 0, 200), nullptr);
  EXPECT_EQ(e.kv_bytes(), o.kv_memory);
  const auto before = held(e, {1, 2});
  // Sequence 2 rewinds to 10 (still one page) while sequence 1 needs a second page: the
  // batch is refused before the rewind, which must not happen either.
  expect_limit([&] { e.forward(join(tokens(2, 10, 11), tokens(1, 256, 257)), nullptr); },
               "would hold 196608 bytes of KV, exceeding --kv-memory 131072");
  EXPECT_EQ(held(e, {1, 2}), before);
  EXPECT_EQ(e.snapshot(2)->n_pos, 200);
  // Within its pages a sequence still grows, and a closed one makes room.
  EXPECT_NO_THROW(e.forward(tokens(2, 200, 256), nullptr));
  e.close(2);
  EXPECT_NO_THROW(e.forward(tokens(1, 256, 300), nullptr));
}

TEST_F(StageLimitsTest, RestoreIsCheckedAgainstTheLimits) {
  StageEngine source = engine({});
  source.forward(tokens(1, 0, 300), nullptr);
  const auto snap = source.snapshot(1)->bytes;

  StageLimitOptions small_ctx;
  small_ctx.ctx = 299;
  StageEngine a = engine(small_ctx);
  expect_limit([&] { a.restore(5, snap); }, "restore of 300 positions exceeds --ctx 299");
  EXPECT_EQ(a.sequences(), 0u);

  StageLimitOptions one;
  one.max_sequences = 1;
  StageEngine b = engine(one);
  b.forward(tokens(7, 0, 3), nullptr);
  const auto before = held(b, {7});
  expect_limit([&] { b.restore(5, snap); }, "restore would hold 2 sequences, exceeding --max-sequences 1");
  EXPECT_NO_THROW(b.restore(7, snap));  // replacing the one it holds
  EXPECT_EQ(b.snapshot(7)->n_pos, 300);
  b.restore(7, before[0]);
  EXPECT_EQ(held(b, {7}), before);

  StageLimitOptions budget;
  budget.kv_memory = 2 * 256 * (2 * 2 * 2 * 16 * 2) - 1;  // not quite the two pages of 300 positions
  StageEngine c = engine(budget);
  expect_limit([&] { c.restore(5, snap); }, "restore of 300 positions would hold 131072 bytes of KV");
  EXPECT_EQ(c.sequences(), 0u);

  auto lying = snap;
  lying.pop_back();
  StageEngine d = engine({});
  EXPECT_THROW(d.restore(5, lying), std::invalid_argument);
  EXPECT_EQ(d.sequences(), 0u);
  EXPECT_NO_THROW(d.restore(5, snap));
  EXPECT_EQ(held(d, {5}), held(source, {1}));
}

TEST(ByteSize, ParsesSuffixes) {
  EXPECT_EQ(parse_byte_size("1000000"), 1000000u);
  EXPECT_EQ(parse_byte_size("512M"), 512ull << 20);
  EXPECT_EQ(parse_byte_size("4G"), 4ull << 30);
  EXPECT_EQ(parse_byte_size("4g"), 4ull << 30);
  EXPECT_EQ(parse_byte_size("1.5GiB"), 3ull << 29);
  EXPECT_EQ(parse_byte_size("64KB"), 64ull << 10);
  EXPECT_EQ(parse_byte_size("2T"), 2ull << 40);
  for (const char* bad : {"", "-1G", "G", "12X", "1e400", "4 G", "nan", "0x10"}) {
    EXPECT_THROW(parse_byte_size(bad), std::invalid_argument) << bad;
  }
}

}  // namespace
}  // namespace pico::worker
