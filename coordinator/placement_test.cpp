#include "placement.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <random>

namespace pico::coordinator {
namespace {

// A model of `layers` equal layers: 100 bytes of weights each, no KV, no state.
PlacementProblem equal_layers(int layers) {
  PlacementProblem p;
  p.layers.assign(static_cast<size_t>(layers), LayerNeeds{100, 0, 0});
  p.ctx = 1;
  p.parallel = 1;
  p.input_bytes_per_token = 0;
  p.hidden_bytes_per_token = 0;
  p.logits_bytes_per_token = 0;
  return p;
}

void add_worker(PlacementProblem& p, const std::string& name, double decode, double batch_per_token,
                uint64_t memory, double latency = 0.001) {
  WorkerMeasures w;
  w.name = name;
  w.decode_seconds.assign(p.layers.size(), decode);
  w.batch_seconds_per_token.assign(p.layers.size(), {batch_per_token});
  w.memory_bytes = memory;
  p.workers.push_back(w);
  p.coordinator_links.push_back({latency, 1e9});
}

struct Expected {
  size_t worker;
  int first, last;
};
void expect_stages(const Placement& placement, const std::vector<Expected>& expected) {
  ASSERT_EQ(placement.stages.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(placement.stages[i].worker, expected[i].worker) << "stage " << i;
    EXPECT_EQ(placement.stages[i].layers.first, expected[i].first) << "stage " << i;
    EXPECT_EQ(placement.stages[i].layers.last, expected[i].last) << "stage " << i;
  }
}

TEST(Placement, OneWorkerThatHoldsEverythingBeatsAnExtraHop) {
  PlacementProblem p = equal_layers(4);
  add_worker(p, "a", 0.01, 0.001, 1000);
  add_worker(p, "b", 0.011, 0.001, 1000);
  const Placement placement = place(p);
  ASSERT_EQ(placement.stages.size(), 1u);
  EXPECT_EQ(placement.stages[0].worker, 0u);
  EXPECT_EQ(placement.stages[0].layers.last, 4);
  // in 1 ms + 4 x 10 ms + out 1 ms
  EXPECT_NEAR(placement.step_seconds, 0.042, 1e-12);
  EXPECT_NEAR(placement.tokens_per_second, 1 / 0.042, 1e-9);
  // With b: alone 46 ms; one layer on it beside three on a, 1 + 30 + 1 + 11 + 1 = 44 ms.
  EXPECT_NE(placement.excluded[1].find("predicts 22.73 tok/s, the chosen one 23.81"), std::string::npos)
      << placement.excluded[1];
  EXPECT_TRUE(placement.excluded[0].empty());
}

TEST(Placement, MemorySplitsTheLayersAndCountsTheHeadAndTheState) {
  PlacementProblem p = equal_layers(4);
  p.last_stage_bytes = 50;  // the head
  p.layers.assign(4, LayerNeeds{100, 2, 10});
  p.ctx = 5;
  p.page_positions = 4;  // 5 positions take 2 pages: 8 positions
  p.parallel = 3;
  // a layer with its state: 100 + 3 x (2 x 8 + 10) = 178 bytes
  EXPECT_EQ(stage_memory_bytes(p, {0, 1}), 178u);
  EXPECT_EQ(stage_memory_bytes(p, {2, 4}), 2 * 178u + 50);
  add_worker(p, "fast", 0.01, 0.001, 2 * 178);        // two layers, not the head
  add_worker(p, "slow", 0.02, 0.002, 2 * 178 + 50);   // two layers and the head
  const Placement placement = place(p);
  expect_stages(placement, {{0, 0, 2}, {1, 2, 4}});
  EXPECT_EQ(placement.stages[1].memory_bytes, 2 * 178u + 50);
  p.workers[1].memory_bytes -= 1;
  EXPECT_THROW(place(p), PlacementError);
}

TEST(Placement, TheFasterWorkerTakesTheLayersItsMemoryHolds) {
  PlacementProblem p = equal_layers(6);
  add_worker(p, "slow", 0.03, 0.003, 600);
  add_worker(p, "fast", 0.01, 0.001, 400);
  // fast holds 4 layers; with slow after it (1 ms more) 4 x 10 + 2 x 30 = 100 ms; slow
  // first is the same sum, and either order has the same hops: the fastest chain puts
  // 4 layers on `fast`.
  const Placement placement = place(p);
  ASSERT_EQ(placement.stages.size(), 2u);
  for (const PlacedStage& s : placement.stages) {
    EXPECT_EQ(s.layers.last - s.layers.first, s.worker == 1 ? 4 : 2);
  }
  EXPECT_NEAR(placement.step_seconds, 0.001 + 0.04 + 0.06 + 0.001 + 0.001, 1e-12);
}

TEST(Placement, TheObjectiveSetsTheBatchAndSoWhoIsFaster) {
  // A CPU-like worker: fast at one token, slow per token of a batch; a GPU-like one:
  // slower at one token, fast in a batch. Each holds the whole model.
  PlacementProblem p = equal_layers(4);
  add_worker(p, "cpu", 0.005, 0.004, 1000);
  add_worker(p, "gpu", 0.010, 0.0001, 1000);
  p.objective = Objective::latency;
  Placement latency = place(p);
  expect_stages(latency, {{0, 0, 4}});
  EXPECT_EQ(latency.batch, 1);
  p.objective = Objective::throughput;
  p.concurrency = 32;  // cpu: 5 ms + 31/63 of the way to 64 x 4 ms, 128 ms a layer; gpu: 10 ms (64 x 0.1 ms is less)
  Placement throughput = place(p);
  expect_stages(throughput, {{1, 0, 4}});
  EXPECT_EQ(throughput.batch, 32);
  EXPECT_NEAR(throughput.tokens_per_second, 32 / (0.001 + 4 * 0.010 + 0.001), 1e-9);
}

TEST(Placement, LinksChooseTheOrder) {
  PlacementProblem p = equal_layers(3);
  for (const char* name : {"a", "b", "c"}) add_worker(p, name, 0.01, 0.001, 100);  // one layer each
  p.hidden_bytes_per_token = 1000;
  p.worker_links.assign(3, std::vector<std::optional<LinkMeasure>>(3, LinkMeasure{0.050, 1e9}));
  p.worker_links[2][0] = LinkMeasure{0.001, 1e9};  // c -> a is the only fast hop, then a -> b
  p.worker_links[0][1] = LinkMeasure{0.001, 1e9};
  const Placement placement = place(p);
  expect_stages(placement, {{2, 0, 1}, {0, 1, 2}, {1, 2, 3}});
  EXPECT_NEAR(placement.stages[0].send_seconds, 0.001 + 1000 / 1e9, 1e-12);
}

TEST(Placement, AWorkerThatHoldsNoLayerIsToldWhy) {
  PlacementProblem p = equal_layers(2);
  add_worker(p, "big", 0.01, 0.001, 1000);
  add_worker(p, "tiny", 0.001, 0.0001, 99);
  const Placement placement = place(p);
  expect_stages(placement, {{0, 0, 2}});
  EXPECT_NE(placement.excluded[1].find("holds no layer"), std::string::npos) << placement.excluded[1];
  EXPECT_NE(placement.excluded[1].find("100 bytes"), std::string::npos) << placement.excluded[1];
}

TEST(Placement, NothingFitsNamesEveryWorker) {
  PlacementProblem p = equal_layers(4);
  add_worker(p, "w0", 0.01, 0.001, 150);
  add_worker(p, "w1", 0.01, 0.001, 50);
  try {
    place(p);
    FAIL() << "expected PlacementError";
  } catch (const PlacementError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("w0"), std::string::npos) << what;
    EXPECT_NE(what.find("w1 offers 0 MiB, not even one layer"), std::string::npos) << what;
  }
}

TEST(Placement, MalformedProblemsAreRefused) {
  PlacementProblem p = equal_layers(2);
  EXPECT_THROW(place(p), std::invalid_argument);  // no worker
  add_worker(p, "a", 0.01, 0.001, 1000);
  p.workers[0].decode_seconds.pop_back();
  EXPECT_THROW(place(p), std::invalid_argument);
  p.workers[0].decode_seconds.push_back(-1);
  EXPECT_THROW(place(p), std::invalid_argument);
  p.workers[0].decode_seconds.back() = 0.01;
  p.coordinator_links[0].bytes_per_second = 0;
  EXPECT_THROW(place(p), std::invalid_argument);
  EXPECT_THROW(parse_objective("fastest"), std::invalid_argument);
  EXPECT_EQ(parse_objective("throughput"), Objective::throughput);
}

// The reference: every ordered subset of workers and every split of the layers into
// that many non-empty ranges, costed directly from the definition. each (optional):
// called with every chain that fits and its step time.
using ChainVisitor = std::function<void(const std::vector<std::pair<size_t, model::LayerRange>>&, double)>;
double brute_force(const PlacementProblem& p, bool keep_order, const ChainVisitor& each = {}) {
  const size_t W = p.workers.size();
  const int L = static_cast<int>(p.layers.size());
  const int batch = p.objective == Objective::throughput ? p.concurrency : 1;
  // The definition: the points (1, one token's time) and (b, b x the time per token of
  // batch b) for each measured b; straight lines between neighbours, the largest
  // batch's time per token past it (never below one token's time).
  const auto at_batch = [&](size_t w, double decode, const std::vector<double>& per_token) {
    const std::vector<int>& measured = p.workers[w].profile_batches;
    std::vector<std::pair<double, double>> points{{1.0, decode}};
    for (size_t b = 0; b < measured.size(); ++b) points.emplace_back(measured[b], measured[b] * per_token[b]);
    if (batch >= points.back().first) return std::max(decode, batch * points.back().second / points.back().first);
    size_t upper = 1;
    while (points[upper].first < batch) ++upper;
    const auto [x0, y0] = points[upper - 1];
    const auto [x1, y1] = points[upper];
    return std::max(decode, y0 + (y1 - y0) * (batch - x0) / (x1 - x0));
  };
  const auto layer_time = [&](size_t w, int l) {
    return at_batch(w, p.workers[w].decode_seconds[l], p.workers[w].batch_seconds_per_token[l]);
  };
  const auto link = [&](size_t a, size_t b) -> LinkMeasure {
    if (p.worker_links.size() > a && p.worker_links[a].size() > b && p.worker_links[a][b]) return *p.worker_links[a][b];
    return {std::max(p.coordinator_links[a].latency_seconds, p.coordinator_links[b].latency_seconds),
            std::min(p.coordinator_links[a].bytes_per_second, p.coordinator_links[b].bytes_per_second)};
  };
  const auto send = [&](const LinkMeasure& l, uint64_t bytes) {
    return l.latency_seconds + static_cast<double>(bytes) * batch / l.bytes_per_second;
  };
  double best = std::numeric_limits<double>::infinity();
  std::vector<size_t> order;
  std::vector<bool> taken(W, false);
  // cuts[i]: where stage i ends
  std::function<void(int, double)> split;
  std::function<void()> choose;
  std::vector<int> cuts;
  split = [&](int from, double cost) {
    const size_t s = cuts.size();
    const size_t w = order[s];
    for (int to = from + 1; to <= L; ++to) {
      const bool last = s + 1 == order.size();
      if (last != (to == L)) continue;
      if (stage_memory_bytes(p, {from, to}) > p.workers[w].memory_bytes) continue;
      const auto& fixed = p.workers[w].fixed_layers;
      if (fixed && (fixed->first != from || fixed->last != to)) continue;
      double c = cost;
      for (int l = from; l < to; ++l) c += layer_time(w, l);
      if (last) {
        c += at_batch(w, p.workers[w].head_decode_seconds, p.workers[w].head_batch_seconds_per_token);
        c += send(p.coordinator_links[w], p.logits_bytes_per_token);
        best = std::min(best, c);
        if (each) {
          std::vector<std::pair<size_t, model::LayerRange>> chain;
          int first = 0;
          for (size_t k = 0; k < order.size(); ++k) {
            const int end = k < cuts.size() ? cuts[k] : L;
            chain.emplace_back(order[k], model::LayerRange{first, end});
            first = end;
          }
          each(chain, c);
        }
      } else {
        c += send(link(w, order[s + 1]), p.hidden_bytes_per_token);
        cuts.push_back(to);
        split(to, c);
        cuts.pop_back();
      }
    }
  };
  choose = [&] {
    if (!order.empty()) split(0, send(p.coordinator_links[order[0]], p.input_bytes_per_token));
    for (size_t w = 0; w < W; ++w) {
      if (taken[w] || (keep_order && !order.empty() && w < order.back())) continue;
      taken[w] = true;
      order.push_back(w);
      choose();
      order.pop_back();
      taken[w] = false;
    }
  };
  choose();
  return best;
}

TEST(Placement, MatchesEveryOrderedSplitOnRandomClusters) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> time(0.001, 0.02), latency(0.0, 0.01), bandwidth(1e6, 1e9);
  std::uniform_int_distribution<int> layer_count(1, 7), worker_count(1, 4);
  std::uniform_int_distribution<uint64_t> weights(10, 100), memory(50, 500);
  int checked = 0;
  for (int trial = 0; trial < 300; ++trial) {
    PlacementProblem p;
    const int L = layer_count(rng);
    for (int l = 0; l < L; ++l) p.layers.push_back({weights(rng), weights(rng) % 3, weights(rng) % 5});
    p.first_stage_bytes = weights(rng);
    p.last_stage_bytes = weights(rng);
    p.ctx = 1 + static_cast<int64_t>(weights(rng) % 4);
    p.page_positions = 2;
    p.parallel = 1 + static_cast<int>(weights(rng) % 2);
    p.hidden_bytes_per_token = weights(rng) * 1000;
    p.logits_bytes_per_token = weights(rng) * 100;
    p.objective = trial % 2 ? Objective::throughput : Objective::latency;
    p.concurrency = 1 + trial % 16;
    const int W = worker_count(rng);
    for (int w = 0; w < W; ++w) {
      WorkerMeasures m;
      m.name = "w" + std::to_string(w);
      // Some concurrencies past the largest measured batch, some between measured ones.
      m.profile_batches = trial % 4 == 0 ? std::vector<int>{8} : std::vector<int>{2, 4, 8, 16, 32, 64};
      const auto per_batch = [&] {
        std::vector<double> out;
        for (size_t b = 0; b < m.profile_batches.size(); ++b) out.push_back(time(rng) / 10);
        return out;
      };
      for (int l = 0; l < L; ++l) {
        m.decode_seconds.push_back(time(rng));
        m.batch_seconds_per_token.push_back(per_batch());
      }
      m.head_decode_seconds = time(rng);
      m.head_batch_seconds_per_token = per_batch();
      m.memory_bytes = memory(rng) * static_cast<uint64_t>(L);
      p.workers.push_back(m);
      p.coordinator_links.push_back({latency(rng), bandwidth(rng)});
    }
    if (trial % 5 == 1) {
      // The last worker started with fixed layers.
      const int first = std::uniform_int_distribution<int>(0, L - 1)(rng);
      p.workers.back().fixed_layers = model::LayerRange{first, std::uniform_int_distribution<int>(first + 1, L)(rng)};
    }
    if (trial % 3 == 0) {
      p.worker_links.assign(static_cast<size_t>(W), std::vector<std::optional<LinkMeasure>>(static_cast<size_t>(W)));
      for (auto& row : p.worker_links) {
        for (auto& link : row) {
          if (rng() % 2) link = LinkMeasure{latency(rng), bandwidth(rng)};
        }
      }
    }
    for (const bool keep_order : {false, true}) {
      p.exhaustive_order_limit = keep_order ? 0 : 8;
      const double expected = brute_force(p, keep_order);
      if (expected == std::numeric_limits<double>::infinity()) {
        EXPECT_THROW(place(p), PlacementError) << "trial " << trial;
        continue;
      }
      const Placement placement = place(p);
      EXPECT_EQ(placement.every_order, !keep_order);
      EXPECT_NEAR(placement.step_seconds, expected, 1e-12) << "trial " << trial << (keep_order ? " in order" : "");
      // The stages it reports add up to the step and tile the layers.
      double sum = 0;
      int next = 0;
      for (const PlacedStage& s : placement.stages) {
        EXPECT_EQ(s.layers.first, next);
        next = s.layers.last;
        sum += s.compute_seconds + s.send_seconds;
        EXPECT_LE(s.memory_bytes, p.workers[s.worker].memory_bytes);
      }
      EXPECT_EQ(next, L);
      const double in = p.coordinator_links[placement.stages[0].worker].latency_seconds +
                        static_cast<double>(p.input_bytes_per_token) * placement.batch /
                            p.coordinator_links[placement.stages[0].worker].bytes_per_second;
      EXPECT_NEAR(sum + in, placement.step_seconds, 1e-12);
      ++checked;
    }
  }
  EXPECT_GT(checked, 300);  // most random clusters have a placement
}

// evaluate_placement costs a given chain as the definition does: every chain that fits
// of random clusters, against the brute force's own sum.
TEST(Placement, EvaluatesEveryChainAsTheDefinition) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> time(0.001, 0.02), latency(0.0, 0.01), bandwidth(1e6, 1e9);
  size_t chains = 0;
  for (int trial = 0; trial < 60; ++trial) {
    PlacementProblem p;
    const int L = 1 + trial % 5;
    for (int l = 0; l < L; ++l) p.layers.push_back({10 + rng() % 90, rng() % 3, rng() % 5});
    p.first_stage_bytes = rng() % 50;
    p.last_stage_bytes = rng() % 50;
    p.hidden_bytes_per_token = 1000 + rng() % 100000;
    p.logits_bytes_per_token = 100 + rng() % 10000;
    p.objective = trial % 2 ? Objective::throughput : Objective::latency;
    p.concurrency = 1 + trial % 16;
    p.ctx = 1;
    const int W = 1 + trial % 3;
    for (int w = 0; w < W; ++w) {
      WorkerMeasures m;
      m.name = "w" + std::to_string(w);
      m.profile_batches = {2, 8, 64};
      for (int l = 0; l < L; ++l) {
        m.decode_seconds.push_back(time(rng));
        m.batch_seconds_per_token.push_back({time(rng) / 2, time(rng) / 5, time(rng) / 10});
      }
      m.head_decode_seconds = time(rng);
      m.head_batch_seconds_per_token = {time(rng) / 2, time(rng) / 5, time(rng) / 10};
      m.memory_bytes = 400 + rng() % 1000;
      p.workers.push_back(m);
      p.coordinator_links.push_back({latency(rng), bandwidth(rng)});
    }
    if (trial % 2) {
      p.worker_links.assign(static_cast<size_t>(W), std::vector<std::optional<LinkMeasure>>(static_cast<size_t>(W)));
      for (auto& row : p.worker_links) {
        for (auto& link : row) link = LinkMeasure{latency(rng), bandwidth(rng)};
      }
    }
    brute_force(p, false, [&](const std::vector<std::pair<size_t, model::LayerRange>>& chain, double seconds) {
      const auto evaluated = evaluate_placement(p, chain);
      ASSERT_TRUE(evaluated.has_value()) << "trial " << trial;
      EXPECT_NEAR(evaluated->step_seconds, seconds, 1e-12) << "trial " << trial;
      ASSERT_EQ(evaluated->stages.size(), chain.size());
      for (size_t s = 0; s < chain.size(); ++s) {
        EXPECT_EQ(evaluated->stages[s].worker, chain[s].first);
        EXPECT_EQ(evaluated->stages[s].layers.last, chain[s].second.last);
      }
      // A running coordinator's lanes count the links as the placement does: its compute
      // plus the links' time by the problem's book (Pipeline::predicted_step_seconds).
      double compute = 0;
      std::vector<std::string> names;
      for (const PlacedStage& stage : evaluated->stages) {
        compute += stage.compute_seconds;
        names.push_back(p.workers[stage.worker].name);
      }
      const auto links = link_book(p).chain_seconds(names, evaluated->batch);
      ASSERT_TRUE(links.has_value());
      EXPECT_NEAR(compute + *links, evaluated->step_seconds, 1e-12) << "trial " << trial;
      ++chains;
    });
  }
  EXPECT_GT(chains, 200u);
}

// A chain's links: the coordinator's to the first worker (the tokens in) and from the
// last (the logits back), and each hop between, measured or estimated from the two
// workers' links to the coordinator (the larger latency, the smaller bandwidth).
TEST(LinkBook, CountsEachLinkOfAChain) {
  LinkBook book;
  book.input_bytes_per_token = 4;
  book.hidden_bytes_per_token = 1000;
  book.logits_bytes_per_token = 100000;
  book.coordinator["a"] = {0.001, 1e6};
  book.coordinator["b"] = {0.004, 1e8};
  book.coordinator["c"] = {0.002, 1e7};
  // 2 tokens: a in (1 ms + 8 B), a -> b estimated (4 ms at 1 MB/s), b back (4 ms + 200 kB at 100 MB/s).
  EXPECT_NEAR(*book.chain_seconds({"a", "b"}, 2), (0.001 + 8e-6) + (0.004 + 2e-3) + (0.004 + 2e-3), 1e-12);
  book.between[{"a", "b"}] = {0.0005, 1e9};  // measured: it counts, not the estimate
  EXPECT_NEAR(*book.chain_seconds({"a", "b"}, 2), (0.001 + 8e-6) + (0.0005 + 2e-6) + (0.004 + 2e-3), 1e-12);
  // One worker: in and back over its own link.
  EXPECT_NEAR(*book.chain_seconds({"c"}, 1), (0.002 + 4e-7) + (0.002 + 1e-2), 1e-12);
  // Rows that return their arg max (greedy) carry 8 bytes back, not a row of logits:
  // 2 tokens, one of them a full row.
  EXPECT_NEAR(*book.chain_seconds({"a", "b"}, 2, 1), (0.001 + 8e-6) + (0.0005 + 2e-6) + (0.004 + 1.00008e-3),
              1e-12);
  // A worker whose link was not measured: no time is given.
  EXPECT_EQ(book.chain_seconds({"a", "d"}, 1), std::nullopt);
  EXPECT_EQ(book.chain_seconds({}, 1), std::nullopt);
  // Newer measures replace older ones; a link they do not measure is kept.
  LinkBook newer;
  newer.coordinator["a"] = {0.003, 1e6};
  newer.logits_bytes_per_token = 100000;
  book.update(newer);
  EXPECT_DOUBLE_EQ(book.coordinator["a"].latency_seconds, 0.003);
  EXPECT_TRUE(book.knows("b") && book.knows("c"));
  EXPECT_EQ(book.between.size(), 1u);
}

TEST(Placement, EvaluatingAChainThatDoesNotFitOrTileIsSaid) {
  PlacementProblem p = equal_layers(4);
  add_worker(p, "a", 0.01, 0.001, 300);  // three layers
  add_worker(p, "b", 0.01, 0.001, 1000);
  EXPECT_FALSE(evaluate_placement(p, {{0, {0, 4}}}).has_value());  // a holds 400 bytes
  const auto split = evaluate_placement(p, {{0, {0, 2}}, {1, {2, 4}}});
  ASSERT_TRUE(split.has_value());
  EXPECT_NEAR(split->step_seconds, 0.001 + 0.02 + 0.001 + 0.02 + 0.001, 1e-12);
  EXPECT_EQ(split->excluded, (std::vector<std::string>{"", ""}));
  EXPECT_THROW(evaluate_placement(p, {{0, {0, 2}}, {1, {3, 4}}}), std::invalid_argument);  // a gap
  EXPECT_THROW(evaluate_placement(p, {{0, {0, 2}}}), std::invalid_argument);               // short of the end
  EXPECT_THROW(evaluate_placement(p, {{0, {0, 2}}, {0, {2, 4}}}), std::invalid_argument);  // a used twice
  EXPECT_THROW(evaluate_placement(p, {{2, {0, 4}}}), std::invalid_argument);               // no worker 2
  EXPECT_THROW(evaluate_placement(p, {}), std::invalid_argument);
}

// A worker seen slower than its profile: every time of it scaled, so a step costs that
// much more and placement moves its layers away.
TEST(Placement, ScaledMeasuresMoveTheLayersOffASlowWorker) {
  PlacementProblem p = equal_layers(4);
  add_worker(p, "a", 0.01, 0.001, 200);  // two layers each: a split
  add_worker(p, "b", 0.01, 0.001, 200);
  add_worker(p, "c", 0.01, 0.001, 200);
  p.workers[1].profile_batches = {8, 64};
  p.workers[1].batch_seconds_per_token.assign(4, {0.002, 0.001});
  p.workers[1].head_decode_seconds = 0.003;
  p.workers[1].head_batch_seconds_per_token = {0.0005, 0.0002};
  WorkerMeasures scaled = p.workers[1];
  scale_measures(scaled, 4);
  EXPECT_EQ(scaled.decode_seconds, std::vector<double>(4, 0.04));
  EXPECT_EQ(scaled.batch_seconds_per_token[3], (std::vector<double>{0.008, 0.004}));
  EXPECT_DOUBLE_EQ(scaled.head_decode_seconds, 0.012);
  EXPECT_EQ(scaled.head_batch_seconds_per_token, (std::vector<double>{0.002, 0.0008}));
  EXPECT_EQ(scaled.profile_batches, p.workers[1].profile_batches);
  p.workers[1].head_decode_seconds = 0;
  p.workers[1].head_batch_seconds_per_token = {0, 0};
  const auto before = evaluate_placement(p, {{0, {0, 2}}, {1, {2, 4}}});
  ASSERT_TRUE(before.has_value());
  scale_measures(p.workers[1], 4);
  const auto after = evaluate_placement(p, {{0, {0, 2}}, {1, {2, 4}}});
  EXPECT_NEAR(after->stages[1].compute_seconds, 4 * before->stages[1].compute_seconds, 1e-12);
  const Placement placed = place(p);
  ASSERT_EQ(placed.stages.size(), 2u);
  for (const PlacedStage& s : placed.stages) EXPECT_NE(s.worker, 1u);
  EXPECT_FALSE(placed.excluded[1].empty());
}

// A new placement's roles for a running cluster: the placed run their stage; the others
// stand by for a stage they can hold, spread over the stages; one that holds none leaves.
// A worker started with fixed layers takes part with exactly them or not at all, and
// stands by only for a stage of exactly them.
TEST(Placement, AWorkerOfFixedLayersTakesThemOrNone) {
  PlacementProblem p = equal_layers(4);
  add_worker(p, "a", 0.01, 0.001, 1000);
  add_worker(p, "b", 0.01, 0.001, 1000);
  add_worker(p, "f", 0.001, 0.0001, 1000);  // ten times as fast, started with layers 1-2 only
  p.workers[2].fixed_layers = model::LayerRange{1, 3};
  add_worker(p, "g", 0.5, 0.05, 1000);  // slow, layers 0-1 only: no stage has those
  p.workers[3].fixed_layers = model::LayerRange{0, 2};
  add_worker(p, "h", 0.5, 0.05, 1000);  // slow, layers 1-2 only: f's stage
  p.workers[4].fixed_layers = model::LayerRange{1, 3};
  const Placement placement = place(p);
  ASSERT_EQ(placement.stages.size(), 3u);
  EXPECT_EQ(placement.stages[1].worker, 2u);
  EXPECT_EQ(placement.stages[1].layers.first, 1);
  EXPECT_EQ(placement.stages[1].layers.last, 3);
  // in 1 + a or b 10 + hop 1 + f 2 + hop 1 + b or a 10 + out 1 ms (f on every layer
  // would take 6)
  EXPECT_NEAR(placement.step_seconds, 0.026, 1e-12);
  const std::vector<WorkerRole> roles = worker_roles(p, placement);
  EXPECT_FALSE(roles[3].stage.has_value());  // no stage of layers 0-1
  EXPECT_EQ(roles[4].stage, 1u);
  EXPECT_TRUE(roles[4].standby);
  // Its layers beyond its memory: told why; a alone serves.
  p.workers[2].memory_bytes = 150;
  const Placement without = place(p);
  expect_stages(without, {{0, 0, 4}});
  EXPECT_NE(without.excluded[2].find("serves only layers 1-2"), std::string::npos) << without.excluded[2];
  // A fixed range that is no range of the model's is refused.
  p.workers[2].fixed_layers = model::LayerRange{2, 5};
  EXPECT_THROW(place(p), std::invalid_argument);
}

TEST(Placement, WorkersLeftOutStandByWhereTheyFit) {
  PlacementProblem p = equal_layers(4);
  add_worker(p, "a", 0.01, 0.001, 200);
  add_worker(p, "b", 0.01, 0.001, 200);
  add_worker(p, "c", 0.5, 0.05, 200);   // slow: left out
  add_worker(p, "d", 0.5, 0.05, 200);   // slow: left out
  add_worker(p, "e", 0.5, 0.05, 50);    // holds no layer
  const Placement placement = place(p);
  ASSERT_EQ(placement.stages.size(), 2u);  // a and b, two layers each, in either order
  const size_t a_stage = placement.stages[0].worker == 0 ? 0 : 1;
  EXPECT_EQ(placement.stages[a_stage].worker, 0u);
  EXPECT_EQ(placement.stages[1 - a_stage].worker, 1u);
  EXPECT_EQ(placement.stages[0].layers.last, 2);
  const std::vector<WorkerRole> roles = worker_roles(p, placement);
  ASSERT_EQ(roles.size(), 5u);
  EXPECT_EQ(roles[0].stage, a_stage);
  EXPECT_FALSE(roles[0].standby);
  EXPECT_EQ(roles[1].stage, 1 - a_stage);
  EXPECT_FALSE(roles[1].standby);
  EXPECT_EQ(roles[2].stage, 0u);  // both stages have none: the earliest
  EXPECT_TRUE(roles[2].standby);
  EXPECT_EQ(roles[3].stage, 1u);  // stage 0 has one now
  EXPECT_TRUE(roles[3].standby);
  EXPECT_FALSE(roles[4].stage.has_value());
  // A worker that holds only the smaller stage stands by there, whatever the counts.
  PlacementProblem q = equal_layers(4);
  add_worker(q, "a", 0.01, 0.001, 300);
  add_worker(q, "b", 0.01, 0.001, 100);
  add_worker(q, "c", 0.5, 0.05, 100);
  add_worker(q, "d", 0.5, 0.05, 100);
  const Placement three = place(q);
  ASSERT_EQ(three.stages.size(), 2u);  // a three layers, b one, in either order
  const size_t b_stage = three.stages[0].worker == 1 ? 0 : 1;
  EXPECT_EQ(three.stages[b_stage].worker, 1u);
  EXPECT_EQ(three.stages[b_stage].layers.last - three.stages[b_stage].layers.first, 1);
  const std::vector<WorkerRole> q_roles = worker_roles(q, three);
  EXPECT_EQ(q_roles[2].stage, b_stage);
  EXPECT_EQ(q_roles[3].stage, b_stage);
  EXPECT_TRUE(q_roles[3].standby);
}

// The lanes the standbys form, and the sequences each takes at a concurrency. Four
// workers that hold two layers each: the chain is two of them (a third hop costs a
// millisecond and saves nothing), the other two stand by, one per stage, and form a
// second lane. Every layer's time is linear in its tokens (10 ms a token: decode and
// batch alike), so a lane's step of n tokens is 3 ms of links + n x 40 ms.
TEST(Placement, TheStandbysFormLanesThatShareTheStreams) {
  PlacementProblem p = equal_layers(4);
  p.objective = Objective::throughput;
  p.concurrency = 8;
  p.lanes = true;
  for (const char* name : {"a", "b", "c", "d"}) add_worker(p, name, 0.01, 0.01, 200);
  const Placement placement = place(p);
  ASSERT_EQ(placement.stages.size(), 2u);
  EXPECT_NEAR(placement.step_seconds, 0.003 + 8 * 0.04, 1e-12);
  // Without lanes (--replicas standby) the chain is the one lane, with every stream.
  p.lanes = false;
  LanesPrediction lanes = predict_lanes(p, placement, 8);
  ASSERT_EQ(lanes.lanes.size(), 1u);
  EXPECT_EQ(lanes.lanes[0].sequences, 8);
  EXPECT_NEAR(lanes.tokens_per_second, 8 / (0.003 + 8 * 0.04), 1e-9);
  p.lanes = true;
  lanes = predict_lanes(p, placement, 8);
  ASSERT_EQ(lanes.lanes.size(), 2u);
  std::vector<size_t> used;
  for (const LanePrediction& lane : lanes.lanes) {
    ASSERT_EQ(lane.chain.size(), 2u);
    EXPECT_EQ(lane.chain[0].second.first, 0);
    EXPECT_EQ(lane.chain[0].second.last, 2);
    EXPECT_EQ(lane.chain[1].second.last, 4);
    for (const auto& [worker, layers] : lane.chain) used.push_back(worker);
  }
  EXPECT_EQ(lanes.lanes[0].chain[0].first, placement.stages[0].worker);
  std::sort(used.begin(), used.end());
  EXPECT_EQ(used, (std::vector<size_t>{0, 1, 2, 3}));
  // Alike lanes take turns: 4 sequences each, twice the one chain's tok/s.
  EXPECT_EQ(lanes.lanes[0].sequences, 4);
  EXPECT_EQ(lanes.lanes[1].sequences, 4);
  EXPECT_NEAR(lanes.lanes[1].step_seconds, 0.003 + 4 * 0.04, 1e-12);
  EXPECT_NEAR(lanes.tokens_per_second, 8 / 0.163, 1e-9);
  // One stream: the first lane alone.
  lanes = predict_lanes(p, placement, 1);
  EXPECT_EQ(lanes.lanes[1].sequences, 0);
  EXPECT_EQ(lanes.lanes[1].tokens_per_second, 0);
  EXPECT_NEAR(lanes.tokens_per_second, 1 / 0.043, 1e-9);

  // c and d three times slower (30 ms a token): their lane's step is 3 ms + n x 120 ms.
  // One at a time, a sequence goes where the step with it is shorter, by more than a
  // tenth, else to the lane with fewer: the first lane takes 1 and 2 (43, 83 ms against
  // 123), the second the third (123 alike), the first 4 to 6 (123 to 203 ms against
  // 243), the second the seventh (243 alike), the first the eighth (243 against 363).
  for (size_t w : {2u, 3u}) {
    p.workers[w].decode_seconds.assign(4, 0.03);
    p.workers[w].batch_seconds_per_token.assign(4, {0.03});
  }
  const Placement fast_first = place(p);
  lanes = predict_lanes(p, fast_first, 8);
  ASSERT_EQ(lanes.lanes.size(), 2u);
  EXPECT_LT(lanes.lanes[0].chain[0].first, 2u);  // the fast workers' chain
  EXPECT_EQ(lanes.lanes[0].sequences, 6);
  EXPECT_EQ(lanes.lanes[1].sequences, 2);
  EXPECT_NEAR(lanes.tokens_per_second, 6 / 0.243 + 2 / 0.243, 1e-9);

  // A stage with no standby left: no lane more.
  p.workers.pop_back();
  p.coordinator_links.pop_back();
  lanes = predict_lanes(p, place(p), 8);
  ASSERT_EQ(lanes.lanes.size(), 1u);
  EXPECT_EQ(lanes.lanes[0].sequences, 8);
}

TEST(Placement, WithLanesTheSearchWeighsWhatEveryLaneServes) {
  // a holds the whole model at 10 ms a layer and token; b, c and d half of it at 12 ms.
  PlacementProblem p = equal_layers(4);
  p.objective = Objective::throughput;
  p.concurrency = 8;
  add_worker(p, "a", 0.01, 0.01, 400);
  for (const char* name : {"b", "c", "d"}) add_worker(p, name, 0.012, 0.012, 200);
  // The fastest chain is a alone (1 + 4 x 80 + 1 ms), and no other worker holds its
  // range: one lane, 8 / 0.322 s.
  const Placement chain = place(p);
  expect_stages(chain, {{0, 0, 4}});
  EXPECT_NEAR(served_tokens_per_second(p, chain), 8 / 0.322, 1e-9);  // no lanes: the chain's
  p.lanes = true;
  EXPECT_NEAR(served_tokens_per_second(p, chain), 8 / 0.322, 1e-9);  // its one lane
  // With lanes, b and c's chain (halves, 3 + n x 48 ms a step) leaves a standby at each
  // stage: a for the first half, d for the second (3 + n x 44 ms). The 8 streams go
  // 4 and 4 (a sequence goes to the lane with the shorter step, by a tenth, else the
  // one with fewer): 4 / 0.195 + 4 / 0.179 = 42.86 tok/s.
  const Placement lanes = place(p);
  ASSERT_EQ(lanes.stages.size(), 2u);
  std::vector<size_t> first_lane{lanes.stages[0].worker, lanes.stages[1].worker};
  std::sort(first_lane.begin(), first_lane.end());
  EXPECT_EQ(first_lane, (std::vector<size_t>{1, 2}));
  EXPECT_EQ(lanes.stages[0].layers.last, 2);
  const LanesPrediction predicted = predict_lanes(p, lanes, 8);
  ASSERT_EQ(predicted.lanes.size(), 2u);
  EXPECT_EQ(predicted.lanes[1].chain[0].first, 0u);
  EXPECT_EQ(predicted.lanes[1].chain[1].first, 3u);
  EXPECT_EQ(predicted.lanes[0].sequences, 4);
  EXPECT_EQ(predicted.lanes[1].sequences, 4);
  EXPECT_NEAR(served_tokens_per_second(p, lanes), 4 / 0.195 + 4 / 0.179, 1e-9);
  EXPECT_NE(lanes.excluded[0].find("the best lanes whose first chain uses it predict 24.84 tok/s, the chosen ones "
                                   "42.86"),
            std::string::npos)
      << lanes.excluded[0];
  // One stream (the latency objective) is the first lane's alone: the fastest chain.
  p.objective = Objective::latency;
  expect_stages(place(p), {{0, 0, 4}});
}

TEST(Placement, WithLanesMatchesEverySubsetsFastestChainOnRandomClusters) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> time(0.001, 0.02), latency(0.0, 0.005);
  int checked = 0, more_than_the_fastest_chain = 0;
  for (int trial = 0; trial < 120; ++trial) {
    PlacementProblem p = equal_layers(2 + trial % 4);
    const int L = static_cast<int>(p.layers.size());
    p.objective = Objective::throughput;
    p.concurrency = 1 + trial % 12;
    p.lanes = true;
    const int W = 2 + trial % 4;
    for (int w = 0; w < W; ++w) {
      // Memory for a third of the layers up to all of them.
      add_worker(p, "w" + std::to_string(w), time(rng), time(rng) / 4,
                 100 * static_cast<uint64_t>(std::max(1, L / 3 + static_cast<int>(rng() % L))), latency(rng));
      // Each layer's own times: no two chains of a subset cost the same (the fastest
      // would then depend on the order of the search).
      for (int l = 0; l < L; ++l) {
        p.workers.back().decode_seconds[static_cast<size_t>(l)] = time(rng);
        p.workers.back().batch_seconds_per_token[static_cast<size_t>(l)] = {time(rng) / 4};
      }
      p.workers.back().profile_batches = {8};
    }
    // Every subset's fastest chain by the brute force, served with the others standing by.
    std::map<size_t, std::pair<double, std::vector<std::pair<size_t, model::LayerRange>>>> fastest;
    brute_force(p, false, [&](const std::vector<std::pair<size_t, model::LayerRange>>& chain, double seconds) {
      size_t mask = 0;
      for (const auto& stage : chain) mask |= size_t{1} << stage.first;
      const auto known = fastest.find(mask);
      if (known == fastest.end() || seconds < known->second.first) fastest[mask] = {seconds, chain};
    });
    if (fastest.empty()) continue;
    double expected = 0;
    for (const auto& [mask, chain] : fastest) {
      const auto placement = evaluate_placement(p, chain.second);
      ASSERT_TRUE(placement.has_value());
      expected = std::max(expected, served_tokens_per_second(p, *placement));
    }
    const double served = served_tokens_per_second(p, place(p));
    EXPECT_NEAR(served, expected, 1e-9 * expected) << "trial " << trial;
    p.lanes = false;
    const Placement fastest_chain = place(p);
    p.lanes = true;
    EXPECT_GE(served, served_tokens_per_second(p, fastest_chain) * (1 - 1e-12)) << "trial " << trial;
    if (served > served_tokens_per_second(p, fastest_chain) * 1.01) ++more_than_the_fastest_chain;
    ++checked;
  }
  EXPECT_GT(checked, 100);
  EXPECT_GT(more_than_the_fastest_chain, 10);  // the lanes' search is not the fastest chain's
}

}  // namespace
}  // namespace pico::coordinator
