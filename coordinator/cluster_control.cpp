#include "cluster_control.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <memory>

#include "cluster_measures.hpp"
#include "placement.hpp"

namespace pico::coordinator {

namespace {
double step_ratio(const StageWindow& w) { return w.measured / std::max(w.predicted, 1e-9); }
// The median ratio of the judged positions other than i, at least 1 (1 when none).
double others_ratio(std::span<const StageWindow> windows, size_t i) {
  std::vector<double> others;
  for (size_t j = 0; j < windows.size(); ++j) {
    if (j != i && windows[j].judged) others.push_back(step_ratio(windows[j]));
  }
  if (others.empty()) return 1.0;
  std::sort(others.begin(), others.end());
  const size_t n = others.size();
  return std::max(1.0, n % 2 ? others[n / 2] : (others[n / 2 - 1] + others[n / 2]) / 2);
}
}  // namespace

std::optional<size_t> slow_position(std::span<const StageWindow> windows, double factor, double window_seconds) {
  constexpr double kLateShare = 0.25;
  std::optional<size_t> slowest;
  for (size_t i = 0; i < windows.size(); ++i) {
    if (!windows[i].judged) continue;
    const double reference = others_ratio(windows, i);
    const StageWindow& w = windows[i];
    const bool slow =
        step_ratio(w) >= factor * reference && w.measured - reference * w.predicted >= kLateShare * window_seconds;
    if (slow && (!slowest || step_ratio(w) > step_ratio(windows[*slowest]))) slowest = i;
  }
  return slowest;
}

double slowdown(std::span<const StageWindow> windows, size_t i) {
  return step_ratio(windows[i]) / others_ratio(windows, i);
}

ClusterControl::ClusterControl(Engine& engine, protocol::ModelIdentity identity, Options options)
    : engine_(engine), identity_(std::move(identity)), options_(std::move(options)) {
  if (options_.slow_factor > 0 || options_.replan_on_loss_seconds > 0 || options_.standby_copy_seconds > 0) {
    watcher_ = std::thread([this] { watch(); });
  }
}

ClusterControl::~ClusterControl() {
  {
    std::lock_guard lock(watch_mutex_);
    stopping_ = true;
  }
  watch_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
}

void ClusterControl::watch() {
  double look = 1.0;
  if (options_.slow_factor > 0) look = std::min(look, options_.slow_seconds / 4);
  if (options_.replan_on_loss_seconds > 0) look = std::min(look, options_.replan_on_loss_seconds / 4);
  if (options_.standby_copy_seconds > 0) look = std::min(look, options_.standby_copy_seconds);
  const auto every = std::chrono::duration<double>(std::clamp(look, 0.05, 1.0));
  auto last_copy = std::chrono::steady_clock::now();
  std::unique_lock lock(watch_mutex_);
  while (!watch_cv_.wait_for(lock, every, [&] { return stopping_; })) {
    lock.unlock();
    try {
      if (options_.slow_factor > 0) check_slow();
    } catch (const std::exception& e) {
      spdlog::warn("the slow-worker watch: {}", e.what());
    }
    try {
      if (options_.replan_on_loss_seconds > 0) check_lost();
    } catch (const std::exception& e) {
      spdlog::warn("placing anew after a lost worker: {}", e.what());
    }
    if (options_.standby_copy_seconds > 0 &&
        std::chrono::steady_clock::now() - last_copy >= std::chrono::duration<double>(options_.standby_copy_seconds)) {
      last_copy = std::chrono::steady_clock::now();
      try {
        copy_to_standbys();
      } catch (const std::exception& e) {
        spdlog::warn("standby copies: {}", e.what());
      }
    }
    lock.lock();
  }
}

void ClusterControl::copy_to_standbys() {
  // A look first, between two steps: the steps in flight are waited for only when a
  // live standby lacks a sequence as it is now.
  const bool due =
      engine_.with_pipeline([this](Pipeline& p) { return p.copies_due(engine_.sequence_lengths()); }).get();
  if (!due) return;
  engine_
      .with_pipeline(
          [this](Pipeline& p) {
            p.copy_to_standbys(engine_.sequence_lengths());
            return false;  // nothing moved
          },
          true)
      .get();
}

void ClusterControl::check_slow() {
  const auto window = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(options_.slow_seconds));
  const auto now = std::chrono::steady_clock::now();
  std::optional<std::pair<size_t, size_t>> move;
  std::optional<std::pair<size_t, uint32_t>> lane_end;  // a later lane's slow worker: position, lane
  std::string slow_worker, why;
  double slow_factor_seen = 0;  // set: no replica, placing anew instead
  // Each worker of a lane against its profile, over the window.
  auto windows_of = [&](Pipeline& p, uint32_t lane) {
    std::vector<StageWindow> windows(p.size());
    for (size_t i = 0; i < p.size(); ++i) {
      if (now - p.active_since(i, lane) < window) continue;
      const StageInfo& info = p.stage(i, lane).info();
      const bool head = i + 1 == p.size();
      StageWindow& w = windows[i];
      const auto steps = p.recent_steps(i, window, lane);
      for (const StageStepTime& step : steps) {
        const auto predicted = predicted_step_seconds(info, info.layers, head, step.tokens);
        if (!predicted) break;
        w.predicted += *predicted;
        w.measured += step.seconds;
      }
      w.judged = !steps.empty() && w.predicted > 0;
      spdlog::debug("slow-worker watch: lane {} stage {}: {:.4f} s of compute in the last {} s, {:.4f} s predicted{}",
                    lane, i, w.measured, options_.slow_seconds, w.predicted, w.judged ? "" : " (not judged)");
    }
    return windows;
  };
  engine_.with_pipeline([&](Pipeline& p) {
           const std::vector<uint32_t> lanes = p.lanes();
           // A later lane's slow worker leaves the lanes: its lane ends, and its sequences
           // go on in the others (from the copies there, with standby copies).
           for (size_t l = 1; l < lanes.size(); ++l) {
             const std::vector<StageWindow> windows = windows_of(p, lanes[l]);
             const auto slow = slow_position(windows, options_.slow_factor, options_.slow_seconds);
             if (!slow) continue;
             lane_end.emplace(*slow, lanes[l]);
             slow_worker = p.stage(*slow, lanes[l]).info().name;
             why = fmt::format("lane {} stage {}: worker {} is slow: {:.3f} s of compute in the last {:.1f} s where its "
                               "profile predicts {:.3f} s; it leaves the lanes, and its lane's requests go on in the others",
                               lanes[l], *slow, slow_worker, windows[*slow].measured, options_.slow_seconds,
                               windows[*slow].predicted);
             return false;
           }
           const std::vector<StageWindow> windows = windows_of(p, lanes.front());
           const auto slow = slow_position(windows, options_.slow_factor, options_.slow_seconds);
           if (!slow) return false;
           const size_t i = *slow;
           const auto workers = p.workers(i);
           const size_t current = p.active_worker(i);
           const bool head = i + 1 == p.size();
           const model::LayerRange layers = workers[current]->info().layers;
           std::optional<size_t> best;
           std::optional<double> best_time;
           for (size_t k = 0; k < workers.size(); ++k) {
             const StageInfo& info = workers[k]->info();
             if (k == current || !workers[k]->up()) continue;
             if (const auto off = moved_off_.find(info.name); off != moved_off_.end() && now - off->second < 10 * window)
               continue;
             const auto t = profiled_seconds(info, layers, head, options_.batch_objective);
             const double time = t ? *t : std::numeric_limits<double>::infinity();
             if (!best || time < *best_time) best = k, best_time = time;
           }
           if (!best) {
             // No replica to move to: a cluster of --layers auto workers is placed anew
             // with this worker's times as slow as it shows (for 10 windows).
             const auto off = moved_off_.find(workers[current]->info().name);
             if (!options_.placement || (off != moved_off_.end() && now - off->second < 10 * window)) return false;
             for (Stage* s : p.all_stages()) {
               if (!s->info().movable) return false;
             }
             slow_worker = workers[current]->info().name;
             slow_factor_seen = slowdown(windows, i);
             why = fmt::format("stage {}: worker {} is slow: {:.3f} s of compute in the last {:.1f} s where its profile "
                               "predicts {:.3f} s, {:.1f} times what the others show; placing anew with it that slow",
                               i, slow_worker, windows[i].measured, options_.slow_seconds, windows[i].predicted,
                               slow_factor_seen);
             return false;
           }
           move.emplace(i, *best);
           slow_worker = workers[current]->info().name;
           why = fmt::format("stage {}: worker {} is slow: {:.3f} s of compute in the last {:.1f} s where its profile "
                             "predicts {:.3f} s; its replica {} takes its layers",
                             i, slow_worker, windows[i].measured, options_.slow_seconds, windows[i].predicted,
                             workers[*best]->info().name);
           return false;
         })
      .get();
  if (!move && slow_factor_seen > 0) {
    spdlog::warn("{}", why);
    moved_off_[slow_worker] = std::chrono::steady_clock::now();
    {
      std::lock_guard lock(caps_mutex_);
      slowdowns_[slow_worker] = {slow_factor_seen, std::chrono::steady_clock::now() + 10 * window};
    }
    PlacementOutcome outcome;
    place({}, &outcome);
    if (outcome.moved) ++slow_moves_;
    return;
  }
  if (lane_end) {
    engine_
        .with_pipeline(
            [&, i = lane_end->first, lane = lane_end->second](Pipeline& p) {
              // Still running there (a failover or replan may have come first).
              const std::vector<uint32_t> lanes = p.lanes();
              if (std::find(lanes.begin(), lanes.end(), lane) == lanes.end() ||
                  p.stage(i, lane).info().name != slow_worker) {
                return false;
              }
              spdlog::warn("{}", why);
              moved_off_[slow_worker] = std::chrono::steady_clock::now();
              ++slow_moves_;
              return p.keep_out_of_lanes(slow_worker);  // true: that lane's sequences replay
            },
            true)
        .get();
    return;
  }
  if (!move) return;
  const auto [i, k] = *move;
  engine_.with_pipeline(
             [&, i = i, k = k](Pipeline& p) {
               // Still the same worker there (a replan or failover may have come first).
               if (p.stage(i).info().name != slow_worker || !p.workers(i)[k]->up()) return false;
               spdlog::warn("{}", why);
               moved_off_[slow_worker] = std::chrono::steady_clock::now();
               ++slow_moves_;
               // Standing by, it forms no lane again while it is slow.
               const bool lane_ended = p.keep_out_of_lanes(slow_worker);
               return move_stage(p, i, k) || lane_ended;
             },
             true)
      .get();
}

void ClusterControl::check_lost() {
  // Workers that left the pipeline lost are looked for again: one back joins (and,
  // with replan_on_join, the cluster is placed anew with it).
  std::vector<std::string> departed;
  if (const auto now = std::chrono::steady_clock::now(); now - departed_looked_ >= std::chrono::seconds(2)) {
    departed_looked_ = now;  // each costs up to a second when it is not back
    std::lock_guard lock(caps_mutex_);
    departed = departed_;
  }
  for (const std::string& address : departed) {
    try {
      join_within(address, std::nullopt, 1000);
      spdlog::info("worker {} is back: it joined the pipeline", address);
    } catch (const std::exception& e) {
      spdlog::debug("worker {} is not back: {}", address, e.what());
    }
  }
  std::string lost;  // an active worker lost with no live replica
  engine_.with_pipeline([&](Pipeline& p) {
           for (size_t i = 0; i < p.size() && lost.empty(); ++i) {
             const auto workers = p.workers(i);
             if (std::none_of(workers.begin(), workers.end(), [](Stage* w) { return w->up(); })) {
               lost = p.stage(i).info().name;
             }
           }
           return false;
         })
      .get();
  const auto now = std::chrono::steady_clock::now();
  if (lost.empty()) {
    lost_since_.reset();
    return;
  }
  if (!lost_since_) lost_since_ = now;
  if (now - *lost_since_ < std::chrono::duration<double>(options_.replan_on_loss_seconds)) return;
  lost_since_ = now;  // a placement that fails is tried again after as long
  spdlog::warn("worker {} is lost with no live replica for {} s: placing the live workers anew", lost,
               options_.replan_on_loss_seconds);
  place({});
}

bool ClusterControl::move_stage(Pipeline& p, size_t i, size_t k) {
  const auto sequences = engine_.sequences_on_stages();
  if (sequences && p.stage(i).up() && p.workers(i).at(k)->up()) return !p.hand_over(i, k, *sequences);
  return p.activate(i, k);
}

ClusterView ClusterControl::describe(Pipeline& pipeline) {
  ClusterView view;
  const PipelineTimings timings = pipeline.timings();
  view.failovers = timings.failovers;
  view.handed_over_sequences = timings.handed_over_sequences;
  view.standby_copies = timings.standby_copies;
  view.standby_copy_bytes = timings.standby_copy_bytes;
  view.standby_copy_seconds = timings.standby_copy_seconds;
  view.slow_moves = slow_moves_;
  view.spread = pipeline.spread();
  for (const uint32_t lane : pipeline.lanes()) {
    const auto steps = timings.lane_steps.find(lane);
    view.lanes.push_back({lane, steps == timings.lane_steps.end() ? 0 : steps->second});
  }
  for (size_t i = 0; i < pipeline.size(); ++i) {
    StageView stage;
    stage.layers = pipeline.stage(i).info().layers;
    const bool head = i + 1 == pipeline.size();
    const auto workers = pipeline.workers(i);
    for (size_t k = 0; k < workers.size(); ++k) {
      const StageInfo& info = workers[k]->info();
      WorkerView w;
      w.name = info.name;
      w.up = workers[k]->up();
      w.active = k == pipeline.active_worker(i);
      w.lane = pipeline.lane_of(i, k);
      w.backend = info.backend;
      w.isa = info.isa;
      w.device = info.device;
      w.threads = info.threads;
      w.memory_bytes = info.memory_bytes;
      w.round_trip_seconds = info.round_trip_seconds;
      if (const auto link = pipeline.links().coordinator.find(info.name); link != pipeline.links().coordinator.end()) {
        w.link = link->second;
      }
      w.decode_seconds = profiled_seconds(info, stage.layers, head, false);
      w.batch_seconds_per_token = profiled_seconds(info, stage.layers, head, true);
      stage.workers.push_back(std::move(w));
    }
    view.stages.push_back(std::move(stage));
  }
  return view;
}

ClusterView ClusterControl::view() {
  ClusterView out;
  engine_.with_pipeline([&](Pipeline& p) {
           out = describe(p);
           return false;
         })
      .get();
  const EngineMetrics m = engine_.metrics();
  for (size_t i = 0; i < out.stages.size(); ++i) {
    if (i < m.timings.stages.size()) out.stages[i].timings = m.timings.stages[i];
    if (i < m.stages.size()) out.stages[i].stats = m.stages[i];
  }
  return out;
}

ClusterView ClusterControl::join(const std::string& address, std::optional<uint64_t> memory_cap) {
  return join_within(address, memory_cap, options_.remote.connect_timeout_ms);
}

ClusterView ClusterControl::join_within(const std::string& address, std::optional<uint64_t> memory_cap,
                                        int connect_timeout_ms) {
  if (options_.remote.curve) {
    // Every stage accepts the keys its plan names (Plan.acceptKeys), fixed at connect.
    throw StageError("worker " + address + ": a CURVE cluster takes no worker at run time; list it in the config");
  }
  if (memory_cap) {
    std::lock_guard lock(caps_mutex_);
    options_.memory_caps[address] = *memory_cap;
  }
  RemoteOptions remote = options_.remote;
  remote.connect_timeout_ms = connect_timeout_ms;
  auto stage = std::make_unique<RemoteStage>(address, remote);
  {
    std::lock_guard lock(caps_mutex_);
    std::erase(departed_, address);
  }
  {
    // A `--layers auto` worker replicates the stage with the fewest live workers: one
    // waiting for its layers, or one whose range is no stage's (left out by an
    // earlier placement).
    std::optional<model::LayerRange> range;
    const StageInfo& info = stage->info();
    engine_.with_pipeline([&](Pipeline& p) {
             size_t best = 0, best_live = std::numeric_limits<size_t>::max();
             bool a_stage_of_its_range = false;
             for (size_t i = 0; i < p.size(); ++i) {
               size_t live = 0;
               for (Stage* w : p.workers(i)) live += w->up() ? 1 : 0;
               if (live < best_live) best = i, best_live = live;
               const auto& l = p.stage(i).info().layers;
               a_stage_of_its_range = a_stage_of_its_range || (l.first == info.layers.first && l.last == info.layers.last);
             }
             if (waits_for_layers(info) || (info.movable && !a_stage_of_its_range)) range = p.stage(best).info().layers;
             return false;
           })
        .get();
    if (range) {
      stage->assign(*range);
      stage.reset();  // it loads the range, then serves anew at its address
      remote.connect_timeout_ms = std::max(remote.connect_timeout_ms, 120000);
      stage = std::make_unique<RemoteStage>(address, remote);
    }
  }
  if (options_.limits_check) {
    if (const std::string short_of = options_.limits_check(stage->info()); !short_of.empty()) {
      throw StageError("worker " + address + " holds less than the coordinator was sized for: " + short_of);
    }
    stage->set_rejoin_check(options_.limits_check);
  }
  // Its link to the coordinator, for the lanes' predicted steps (Pipeline::links).
  const std::optional<LinkMeasure> link = measure_link(*stage, 1u << 20);
  auto joining = std::make_shared<std::unique_ptr<Stage>>(std::move(stage));
  engine_.with_pipeline([&](Pipeline& p) {
           if (link) p.add_link(address, *link);
           p.add_replica(std::move(*joining), identity_);
           return false;
         })
      .get();
  if (options_.replan_on_join) {
    // A cluster of --layers auto workers is placed anew; otherwise the stages move to
    // their fastest workers.
    bool movable = true;
    engine_.with_pipeline([&](Pipeline& p) {
             for (Stage* s : p.all_stages()) movable = movable && s->info().movable;
             return false;
           })
        .get();
    // The worker has joined either way: a refusal to move is logged, not thrown.
    try {
      if (movable && options_.placement) {
        place({});
      } else {
        replan(std::nullopt);
      }
    } catch (const StageError& e) {
      spdlog::warn("after worker {} joined: {}", address, e.what());
    }
  }
  return view();
}

ClusterView ClusterControl::replan(const std::optional<std::string>& drain, bool* moved) {
  const bool batch = options_.batch_objective;
  bool any = false;
  engine_.with_pipeline(
             [&](Pipeline& p) {
               // Every move is decided before any is made: a refusal changes nothing.
               std::vector<std::pair<size_t, size_t>> moves;
               bool drained_found = !drain;
               for (size_t i = 0; i < p.size(); ++i) {
                 const auto workers = p.workers(i);
                 const size_t current = p.active_worker(i);
                 const bool head = i + 1 == p.size();
                 const auto& layers = workers[current]->info().layers;
                 auto time_of = [&](size_t k) {
                   const auto t = profiled_seconds(workers[k]->info(), layers, head, batch);
                   return t ? *t : std::numeric_limits<double>::infinity();
                 };
                 // A worker of another lane serves already: only a drain takes it (its lane
                 // ends), and only when no worker standing by can.
                 auto rank = [&](size_t k) { return std::pair(p.lane_of(i, k).has_value(), time_of(k)); };
                 size_t best = workers.size();
                 for (size_t k = 0; k < workers.size(); ++k) {
                   if (k == current || (drain && workers[k]->info().name == *drain) || !workers[k]->up()) continue;
                   if (!drain && p.lane_of(i, k)) continue;
                   if (best == workers.size() || rank(k) < rank(best)) best = k;
                 }
                 if (drain) {
                   for (Stage* w : workers) drained_found = drained_found || w->info().name == *drain;
                   if (workers[current]->info().name != *drain) continue;
                   if (best == workers.size()) {
                     throw StageError("stage " + std::to_string(i) + ": no live replica can take layers " +
                                      model::to_string(layers) + " from worker " + *drain);
                   }
                   moves.emplace_back(i, best);
                 } else if (best < workers.size() && time_of(best) <= 0.9 * time_of(current)) {
                   moves.emplace_back(i, best);
                 }
               }
               if (!drained_found) throw StageError("no worker " + *drain + " in the pipeline");
               // A drained worker leaves its lane (that lane's sequences replay) and forms none again.
               bool replay = drain && p.keep_out_of_lanes(*drain);
               any = replay;
               for (const auto& [i, k] : moves) {
                 any = true;
                 replay = move_stage(p, i, k) || replay;
               }
               return replay;
             },
             true)
      .get();
  if (moved) *moved = any;
  return view();
}

ClusterView ClusterControl::move_layers(const std::map<std::string, model::LayerRange>& ranges) {
  std::optional<std::string> failed;  // a move that failed once workers had dropped their sequences
  engine_.with_pipeline([&](Pipeline& p) { return apply_ranges(p, ranges, {}, {}, &failed); }, true).get();
  if (failed) throw StageError(*failed);
  return view();
}

bool ClusterControl::apply_ranges(Pipeline& p, const std::map<std::string, model::LayerRange>& ranges,
                                  const std::vector<std::string>& dropped, const std::vector<std::string>& active,
                                  std::optional<std::string>* failed) {
  // Checked first: a refusal moves nothing.
  const std::vector<Stage*> all = p.all_stages();
  auto named = [&](const std::string& address) {
    auto it = std::find_if(all.begin(), all.end(), [&](Stage* s) { return s->info().name == address; });
    if (it == all.end()) throw StageError("no worker " + address + " in the pipeline");
    return *it;
  };
  for (const std::string& address : dropped) named(address);
  std::vector<std::pair<RemoteStage*, model::LayerRange>> moves;
  for (const auto& entry : ranges) {
    const std::string& address = entry.first;
    const model::LayerRange range = entry.second;
    Stage& s = *named(address);
    if (range.first < 0 || range.first >= range.last || range.last > static_cast<int32_t>(identity_.n_layer)) {
      throw StageError("layers " + model::to_string(range) + " for worker " + address + " are not a range of the model's " +
                       std::to_string(identity_.n_layer) + " layers");
    }
    if (s.info().layers.first == range.first && s.info().layers.last == range.last) continue;
    auto* remote = dynamic_cast<RemoteStage*>(&s);
    if (!remote || !s.info().movable) {
      throw StageError("worker " + address + " was not started with --layers auto: it keeps layers " +
                       model::to_string(s.info().layers));
    }
    if (!s.up()) throw StageError("worker " + address + " is not up");
    moves.emplace_back(remote, range);
  }
  std::vector<StageInfo> after;
  for (Stage* s : all) {
    StageInfo info = s->info();
    if (std::find(dropped.begin(), dropped.end(), info.name) != dropped.end()) continue;
    if (auto r = ranges.find(info.name); r != ranges.end()) info.layers = r->second;
    after.push_back(info);
  }
  std::sort(after.begin(), after.end(), [](const StageInfo& a, const StageInfo& b) {
    return a.layers.first != b.layers.first ? a.layers.first < b.layers.first : a.layers.last < b.layers.last;
  });
  after.erase(std::unique(after.begin(), after.end(),
                          [](const StageInfo& a, const StageInfo& b) {
                            return a.layers.first == b.layers.first && a.layers.last == b.layers.last;
                          }),
              after.end());
  check_coverage(after, static_cast<int32_t>(identity_.n_layer));
  // Which worker runs each position afterwards, when asked: the moves regroup keeps
  // the workers active before where it can.
  // With no range moved, the sequences' state is handed over where it can be (true:
  // replay); after a regroup everything is replayed anyway.
  auto activate_asked = [&](bool hand_over) {
    bool replay = false;
    for (const std::string& address : active) {
      for (size_t i = 0; i < p.size(); ++i) {
        const auto workers = p.workers(i);
        for (size_t k = 0; k < workers.size(); ++k) {
          if (workers[k]->info().name != address || !workers[k]->up() || k == p.active_worker(i)) continue;
          replay = (hand_over ? move_stage(p, i, k) : p.activate(i, k)) || replay;
        }
      }
    }
    return replay;
  };
  if (moves.empty() && dropped.empty()) return activate_asked(true);

  // Each worker takes its range, then is connected afresh once it has loaded it.
  RemoteOptions remote = options_.remote;
  remote.connect_timeout_ms = std::max(remote.connect_timeout_ms, 120000);
  auto reconnect = [&](const std::string& address, model::LayerRange range) {
    auto fresh = std::make_unique<RemoteStage>(address, remote);
    const auto& l = fresh->info().layers;
    if (l.first != range.first || l.last != range.last) {
      throw StageError("worker " + address + " serves layers " + model::to_string(l) + ", not " + model::to_string(range));
    }
    if (options_.limits_check) {
      if (const std::string short_of = options_.limits_check(fresh->info()); !short_of.empty()) {
        throw StageError("worker " + address + " with layers " + model::to_string(range) +
                         " holds less than the coordinator was sized for: " + short_of);
      }
      fresh->set_rejoin_check(options_.limits_check);
    }
    return fresh;
  };
  std::vector<std::unique_ptr<Stage>> fresh;
  std::vector<std::pair<RemoteStage*, model::LayerRange>> done;  // with its range before
  try {
    for (const auto& [stage, range] : moves) {
      const model::LayerRange before = stage->info().layers;
      spdlog::info("worker {}: moving from layers {} to {}", stage->info().name, model::to_string(before), model::to_string(range));
      stage->assign(range);
      done.emplace_back(stage, before);
      fresh.push_back(reconnect(stage->info().name, range));
    }
  } catch (const StageError& e) {
    // Back to the ranges they had; the pipeline is planned again and its sequences
    // replayed all the same (those workers dropped theirs). Nobody leaves.
    spdlog::error("moving layers: {}; the workers moved already take their ranges back", e.what());
    if (done.empty()) throw;
    fresh.clear();
    std::vector<std::unique_ptr<Stage>> back;
    for (const auto& [stage, before] : done) {
      try {
        stage->assign(before);  // its connection outlives the move: the socket stays
        back.push_back(reconnect(stage->info().name, before));
      } catch (const StageError& undo) {
        spdlog::error("worker {}: {}", stage->info().name, undo.what());
      }
    }
    if (!back.empty()) p.regroup(std::move(back), identity_);
    *failed = e.what();
    return true;
  }
  p.regroup(std::move(fresh), identity_, dropped);
  activate_asked(false);
  return true;  // the sequences are replayed: the moved workers dropped theirs
}

ClusterView ClusterControl::place(const std::map<std::string, uint64_t>& memory_caps, PlacementOutcome* outcome,
                                  bool dry_run) {
  if (!options_.placement) throw StageError("this pico-coord was started without what placement needs");
  PlacementOutcome out;
  std::optional<std::string> failed;
  engine_.with_pipeline([&](Pipeline& p) { return place_on(p, memory_caps, dry_run, out, &failed); }, true).get();
  if (failed) throw StageError(*failed);
  spdlog::info("placing anew: {}", out.why);
  if (outcome) *outcome = std::move(out);
  return view();
}

bool ClusterControl::place_on(Pipeline& p, const std::map<std::string, uint64_t>& new_caps, bool dry_run,
                              PlacementOutcome& out, std::optional<std::string>* failed) {
  constexpr uint64_t kProbeBytes = 1u << 20;
  std::map<std::string, uint64_t> caps;
  {
    std::lock_guard lock(caps_mutex_);
    caps = options_.memory_caps;
  }
  const auto all = p.all_stages();
  for (const auto& cap : new_caps) {
    const std::string& address = cap.first;
    if (std::none_of(all.begin(), all.end(), [&](Stage* s) { return s->info().name == address; })) {
      throw StageError("no worker " + address + " in the pipeline (its 'memory')");
    }
    caps[address] = cap.second;
  }
  // Who can be placed: every live worker; the lost ones leave.
  std::vector<RemoteStage*> live;
  std::vector<std::string> lost;
  for (Stage* s : p.all_stages()) {
    if (!s->up()) {
      lost.push_back(s->info().name);
      continue;
    }
    auto* remote = dynamic_cast<RemoteStage*>(s);
    if (!remote) throw StageError("stage " + s->info().name + " runs in this process: nothing to place anew");
    live.push_back(remote);
  }
  if (live.empty()) throw StageError("no live worker to place the model on");
  std::vector<MeasuredWorker> measured;
  std::vector<WorkerEntry> entries;
  for (RemoteStage* s : live) {
    measured.push_back(measure_worker(*s, kProbeBytes));
    WorkerEntry e;
    e.address = s->info().name;
    if (auto cap = caps.find(e.address); cap != caps.end()) e.memory = cap->second;
    entries.push_back(std::move(e));
  }
  PlacementProblem problem = *options_.placement;
  const PlaceableWorkers placeable = add_placeable_workers(problem, measured, entries, identity_);
  for (size_t i = 0; i < measured.size(); ++i) {
    if (!placeable.left_out[i].empty()) {
      throw StageError("worker " + measured[i].address + " cannot be placed: " + placeable.left_out[i]);
    }
    // One started with fixed layers (not --layers auto) keeps them: placed with exactly
    // them, standing by for a stage of them, or leaving.
    if (!live[i]->info().movable) problem.workers[i].fixed_layers = live[i]->info().layers;
  }
  {
    // A worker the watch saw slow counts as that slow for a while (its profile was
    // measured on an idle machine).
    std::lock_guard lock(caps_mutex_);
    const auto now = std::chrono::steady_clock::now();
    for (WorkerMeasures& w : problem.workers) {
      const auto slow = slowdowns_.find(w.name);
      if (slow == slowdowns_.end() || now >= slow->second.until) continue;
      scale_measures(w, slow->second.factor);
    }
  }
  if (!options_.remote.curve) {
    // Links between workers as they measure them (a CURVE link needs the keys of both,
    // which the plans fixed: those are estimated from the links to the coordinator).
    problem.worker_links = measure_worker_links(live, entries, placeable.placed, kProbeBytes);
  }
  Placement placement;
  try {
    placement = coordinator::place(problem);
  } catch (const PlacementError& e) {
    throw StageError(e.what());
  }
  if (!dry_run) {
    p.update_links(link_book(problem));  // the lanes' choice counts the links as measured now
    std::lock_guard lock(caps_mutex_);
    for (const auto& [address, bytes] : new_caps) options_.memory_caps[address] = bytes;
  }
  // The running split under the same measures (placeable.placed is the identity here).
  std::vector<std::pair<size_t, model::LayerRange>> running;
  bool usable = true;
  for (size_t i = 0; i < p.size() && usable; ++i) {
    const auto k = std::find(live.begin(), live.end(), &p.stage(i));
    if (k == live.end()) {
      usable = false;
    } else {
      running.emplace_back(static_cast<size_t>(k - live.begin()), p.stage(i).info().layers);
    }
  }
  std::optional<Placement> before;
  if (usable) before = evaluate_placement(problem, running);
  // What each serves: with lanes (--replicas spread) and the throughput objective,
  // every lane its standbys form together (the running split's standbys counted where
  // placement would put them).
  if (before) out.before_tokens_per_second = served_tokens_per_second(problem, *before);
  out.after_tokens_per_second = served_tokens_per_second(problem, placement);

  std::map<std::string, model::LayerRange> ranges;
  std::vector<std::string> dropped = lost, active;
  for (const PlacedStage& stage : placement.stages) {
    const std::string& address = live[stage.worker]->info().name;
    ranges[address] = stage.layers;
    active.push_back(address);
    out.stages.push_back({address, stage.layers, stage.compute_seconds, stage.send_seconds});
  }
  const std::vector<WorkerRole> roles = worker_roles(problem, placement);
  for (size_t w = 0; w < live.size(); ++w) {
    const std::string& address = live[w]->info().name;
    if (roles[w].stage && !roles[w].standby) continue;  // placed
    if (!roles[w].stage) {
      dropped.push_back(address);
      out.others.push_back({address, "leaves the pipeline: " + placement.excluded[w]});
      continue;
    }
    const model::LayerRange layers = placement.stages[*roles[w].stage].layers;
    ranges[address] = layers;
    out.others.push_back({address, fmt::format("stands by for stage {} (layers {}): {}", *roles[w].stage,
                                               model::to_string(layers), placement.excluded[w])});
  }
  for (const std::string& address : lost) out.others.push_back({address, "leaves the pipeline: lost"});
  const bool same = before && running.size() == placement.stages.size() &&
                    std::equal(running.begin(), running.end(), placement.stages.begin(), [](const auto& a, const PlacedStage& b) {
                      return a.first == b.worker && a.second.first == b.layers.first && a.second.last == b.layers.last;
                    });
  if (same) {
    out.why = fmt::format("the running split is the placement ({:.2f} tok/s predicted)", out.after_tokens_per_second);
    return false;
  }
  if (before && out.after_tokens_per_second < 1.1 * *out.before_tokens_per_second) {
    out.why = fmt::format("the placement predicts {:.2f} tok/s, the running split {:.2f}: less than 10 % more, "
                          "nothing moves",
                          out.after_tokens_per_second, *out.before_tokens_per_second);
    return false;
  }
  out.why = before ? fmt::format("the placement predicts {:.2f} tok/s, the running split {:.2f}",
                                 out.after_tokens_per_second, *out.before_tokens_per_second)
                   : fmt::format("the running split is unusable ({}); the placement predicts {:.2f} tok/s",
                                 usable ? "a worker holds more than its memory" : "a lost active worker",
                                 out.after_tokens_per_second);
  if (dry_run) {
    out.why = "dry run: it would move: " + out.why;
    return false;
  }
  out.moved = true;
  const bool replay = apply_ranges(p, ranges, dropped, active, failed);
  if (!*failed) {
    std::lock_guard lock(caps_mutex_);
    for (const std::string& address : lost) {
      if (std::find(departed_.begin(), departed_.end(), address) == departed_.end()) departed_.push_back(address);
    }
  }
  return replay;
}

}  // namespace pico::coordinator
