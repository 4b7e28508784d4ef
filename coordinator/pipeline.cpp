#include "pipeline.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>
#include <stdexcept>

#include "profile_times.hpp"

namespace pico::coordinator {

namespace {
std::string layers_text(const StageInfo& s) { return model::to_string(s.layers); }
}  // namespace

void check_coverage(const std::vector<StageInfo>& stages, int32_t n_layer) {
  if (stages.empty()) throw StageError("no stages");
  int32_t expect = 0;
  for (size_t i = 0; i < stages.size(); ++i) {
    const auto& s = stages[i];
    if (s.layers.first < expect) {
      throw StageError("worker " + s.name + " (layers " + layers_text(s) + ") overlaps " +
                       (i ? "worker " + stages[i - 1].name + " (layers " + layers_text(stages[i - 1]) + ")"
                          : std::string("the layers before it")));
    }
    if (s.layers.first > expect) {
      throw StageError("no stage holds layers " + std::to_string(expect) + "-" + std::to_string(s.layers.first - 1) +
                       " (gap before worker " + s.name + ")");
    }
    expect = s.layers.last;
  }
  if (expect != n_layer) {
    throw StageError("no stage holds layers " + std::to_string(expect) + "-" + std::to_string(n_layer - 1) +
                     " (after worker " + stages.back().name + ")");
  }
}

namespace {

void describe(StageTimingTotals& t, const StageInfo& info) {
  t.layers = info.layers;
  t.backend = info.backend;
  t.isa = info.isa;
  t.device = info.device;
  t.device_memory_bytes = info.device_memory_bytes;
}

}  // namespace

Pipeline::Pipeline(std::vector<std::unique_ptr<Stage>> stages, const protocol::ModelIdentity& expected) {
  line_up(std::move(stages), expected);
}

void Pipeline::line_up(std::vector<std::unique_ptr<Stage>> stages, const protocol::ModelIdentity& expected) {
  std::vector<Position> positions;
  std::vector<StageInfo> infos;
  for (auto& s : stages) {
    const StageInfo info = s->info();
    if (!(info.identity == expected)) {
      throw StageError("worker " + info.name + " serves another model: " + protocol::to_string(info.identity) +
                       "; expected " + protocol::to_string(expected));
    }
    auto same = std::find_if(positions.begin(), positions.end(), [&](const Position& p) {
      const auto& l = p.active().info().layers;
      return l.first == info.layers.first && l.last == info.layers.last;
    });
    if (same != positions.end()) {
      same->workers.push_back(std::move(s));
      continue;
    }
    infos.push_back(info);
    positions.emplace_back();
    positions.back().workers.push_back(std::move(s));
  }
  check_coverage(infos, static_cast<int32_t>(expected.n_layer));
  positions_ = std::move(positions);
  lanes_.clear();
  lanes_.push_back({next_lane_++, {}, std::chrono::steady_clock::now()});
  {
    // The totals start again with the positions (each as many as there are positions).
    std::lock_guard lock(timings_mutex_);
    timings_.stages.assign(positions_.size(), {});
    for (size_t i = 0; i < positions_.size(); ++i) describe(timings_.stages[i], positions_[i].active().info());
  }
  plan_all();
  for (size_t i = 0; i < positions_.size(); ++i) {
    const StageInfo& info = positions_[i].active().info();
    spdlog::info("stage {}: {} layers {} ({}{}{}{} threads)", i, info.name, layers_text(info),
                 info.isa.empty() ? "" : info.isa + ", ", info.backend.empty() ? "" : info.backend + ", ",
                 info.device.empty() ? "" : info.device + ", ", info.threads);
    for (size_t k = 1; k < positions_[i].workers.size(); ++k) {
      if (const auto lane = lane_of(i, k)) {
        spdlog::info("stage {}: {} runs these layers in lane {}", i, positions_[i].workers[k]->info().name, *lane);
      } else {
        spdlog::info("stage {}: {} stands by as a replica", i, positions_[i].workers[k]->info().name);
      }
    }
  }
}

std::vector<Stage*> Pipeline::all_stages() {
  std::vector<Stage*> all;
  for (auto& p : positions_) {
    for (auto& w : p.workers) all.push_back(w.get());
  }
  return all;
}

std::optional<size_t> Pipeline::live_replica(size_t i) {
  Position& p = positions_[i];
  for (size_t k = 0; k < p.workers.size(); ++k) {
    if (!p.runs(k) && p.workers[k]->up()) return k;
  }
  return std::nullopt;
}

void Pipeline::switch_to(size_t i, size_t k, size_t lane) {
  Position& p = positions_[i];
  const size_t old = p.worker_of(lane);
  p.holds_closed.resize(p.workers.size());
  p.holds_closed[old] = true;  // the caller's replay closes its sequences there too
  holds_closed_until_ = next_step_;
  // What it holds as a standby is the replay's start; active, it keeps no copy records.
  auto& taken = taken_over_[lanes_[lane].id];
  taken.resize(positions_.size());
  taken[i] = std::move(copies_of(i, k));
  p.copies[k].clear();
  start_recent(i, k);
  if (lane == 0) {
    p.current = k;
  } else {
    p.spread[lane - 1] = k;
    return;  // the timings describe the first lane's worker
  }
  std::lock_guard lock(timings_mutex_);
  describe(timings_.stages[i], p.active().info());
}

void Pipeline::start_recent(size_t i, size_t k) {
  std::lock_guard lock(timings_mutex_);
  auto& recent = positions_[i].recent;
  if (recent.size() <= k) recent.resize(k + 1);
  recent[k] = {};
}

const Pipeline::RecentSteps* Pipeline::recent_of(size_t i, size_t k) const {
  const auto& recent = positions_.at(i).recent;
  return k < recent.size() ? &recent[k] : nullptr;
}

bool Pipeline::fail_over(std::span<const uint32_t> only) {
  // First whether every lost worker has a live standby, or its lane can end with
  // another lane going on: otherwise nothing changes.
  struct Swap {
    size_t position, worker, lane;
  };
  std::vector<Swap> swaps;
  std::vector<size_t> ending;  // lane indices, ascending
  std::vector<std::vector<size_t>> claimed(positions_.size());  // standbys already given a lane
  for (size_t j = 0; j < lanes_.size(); ++j) {
    if (!only.empty() && std::find(only.begin(), only.end(), lanes_[j].id) == only.end()) continue;
    std::vector<Swap> lane_swaps;
    bool ends = false;
    for (size_t i = 0; i < positions_.size() && !ends; ++i) {
      const Position& p = positions_[i];
      if (p.workers[p.worker_of(j)]->up()) continue;
      std::optional<size_t> live;
      for (size_t k = 0; k < p.workers.size() && !live; ++k) {
        const bool taken = std::find(claimed[i].begin(), claimed[i].end(), k) != claimed[i].end();
        if (!p.runs(k) && !taken && p.workers[k]->up()) live = k;
      }
      if (!live) ends = true;
      else lane_swaps.push_back({i, *live, j});
    }
    if (ends) {
      ending.push_back(j);
      continue;
    }
    for (const Swap& w : lane_swaps) {
      claimed[w.position].push_back(w.worker);
      swaps.push_back(w);
    }
  }
  if (ending.size() == lanes_.size() || (swaps.empty() && ending.empty())) return false;
  std::vector<uint32_t> swapped;  // ids of the lanes that took a standby
  for (const Swap& w : swaps) {
    Position& p = positions_[w.position];
    spdlog::warn("stage {}: worker {} is lost; its replica {} takes layers {}{}", w.position,
                 p.workers[p.worker_of(w.lane)]->info().name, p.workers[w.worker]->info().name,
                 layers_text(p.workers[w.worker]->info()),
                 lanes_.size() > 1 ? " in lane " + std::to_string(lanes_[w.lane].id) : std::string());
    switch_to(w.position, w.worker, w.lane);
    if (std::find(swapped.begin(), swapped.end(), lanes_[w.lane].id) == swapped.end()) swapped.push_back(lanes_[w.lane].id);
    std::lock_guard lock(timings_mutex_);
    ++timings_.failovers;
  }
  for (size_t e = ending.size(); e-- > 0;) {
    spdlog::warn("lane {} lost a worker that no standby can replace: it ends, its sequences replay on another lane",
                 lanes_[ending[e]].id);
    end_lane(ending[e]);
    std::lock_guard lock(timings_mutex_);
    ++timings_.failovers;
  }
  if (only.empty()) {
    abandon_steps();
    plan_all();
    return true;
  }
  // The other lanes run on: their workers keep their plans (and their steps in flight).
  for (const uint32_t id : swapped) plan_lane(lane_index(id));
  add_lanes();
  return true;
}

std::vector<uint32_t> Pipeline::lanes_with_a_lost_worker() {
  std::vector<uint32_t> lost;
  for (size_t j = 0; j < lanes_.size(); ++j) {
    for (auto& p : positions_) {
      if (p.workers[p.worker_of(j)]->up()) continue;
      lost.push_back(lanes_[j].id);
      break;
    }
  }
  return lost;
}

void Pipeline::abandon_steps(std::span<const uint32_t> lanes) {
  for (Lane& l : lanes_) {
    if (lanes.empty() || std::find(lanes.begin(), lanes.end(), l.id) != lanes.end()) l.inflight.clear();
  }
}

void Pipeline::end_lane(size_t lane) {
  for (size_t i = 0; i < positions_.size(); ++i) {
    Position& p = positions_[i];
    p.holds_closed.resize(p.workers.size());
    p.holds_closed[p.worker_of(lane)] = true;  // it holds the lane's sequences until the replay's closes
    holds_closed_until_ = next_step_;
    if (lane == 0) {
      p.current = p.spread.front();  // its recent steps go on: it runs the same chain
      p.spread.erase(p.spread.begin());
      std::lock_guard lock(timings_mutex_);
      describe(timings_.stages[i], p.active().info());
    } else {
      p.spread.erase(p.spread.begin() + static_cast<std::ptrdiff_t>(lane - 1));
    }
  }
  taken_over_.erase(lanes_[lane].id);
  lanes_.erase(lanes_.begin() + static_cast<std::ptrdiff_t>(lane));
}

bool Pipeline::keep_out_of_lanes(const std::string& name) {
  if (std::find(kept_out_.begin(), kept_out_.end(), name) == kept_out_.end()) kept_out_.push_back(name);
  for (size_t i = 0; i < positions_.size(); ++i) {
    for (size_t k = 0; k < positions_[i].workers.size(); ++k) {
      if (positions_[i].workers[k]->info().name != name) continue;
      const auto lane = lane_of(i, k);
      if (!lane || lane_index(*lane) == 0) continue;
      spdlog::info("lane {} ends: worker {} is kept out of the lanes", *lane, name);
      end_lane(lane_index(*lane));
      return true;
    }
  }
  return false;
}

bool Pipeline::form_lanes() {
  if (!spread_ || !chains_possible_) return false;
  bool formed = false;
  while (true) {
    std::vector<size_t> picked;
    for (size_t i = 0; i < positions_.size(); ++i) {
      const Position& p = positions_[i];
      std::optional<size_t> live;
      for (size_t k = 0; k < p.workers.size() && !live; ++k) {
        const bool out = std::find(kept_out_.begin(), kept_out_.end(), p.workers[k]->info().name) != kept_out_.end();
        if (!p.runs(k) && !out && p.workers[k]->up()) live = k;
      }
      if (!live) return formed;
      picked.push_back(*live);
    }
    lanes_.push_back({next_lane_++, {}, std::chrono::steady_clock::now()});
    std::string names;
    for (size_t i = 0; i < positions_.size(); ++i) {
      // Its copies stay: they are of sequences of other lanes, which it takes over if theirs ends.
      positions_[i].spread.push_back(picked[i]);
      start_recent(i, picked[i]);
      names += (i ? ", " : "") + positions_[i].workers[picked[i]]->info().name;
    }
    spdlog::info("lane {}: {} run the layers as a chain of their own", lanes_.back().id, names);
    formed = true;
  }
}

void Pipeline::add_lanes() {
  const size_t before = lanes_.size();
  if (form_lanes()) {
    for (size_t j = before; j < lanes_.size(); ++j) plan_lane(j);
  }
}

void Pipeline::set_spread(bool spread) {
  spread_ = spread;
  if (spread) {
    add_lanes();
    return;
  }
  while (lanes_.size() > 1) end_lane(lanes_.size() - 1);
}

std::vector<uint32_t> Pipeline::lanes() const {
  std::vector<uint32_t> ids;
  for (const Lane& l : lanes_) ids.push_back(l.id);
  return ids;
}

std::optional<size_t> Pipeline::find_lane(uint32_t id) const {
  if (id == 0) return 0;
  for (size_t j = 0; j < lanes_.size(); ++j) {
    if (lanes_[j].id == id) return j;
  }
  return std::nullopt;
}

size_t Pipeline::lane_index(uint32_t id) const {
  if (const auto j = find_lane(id)) return *j;
  throw std::logic_error("lane " + std::to_string(id) + " is not running");
}

Stage& Pipeline::stage(size_t i, uint32_t lane) {
  const Position& p = positions_.at(i);
  const auto j = find_lane(lane);
  if (!j) throw std::out_of_range("lane " + std::to_string(lane) + " is not running");
  return *p.workers[p.worker_of(*j)];
}

std::optional<uint32_t> Pipeline::lane_of(size_t i, size_t k) const {
  const Position& p = positions_.at(i);
  for (size_t j = 0; j < lanes_.size(); ++j) {
    if (p.worker_of(j) == k) return lanes_[j].id;
  }
  return std::nullopt;
}

size_t Pipeline::in_flight(uint32_t lane) const { return lanes_.at(lane_index(lane)).inflight.size(); }

std::optional<double> Pipeline::predicted_step_seconds(uint32_t lane, size_t tokens,
                                                       std::optional<size_t> full_logits_rows) const {
  const size_t j = lane_index(lane);
  double total = 0;
  std::vector<std::string> chain;
  for (size_t i = 0; i < positions_.size(); ++i) {
    const StageInfo& info = positions_[i].workers[positions_[i].worker_of(j)]->info();
    const auto t = coordinator::predicted_step_seconds(info, info.layers, i + 1 == positions_.size(), tokens);
    if (!t) return std::nullopt;
    total += *t;
    chain.push_back(info.name);
  }
  if (!links_cover_every_lane()) return total;
  const auto links = links_.chain_seconds(chain, static_cast<double>(tokens),
                                          static_cast<double>(full_logits_rows.value_or(tokens)));
  return total + links.value_or(0.0);
}

bool Pipeline::links_cover_every_lane() const {
  for (size_t k = 0; k < lanes_.size(); ++k) {
    for (const Position& p : positions_) {
      if (!links_.knows(p.workers[p.worker_of(k)]->info().name)) return false;
    }
  }
  return true;
}

std::vector<Stage*> Pipeline::workers(size_t i) {
  std::vector<Stage*> out;
  for (auto& w : positions_.at(i).workers) out.push_back(w.get());
  return out;
}

void Pipeline::regroup(std::vector<std::unique_ptr<Stage>> moved, const protocol::ModelIdentity& expected,
                       const std::vector<std::string>& dropped) {
  // The new line-up is checked before anything changes: the ranges in layer order, a
  // worker active before first within its range.
  struct Entry {
    Stage* stage;
    size_t position, worker;
    std::unique_ptr<Stage>* replacement;
    bool was_active;
  };
  std::vector<Entry> entries;
  std::vector<bool> used(moved.size(), false);
  std::vector<bool> found(dropped.size(), false);
  std::vector<std::pair<size_t, size_t>> leave;  // position, worker
  for (size_t i = 0; i < positions_.size(); ++i) {
    for (size_t k = 0; k < positions_[i].workers.size(); ++k) {
      const auto drop = std::find(dropped.begin(), dropped.end(), positions_[i].workers[k]->info().name);
      if (drop != dropped.end()) {
        found[static_cast<size_t>(drop - dropped.begin())] = true;
        leave.emplace_back(i, k);
        continue;
      }
      Entry e{positions_[i].workers[k].get(), i, k, nullptr, k == positions_[i].current};
      for (size_t m = 0; m < moved.size(); ++m) {
        if (!used[m] && moved[m]->info().name == e.stage->info().name) {
          e.replacement = &moved[m];
          used[m] = true;
          break;
        }
      }
      entries.push_back(e);
    }
  }
  for (size_t d = 0; d < dropped.size(); ++d) {
    if (!found[d]) throw StageError("worker " + dropped[d] + " is not in the pipeline");
  }
  for (size_t m = 0; m < moved.size(); ++m) {
    if (!used[m]) throw StageError("worker " + moved[m]->info().name + " is not in the pipeline");
    if (!(moved[m]->info().identity == expected)) {
      throw StageError("worker " + moved[m]->info().name + " serves another model: " +
                       protocol::to_string(moved[m]->info().identity));
    }
  }
  auto layers_of = [](const Entry& e) { return (e.replacement ? **e.replacement : *e.stage).info().layers; };
  std::stable_sort(entries.begin(), entries.end(), [&](const Entry& a, const Entry& b) {
    const auto la = layers_of(a), lb = layers_of(b);
    return la.first != lb.first ? la.first < lb.first : la.last != lb.last ? la.last < lb.last : a.was_active > b.was_active;
  });
  std::vector<StageInfo> ranges;
  for (const Entry& e : entries) {
    const StageInfo& info = (e.replacement ? **e.replacement : *e.stage).info();
    if (ranges.empty() || ranges.back().layers.first != info.layers.first || ranges.back().layers.last != info.layers.last) {
      ranges.push_back(info);
    }
  }
  check_coverage(ranges, static_cast<int32_t>(expected.n_layer));
  // Now the change. The copies on standbys are not carried into the new positions: each
  // is closed (a moved worker dropped them already).
  for (size_t i = 0; i < positions_.size(); ++i) {
    for (size_t k = 0; k < positions_[i].copies.size(); ++k) forget_copies(i, k);
  }
  // Each worker (or its replacement) in the new order.
  std::vector<std::unique_ptr<Stage>> ordered;
  for (const Entry& e : entries) {
    ordered.push_back(e.replacement ? std::move(*e.replacement) : std::move(positions_[e.position].workers[e.worker]));
  }
  // Workers of the later lanes hold those lanes' sequences: the replay's closes reach
  // them wherever they stand next.
  std::vector<const Stage*> ran_lanes;
  for (const auto& p : positions_) {
    for (size_t k : p.spread) ran_lanes.push_back(p.workers[k].get());
  }
  std::vector<std::unique_ptr<Stage>> leaving;
  for (const auto& [i, k] : leave) {
    auto& w = positions_[i].workers[k];
    spdlog::warn("worker {} leaves the pipeline", w->info().name);
    if (w->up()) leaving.push_back(std::move(w));
  }
  leaving_ = std::move(leaving);
  kept_out_.clear();  // a new line-up: every worker may form a lane
  positions_.clear();  // the lost dropped workers' connections with it
  line_up(std::move(ordered), expected);
  taken_over_.clear();  // every lane is new: the replay starts at 0
  for (auto& p : positions_) {
    p.holds_closed.resize(p.workers.size());
    for (size_t k = 0; k < p.workers.size(); ++k) {
      const bool ran = std::find(ran_lanes.begin(), ran_lanes.end(), p.workers[k].get()) != ran_lanes.end();
      if (ran && !p.runs(k)) p.holds_closed[k] = true;
    }
  }
  holds_closed_until_ = next_step_;
}

size_t Pipeline::add_replica(std::unique_ptr<Stage> stage, const protocol::ModelIdentity& expected) {
  const StageInfo& info = stage->info();
  if (!(info.identity == expected)) {
    throw StageError("worker " + info.name + " serves another model: " + protocol::to_string(info.identity) +
                     "; expected " + protocol::to_string(expected));
  }
  // Back after it left: this connection replaces the one that took the closes.
  std::erase_if(leaving_, [&](const std::unique_ptr<Stage>& w) { return w->info().name == info.name; });
  std::erase(kept_out_, info.name);
  for (size_t i = 0; i < positions_.size(); ++i) {
    const auto& l = positions_[i].active().info().layers;
    if (l.first != info.layers.first || l.last != info.layers.last) continue;
    for (const auto& w : positions_[i].workers) {
      if (w->info().name == info.name) throw StageError("worker " + info.name + " is in the pipeline already");
    }
    spdlog::info("stage {}: {} joins as a replica (layers {})", i, info.name, layers_text(info));
    positions_[i].workers.push_back(std::move(stage));
    add_lanes();
    return i;
  }
  throw StageError("worker " + info.name + " serves layers " + layers_text(info) +
                   ", which are no stage's: a joining worker replicates a stage's range");
}

bool Pipeline::hand_over(size_t i, size_t k, std::span<const int32_t> sequences) {
  Position& p = positions_.at(i);
  if (k >= p.workers.size() || k == p.current) {
    throw StageError("stage " + std::to_string(i) + ": worker " + std::to_string(k) + " is no replica to hand over to");
  }
  Stage& from = p.active();
  Stage& to = *p.workers[k];
  if (!from.up() || !to.up()) throw StageError("worker " + (from.up() ? to : from).info().name + " is not up");
  const size_t old = p.current;
  const auto lane = lane_of(i, k);
  if (lane) end_lane(lane_index(*lane));
  // Planned first: a worker's first plan from this session drops whatever it holds.
  switch_to(i, k);
  abandon_steps();
  plan_all();
  uint64_t moved = 0, bytes = 0;
  try {
    for (const int32_t seq : sequences) {
      const auto state = from.snapshot(seq);
      if (!state) continue;  // not open there (nothing computed for it yet)
      to.restore(seq, *state);
      bytes += state->size();
      ++moved;
    }
    for (const int32_t seq : sequences) from.close(seq);
  } catch (const StageError& e) {
    spdlog::warn("stage {}: handing the sequences over from {} to {} failed ({}); they are replayed", i,
                 from.info().name, to.info().name, e.what());
    taken_over_[lanes_[0].id][i] = std::map<int32_t, int32_t>();  // restored or not, the replay starts at 0
    return false;  // switch_to left the old worker the replay's closes
  }
  p.holds_closed[old] = false;  // it has none of them now
  taken_over_[lanes_[0].id][i].reset();  // nothing replays
  spdlog::info("stage {}: worker {} takes layers {} from {} with the state of {} sequence(s) ({:.1f} MiB)", i,
               to.info().name, layers_text(to.info()), from.info().name, moved, static_cast<double>(bytes) / (1 << 20));
  std::lock_guard lock(timings_mutex_);
  timings_.handed_over_sequences += moved;
  return !lane;  // the sequences of the lane that ended replay
}

bool Pipeline::activate(size_t i, size_t k) {
  Position& p = positions_.at(i);
  if (k >= p.workers.size()) throw StageError("stage " + std::to_string(i) + " has no worker " + std::to_string(k));
  if (k == p.current) return false;
  if (!p.workers[k]->up()) throw StageError("worker " + p.workers[k]->info().name + " is not up");
  spdlog::info("stage {}: worker {} takes layers {} from {}", i, p.workers[k]->info().name,
               layers_text(p.workers[k]->info()), p.active().info().name);
  if (const auto lane = lane_of(i, k)) end_lane(lane_index(*lane));
  switch_to(i, k);
  abandon_steps();
  plan_all();
  return true;
}

void Pipeline::rejoin_standbys() {
  for (auto& p : positions_) {
    for (size_t k = 0; k < p.workers.size(); ++k) {
      Stage& s = *p.workers[k];
      if (p.runs(k) || s.up()) continue;
      // Restarted, it holds none of its copies; only hung, it hears their closes.
      forget_copies(static_cast<size_t>(&p - positions_.data()), k);
      try {
        s.rejoin();  // sends the closes it missed
        if (k < p.holds_closed.size()) p.holds_closed[k] = false;
        std::erase(kept_out_, s.info().name);  // restarted (maybe mended): it may form a lane again
        spdlog::info("replica {} is back and stands by", s.info().name);
      } catch (const StageError& e) {
        spdlog::debug("replica {}: {}", s.info().name, e.what());
      }
    }
  }
  add_lanes();
}

void Pipeline::plan_all() {
  chains_possible_ =
      std::all_of(positions_.begin(), positions_.end(), [](const Position& p) { return p.active().remote(); });
  form_lanes();
  for (size_t j = 0; j < lanes_.size(); ++j) plan_lane(j);
}

void Pipeline::plan_lane(size_t lane) {
  // Last stage first: each stage then knows its predecessor's key (Plan.acceptKeys)
  // before the predecessor connects to it, since a CURVE server that refuses a key
  // once is not asked again by that connection.
  const size_t n = positions_.size();
  auto worker = [&](size_t i) -> Stage& { return *positions_[i].workers[positions_[i].worker_of(lane)]; };
  for (size_t i = n; i-- > 0;) {
    const bool last = i + 1 == n;
    worker(i).plan(last ? nullptr : &worker(i + 1), last && chains_possible_ ? &worker(0) : nullptr, i, n);
  }
}

bool Pipeline::chain_running() const {
  return std::any_of(lanes_.begin(), lanes_.end(), [](const Lane& l) {
    return std::any_of(l.inflight.begin(), l.inflight.end(),
                       [](const Inflight& f) { return f.chain_steps > 0 || f.chained; });
  });
}

uint64_t Pipeline::submit(std::span<const model::BatchToken> batch, std::span<const protocol::LogitsOutput> outputs,
                          const ChainGrant& chain, uint32_t lane) {
  if (chain_running()) throw std::logic_error("a step submitted while a greedy chain runs");
  // A stage lost since the last step (even while idle) gets its chance to rejoin first:
  // a worker restarted while nothing ran serves the next request.
  const size_t j = lane_index(lane);
  // With several lanes a loss costs only its lane's steps: this lane's workers are
  // looked at here, the other lanes' by wait().
  const bool several = lanes_.size() > 1;
  auto lose_this_lane = [&](const StageError& e) {
    const uint32_t id = lanes_[j].id;
    abandon_steps(std::span(&id, 1));
    throw LanesLost(e, {id});
  };
  if (several) {
    for (size_t i = 0; i < positions_.size(); ++i) {
      Stage& s = *positions_[i].workers[positions_[i].worker_of(j)];
      if (!s.up()) lose_this_lane(StageError("worker " + s.info().name + " (stage " + std::to_string(i) + ") is lost"));
    }
  } else {
    rejoin_lost();
  }
  const uint64_t step = next_step_++;
  const ChainGrant grant = chains_possible_ ? chain : ChainGrant{};
  next_step_ += grant.steps;  // the ids of the steps the last stage may start
  try {
    positions_.front().workers[positions_.front().worker_of(j)]->submit(step, batch, outputs, grant);
  } catch (const StageError& e) {
    if (several) lose_this_lane(e);
    abandon_steps();
    throw;
  }
  Lane& l = lanes_[j];
  if (l.inflight.empty()) l.answered = std::chrono::steady_clock::now();
  l.inflight.push_back({step, batch.size(), grant.steps, false});
  return step;
}

void Pipeline::rejoin_lost() {
  bool rejoined = false;
  for (size_t j = 0; j < lanes_.size(); ++j) {
    for (size_t i = 0; i < positions_.size(); ++i) {
      Stage& s = *positions_[i].workers[positions_[i].worker_of(j)];
      if (s.up()) continue;
      if (live_replica(i) || lanes_.size() > 1) {
        // A live replica takes over (fail_over), or the lane ends, rather than waiting for this one.
        abandon_steps();
        throw StageError("worker " + s.info().name + " (stage " + std::to_string(i) + ") is lost");
      }
      try {
        s.rejoin();
      } catch (const StageError&) {
        abandon_steps();
        throw;
      }
      if (j == 0) {
        // A restarted worker may run on another backend or device.
        std::lock_guard lock(timings_mutex_);
        describe(timings_.stages[i], s.info());
      }
      rejoined = true;
    }
  }
  if (rejoined) {
    // Every stage connects afresh to the next; nothing is in flight at this point.
    abandon_steps();
    plan_all();
  }
}

std::string Pipeline::lost_stage() {
  for (size_t j = 0; j < lanes_.size(); ++j) {
    for (auto& p : positions_) {
      Stage& s = *p.workers[p.worker_of(j)];
      if (!s.up()) return s.info().name;
    }
  }
  return {};
}

StepOutput Pipeline::wait(int timeout_ms) {
  const uint64_t wait_start = protocol::steady_nanos();
  const auto called = std::chrono::steady_clock::now();
  const auto timeout = std::chrono::milliseconds(timeout_ms);
  const size_t n = positions_.size();
  auto worker = [&](size_t i, size_t j) -> Stage& { return *positions_[i].workers[positions_[i].worker_of(j)]; };
  // An answer to a step in flight, or to one abandoned earlier (dropped).
  auto current = [&](uint64_t step) {
    for (const Lane& l : lanes_) {
      for (const auto& f : l.inflight) {
        if (f.step == step) return true;
      }
    }
    return false;
  };
  try {
    while (true) {
      try {
        // Errors and lost connections of the stages before the last one.
        for (size_t j = 0; j < lanes_.size(); ++j) {
          for (size_t i = 0; i + 1 < n; ++i) {
            if (worker(i, j).poll(0)) throw StageError("stage " + std::to_string(i) + " answered with logits");
          }
        }
        // One lane waits on its last stage; several look at each in turn, waiting on
        // all their sockets at once in between, starting after the lane that answered
        // last (a lane always ready would otherwise starve the others).
        const bool several = lanes_.size() > 1;
        for (size_t t = 0; t < lanes_.size(); ++t) {
          const size_t j = (poll_from_ + t) % lanes_.size();
          Lane& lane = lanes_[j];
          auto out = worker(n - 1, j).poll(several ? 0 : 20);
          if (!out) continue;
          if (lane.inflight.empty() || out->step != lane.inflight.front().step) {
            if (current(out->step)) throw StageError("step " + std::to_string(out->step) + " finished out of order");
            continue;  // late logits of an abandoned step
          }
          const Inflight done = lane.inflight.front();
          if (out->chained && done.chain_steps == 0) {
            throw StageError("the last stage chained step " + std::to_string(out->step) + " without a grant");
          }
          account(*out, done.tokens, wait_start, j);
          lane.inflight.pop_front();
          poll_from_ = j + 1;
          lane.answered = std::chrono::steady_clock::now();
          // Submitted after the last failover, so after the caller closed what the
          // replaced workers held: later sequences never reached them. (Another lane's
          // step may have been in flight across the failover.)
          if (done.step >= holds_closed_until_) {
            for (auto& p : positions_) p.holds_closed.clear();
          }
          // The step the last stage started is the next to finish.
          if (out->chained) lane.inflight.push_front({done.step + 1, done.tokens, done.chain_steps - 1, true});
          return std::move(*out);
        }
        if (several) {
          std::vector<Stage*> lasts;
          for (size_t j = 0; j < lanes_.size(); ++j) lasts.push_back(&worker(n - 1, j));
          wait_readable(lasts, 20);
        }
      } catch (const StageError& e) {
        if (e.step() == 0) throw;
        if (!current(e.step())) continue;  // about an abandoned step
        // A stage that answered about one step is alive; a step refused because a stage
        // further down is gone (unavailable) shows as that stage being lost.
        if (!lost_stage().empty()) throw;
        for (Lane& l : lanes_) std::erase_if(l.inflight, [&](const Inflight& f) { return f.step == e.step(); });
        throw StepRefused(e);
      }
      // A lane with steps in flight and no answer for timeout_ms (since this call at the
      // earliest) is stuck.
      const auto now = std::chrono::steady_clock::now();
      const bool none = std::all_of(lanes_.begin(), lanes_.end(), [](const Lane& l) { return l.inflight.empty(); });
      if (none && now - called >= timeout) throw StageError("no logits within " + std::to_string(timeout_ms) + " ms");
      for (const Lane& l : lanes_) {
        if (l.inflight.empty() || now - std::max(l.answered, called) < timeout) continue;
        throw StageError("no logits within " + std::to_string(timeout_ms) + " ms" +
                         (lanes_.size() > 1 ? " (lane " + std::to_string(l.id) + ")" : std::string()));
      }
    }
  } catch (const StepRefused&) {
    throw;
  } catch (const StageError& e) {
    if (lanes_.size() > 1) {
      // Some lanes lost a worker, the others go on with their steps in flight.
      const std::vector<uint32_t> lost = lanes_with_a_lost_worker();
      if (!lost.empty() && lost.size() < lanes_.size()) {
        abandon_steps(lost);
        throw LanesLost(e, lost);
      }
    }
    abandon_steps();
    throw;
  }
}

void Pipeline::account(const StepOutput& out, size_t tokens, uint64_t wait_start, size_t lane) {
  auto seconds = [](int64_t nanos) { return nanos > 0 ? static_cast<double>(nanos) * 1e-9 : 0.0; };
  std::lock_guard lock(timings_mutex_);
  // Everything in the coordinator's clock: a stage's stamp minus its clock offset. A
  // chained step was sent by the last stage.
  const Position& last = positions_.back();
  int64_t prev_sent = static_cast<int64_t>(out.sent_nanos) -
                      (out.sent_by_last ? last.workers[last.worker_of(lane)]->clock_offset_nanos() : 0);
  if (out.sent_by_last) ++timings_.chained_steps;
  ++timings_.lane_steps[lanes_[lane].id];
  bool prev_remote = true;  // the coordinator is not the stage's process
  const auto now = std::chrono::steady_clock::now();
  for (const StageStamp& st : out.stamps) {
    if (st.stage >= positions_.size()) continue;
    Position& position = positions_[st.stage];
    Stage& stage = *position.workers[position.worker_of(lane)];
    StageTimingTotals& t = timings_.stages[st.stage];
    const int64_t offset = stage.clock_offset_nanos();
    auto local = [&](uint64_t stamp) { return static_cast<int64_t>(stamp) - offset; };
    const double compute = seconds(static_cast<int64_t>(st.compute_end) - static_cast<int64_t>(st.compute_start));
    t.compute_seconds += compute;
    if (stage.remote() && prev_remote) {
      const int64_t received = local(st.received), idle_since = local(st.idle_since);
      // The input arrived sometime after it was sent; while the stage was still busy
      // with earlier batches it queued, after that it was in transit.
      const int64_t queued = std::clamp<int64_t>(idle_since - prev_sent, 0, std::max<int64_t>(received - prev_sent, 0));
      t.queue_seconds += seconds(queued);
      t.transfer_seconds += seconds(received - prev_sent - queued);
    }
    ++t.batches;
    t.tokens += tokens;
    // The worker's recent steps (the slow watch's).
    const size_t k = position.worker_of(lane);
    if (position.recent.size() <= k) position.recent.resize(k + 1);
    auto& recent = position.recent[k];
    if (recent.steps.size() < kRecentSteps) {
      recent.steps.push_back({now, tokens, compute});
    } else {
      recent.steps[recent.next] = {now, tokens, compute};
      recent.next = (recent.next + 1) % kRecentSteps;
    }
    prev_sent = local(st.sent);
    prev_remote = stage.remote();
  }
  if (!out.stamps.empty() && last.workers[last.worker_of(lane)]->remote()) {
    timings_.logits_transfer_seconds +=
        seconds(static_cast<int64_t>(out.received_nanos) - std::max(prev_sent, static_cast<int64_t>(wait_start)));
  }
}

PipelineTimings Pipeline::timings() const {
  std::lock_guard lock(timings_mutex_);
  return timings_;
}

std::vector<StageStepTime> Pipeline::recent_steps(size_t i, std::chrono::steady_clock::duration within,
                                                  uint32_t lane) const {
  std::lock_guard lock(timings_mutex_);
  const auto since = std::chrono::steady_clock::now() - within;
  std::vector<StageStepTime> out;
  const auto j = find_lane(lane);
  const RecentSteps* recent = j ? recent_of(i, positions_.at(i).worker_of(*j)) : nullptr;
  if (!recent) return out;
  for (const StageStepTime& t : recent->steps) {
    if (t.finished >= since) out.push_back(t);
  }
  return out;
}

std::chrono::steady_clock::time_point Pipeline::active_since(size_t i, uint32_t lane) const {
  std::lock_guard lock(timings_mutex_);
  const auto j = find_lane(lane);
  const RecentSteps* recent = j ? recent_of(i, positions_.at(i).worker_of(*j)) : nullptr;
  return recent ? recent->since : std::chrono::steady_clock::now();
}

void Pipeline::close(int32_t seq_id) {
  // Every stage, even when one fails: the others must not keep the sequence. A worker
  // replaced while lost (maybe only hung) gets it when it rejoins.
  std::optional<StageError> first;
  for (auto& w : leaving_) {
    try {
      if (w->up()) w->close(seq_id);
    } catch (const StageError& e) {
      spdlog::warn("worker {} (left the pipeline): {}", w->info().name, e.what());
    }
  }
  for (auto& p : positions_) {
    for (size_t k = 0; k < p.workers.size(); ++k) {
      Stage& s = *p.workers[k];
      const bool copy = k < p.copies.size() && p.copies[k].erase(seq_id) > 0;
      if (!p.runs(k) && !copy && !(k < p.holds_closed.size() && p.holds_closed[k])) continue;
      try {
        s.close(seq_id);
      } catch (const StageError& e) {
        if (!first) first = e;
      }
    }
  }
  if (first) throw *first;
}

std::map<int32_t, int32_t>& Pipeline::copies_of(size_t i, size_t k) {
  Position& p = positions_.at(i);
  if (p.copies.size() < p.workers.size()) p.copies.resize(p.workers.size());
  return p.copies.at(k);
}

void Pipeline::forget_copies(size_t i, size_t k) {
  auto& copies = copies_of(i, k);
  Stage& worker = *positions_[i].workers[k];
  for (const auto& [seq, length] : copies) {
    try {
      worker.close(seq);
    } catch (const StageError& e) {
      spdlog::debug("closing a copy on {}: {}", worker.info().name, e.what());
    }
  }
  copies.clear();
}

bool Pipeline::copies_due(std::span<const SequenceLength> sequences) {
  for (size_t i = 0; i < positions_.size(); ++i) {
    for (size_t k = 0; k < positions_[i].workers.size(); ++k) {
      if (!positions_[i].workers[k]->up()) continue;
      const auto& copies = copies_of(i, k);
      for (const SequenceLength& s : sequences) {
        if (!copies_to(i, k, s.lane)) continue;
        const auto held = copies.find(s.seq_id);
        if (s.length > 0 && (held == copies.end() || held->second != s.length)) return true;
      }
    }
  }
  return false;
}

bool Pipeline::copies_to(size_t i, size_t k, uint32_t lane) const {
  const auto j = find_lane(lane);
  return j && positions_[i].worker_of(*j) != k;
}

Pipeline::CopyRound Pipeline::copy_to_standbys(std::span<const SequenceLength> sequences) {
  const auto start = std::chrono::steady_clock::now();
  CopyRound round;
  const size_t n = positions_.size();
  bool stopped = false;  // an active worker did not answer a snapshot
  for (size_t i = 0; i < n && !stopped; ++i) {
    Position& p = positions_[i];
    // The live workers that may take copies (the standbys and the other lanes' workers)
    // and which sequences each lacks at its length.
    std::vector<size_t> standbys;
    for (size_t k = 0; k < p.workers.size(); ++k) {
      if (!p.workers[k]->up()) {
        if (!p.runs(k)) forget_copies(i, k);
        continue;
      }
      standbys.push_back(k);
    }
    // A standby is planned as the stage it would run (no step reaches it): a worker's
    // first plan from this session drops what it holds, so it must come before the
    // restores. A lane's worker is planned already.
    for (auto it = standbys.begin(); it != standbys.end();) {
      if (p.runs(*it)) {
        ++it;
        continue;
      }
      try {
        p.workers[*it]->plan(i + 1 < n ? &positions_[i + 1].active() : nullptr, nullptr, i, n);
        ++it;
      } catch (const StageError& e) {
        spdlog::warn("stage {}: standby {} refused its plan ({}); it gets no copy", i, p.workers[*it]->info().name,
                     e.what());
        forget_copies(i, *it);
        it = standbys.erase(it);
      }
    }
    if (standbys.empty()) continue;
    for (const SequenceLength& seq : sequences) {
      if (seq.length <= 0) continue;
      std::vector<size_t> lacking;
      for (size_t k : standbys) {
        if (!copies_to(i, k, seq.lane)) continue;  // it runs the sequence
        const auto& copies = copies_of(i, k);
        const auto held = copies.find(seq.seq_id);
        if (held == copies.end() || held->second != seq.length) lacking.push_back(k);
      }
      if (lacking.empty()) continue;
      const auto lane = find_lane(seq.lane);
      if (!lane) continue;  // its lane ended: it replays
      Stage& source = *p.workers[p.worker_of(*lane)];
      std::optional<std::vector<uint8_t>> state;
      try {
        state = source.snapshot(seq.seq_id);
      } catch (const StageError& e) {
        spdlog::warn("stage {}: no snapshot of sequence {} from {} ({}); the copies stop here", i, seq.seq_id,
                     source.info().name, e.what());
        stopped = true;
        break;
      }
      if (!state) continue;  // not open there
      for (size_t k : lacking) {
        Stage& standby = *p.workers[k];
        try {
          standby.restore(seq.seq_id, *state);
          copies_of(i, k)[seq.seq_id] = seq.length;
          ++round.sequences;
          round.bytes += state->size();
        } catch (const StageError& e) {
          spdlog::warn("stage {}: standby {} took no copy of sequence {} ({})", i, standby.info().name, seq.seq_id,
                       e.what());
          auto& copies = copies_of(i, k);
          if (copies.erase(seq.seq_id) > 0 || standby.up()) {
            try {
              standby.close(seq.seq_id);  // it may hold an older copy
            } catch (const StageError&) {
            }
          }
          if (!standby.up()) forget_copies(i, k);
        }
      }
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (round.sequences > 0) {
    spdlog::debug("standby copies: {} sequence state(s), {:.1f} MiB in {:.0f} ms", round.sequences,
                  static_cast<double>(round.bytes) / (1 << 20), seconds * 1e3);
  }
  std::lock_guard lock(timings_mutex_);
  timings_.standby_copies += round.sequences;
  timings_.standby_copy_bytes += round.bytes;
  timings_.standby_copy_seconds += seconds;
  return round;
}

void Pipeline::cut_copies(int32_t seq_id, int32_t length) {
  for (auto& p : positions_) {
    for (auto& copies : p.copies) {
      const auto held = copies.find(seq_id);
      if (held != copies.end()) held->second = std::min(held->second, length);
    }
  }
}

int32_t Pipeline::copied_prefix(int32_t seq_id, uint32_t lane) const {
  const auto j = find_lane(lane);
  if (!j) return 0;  // the lane ended
  const auto positions = taken_over_.find(lanes_[*j].id);
  if (positions == taken_over_.end()) return 0;
  std::optional<int32_t> prefix;
  for (const auto& taken : positions->second) {
    if (!taken) continue;
    const auto held = taken->find(seq_id);
    const int32_t n = held == taken->end() ? 0 : held->second;
    prefix = prefix ? std::min(*prefix, n) : n;
  }
  return prefix.value_or(0);
}

int32_t Pipeline::copies_in_lane(int32_t seq_id, uint32_t lane) const {
  const auto j = find_lane(lane);
  if (!j || positions_.empty()) return 0;
  int32_t prefix = std::numeric_limits<int32_t>::max();
  for (const Position& p : positions_) {
    const size_t k = p.worker_of(*j);
    int32_t held = 0;
    if (k < p.copies.size()) {
      const auto copy = p.copies[k].find(seq_id);
      if (copy != p.copies[k].end()) held = copy->second;
    }
    prefix = std::min(prefix, held);
  }
  return prefix;
}

int32_t Pipeline::adopt_copies(int32_t seq_id, uint32_t lane) {
  const int32_t prefix = copies_in_lane(seq_id, lane);
  if (const auto j = find_lane(lane)) {
    for (size_t i = 0; i < positions_.size(); ++i) {
      copies_of(i, positions_[i].worker_of(*j)).erase(seq_id);  // the lane's own sequence from now on
    }
  }
  return prefix;
}

bool Pipeline::kept_its_workers(uint32_t lane) const {
  const auto j = find_lane(lane);
  return j && !taken_over_.contains(lanes_[*j].id);  // not an ended lane
}

void Pipeline::forget_taken_over() { taken_over_.clear(); }

void Pipeline::close_on_replaced(int32_t seq_id) {
  for (auto& p : positions_) {
    for (size_t k = 0; k < p.workers.size() && k < p.holds_closed.size(); ++k) {
      if (p.runs(k) || !p.holds_closed[k]) continue;
      try {
        p.workers[k]->close(seq_id);
      } catch (const StageError& e) {
        spdlog::debug("closing sequence {} on {}: {}", seq_id, p.workers[k]->info().name, e.what());
      }
    }
  }
}

}  // namespace pico::coordinator
