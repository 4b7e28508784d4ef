// A Stage runs a contiguous range of layers: LocalStage in-process (worker's
// StageEngine), RemoteStage a pico-worker over ZeroMQ. The Pipeline (pipeline.hpp)
// chains them; the scheduler sees only the Pipeline.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/model.hpp"
#include "net.hpp"
#include "protocol.hpp"
#include "profile.hpp"
#include "stage_engine.hpp"

namespace pico::coordinator {

// A stage failed: an error reply, a lost connection, a refused check. The message
// names the stage.
class StageError : public std::runtime_error {
 public:
  explicit StageError(const std::string& what, uint64_t step = 0) : std::runtime_error(what), step_(step) {}
  // The step the error concerns (0: none, or every step).
  uint64_t step() const { return step_; }

 private:
  uint64_t step_ = 0;
};

struct StageInfo {
  std::string name;                // "local" or the worker's address
  model::LayerRange layers;
  protocol::ModelIdentity identity;
  std::string isa, backend;
  std::string device;              // the backend's device ("name, driver"); empty on the CPU
  uint64_t device_memory_bytes = 0;
  uint32_t cores = 0, threads = 0;
  uint64_t memory_bytes = 0;
  worker::StageLimits limits;      // what the stage holds at most (protocol Limits)
  std::optional<worker::WorkerProfile> profile;  // a worker's measures (Capabilities.profile)
  double round_trip_seconds = 0;   // the fastest heartbeat round trip at connect (a remote stage)
  bool movable = false;            // a --layers auto worker: takes another range while serving (Assign)
};

// Logits rows: a vector of the process's own, or a received frame read in place (no
// copy of the 4 x n_vocab bytes per row).
class LogitsBuffer {
 public:
  LogitsBuffer() = default;
  LogitsBuffer(std::vector<float> values) : values_(std::move(values)), data_(values_.data()), size_(values_.size()) {}
  LogitsBuffer(zmq::message_t frame, const float* data, size_t size, std::vector<float> scratch)
      : values_(std::move(scratch)), frame_(std::move(frame)), data_(data), size_(size) {}
  LogitsBuffer(LogitsBuffer&&) noexcept = default;
  LogitsBuffer& operator=(LogitsBuffer&&) noexcept = default;
  const float* data() const { return data_; }
  size_t size() const { return size_; }
  const float* begin() const { return data_; }
  const float* end() const { return data_ + size_; }

 private:
  std::vector<float> values_;  // moving a vector keeps its buffer, so data_ stays valid
  zmq::message_t frame_;
  const float* data_ = nullptr;
  size_t size_ = 0;
};

// The stamps one stage put on a step (its own clock, protocol::StageTiming).
struct StageStamp {
  uint32_t stage = 0;
  uint64_t received = 0, idle_since = 0, compute_start = 0, compute_end = 0, sent = 0;
};

// One stage's trace of a step's traced rows (model::BatchToken::trace, protocol
// LayerTrace): the RMS of each row's residual stream after each of its layers.
struct StageTrace {
  int32_t first_layer = 0, layers = 0;
  std::vector<int32_t> seq_ids, positions;
  std::vector<float> rms;  // rows x layers, row by row
};

// The logits of one finished step: one row per token that asked for them. A row asked
// as arg max only (LogitsOutput::ARGMAX) may come back as just that (argmax[row] >= 0)
// or in full; full rows are n_vocab values each, in row order, in `logits`.
struct StepOutput {
  uint64_t step = 0;
  std::vector<int32_t> seq_ids;
  std::vector<int32_t> positions;
  LogitsBuffer logits;
  int64_t n_vocab = 0;
  // One per row, or empty when every row is full: -1 for a full row, else the row's
  // arg max (the first of equal maxima) with its logit in argmax_logits.
  std::vector<int32_t> argmax;
  std::vector<float> argmax_logits;
  // The last stage started step + 1 itself, a greedy chain (ChainGrant): the same
  // sequences, each row's arg max as its token, positions + 1.
  bool chained = false;
  bool sent_by_last = false;  // this step was such a chained one: sent_nanos is in the last stage's clock
  // The rows asked as hidden states (LogitsOutput::HIDDEN), not among the rows above:
  // their sequences and positions, and n_embd values each after the output norm.
  std::vector<int32_t> hidden_seq_ids, hidden_positions;
  std::vector<float> hidden;
  int64_t n_embd = 0;
  bool is_argmax(size_t row) const { return !argmax.empty() && argmax[row] >= 0; }
  // A full row's logits (empty for an arg max row).
  std::span<const float> row_logits(size_t row) const;
  // Timings: when the coordinator sent the step and received its logits (its clock),
  // and each stage's stamps, in pipeline order.
  uint64_t sent_nanos = 0, received_nanos = 0;
  std::vector<StageStamp> stamps;
  std::vector<StageTrace> traces;  // each stage's, in pipeline order, when rows were traced
};

struct StageStats {
  uint64_t memory_bytes = 0, kv_bytes = 0, batches = 0, tokens = 0;
  uint32_t sequences = 0;
  uint64_t chained_steps = 0;  // steps the (last) stage started itself
  // Of kv_bytes (all sequence state): a hybrid's recurrent states with their
  // checkpoints, and of those the checkpoints.
  uint64_t recurrent_bytes = 0, checkpoint_bytes = 0;
  uint64_t free_bytes = 0;  // memory the stage's process may still fill (model::MemoryRoom)
};

// A grant to the last stage to start up to `steps` further steps itself (protocol
// Forward.chainSteps): after a step whose rows all want their arg max only, and none
// of whose arg maxes is a stop token, it sends the next step (those tokens, positions
// + 1) straight to the first stage, so that a greedy token costs no hop through the
// coordinator.
struct ChainGrant {
  uint32_t steps = 0;
  std::vector<int32_t> stop_tokens;
};

class Stage {
 public:
  virtual ~Stage() = default;
  virtual const StageInfo& info() const = 0;
  // Where this stage's output goes: `next` (of the same kind), or, when null, back
  // to the coordinator as logits. chain_to (the last stage only, may be null): the
  // first stage, where it may start chained steps (ChainGrant).
  virtual void plan(Stage* next, Stage* chain_to, size_t index, size_t count) = 0;
  // The first stage: starts a step through the whole pipeline. outputs: what the last
  // stage returns for each batch row that wants logits (empty: full rows for all);
  // chain: how many steps after it the last stage may start itself.
  virtual void submit(uint64_t step, std::span<const model::BatchToken> batch,
                      std::span<const protocol::LogitsOutput> outputs, const ChainGrant& chain) = 0;
  virtual void close(int32_t seq_id) = 0;
  // No truncate: a stage cuts a sequence when its next token comes below the positions
  // it holds (StageEngine::forward), since a separate message could reach a later
  // stage after that token.
  // A finished step (the last stage), waiting up to timeout_ms; throws StageError on
  // an error reply or a lost connection (any stage).
  virtual std::optional<StepOutput> poll(int timeout_ms) = 0;
  virtual StageStats stats() = 0;
  // The state of one sequence on this stage's layers (nullopt: not open here), and
  // putting one back (throws StageError when refused).
  virtual std::optional<std::vector<uint8_t>> snapshot(int32_t seq_id) = 0;
  virtual void restore(int32_t seq_id, std::span<const uint8_t> state) = 0;
  // Slots on disk (worker/slot_file.hpp): the stage writes a sequence's state on its
  // layers with the sequence's tokens to `name` in its own slot directory (returns the
  // state's bytes), or reads one back into seq_id (the file's tokens and bytes). Throws
  // StageError naming what is wrong; a stage without slots on disk refuses both.
  struct SlotRead {
    std::vector<int32_t> tokens;
    uint64_t bytes = 0;
  };
  virtual uint64_t save_slot(int32_t seq_id, const std::string& name, std::span<const int32_t> tokens);
  virtual SlotRead restore_slot(int32_t seq_id, const std::string& name);
  // A stage in another process: its stamps are in its own clock, and its input and
  // output cross a link. clock_offset_nanos: its clock minus the coordinator's.
  virtual bool remote() const { return false; }
  virtual int64_t clock_offset_nanos() const { return 0; }
  // False once the stage was lost (looks at its connection now); rejoin() then tries
  // to get it back (see RemoteStage), throwing StageError when it is not back.
  virtual bool up() { return true; }
  virtual void rejoin() {}
  // What a stage coming back must still hold: the coordinator sized ctx x parallel
  // against the limits it had at connect (sizing.hpp). The check says why a stage's
  // new limits fall short (empty: they do not); rejoin() then refuses it.
  using RejoinCheck = std::function<std::string(const StageInfo&)>;
  virtual void set_rejoin_check(RejoinCheck) {}
};

class LocalStage final : public Stage {
 public:
  LocalStage(const std::string& model_path, std::optional<model::LayerRange> range, int threads,
             const worker::StageLimitOptions& limits = {}, const worker::StageBackendOptions& backend = {});
  const StageInfo& info() const override { return info_; }
  void plan(Stage* next, Stage* chain_to, size_t index, size_t count) override;
  // Always full rows and never a chain: in-process, the arg max costs the same here
  // as at the sampler, and there is no hop to save.
  void submit(uint64_t step, std::span<const model::BatchToken> batch,
              std::span<const protocol::LogitsOutput> outputs, const ChainGrant& chain) override;
  void close(int32_t seq_id) override { engine_.close(seq_id); }
  std::optional<StepOutput> poll(int timeout_ms) override;
  StageStats stats() override;
  std::optional<std::vector<uint8_t>> snapshot(int32_t seq_id) override;
  void restore(int32_t seq_id, std::span<const uint8_t> state) override;
  uint64_t save_slot(int32_t seq_id, const std::string& name, std::span<const int32_t> tokens) override;
  SlotRead restore_slot(int32_t seq_id, const std::string& name) override;
  // Where slot files go (pico-coord --slot-save-path; empty: off).
  void set_slot_dir(std::string dir) { slot_dir_ = std::move(dir); }

 private:
  void run(uint64_t step, std::span<const model::BatchToken> batch, const float* hidden,
           std::vector<StageStamp> stamps, std::vector<StageTrace> traces);

  worker::StageEngine engine_;
  StageInfo info_;
  LocalStage* next_ = nullptr;
  LocalStage* last_ = this;  // where finished steps are queued
  std::deque<StepOutput> done_;
  size_t index_ = 0;
  std::string slot_dir_;
};

struct RemoteOptions {
  int connect_timeout_ms = 10000;  // hello and plan answers
  // A lost worker rejoins when its address accepts a connection within rejoin_connect_ms
  // and it answers hello within rejoin_answer_ms (a stopped process's port may still
  // accept connections).
  int rejoin_connect_ms = 500;
  int rejoin_answer_ms = 1000;
  protocol::DType activations = protocol::DType::F32;
  net::Timing timing;
  // Take the worker over even when another live coordinator's session owns it
  // (Plan.takeOver; only the first plan: a coordinator taken over later stays so).
  bool take_over = false;
  // CURVE: this coordinator's key pair and the worker's public key (server_key);
  // nullopt: an open link.
  std::optional<net::Curve> curve;
  // Public keys of every worker of the pipeline: each stage accepts their connections
  // for this session (Plan.acceptKeys), besides its own authorized keys.
  std::vector<std::string> cluster_keys;
};

// This process's session (random, never 0): stamped on every message to the workers;
// a plan makes it a worker's owner (see worker/server.hpp).
uint64_t process_session();

// A pico-worker. A lost worker (killed, hung past the heartbeat timeout) makes every
// call fail with a StageError naming it until rejoin() gets it back: a fresh
// connection, hello, the same model identity and layers as before; the Pipeline then
// re-sends every plan.
class RemoteStage final : public Stage {
 public:
  // Connects and exchanges hello/capabilities; throws StageError naming the worker.
  RemoteStage(const std::string& address, const RemoteOptions& options);
  const StageInfo& info() const override { return info_; }
  void plan(Stage* next, Stage* chain_to, size_t index, size_t count) override;
  void submit(uint64_t step, std::span<const model::BatchToken> batch,
              std::span<const protocol::LogitsOutput> outputs, const ChainGrant& chain) override;
  // Closing a sequence on a lost worker is remembered and sent when it rejoins.
  void close(int32_t seq_id) override;
  std::optional<StepOutput> poll(int timeout_ms) override;
  StageStats stats() override;
  std::optional<std::vector<uint8_t>> snapshot(int32_t seq_id) override;
  void restore(int32_t seq_id, std::span<const uint8_t> state) override;
  uint64_t save_slot(int32_t seq_id, const std::string& name, std::span<const int32_t> tokens) override;
  SlotRead restore_slot(int32_t seq_id, const std::string& name) override;
  bool remote() const override { return true; }
  int64_t clock_offset_nanos() const override { return clock_offset_; }
  bool up() override;
  // Nothing to do when up. Otherwise tries once, without waiting beyond
  // rejoin_connect_ms when nothing listens at the address; throws StageError naming
  // the worker when it is not back, or came back serving another model or layers.
  void rejoin() override;
  void set_rejoin_check(RejoinCheck check) override { rejoin_check_ = std::move(check); }
  const std::string& address() const { return address_; }
  // Times a heartbeat carrying probe_bytes of payload, the fastest of `tries`
  // (seconds, round trip); throws StageError.
  double probe_round_trip(uint64_t probe_bytes, int tries);
  // pico-worker --layers auto: gives the worker its range (protocol Assign) and waits
  // for its answer; the worker then loads the range and serves anew at its address
  // (connect a new RemoteStage). Throws StageError naming the worker.
  void assign(model::LayerRange layers);
  // Asks the worker to measure its link to another worker (protocol LinkProbe);
  // nullopt when it could not (the reason in *error). Throws StageError when this
  // worker does not answer.
  std::optional<std::pair<double, double>> probe_link(const std::string& address, const std::string& public_key,
                                                      uint64_t probe_bytes, std::string* error);
  // The worker's CURVE public key (empty: an open link).
  std::string public_key() const { return options_.curve ? options_.curve->server_key : std::string(); }
  // For waiting on several workers at once (wait_readable).
  zmq::socket_t& socket() { return socket_; }

 private:
  // slotSave (save) or slotRestore, answered by slotDone: the file's tokens and bytes.
  SlotRead slot_file(bool save, int32_t seq_id, const std::string& name, std::span<const int32_t> tokens);
  void connect();  // a fresh socket and monitor
  void hello(int timeout_ms);  // hello/capabilities into info_, then the clock offset
  void estimate_clock_offset();
  // One heartbeat (carrying a probe of probe_bytes) and its answer, in this process's
  // steady clock and the worker's; fails naming `what` after connect_timeout_ms.
  struct RoundTrip {
    uint64_t sent = 0, received = 0, worker_clock = 0;
  };
  RoundTrip heartbeat_round_trip(uint64_t probe_bytes, const char* what);
  // Stamps this process's session on the envelope and sends it.
  void send(protocol::Builder& message, std::vector<zmq::message_t>&& payloads = {});
  // The next message other than heartbeats within timeout_ms (throws on lost/timeout).
  std::optional<net::Received> receive(int timeout_ms);
  // The next message of kind `which`, skipping stale answers (logits and errors of
  // steps abandoned earlier); an error about no step fails.
  net::Received expect(protocol::Envelope::Body::Which which, const char* what);
  [[noreturn]] void fail(const std::string& what, uint64_t step = 0) const;
  void check_alive();

  std::string address_;
  RemoteOptions options_;
  RejoinCheck rejoin_check_;
  std::unique_ptr<net::ConnectionMonitor> monitor_;
  zmq::socket_t socket_;
  StageInfo info_;
  bool up_ = true;
  std::string lost_reason_;
  int64_t clock_offset_ = 0;
  std::vector<int32_t> pending_closes_;
  bool planned_ = false;  // a plan was acknowledged: this session owned the worker
};

// Waits up to timeout_ms until any of the stages may have a message to poll (remote
// ones: on their sockets at once; with any other stage, a millisecond, as it polls
// at no cost). Never throws: poll() then says what came.
void wait_readable(std::span<Stage* const> stages, int timeout_ms);

}  // namespace pico::coordinator
