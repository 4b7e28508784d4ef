#include "sample/sampler.hpp"

#include "sample/argmax.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace pico::sample {

namespace {

bool higher(const Candidate& a, const Candidate& b) { return a.logit > b.logit || (a.logit == b.logit && a.id < b.id); }

// Keeps the first n candidates. (Not vector::resize: gcc 12 -O3 for s390x miscompiles
// the shrinking resize in apply_min_p into an append of 2^64 - 1 elements.)
void truncate(std::vector<Candidate>& items, size_t n) {
  if (n < items.size()) items.erase(items.begin() + static_cast<std::ptrdiff_t>(n), items.end());
}

}  // namespace

std::string_view stage_name(Stage stage) {
  switch (stage) {
    case Stage::Penalties: return "penalties";
    case Stage::TopK: return "top_k";
    case Stage::TypicalP: return "typical_p";
    case Stage::TopP: return "top_p";
    case Stage::MinP: return "min_p";
    case Stage::Temperature: return "temperature";
    case Stage::TopNSigma: return "top_n_sigma";
    case Stage::Xtc: return "xtc";
    case Stage::Dry: return "dry";
  }
  return "?";
}

SamplingParams SamplingParams::greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  p.penalty_last_n = 0;
  return p;
}

bool SamplingParams::argmax_suffices() const { return free_pick_is_argmax() && !grammar; }

bool SamplingParams::free_pick_is_argmax() const {
  const bool penalties =
      penalty_last_n != 0 && (repeat_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f);
  const bool xtc = xtc_probability > 0.0f && xtc_threshold <= 0.5f;
  const bool dry = dry_multiplier != 0.0f && dry_base >= 1.0f && dry_penalty_last_n != 0;
  return temperature <= 0.0f && logit_bias.empty() && !penalties && !dry && typical_p >= 1.0f && !xtc &&
         dynatemp_range <= 0.0f && mirostat == 0;
}

Candidates Candidates::from_logits(std::span<const float> logits) {
  Candidates c;
  c.items.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) c.items[i] = {static_cast<int32_t>(i), logits[i], 0.0f};
  return c;
}

void Candidates::sort() {
  if (!sorted) std::sort(items.begin(), items.end(), higher);
  sorted = true;
}

void Candidates::softmax() {
  sort();
  if (items.empty()) return;
  const float max_logit = items.front().logit;
  float sum = 0.0f;
  for (Candidate& c : items) {
    c.p = std::exp(c.logit - max_logit);
    sum += c.p;
  }
  for (Candidate& c : items) c.p /= sum;
}

std::vector<int32_t> Candidates::ids() const {
  std::vector<int32_t> out;
  out.reserve(items.size());
  for (const Candidate& c : items) out.push_back(c.id);
  return out;
}

void apply_logit_bias(Candidates& c, std::span<const LogitBias> bias) {
  if (bias.empty()) return;
  // Candidates come in id order until a stage reorders them; look ids up either way.
  std::unordered_map<int32_t, float> by_id;
  for (const LogitBias& b : bias) by_id[b.token] += b.bias;
  for (Candidate& cand : c.items) {
    if (auto it = by_id.find(cand.id); it != by_id.end()) cand.logit += it->second;
  }
  c.sorted = false;
}

void apply_top_k(Candidates& c, int32_t k) {
  if (k <= 0) return;
  const size_t keep = std::min(static_cast<size_t>(k), c.items.size());
  if (!c.sorted) {
    std::partial_sort(c.items.begin(), c.items.begin() + static_cast<std::ptrdiff_t>(keep), c.items.end(), higher);
    c.sorted = true;
  }
  truncate(c.items, keep);
}

void apply_top_p(Candidates& c, float p, size_t min_keep) {
  if (p >= 1.0f || c.items.empty()) return;
  c.softmax();
  float cumulative = 0.0f;
  size_t keep = c.items.size();
  for (size_t i = 0; i < c.items.size(); ++i) {
    cumulative += c.items[i].p;
    if (cumulative >= p && i + 1 >= min_keep) {
      keep = i + 1;
      break;
    }
  }
  truncate(c.items, keep);
}

void apply_min_p(Candidates& c, float p, size_t min_keep) {
  if (p <= 0.0f || c.items.empty()) return;
  c.sort();
  // p_i >= p * p_max  <=>  logit_i >= logit_max + log(p)
  const float threshold = c.items.front().logit + std::log(p);
  size_t keep = 1;
  while (keep < c.items.size() && (c.items[keep].logit >= threshold || keep < min_keep)) ++keep;
  truncate(c.items, keep);
}

void apply_typical_p(Candidates& c, float p, size_t min_keep) {
  if (p >= 1.0f || c.items.empty()) return;
  c.softmax();
  float entropy = 0.0f;
  for (const Candidate& cand : c.items) {
    if (cand.p > 0.0f) entropy += -cand.p * std::log(cand.p);
  }
  // Most typical first: |-log p - entropy| ascending.
  std::vector<float> distance(c.items.size());
  for (size_t i = 0; i < c.items.size(); ++i) distance[i] = std::fabs(-std::log(c.items[i].p) - entropy);
  std::vector<size_t> order(c.items.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return distance[a] < distance[b]; });
  float cumulative = 0.0f;
  size_t keep = order.size();
  for (size_t i = 0; i < order.size(); ++i) {
    cumulative += c.items[order[i]].p;
    if (cumulative > p && (min_keep == 0 || i + 1 >= min_keep)) {
      keep = i + 1;
      break;
    }
  }
  std::vector<Candidate> kept;
  kept.reserve(keep);
  for (size_t i = 0; i < keep; ++i) kept.push_back(c.items[order[i]]);
  c.items = std::move(kept);
  c.sorted = false;
}

void apply_temperature(Candidates& c, float temperature) {
  if (c.items.empty()) return;
  if (temperature <= 0.0f) {
    // Only the best candidate stays (the first of equal ones in id order).
    const auto best = std::min_element(c.items.begin(), c.items.end(), higher);
    const Candidate keep = *best;
    c.items.assign(1, keep);
    c.sorted = true;
    return;
  }
  for (Candidate& cand : c.items) cand.logit /= temperature;
}

void apply_dynamic_temperature(Candidates& c, float temperature, float range, float exponent) {
  if (range <= 0.0f) return apply_temperature(c, temperature);
  if (c.items.size() <= 1) return;
  const float min_temperature = std::max(0.0f, temperature - range);
  const float max_temperature = temperature + range;
  const float max_entropy = -std::log(1.0f / static_cast<float>(c.items.size()));
  c.softmax();
  float entropy = 0.0f;
  for (const Candidate& cand : c.items) {
    if (cand.p > 0.0f) entropy -= cand.p * std::log(cand.p);
  }
  const float normalized = entropy / max_entropy;
  apply_temperature(c, min_temperature + (max_temperature - min_temperature) * std::pow(normalized, exponent));
}

void apply_top_n_sigma(Candidates& c, float n) {
  if (n <= 0.0f || c.items.size() <= 1) return;
  float max_logit = c.items.front().logit;
  float sum = 0.0f;
  size_t finite = 0;
  for (const Candidate& cand : c.items) {
    if (cand.logit == -INFINITY) continue;
    max_logit = std::max(max_logit, cand.logit);
    sum += cand.logit;
    ++finite;
  }
  const float mean = finite > 0 ? sum / static_cast<float>(finite) : 0.0f;
  float squares = 0.0f;
  for (const Candidate& cand : c.items) {
    // llama.cpp squares in double (pow of a float and an int) and adds to a float.
    if (cand.logit != -INFINITY) squares = static_cast<float>(squares + std::pow(static_cast<double>(cand.logit - mean), 2));
  }
  const float sigma = finite > 0 ? std::sqrt(squares / static_cast<float>(finite)) : 0.0f;
  for (Candidate& cand : c.items) {
    if (cand.logit < max_logit - n * sigma) cand.logit = -INFINITY;
  }
  c.sorted = false;
}

bool xtc_can_act(const Candidates& c, float probability, float threshold) {
  return probability > 0.0f && threshold <= 0.5f && c.items.size() >= 2;
}

void apply_xtc(Candidates& c, float probability, float threshold, size_t min_keep, double chance) {
  if (!xtc_can_act(c, probability, threshold) || chance > probability) return;
  c.softmax();
  size_t last_above = 0;  // the least probable candidate at or above the threshold
  for (size_t i = 0; i < c.items.size() && c.items[i].p >= threshold; ++i) last_above = i;
  if (last_above > 0 && c.items.size() - last_above >= min_keep) {
    c.items.erase(c.items.begin(), c.items.begin() + static_cast<std::ptrdiff_t>(last_above));
  }
}

size_t draw(Candidates& c, double uniform) {
  if (c.items.empty()) throw std::invalid_argument("no candidates to sample from");
  if (c.items.size() == 1) {
    c.items[0].p = 1.0f;
    return 0;
  }
  float max_logit = c.items[0].logit;
  for (const Candidate& cand : c.items) max_logit = std::max(max_logit, cand.logit);
  if (!std::isfinite(max_logit)) return 0;  // every candidate banned: nothing to weigh
  double sum = 0.0;
  for (Candidate& cand : c.items) {
    cand.p = std::exp(cand.logit - max_logit);
    sum += cand.p;
  }
  const double target = sum * uniform;
  double running = 0.0;
  size_t chosen = c.items.size() - 1;
  bool found = false;
  for (size_t i = 0; i < c.items.size(); ++i) {
    running += c.items[i].p;
    if (!found && running >= target && c.items[i].p > 0.0f) {
      chosen = i;
      found = true;
    }
    c.items[i].p = static_cast<float>(c.items[i].p / sum);
  }
  return chosen;
}

void PenaltyWindow::accept(int32_t token) {
  if (last_n_ == 0) return;
  ++counts_[token];
  window_.push_back(token);
  if (last_n_ > 0 && window_.size() > static_cast<size_t>(last_n_)) {
    const int32_t old = window_.front();
    window_.pop_front();
    if (--counts_[old] == 0) counts_.erase(old);
  }
}

void PenaltyWindow::reset() {
  window_.clear();
  counts_.clear();
}

int PenaltyWindow::count(int32_t token) const {
  const auto it = counts_.find(token);
  return it == counts_.end() ? 0 : it->second;
}

void PenaltyWindow::apply(Candidates& c, float repeat, float frequency, float presence) const {
  if (last_n_ == 0 || counts_.empty() || (repeat == 1.0f && frequency == 0.0f && presence == 0.0f)) return;
  for (Candidate& cand : c.items) {
    const int n = count(cand.id);
    if (n == 0) continue;
    // Multiply negative logits by the penalty, divide positive ones: both less likely.
    if (cand.logit <= 0.0f) {
      cand.logit *= repeat;
    } else {
      cand.logit /= repeat;
    }
    cand.logit -= static_cast<float>(n) * frequency + presence;
  }
  c.sorted = false;
}

double Random::uniform() {
  // 27 + 26 bits of two outputs make a 53-bit integer, scaled to [0, 1).
  const uint64_t a = engine_() >> 5;
  const uint64_t b = engine_() >> 6;
  return static_cast<double>(a * 67108864ull + b) * (1.0 / 9007199254740992.0);
}

namespace {
// XTC's stream from a seed of its own: the same seed would make its chance equal the
// draw of the same token (both streams take one uniform per token), so that whether
// XTC acts and which token is drawn would go together.
uint32_t xtc_seed(uint32_t seed) { return seed ^ 0x9E3779B9u; }

uint32_t resolve_seed(uint32_t seed) {
  if (seed != SamplingParams::kRandomSeed) return seed;
  std::random_device device;
  return device();
}
}  // namespace

Sampler::Sampler(SamplingParams params)
    : params_(std::move(params)),
      seed_(resolve_seed(params_.seed)),
      random_(seed_),
      xtc_random_(xtc_seed(seed_)),
      penalties_(params_.penalty_last_n),
      dry_(params_.dry_penalty_last_n),
      mu_(2.0f * params_.mirostat_tau),
      plain_greedy_(params_.free_pick_is_argmax()) {
  if (!std::isfinite(params_.repeat_penalty) || params_.repeat_penalty <= 0.0f) {
    throw std::invalid_argument("repeat_penalty must be finite and greater than 0");
  }
  if (!std::isfinite(params_.frequency_penalty) || !std::isfinite(params_.presence_penalty)) {
    throw std::invalid_argument("frequency and presence penalties must be finite");
  }
  if (params_.mirostat < 0 || params_.mirostat > 2) throw std::invalid_argument("mirostat must be 0, 1 or 2");
  if (!std::isfinite(params_.mirostat_tau) || !std::isfinite(params_.mirostat_eta)) {
    throw std::invalid_argument("mirostat_tau and mirostat_eta must be finite");
  }
  if (!(params_.xtc_probability >= 0.0f && params_.xtc_probability <= 1.0f)) {
    throw std::invalid_argument("xtc_probability must be in [0, 1]");
  }
  if (!std::isfinite(params_.dry_multiplier) || !std::isfinite(params_.dry_base) || params_.dry_allowed_length < 0) {
    throw std::invalid_argument("dry_multiplier and dry_base must be finite, dry_allowed_length not negative");
  }
  if (!std::isfinite(params_.dynatemp_range) || !std::isfinite(params_.dynatemp_exponent) ||
      !std::isfinite(params_.top_n_sigma)) {
    throw std::invalid_argument("dynatemp_range, dynatemp_exponent and top_n_sigma must be finite");
  }
  if (params_.grammar) {
    if (!params_.grammar_vocabulary) throw std::invalid_argument("a grammar needs the vocabulary's pieces");
    grammar_.emplace(params_.grammar, params_.grammar_vocabulary);
    grammar_waiting_ = !params_.grammar_triggers.empty();
  }
  for (const std::string& trigger : params_.grammar_triggers) {
    if (trigger.empty()) throw std::invalid_argument("a grammar trigger must not be empty");
  }
}

Candidates Sampler::filter(std::span<const float> logits, Random* xtc_random) const {
  Candidates c = Candidates::from_logits(logits);
  apply_logit_bias(c, params_.logit_bias);
  for (Stage stage : params_.stages) {
    switch (stage) {
      case Stage::Penalties:
        penalties_.apply(c, params_.repeat_penalty, params_.frequency_penalty, params_.presence_penalty);
        break;
      case Stage::Dry:
        dry_.apply(c, params_.dry_multiplier, params_.dry_base, params_.dry_allowed_length, params_.dry_breakers.get());
        break;
      case Stage::TopK: apply_top_k(c, params_.top_k); break;
      case Stage::TypicalP: apply_typical_p(c, params_.typical_p, params_.min_keep); break;
      case Stage::TopP: apply_top_p(c, params_.top_p, params_.min_keep); break;
      case Stage::MinP: apply_min_p(c, params_.min_p, params_.min_keep); break;
      case Stage::TopNSigma: apply_top_n_sigma(c, params_.top_n_sigma); break;
      case Stage::Xtc: {
        // The chance is drawn only where the stage could act (llama.cpp's rule).
        double chance = 0.0;
        if (xtc_random && xtc_can_act(c, params_.xtc_probability, params_.xtc_threshold)) chance = xtc_random->uniform();
        apply_xtc(c, params_.xtc_probability, params_.xtc_threshold, params_.min_keep, chance);
        break;
      }
      case Stage::Temperature:
        apply_dynamic_temperature(c, params_.temperature, params_.dynatemp_range, params_.dynatemp_exponent);
        break;
    }
  }
  return c;
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (!grammar_ || grammar_waiting_) return sample_unconstrained(logits);
  const Random random = random_, xtc_random = xtc_random_;
  const float mu = mu_;
  const int32_t free_pick = sample_unconstrained(logits);
  if (grammar_->allows(free_pick)) return free_pick;
  random_ = random;
  xtc_random_ = xtc_random;
  mu_ = mu;
  if (plain_greedy_) {
    if (const auto best = best_allowed_of_the_top(logits)) {
      random_.uniform();  // the one draw per token of the greedy path
      return *best;
    }
  }
  std::vector<float> constrained(logits.begin(), logits.end());
  std::vector<int32_t> ids(constrained.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  grammar_->constrain(ids, constrained);
  if (std::none_of(constrained.begin(), constrained.end(), [](float x) { return x != -INFINITY; })) {
    throw std::runtime_error("the grammar allows no token of the vocabulary here");
  }
  const int32_t pick = sample_unconstrained(constrained);
  if (!grammar_->allows(pick)) throw std::runtime_error("the grammar refused every token the samplers kept");
  return pick;
}

// Greedy under a grammar picks the arg max of the constrained logits: the best allowed
// token. It is most often among the best few, found by one pass over the row, which
// saves the pass of the grammar over the whole vocabulary. The order is the
// candidates' (logit descending, then id), so ties resolve as first_argmax does.
std::optional<int32_t> Sampler::best_allowed_of_the_top(std::span<const float> logits) const {
  constexpr size_t kLook = 64;
  using Entry = std::pair<float, int32_t>;
  const auto better = [](const Entry& a, const Entry& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  std::vector<Entry> top;  // a heap whose front is the worst kept
  top.reserve(kLook);
  for (size_t i = 0; i < logits.size(); ++i) {
    const Entry e{logits[i], static_cast<int32_t>(i)};
    if (std::isnan(e.first)) return std::nullopt;  // first_argmax's NaN rules: the full path
    if (top.size() < kLook) {
      top.push_back(e);
      std::push_heap(top.begin(), top.end(), better);
    } else if (better(e, top.front())) {
      std::pop_heap(top.begin(), top.end(), better);
      top.back() = e;
      std::push_heap(top.begin(), top.end(), better);
    }
  }
  std::sort(top.begin(), top.end(), better);
  for (const auto& [logit, id] : top) {
    if (logit == -INFINITY) break;
    if (grammar_->allows(id)) return id;
  }
  return std::nullopt;
}

int32_t Sampler::sample_unconstrained(std::span<const float> logits) {
  if (plain_greedy_ && !logits.empty()) {
    random_.uniform();  // the same one draw per token as the full path
    // The first of equal maxima, as the candidates' order (logit, then id) picks.
    return static_cast<int32_t>(first_argmax(logits.data(), logits.size()));
  }
  if (params_.mirostat != 0) return sample_mirostat(logits);
  Candidates c = filter(logits, &xtc_random_);
  const double u = random_.uniform();  // one draw per token, whatever is left
  return c.items[draw(c, u)].id;
}

// llama.cpp's mirostat samplers: the logit bias, the temperature, then a truncation that
// steers the observed surprise (-log2 p of the pick) towards tau: v1 by top-k with k from
// the estimated Zipf exponent of the 100 most probable candidates, v2 by dropping the
// candidates whose surprise exceeds mu. mu moves by eta times the error after each pick.
int32_t Sampler::sample_mirostat(std::span<const float> logits) {
  Candidates c = Candidates::from_logits(logits);
  apply_logit_bias(c, params_.logit_bias);
  apply_temperature(c, params_.temperature);
  c.softmax();
  if (params_.mirostat == 1) {
    constexpr size_t kM = 100;
    float sum_ti_bi = 0.0f, sum_ti_sq = 0.0f;
    for (size_t i = 0; i + 1 < kM && i + 1 < c.items.size(); ++i) {
      const float t_i = std::log(static_cast<float>(i + 2) / static_cast<float>(i + 1));
      const float b_i = std::log(c.items[i].p / c.items[i + 1].p);
      sum_ti_bi += t_i * b_i;
      sum_ti_sq += t_i * t_i;
    }
    const float s_hat = sum_ti_bi / sum_ti_sq;
    const float epsilon_hat = s_hat - 1.0f;
    const float k = std::pow((epsilon_hat * std::pow(2.0f, mu_)) /
                                 (1.0f - std::pow(static_cast<float>(logits.size()), -epsilon_hat)),
                             1.0f / s_hat);
    // One candidate (or a flat distribution) gives no estimate: keep the best.
    const float kept = std::isnan(k) ? 1.0f : std::clamp(k, 1.0f, static_cast<float>(c.items.size()));
    apply_top_k(c, static_cast<int32_t>(kept));
  } else {
    size_t keep = 0;
    while (keep < c.items.size() && -std::log2(c.items[keep].p) <= mu_) ++keep;
    apply_top_k(c, static_cast<int32_t>(std::max<size_t>(keep, 1)));
  }
  const double u = random_.uniform();
  const size_t chosen = draw(c, u);
  const float surprise = -std::log2(c.items[chosen].p);
  mu_ -= params_.mirostat_eta * (surprise - params_.mirostat_tau);
  return c.items[chosen].id;
}

void Sampler::accept(int32_t token) {
  if (grammar_waiting_) {
    watch_for_trigger(token);
  } else if (grammar_) {
    grammar_->accept(token);
  }
  remember(token);
}

void Sampler::watch_for_trigger(int32_t token) {
  const GrammarVocabulary& vocabulary = grammar_->vocabulary();
  if (token < 0 || static_cast<size_t>(token) >= vocabulary.size() || vocabulary.end_of_generation[static_cast<size_t>(token)]) {
    return;
  }
  reply_tail_ += vocabulary.pieces[static_cast<size_t>(token)];
  size_t first = std::string::npos, longest = 0;
  for (const std::string& trigger : params_.grammar_triggers) {
    first = std::min(first, reply_tail_.find(trigger));
    longest = std::max(longest, trigger.size());
  }
  if (first != std::string::npos) {
    // The grammar starts at the trigger: the trigger and what followed it in the token.
    grammar_waiting_ = false;
    grammar_->accept_text(std::string_view(reply_tail_).substr(first));
    reply_tail_.clear();
    return;
  }
  if (reply_tail_.size() >= longest) reply_tail_.erase(0, reply_tail_.size() - (longest - 1));
}

void Sampler::remember(int32_t token) {
  penalties_.accept(token);
  dry_.accept(token);
}

void Sampler::reset() {
  penalties_.reset();
  dry_.reset();
  random_ = Random(seed_);
  xtc_random_ = Random(xtc_seed(seed_));
  mu_ = 2.0f * params_.mirostat_tau;
  if (params_.grammar) grammar_.emplace(params_.grammar, params_.grammar_vocabulary);
  grammar_waiting_ = params_.grammar && !params_.grammar_triggers.empty();
  reply_tail_.clear();
}

}  // namespace pico::sample
