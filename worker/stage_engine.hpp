// One stage of the pipeline in-process: a model file, its layer range, a CPU backend
// and the KV cache of many sequences. pico-worker serves it over ZeroMQ; the
// coordinator's LocalStage calls it directly.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "gguf/reader.hpp"
#include "model/layer_split.hpp"
#include "model/model.hpp"
#include "model/residency.hpp"
#include "protocol.hpp"
#include "state/kv_cache.hpp"

namespace pico::worker {

// What a stage holds at most (protocol Limits), resolved at start: every forward and
// restore is checked against them as a whole before anything is written or allocated.
struct StageLimits {
  int64_t max_rows = 0;             // tokens (rows) per forward
  int64_t max_positions = 0;        // positions per sequence
  int64_t max_sequences = 0;        // sequences holding state at once
  uint64_t state_budget_bytes = 0;  // KV bytes over all sequences (whole pages)
  uint64_t kv_bytes_per_position = 0;
  uint64_t state_bytes_per_sequence = 0;  // fixed-size state per sequence (none yet: 0)
  int64_t page_positions = 0;
  // The largest legal message (one frame and all frames together): a forward of
  // max_rows hidden states, or a restore of the largest state that fits, plus room
  // for the header.
  uint64_t max_message_bytes = 0;
};

// What the last stage returns for a row (protocol::LogitsOutput) as the row's flags:
// argmax_only, hidden_state, pool. The worker's server and the in-process stage both
// read a forward's outputs through it.
void set_output(model::BatchToken& row, protocol::LogitsOutput output);

// The limits asked for (pico-worker's flags); 0 / nullopt takes the default.
// The backend a stage runs its layers on (backend/devices.hpp's open_backend).
struct StageBackendOptions {
  std::string name = "cpu";
  int device = 0;
  // --device-memory: the most of the device's memory the stage may take (nullopt: all
  // of it). A range whose weights exceed it is refused at load.
  std::optional<uint64_t> memory;
};

struct StageLimitOptions {
  int64_t max_rows = 4096;
  int64_t ctx = 0;  // 0: the model's context length (4096 when it names none)
  int64_t max_sequences = 256;
  std::optional<uint64_t> kv_memory;  // nullopt: default_state_budget()
};

// A forward or restore beyond one of the StageLimits (the text names the limit, its
// flag and the numbers); the stage is left as it was.
class LimitError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// How the default state budget was found: MemAvailable, less the bytes of the weights
// the stage reads (mapped file pages, resident or not, are counted in MemAvailable as
// page cache), less a margin of a tenth of MemAvailable for everything else.
struct MemoryBudget {
  uint64_t available = 0, weights = 0, margin = 0, budget = 0;
};
MemoryBudget default_state_budget(const gguf::Model& file, model::LayerRange range, int32_t n_layer);
using model::stage_reads;  // which tensors a stage reads (model/layer_split.hpp)
// MemAvailable from /proc/meminfo in bytes (0 when unknown).
uint64_t available_memory_bytes();

// "512M", "4G", "1.5GiB", "1000000" (bytes; K, M, G, T are powers of 1024). Throws
// std::invalid_argument naming the text.
uint64_t parse_byte_size(const std::string& text);

// "A-B", inclusive (0-15 is 16 layers) -> [A, B+1). Throws std::invalid_argument.
model::LayerRange parse_layers(const std::string& text);

class StageEngine {
 public:
  // range nullopt: every layer. threads <= 0: the default count.
  // residency: --mem / --prefault (the cpu backend only: a device's weights are copied
  // to it at load); progress(done, total) while prefaulting.
  StageEngine(const std::string& model_path, std::optional<model::LayerRange> range, int threads,
              const StageLimitOptions& limits = {}, const StageBackendOptions& backend = {},
              const model::ResidencyOptions& residency = {},
              const std::function<void(uint64_t, uint64_t)>& progress = {});
  // What was locked and whether the range streams (null without --mem or --prefault).
  const model::WeightResidency* residency() const { return residency_.get(); }

  model::LayerRange layers() const { return range_; }
  bool is_first() const { return range_.first == 0; }
  bool is_last() const { return range_.last == n_layer(); }
  int32_t n_layer() const { return static_cast<int32_t>(model_->hparams().n_layer); }
  int64_t n_embd() const { return model_->hparams().n_embd; }
  int64_t n_vocab() const { return model_->hparams().n_vocab; }
  int threads() const { return threads_; }
  const char* backend_name() const { return be_->name(); }
  // The device the backend runs on ("name, driver"; empty on the CPU) and its memory.
  const std::string& device() const { return device_; }
  uint64_t device_memory_bytes() const { return device_memory_bytes_; }
  const protocol::ModelIdentity& identity() const { return identity_; }
  const gguf::Model& file() const { return *file_; }
  const model::Model& model() const { return *model_; }
  const StageLimits& limits() const { return limits_; }
  const MemoryBudget& memory_budget() const { return memory_; }  // the default's figures (zero when set)

  // Runs the stage's layers (see model::Model::forward): hidden is null on the first
  // stage, else batch.size() rows of n_embd. Returns logits rows (last stage) or
  // hidden states. The last stage pools the hidden-state rows marked `pool` (mean
  // pooling: a running sum per sequence, in position order whatever the batches, so
  // the mean does not depend on how the prompt was split). Throws LimitError for a
  // batch beyond the limits and std::invalid_argument for one the stage cannot take,
  // both before changing any sequence.
  // argmax (the last stage): rows asked as arg max only come back reduced on the
  // backend (Model::forward), left out of the returned logits.
  std::vector<float> forward(std::span<const model::BatchToken> batch, const float* hidden,
                             model::ReducedRows* argmax = nullptr);

  // A sequence's state on this stage's layers (SequenceState::snapshot), nullopt when
  // the sequence is not open here; restore() puts one back under seq_id (replacing
  // any state it had; std::invalid_argument for a malformed state or one of another
  // configuration, LimitError for one beyond the limits; either leaves it as it was).
  struct Snapshot {
    int64_t n_pos = 0;
    std::vector<uint8_t> bytes;
  };
  std::optional<Snapshot> snapshot(int32_t seq_id) const;
  void restore(int32_t seq_id, std::span<const uint8_t> bytes);

  void close(int32_t seq_id) {
    cache_->remove(seq_id);
    pools_.erase(seq_id);
  }
  void close_all() {  // a new session's plan: the old one's sequences go
    cache_->clear();
    pools_.clear();
  }
  void truncate(int32_t seq_id, int64_t pos) { cache_->truncate(seq_id, pos); }
  size_t kv_bytes() const { return cache_->bytes_used(); }  // all sequence state: KV, recurrent, checkpoints
  size_t recurrent_bytes() const { return cache_->recurrent_bytes(); }  // of which recurrent states and checkpoints
  size_t checkpoint_bytes() const { return cache_->checkpoint_bytes(); }  // of which checkpoints
  size_t sequences() const { return cache_->size(); }
  uint64_t batches() const { return batches_; }  // forward calls served
  uint64_t tokens() const { return tokens_; }    // tokens in them

 private:
  // Throws std::invalid_argument when the range's weights exceed the device's memory
  // (or --device-memory), naming both sizes.
  // Refuses a range whose weights (and KV cache, when it is device memory) the device
  // cannot hold, naming the sizes; a device KV cache's budget is capped to what is left.
  void check_device_memory(const StageBackendOptions& backend, bool budget_given, uint64_t one_sequence);

  void check_limits(std::span<const model::BatchToken> batch, const std::map<int32_t, int64_t>& next_pos) const;
  // The last stage's mean pooling of `rows`' hidden states (BatchToken::pool).
  void pool_hidden(std::span<const model::BatchToken> batch, model::ReducedRows& rows);

  std::unique_ptr<gguf::Model> file_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<model::WeightResidency> residency_;  // after model_: it is the model's observer
  std::unique_ptr<backend::Backend> be_;
  std::string device_;
  uint64_t device_memory_bytes_ = 0;
  std::unique_ptr<state::KvCache> cache_;
  model::LayerRange range_;
  StageLimits limits_;
  MemoryBudget memory_;
  int threads_ = 0;
  protocol::ModelIdentity identity_;
  uint64_t batches_ = 0;
  // Mean pooling's running sums per sequence (BatchToken::pool), in double.
  struct Pool {
    std::vector<double> sum;
    int64_t rows = 0;
  };
  std::map<int32_t, Pool> pools_;
  uint64_t tokens_ = 0;
};

}  // namespace pico::worker
