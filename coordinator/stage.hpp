// A Stage runs a contiguous range of layers: LocalStage in-process (worker's
// StageEngine), RemoteStage a pico-worker over ZeroMQ. The Pipeline (pipeline.hpp)
// chains them; the scheduler sees only the Pipeline.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/model.hpp"
#include "net.hpp"
#include "protocol.hpp"
#include "stage_engine.hpp"

namespace pico::coordinator {

// A stage failed: an error reply, a lost connection, a refused check. The message
// names the stage.
class StageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct StageInfo {
  std::string name;                // "local" or the worker's address
  model::LayerRange layers;
  protocol::ModelIdentity identity;
  std::string isa, backend;
  uint32_t cores = 0, threads = 0;
  uint64_t memory_bytes = 0;
};

// The logits of one finished step: one row of n_vocab per token that asked for them.
struct StepOutput {
  uint64_t step = 0;
  std::vector<int32_t> seq_ids;
  std::vector<int32_t> positions;
  std::vector<float> logits;
  int64_t n_vocab = 0;
};

struct StageStats {
  uint64_t memory_bytes = 0, kv_bytes = 0, batches = 0, tokens = 0;
  uint32_t sequences = 0;
};

class Stage {
 public:
  virtual ~Stage() = default;
  virtual const StageInfo& info() const = 0;
  // Where this stage's output goes: `next` (of the same kind), or, when null, back
  // to the coordinator as logits.
  virtual void plan(Stage* next, size_t index, size_t count) = 0;
  // The first stage: starts a step through the whole chain.
  virtual void submit(uint64_t step, std::span<const model::BatchToken> batch) = 0;
  virtual void close(int32_t seq_id) = 0;
  virtual void truncate(int32_t seq_id, int64_t pos) = 0;
  // A finished step (the last stage), waiting up to timeout_ms; throws StageError on
  // an error reply or a lost connection (any stage).
  virtual std::optional<StepOutput> poll(int timeout_ms) = 0;
  virtual StageStats stats() = 0;
};

class LocalStage final : public Stage {
 public:
  LocalStage(const std::string& model_path, std::optional<model::LayerRange> range, int threads);
  const StageInfo& info() const override { return info_; }
  void plan(Stage* next, size_t index, size_t count) override;
  void submit(uint64_t step, std::span<const model::BatchToken> batch) override;
  void close(int32_t seq_id) override { engine_.close(seq_id); }
  void truncate(int32_t seq_id, int64_t pos) override { engine_.truncate(seq_id, pos); }
  std::optional<StepOutput> poll(int timeout_ms) override;
  StageStats stats() override;

 private:
  void run(uint64_t step, std::span<const model::BatchToken> batch, const float* hidden);

  worker::StageEngine engine_;
  StageInfo info_;
  LocalStage* next_ = nullptr;
  LocalStage* last_ = this;  // where finished steps are queued
  std::deque<StepOutput> done_;
};

struct RemoteOptions {
  int connect_timeout_ms = 10000;  // hello and plan answers
  protocol::DType activations = protocol::DType::F32;
  net::Timing timing;
};

class RemoteStage final : public Stage {
 public:
  // Connects and exchanges hello/capabilities; throws StageError naming the worker.
  RemoteStage(const std::string& address, const RemoteOptions& options);
  const StageInfo& info() const override { return info_; }
  void plan(Stage* next, size_t index, size_t count) override;
  void submit(uint64_t step, std::span<const model::BatchToken> batch) override;
  void close(int32_t seq_id) override;
  void truncate(int32_t seq_id, int64_t pos) override;
  std::optional<StepOutput> poll(int timeout_ms) override;
  StageStats stats() override;
  const std::string& address() const { return address_; }

 private:
  void send(const std::vector<uint8_t>& header, std::span<const std::vector<uint8_t>> payloads = {});
  // The next message other than heartbeats within timeout_ms (throws on lost/timeout).
  std::optional<net::Received> receive(int timeout_ms);
  [[noreturn]] void fail(const std::string& what) const;
  void check_alive();

  std::string address_;
  RemoteOptions options_;
  net::ConnectionMonitor monitor_;
  zmq::socket_t socket_;
  StageInfo info_;
};

}  // namespace pico::coordinator
