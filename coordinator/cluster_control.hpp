// The running cluster as /cluster shows and changes it: each stage's workers (the
// active one and its replicas) with their health and measures; a worker joining at run
// time (a replica of a stage's range; a `--layers auto` worker is given the range of
// the stage with the fewest live workers); moving a stage to another of its workers
// (draining one for maintenance, or to the fastest by their measures), the sequences
// following by replay; and, when asked, a watch that moves a stage off a worker that
// stays slow. Everything that touches the pipeline runs on the engine's thread
// (Engine::with_pipeline); joining connects from the caller's thread first.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
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
  // Its compute / queue / transfer totals (Pipeline::timings), and its active worker's
  // memory as of the engine's last idle moment (nullopt before one).
  StageTimingTotals timings;
  std::optional<StageStats> stats;
};
struct ClusterView {
  std::vector<StageView> stages;
  uint64_t failovers = 0;
  uint64_t slow_moves = 0;  // stages moved off a slow worker by the watch
};

// A worker's profiled time per token for layers [first, last) (+ the head when `head`):
// nullopt without a profile covering them.
std::optional<double> profiled_seconds(const StageInfo& info, model::LayerRange layers, bool head, bool batch);
// What its profile predicts for a step of `tokens` tokens through those layers: per
// layer, the placement's layer_step_seconds.
std::optional<double> predicted_step_seconds(const StageInfo& info, model::LayerRange layers, bool head, size_t tokens);

// A position's last window of steps, as the slow-worker rule judges it.
struct StageWindow {
  bool judged = false;   // its worker was active the whole window, finished steps in it, and has a profile
  double measured = 0;   // the steps' times (StageStepTime), seconds
  double predicted = 0;  // what the worker's profile predicts for the same steps
};
// The position whose worker is slow, or nullopt. Its ratio of measured to predicted
// time is at least `factor` times what the other judged positions show (the median of
// their ratios, at least 1; 1 when there is none): a machine's load or a small model's
// fixed costs slow every stage alike and move nothing. And the time beyond what that
// explains is at least a quarter of the window, so that a few slow steps on an idle
// cluster move nothing either. The largest ratio when several are.
std::optional<size_t> slow_position(std::span<const StageWindow> windows, double factor, double window_seconds);

class ClusterControl {
 public:
  struct Options {
    RemoteOptions remote;                // how to reach a joining worker (no CURVE: see join)
    Stage::RejoinCheck limits_check;     // what a joining worker must hold (sizing)
    bool replan_on_join = false;         // move to the fastest workers after each join
    bool batch_objective = false;        // rank workers by batch time per token (throughput)
    // The watch (off at 0): a stage whose worker stays slow for slow_seconds
    // (slow_position over that window, checked a few times a window) moves to its
    // live replica with the shortest profiled time, as a replan does; a worker moved
    // off is not moved back to by the watch for 10 windows.
    double slow_factor = 0;
    double slow_seconds = 3;
  };
  ClusterControl(Engine& engine, protocol::ModelIdentity identity, Options options);
  ~ClusterControl();
  ClusterControl(const ClusterControl&) = delete;
  ClusterControl& operator=(const ClusterControl&) = delete;

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
  // Gives workers other layer ranges (address -> range): each named worker (started
  // with --layers auto) loads its new range, the pipeline is regrouped by range and
  // every sequence is replayed there, so no request fails. Checked before anything
  // moves: every named worker is in the pipeline, remote, movable and up, and the
  // ranges all workers then serve tile the model. Should a worker refuse or fail, the
  // ones moved already are given their ranges back. Throws StageError.
  ClusterView move_layers(const std::map<std::string, model::LayerRange>& ranges);

 private:
  ClusterView describe(Pipeline& pipeline);
  void watch();
  // One look of the watch: moves a stage off a slow worker when there is one.
  void check_slow();
  Engine& engine_;
  protocol::ModelIdentity identity_;
  Options options_;
  std::map<std::string, std::chrono::steady_clock::time_point> moved_off_;  // the watch's thread only
  std::atomic<uint64_t> slow_moves_{0};
  std::mutex watch_mutex_;
  std::condition_variable watch_cv_;
  bool stopping_ = false;
  std::thread watcher_;
};

}  // namespace pico::coordinator
