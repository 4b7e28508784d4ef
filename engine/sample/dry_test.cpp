// DRY against its definition (llama.cpp's src/llama-sampler.cpp): the repeat a
// candidate would extend, the breakers that cut repeats, the penalty's exponent bound,
// the window of the last N tokens, the breakers built from a vocabulary.
#include "sample/dry.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "sample/sampler.hpp"

namespace pico::sample {
namespace {

// The logits after DRY over `history` (token ids), for a vocabulary of `n` zeros.
std::vector<float> penalised(const std::vector<int32_t>& history, int32_t n, float multiplier, float base,
                             int32_t allowed, int32_t last_n = 64, const DryBreakers* breakers = nullptr) {
  DryHistory dry(last_n);
  for (const int32_t t : history) dry.accept(t);
  Candidates c = Candidates::from_logits(std::vector<float>(static_cast<size_t>(n), 0.0f));
  dry.apply(c, multiplier, base, allowed, breakers);
  std::vector<float> out(static_cast<size_t>(n));
  for (const Candidate& cand : c.items) out[static_cast<size_t>(cand.id)] = cand.logit;
  return out;
}

constexpr int32_t a = 1, b = 2, c = 3, y = 4, colon = 9;

// llama.cpp's worked example: "a b c c b c y a b c" ends with "a b c", seen before
// followed by c (3 long), "b c" before y (2), "c" before b (1).
TEST(Dry, PenalisesTheTokensThatWouldExtendARepeat) {
  const std::vector<int32_t> history{a, b, c, c, b, c, y, a, b, c};
  const std::vector<float> out = penalised(history, 10, 1.0f, 2.0f, 2);
  EXPECT_EQ(out[c], -2.0f);  // 1 * 2^(3 - 2)
  EXPECT_EQ(out[y], -1.0f);  // 1 * 2^(2 - 2)
  EXPECT_EQ(out[b], 0.0f);   // 1 long: allowed
  EXPECT_EQ(out[a], 0.0f);
  const std::vector<float> looser = penalised(history, 10, 0.5f, 3.0f, 1);
  EXPECT_EQ(looser[c], 0.5f * -9.0f);
  EXPECT_EQ(looser[y], 0.5f * -3.0f);
  EXPECT_EQ(looser[b], -0.5f);
}

TEST(Dry, OffOrTooShortChangesNothing) {
  const std::vector<int32_t> history{a, b, c, a, b, c};
  const std::vector<float> zeros(10, 0.0f);
  EXPECT_EQ(penalised(history, 10, 0.0f, 2.0f, 2), zeros);
  EXPECT_EQ(penalised(history, 10, 1.0f, 0.9f, 2), zeros);
  EXPECT_EQ(penalised(history, 10, 1.0f, 2.0f, 2, 0), zeros);
  EXPECT_EQ(penalised({a, b}, 10, 1.0f, 2.0f, 2), zeros);  // no more tokens than allowed
  EXPECT_NE(penalised(history, 10, 1.0f, 2.0f, 2), zeros);
}

TEST(Dry, OnlyTheLastNTokensCount) {
  // a b c ... a b: c would extend "a b" (2 long) if the first a b is in the window.
  const std::vector<int32_t> history{a, b, c, y, y, a, b};
  EXPECT_EQ(penalised(history, 10, 1.0f, 2.0f, 1, 64)[c], -2.0f);
  EXPECT_EQ(penalised(history, 10, 1.0f, 2.0f, 1, 4)[c], 0.0f);
}

TEST(Dry, ABreakerCutsTheRepeatAndIsNeverPenalisedItself) {
  // "a b : c a b : c": the last "c" was seen before, after "a b :", so a would extend a
  // 4-long repeat; the breaker ':' one token back limits it to 1.
  const std::vector<int32_t> history{a, b, colon, c, a, b, colon, c};
  EXPECT_EQ(penalised(history, 10, 1.0f, 2.0f, 1)[a], -8.0f);  // 2^(4 - 1)
  DryBreakers breakers;
  breakers.heads.emplace(colon, std::vector<int32_t>());
  EXPECT_EQ(penalised(history, 10, 1.0f, 2.0f, 1, 64, &breakers)[a], -1.0f);  // 2^(1 - 1)
  // ':' follows "a b" (2 long) but is a breaker: never penalised.
  const std::vector<int32_t> before_colon{a, b, colon, a, b};
  EXPECT_EQ(penalised(before_colon, 10, 1.0f, 2.0f, 1)[colon], -2.0f);
  EXPECT_EQ(penalised(before_colon, 10, 1.0f, 2.0f, 1, 64, &breakers)[colon], 0.0f);
}

TEST(Dry, AMultiTokenBreakerCountsOnlyWhenItsTailMatches) {
  // Breaker "y a" as head y with tail {a}: in "c y a b c y a b" the last "y a" bounds
  // repeats to the tokens after it.
  DryBreakers breakers;
  breakers.heads.emplace(y, std::vector<int32_t>{a});
  const std::vector<int32_t> history{c, y, a, b, c, y, a, b};
  // Without it: c would extend "c y a b" (4 long).
  EXPECT_EQ(penalised(history, 10, 1.0f, 2.0f, 1)[c], -8.0f);
  // With it: the nearest head y is 2 back with its tail a after it: limit 2 - 1 = 1.
  EXPECT_EQ(penalised(history, 10, 1.0f, 2.0f, 1, 64, &breakers)[c], -1.0f);
  // A head whose tail does not follow: no limit.
  DryBreakers other;
  other.heads.emplace(y, std::vector<int32_t>{c});
  EXPECT_EQ(penalised(history, 10, 1.0f, 2.0f, 1, 64, &other)[c], -8.0f);
}

TEST(Dry, TheExponentIsBoundedSoThePenaltyStaysFinite) {
  std::vector<int32_t> history;
  for (int i = 0; i < 40; ++i) history.push_back(i % 2 ? a : b);
  const std::vector<float> out = penalised(history, 10, 1.0f, 1e10f, 0);
  // 88.72 / ln(1e10) = 3.85: the exponent stops at 3.
  EXPECT_EQ(out[b], static_cast<float>(std::pow(static_cast<double>(1e10f), 3)) * -1.0f);
  EXPECT_TRUE(std::isfinite(out[b]));
}

TEST(Dry, BreakersFromAVocabulary) {
  const std::vector<std::string> vocab{"he", "llo", "hello", "lo w", "w", " w", "x"};
  auto text = [&](int32_t id) { return vocab[static_cast<size_t>(id)]; };
  auto tokenize = [&](std::string_view s) {
    std::vector<int32_t> ids;
    if (s == " w") ids = {5};
    if (s == "o w") ids = {6, 6, 6};  // any other tail would be a bug of the overlap
    return ids;
  };
  const std::vector<std::string> breakers{"lo w", ""};
  const DryBreakers built = make_dry_breakers(breakers, static_cast<int32_t>(vocab.size()), text, tokenize);
  EXPECT_TRUE(built.breaks_alone(3));  // "lo w" contains it
  EXPECT_FALSE(built.breaks_alone(1));
  // "llo" and "hello" end with "lo", the breaker's start: the rest " w" follows.
  for (const int32_t head : {1, 2}) {
    const auto [first, last] = built.heads.equal_range(head);
    ASSERT_EQ(std::distance(first, last), 1) << head;
    EXPECT_EQ(first->second, std::vector<int32_t>{5}) << head;
  }
  EXPECT_EQ(built.heads.count(0), 0u);  // "he": no 'l' at its end
  EXPECT_EQ(built.heads.count(4), 0u);
  EXPECT_EQ(built.heads.size(), 3u);
}

TEST(Dry, InTheSamplerAfterThePenaltiesAndNotGreedy) {
  SamplingParams p = SamplingParams::greedy();
  EXPECT_TRUE(p.argmax_suffices());
  p.dry_multiplier = 1.0f;
  p.dry_base = 2.0f;
  p.dry_allowed_length = 1;
  EXPECT_FALSE(p.argmax_suffices());
  EXPECT_EQ(p.stages[1], Stage::Dry);
  Sampler s(p);
  for (const int32_t t : {a, b, c, a, b}) s.accept(t);
  // c leads by 1.5 but would extend "a b" (2 long): 2^(2 - 1) = 2 drops it below y.
  std::vector<float> logits(10, 0.0f);
  logits[c] = 1.5f;
  logits[y] = 1.0f;
  EXPECT_EQ(s.sample(logits), y);
  s.reset();
  EXPECT_EQ(s.sample(logits), c);  // nothing accepted: no repeat
}

}  // namespace
}  // namespace pico::sample
