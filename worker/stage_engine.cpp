#include "stage_engine.hpp"

#include <map>
#include <stdexcept>

#include "cpu/thread_pool.hpp"

namespace pico::worker {

model::LayerRange parse_layers(const std::string& text) {
  const size_t dash = text.find('-');
  try {
    if (dash == std::string::npos || dash == 0 || dash + 1 == text.size()) throw std::invalid_argument("");
    size_t used_a = 0, used_b = 0;
    const int a = std::stoi(text.substr(0, dash), &used_a);
    const int b = std::stoi(text.substr(dash + 1), &used_b);
    if (used_a != dash || used_b != text.size() - dash - 1 || a < 0 || b < a) throw std::invalid_argument("");
    return {a, b + 1};
  } catch (const std::exception&) {
    throw std::invalid_argument("layer range '" + text + "' is not A-B (inclusive, A <= B)");
  }
}

StageEngine::StageEngine(const std::string& model_path, std::optional<model::LayerRange> range, int threads) {
  file_ = gguf::Model::open(model_path);
  model_ = model::Model::load(*file_);
  range_ = range.value_or(model_->all_layers());
  if (range_.first < 0 || range_.last > n_layer() || range_.first >= range_.last) {
    throw std::invalid_argument("layers [" + std::to_string(range_.first) + ", " + std::to_string(range_.last) +
                                ") are not within the model's " + std::to_string(n_layer()) + " layers");
  }
  threads_ = threads > 0 ? threads : cpu::default_thread_count();
  be_ = backend::make_cpu_backend(threads_);
  cache_ = std::make_unique<state::KvCache>(model_->kv_config(range_));
  identity_ = protocol::model_identity(*file_);
}

std::vector<float> StageEngine::forward(std::span<const model::BatchToken> batch, const float* hidden) {
  if (batch.empty()) throw std::invalid_argument("empty batch");
  if (!is_first() && hidden == nullptr) throw std::invalid_argument("this stage needs hidden states");
  std::map<int32_t, int64_t> next_pos;  // per sequence: the position its next token must have
  std::map<int32_t, int64_t> rewind;    // sequences whose tokens start below their cached positions
  for (const auto& t : batch) {
    if (is_first() && (t.token < 0 || t.token >= n_vocab())) {
      throw std::invalid_argument("token " + std::to_string(t.token) + " is outside the vocabulary");
    }
    if (t.pos < 0) throw std::invalid_argument("negative position");
    auto [it, fresh] = next_pos.try_emplace(t.seq_id, 0);
    if (fresh) it->second = cache_->contains(t.seq_id) ? cache_->sequence(t.seq_id).n_pos() : 0;
    const int64_t n_pos = it->second;
    if (fresh && t.pos < n_pos) rewind[t.seq_id] = t.pos;
    it->second = t.pos + 1;
    if (t.pos > n_pos || (!fresh && t.pos != n_pos)) {
      throw std::invalid_argument("sequence " + std::to_string(t.seq_id) + ": position " + std::to_string(t.pos) +
                                  " leaves a gap after " + std::to_string(n_pos) + " cached positions");
    }
  }
  // A sequence continued from an earlier position (the coordinator reusing a cached
  // prompt prefix) drops the positions after it: the cut travels with the tokens, so no
  // separate truncate message can reach a later stage after them.
  for (const auto& [seq_id, pos] : rewind) cache_->truncate(seq_id, pos);
  std::vector<float> out = model_->forward(*be_, batch, hidden, range_, *cache_);
  ++batches_;
  tokens_ += batch.size();
  return out;
}

std::optional<StageEngine::Snapshot> StageEngine::snapshot(int32_t seq_id) const {
  if (!cache_->contains(seq_id)) return std::nullopt;
  const state::SequenceState& state = cache_->sequence(seq_id);
  return Snapshot{state.n_pos(), state.snapshot()};
}

void StageEngine::restore(int32_t seq_id, std::span<const uint8_t> bytes) {
  // Restored into a fresh state first: a refused snapshot leaves the sequence as it was.
  state::KvState restored(cache_->config());
  restored.restore(bytes);
  cache_->sequence(seq_id).restore(bytes);
}

}  // namespace pico::worker
