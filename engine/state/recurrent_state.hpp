// The recurrent state of the linear-attention (Gated DeltaNet) layers of a hybrid
// model, per sequence, for the layers of one stage: per layer the causal
// convolution's last taps - 1 inputs and the delta rule's state (per value head a
// head_dim x head_dim matrix), all F32, as llama.cpp keeps them (cache_r / cache_s).
//
// Unlike the KV cache it cannot be cut back to an earlier position: the state after n
// tokens has forgotten how it got there. So a sequence keeps checkpoints, copies of its
// state at chosen positions, taken when the stage is told to (the coordinator marks the
// tokens after which every stage takes one, so all stages hold the same positions),
// and truncate() goes back to a checkpoint exactly or to the empty state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "state/sequence_state.hpp"
#include "state/stores.hpp"

namespace pico::state {

struct RecurrentConfig {
  int32_t first_layer = 0;  // the stage's layers: [first_layer, last_layer)
  int32_t last_layer = 0;
  std::vector<bool> recurrent;  // per layer of the range: a linear-attention layer
  int64_t conv_taps = 0;        // K: the state keeps K - 1 inputs
  int64_t conv_channels = 0;    // 2 * key heads * head_dim + value heads * head_dim
  int64_t n_v_heads = 0;
  int64_t head_dim = 0;

  bool holds(int32_t layer) const {
    return layer >= first_layer && layer < last_layer && recurrent[static_cast<size_t>(layer - first_layer)];
  }
  int64_t layers() const;  // recurrent layers in the range
  int64_t conv_floats() const { return (conv_taps - 1) * conv_channels; }
  int64_t ssm_floats() const { return n_v_heads * head_dim * head_dim; }
};

// Throws std::invalid_argument for a configuration the state cannot hold.
void validate(const RecurrentConfig& config);
// Bytes one sequence's state takes (without checkpoints): fixed, whatever its length.
uint64_t recurrent_bytes_per_sequence(const RecurrentConfig& config);

// Which checkpoint to drop when a sequence holds more than it may: checkpoints at
// `positions` (ascending; the last one the newest, always kept), position 0 (the empty
// state) counting as one that is always there. Drops the one whose neighbours are
// closest together, the one the least reuse would miss, the older on a tie; so the
// spacing widens with age instead of all of them crowding at the end.
size_t checkpoint_to_evict(std::span<const int64_t> positions);

class RecurrentState final : public SequenceState {
 public:
  // The state and its checkpoints are blocks of `store` (host memory when null), of
  // recurrent_bytes_per_sequence(config) each.
  explicit RecurrentState(const RecurrentConfig& config, std::shared_ptr<BlockStore> store = nullptr);
  ~RecurrentState() override;
  RecurrentState(const RecurrentState&) = delete;
  RecurrentState& operator=(const RecurrentState&) = delete;

  int64_t n_pos() const override { return n_pos_; }
  // The model sets it once a forward has run every layer of the stage.
  void set_n_pos(int64_t n_pos) { n_pos_ = n_pos; }
  // pos >= n_pos: nothing; pos == 0: the empty state; the position of a checkpoint: that
  // checkpoint (newer ones are dropped). Any other position throws
  // std::invalid_argument: the state cannot be rewound there.
  void truncate(int64_t pos) override;
  bool can_truncate(int64_t pos) const;
  size_t bytes_used() const override;  // the state and its checkpoints
  // The current state (checkpoints are not part of it).
  std::vector<uint8_t> snapshot() const override;
  void restore(std::span<const uint8_t> snapshot) override;
  // The positions a snapshot restores, checked as restore() checks it.
  int64_t snapshot_positions(std::span<const uint8_t> snapshot) const;

  const RecurrentConfig& config() const { return config_; }
  // The layer's states, in the store's memory (the host's, or a device's: see stores.hpp).
  float* conv(int32_t layer) { return data_ + offset(layer); }
  float* ssm(int32_t layer) { return data_ + offset(layer) + config_.conv_floats(); }
  const BlockStore& store() const { return *store_; }

  // A checkpoint of the state at n_pos (replacing one already there); then drops
  // checkpoints by checkpoint_to_evict until at most max_checkpoints remain.
  void checkpoint(size_t max_checkpoints);
  std::vector<int64_t> checkpoint_positions() const;
  size_t checkpoint_count() const { return checkpoints_.size(); }
  size_t checkpoint_bytes() const;

 private:
  struct Checkpoint {
    int64_t pos = 0;
    float* data = nullptr;  // a block of the store
  };
  size_t offset(int32_t layer) const;
  size_t block_bytes() const { return store_->block_floats() * sizeof(float); }
  // Drops checkpoints [first, end), giving their blocks back.
  void drop_checkpoints(std::vector<Checkpoint>::iterator first);

  RecurrentConfig config_;
  std::shared_ptr<BlockStore> store_;
  std::vector<size_t> layer_index_;  // per layer of the range: its slot among the recurrent ones
  float* data_ = nullptr;            // per recurrent layer: conv state, then ssm state
  std::vector<Checkpoint> checkpoints_;  // ascending positions
  int64_t n_pos_ = 0;
};

}  // namespace pico::state
