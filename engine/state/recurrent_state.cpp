#include "state/recurrent_state.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

namespace pico::state {
namespace {

// Snapshot layout (host order, uint64 words): magic, version, first layer, layer
// count, conv floats, ssm floats per layer, positions; then the floats of every
// recurrent layer (conv state, then ssm state).
constexpr uint64_t kMagic = 0x5345525243;  // "CRRES"
constexpr uint64_t kVersion = 1;
constexpr size_t kHeaderWords = 7;

}  // namespace

int64_t RecurrentConfig::layers() const {
  return static_cast<int64_t>(std::count(recurrent.begin(), recurrent.end(), true));
}

void validate(const RecurrentConfig& c) {
  if (c.first_layer < 0 || c.last_layer < c.first_layer) throw std::invalid_argument("recurrent state: bad layer range");
  if (c.recurrent.size() != static_cast<size_t>(c.last_layer - c.first_layer)) {
    throw std::invalid_argument("recurrent state: the layer mask does not cover the range");
  }
  if (c.conv_taps < 1 || c.conv_channels <= 0 || c.n_v_heads <= 0 || c.head_dim <= 0) {
    throw std::invalid_argument("recurrent state: bad shape");
  }
}

uint64_t recurrent_bytes_per_sequence(const RecurrentConfig& c) {
  return static_cast<uint64_t>(c.layers()) * static_cast<uint64_t>(c.conv_floats() + c.ssm_floats()) * sizeof(float);
}

size_t checkpoint_to_evict(std::span<const int64_t> positions) {
  if (positions.size() < 2) throw std::invalid_argument("checkpoint_to_evict: nothing to drop");
  size_t best = 0;
  int64_t best_gap = std::numeric_limits<int64_t>::max();
  for (size_t i = 0; i + 1 < positions.size(); ++i) {
    const int64_t gap = positions[i + 1] - (i > 0 ? positions[i - 1] : 0);
    if (gap < best_gap) best = i, best_gap = gap;
  }
  return best;
}

RecurrentState::RecurrentState(const RecurrentConfig& config, std::shared_ptr<BlockStore> store)
    : config_(config), store_(std::move(store)) {
  validate(config_);
  size_t slot = 0;
  for (bool r : config_.recurrent) layer_index_.push_back(r ? slot++ : SIZE_MAX);
  const size_t floats = slot * static_cast<size_t>(config_.conv_floats() + config_.ssm_floats());
  if (!store_) store_ = host_block_store(floats);
  if (store_->block_floats() != floats) throw std::invalid_argument("recurrent state: a store of blocks of another size");
  data_ = store_->allocate();
}

RecurrentState::~RecurrentState() {
  drop_checkpoints(checkpoints_.begin());
  store_->free(data_);
}

void RecurrentState::drop_checkpoints(std::vector<Checkpoint>::iterator first) {
  for (auto it = first; it != checkpoints_.end(); ++it) store_->free(it->data);
  checkpoints_.erase(first, checkpoints_.end());
}

size_t RecurrentState::offset(int32_t layer) const {
  if (!config_.holds(layer)) {
    throw std::out_of_range("recurrent state: layer " + std::to_string(layer) + " is not a linear layer of this stage");
  }
  return layer_index_[static_cast<size_t>(layer - config_.first_layer)] *
         static_cast<size_t>(config_.conv_floats() + config_.ssm_floats());
}

bool RecurrentState::can_truncate(int64_t pos) const {
  if (pos >= n_pos_ || pos <= 0) return true;
  return std::any_of(checkpoints_.begin(), checkpoints_.end(), [pos](const Checkpoint& c) { return c.pos == pos; });
}

void RecurrentState::truncate(int64_t pos) {
  if (pos >= n_pos_) return;
  if (pos <= 0) {
    store_->zero(data_);
    drop_checkpoints(checkpoints_.begin());
    n_pos_ = 0;
    return;
  }
  auto it = std::find_if(checkpoints_.begin(), checkpoints_.end(), [pos](const Checkpoint& c) { return c.pos == pos; });
  if (it == checkpoints_.end()) {
    throw std::invalid_argument("recurrent state: no checkpoint at position " + std::to_string(pos) +
                                " to go back to (it cannot be rewound)");
  }
  store_->copy(it->data, data_);
  drop_checkpoints(it + 1);
  n_pos_ = pos;
}

size_t RecurrentState::bytes_used() const { return block_bytes() + checkpoint_bytes(); }

size_t RecurrentState::checkpoint_bytes() const { return checkpoints_.size() * block_bytes(); }

std::vector<int64_t> RecurrentState::checkpoint_positions() const {
  std::vector<int64_t> positions;
  for (const Checkpoint& c : checkpoints_) positions.push_back(c.pos);
  return positions;
}

void RecurrentState::checkpoint(size_t max_checkpoints) {
  if (max_checkpoints == 0 || n_pos_ == 0) return;
  auto newer = checkpoints_.end();
  while (newer != checkpoints_.begin() && std::prev(newer)->pos >= n_pos_) --newer;
  drop_checkpoints(newer);
  checkpoints_.reserve(checkpoints_.size() + 1);
  float* block = store_->allocate();
  store_->copy(data_, block);
  checkpoints_.push_back({n_pos_, block});
  while (checkpoints_.size() > max_checkpoints) {
    const std::vector<int64_t> positions = checkpoint_positions();
    const auto evicted = checkpoints_.begin() + static_cast<std::ptrdiff_t>(checkpoint_to_evict(positions));
    store_->free(evicted->data);
    checkpoints_.erase(evicted);
  }
}

std::vector<uint8_t> RecurrentState::snapshot() const {
  const uint64_t header[kHeaderWords] = {kMagic,
                                         kVersion,
                                         static_cast<uint64_t>(config_.first_layer),
                                         config_.recurrent.size(),
                                         static_cast<uint64_t>(config_.conv_floats()),
                                         static_cast<uint64_t>(config_.ssm_floats()),
                                         static_cast<uint64_t>(n_pos_)};
  std::vector<uint8_t> out(sizeof header + block_bytes());
  std::memcpy(out.data(), header, sizeof header);
  std::vector<float> state(store_->block_floats());
  store_->read(data_, state.data());
  if (!state.empty()) std::memcpy(out.data() + sizeof header, state.data(), block_bytes());
  return out;
}

int64_t RecurrentState::snapshot_positions(std::span<const uint8_t> snapshot) const {
  if (snapshot.size() < kHeaderWords * 8) {
    throw std::invalid_argument("recurrent snapshot: " + std::to_string(snapshot.size()) +
                                " bytes, shorter than its header");
  }
  uint64_t header[kHeaderWords];
  std::memcpy(header, snapshot.data(), sizeof header);
  if (header[0] != kMagic) throw std::invalid_argument("recurrent snapshot: not a recurrent snapshot (bad magic)");
  if (header[1] != kVersion) {
    throw std::invalid_argument("recurrent snapshot: format version " + std::to_string(header[1]) +
                                ", this stage reads " + std::to_string(kVersion));
  }
  if (header[2] != static_cast<uint64_t>(config_.first_layer) || header[3] != config_.recurrent.size() ||
      header[4] != static_cast<uint64_t>(config_.conv_floats()) ||
      header[5] != static_cast<uint64_t>(config_.ssm_floats())) {
    throw std::invalid_argument("recurrent snapshot: another state configuration (layers or sizes)");
  }
  if (snapshot.size() - sizeof header != block_bytes()) {
    throw std::invalid_argument("recurrent snapshot: " + std::to_string(snapshot.size() - sizeof header) +
                                " bytes of state, this stage holds " + std::to_string(block_bytes()));
  }
  if (header[6] > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
    throw std::invalid_argument("recurrent snapshot: position count " + std::to_string(header[6]) + " out of range");
  }
  return static_cast<int64_t>(header[6]);
}

void RecurrentState::restore(std::span<const uint8_t> snapshot) {
  const int64_t n = snapshot_positions(snapshot);
  std::vector<float> state(store_->block_floats());
  if (!state.empty()) std::memcpy(state.data(), snapshot.data() + kHeaderWords * 8, block_bytes());
  store_->write(data_, state.data());
  drop_checkpoints(checkpoints_.begin());
  n_pos_ = n;
}

}  // namespace pico::state
