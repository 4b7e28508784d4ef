#include "placement.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

namespace pico::coordinator {

namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

std::string mib(uint64_t bytes) { return fmt::format("{:.0f} MiB", static_cast<double>(bytes) / (1 << 20)); }

// What the search needs, computed once: per worker, prefix sums of its layer times at
// the step's batch; per layer range, its memory; per pair of workers, the link cost.
class Costs {
 public:
  // The objective's batch: one token for latency, `concurrency` for throughput.
  explicit Costs(const PlacementProblem& p)
      : Costs(p, p.objective == Objective::throughput ? std::max(1, p.concurrency) : 1) {}
  Costs(const PlacementProblem& p, int batch) : p_(p), layers_(static_cast<int>(p.layers.size())), batch_(batch) {
    const double n = batch_;
    for (const WorkerMeasures& w : p.workers) {
      std::vector<double> prefix(layers_ + 1, 0.0);
      for (int l = 0; l < layers_; ++l) {
        prefix[l + 1] = prefix[l] + layer_step_seconds(w.decode_seconds[l], w.profile_batches, w.batch_seconds_per_token[l], n);
      }
      time_prefix_.push_back(std::move(prefix));
      head_.push_back(layer_step_seconds(w.head_decode_seconds, w.profile_batches, w.head_batch_seconds_per_token, n));
    }
    // The memory of a range in O(1): stage_memory_bytes of a range is the prefix sums'
    // difference plus the first and last stages' share.
    for (int l = 0; l <= layers_; ++l) {
      memory_prefix_.push_back(stage_memory_bytes(p, {0, l}) - p.first_stage_bytes -
                               (l == layers_ ? p.last_stage_bytes : 0));
    }
  }

  int layers() const { return layers_; }
  int batch() const { return batch_; }
  size_t workers() const { return p_.workers.size(); }

  double compute(size_t w, int first, int last) const {
    return time_prefix_[w][last] - time_prefix_[w][first] + (last == layers_ ? head_[w] : 0.0);
  }
  // Worker w may run layers [first, last): its memory holds them, and a worker of fixed
  // layers runs only those.
  bool fits(size_t w, int first, int last) const { return holds(w, first, last) && allowed(w, first, last); }
  bool allowed(size_t w, int first, int last) const {
    const auto& fixed = p_.workers[w].fixed_layers;
    return !fixed || (fixed->first == first && fixed->last == last);
  }
  // Its memory holds them (a longer range holds more: the searches stop at the first
  // range that does not fit).
  bool holds(size_t w, int first, int last) const {
    const uint64_t bytes = memory_prefix_[static_cast<size_t>(last)] - memory_prefix_[static_cast<size_t>(first)] +
                           (first == 0 ? p_.first_stage_bytes : 0) + (last == layers_ ? p_.last_stage_bytes : 0);
    return bytes <= p_.workers[w].memory_bytes;
  }
  double from_coordinator(size_t w) const {
    return transfer(p_.coordinator_links[w], p_.input_bytes_per_token);
  }
  double to_coordinator(size_t w) const { return transfer(p_.coordinator_links[w], p_.logits_bytes_per_token); }
  double between(size_t from, size_t to) const { return transfer(link(from, to), p_.hidden_bytes_per_token); }

 private:
  LinkMeasure link(size_t from, size_t to) const {
    if (from < p_.worker_links.size() && to < p_.worker_links[from].size() && p_.worker_links[from][to]) {
      return *p_.worker_links[from][to];
    }
    return estimated_link(p_.coordinator_links[from], p_.coordinator_links[to]);
  }
  double transfer(const LinkMeasure& link, uint64_t bytes_per_token) const {
    return link_seconds(link, bytes_per_token, batch_);
  }

  const PlacementProblem& p_;
  int layers_ = 0;
  int batch_ = 1;
  std::vector<std::vector<double>> time_prefix_;
  std::vector<double> head_;
  std::vector<uint64_t> memory_prefix_;  // [l]: the layers [0, l) alone
};

// One chain of stages as the search found it: (worker, first layer) per stage.
struct Chain {
  double seconds = kInfinity;
  std::vector<std::pair<size_t, int>> stages;  // worker, first layer; each ends where the next starts
};

// Every subset and order: best[mask] is the fastest chain using exactly the workers
// of mask. dp over (mask, last worker, layers covered), the cost of the chain so far
// (the coordinator's link in, each stage's compute and the link into it).
std::vector<Chain> search_every_order(const Costs& c) {
  const size_t W = c.workers();
  const int L = c.layers();
  const size_t masks = size_t{1} << W;
  const auto at = [&](size_t mask, size_t last, int l) { return (mask * W + last) * (L + 1) + static_cast<size_t>(l); };
  std::vector<double> dp(masks * W * (L + 1), kInfinity);
  std::vector<int32_t> parent_last(dp.size(), -1), parent_layer(dp.size(), -1);
  for (size_t w = 0; w < W; ++w) {
    for (int l = 1; l <= L; ++l) {
      if (c.fits(w, 0, l)) dp[at(size_t{1} << w, w, l)] = c.from_coordinator(w) + c.compute(w, 0, l);
    }
  }
  for (size_t mask = 1; mask < masks; ++mask) {
    for (size_t last = 0; last < W; ++last) {
      if (!(mask & (size_t{1} << last))) continue;
      for (int l = 1; l < L; ++l) {
        const double here = dp[at(mask, last, l)];
        if (here == kInfinity) continue;
        for (size_t w = 0; w < W; ++w) {
          if (mask & (size_t{1} << w)) continue;
          const double link = here + c.between(last, w);
          const size_t next_mask = mask | (size_t{1} << w);
          for (int e = l + 1; e <= L; ++e) {
            if (!c.holds(w, l, e)) break;  // a longer range holds more
            if (!c.allowed(w, l, e)) continue;
            const double cost = link + c.compute(w, l, e);
            const size_t i = at(next_mask, w, e);
            if (cost < dp[i]) {
              dp[i] = cost;
              parent_last[i] = static_cast<int32_t>(last);
              parent_layer[i] = l;
            }
          }
        }
      }
    }
  }
  std::vector<Chain> best(masks);
  for (size_t mask = 1; mask < masks; ++mask) {
    for (size_t last = 0; last < W; ++last) {
      const double cost = dp[at(mask, last, L)] + c.to_coordinator(last);
      if (!(cost < best[mask].seconds)) continue;
      Chain chain{cost, {}};
      size_t m = mask, w = last;
      int l = L;
      while (true) {
        const size_t i = at(m, w, l);
        const int first = parent_layer[i] < 0 ? 0 : parent_layer[i];
        chain.stages.insert(chain.stages.begin(), {w, first});
        if (parent_last[i] < 0) break;
        m &= ~(size_t{1} << w);
        w = static_cast<size_t>(parent_last[i]);
        l = first;
      }
      best[mask] = std::move(chain);
    }
  }
  return best;
}

// The workers in the order given, each taking part or not. required: a worker that
// must take part (SIZE_MAX: none), for the reason a worker was left out.
Chain search_in_order(const Costs& c, size_t required) {
  const size_t W = c.workers();
  const int L = c.layers();
  // dp over (last worker, layers covered, whether `required` is in the chain).
  const auto at = [&](size_t last, int l, int has) { return (last * (L + 1) + static_cast<size_t>(l)) * 2 + has; };
  std::vector<double> dp(W * (L + 1) * 2, kInfinity);
  std::vector<int64_t> parent(dp.size(), -1);
  for (size_t w = 0; w < W; ++w) {
    for (int l = 1; l <= L && c.holds(w, 0, l); ++l) {
      if (c.allowed(w, 0, l)) dp[at(w, l, w == required)] = c.from_coordinator(w) + c.compute(w, 0, l);
    }
  }
  for (size_t last = 0; last < W; ++last) {
    for (int l = 1; l < L; ++l) {
      for (int has = 0; has < 2; ++has) {
        const double here = dp[at(last, l, has)];
        if (here == kInfinity) continue;
        for (size_t w = last + 1; w < W; ++w) {
          const double link = here + c.between(last, w);
          for (int e = l + 1; e <= L && c.holds(w, l, e); ++e) {
            if (!c.allowed(w, l, e)) continue;
            const size_t i = at(w, e, has || w == required);
            const double cost = link + c.compute(w, l, e);
            if (cost < dp[i]) {
              dp[i] = cost;
              parent[i] = static_cast<int64_t>(at(last, l, has));
            }
          }
        }
      }
    }
  }
  Chain best;
  const int need = required == SIZE_MAX ? 0 : 1;
  for (size_t last = 0; last < W; ++last) {
    for (int has = need; has < 2; ++has) {
      const double cost = dp[at(last, L, has)] + c.to_coordinator(last);
      if (!(cost < best.seconds)) continue;
      best = {cost, {}};
      for (int64_t i = static_cast<int64_t>(at(last, L, has)); i >= 0; i = parent[static_cast<size_t>(i)]) {
        const size_t w = static_cast<size_t>(i) / 2 / static_cast<size_t>(L + 1);
        const int64_t p = parent[static_cast<size_t>(i)];
        const int first = p < 0 ? 0 : static_cast<int>(static_cast<size_t>(p) / 2 % static_cast<size_t>(L + 1));
        best.stages.insert(best.stages.begin(), {w, first});
      }
    }
  }
  return best;
}

void check_problem(const PlacementProblem& p) {
  if (p.layers.empty()) throw std::invalid_argument("placement: the model has no layers");
  if (p.workers.empty()) throw std::invalid_argument("placement: no worker");
  if (p.coordinator_links.size() != p.workers.size()) {
    throw std::invalid_argument("placement: one coordinator link per worker");
  }
  if (p.ctx <= 0 || p.parallel <= 0 || p.page_positions <= 0 || p.concurrency <= 0) {
    throw std::invalid_argument("placement: ctx, parallel, page positions and concurrency must be positive");
  }
  const auto check_link = [](const LinkMeasure& l, const std::string& what) {
    if (!(l.bytes_per_second > 0) || !(l.latency_seconds >= 0) || !std::isfinite(l.latency_seconds)) {
      throw std::invalid_argument("placement: the link " + what + " has no positive bandwidth or a bad latency");
    }
  };
  for (size_t i = 0; i < p.workers.size(); ++i) {
    const WorkerMeasures& w = p.workers[i];
    if (w.decode_seconds.size() != p.layers.size() || w.batch_seconds_per_token.size() != p.layers.size()) {
      throw std::invalid_argument("placement: worker " + w.name + " has no time for every layer");
    }
    for (size_t b = 0; b < w.profile_batches.size(); ++b) {
      if (w.profile_batches[b] < 2 || (b > 0 && w.profile_batches[b] <= w.profile_batches[b - 1])) {
        throw std::invalid_argument("placement: worker " + w.name + "'s profile batches are not ascending and > 1");
      }
    }
    const auto bad = [](double s) { return !(s >= 0) || !std::isfinite(s); };
    const auto bad_batches = [&](const std::vector<double>& per_batch) {
      return per_batch.size() != w.profile_batches.size() || std::any_of(per_batch.begin(), per_batch.end(), bad);
    };
    if (std::any_of(w.decode_seconds.begin(), w.decode_seconds.end(), bad) ||
        std::any_of(w.batch_seconds_per_token.begin(), w.batch_seconds_per_token.end(), bad_batches) ||
        bad(w.head_decode_seconds) || bad_batches(w.head_batch_seconds_per_token)) {
      throw std::invalid_argument("placement: worker " + w.name + " has a negative or non-finite time, or not one per batch");
    }
    check_link(p.coordinator_links[i], "coordinator - " + w.name);
    if (w.fixed_layers && (w.fixed_layers->first < 0 || w.fixed_layers->last <= w.fixed_layers->first ||
                           w.fixed_layers->last > static_cast<int32_t>(p.layers.size()))) {
      throw std::invalid_argument("placement: worker " + w.name + "'s fixed layers are no range of the model's");
    }
  }
  for (size_t i = 0; i < p.worker_links.size(); ++i) {
    for (size_t j = 0; j < p.worker_links[i].size(); ++j) {
      if (p.worker_links[i][j]) check_link(*p.worker_links[i][j], p.workers.at(i).name + " -> " + p.workers.at(j).name);
    }
  }
}

// Why worker w holds no layer at all, or empty when it holds some range.
std::string cannot_hold(const PlacementProblem& p, const Costs& c, size_t w) {
  if (const auto& fixed = p.workers[w].fixed_layers) {
    if (c.fits(w, fixed->first, fixed->last)) return {};
    const uint64_t bytes = stage_memory_bytes(p, *fixed);
    return fmt::format("it serves only layers {} (not started with --layers auto), which take {} ({} bytes) with "
                       "the state of {} x {} positions, and it offers {} ({} bytes)",
                       model::to_string(*fixed), mib(bytes), bytes, p.parallel, p.ctx, mib(p.workers[w].memory_bytes),
                       p.workers[w].memory_bytes);
  }
  const int L = c.layers();
  for (int l = 0; l < L; ++l) {
    if (c.fits(w, l, l + 1)) return {};
  }
  uint64_t smallest = UINT64_MAX;
  for (int l = 0; l < L; ++l) smallest = std::min(smallest, stage_memory_bytes(p, {l, l + 1}));
  return fmt::format("it offers {} ({} bytes) but the smallest layer takes {} ({} bytes) with the state of {} x {} "
                     "positions",
                     mib(p.workers[w].memory_bytes), p.workers[w].memory_bytes, mib(smallest), smallest, p.parallel,
                     p.ctx);
}

Placement make_placement(const PlacementProblem& p, const Costs& c, const Chain& chain) {
  Placement out;
  out.batch = c.batch();
  out.step_seconds = chain.seconds;
  out.tokens_per_second = c.batch() / chain.seconds;
  for (size_t s = 0; s < chain.stages.size(); ++s) {
    const auto [w, first] = chain.stages[s];
    const bool last_stage = s + 1 == chain.stages.size();
    const int last = last_stage ? c.layers() : chain.stages[s + 1].second;
    PlacedStage stage;
    stage.worker = w;
    stage.layers = {first, last};
    stage.compute_seconds = c.compute(w, first, last);
    stage.send_seconds = last_stage ? c.to_coordinator(w) : c.between(w, chain.stages[s + 1].first);
    stage.memory_bytes = stage_memory_bytes(p, stage.layers);
    out.stages.push_back(stage);
  }
  return out;
}

// A given chain (per stage: worker, layers) costed under c; infinite seconds when a
// stage does not fit its worker. Throws std::invalid_argument for a worker out of range
// or used twice, or ranges that do not tile the model.
Chain cost_chain(const PlacementProblem& p, const Costs& c,
                 const std::vector<std::pair<size_t, model::LayerRange>>& chain) {
  Chain out{0.0, {}};
  std::vector<bool> used(p.workers.size(), false);
  int next = 0;
  bool fits = true;
  for (size_t s = 0; s < chain.size(); ++s) {
    const auto& [w, layers] = chain[s];
    if (w >= p.workers.size() || used[w]) {
      throw std::invalid_argument("placement: worker " + std::to_string(w) + " is no worker or used twice");
    }
    if (layers.first != next || layers.last <= layers.first || layers.last > c.layers()) {
      throw std::invalid_argument("placement: the ranges do not tile the model's layers");
    }
    used[w] = true;
    fits = fits && c.fits(w, layers.first, layers.last);
    out.seconds += (s == 0 ? c.from_coordinator(w) : c.between(chain[s - 1].first, w)) +
                   c.compute(w, layers.first, layers.last);
    out.stages.emplace_back(w, layers.first);
    next = layers.last;
  }
  if (next != c.layers()) throw std::invalid_argument("placement: the ranges do not tile the model's layers");
  out.seconds = fits ? out.seconds + c.to_coordinator(chain.back().first) : kInfinity;
  return out;
}

}  // namespace

Objective parse_objective(const std::string& text) {
  if (text == "latency") return Objective::latency;
  if (text == "throughput") return Objective::throughput;
  throw std::invalid_argument("objective '" + text + "' is not latency or throughput");
}

const char* to_string(Objective objective) { return objective == Objective::latency ? "latency" : "throughput"; }

void scale_measures(WorkerMeasures& w, double factor) {
  for (double& s : w.decode_seconds) s *= factor;
  for (auto& per_batch : w.batch_seconds_per_token) {
    for (double& s : per_batch) s *= factor;
  }
  w.head_decode_seconds *= factor;
  for (double& s : w.head_batch_seconds_per_token) s *= factor;
}

uint64_t stage_memory_bytes(const PlacementProblem& p, model::LayerRange layers) {
  const int64_t pages = (p.ctx + p.page_positions - 1) / p.page_positions;
  const uint64_t positions = static_cast<uint64_t>(pages * p.page_positions);
  uint64_t weights = 0, per_sequence = 0;
  for (int l = layers.first; l < layers.last; ++l) {
    const LayerNeeds& n = p.layers[static_cast<size_t>(l)];
    weights += n.weight_bytes;
    per_sequence += n.kv_bytes_per_position * positions + n.state_bytes_per_sequence;
  }
  if (layers.first == 0) weights += p.first_stage_bytes;
  if (layers.last == static_cast<int>(p.layers.size())) weights += p.last_stage_bytes;
  return weights + per_sequence * static_cast<uint64_t>(p.parallel);
}

Placement place(const PlacementProblem& p) {
  check_problem(p);
  const Costs c(p);
  const size_t W = p.workers.size();
  const bool every_order = W <= p.exhaustive_order_limit && W < 20;
  Chain best;
  std::vector<double> best_with(W, kInfinity);  // the fastest chain that uses each worker
  std::vector<Chain> by_mask;
  if (every_order) {
    by_mask = search_every_order(c);
    for (size_t mask = 1; mask < by_mask.size(); ++mask) {
      if (by_mask[mask].seconds < best.seconds) best = by_mask[mask];
      for (size_t w = 0; w < W; ++w) {
        if (mask & (size_t{1} << w)) best_with[w] = std::min(best_with[w], by_mask[mask].seconds);
      }
    }
  } else {
    best = search_in_order(c, SIZE_MAX);
  }
  if (best.seconds == kInfinity) {
    std::string why = fmt::format("no placement of the model's {} layers fits the workers' memory (state of {} "
                                  "sequences x {} positions; the whole model takes {}):",
                                  c.layers(), p.parallel, p.ctx, mib(stage_memory_bytes(p, {0, c.layers()})));
    for (size_t w = 0; w < W; ++w) {
      const std::string reason = cannot_hold(p, c, w);
      const char* holds = p.workers[w].fixed_layers ? "not its fixed layers" : "not even one layer";
      why += fmt::format(" {} offers {}{}{};", p.workers[w].name, mib(p.workers[w].memory_bytes),
                         reason.empty() ? "" : ", ", reason.empty() ? "" : holds);
    }
    throw PlacementError(why + " lower ctx or parallel, or add workers");
  }
  Placement out = make_placement(p, c, best);
  // With lanes, every subset's fastest chain as the first lane, the others standing by:
  // the most tok/s served wins (the fastest chain on a tie).
  const bool weigh_lanes = p.lanes && p.objective == Objective::throughput && every_order;
  double served = weigh_lanes ? served_tokens_per_second(p, out) : 0;
  std::vector<double> served_with(W, 0.0);  // the most served with each worker in the first lane
  if (weigh_lanes) {
    for (size_t mask = 1; mask < by_mask.size(); ++mask) {
      if (by_mask[mask].seconds == kInfinity) continue;
      Placement candidate = make_placement(p, c, by_mask[mask]);
      const double candidate_served = served_tokens_per_second(p, candidate);
      for (size_t w = 0; w < W; ++w) {
        if (mask & (size_t{1} << w)) served_with[w] = std::max(served_with[w], candidate_served);
      }
      if (candidate_served > served * (1 + 1e-9)) {
        served = candidate_served;
        out = std::move(candidate);
      }
    }
  }
  out.every_order = every_order;
  out.excluded.assign(W, {});
  std::vector<bool> used(W, false);
  for (const PlacedStage& s : out.stages) used[s.worker] = true;
  for (size_t w = 0; w < W; ++w) {
    if (used[w]) continue;
    if (const std::string reason = cannot_hold(p, c, w); !reason.empty()) {
      out.excluded[w] = "holds no layer: " + reason;
      continue;
    }
    // tok/s, 0 where nothing that uses it fits
    const double with = weigh_lanes   ? served_with[w]
                        : every_order ? c.batch() / best_with[w]
                                      : c.batch() / search_in_order(c, w).seconds;
    if (with == 0) {
      out.excluded[w] = "no placement that uses it fits the other workers' memory";
    } else if (weigh_lanes) {
      out.excluded[w] = fmt::format("the best lanes whose first chain uses it predict {:.2f} tok/s, the chosen ones "
                                    "{:.2f}",
                                    with, served);
    } else {
      out.excluded[w] = fmt::format("the best placement that uses it predicts {:.2f} tok/s, the chosen one {:.2f}",
                                    with, out.tokens_per_second);
    }
  }
  return out;
}

double served_tokens_per_second(const PlacementProblem& p, const Placement& placement) {
  if (!p.lanes || p.objective != Objective::throughput) return placement.tokens_per_second;
  return predict_lanes(p, placement, p.concurrency).tokens_per_second;
}

std::vector<WorkerRole> worker_roles(const PlacementProblem& p, const Placement& placement) {
  std::vector<WorkerRole> roles(p.workers.size());
  std::vector<size_t> standbys(placement.stages.size(), 0);
  for (size_t s = 0; s < placement.stages.size(); ++s) roles.at(placement.stages[s].worker).stage = s;
  for (size_t w = 0; w < p.workers.size(); ++w) {
    if (roles[w].stage) continue;
    for (size_t s = 0; s < placement.stages.size(); ++s) {
      const model::LayerRange& layers = placement.stages[s].layers;
      if (stage_memory_bytes(p, layers) > p.workers[w].memory_bytes) continue;
      const auto& fixed = p.workers[w].fixed_layers;
      if (fixed && (fixed->first != layers.first || fixed->last != layers.last)) continue;
      if (!roles[w].stage || standbys[s] < standbys[*roles[w].stage]) roles[w].stage = s;
    }
    if (roles[w].stage) {
      roles[w].standby = true;
      ++standbys[*roles[w].stage];
    }
  }
  return roles;
}

LanesPrediction predict_lanes(const PlacementProblem& p, const Placement& placement, int concurrency) {
  const std::vector<WorkerRole> roles = worker_roles(p, placement);
  std::vector<std::vector<size_t>> standbys(placement.stages.size());
  for (size_t w = 0; w < roles.size(); ++w) {
    if (roles[w].standby) standbys[*roles[w].stage].push_back(w);
  }
  // The placed chain, then (with lanes) as many lanes as the stage with the fewest
  // standbys has.
  size_t more = standbys.empty() || !p.lanes ? 0 : SIZE_MAX;
  for (const auto& at_stage : standbys) more = std::min(more, at_stage.size());
  LanesPrediction out;
  out.lanes.resize(1 + more);
  for (size_t s = 0; s < placement.stages.size(); ++s) {
    out.lanes[0].chain.emplace_back(placement.stages[s].worker, placement.stages[s].layers);
    for (size_t k = 0; k < more; ++k) out.lanes[1 + k].chain.emplace_back(standbys[s][k], placement.stages[s].layers);
  }
  // A lane's step of n tokens: the cost model's at a batch of n.
  check_problem(p);
  std::map<int, Costs> at_batch;
  std::map<std::pair<size_t, int>, double> steps;
  const auto step = [&](size_t l, int n) {
    const auto known = steps.find({l, n});
    if (known != steps.end()) return known->second;
    const Costs& c = at_batch.try_emplace(n, p, n).first->second;
    return steps[{l, n}] = cost_chain(p, c, out.lanes[l].chain).seconds;
  };
  for (int c = 0; c < concurrency; ++c) {
    size_t best = 0;
    for (size_t l = 1; l < out.lanes.size(); ++l) {
      if (takes_the_sequence_first(step(l, out.lanes[l].sequences + 1), out.lanes[l].sequences,
                                   step(best, out.lanes[best].sequences + 1), out.lanes[best].sequences)) {
        best = l;
      }
    }
    ++out.lanes[best].sequences;
  }
  for (size_t l = 0; l < out.lanes.size(); ++l) {
    LanePrediction& lane = out.lanes[l];
    if (lane.sequences == 0) continue;
    lane.step_seconds = step(l, lane.sequences);
    lane.tokens_per_second = lane.sequences / lane.step_seconds;
    out.tokens_per_second += lane.tokens_per_second;
  }
  return out;
}

std::optional<Placement> evaluate_placement(const PlacementProblem& p,
                                            const std::vector<std::pair<size_t, model::LayerRange>>& chain) {
  check_problem(p);
  const Costs c(p);
  const Chain asked = cost_chain(p, c, chain);
  if (asked.seconds == kInfinity) return std::nullopt;
  Placement out = make_placement(p, c, asked);
  out.excluded.assign(p.workers.size(), "not in the chain");
  for (const auto& stage : chain) out.excluded[stage.first].clear();
  return out;
}

LinkBook link_book(const PlacementProblem& problem) {
  LinkBook book;
  book.input_bytes_per_token = problem.input_bytes_per_token;
  book.hidden_bytes_per_token = problem.hidden_bytes_per_token;
  book.logits_bytes_per_token = problem.logits_bytes_per_token;
  for (size_t i = 0; i < problem.workers.size() && i < problem.coordinator_links.size(); ++i) {
    book.coordinator[problem.workers[i].name] = problem.coordinator_links[i];
    for (size_t j = 0; i < problem.worker_links.size() && j < problem.worker_links[i].size(); ++j) {
      if (j < problem.workers.size() && problem.worker_links[i][j]) {
        book.between[{problem.workers[i].name, problem.workers[j].name}] = *problem.worker_links[i][j];
      }
    }
  }
  return book;
}

}  // namespace pico::coordinator
