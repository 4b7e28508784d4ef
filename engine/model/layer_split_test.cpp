#include "model/layer_split.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>

namespace pico::model {
namespace {

uint64_t largest_stage(const std::vector<uint64_t>& layers, uint64_t head, const std::vector<LayerRange>& ranges) {
  uint64_t worst = 0;
  for (size_t s = 0; s < ranges.size(); ++s) {
    uint64_t load = s + 1 == ranges.size() ? head : 0;
    for (int32_t i = ranges[s].first; i < ranges[s].last; ++i) load += layers[static_cast<size_t>(i)];
    worst = std::max(worst, load);
  }
  return worst;
}

// Every way to cut n layers into `stages` contiguous non-empty ranges: the smallest
// largest stage, by brute force.
uint64_t brute_force_best(const std::vector<uint64_t>& layers, uint64_t head, int stages) {
  const auto n = static_cast<int>(layers.size());
  uint64_t best = UINT64_MAX;
  std::vector<int> ends(static_cast<size_t>(stages));
  const auto recurse = [&](auto&& self, int s, int first) -> void {
    if (s == stages - 1) {
      std::vector<LayerRange> ranges;
      int begin = 0;
      for (int k = 0; k < stages - 1; ++k) {
        ranges.push_back({begin, ends[static_cast<size_t>(k)]});
        begin = ends[static_cast<size_t>(k)];
      }
      ranges.push_back({begin, n});
      best = std::min(best, largest_stage(layers, head, ranges));
      return;
    }
    for (int end = first + 1; end <= n - (stages - 1 - s); ++end) {
      ends[static_cast<size_t>(s)] = end;
      self(self, s + 1, end);
    }
  };
  recurse(recurse, 0, 0);
  return best;
}

TEST(LayerSplit, EqualLayersWithoutHeadSplitEvenly) {
  const std::vector<uint64_t> layers(12, 100);
  const auto ranges = balanced_layer_split(layers, 0, 2);
  ASSERT_EQ(ranges.size(), 2u);
  EXPECT_EQ(format_layer_ranges(ranges), "0-5,6-11");
  EXPECT_EQ(format_layer_ranges(balanced_layer_split(layers, 0, 3)), "0-3,4-7,8-11");
}

TEST(LayerSplit, TheHeadMovesLayersToEarlierStages) {
  // 12 layers of 100 bytes and a head of 160 (the bench-pipeline model's proportions):
  // 7 + 5 layers give 700 / 660 where 6 + 6 give 600 / 760.
  const std::vector<uint64_t> layers(12, 100);
  EXPECT_EQ(format_layer_ranges(balanced_layer_split(layers, 160, 2)), "0-6,7-11");
}

TEST(LayerSplit, MatchesBruteForceOnUnevenLayers) {
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    std::vector<uint64_t> layers(3 + seed % 8);
    for (size_t i = 0; i < layers.size(); ++i) layers[i] = 1 + (seed * 2654435761u + static_cast<uint32_t>(i) * 40503u) % 97;
    const uint64_t head = seed % 3 == 0 ? 0 : (seed * 7919u) % 300;
    for (int stages = 1; stages <= static_cast<int>(layers.size()); ++stages) {
      const auto ranges = balanced_layer_split(layers, head, stages);
      ASSERT_EQ(ranges.size(), static_cast<size_t>(stages));
      EXPECT_EQ(ranges.front().first, 0);
      EXPECT_EQ(ranges.back().last, static_cast<int32_t>(layers.size()));
      for (size_t s = 0; s < ranges.size(); ++s) {
        EXPECT_LT(ranges[s].first, ranges[s].last);
        if (s > 0) {
          EXPECT_EQ(ranges[s].first, ranges[s - 1].last);
        }
      }
      EXPECT_EQ(largest_stage(layers, head, ranges), brute_force_best(layers, head, stages))
          << "seed " << seed << ", " << stages << " stages: " << format_layer_ranges(ranges);
    }
  }
}

TEST(LayerSplit, RefusesImpossibleStageCounts) {
  const std::vector<uint64_t> layers(4, 1);
  EXPECT_THROW(balanced_layer_split(layers, 0, 0), std::invalid_argument);
  EXPECT_THROW(balanced_layer_split(layers, 0, 5), std::invalid_argument);
}

}  // namespace
}  // namespace pico::model
