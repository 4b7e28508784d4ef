// The running cluster as /cluster shows and changes it: each stage's workers (the
// active one and its replicas) with their health and measures; a worker joining at run
// time (a replica of a stage's range; a `--layers auto` worker is given the range of
// the stage with the fewest live workers); moving a stage to another of its workers
// (draining one for maintenance, or to the fastest by their measures), the sequences
// following by replay. Everything that touches the pipeline runs on the engine's
// thread (Engine::with_pipeline); joining connects from the caller's thread first.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine.hpp"
#include "stage.hpp"

namespace pico::coordinator {

struct WorkerView {
  std::string name;
  bool up = false, active = false;
  std::string backend, isa, device;
  uint32_t threads = 0;
  uint64_t memory_bytes = 0;
  double round_trip_seconds = 0;
  // Its profile's time for the stage's layers (and the head on the last stage), per
  // token: one token alone, and in a prefill-sized batch; nullopt without a profile.
  std::optional<double> decode_seconds, batch_seconds_per_token;
};
struct StageView {
  model::LayerRange layers;
  std::vector<WorkerView> workers;
};
struct ClusterView {
  std::vector<StageView> stages;
  uint64_t failovers = 0;
};

// A worker's profiled time per token for layers [first, last) (+ the head when `head`):
// nullopt without a profile covering them.
std::optional<double> profiled_seconds(const StageInfo& info, model::LayerRange layers, bool head, bool batch);

class ClusterControl {
 public:
  struct Options {
    RemoteOptions remote;                // how to reach a joining worker (no CURVE: see join)
    Stage::RejoinCheck limits_check;     // what a joining worker must hold (sizing)
    bool replan_on_join = false;         // move to the fastest workers after each join
    bool batch_objective = false;        // rank workers by batch time per token (throughput)
  };
  ClusterControl(Engine& engine, protocol::ModelIdentity identity, Options options);

  // Thread-safe; each waits for the engine thread.
  ClusterView view();
  // Connects the worker at address (hello; assign when it waits for its layers), checks
  // its model and limits, and adds it as a replica standing by. Throws StageError.
  ClusterView join(const std::string& address);
  // drain: the worker to take out of service (every stage it runs moves to its fastest
  // live replica; an error when a stage of it has none). Without: every stage moves to
  // its live worker with the shortest profiled time when that is at least 10 % shorter
  // than the active one's. *moved says whether any stage moved.
  ClusterView replan(const std::optional<std::string>& drain, bool* moved = nullptr);

 private:
  static ClusterView describe(Pipeline& pipeline);
  Engine& engine_;
  protocol::ModelIdentity identity_;
  Options options_;
};

}  // namespace pico::coordinator
