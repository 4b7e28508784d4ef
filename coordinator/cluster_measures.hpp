// The measures placement needs (placement.hpp), gathered: what each layer of the model
// needs (from the file), and from each worker its profile (Capabilities) and its link
// to the coordinator (heartbeat round trips, one empty and one carrying a probe).
// Links between workers are not measured yet: placement estimates them from the two
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

// Connects to each worker (hello, then probes of probe_bytes); a worker that cannot be
// reached or sent no profile has `error` set instead of failing the rest.
std::vector<MeasuredWorker> measure_workers(const std::vector<WorkerEntry>& workers, const RemoteOptions& options,
                                            const std::optional<net::KeyPair>& own_keys, uint64_t probe_bytes);

}  // namespace pico::coordinator
