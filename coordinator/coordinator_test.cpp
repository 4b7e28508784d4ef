#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cluster_config.hpp"
#include "engine.hpp"
#include "pipeline.hpp"

namespace pico::coordinator {
namespace {

std::vector<StageInfo> stages(std::initializer_list<std::pair<int, int>> ranges) {
  std::vector<StageInfo> out;
  int k = 0;
  for (auto [a, b] : ranges) {
    StageInfo s;
    s.name = "w" + std::to_string(k++);
    s.layers = {a, b};
    out.push_back(s);
  }
  return out;
}

std::string coverage_error(const std::vector<StageInfo>& s, int n_layer) {
  try {
    check_coverage(s, n_layer);
  } catch (const StageError& e) {
    return e.what();
  }
  return "";
}

TEST(Coverage, AcceptsATiling) {
  EXPECT_EQ(coverage_error(stages({{0, 16}}), 16), "");
  EXPECT_EQ(coverage_error(stages({{0, 5}, {5, 6}, {6, 16}}), 16), "");
}

TEST(Coverage, NamesGapsAndOverlaps) {
  EXPECT_NE(coverage_error(stages({{0, 5}, {4, 16}}), 16).find("w1 (layers 4-15) overlaps worker w0"),
            std::string::npos);
  EXPECT_NE(coverage_error(stages({{0, 5}, {6, 16}}), 16).find("no stage holds layers 5-5"), std::string::npos);
  EXPECT_NE(coverage_error(stages({{1, 16}}), 16).find("no stage holds layers 0-0"), std::string::npos);
  EXPECT_NE(coverage_error(stages({{0, 8}}), 16).find("no stage holds layers 8-15"), std::string::npos);
  EXPECT_NE(coverage_error({}, 16), "");
}

TEST(ClusterConfig, ReadsWorkersAndScheduler) {
  const auto path = std::filesystem::temp_directory_path() / "pico-cluster-config-test.toml";
  {
    std::ofstream out(path);
    out << "[scheduler]\nmicro_batch = 8\nactivations = \"f16\"\n\n"
           "[[worker]]\naddress = \"tcp://10.0.0.2:7701\"\nlayers = \"0-15\"\n\n"
           "[[worker]]\naddress = \"ipc:///tmp/w1\"\n";
  }
  const ClusterConfig c = load_cluster_config(path.string());
  ASSERT_EQ(c.workers.size(), 2u);
  EXPECT_EQ(c.workers[0].address, "tcp://10.0.0.2:7701");
  ASSERT_TRUE(c.workers[0].layers.has_value());
  EXPECT_EQ(c.workers[0].layers->first, 0);
  EXPECT_EQ(c.workers[0].layers->last, 16);
  EXPECT_FALSE(c.workers[1].layers.has_value());
  EXPECT_EQ(c.micro_batch.value_or(0), 8);
  EXPECT_EQ(c.activations.value_or(""), "f16");
  {
    std::ofstream out(path);
    out << "[[worker]]\nlayers = \"0-1\"\n";
  }
  EXPECT_THROW(load_cluster_config(path.string()), std::runtime_error);
  {
    std::ofstream out(path);
    out << "[[worker]\n";
  }
  EXPECT_THROW(load_cluster_config(path.string()), std::runtime_error);
  std::filesystem::remove(path);
}

TEST(LayerRange, ParsesInclusiveRanges) {
  const auto r = worker::parse_layers("0-15");
  EXPECT_EQ(r.first, 0);
  EXPECT_EQ(r.last, 16);
  EXPECT_THROW(worker::parse_layers("3-1"), std::invalid_argument);
  EXPECT_THROW(worker::parse_layers("a-b"), std::invalid_argument);
  EXPECT_THROW(worker::parse_layers("3"), std::invalid_argument);
  EXPECT_THROW(worker::parse_layers("1-2x"), std::invalid_argument);
}

// Stop strings: matched across pushes, never released, text that may begin one held back.
TEST(StopMatcher, HoldsBackAndCuts) {
  StopMatcher m({"</end>", "STOP"});
  EXPECT_EQ(m.push("Hello <"), "Hello ");
  EXPECT_EQ(m.push("/e"), "");
  EXPECT_EQ(m.push("x"), "</ex");  // no longer a prefix
  EXPECT_EQ(m.push(" ST"), " ");
  EXPECT_EQ(m.push("OP and more"), "");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(m.push("later"), "");
}

TEST(StopMatcher, FlushReleasesAPartialPrefix) {
  StopMatcher m({"abc"});
  EXPECT_EQ(m.push("xxab"), "xx");
  EXPECT_FALSE(m.matched());
  EXPECT_EQ(m.flush(), "ab");
  StopMatcher none({});
  EXPECT_EQ(none.push("anything"), "anything");
  StopMatcher empty({""});
  EXPECT_EQ(empty.push("text"), "text");
  EXPECT_FALSE(empty.matched());
}

TEST(StopMatcher, EarliestMatchWins) {
  StopMatcher m({"world", "lo w"});
  EXPECT_EQ(m.push("hello world"), "hel");
  EXPECT_TRUE(m.matched());
}

}  // namespace
}  // namespace pico::coordinator
