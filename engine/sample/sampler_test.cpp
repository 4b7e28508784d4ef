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

// Every candidate kept (no top-k, top-p or min-p): the draw sees the whole distribution.
SamplingParams whole_distribution(uint32_t seed, float temperature = 1.0f) {
  SamplingParams p;
  p.seed = seed;
  p.temperature = temperature;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
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

// The samplers below are checked against their definitions in llama.cpp's
// src/llama-sampler.cpp, with the expected values worked out here independently.

TEST(TopNSigma, MasksLogitsBelowMaxMinusNStd) {
  // mean 2, std sqrt(2): 4 - 1.41 = 2.59 keeps 3 and 4.
  auto c = Candidates::from_logits(std::vector<float>{0, 1, 2, 3, 4});
  apply_top_n_sigma(c, 1.0f);
  std::set<int32_t> finite;
  for (const Candidate& cand : c.items)
    if (std::isfinite(cand.logit)) finite.insert(cand.id);
  EXPECT_EQ(finite, (std::set<int32_t>{3, 4}));
  // -infinity is left out of the mean and the std: over {0, 10}, mean 5 and std 5.
  c = Candidates::from_logits(std::vector<float>{-INFINITY, 0, 10});
  apply_top_n_sigma(c, 0.9f);  // 10 - 4.5: 0 goes
  EXPECT_EQ(c.items[1].logit, -INFINITY);
  EXPECT_EQ(c.items[2].logit, 10.0f);
  c = Candidates::from_logits(std::vector<float>{0, 1, 2, 3, 4});
  apply_top_n_sigma(c, 0.0f);  // off
  for (const Candidate& cand : c.items) EXPECT_TRUE(std::isfinite(cand.logit));
}

TEST(Xtc, RemovesTheTopChoicesButTheLeastOfThem) {
  const auto logits = log_probs({0.5f, 0.3f, 0.15f, 0.05f});
  auto c = Candidates::from_logits(logits);
  apply_xtc(c, 1.0f, 0.1f, 0, 0.5);  // 0.5, 0.3, 0.15 are >= 0.1: 0.15 stays
  EXPECT_EQ(c.ids(), (std::vector<int32_t>{2, 3}));
  c = Candidates::from_logits(logits);
  apply_xtc(c, 0.5f, 0.1f, 0, 0.9);  // the chance did not come up
  EXPECT_EQ(c.items.size(), 4u);
  c = Candidates::from_logits(logits);
  apply_xtc(c, 1.0f, 0.1f, 3, 0.0);  // 2 would be left, fewer than min_keep
  EXPECT_EQ(c.items.size(), 4u);
  c = Candidates::from_logits(logits);
  apply_xtc(c, 1.0f, 0.6f, 0, 0.0);  // a threshold over 0.5 turns it off
  EXPECT_EQ(c.items.size(), 4u);
  c = Candidates::from_logits(logits);
  apply_xtc(c, 1.0f, 0.4f, 0, 0.0);  // only 0.5 is above: nothing to exclude
  EXPECT_EQ(c.items.size(), 4u);
}

TEST(Xtc, ItsChanceIsIndependentOfTheDraw) {
  // p = 0.6, 0.3, 0.1, threshold 0.25, probability 0.5: the best is picked only when XTC
  // does not act (half the time) and then with 0.6: 30 % in all. Were XTC's chance the
  // draw itself, the best would come only from draws in (0.5, 0.6): 10 %.
  SamplingParams p = whole_distribution(21);
  p.xtc_probability = 0.5f;
  p.xtc_threshold = 0.25f;
  Sampler s(p);
  const auto logits = log_probs({0.6f, 0.3f, 0.1f});
  int best = 0;
  constexpr int kDraws = 4000;
  for (int i = 0; i < kDraws; ++i) best += s.sample(logits) == 0 ? 1 : 0;
  EXPECT_NEAR(static_cast<double>(best) / kDraws, 0.30, 0.03);
}

TEST(DynamicTemperature, FollowsTheNormalisedEntropy) {
  const std::vector<float> logits{2, 1, 0};
  double sum = 0, entropy = 0;
  for (float l : logits) sum += std::exp(l - 2.0);
  for (float l : logits) {
    const double p = std::exp(l - 2.0) / sum;
    entropy -= p * std::log(p);
  }
  for (const float exponent : {1.0f, 2.0f}) {
    // t = 1, range 0.5: from 0.5 to 1.5 by (H / ln 3)^exponent.
    const double t = 0.5 + 1.0 * std::pow(entropy / std::log(3.0), exponent);
    auto c = Candidates::from_logits(logits);
    apply_dynamic_temperature(c, 1.0f, 0.5f, exponent);
    for (const Candidate& cand : c.items) EXPECT_NEAR(cand.logit, logits[static_cast<size_t>(cand.id)] / t, 1e-5);
  }
  auto c = Candidates::from_logits(logits);
  apply_dynamic_temperature(c, 2.0f, 0.0f, 1.0f);  // range 0: the plain temperature
  EXPECT_FLOAT_EQ(c.items[0].logit, 1.0f);
}

TEST(Mirostat, V2KeepsWhatIsNoMoreSurprisingThanMuAndMovesMu) {
  SamplingParams p;
  p.seed = 7;
  p.temperature = 1.0f;
  p.mirostat = 2;
  p.mirostat_tau = 0.1f;  // mu starts at 0.2 bits: only p >= 0.87 is kept, so the best alone
  p.mirostat_eta = 0.1f;
  Sampler s(p);
  const auto logits = log_probs({0.1f, 0.5f, 0.3f, 0.1f});
  EXPECT_EQ(s.sample(logits), 1);
  // The pick had surprise 0 (alone, p 1): mu = 0.2 - 0.1 * (0 - 0.1).
  EXPECT_NEAR(s.mirostat_mu(), 0.21f, 1e-6);
  s.reset();
  EXPECT_FLOAT_EQ(s.mirostat_mu(), 0.2f);
}

TEST(Mirostat, V1TruncatesToTheKOfItsZipfEstimate) {
  // p_i ~ 1 / (i + 1)^1.2 over 1000 tokens: the estimate of the exponent is exactly 1.2,
  // and with mu = 2 tau = 10: k = (0.2 * 2^10 / (1 - 1000^-0.2))^(1 / 1.2) = 107.
  const double s_exp = 1.2;
  std::vector<float> logits(1000);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(-s_exp * std::log(static_cast<double>(i + 1)));
  const double k = std::pow(0.2 * std::pow(2.0, 10.0) / (1.0 - std::pow(1000.0, -0.2)), 1.0 / s_exp);
  ASSERT_EQ(static_cast<int>(k), 107);
  double top_mass = 0;
  for (int i = 0; i < 107; ++i) top_mass += std::exp(static_cast<double>(logits[static_cast<size_t>(i)]));
  int largest = 0;
  for (uint32_t seed = 1; seed <= 200; ++seed) {
    SamplingParams p;
    p.seed = seed;
    p.temperature = 1.0f;
    p.mirostat = 1;
    p.mirostat_tau = 5.0f;
    p.mirostat_eta = 0.1f;
    Sampler s(p);
    const int32_t token = s.sample(logits);
    ASSERT_LT(token, 107) << "seed " << seed;
    largest = std::max(largest, token);
    // mu moves by eta times (the pick's surprise within the kept 107 - tau).
    const double surprise = -std::log2(std::exp(static_cast<double>(logits[static_cast<size_t>(token)])) / top_mass);
    EXPECT_NEAR(s.mirostat_mu(), 10.0 - 0.1 * (surprise - 5.0), 1e-3);
  }
  EXPECT_GT(largest, 50);  // the truncation is k's, not tighter
}

TEST(Greedy, ArgmaxSufficesOnlyWithoutStagesThatMoveTheBest) {
  SamplingParams p = SamplingParams::greedy();
  EXPECT_TRUE(p.argmax_suffices());
  p.top_n_sigma = 1.0f;  // keeps the best
  EXPECT_TRUE(p.argmax_suffices());
  SamplingParams xtc = p;
  xtc.xtc_probability = 0.5f;
  EXPECT_FALSE(xtc.argmax_suffices());
  xtc.xtc_threshold = 0.6f;  // off
  EXPECT_TRUE(xtc.argmax_suffices());
  SamplingParams dynamic = p;
  dynamic.dynatemp_range = 0.5f;  // temperature 0 +- 0.5 can be above 0
  EXPECT_FALSE(dynamic.argmax_suffices());
  SamplingParams mirostat = p;
  mirostat.mirostat = 2;
  EXPECT_FALSE(mirostat.argmax_suffices());
}

TEST(Sampler, RejectsBadNewSamplerParameters) {
  SamplingParams p;
  p.mirostat = 3;
  EXPECT_THROW(Sampler{p}, std::invalid_argument);
  p.mirostat = 0;
  p.xtc_probability = 1.5f;
  EXPECT_THROW(Sampler{p}, std::invalid_argument);
  p.xtc_probability = 0.0f;
  p.dynatemp_exponent = NAN;
  EXPECT_THROW(Sampler{p}, std::invalid_argument);
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
  SamplingParams p = whole_distribution(42, 1.5f);
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
  SamplingParams p = whole_distribution(9);
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
  // common/common.h's order.
  EXPECT_EQ(p.stages, (std::vector<Stage>{Stage::Penalties, Stage::Dry, Stage::TopNSigma, Stage::TopK, Stage::TypicalP,
                                          Stage::TopP, Stage::MinP, Stage::Xtc, Stage::Temperature}));
  EXPECT_EQ(p.dry_multiplier, 0.0f);
  EXPECT_EQ(p.dry_base, 1.75f);
  EXPECT_EQ(p.dry_allowed_length, 2);
  EXPECT_EQ(p.dry_penalty_last_n, 64);
  EXPECT_LE(p.top_n_sigma, 0.0f);
  EXPECT_EQ(p.xtc_probability, 0.0f);
  EXPECT_EQ(p.dynatemp_range, 0.0f);
  EXPECT_EQ(p.mirostat, 0);
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

// Grammar-constrained sampling (llama.cpp's common sampler: the free pick when the
// grammar allows it, else a pick over the logits the grammar leaves).
std::shared_ptr<const GrammarVocabulary> letters_vocabulary() {
  // 4: the end of generation (no text)
  return std::make_shared<const GrammarVocabulary>(std::vector<std::string>{"a", "b", "c", "ab", ""},
                                                   std::vector<bool>{false, false, false, false, true});
}

SamplingParams with_grammar(SamplingParams p, std::string_view gbnf) {
  p.grammar = Grammar::parse(gbnf);
  p.grammar_vocabulary = letters_vocabulary();
  return p;
}

TEST(GrammarSampling, GreedyPicksTheBestAllowedToken) {
  // "a" is best, but only b's then the end are allowed.
  Sampler s(with_grammar(SamplingParams::greedy(), "root ::= \"b\" \"b\"?"));
  const std::vector<float> logits = {5, 1, 3, 4, 0};
  EXPECT_EQ(s.sample(logits), 1);
  s.accept(1);
  EXPECT_EQ(s.sample(logits), 1);  // "b" again: still better than the end
  s.accept(1);
  EXPECT_EQ(s.sample(logits), 4);  // only the end is left
  s.accept(4);
}

TEST(GrammarSampling, NeedsFullLogitsAndRefusesATokenOutsideIt) {
  const SamplingParams p = with_grammar(SamplingParams::greedy(), "root ::= \"c\"");
  EXPECT_FALSE(p.argmax_suffices());  // the arg max may be refused
  EXPECT_TRUE(p.free_pick_is_argmax());
  Sampler s(p);
  EXPECT_THROW(s.accept(0), std::exception);
  SamplingParams no_vocabulary = p;
  no_vocabulary.grammar_vocabulary = nullptr;
  EXPECT_THROW(Sampler{no_vocabulary}, std::invalid_argument);
}

TEST(GrammarSampling, AnAllowedFreePickKeepsTheUnconstrainedDraws) {
  // A grammar that allows every letter changes nothing: the same seeded picks.
  SamplingParams free = whole_distribution(42);
  Sampler plain(free), constrained(with_grammar(free, "root ::= [a-c]*"));
  const std::vector<float> logits = {1.0f, 1.2f, 0.8f, 0.9f, -50.0f};
  for (int i = 0; i < 40; ++i) {
    const int32_t a = plain.sample(logits), b = constrained.sample(logits);
    ASSERT_EQ(a, b) << "pick " << i;
    plain.accept(a);
    constrained.accept(b);
  }
}

TEST(GrammarSampling, ARefusedPickIsMadeAgainWithTheSameDraw) {
  // Only "c", "ab" or "a" (the start of "ab") may come, not "b" or the end. The pick is
  // the free one when allowed; when refused, it is what a sampler without grammar makes,
  // in the same random state, from logits where the refused tokens are -infinity: the
  // refused pick left no trace.
  SamplingParams free = whole_distribution(7);
  const std::vector<float> logits = {0.5f, 2.5f, 0.6f, 0.4f, 1.0f};
  std::vector<float> allowed = logits;
  allowed[1] = allowed[4] = -INFINITY;
  std::set<int32_t> picks;
  int redrawn = 0;
  for (int i = 0; i < 30; ++i) {
    Sampler constrained(with_grammar(free, "root ::= (\"c\" | \"ab\")+"));
    Sampler free_reference(free), allowed_reference(free);
    for (int k = 0; k < i; ++k) {  // each generator advances alike (allowed picks: one draw)
      constrained.sample(allowed);
      free_reference.sample(allowed);
      allowed_reference.sample(allowed);
    }
    const int32_t free_pick = free_reference.sample(logits);
    const bool refused = free_pick == 1 || free_pick == 4;
    redrawn += refused;
    const int32_t pick = constrained.sample(logits);
    EXPECT_EQ(pick, refused ? allowed_reference.sample(allowed) : free_pick) << "pick " << i;
    picks.insert(pick);
  }
  EXPECT_EQ(picks, (std::set<int32_t>{0, 2, 3}));
  EXPECT_GT(redrawn, 10);  // the case under test came up
}

// Greedy under a grammar is the arg max over the allowed tokens (the first of equal
// ones), whether the best allowed token is among the best few logits (found without a
// pass of the grammar over the vocabulary) or far below them.
TEST(GrammarSampling, GreedyIsTheArgMaxOfTheAllowedTokens) {
  std::vector<std::string> pieces;
  for (int i = 0; i < 2000; ++i) pieces.emplace_back(static_cast<size_t>(1 + (i / 26) % 3), static_cast<char>('a' + i % 26));
  pieces.emplace_back();
  std::vector<bool> end(pieces.size(), false);
  end.back() = true;
  SamplingParams p = SamplingParams::greedy();
  p.grammar = Grammar::parse("root ::= [x-z]+");
  p.grammar_vocabulary = std::make_shared<const GrammarVocabulary>(pieces, end);
  for (float allowed_boost : {3.0f, 0.0f, -3.0f}) {  // the best allowed: near the top, mid-way, low
    std::vector<float> logits(pieces.size());
    for (size_t i = 0; i < logits.size(); ++i) {
      logits[i] = std::sin(static_cast<float>(i) * 0.7f) * 2.0f + (pieces[i].front() >= 'x' ? allowed_boost : 0.0f);
    }
    logits[23 + 26 * 40] = logits[23 + 26 * 41] = 9.0f;  // two equal best allowed ("x" pieces): the first
    for (int round = 0; round < 2; ++round) {
      Sampler s(p);
      int32_t expected = -1;
      for (size_t i = 0; i < logits.size(); ++i) {
        const bool allowed = !end[i] && pieces[i].front() >= 'x';
        if (allowed && (expected < 0 || logits[i] > logits[static_cast<size_t>(expected)])) expected = static_cast<int32_t>(i);
      }
      EXPECT_EQ(s.sample(logits), expected) << "boost " << allowed_boost << " round " << round;
      logits[static_cast<size_t>(expected)] = -INFINITY;  // the next best, for the next round
      logits[23 + 26 * 41] = logits[23 + 26 * 40] == -INFINITY ? -1.0f : logits[23 + 26 * 41];
    }
  }
}

TEST(GrammarSampling, PromptTokensDoNotMoveTheGrammar) {
  Sampler s(with_grammar(SamplingParams::greedy(), "root ::= \"a\""));
  s.remember(1);  // a prompt's "b": the penalties' history only
  EXPECT_EQ(s.sample(std::vector<float>{0, 9, 0, 0, 0}), 0);
}

TEST(GrammarSampling, NoAllowedTokenIsAnError) {
  Sampler s(with_grammar(SamplingParams::greedy(), "root ::= \"z\""));
  EXPECT_THROW(s.sample(std::vector<float>{1, 2, 3, 4, 5}), std::runtime_error);
}

TEST(GrammarSampling, ResetRestartsTheGrammar) {
  Sampler s(with_grammar(SamplingParams::greedy(), "root ::= \"a\" \"b\""));
  const std::vector<float> logits = {1, 2, 0, 0, 0};
  EXPECT_EQ(s.sample(logits), 0);
  s.accept(0);
  EXPECT_EQ(s.sample(logits), 1);
  s.reset();
  EXPECT_EQ(s.sample(logits), 0);
}

// A lazy grammar: free until its trigger appears in the reply (here "ab", across two
// tokens or inside one), then the reply from the trigger on follows it.
TEST(GrammarSampling, ALazyGrammarHoldsFromItsTriggerOn) {
  SamplingParams p = with_grammar(SamplingParams::greedy(), "root ::= \"ab\" \"c\"+");
  p.grammar_triggers = {"ab"};
  const std::vector<float> favour_a = {9, 1, 2, 0, 0}, favour_end = {1, 2, 3, 0, 9};
  for (const std::vector<int32_t>& opening : {std::vector<int32_t>{0, 1}, std::vector<int32_t>{3}}) {
    Sampler s(p);
    EXPECT_EQ(s.sample(favour_a), 0);  // free: "a" is not allowed by the grammar's start, yet taken
    s.accept(2);                       // "c": no trigger yet
    s.accept(2);
    for (int32_t token : opening) s.accept(token);
    EXPECT_EQ(s.sample(favour_a), 2);    // triggered: after "ab" only "c" may come
    s.accept(2);
    EXPECT_EQ(s.sample(favour_end), 4);  // "ab" "c": the grammar may end
    s.reset();                           // waits for the trigger again
    EXPECT_EQ(s.sample(favour_a), 0);
  }
  // Text from the trigger on that the grammar does not allow: refused as any token is.
  p.grammar_triggers = {"b"};
  Sampler refused(p);
  refused.accept(0);
  EXPECT_THROW(refused.accept(1), std::logic_error);  // the grammar would start at "b", not "ab"
  p.grammar_triggers = {""};
  EXPECT_THROW(Sampler{p}, std::invalid_argument);
}

}  // namespace
}  // namespace pico::sample
