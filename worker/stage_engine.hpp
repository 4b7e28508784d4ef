// One stage of the pipeline in-process: a model file, its layer range, a CPU backend
// and the KV cache of many sequences. pico-worker serves it over ZeroMQ; the
// coordinator's LocalStage calls it directly.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "gguf/reader.hpp"
#include "model/model.hpp"
#include "protocol.hpp"
#include "state/kv_cache.hpp"

namespace pico::worker {

// "A-B", inclusive (0-15 is 16 layers) -> [A, B+1). Throws std::invalid_argument.
model::LayerRange parse_layers(const std::string& text);

class StageEngine {
 public:
  // range nullopt: every layer. threads <= 0: the default count.
  StageEngine(const std::string& model_path, std::optional<model::LayerRange> range, int threads);

  model::LayerRange layers() const { return range_; }
  bool is_first() const { return range_.first == 0; }
  bool is_last() const { return range_.last == n_layer(); }
  int32_t n_layer() const { return static_cast<int32_t>(model_->hparams().n_layer); }
  int64_t n_embd() const { return model_->hparams().n_embd; }
  int64_t n_vocab() const { return model_->hparams().n_vocab; }
  int threads() const { return threads_; }
  const char* backend_name() const { return be_->name(); }
  const protocol::ModelIdentity& identity() const { return identity_; }
  const gguf::Model& file() const { return *file_; }

  // Runs the stage's layers (see model::Model::forward): hidden is null on the first
  // stage, else batch.size() rows of n_embd. Returns logits rows (last stage) or
  // hidden states. Throws std::invalid_argument for a batch the stage cannot take.
  std::vector<float> forward(std::span<const model::BatchToken> batch, const float* hidden);

  // A sequence's state on this stage's layers (SequenceState::snapshot), nullopt when
  // the sequence is not open here; restore() puts one back under seq_id (replacing
  // any state it had; std::invalid_argument for a state of another configuration).
  struct Snapshot {
    int64_t n_pos = 0;
    std::vector<uint8_t> bytes;
  };
  std::optional<Snapshot> snapshot(int32_t seq_id) const;
  void restore(int32_t seq_id, std::span<const uint8_t> bytes);

  void close(int32_t seq_id) { cache_->remove(seq_id); }
  void close_all() { cache_->clear(); }  // a new session's plan: the old one's sequences go
  void truncate(int32_t seq_id, int64_t pos) { cache_->truncate(seq_id, pos); }
  size_t kv_bytes() const { return cache_->bytes_used(); }
  size_t sequences() const { return cache_->size(); }
  uint64_t batches() const { return batches_; }  // forward calls served
  uint64_t tokens() const { return tokens_; }    // tokens in them

 private:
  std::unique_ptr<gguf::Model> file_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<backend::Backend> be_;
  std::unique_ptr<state::KvCache> cache_;
  model::LayerRange range_;
  int threads_ = 0;
  protocol::ModelIdentity identity_;
  uint64_t batches_ = 0;
  uint64_t tokens_ = 0;
};

}  // namespace pico::worker
