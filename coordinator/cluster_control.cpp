#include "cluster_control.hpp"

#include <spdlog/spdlog.h>

#include <limits>
#include <memory>

#include "cluster_measures.hpp"

namespace pico::coordinator {

std::optional<double> profiled_seconds(const StageInfo& info, model::LayerRange layers, bool head, bool batch) {
  if (!info.profile || layers.last > static_cast<int32_t>(info.profile->layers.size())) return std::nullopt;
  auto time = [&](const worker::LayerTime& t) { return batch ? t.batch_seconds_per_token : t.decode_seconds; };
  double total = head ? time(info.profile->head) : 0.0;
  for (int32_t l = layers.first; l < layers.last; ++l) total += time(info.profile->layers[static_cast<size_t>(l)]);
  return total;
}

ClusterControl::ClusterControl(Engine& engine, protocol::ModelIdentity identity, Options options)
    : engine_(engine), identity_(std::move(identity)), options_(std::move(options)) {}

ClusterView ClusterControl::describe(Pipeline& pipeline) {
  ClusterView view;
  view.failovers = pipeline.timings().failovers;
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

}  // namespace pico::coordinator
