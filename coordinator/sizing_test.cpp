#include "sizing.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cluster_config.hpp"

namespace pico::coordinator {
namespace {

// A stage of layers [first, last) with 1000 bytes of KV per position, pages of 16.
StageInfo stage(const std::string& name, int32_t first, int32_t last, uint64_t budget) {
  StageInfo s;
  s.name = name;
  s.layers = {first, last};
  s.limits.max_rows = 4096;
  s.limits.max_positions = 8192;
  s.limits.max_sequences = 256;
  s.limits.state_budget_bytes = budget;
  s.limits.kv_bytes_per_position = 1000;
  s.limits.page_positions = 16;
  return s;
}

SizingRequest request(int64_t ctx, int parallel) {
  SizingRequest r;
  r.ctx = ctx;
  r.model_ctx = 2048;
  r.parallel = parallel;
  r.max_batch_tokens = 512;
  return r;
}

bool mentions(const std::vector<std::string>& notes, const std::string& part) {
  for (const auto& n : notes) {
    if (n.find(part) != std::string::npos) return true;
  }
  return false;
}

TEST(Sizing, KeepsWhatFits) {
  // 32 sequences of 1024 positions: 32 x 1024 x 1000 bytes.
  const Sizing s =
      size_for_stages({stage("a", 0, 3, 32 * 1024 * 1000), stage("b", 4, 7, 1ull << 40)}, request(1024, 32));
  EXPECT_EQ(s.ctx, 1024);
  EXPECT_EQ(s.parallel, 32);
  EXPECT_EQ(s.max_batch_tokens, 512);
  EXPECT_TRUE(s.notes.empty());
}

TEST(Sizing, TheModelsContextByDefault) {
  const Sizing s = size_for_stages({stage("a", 0, 7, 1ull << 40)}, request(0, 4));
  EXPECT_EQ(s.ctx, 2048);
}

TEST(Sizing, CutsParallelToTheSmallestBudgetNamingTheStage) {
  // Stage b holds 10.5 sequences of 1024 positions: 10.
  const Sizing s = size_for_stages({stage("a", 0, 3, 1ull << 40), stage("b", 4, 7, 10 * 1024 * 1000 + 500 * 1000)},
                                   request(1024, 32));
  EXPECT_EQ(s.parallel, 10);
  ASSERT_EQ(s.notes.size(), 1u);
  EXPECT_TRUE(mentions(s.notes, "stage b (layers 4-6)")) << s.notes[0];
  EXPECT_TRUE(mentions(s.notes, "parallel 32 cut to 10")) << s.notes[0];
  EXPECT_TRUE(mentions(s.notes, "1024000 per sequence")) << s.notes[0];
}

TEST(Sizing, CountsWholePagesAndFixedState) {
  // ctx 1000 takes 63 pages of 16 = 1008 positions; plus 24000 bytes of fixed state.
  StageInfo a = stage("a", 0, 7, 0);
  a.limits.state_bytes_per_sequence = 24000;
  const uint64_t one = 1008 * 1000 + 24000;
  EXPECT_EQ(sequence_bytes(a.limits, 1000), one);
  a.limits.state_budget_bytes = 3 * one;
  EXPECT_EQ(size_for_stages({a}, request(1000, 8)).parallel, 3);
  a.limits.state_budget_bytes = 3 * one - 1;
  EXPECT_EQ(size_for_stages({a}, request(1000, 8)).parallel, 2);
}

TEST(Sizing, RefusesWhenOneSequenceDoesNotFit) {
  // 100 pages of 16 positions fit: ctx 1600 at most.
  try {
    size_for_stages({stage("a", 0, 3, 1ull << 40), stage("tcp://w2:7702", 4, 7, 1600 * 1000 + 999)}, request(2048, 4));
    FAIL() << "sized a context that does not fit";
  } catch (const SizingError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("stage tcp://w2:7702 (layers 4-6)"), std::string::npos) << what;
    EXPECT_NE(what.find("2048000 bytes"), std::string::npos) << what;
    EXPECT_NE(what.find("budget of 1600999 bytes"), std::string::npos) << what;
    EXPECT_NE(what.find("--ctx 1600 or less"), std::string::npos) << what;
    EXPECT_NE(what.find("--kv-memory 2048000"), std::string::npos) << what;
  }
  // The same stage with ctx 1600 holds one sequence.
  EXPECT_EQ(size_for_stages({stage("a", 0, 3, 1600 * 1000 + 999)}, request(1600, 4)).parallel, 1);
}

TEST(Sizing, CutsCtxSequencesAndRowsToEveryStagesLimits) {
  StageInfo a = stage("a", 0, 3, 1ull << 40), b = stage("b", 4, 7, 1ull << 40);
  a.limits.max_positions = 4096;
  b.limits.max_positions = 1000;
  a.limits.max_sequences = 12;
  b.limits.max_rows = 100;
  const Sizing s = size_for_stages({a, b}, request(8192, 32));
  EXPECT_EQ(s.ctx, 1000);
  EXPECT_EQ(s.parallel, 12);
  EXPECT_EQ(s.max_batch_tokens, 100);
  EXPECT_TRUE(mentions(s.notes, "ctx 8192 cut to 4096: stage a"));
  EXPECT_TRUE(mentions(s.notes, "ctx 4096 cut to 1000: stage b"));
  EXPECT_TRUE(mentions(s.notes, "parallel 32 cut to 12: stage a"));
  EXPECT_TRUE(mentions(s.notes, "max batch tokens 512 cut to 100: stage b"));
}

TEST(Sizing, TheBudgetIsCheckedAtTheCutContext) {
  // At ctx 8192 one sequence would not fit; stage b's --ctx 512 makes 4 fit.
  StageInfo a = stage("a", 0, 3, 4 * 512 * 1000), b = stage("b", 4, 7, 1ull << 40);
  b.limits.max_positions = 512;
  const Sizing s = size_for_stages({a, b}, request(8192, 32));
  EXPECT_EQ(s.ctx, 512);
  EXPECT_EQ(s.parallel, 4);
}

TEST(Sizing, CoordinatorMessagesFitTheLargestAnswer) {
  // 512 rows of 32000 F32 logits, or a snapshot of 4096 positions of 100 KB.
  EXPECT_GE(coordinator_max_message_bytes(512, 32000, 4096, 1000), 512ull * 32000 * 4);
  EXPECT_LT(coordinator_max_message_bytes(512, 32000, 4096, 1000), 512ull * 32000 * 4 + (4u << 20));
  EXPECT_GE(coordinator_max_message_bytes(8, 32000, 4096, 100000), 4096ull * 100000);
}

// A stage back after a restart must still hold what the coordinator serves: the same
// or larger limits pass (a budget a little different from before, as MemAvailable
// moves, too), each smaller one is named.
TEST(Sizing, ARejoiningStageMustStillHoldWhatWasSized) {
  const Sizing sized = size_for_stages({stage("b", 4, 7, 10 * 1024 * 1000 + 500 * 1000)}, request(1024, 32));
  ASSERT_EQ(sized.parallel, 10);
  EXPECT_EQ(rejoin_shortfall(stage("b", 4, 7, 10 * 1024 * 1000 + 100 * 1000), sized), "");
  EXPECT_EQ(rejoin_shortfall(stage("b", 4, 7, 1ull << 40), sized), "");

  const std::string budget = rejoin_shortfall(stage("b", 4, 7, 9 * 1024 * 1000), sized);
  EXPECT_NE(budget.find("parallel 10 cut to 9"), std::string::npos) << budget;
  StageInfo fewer = stage("b", 4, 7, 1ull << 40);
  fewer.limits.max_sequences = 4;
  EXPECT_NE(rejoin_shortfall(fewer, sized).find("--max-sequences"), std::string::npos);
  StageInfo shorter = stage("b", 4, 7, 1ull << 40);
  shorter.limits.max_positions = 512;
  EXPECT_NE(rejoin_shortfall(shorter, sized).find("--ctx"), std::string::npos);
  StageInfo narrower = stage("b", 4, 7, 1ull << 40);
  narrower.limits.max_rows = 64;
  EXPECT_NE(rejoin_shortfall(narrower, sized).find("--max-rows"), std::string::npos);
  const std::string none = rejoin_shortfall(stage("b", 4, 7, 1000), sized);
  EXPECT_NE(none.find("more than its budget"), std::string::npos) << none;
}

TEST(ClusterConfig, ReadsCtxAndParallel) {
  const auto path = std::filesystem::temp_directory_path() / "pico-sizing-config-test.toml";
  auto load = [&](const std::string& text) {
    std::ofstream(path) << text;
    return load_cluster_config(path.string());
  };
  const ClusterConfig c = load("[scheduler]\nctx = 3000\nparallel = 7\n");
  EXPECT_EQ(c.ctx.value_or(0), 3000);
  EXPECT_EQ(c.parallel.value_or(0), 7);
  EXPECT_FALSE(load("[scheduler]\nmicro_batch = 8\n").ctx.has_value());
  for (const char* bad :
       {"ctx = 0", "ctx = -5", "ctx = \"big\"", "ctx = 1.5", "parallel = 0", "parallel = 100000", "parallel = true"}) {
    EXPECT_THROW(load(std::string("[scheduler]\n") + bad + "\n"), std::runtime_error) << bad;
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace pico::coordinator
