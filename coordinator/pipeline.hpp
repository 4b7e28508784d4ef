// The ordered stages of one model: checked at connect (model identity, layer
// coverage with no gap and no overlap), planned (each stage learns the next), then
// driven step by step: submit a batch to the first stage, wait for its logits from
// the last. A lost worker fails the steps in flight; the next submit tries to get it
// back (RemoteStage::rejoin) and, once it is, re-sends every plan.
//
// Replicas: workers given the same layer range are one position of the pipeline; the
// first of them is active, the others stand by. fail_over() puts a live replica in
// place of a lost active worker and plans every stage again; the caller then replays
// its sequences (every step in flight is gone, and the replica holds none of them).
//
// Lanes (set_spread): while every position has a live worker standing by, those
// workers form one more chain through the layers, a lane, that runs steps of its own
// beside the first one; each sequence lives on one lane (the caller says which in
// submit). A lane that loses a worker takes a standby in its place, or, when its
// position has none, ends: its other workers stand by again, and its sequences replay
// on another lane. The first lane is the one the single-chain calls (stage(i),
// activate, hand_over, copies, recent_steps) work on.
#pragma once

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "link_times.hpp"
#include "stage.hpp"

namespace pico::coordinator {

// Where the time of the finished steps went, per stage, summed since the start
// (seconds; the stages' stamps mapped onto the coordinator's clock).
struct StageTimingTotals {
  model::LayerRange layers;
  // What runs the stage (its Capabilities): backend, CPU level, device ("name, driver"),
  // device memory; empty / 0 on the CPU.
  std::string backend, isa, device;
  uint64_t device_memory_bytes = 0;
  double compute_seconds = 0;   // running the layers
  double queue_seconds = 0;     // input waiting while the stage was busy with earlier batches
  double transfer_seconds = 0;  // input in transit: from the coordinator (stage 0) or the stage before
  uint64_t batches = 0, tokens = 0;
};
struct PipelineTimings {
  std::vector<StageTimingTotals> stages;
  double logits_transfer_seconds = 0;  // last stage back to the coordinator
  uint64_t chained_steps = 0;          // finished steps the last stage had started itself
  uint64_t failovers = 0;              // lost workers replaced by a replica (Pipeline::fail_over)
  uint64_t handed_over_sequences = 0;  // sequences whose state moved to another worker (Pipeline::hand_over)
  // Standby copies (Pipeline::copy_to_standbys): sequence states restored on standbys,
  // their bytes, and the time the rounds took (generation waits meanwhile).
  uint64_t standby_copies = 0, standby_copy_bytes = 0;
  double standby_copy_seconds = 0;
  std::map<uint32_t, uint64_t> lane_steps;  // finished steps per lane id (Pipeline::lanes)
};

// A sequence and the positions it holds on every worker of its lane (Pipeline::copy_to_standbys).
struct SequenceLength {
  int32_t seq_id = 0;
  int32_t length = 0;
  uint32_t lane = 0;  // Pipeline::lanes(); 0: the first lane
};

// One finished step at a position, on its active worker: its compute time (the
// worker's own stamps), what the worker's profile predicts. Not the transfers: a stalled
// process holds the messages of its neighbours' too, and a small model's fixed costs
// would swamp the layers' time.
struct StageStepTime {
  std::chrono::steady_clock::time_point finished;  // when the coordinator learnt of it
  size_t tokens = 0;
  double seconds = 0;
};

// A step that one stage refused or answered with something that does not fit it (an
// error reply naming the step, e.g. a worker's limit or badRequest; logits without
// their rows) while every stage is still up: only that step is gone, the other steps
// in flight go on. Any other StageError from wait() (a lost stage, a timeout, an error
// about no step) abandons every step in flight.
class StepRefused : public StageError {
 public:
  explicit StepRefused(const StageError& e) : StageError(e.what(), e.step()) {}
};

// With several lanes: a worker of some lanes is lost while every other lane goes on.
// Only the steps in flight of the lanes named are abandoned; the other lanes' steps are
// still in flight and answer as usual (fail_over(lanes()) then mends those lanes alone).
class LanesLost : public StageError {
 public:
  LanesLost(const StageError& e, std::vector<uint32_t> lanes) : StageError(e.what(), e.step()), lanes_(std::move(lanes)) {}
  const std::vector<uint32_t>& lanes() const { return lanes_; }

 private:
  std::vector<uint32_t> lanes_;
};

class Pipeline {
 public:
  // Throws StageError when the stages do not form the model `expected` with n_layer
  // layers. A stage whose layers are those of an earlier one is its replica.
  Pipeline(std::vector<std::unique_ptr<Stage>> stages, const protocol::ModelIdentity& expected);

  // Positions (one per layer range) and the worker active at each (in the first lane).
  size_t size() const { return positions_.size(); }
  Stage& stage(size_t i) { return positions_.at(i).active(); }
  // Lanes: with spread on, every set of live standbys, one at each position, forms a
  // lane of its own (planned as a chain at once); off, the lanes after the first end
  // (the caller replays their sequences: lanes() no longer has them). Only while no
  // step is in flight. Spreading needs remote workers: with a local stage there is one lane.
  void set_spread(bool spread);
  bool spread() const { return spread_; }
  // The lanes' ids, the first lane first. An id is never used again once its lane ended,
  // so a sequence whose lane is not among them replays on another.
  std::vector<uint32_t> lanes() const;
  // The worker of lane `lane` at position i (0: the first lane). Throws std::out_of_range
  // for a lane that is not running.
  Stage& stage(size_t i, uint32_t lane);
  // The lane worker k of position i runs in (nullopt: it stands by).
  std::optional<uint32_t> lane_of(size_t i, size_t k) const;
  // Keeps the worker named out of the lanes (one drained, or moved off as slow): a lane
  // after the first that it runs in ends (true: the caller replays), and no lane forms
  // with it until it is lost and back, joins again, or a regroup. Only while no step is
  // in flight.
  bool keep_out_of_lanes(const std::string& name);
  // Every worker: the active ones and the replicas standing by (sizing, rejoin checks).
  std::vector<Stage*> all_stages();
  // Workers standing by at position i (live or not).
  size_t replicas(size_t i) const { return positions_.at(i).workers.size() - 1; }
  // Each lost active worker whose position has a live replica is replaced by it, and
  // every stage is planned again; the steps in flight are abandoned. True when a
  // worker was replaced and every active worker is now up (the caller replays its
  // sequences); false when nothing was lost or a lost one has no live replica (then
  // nothing changed). Only while no step is in flight (after wait() or submit() threw).
  // With lanes: a lane whose lost worker has no live standby ends, when another lane
  // goes on (true; that lane's sequences replay on another); false when none would.
  // `only` (after LanesLost): just those lanes are mended; they must have no step in
  // flight (LanesLost dropped theirs), the others keep theirs and are not planned again.
  bool fail_over(std::span<const uint32_t> only = {});
  // Tries to get back lost replicas standing by (RemoteStage::rejoin; never throws).
  void rejoin_standbys();
  // The workers at position i (the active one is workers(i)[active_worker(i)]).
  std::vector<Stage*> workers(size_t i);
  size_t active_worker(size_t i) const { return positions_.at(i).current; }
  // A worker joining the running pipeline: a replica standing by at the position of its
  // layers (returned). Throws StageError when it serves another model or a range that
  // is no position's.
  size_t add_replica(std::unique_ptr<Stage> stage, const protocol::ModelIdentity& expected);
  // Makes worker k of position i the active one (it must be up) and plans every stage
  // again; the steps in flight are abandoned and the caller replays its sequences, as
  // after fail_over(). False when it was active already. Throws StageError otherwise.
  // A worker k running in a later lane leaves it first (that lane ends).
  bool activate(size_t i, size_t k);
  // As activate() (worker k, up, not the active one, becomes active; every stage is
  // planned again), but the sequences' state moves from the worker active before (up)
  // to worker k, same layers, by snapshot and restore (each then closed on the old
  // worker), so that the caller replays nothing: every other stage keeps its state.
  // False when a snapshot or restore failed: worker k is active all the same, and the
  // caller replays (its closes reach both workers). Throws StageError, changing
  // nothing, when k is no replica or either worker is not up. A worker k running in a
  // later lane leaves it first: that lane ends, and the result is false (its sequences replay).
  bool hand_over(size_t i, size_t k, std::span<const int32_t> sequences);
  // Standby copies, so that a replica taking a lost worker's place replays only what
  // came after the copy: the state of each sequence given (with the positions every
  // worker of its lane holds for it) is copied from its lane's worker at each position
  // to the other live workers there (snapshot, restore): the standbys (each planned
  // first, which makes it this session's and keeps what it is given) and the workers
  // of the other lanes (which take the sequence over when its lane ends:
  // adopt_copies), skipping a worker that holds a sequence at that length already. Only while no step is in flight. A standby that
  // fails is skipped (its copy of that sequence forgotten, and closed there); a failed
  // snapshot ends the round (the active worker is lost: the next step finds it).
  struct CopyRound {
    uint64_t sequences = 0, bytes = 0;
  };
  CopyRound copy_to_standbys(std::span<const SequenceLength> sequences);
  // Whether copy_to_standbys(sequences) would copy anything (a look, no message sent).
  bool copies_due(std::span<const SequenceLength> sequences);
  // The sequence now holds only its first `length` positions (a reuse cut it): its
  // copies stay valid up to there.
  void cut_copies(int32_t seq_id, int32_t length);
  // After workers took positions over (fail_over, activate) and before the caller's
  // replay: the positions of seq_id that every worker now active in its lane holds, as
  // copied while it stood by (the replay may start there under the same id; each stage
  // cuts the sequence on arrival), 0 when one of them has no copy or no worker of that
  // lane changed. forget_taken_over() once the replay is planned. A regroup leaves 0
  // everywhere.
  int32_t copied_prefix(int32_t seq_id, uint32_t lane = 0) const;
  // In the same window: lane `lane` runs with the workers it had (none taken over, and
  // it did not end), which hold each of its sequences as far as its steps that came
  // back (the replay may start there; each stage cuts on arrival what an abandoned
  // step added).
  bool kept_its_workers(uint32_t lane) const;
  // For a sequence whose lane ended and that now goes on in lane `lane`: the positions
  // of seq_id that every worker of that lane holds as a copy (0 when one has none). The
  // replay may start there under the same id. Those copies become the lane's own.
  int32_t adopt_copies(int32_t seq_id, uint32_t lane);
  // What adopt_copies(seq_id, lane) would return, taking nothing.
  int32_t copies_in_lane(int32_t seq_id, uint32_t lane) const;
  void forget_taken_over();
  // Closes seq_id only on the workers that were replaced (a lost one when it rejoins):
  // a sequence that resumes from a copy keeps its id, and they hold a stale state of it.
  void close_on_replaced(int32_t seq_id);

  // After workers took other ranges (a --layers auto worker moved by Assign): `moved`
  // holds their new connections, each replacing the worker of its name. The workers
  // are grouped into positions by range in layer order, a worker active before staying
  // active where it can; every stage is planned again, the steps in flight are
  // abandoned and the caller replays its sequences. Workers named in `dropped` leave
  // the pipeline (a lost worker, or one a new placement has no range for); one still
  // up hears the replay's closes (it holds the sequences) until the next regroup or
  // until a worker of its name joins again. Throws
  // StageError, changing nothing, when a moved or dropped worker is not in the
  // pipeline or the ranges do not tile the model.
  void regroup(std::vector<std::unique_ptr<Stage>> moved, const protocol::ModelIdentity& expected,
               const std::vector<std::string>& dropped = {});

  // Starts a step on lane `lane` (0: the first); returns its id. outputs: per batch
  // row, what the last stage returns for it when it wants logits (empty: full rows; see
  // Stage::submit). chain: the last stage may start up to chain.steps steps after it
  // itself (ChainGrant; ignored unless chains_possible()); their ids follow this one's.
  // Throws StageError when a stage is lost (and did not rejoin just now),
  // std::logic_error while a chain runs or for a lane that is not running. With several
  // lanes only this lane's workers are looked at, and a lost one throws LanesLost for
  // this lane (the others' losses are wait()'s to find).
  uint64_t submit(std::span<const model::BatchToken> batch, std::span<const protocol::LogitsOutput> outputs = {},
                  const ChainGrant& chain = {}, uint32_t lane = 0);
  // Steps of lane `lane` in flight.
  size_t in_flight(uint32_t lane) const;
  // What the profiles of lane `lane`'s workers predict for a step of `tokens` tokens
  // through every position, plus its links' time (LinkBook::chain_seconds, with
  // `full_logits_rows` of the rows returning logits rows, the others their arg max;
  // nullopt: every row) when the links of every lane's workers were measured
  // (set_links; else no lane counts its links, so that lanes compare alike); nullopt
  // when a worker has no profile.
  std::optional<double> predicted_step_seconds(uint32_t lane, size_t tokens,
                                               std::optional<size_t> full_logits_rows = std::nullopt) const;
  // The links the coordinator measured (link_book); newer measures (LinkBook::update);
  // one more worker's link to it (a worker that joined).
  void set_links(LinkBook links) { links_ = std::move(links); }
  void update_links(const LinkBook& newer) { links_.update(newer); }
  void add_link(const std::string& worker, const LinkMeasure& link) { links_.coordinator[worker] = link; }
  const LinkBook& links() const { return links_; }
  // The next finished step of any lane (within a lane, steps finish in the order
  // submitted; a chained one right after the step it follows, which says so:
  // StepOutput::chained). A lane with steps in flight that answers nothing within
  // timeout_ms counts as an error too. Throws StepRefused
  // when a stage that is still up refused one step in flight (only that one is dropped;
  // StepRefused::step() names it); StageError on any other error, a lost stage, or no
  // answer within timeout_ms: the steps in flight are then abandoned (their late
  // answers are dropped). With several lanes, when only some have a lost worker:
  // LanesLost, and only their steps are abandoned.
  StepOutput wait(int timeout_ms);
  // Tries to get every lost stage back (RemoteStage::rejoin) and, when one came back,
  // plans every stage again; submit() does this first. Throws StageError naming a stage
  // that is still lost, at once when a replica of it is up (fail_over() is then the
  // way on). Only while no step is in flight.
  void rejoin_lost();
  // The first stage that is not up in any lane (its name), or empty when all are.
  std::string lost_stage();
  // Every stage is remote, so the last can send chained steps to the first.
  bool chains_possible() const { return chains_possible_; }
  // A chained step is in flight or may still be started: no other step may be
  // submitted (it could reach the first stage before or after the chained one).
  bool chain_running() const;
  // On every stage that is up; a lost one closes it when it rejoins.
  void close(int32_t seq_id);
  // Thread-safe.
  PipelineTimings timings() const;
  // The steps the worker of lane `lane` (0: the first) at position i finished in the
  // last `within` (at most kRecentSteps, none from before it took that place), and since
  // when it runs there (now for a lane not running, or a worker with no step yet).
  std::vector<StageStepTime> recent_steps(size_t i, std::chrono::steady_clock::duration within,
                                          uint32_t lane = 0) const;
  std::chrono::steady_clock::time_point active_since(size_t i, uint32_t lane = 0) const;
  static constexpr size_t kRecentSteps = 4096;

 private:
  // A worker's last kRecentSteps steps since it took its place in a lane, a ring, and
  // since when it runs there.
  struct RecentSteps {
    std::vector<StageStepTime> steps;
    size_t next = 0;
    std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
  };
  void plan_all();
  void plan_lane(size_t lane);
  // With spread on and remote workers: new lanes from the live standbys, one at each
  // position, while there are some (not planned; true when one formed).
  bool form_lanes();
  // Lane `lane` (an index) ends: its workers stand by again, holding the closes of the
  // replay (its sequences replay on another lane).
  void end_lane(size_t lane);
  // form_lanes, then each new lane planned.
  void add_lanes();
  std::optional<size_t> find_lane(uint32_t id) const;  // its index; nullopt for a lane not running (0: the first)
  size_t lane_index(uint32_t id) const;  // throws std::logic_error for a lane not running
  // The steps in flight of the lanes given (ids; every lane when empty) are dropped.
  void abandon_steps(std::span<const uint32_t> lanes = {});
  // The running lanes with a worker that is not up (their ids).
  std::vector<uint32_t> lanes_with_a_lost_worker();
  // Positions from workers in pipeline order (a worker with an earlier one's range is
  // its replica), checked against the model; sets the timings' stages and logs them.
  void line_up(std::vector<std::unique_ptr<Stage>> stages, const protocol::ModelIdentity& expected);
  // A live worker of position i that stands by (in no lane; the first such).
  std::optional<size_t> live_replica(size_t i);
  // Makes worker k of position i the one of lane `lane` (an index); the one it replaces
  // gets the replay's closes.
  void switch_to(size_t i, size_t k, size_t lane = 0);
  void account(const StepOutput& out, size_t tokens, uint64_t wait_start, size_t lane);
  // Worker k of position i takes a place in a lane: its recent steps start anew.
  void start_recent(size_t i, size_t k);
  // Its recent steps (nullptr: none yet). With timings_mutex_ held.
  const RecentSteps* recent_of(size_t i, size_t k) const;
  // Whether worker k of position i takes copies of the sequences of lane `lane` (it is
  // not that lane's worker there, and the lane runs).
  bool copies_to(size_t i, size_t k, uint32_t lane) const;
  // The standby copies worker k of position i holds (seq id -> positions).
  std::map<int32_t, int32_t>& copies_of(size_t i, size_t k);
  // Worker k of position i holds no copy we know of: each is closed there (a lost
  // worker hears it when it rejoins), and the records go.
  void forget_copies(size_t i, size_t k);

  struct Position {
    std::vector<std::unique_ptr<Stage>> workers;  // the same layers; workers[current] runs them
    size_t current = 0;
    std::vector<size_t> spread;  // the worker of each lane after the first, in lane order
    // Replaced (lost, maybe only hung, or moved away from), it may still hold sequences:
    // the closes of the caller's replay reach it (a lost one when it rejoins); none after
    // the first step on the replica.
    std::vector<bool> holds_closed;
    // Per worker: the sequences copied to it (a standby's, or another lane's), with the positions copied.
    std::vector<std::map<int32_t, int32_t>> copies;
    // Per worker (guarded by timings_mutex_; sized on first use).
    std::vector<RecentSteps> recent;
    Stage& active() const { return *workers[current]; }
    size_t worker_of(size_t lane) const { return lane == 0 ? current : spread.at(lane - 1); }
    bool runs(size_t k) const { return k == current || std::find(spread.begin(), spread.end(), k) != spread.end(); }
  };
  std::vector<Position> positions_;
  std::vector<std::unique_ptr<Stage>> leaving_;  // left the pipeline while up: closes reach them
  // Per lane id, per position, since the last forget_taken_over(): the copies the worker
  // that took it over held (nullopt: its worker did not change).
  std::map<uint32_t, std::vector<std::optional<std::map<int32_t, int32_t>>>> taken_over_;
  uint64_t next_step_ = 1;
  // The first step submitted after a worker was last given holds_closed: its answer
  // means the caller's replay (and its closes) went out.
  uint64_t holds_closed_until_ = 0;
  struct Inflight {
    uint64_t step = 0;
    size_t tokens = 0;
    uint32_t chain_steps = 0;  // the last stage may start this many steps after it
    bool chained = false;      // started by the last stage
  };
  bool chains_possible_ = false;
  bool spread_ = false;
  LinkBook links_;
  // The links of every lane's workers are in links_ (predicted_step_seconds counts them).
  bool links_cover_every_lane() const;
  struct Lane {
    uint32_t id = 0;
    std::deque<Inflight> inflight;
    std::chrono::steady_clock::time_point answered;  // its last answer, or its first step after none in flight
  };
  std::vector<Lane> lanes_;  // lanes_[0] runs each position's current worker, lanes_[j] its spread[j - 1]
  uint32_t next_lane_ = 1;
  std::vector<std::string> kept_out_;  // keep_out_of_lanes
  size_t poll_from_ = 0;  // the lane wait() looks at first (modulo the lanes)
  mutable std::mutex timings_mutex_;
  PipelineTimings timings_;
};

// The coverage check alone (for tests): stages' [first, last) in order must tile
// [0, n_layer). Throws StageError naming the stages at fault.
void check_coverage(const std::vector<StageInfo>& stages, int32_t n_layer);

}  // namespace pico::coordinator
