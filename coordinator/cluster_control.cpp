#include "cluster_control.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <memory>

#include "cluster_measures.hpp"
#include "placement.hpp"

namespace pico::coordinator {

namespace {
// The sum of time(a layer's measures) over layers [first, last) of the worker's profile
// (+ the head's); nullopt without a profile covering them.
template <class Time>
std::optional<double> over_profile(const StageInfo& info, model::LayerRange layers, bool head, Time&& time) {
  if (!info.profile || layers.last > static_cast<int32_t>(info.profile->layers.size())) return std::nullopt;
  double total = head ? time(info.profile->head) : 0.0;
  for (int32_t l = layers.first; l < layers.last; ++l) total += time(info.profile->layers[static_cast<size_t>(l)]);
  return total;
}
}  // namespace

std::optional<double> profiled_seconds(const StageInfo& info, model::LayerRange layers, bool head, bool batch) {
  return over_profile(info, layers, head, [&](const worker::LayerTime& t) {
    return batch && !t.seconds_per_token.empty() ? t.seconds_per_token.back() : t.decode_seconds;
  });
}

std::optional<double> predicted_step_seconds(const StageInfo& info, model::LayerRange layers, bool head, size_t tokens) {
  return over_profile(info, layers, head, [&](const worker::LayerTime& t) {
    return layer_step_seconds(t.decode_seconds, info.profile->batches, t.seconds_per_token, static_cast<double>(tokens));
  });
}

std::optional<size_t> slow_position(std::span<const StageWindow> windows, double factor, double window_seconds) {
  constexpr double kLateShare = 0.25;
  auto ratio = [](const StageWindow& w) { return w.measured / std::max(w.predicted, 1e-9); };
  std::optional<size_t> slowest;
  for (size_t i = 0; i < windows.size(); ++i) {
    if (!windows[i].judged) continue;
    std::vector<double> others;
    for (size_t j = 0; j < windows.size(); ++j) {
      if (j != i && windows[j].judged) others.push_back(ratio(windows[j]));
    }
    double reference = 1.0;
    if (!others.empty()) {
      std::sort(others.begin(), others.end());
      const size_t n = others.size();
      reference = std::max(1.0, n % 2 ? others[n / 2] : (others[n / 2 - 1] + others[n / 2]) / 2);
    }
    const StageWindow& w = windows[i];
    const bool slow = ratio(w) >= factor * reference && w.measured - reference * w.predicted >= kLateShare * window_seconds;
    if (slow && (!slowest || ratio(w) > ratio(windows[*slowest]))) slowest = i;
  }
  return slowest;
}

ClusterControl::ClusterControl(Engine& engine, protocol::ModelIdentity identity, Options options)
    : engine_(engine), identity_(std::move(identity)), options_(std::move(options)) {
  if (options_.slow_factor > 0) watcher_ = std::thread([this] { watch(); });
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
  const auto every = std::chrono::duration<double>(std::clamp(options_.slow_seconds / 4, 0.05, 1.0));
  std::unique_lock lock(watch_mutex_);
  while (!watch_cv_.wait_for(lock, every, [&] { return stopping_; })) {
    lock.unlock();
    try {
      check_slow();
    } catch (const std::exception& e) {
      spdlog::warn("the slow-worker watch: {}", e.what());
    }
    lock.lock();
  }
}

void ClusterControl::check_slow() {
  const auto window = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(options_.slow_seconds));
  const auto now = std::chrono::steady_clock::now();
  std::optional<std::pair<size_t, size_t>> move;
  std::string slow_worker, why;
  engine_.with_pipeline([&](Pipeline& p) {
           std::vector<StageWindow> windows(p.size());
           for (size_t i = 0; i < p.size(); ++i) {
             if (now - p.active_since(i) < window) continue;
             const StageInfo& info = p.stage(i).info();
             const bool head = i + 1 == p.size();
             StageWindow& w = windows[i];
             const auto steps = p.recent_steps(i, window);
             for (const StageStepTime& step : steps) {
               const auto predicted = predicted_step_seconds(info, info.layers, head, step.tokens);
               if (!predicted) break;
               w.predicted += *predicted;
               w.measured += step.seconds;
             }
             w.judged = !steps.empty() && w.predicted > 0;
           }
           for (size_t i = 0; i < windows.size(); ++i) {
             spdlog::debug("slow-worker watch: stage {}: {:.4f} s of compute in the last {} s, {:.4f} s predicted{}", i,
                           windows[i].measured, options_.slow_seconds, windows[i].predicted,
                           windows[i].judged ? "" : " (not judged)");
           }
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
           if (!best) return false;
           move.emplace(i, *best);
           slow_worker = workers[current]->info().name;
           why = fmt::format("stage {}: worker {} is slow: {:.3f} s of compute in the last {:.1f} s where its profile "
                             "predicts {:.3f} s; its replica {} takes its layers",
                             i, slow_worker, windows[i].measured, options_.slow_seconds, windows[i].predicted,
                             workers[*best]->info().name);
           return false;
         })
      .get();
  if (!move) return;
  const auto [i, k] = *move;
  engine_.with_pipeline(
             [&, i = i, k = k](Pipeline& p) {
               // Still the same worker there (a replan or failover may have come first).
               if (p.stage(i).info().name != slow_worker || !p.workers(i)[k]->up()) return false;
               spdlog::warn("{}", why);
               moved_off_[slow_worker] = std::chrono::steady_clock::now();
               ++slow_moves_;
               return p.activate(i, k);
             },
             true)
      .get();
}

ClusterView ClusterControl::describe(Pipeline& pipeline) {
  ClusterView view;
  view.failovers = pipeline.timings().failovers;
  view.slow_moves = slow_moves_;
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
      w.backend = info.backend;
      w.isa = info.isa;
      w.device = info.device;
      w.threads = info.threads;
      w.memory_bytes = info.memory_bytes;
      w.round_trip_seconds = info.round_trip_seconds;
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

ClusterView ClusterControl::join(const std::string& address) {
  if (options_.remote.curve) {
    // Every stage accepts the keys its plan names (Plan.acceptKeys), fixed at connect.
    throw StageError("worker " + address + ": a CURVE cluster takes no worker at run time; list it in the config");
  }
  RemoteOptions remote = options_.remote;
  auto stage = std::make_unique<RemoteStage>(address, remote);
  if (waits_for_layers(stage->info())) {
    // A `--layers auto` worker replicates the stage with the fewest live workers.
    model::LayerRange range;
    engine_.with_pipeline([&](Pipeline& p) {
             size_t best = 0, best_live = std::numeric_limits<size_t>::max();
             for (size_t i = 0; i < p.size(); ++i) {
               size_t live = 0;
               for (Stage* w : p.workers(i)) live += w->up() ? 1 : 0;
               if (live < best_live) best = i, best_live = live;
             }
             range = p.stage(best).info().layers;
             return false;
           })
        .get();
    stage->assign(range);
    stage.reset();  // it loads the range, then serves anew at its address
    remote.connect_timeout_ms = std::max(remote.connect_timeout_ms, 120000);
    stage = std::make_unique<RemoteStage>(address, remote);
  }
  if (options_.limits_check) {
    if (const std::string short_of = options_.limits_check(stage->info()); !short_of.empty()) {
      throw StageError("worker " + address + " holds less than the coordinator was sized for: " + short_of);
    }
    stage->set_rejoin_check(options_.limits_check);
  }
  auto joining = std::make_shared<std::unique_ptr<Stage>>(std::move(stage));
  engine_.with_pipeline([&](Pipeline& p) {
           p.add_replica(std::move(*joining), identity_);
           return false;
         })
      .get();
  if (options_.replan_on_join) replan(std::nullopt);
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
                 size_t best = workers.size();
                 for (size_t k = 0; k < workers.size(); ++k) {
                   if (k == current || (drain && workers[k]->info().name == *drain) || !workers[k]->up()) continue;
                   if (best == workers.size() || time_of(k) < time_of(best)) best = k;
                 }
                 if (drain) {
                   for (Stage* w : workers) drained_found = drained_found || w->info().name == *drain;
                   if (workers[current]->info().name != *drain) continue;
                   if (best == workers.size()) {
                     throw StageError("stage " + std::to_string(i) + ": no live replica can take layers " +
                                      std::to_string(layers.first) + "-" + std::to_string(layers.last - 1) +
                                      " from worker " + *drain);
                   }
                   moves.emplace_back(i, best);
                 } else if (best < workers.size() && time_of(best) <= 0.9 * time_of(current)) {
                   moves.emplace_back(i, best);
                 }
               }
               if (!drained_found) throw StageError("no worker " + *drain + " in the pipeline");
               for (const auto& [i, k] : moves) any = p.activate(i, k) || any;
               return any;
             },
             true)
      .get();
  if (moved) *moved = any;
  return view();
}

namespace {

std::string range_text(model::LayerRange r) { return std::to_string(r.first) + "-" + std::to_string(r.last - 1); }

}  // namespace

ClusterView ClusterControl::move_layers(const std::map<std::string, model::LayerRange>& ranges) {
  std::optional<std::string> failed;  // a move that failed once workers had dropped their sequences
  engine_.with_pipeline(
             [&](Pipeline& p) {
               // Checked first: a refusal moves nothing.
               const std::vector<Stage*> all = p.all_stages();
               std::vector<StageInfo> after;
               std::vector<std::pair<RemoteStage*, model::LayerRange>> moves;
               for (const auto& entry : ranges) {
                 const std::string& address = entry.first;
                 const model::LayerRange range = entry.second;
                 auto it = std::find_if(all.begin(), all.end(), [&](Stage* s) { return s->info().name == address; });
                 if (it == all.end()) throw StageError("no worker " + address + " in the pipeline");
                 Stage& s = **it;
                 if (range.first < 0 || range.first >= range.last ||
                     range.last > static_cast<int32_t>(identity_.n_layer)) {
                   throw StageError("layers " + range_text(range) + " for worker " + address + " are not a range of the model's " +
                                    std::to_string(identity_.n_layer) + " layers");
                 }
                 if (s.info().layers.first == range.first && s.info().layers.last == range.last) continue;
                 auto* remote = dynamic_cast<RemoteStage*>(&s);
                 if (!remote || !s.info().movable) {
                   throw StageError("worker " + address + " was not started with --layers auto: it keeps layers " +
                                    range_text(s.info().layers));
                 }
                 if (!s.up()) throw StageError("worker " + address + " is not up");
                 moves.emplace_back(remote, range);
               }
               for (Stage* s : all) {
                 StageInfo info = s->info();
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
               if (moves.empty()) return false;

               // Each worker takes its range, then is connected afresh once it has loaded it.
               RemoteOptions remote = options_.remote;
               remote.connect_timeout_ms = std::max(remote.connect_timeout_ms, 120000);
               auto reconnect = [&](const std::string& address, model::LayerRange range) {
                 auto fresh = std::make_unique<RemoteStage>(address, remote);
                 const auto& l = fresh->info().layers;
                 if (l.first != range.first || l.last != range.last) {
                   throw StageError("worker " + address + " serves layers " + range_text(l) + ", not " + range_text(range));
                 }
                 if (options_.limits_check) {
                   if (const std::string short_of = options_.limits_check(fresh->info()); !short_of.empty()) {
                     throw StageError("worker " + address + " with layers " + range_text(range) +
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
                   spdlog::info("worker {}: moving from layers {} to {}", stage->info().name, range_text(before),
                                range_text(range));
                   stage->assign(range);
                   done.emplace_back(stage, before);
                   fresh.push_back(reconnect(stage->info().name, range));
                 }
               } catch (const StageError& e) {
                 // Back to the ranges they had; the pipeline is planned again and its
                 // sequences replayed all the same (those workers dropped theirs).
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
                 failed = e.what();
               }
               if (!failed) p.regroup(std::move(fresh), identity_);
               return true;  // the sequences are replayed: the moved workers dropped theirs
             },
             true)
      .get();
  if (failed) throw StageError(*failed);
  return view();
}

}  // namespace pico::coordinator
