// Placement: which workers take part, in which order, and which contiguous layer
// range each runs, chosen from what each worker measured (its profile: seconds per
// layer at batch 1 and per token at a prefill-sized batch, and the memory it offers)
// and what each link measured (latency, bandwidth), subject to memory: a stage holds
// its layers' weights plus the KV and recurrent state of `parallel` sequences of `ctx`
// positions.
//
// The cost model is pico's scheduler: a step carries the next token of every
// decoding sequence through every stage and back, and a sequence's next step waits
// for its logits, so the time per step is a sum over the stages (compute, then the
// hidden states sent on) plus the coordinator's two links. The objective sets the
// step's batch: `latency` one token (one stream), `throughput` `concurrency` tokens
// (that many streams at once). A layer's time at batch n lies on the line through its
// measures, one token and batches of 2, 4, 8 ... (layer_step_seconds). Both objectives are then additive over
// stages, and the search is exact: dynamic programming over (workers used, last
// worker, layers covered) tries every subset and order of up to
// `exhaustive_order_limit` workers; beyond that the workers keep the order given and
// the search chooses which take part and their ranges.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "model/model.hpp"
#include "link_times.hpp"

namespace pico::coordinator {

enum class Objective { latency, throughput };

// A layer's time for a step of `tokens` tokens from its profile: one token's time
// (`decode_seconds`), and the time per token of a batch of each of `batches` tokens
// (ascending, > 1). Between two measured batches, the line through both points (a
// step's weights are read once and its arithmetic grows with its tokens); past the
// largest, its time per token; never less than one token's time.
inline double layer_step_seconds(double decode_seconds, const std::vector<int>& batches,
                                 const std::vector<double>& seconds_per_token, double tokens) {
  double below_tokens = 1, below_seconds = decode_seconds;
  for (size_t b = 0; b < batches.size() && b < seconds_per_token.size(); ++b) {
    const double at = batches[b], seconds = at * seconds_per_token[b];
    if (tokens <= at && at > below_tokens) {
      const double line = below_seconds + (tokens - below_tokens) / (at - below_tokens) * (seconds - below_seconds);
      return std::max(decode_seconds, line);
    }
    below_tokens = at;
    below_seconds = seconds;
  }
  if (below_tokens <= 1) return std::max(decode_seconds, tokens * decode_seconds);
  return std::max(decode_seconds, tokens * below_seconds / below_tokens);
}

// Throws std::invalid_argument unless "latency" or "throughput".
Objective parse_objective(const std::string& text);
const char* to_string(Objective objective);

// What a layer needs wherever it runs.
struct LayerNeeds {
  uint64_t weight_bytes = 0;
  uint64_t kv_bytes_per_position = 0;     // one sequence
  uint64_t state_bytes_per_sequence = 0;  // recurrent state and its checkpoints
};

// One worker's profile, over every layer of the model.
struct WorkerMeasures {
  std::string name;                              // its address, for messages
  std::vector<double> decode_seconds;                         // per layer: a batch of one token
  std::vector<std::vector<double>> batch_seconds_per_token;   // per layer: per token of each profile batch
  double head_decode_seconds = 0;                             // output norm and head (the last stage)
  std::vector<double> head_batch_seconds_per_token = {0.0};   // per profile batch
  std::vector<int> profile_batches = {64};                    // tokens of the batches measured, ascending
  uint64_t memory_bytes = 0;                     // what it offers for weights + KV + state
  // A worker that serves only these layers (started with --layers A-B, not auto): it
  // takes part with exactly them, or stands by for a stage of exactly them, or not at all.
  std::optional<model::LayerRange> fixed_layers;
};

// The worker's times, every layer's and the head's, `factor` times as long (a worker
// seen slower than its profile).
void scale_measures(WorkerMeasures& worker, double factor);

struct PlacementProblem {
  std::vector<LayerNeeds> layers;
  uint64_t first_stage_bytes = 0;  // read by the stage holding layer 0 (token embeddings)
  uint64_t last_stage_bytes = 0;   // read by the stage holding the last layer (output norm, head)
  int64_t ctx = 4096;              // positions per sequence
  int64_t page_positions = 1;      // KV grows in pages of this many positions
  int parallel = 1;                // sequences holding state at once
  uint64_t input_bytes_per_token = 4;    // coordinator -> first stage (a token id)
  uint64_t hidden_bytes_per_token = 0;   // stage -> stage (n_embd values)
  uint64_t logits_bytes_per_token = 0;   // last stage -> coordinator
  std::vector<WorkerMeasures> workers;
  std::vector<LinkMeasure> coordinator_links;  // per worker: coordinator <-> worker
  // [i][j]: worker i sends to worker j. Missing (or empty): estimated from the two
  // workers' coordinator links (the larger latency, the smaller bandwidth).
  std::vector<std::vector<std::optional<LinkMeasure>>> worker_links;
  Objective objective = Objective::latency;
  int concurrency = 1;  // throughput: tokens per step
  // The workers left out of the chain stand by where they fit and form more lanes
  // (pico-coord --replicas spread, predict_lanes). With the throughput objective the
  // search then weighs what every lane serves, not the chain alone: the fastest chain of
  // every subset of workers is tried as the first lane (a slower chain can leave a
  // standby at every stage).
  bool lanes = false;
  size_t exhaustive_order_limit = 8;
};

struct PlacedStage {
  size_t worker = 0;  // index into PlacementProblem::workers
  model::LayerRange layers;
  double compute_seconds = 0;  // its layers (and the head on the last stage) for one step
  double send_seconds = 0;     // its output to the next stage (the last: to the coordinator)
  uint64_t memory_bytes = 0;   // weights + state it holds
};

struct Placement {
  std::vector<PlacedStage> stages;
  int batch = 1;               // tokens per step
  double step_seconds = 0;     // one step through every stage and back
  double tokens_per_second = 0;  // batch / step_seconds
  bool every_order = true;     // every order of the workers was tried
  // Per worker: empty when it takes part, else why it was left out.
  std::vector<std::string> excluded;
};

// No placement holds the model (the text says which worker could hold what).
class PlacementError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws std::invalid_argument for a malformed problem (sizes that disagree, no
// worker, a non-positive bandwidth), PlacementError when nothing fits.
Placement place(const PlacementProblem& problem);

// What the cost model predicts for a given chain (the workers in pipeline order, each
// with its range; the ranges tile the model): the placement place() would report for
// it, to compare the running split with a new one. nullopt when a stage does not fit
// its worker's memory. Throws std::invalid_argument for a malformed problem, a worker
// index out of range, a worker used twice, or ranges that do not tile the model.
std::optional<Placement> evaluate_placement(const PlacementProblem& problem,
                                            const std::vector<std::pair<size_t, model::LayerRange>>& chain);

// Where each worker of a placement problem goes when a running cluster takes a new
// placement: a placed worker runs its stage's range; a worker left out that can hold a
// placed range (its memory) stands by as that stage's replica, for the stage with the
// fewest standbys so far (the earliest of those); one that can hold none leaves. A
// worker of fixed layers stands by only for a stage of exactly its layers.
struct WorkerRole {
  std::optional<size_t> stage;           // the placed stage it runs or stands by for; nullopt: it leaves
  bool standby = false;
};
std::vector<WorkerRole> worker_roles(const PlacementProblem& problem, const Placement& placement);

// Whether a lane takes a new sequence before the best lane so far, by what their
// workers predict for a step with one more sequence (`step`, `best_step`) and the
// sequences each runs: a step shorter by more than a tenth, or steps within a tenth of
// each other (the noise of like machines' profiles) and fewer sequences.
inline bool takes_the_sequence_first(double step, long sequences, double best_step, long best_sequences) {
  const bool shorter = step < 0.9 * best_step;
  const bool alike = step <= best_step / 0.9 && best_step <= step / 0.9;
  return shorter || (alike && sequences < best_sequences);
}

// The lanes a running cluster forms from a placement (pico-coord --replicas spread, the
// default): the placed chain is the first; with PlacementProblem::lanes, while every
// stage has a standby left (worker_roles), the first left at each stage form one more,
// as Pipeline::form_lanes takes them (without, the chain is the one lane).
// `concurrency` sequences then go one at a time to the lane whose step with one more
// sequence (compute and links) is the shortest (takes_the_sequence_first), as
// Engine::quietest_lane sends them; each lane steps its own sequences' tokens, the
// lanes at once.
struct LanePrediction {
  std::vector<std::pair<size_t, model::LayerRange>> chain;  // per stage: worker, layers
  int sequences = 0;
  double step_seconds = 0;       // a step of its sequences' tokens (0: it has none)
  double tokens_per_second = 0;
};
struct LanesPrediction {
  std::vector<LanePrediction> lanes;
  double tokens_per_second = 0;  // every lane's together
};
LanesPrediction predict_lanes(const PlacementProblem& problem, const Placement& placement, int concurrency);

// The tok/s a placement serves by the problem's objective: with lanes and the throughput
// objective every lane's together at the problem's concurrency (predict_lanes), else the
// chain's.
double served_tokens_per_second(const PlacementProblem& problem, const Placement& placement);

// A placement problem's links by worker address (its workers' names), and the bytes a
// step carries per token: what a running pipeline adds to its lanes' predicted steps
// (Pipeline::set_links), so that a chain's step there is the placement's.
LinkBook link_book(const PlacementProblem& problem);

// The bytes a stage of `layers` holds on a worker (weights, its share of the
// embeddings / head, state of `parallel` sequences of ctx positions).
uint64_t stage_memory_bytes(const PlacementProblem& problem, model::LayerRange layers);

}  // namespace pico::coordinator
