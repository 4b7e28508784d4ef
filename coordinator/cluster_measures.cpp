#include "cluster_measures.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>

#include "link_probe.hpp"
#include "state/kv_cache.hpp"

namespace pico::coordinator {

PlacementProblem model_placement_problem(const gguf::Model& file, int64_t ctx, int parallel,
                                         protocol::DType activations) {
  const auto model = model::Model::load(file);
  const int32_t n_layer = static_cast<int32_t>(model->hparams().n_layer);
  PlacementProblem p;
  p.ctx = ctx;
  p.parallel = parallel;
  p.layers.resize(static_cast<size_t>(n_layer));
  // Where each tensor is read, by the stages' own rule (worker::stage_reads): a layer's
  // tensors by its stage; the rest by a first stage or a last one or both (what every
  // stage reads, a few bytes of rope factors, is counted on the first and the last).
  const model::LayerRange first_only{0, std::min(1, n_layer - 1)}, last_only{std::max(1, n_layer - 1), n_layer};
  for (const auto& t : file.tensors()) {
    if (t.name.rfind("blk.", 0) == 0) {
      const int layer = std::atoi(t.name.c_str() + 4);
      if (layer >= 0 && layer < n_layer) p.layers[static_cast<size_t>(layer)].weight_bytes += t.bytes;
      continue;
    }
    if (worker::stage_reads(file, t.name, first_only, n_layer)) p.first_stage_bytes += t.bytes;
    if (worker::stage_reads(file, t.name, last_only, n_layer)) p.last_stage_bytes += t.bytes;
  }
  for (int32_t l = 0; l < n_layer; ++l) {
    const state::KvConfig kv = model->kv_config({l, l + 1});
    p.page_positions = kv.page_positions;
    p.layers[static_cast<size_t>(l)].kv_bytes_per_position = state::kv_bytes_per_position(kv);
    p.layers[static_cast<size_t>(l)].state_bytes_per_sequence =
        model->make_cache({l, l + 1})->fixed_bytes_per_sequence();
  }
  const uint64_t n_embd = static_cast<uint64_t>(model->hparams().n_embd);
  switch (activations) {
    case protocol::DType::F32: p.hidden_bytes_per_token = 4 * n_embd; break;
    case protocol::DType::F16: p.hidden_bytes_per_token = 2 * n_embd; break;
    case protocol::DType::Q80: p.hidden_bytes_per_token = (n_embd + 31) / 32 * 34; break;
  }
  p.logits_bytes_per_token = 4 * static_cast<uint64_t>(model->hparams().n_vocab);
  p.input_bytes_per_token = 4;
  return p;
}

MeasuredWorker measure_worker(RemoteStage& stage, uint64_t probe_bytes) {
  MeasuredWorker m;
  m.address = stage.address();
  // A worker waiting for its layers has no limits yet; it takes link probes of up to
  // 64 MiB (worker/link_probe.hpp).
  const uint64_t largest = stage.info().limits.max_message_bytes > 0 ? stage.info().limits.max_message_bytes / 2
                                                                     : worker::kMaxLinkProbeBytes;
  const uint64_t bytes = std::max<uint64_t>(1, std::min<uint64_t>(probe_bytes, largest));
  const double empty = stage.probe_round_trip(0, 4);
  const double loaded = stage.probe_round_trip(bytes, 3);
  m.link.latency_seconds = std::min(empty, stage.info().round_trip_seconds) / 2;
  // The probe's extra time is its bytes in transit (one way); a link faster than the
  // clock can tell is taken as 100 GB/s.
  m.link.bytes_per_second = static_cast<double>(bytes) / std::max(loaded - empty, static_cast<double>(bytes) / 1e11);
  if (!stage.info().profile) m.error = "sent no profile";
  m.info = stage.info();
  return m;
}

std::optional<LinkMeasure> measure_link(RemoteStage& stage, uint64_t probe_bytes) {
  try {
    return measure_worker(stage, probe_bytes).link;
  } catch (const StageError& e) {
    spdlog::warn("the link to {} is not measured: {}", stage.address(), e.what());
    return std::nullopt;
  }
}

std::vector<MeasuredWorker> measure_workers(const std::vector<WorkerEntry>& workers, const RemoteOptions& options,
                                            const std::optional<net::KeyPair>& own_keys, uint64_t probe_bytes,
                                            std::vector<std::unique_ptr<RemoteStage>>* connected) {
  std::vector<MeasuredWorker> out;
  for (const WorkerEntry& w : workers) {
    MeasuredWorker m;
    m.address = w.address;
    std::unique_ptr<RemoteStage> stage;
    try {
      RemoteOptions ro = options;
      if (own_keys) ro.curve = net::Curve{*own_keys, w.public_key};
      stage = std::make_unique<RemoteStage>(w.address, ro);
      m = measure_worker(*stage, probe_bytes);
    } catch (const std::exception& e) {
      m.error = e.what();
      stage.reset();
    }
    if (connected) connected->push_back(std::move(stage));
    if (!m.error.empty()) spdlog::warn("{}: {}", w.address, m.error);
    out.push_back(std::move(m));
  }
  return out;
}

PlaceableWorkers add_placeable_workers(PlacementProblem& problem, const std::vector<MeasuredWorker>& measured,
                                       const std::vector<WorkerEntry>& entries, const protocol::ModelIdentity& model) {
  PlaceableWorkers out;
  out.left_out.resize(measured.size());
  for (size_t i = 0; i < measured.size(); ++i) {
    const MeasuredWorker& m = measured[i];
    if (!m.error.empty()) {
      out.left_out[i] = m.error;
      continue;
    }
    if (m.info->identity.hash != model.hash) {
      out.left_out[i] = "serves another model (" + protocol::to_string(m.info->identity) + ")";
      continue;
    }
    WorkerMeasures w;
    w.name = m.address;
    for (const worker::LayerTime& t : m.info->profile->layers) {
      w.decode_seconds.push_back(t.decode_seconds);
      w.batch_seconds_per_token.push_back(t.seconds_per_token);
    }
    w.head_decode_seconds = m.info->profile->head.decode_seconds;
    w.head_batch_seconds_per_token = m.info->profile->head.seconds_per_token;
    w.profile_batches = m.info->profile->batches;
    w.memory_bytes = m.info->profile->memory_bytes;
    if (i < entries.size() && entries[i].memory) w.memory_bytes = std::min(w.memory_bytes, *entries[i].memory);
    problem.workers.push_back(std::move(w));
    problem.coordinator_links.push_back(m.link);
    out.placed.push_back(i);
  }
  return out;
}

std::vector<std::vector<std::optional<LinkMeasure>>> measure_worker_links(
    const std::vector<RemoteStage*>& stages, const std::vector<WorkerEntry>& entries,
    const std::vector<size_t>& placed, uint64_t probe_bytes) {
  std::vector<std::vector<std::optional<LinkMeasure>>> links(placed.size(),
                                                             std::vector<std::optional<LinkMeasure>>(placed.size()));
  for (size_t k = 0; k < placed.size(); ++k) {
    for (size_t l = 0; l < placed.size(); ++l) {
      if (k == l) continue;
      const WorkerEntry& to = entries[placed[l]];
      std::string error;
      const auto m = stages[placed[k]]->probe_link(to.address, to.public_key, probe_bytes, &error);
      if (m) {
        links[k][l] = LinkMeasure{m->first, m->second};
      } else {
        spdlog::warn("link {} -> {} not measured ({}): estimated from their links to the coordinator",
                     entries[placed[k]].address, to.address, error);
      }
    }
  }
  return links;
}

bool waits_for_layers(const StageInfo& info) { return info.layers.last <= info.layers.first; }

std::vector<WorkerEntry> assign_auto_layers(std::vector<std::unique_ptr<RemoteStage>>& connected,
                                            const std::vector<WorkerEntry>& workers, const gguf::Model& file,
                                            const AutoPlacement& settings, LinkBook* links) {
  const auto waiting = std::count_if(connected.begin(), connected.end(),
                                     [](const auto& stage) { return waits_for_layers(stage->info()); });
  if (waiting == 0) return workers;
  std::vector<MeasuredWorker> measured;
  for (auto& stage : connected) measured.push_back(measure_worker(*stage, 4u << 20));
  const protocol::ModelIdentity identity = protocol::model_identity(file);
  PlacementProblem problem = model_placement_problem(file, settings.ctx, settings.parallel, settings.activations);
  problem.objective = settings.objective;
  problem.concurrency = settings.concurrency > 0 ? settings.concurrency : settings.parallel;
  problem.lanes = settings.lanes;
  const PlaceableWorkers placeable = add_placeable_workers(problem, measured, workers, identity);
  if (placeable.placed.empty()) throw PlacementError("no worker answered with a profile of this model");
  // A worker started with fixed layers (not --layers auto) keeps them: placed with
  // exactly them or left out.
  for (size_t k = 0; k < placeable.placed.size(); ++k) {
    const StageInfo& info = connected[placeable.placed[k]]->info();
    if (!waits_for_layers(info) && !info.movable) problem.workers[k].fixed_layers = info.layers;
  }
  std::vector<RemoteStage*> stages;
  for (auto& stage : connected) stages.push_back(stage.get());
  problem.worker_links = measure_worker_links(stages, workers, placeable.placed, 4u << 20);
  if (links) *links = link_book(problem);
  const Placement placement = place(problem);
  spdlog::info("placement for {}: {:.2f} tok/s predicted ({} token(s) a step)", to_string(problem.objective),
               placement.tokens_per_second, placement.batch);
  // Each placed worker takes its stage's range; each left out that holds a stage's
  // range stands by for it (a replica: with --replicas spread, a standby at every
  // stage forms one more lane).
  const std::vector<WorkerRole> roles = worker_roles(problem, placement);
  const auto take = [&](size_t k, size_t s) {
    const PlacedStage& stage = placement.stages[s];
    const size_t i = placeable.placed[k];
    WorkerEntry entry = workers[i];
    entry.layers = stage.layers;
    const model::LayerRange held = connected[i]->info().layers;
    if (held.first != stage.layers.first || held.last != stage.layers.last) connected[i]->assign(stage.layers);
    return entry;
  };
  std::vector<WorkerEntry> ordered;
  for (size_t s = 0; s < placement.stages.size(); ++s) {
    const PlacedStage& stage = placement.stages[s];
    ordered.push_back(take(stage.worker, s));
    spdlog::info("stage {}: {} takes layers {}-{} ({:.3f} ms compute a step)", s, ordered.back().address,
                 stage.layers.first, stage.layers.last - 1, stage.compute_seconds * 1e3);
  }
  for (size_t k = 0; k < placeable.placed.size(); ++k) {
    if (placement.excluded[k].empty()) continue;
    const std::string& address = measured[placeable.placed[k]].address;
    if (!roles[k].standby) {
      spdlog::info("left out {}: {}", address, placement.excluded[k]);
      continue;
    }
    ordered.push_back(take(k, *roles[k].stage));
    spdlog::info("{} stands by for stage {} (layers {}), out of the first chain: {}", address, *roles[k].stage,
                 model::to_string(*ordered.back().layers), placement.excluded[k]);
  }
  if (problem.lanes) {
    const LanesPrediction lanes = predict_lanes(problem, placement, problem.concurrency);
    spdlog::info("with the lanes the standbys form: {} lane(s), {:.2f} tok/s predicted at {} streams",
                 lanes.lanes.size(), lanes.tokens_per_second, problem.concurrency);
  }
  for (size_t i = 0; i < measured.size(); ++i) {
    if (!placeable.left_out[i].empty()) spdlog::warn("left out {}: {}", measured[i].address, placeable.left_out[i]);
  }
  return ordered;
}

}  // namespace pico::coordinator
