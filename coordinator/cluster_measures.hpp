// The measures placement needs (placement.hpp), gathered: what each layer of the model
// needs (from the file), and from each worker its profile (Capabilities) and its link
// to the coordinator (heartbeat round trips, one empty and one carrying a probe).
// Links between workers are measured by the workers themselves (measure_worker_links)
// where no CURVE keys stand between them; placement estimates the others from the two
// workers' links to the coordinator.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cluster_config.hpp"
#include "gguf/reader.hpp"
#include "placement.hpp"
#include "stage.hpp"

namespace pico::coordinator {

// The model's side of a placement problem: each layer's weights, KV per position and
// recurrent state per sequence (F16 KV), the first and last stages' tensors, and the
// bytes per token of hidden states between stages (`activations` as the links carry
// them) and of logits rows back.
PlacementProblem model_placement_problem(const gguf::Model& file, int64_t ctx, int parallel,
                                         protocol::DType activations);

struct MeasuredWorker {
  std::string address;
  std::optional<StageInfo> info;  // nullopt: it could not be reached (error says why)
  std::string error;
  LinkMeasure link;
};

// A connected worker's profile and link (heartbeat round trips, empty and carrying
// probe_bytes); `error` says when it sent no profile.
MeasuredWorker measure_worker(RemoteStage& stage, uint64_t probe_bytes);
// A connected worker's link alone (as measure_worker measures it): nullopt, with a
// warning logged, when it does not answer the probes.
std::optional<LinkMeasure> measure_link(RemoteStage& stage, uint64_t probe_bytes);
// Connects to each worker and measures it; a worker that cannot be reached or sent no
// profile has `error` set instead of failing the rest.
// connected (optional): the stages, kept connected (null where unreachable).
std::vector<MeasuredWorker> measure_workers(const std::vector<WorkerEntry>& workers, const RemoteOptions& options,
                                            const std::optional<net::KeyPair>& own_keys, uint64_t probe_bytes,
                                            std::vector<std::unique_ptr<RemoteStage>>* connected = nullptr);

// The measured workers that can be placed, added to `problem` (their profile, the
// memory they offer capped by the config's `memory`, their link): `placed[k]` is the
// index in `measured` of problem.workers[k]. The others get their reason in left_out
// (unreachable, no profile, another model).
struct PlaceableWorkers {
  std::vector<size_t> placed;
  std::vector<std::string> left_out;  // per measured worker; empty: placeable
};
PlaceableWorkers add_placeable_workers(PlacementProblem& problem, const std::vector<MeasuredWorker>& measured,
                                       const std::vector<WorkerEntry>& entries, const protocol::ModelIdentity& model);

struct AutoPlacement {
  Objective objective = Objective::latency;
  int concurrency = 0;  // throughput: tokens per step (0: parallel)
  int64_t ctx = 0;
  int parallel = 1;
  protocol::DType activations = protocol::DType::F32;
  bool lanes = false;  // pico-coord --replicas spread: PlacementProblem::lanes
};

// The links between placed workers, measured by the workers themselves (protocol
// LinkProbe): [k][l] from the worker of problem.workers[k] to that of [l], as
// PlacementProblem::worker_links takes them; a link a worker could not measure stays
// empty (placement then estimates it). stages[i] is entries[i], connected.
std::vector<std::vector<std::optional<LinkMeasure>>> measure_worker_links(
    const std::vector<RemoteStage*>& stages, const std::vector<WorkerEntry>& entries,
    const std::vector<size_t>& placed, uint64_t probe_bytes);

// Whether a worker waits for its layers (pico-worker --layers auto: Capabilities with
// no range).
bool waits_for_layers(const StageInfo& info);

// pico-worker --layers auto: when some of the connected workers (connected[i] is
// workers[i]) hold no range yet, measures and places them all (placement.hpp; one
// that has its range keeps it: placed with exactly it, or left out) and assigns each
// waiting one its range (protocol Assign); returns the workers that take part, in
// pipeline order, with their ranges (each then loads its range and serves anew at its
// address: connect again). Workers that all have their ranges are returned as they
// are, and nothing is measured. links (optional): set to what was measured
// (link_book). Throws PlacementError when no placement holds the model, StageError
// for a worker that refuses its range.
std::vector<WorkerEntry> assign_auto_layers(std::vector<std::unique_ptr<RemoteStage>>& connected,
                                            const std::vector<WorkerEntry>& workers, const gguf::Model& file,
                                            const AutoPlacement& settings, LinkBook* links = nullptr);

}  // namespace pico::coordinator
