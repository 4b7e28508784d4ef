// The running cluster as /cluster shows and changes it: each stage's workers (the
// active one and its replicas) with their health and measures; a worker joining at run
// time (a replica of a stage's range; a `--layers auto` worker is given the range of
// the stage with the fewest live workers); moving a stage to another of its workers
// (draining one for maintenance, or to the fastest by their measures), the sequences'
// state handed over (or replayed); giving `--layers auto` workers other ranges, by
// name or by placing the cluster anew from fresh measures; and, when asked, a watch
// that moves a stage off a worker that stays slow and places anew after a loss.
// Everything that touches the pipeline runs on the engine's thread
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
#include "placement.hpp"
#include "profile_times.hpp"
#include "stage.hpp"

namespace pico::coordinator {

struct WorkerView {
  std::string name;
  bool up = false, active = false;
  std::optional<uint32_t> lane;  // the lane it runs in (nullopt: it stands by)
  std::string backend, isa, device;
  uint32_t threads = 0;
  uint64_t memory_bytes = 0;
  double round_trip_seconds = 0;
  std::optional<LinkMeasure> link;  // its link to the coordinator as last measured (Pipeline::links)
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
// What place() found and did: the new placement's stages, where every other worker
// went, and the cost model's tok/s for the running split and the new one.
struct PlacementOutcome {
  bool moved = false;
  std::string why;  // why it moved, or why not
  std::optional<double> before_tokens_per_second;  // nullopt: the running split is unusable (a lost or too small worker)
  double after_tokens_per_second = 0;
  struct Placed {
    std::string address;
    model::LayerRange layers;
    double compute_seconds = 0, send_seconds = 0;
  };
  std::vector<Placed> stages;
  struct Other {
    std::string address;
    std::string what;  // "stands by for stage N (layers A-B)", or why it leaves the pipeline
  };
  std::vector<Other> others;
};

struct ClusterView {
  std::vector<StageView> stages;
  uint64_t failovers = 0;
  uint64_t handed_over_sequences = 0;  // moved to another worker by snapshot and restore
  uint64_t slow_moves = 0;  // stages moved off a slow worker by the watch
  // Standby copies (Options::standby_copy_seconds): sequence states copied, their bytes,
  // the seconds generation waited for them.
  uint64_t standby_copies = 0, standby_copy_bytes = 0;
  double standby_copy_seconds = 0;
  // Replicas spread into lanes (Pipeline::set_spread), the lanes running, first first,
  // and the steps each finished.
  bool spread = false;
  struct LaneView {
    uint32_t id = 0;
    uint64_t steps = 0;
  };
  std::vector<LaneView> lanes;
};

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
// How much slower position i ran than the others: its ratio of measured to predicted
// time over the others' median ratio (at least 1), as slow_position judges it.
double slowdown(std::span<const StageWindow> windows, size_t i);

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
    // off is not moved back to by the watch for 10 windows. With no live replica, a
    // cluster of --layers auto workers is placed anew, the slow worker's times scaled
    // by its slowdown() for 10 windows.
    double slow_factor = 0;
    double slow_seconds = 3;
    // Placing anew (place()): the model's side of the placement problem (its layers,
    // ctx, parallel, bytes per token, objective and concurrency: cluster_measures.hpp's
    // model_placement_problem); unset, place() is refused.
    std::optional<PlacementProblem> placement;
    std::map<std::string, uint64_t> memory_caps;  // per worker address: what placement may plan on it
    // When an active worker is lost with no live replica for this long (0: never), the
    // live workers are placed anew (those of fixed layers keep them), so that new requests
    // are served again; the lost workers then left are looked for (every look of the
    // watch) and join again when back.
    double replan_on_loss_seconds = 0;
    // Every this many seconds (0: never), the state of each sequence that changed since
    // is copied to the live standbys of every stage (Pipeline::copy_to_standbys, once the
    // steps in flight finish), so that after a loss its replica replays only what came
    // after the copy.
    double standby_copy_seconds = 0;
  };
  ClusterControl(Engine& engine, protocol::ModelIdentity identity, Options options);
  ~ClusterControl();
  ClusterControl(const ClusterControl&) = delete;
  ClusterControl& operator=(const ClusterControl&) = delete;

  // Thread-safe; each waits for the engine thread.
  ClusterView view();
  // Connects the worker at address (hello; assign when it waits for its layers, or is
  // a --layers auto worker whose range is no stage's), checks its model and limits, and
  // adds it as a replica standing by. memory_cap: what placement may plan on it from
  // now on. With replan_on_join, a cluster of --layers auto workers is then placed
  // anew (place()), any other moves each stage to its fastest worker (replan()).
  // Throws StageError.
  ClusterView join(const std::string& address, std::optional<uint64_t> memory_cap = std::nullopt);
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
  // Measures the live workers and their links again, places them (a worker started
  // with fixed layers, not --layers auto, keeps them: placed with exactly them,
  // standing by for a stage of them, or left out) (placement.hpp, the objective it was started with; memory_caps
  // added to those it has) and, when the running split is unusable (a lost active
  // worker, one beyond its memory) or the new placement predicts at least 10 % more
  // tok/s, moves to it as move_layers does: the placed workers take their ranges in
  // its order, those left out stand by for a range they can hold or leave the
  // pipeline, as do lost workers. No request fails. Throws StageError (nothing moved).
  // dry_run: measures, places and says what it would do (outcome), moving nothing and
  // keeping no cap.
  ClusterView place(const std::map<std::string, uint64_t>& memory_caps, PlacementOutcome* outcome = nullptr,
                    bool dry_run = false);

 private:
  ClusterView describe(Pipeline& pipeline);
  void watch();
  // One look of the watch: moves a stage off a slow worker when there is one.
  void check_slow();
  // One look of the watch: places anew once an active worker has been lost, with no
  // live replica, for replan_on_loss_seconds.
  void check_lost();
  // One look of the watch: copies the sequences to the standbys when some lack them.
  void copy_to_standbys();
  // On the engine thread, with no step in flight: the workers named in `ranges` take
  // those ranges, those in `dropped` leave, then the pipeline is regrouped (and, given
  // `active`, those workers become active at their ranges). Checked first; should a
  // worker refuse or fail, those moved already take their ranges back, *failed says
  // why. Throws StageError when the check refuses. True: the sequences must be replayed.
  bool apply_ranges(Pipeline& p, const std::map<std::string, model::LayerRange>& ranges,
                    const std::vector<std::string>& dropped, const std::vector<std::string>& active,
                    std::optional<std::string>* failed);
  // Makes worker k of position i active (with nothing in flight): the sequences' state
  // handed over from the active worker when it can be (no replay: false), else by
  // Pipeline::activate (true: the caller replays).
  bool move_stage(Pipeline& p, size_t i, size_t k);
  ClusterView join_within(const std::string& address, std::optional<uint64_t> memory_cap, int connect_timeout_ms);
  // place()'s work on the engine thread.
  bool place_on(Pipeline& p, const std::map<std::string, uint64_t>& new_caps, bool dry_run, PlacementOutcome& outcome,
                std::optional<std::string>* failed);
  Engine& engine_;
  protocol::ModelIdentity identity_;
  Options options_;
  std::map<std::string, std::chrono::steady_clock::time_point> moved_off_;  // the watch's thread only
  std::atomic<uint64_t> slow_moves_{0};
  std::mutex caps_mutex_;  // memory_caps of options_, slowdowns_
  struct Slowdown {
    double factor = 1;
    std::chrono::steady_clock::time_point until;
  };
  std::map<std::string, Slowdown> slowdowns_;  // workers the watch saw slow, for place()
  std::vector<std::string> departed_;           // lost workers a placement dropped: the watch looks for them
  std::chrono::steady_clock::time_point departed_looked_{};  // the watch's thread only
  std::optional<std::chrono::steady_clock::time_point> lost_since_;  // the watch's thread only
  std::mutex watch_mutex_;
  std::condition_variable watch_cv_;
  bool stopping_ = false;
  std::thread watcher_;
};

}  // namespace pico::coordinator
