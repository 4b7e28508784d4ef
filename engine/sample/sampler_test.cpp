#include "sample/sampler.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

namespace pico::sample {
namespace {

std::vector<float> log_probs(std::vector<float> probs) {
  for (float& p : probs) p = std::log(p);
  return probs;
}

std::set<int32_t> id_set(const Candidates& c) {
  const auto ids = c.ids();
  return {ids.begin(), ids.end()};
}

SamplingParams only(std::vector<Stage> stages) {
  SamplingParams p;
  p.stages = std::move(stages);
  p.seed = 1;
  return p;
}

TEST(Candidates, SoftmaxSortsAndNormalizes) {
  auto c = Candidates::from_logits(log_probs({0.1f, 0.4f, 0.2f, 0.3f}));
  c.softmax();
  EXPECT_EQ(c.ids(), (std::vector<int32_t>{1, 3, 2, 0}));
  EXPECT_NEAR(c.items[0].p, 0.4f, 1e-6);
  EXPECT_NEAR(c.items[3].p, 0.1f, 1e-6);
}

TEST(TopK, KeepsTheKHighest) {
  auto c = Candidates::from_logits(std::vector<float>{1, 5, 3, 4, 2});
  apply_top_k(c, 2);
  EXPECT_EQ(c.ids(), (std::vector<int32_t>{1, 3}));
  auto all = Candidates::from_logits(std::vector<float>{1, 5, 3});
  apply_top_k(all, 0);  // off
  EXPECT_EQ(all.items.size(), 3u);
  apply_top_k(all, 10);
  EXPECT_EQ(all.items.size(), 3u);
  // Ties go to the lower id.
  auto ties = Candidates::from_logits(std::vector<float>{2, 2, 2, 1});
  apply_top_k(ties, 2);
  EXPECT_EQ(ties.ids(), (std::vector<int32_t>{0, 1}));
}

TEST(TopP, KeepsTheSmallestSetReachingTheMass) {
  const auto logits = log_probs({0.5f, 0.3f, 0.15f, 0.05f});
  auto c = Candidates::from_logits(logits);
  apply_top_p(c, 0.75f, 0);
  EXPECT_EQ(c.ids(), (std::vector<int32_t>{0, 1}));
  c = Candidates::from_logits(logits);
  apply_top_p(c, 0.85f, 0);
  EXPECT_EQ(c.ids(), (std::vector<int32_t>{0, 1, 2}));
  c = Candidates::from_logits(logits);
  apply_top_p(c, 0.1f, 3);  // min_keep
  EXPECT_EQ(c.ids(), (std::vector<int32_t>{0, 1, 2}));
  c = Candidates::from_logits(logits);
  apply_top_p(c, 1.0f, 0);  // off
  EXPECT_EQ(c.items.size(), 4u);
}

TEST(MinP, DropsTokensBelowAFractionOfTheBest) {
  const auto logits = log_probs({0.5f, 0.3f, 0.15f, 0.05f});
  auto c = Candidates::from_logits(logits);
  apply_min_p(c, 0.2f, 0);  // threshold 0.1
  EXPECT_EQ(id_set(c), (std::set<int32_t>{0, 1, 2}));
  c = Candidates::from_logits(logits);
  apply_min_p(c, 0.9f, 0);
  EXPECT_EQ(id_set(c), (std::set<int32_t>{0}));
  c = Candidates::from_logits(logits);
  apply_min_p(c, 0.9f, 2);
  EXPECT_EQ(id_set(c), (std::set<int32_t>{0, 1}));
}

TEST(TypicalP, KeepsTokensNearTheEntropy) {
  // H = 1.2799; |-ln p - H|: 0.364 (p .4), 0.076 (p .3), 0.330 (p .2), 1.023 (p .1).
  const auto logits = log_probs({0.4f, 0.3f, 0.2f, 0.1f});
  auto c = Candidates::from_logits(logits);
  apply_typical_p(c, 0.45f, 0);
  EXPECT_EQ(c.ids(), (std::vector<int32_t>{1, 2}));
  c = Candidates::from_logits(logits);
  apply_typical_p(c, 0.55f, 0);
  EXPECT_EQ(c.ids(), (std::vector<int32_t>{1, 2, 0}));
}

TEST(Temperature, ScalesOrKeepsTheBest) {
  auto c = Candidates::from_logits(std::vector<float>{2, -4, 1});
  apply_temperature(c, 2.0f);
  EXPECT_FLOAT_EQ(c.items[0].logit, 1.0f);
  EXPECT_FLOAT_EQ(c.items[1].logit, -2.0f);
  c = Candidates::from_logits(std::vector<float>{2, 7, 7, 1});
  apply_temperature(c, 0.0f);
  EXPECT_EQ(c.ids(), (std::vector<int32_t>{1}));
}

TEST(Penalties, ChangeOnlyTheTokensInTheWindow) {
  SamplingParams p = only({Stage::Penalties});
  p.penalty_last_n = 2;
  p.repeat_penalty = 2.0f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  Sampler s(p);
  for (int32_t t : {4, 2, 2, 3}) s.accept(t);  // the window keeps the last two: 2, 3
  const std::vector<float> logits = {1, 1, 2, -2, 1};
  const Candidates c = s.filter(logits);
  std::map<int32_t, float> after;
  for (const auto& cand : c.items) after[cand.id] = cand.logit;
  EXPECT_FLOAT_EQ(after[0], 1.0f);
  EXPECT_FLOAT_EQ(after[1], 1.0f);
  EXPECT_FLOAT_EQ(after[4], 1.0f);         // left the window
  EXPECT_FLOAT_EQ(after[2], 2.0f / 2 - 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(after[3], -2.0f * 2 - 0.5f - 0.25f);
  s.reset();
  const Candidates fresh = s.filter(logits);
  EXPECT_FLOAT_EQ(fresh.items[2].logit, 2.0f);
}

TEST(Penalties, FrequencyCountsRepeats) {
  PenaltyWindow w(64);
  for (int32_t t : {7, 7, 7, 1}) w.accept(t);
  EXPECT_EQ(w.count(7), 3);
  EXPECT_EQ(w.count(1), 1);
  EXPECT_EQ(w.count(2), 0);
  auto c = Candidates::from_logits(std::vector<float>{0, 0, 0, 0, 0, 0, 0, 0});
  w.apply(c, 1.0f, 1.0f, 0.0f);
  EXPECT_FLOAT_EQ(c.items[7].logit, -3.0f);
  EXPECT_FLOAT_EQ(c.items[1].logit, -1.0f);
  PenaltyWindow off(0);
  off.accept(7);
  EXPECT_EQ(off.count(7), 0);
}

TEST(LogitBias, AddsToTheLogit) {
  SamplingParams p = SamplingParams::greedy();
  p.logit_bias = {{0, 10.0f}};
  Sampler s(p);
  EXPECT_EQ(s.sample(std::vector<float>{1, 5, 3}), 0);
  p.logit_bias = {{1, -INFINITY}};
  Sampler banned(p);
  EXPECT_EQ(banned.sample(std::vector<float>{1, 5, 3}), 2);
}

TEST(Greedy, IsTheArgMax) {
  Random r(7);
  Sampler s(SamplingParams::greedy());
  for (int round = 0; round < 50; ++round) {
    std::vector<float> logits(1000);
    for (float& l : logits) l = static_cast<float>(r.uniform() * 20.0 - 10.0);
    const auto best = std::max_element(logits.begin(), logits.end()) - logits.begin();
    EXPECT_EQ(s.sample(logits), best);
  }
  EXPECT_EQ(s.sample(std::vector<float>{3, 9, 9, 1}), 1);  // first of equal
}

TEST(Greedy, ShortcutAgreesWithTheFullChain) {
  // Coarse logits make ties common: the arg max shortcut must pick what the chain of
  // stages (top-k, top-p, min-p, temperature 0) picks.
  Random r(11);
  Sampler s(SamplingParams::greedy());
  for (int round = 0; round < 200; ++round) {
    std::vector<float> logits(500);
    for (float& l : logits) l = static_cast<float>(static_cast<int>(r.uniform() * 8.0));
    const Candidates chain = s.filter(logits);
    ASSERT_EQ(chain.items.size(), 1u);
    EXPECT_EQ(s.sample(logits), chain.items[0].id);
  }
}

TEST(Greedy, PenaltiesStillApply) {
  // Greedy with a repeat penalty is not the plain arg max: the penalised token loses.
  SamplingParams p = SamplingParams::greedy();
  p.repeat_penalty = 4.0f;
  p.penalty_last_n = 64;
  Sampler s(p);
  const std::vector<float> logits{1.0f, 3.0f, 2.0f};
  EXPECT_EQ(s.sample(logits), 1);
  s.accept(1);
  EXPECT_EQ(s.sample(logits), 2);
}

TEST(Random, IsTheSameEverywhere) {
  // std::mt19937 with seed 5489 starts 3499211612, 581869302 (the standard fixes it).
  Random r(5489);
  EXPECT_DOUBLE_EQ(r.uniform(), 0.8147236863931789);
  Random a(123), b(123);
  for (int i = 0; i < 1000; ++i) {
    const double x = a.uniform();
    EXPECT_EQ(x, b.uniform());
    EXPECT_GE(x, 0.0);
    EXPECT_LT(x, 1.0);
  }
}

TEST(Sampler, SameSeedSameTokens) {
  std::vector<float> logits(50);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i)) * 3.0f;
  SamplingParams p;
  p.seed = 42;
  p.temperature = 1.5f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  auto run = [&](uint32_t seed) {
    p.seed = seed;
    Sampler s(p);
    std::vector<int32_t> out;
    for (int i = 0; i < 200; ++i) out.push_back(s.sample(logits));
    return out;
  };
  const auto first = run(42);
  EXPECT_EQ(first, run(42));
  EXPECT_NE(first, run(43));
  // reset() restarts the sequence.
  p.seed = 42;
  Sampler s(p);
  const int32_t t0 = s.sample(logits);
  s.sample(logits);
  s.reset();
  EXPECT_EQ(s.sample(logits), t0);
}

TEST(Sampler, DrawsFollowTheDistribution) {
  const auto logits = log_probs({0.5f, 0.3f, 0.15f, 0.05f});
  SamplingParams p;
  p.seed = 9;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  Sampler s(p);
  std::map<int32_t, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++counts[s.sample(logits)];
  EXPECT_NEAR(counts[0] / double(n), 0.5, 0.02);
  EXPECT_NEAR(counts[1] / double(n), 0.3, 0.02);
  EXPECT_NEAR(counts[2] / double(n), 0.15, 0.02);
  EXPECT_NEAR(counts[3] / double(n), 0.05, 0.01);
}

TEST(Sampler, DefaultChainIsLlamaCpps) {
  const SamplingParams p;
  EXPECT_EQ(p.stages, (std::vector<Stage>{Stage::Penalties, Stage::TopK, Stage::TypicalP, Stage::TopP, Stage::MinP,
                                          Stage::Temperature}));
  EXPECT_EQ(p.top_k, 40);
  EXPECT_FLOAT_EQ(p.top_p, 0.95f);
  EXPECT_FLOAT_EQ(p.min_p, 0.05f);
  EXPECT_FLOAT_EQ(p.temperature, 0.8f);
  EXPECT_EQ(p.penalty_last_n, 64);
  // With the defaults only tokens that survive top-k 40 can come out.
  std::vector<float> logits(1000);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(i % 97) * 0.01f;
  SamplingParams seeded;
  seeded.seed = 3;
  Sampler s(seeded);
  const Candidates kept = s.filter(logits);
  EXPECT_LE(kept.items.size(), 40u);
  for (int i = 0; i < 100; ++i) EXPECT_GE(logits[static_cast<size_t>(s.sample(logits))], 0.86f);
}

TEST(Sampler, RejectsBadPenalties) {
  SamplingParams p;
  p.repeat_penalty = 0.0f;
  EXPECT_THROW(Sampler{p}, std::invalid_argument);
  p.repeat_penalty = 1.0f;
  p.frequency_penalty = NAN;
  EXPECT_THROW(Sampler{p}, std::invalid_argument);
}

}  // namespace
}  // namespace pico::sample
