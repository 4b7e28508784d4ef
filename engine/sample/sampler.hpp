// Token sampling from logits: logit bias, repetition/frequency/presence penalties over
// the last N tokens, DRY, top-n-sigma, top-k, typical-p, top-p, min-p, XTC, temperature
// (fixed or dynamic by the entropy), then a draw from the distribution (or the arg max
// when the temperature is 0); or mirostat (v1, v2) after the logit bias and the
// temperature instead of all of that. The default order is llama.cpp's
// (common/common.h: penalties, dry, top_n_sigma, top_k, typ_p, top_p, min_p, xtc,
// temperature, dist; the logit bias comes first), and each stage computes what
// llama.cpp's does (src/llama-sampler.cpp).
//
// A grammar (GBNF) constrains the pick as llama.cpp's common sampler does: the pick is
// made freely and kept when the grammar allows it; otherwise the logits of every token
// the grammar refuses become -infinity and the pick is made again, with the random
// state it had (so a refused pick leaves no trace). llama.cpp's own trade: a
// constrained token costs one check in the common case, not a pass over the vocabulary.
//
// Seeded sampling is deterministic everywhere: the generator is std::mt19937 (fully
// specified by the standard) and its output is turned into a uniform double here,
// not by std::uniform_real_distribution (whose algorithm each library chooses).
// Candidates of equal logit are ordered by token id.
#pragma once

#include <cstdint>
#include <deque>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <memory>
#include <optional>
#include <vector>

#include "sample/dry.hpp"
#include "sample/grammar.hpp"

namespace pico::sample {

struct LogitBias {
  int32_t token = 0;
  float bias = 0.0f;  // added to the logit; -INFINITY bans the token
};

enum class Stage { Penalties, TopK, TypicalP, TopP, MinP, Temperature, TopNSigma, Xtc, Dry };

std::string_view stage_name(Stage stage);

struct SamplingParams {
  static constexpr uint32_t kRandomSeed = 0xFFFFFFFF;  // pick a seed from std::random_device

  uint32_t seed = kRandomSeed;
  float temperature = 0.8f;  // <= 0: greedy (the highest logit after bias and penalties)
  int32_t top_k = 40;        // <= 0: off
  float top_p = 0.95f;       // >= 1: off
  float min_p = 0.05f;       // <= 0: off
  float typical_p = 1.0f;    // >= 1: off
  size_t min_keep = 0;       // top-p, min-p and typical-p keep at least this many
  int32_t penalty_last_n = 64;   // window of accepted tokens the penalties see; 0: off, < 0: all
  float repeat_penalty = 1.0f;   // 1: off; divides positive logits, multiplies negative ones
  float frequency_penalty = 0.0f;  // minus this times the token's count in the window
  float presence_penalty = 0.0f;   // minus this once if the token is in the window
  std::vector<LogitBias> logit_bias;
  float top_n_sigma = -1.0f;       // <= 0: off; else keeps logits >= max - n * their std
  float xtc_probability = 0.0f;    // XTC: the chance per token of excluding the top choices; 0: off
  float xtc_threshold = 0.1f;      // ... those at or above this probability but the least (> 0.5: off)
  float dynatemp_range = 0.0f;     // > 0: temperature in [t - range, t + range] by the entropy
  float dynatemp_exponent = 1.0f;  // ... normalised entropy to this power
  int32_t mirostat = 0;            // 1, 2: mirostat v1 / v2 after the logit bias and temperature
  float mirostat_tau = 5.0f;       // its target surprise (bits)
  float mirostat_eta = 0.1f;       // its learning rate
  float dry_multiplier = 0.0f;      // DRY: 0 off; the penalty multiplier * base^(length - allowed)
  float dry_base = 1.75f;           // ... < 1: off
  int32_t dry_allowed_length = 2;   // ... repeats up to this long are free
  int32_t dry_penalty_last_n = 64;  // ... the accepted tokens it scans; 0: off
  std::shared_ptr<const DryBreakers> dry_breakers;  // ... its sequence breakers (none: null)
  std::shared_ptr<const Grammar> grammar;                        // null: none
  std::shared_ptr<const GrammarVocabulary> grammar_vocabulary;  // needed with a grammar
  // A lazy grammar (llama.cpp's grammar_lazy, as tool calls under tool_choice auto use
  // it): it constrains nothing until one of these texts appears in the reply; from the
  // trigger on, the reply follows it. Empty: the grammar holds from the first token.
  std::vector<std::string> grammar_triggers;
  std::vector<Stage> stages = {Stage::Penalties, Stage::Dry, Stage::TopNSigma, Stage::TopK, Stage::TypicalP,
                               Stage::TopP,      Stage::MinP, Stage::Xtc,       Stage::Temperature};

  // Greedy decoding: temperature 0, no penalties.
  static SamplingParams greedy();
  // Whether the pick is always the arg max of the raw logits (the first of equal ones),
  // so that the distribution need not be built: temperature 0 and no stage that can
  // move the best candidate (logit bias, penalties, DRY, typical-p, XTC, dynamic
  // temperature, mirostat, a grammar).
  bool argmax_suffices() const;
  // The same before a grammar: the pick made freely is the arg max.
  bool free_pick_is_argmax() const;
};

struct Candidate {
  int32_t id;
  float logit;
  float p;  // filled by softmax
};

// The candidates a stage works on. `sorted`: by logit, descending (ties by id).
struct Candidates {
  std::vector<Candidate> items;
  bool sorted = false;

  static Candidates from_logits(std::span<const float> logits);
  void sort();                           // by logit descending, then id ascending
  void softmax();                        // p from logits (sorts first)
  std::vector<int32_t> ids() const;
};

// The stages, usable one by one.
void apply_logit_bias(Candidates& c, std::span<const LogitBias> bias);
void apply_top_k(Candidates& c, int32_t k);
void apply_top_p(Candidates& c, float p, size_t min_keep);
void apply_min_p(Candidates& c, float p, size_t min_keep);
void apply_typical_p(Candidates& c, float p, size_t min_keep);
void apply_temperature(Candidates& c, float temperature);
// Dynamic temperature (llama.cpp's temp_ext): temperature + range scaled by the
// normalised entropy of the candidates to `exponent`, from max(0, t - range) to t + range.
void apply_dynamic_temperature(Candidates& c, float temperature, float range, float exponent);
// Top-n-sigma: logits below max - n * std (over the finite ones) become -infinity.
void apply_top_n_sigma(Candidates& c, float n);
// XTC ("exclude top choices"): when `chance` <= probability, removes every candidate
// at or above `threshold` but the least probable of them (keeping at least min_keep).
void apply_xtc(Candidates& c, float probability, float threshold, size_t min_keep, double chance);
// XTC draws its chance only when it can act (llama.cpp's rule, which keeps the draws
// the same as its own).
bool xtc_can_act(const Candidates& c, float probability, float threshold);
// Index into c.items of a draw from softmax(logits) with `uniform` in [0, 1).
size_t draw(Candidates& c, double uniform);

// Counts of the last N accepted tokens, for the penalties.
class PenaltyWindow {
 public:
  explicit PenaltyWindow(int32_t last_n) : last_n_(last_n) {}
  void accept(int32_t token);
  void reset();
  int count(int32_t token) const;
  void apply(Candidates& c, float repeat, float frequency, float presence) const;

 private:
  int32_t last_n_;
  std::deque<int32_t> window_;
  std::unordered_map<int32_t, int> counts_;
};

// Uniform doubles in [0, 1) from a seeded std::mt19937, the same on every platform.
class Random {
 public:
  explicit Random(uint32_t seed) : engine_(seed) {}
  double uniform();  // 53 random bits

 private:
  std::mt19937 engine_;
};

class Sampler {
 public:
  explicit Sampler(SamplingParams params);

  // Picks the next token from the logits of the whole vocabulary. Does not record it:
  // call accept() with the token actually used.
  int32_t sample(std::span<const float> logits);
  // Records a generated token: the repetition penalties' history, and the grammar's
  // position (throws std::runtime_error when the grammar does not allow it).
  void accept(int32_t token);
  // Records a token of the prompt: the penalties' history only (llama.cpp's grammar
  // starts at the reply).
  void remember(int32_t token);
  // Forgets the accepted tokens, restarts the generator from the seed and the grammar
  // from its start.
  void reset();

  // The candidates left after every stage, before the draw (for inspection and tests;
  // XTC acts whenever it is on, as if its chance came up).
  Candidates filter(std::span<const float> logits) const { return filter(logits, nullptr); }
  // Mirostat's running target surprise (2 tau at the start).
  float mirostat_mu() const { return mu_; }
  const SamplingParams& params() const { return params_; }
  uint32_t seed() const { return seed_; }

 private:
  // xtc_random: XTC's chance comes from it (null: XTC acts whenever it is on).
  Candidates filter(std::span<const float> logits, Random* xtc_random) const;
  int32_t sample_unconstrained(std::span<const float> logits);
  std::optional<int32_t> best_allowed_of_the_top(std::span<const float> logits) const;
  int32_t sample_mirostat(std::span<const float> logits);

  SamplingParams params_;
  uint32_t seed_;
  Random random_;
  Random xtc_random_;  // XTC's own stream, so it moves no other draw and goes with none
  PenaltyWindow penalties_;
  DryHistory dry_;
  float mu_ = 0.0f;
  bool plain_greedy_ = false;  // sample() takes the arg max directly
  std::optional<GrammarMatcher> grammar_;
  // A lazy grammar's wait for its trigger: the reply's last bytes (a trigger may span tokens).
  bool grammar_waiting_ = false;
  std::string reply_tail_;
  void watch_for_trigger(int32_t token);
};

}  // namespace pico::sample
