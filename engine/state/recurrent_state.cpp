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

RecurrentState::RecurrentState(const RecurrentConfig& config) : config_(config) {
  validate(config_);
  size_t slot = 0;
  for (bool r : config_.recurrent) layer_index_.push_back(r ? slot++ : SIZE_MAX);
  data_.assign(slot * static_cast<size_t>(config_.conv_floats() + config_.ssm_floats()), 0.0f);
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
    std::fill(data_.begin(), data_.end(), 0.0f);
    checkpoints_.clear();
    n_pos_ = 0;
    return;
  }
  auto it = std::find_if(checkpoints_.begin(), checkpoints_.end(), [pos](const Checkpoint& c) { return c.pos == pos; });
  if (it == checkpoints_.end()) {
    throw std::invalid_argument("recurrent state: no checkpoint at position " + std::to_string(pos) +
                                " to go back to (it cannot be rewound)");
  }
  data_ = it->data;
  checkpoints_.erase(it + 1, checkpoints_.end());
  n_pos_ = pos;
}

size_t RecurrentState::bytes_used() const { return data_.size() * sizeof(float) + checkpoint_bytes(); }

size_t RecurrentState::checkpoint_bytes() const {
  size_t total = 0;
  for (const Checkpoint& c : checkpoints_) total += c.data.size() * sizeof(float);
  return total;
}

std::vector<int64_t> RecurrentState::checkpoint_positions() const {
  std::vector<int64_t> positions;
  for (const Checkpoint& c : checkpoints_) positions.push_back(c.pos);
  return positions;
}

void RecurrentState::checkpoint(size_t max_checkpoints) {
  if (max_checkpoints == 0 || n_pos_ == 0) return;
  while (!checkpoints_.empty() && checkpoints_.back().pos >= n_pos_) checkpoints_.pop_back();
  checkpoints_.push_back({n_pos_, data_});
  while (checkpoints_.size() > max_checkpoints) {
    const std::vector<int64_t> positions = checkpoint_positions();
    checkpoints_.erase(checkpoints_.begin() + static_cast<std::ptrdiff_t>(checkpoint_to_evict(positions)));
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
  std::vector<uint8_t> out(sizeof header + data_.size() * sizeof(float));
  std::memcpy(out.data(), header, sizeof header);
  if (!data_.empty()) std::memcpy(out.data() + sizeof header, data_.data(), data_.size() * sizeof(float));
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
  if (snapshot.size() - sizeof header != data_.size() * sizeof(float)) {
    throw std::invalid_argument("recurrent snapshot: " + std::to_string(snapshot.size() - sizeof header) +
                                " bytes of state, this stage holds " + std::to_string(data_.size() * sizeof(float)));
  }
  if (header[6] > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
    throw std::invalid_argument("recurrent snapshot: position count " + std::to_string(header[6]) + " out of range");
  }
  return static_cast<int64_t>(header[6]);
}

void RecurrentState::restore(std::span<const uint8_t> snapshot) {
  const int64_t n = snapshot_positions(snapshot);
  if (!data_.empty()) std::memcpy(data_.data(), snapshot.data() + kHeaderWords * 8, data_.size() * sizeof(float));
  checkpoints_.clear();
  n_pos_ = n;
}

}  // namespace pico::state
