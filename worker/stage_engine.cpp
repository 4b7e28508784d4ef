#include "stage_engine.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <map>
#include <set>
#include <stdexcept>

#include "backend/devices.hpp"
#include "cpu/thread_pool.hpp"
#include "model/memory_room.hpp"

namespace pico::worker {

uint64_t available_memory_bytes() { return model::mem_available_bytes(); }

namespace {

std::string mib(uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

// Bytes of every tensor the stage of `range` reads (its layers', and the embeddings,
// output norm and head where the stage has them).
uint64_t stage_weight_bytes(const gguf::Model& file, model::LayerRange range, int32_t n_layer) {
  uint64_t bytes = 0;
  for (const auto& t : file.tensors()) {
    if (stage_reads(file, t.name, range, n_layer)) bytes += t.bytes;
  }
  return bytes;
}

}  // namespace

MemoryBudget default_state_budget(const gguf::Model& file, model::LayerRange range, int32_t n_layer) {
  MemoryBudget m;
  m.available = available_memory_bytes();
  // Every weight byte the stage reads, resident or not: mapped file pages already read
  // are page cache, which MemAvailable counts as available (reclaimable), and the rest
  // will be taken from it once read (or swapped into memory of the model's own).
  m.weights = stage_weight_bytes(file, range, n_layer);
  m.margin = m.available / 10;
  const uint64_t taken = m.weights + m.margin;
  m.budget = m.available > taken ? m.available - taken : 0;
  return m;
}

uint64_t parse_byte_size(const std::string& text) {
  const auto bad = [&] {
    return std::invalid_argument("'" + text + "' is not a size in bytes (e.g. 1000000, 512M, 4G, 1.5GiB)");
  };
  // Digits with at most one point (no sign, exponent or hex), then the suffix.
  size_t used = 0;
  bool point = false;
  while (used < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[used])) || (text[used] == '.' && !point))) {
    point = point || text[used] == '.';
    ++used;
  }
  if (used == 0 || text.substr(0, used) == ".") throw bad();
  const double value = std::stod(text.substr(0, used));
  std::string suffix = text.substr(used);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (suffix.size() > 1 && (suffix.ends_with("IB") || suffix.ends_with("B"))) {
    suffix.resize(suffix.size() - (suffix.ends_with("IB") ? 2 : 1));
  } else if (suffix == "B") {
    suffix.clear();
  }
  static const std::string kSuffixes = "KMGT";
  double scale = 1;
  if (!suffix.empty()) {
    const size_t power = suffix.size() == 1 ? kSuffixes.find(suffix[0]) : std::string::npos;
    if (power == std::string::npos) throw bad();
    for (size_t i = 0; i <= power; ++i) scale *= 1024.0;
  }
  const double bytes = value * scale;
  if (!std::isfinite(bytes) || bytes < 0 || bytes >= 1.8e19) throw bad();
  return static_cast<uint64_t>(bytes);
}

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

StageEngine::StageEngine(const std::string& model_path, std::optional<model::LayerRange> range, int threads,
                         const StageLimitOptions& limits, const StageBackendOptions& backend,
                         const model::ResidencyOptions& residency,
                         const std::function<void(uint64_t, uint64_t)>& progress) {
  file_ = gguf::Model::open(model_path);
  model_ = model::Model::load(*file_);
  range_ = range.value_or(model_->all_layers());
  if (range_.first < 0 || range_.last > n_layer() || range_.first >= range_.last) {
    throw std::invalid_argument("layers [" + std::to_string(range_.first) + ", " + std::to_string(range_.last) +
                                ") are not within the model's " + std::to_string(n_layer()) + " layers");
  }
  threads_ = threads > 0 ? threads : cpu::default_thread_count();
  if (backend.name == "cpu" && backend.memory) {
    throw std::invalid_argument("--device-memory limits a device backend's memory; the cpu backend has none");
  }
  be_ = backend::open_backend(backend.name, backend.device, threads_);
  if (backend.name != "cpu") {
    for (const backend::ComputeDevice& d : backend::list_compute_devices().devices) {
      if (d.backend != backend.name || d.index != static_cast<uint32_t>(backend.device)) continue;
      device_ = d.name + ", " + d.driver;
      device_memory_bytes_ = d.memory_bytes;
    }
  }
  const state::KvConfig kv = model_->kv_config(range_);
  model_->load_weights(*be_, range_);
  if (residency.lock_bytes > 0 || residency.prefault) {
    if (backend.name != "cpu") {
      throw std::invalid_argument("--mem and --prefault keep the mapped weights in memory: the cpu backend's (a device "
                                  "backend copies them to the device at load)");
    }
    residency_ = std::make_unique<model::WeightResidency>(*file_, range_, n_layer(), residency, progress);
    model_->set_layer_observer(residency_.get());
  }
  cache_ = model_->make_cache(range_, GgmlType::F16, GgmlType::F16, backend::state_stores_of(*be_));
  identity_ = protocol::model_identity(*file_);

  if (limits.max_rows <= 0 || limits.ctx < 0 || limits.max_sequences <= 0) {
    throw std::invalid_argument("limits: --max-rows and --max-sequences must be positive, --ctx not negative");
  }
  const int64_t n_ctx_train = model_->hparams().n_ctx_train;
  limits_.max_rows = limits.max_rows;
  limits_.max_positions = limits.ctx > 0 ? limits.ctx : (n_ctx_train > 0 ? n_ctx_train : 4096);
  if (limits_.max_positions > INT32_MAX) throw std::invalid_argument("limits: --ctx beyond 2^31 positions");
  limits_.max_sequences = limits.max_sequences;
  limits_.kv_bytes_per_position = state::kv_bytes_per_position(kv);
  limits_.state_bytes_per_sequence = cache_->fixed_bytes_per_sequence();
  limits_.page_positions = kv.page_positions;
  if (limits.kv_memory) {
    limits_.state_budget_bytes = *limits.kv_memory;
  } else {
    memory_ = default_state_budget(*file_, range_, n_layer());
    limits_.state_budget_bytes = memory_.budget;
  }
  // Room for a header beside its payload: a forward's lists take ~20 bytes a row.
  const uint64_t header_room = (uint64_t{1} << 20) + 64 * static_cast<uint64_t>(limits_.max_rows);
  const uint64_t hidden = static_cast<uint64_t>(limits_.max_rows) * static_cast<uint64_t>(n_embd()) * 4;
  const uint64_t restore = std::min(
      state::kv_bytes_for_positions(kv, limits_.max_positions) + 8 * static_cast<uint64_t>(range_.last - range_.first) +
          limits_.state_bytes_per_sequence + 1024,
      limits_.state_budget_bytes);
  limits_.max_message_bytes = std::max(hidden, restore) + header_room;
  const uint64_t one_sequence =
      state::kv_bytes_for_positions(kv, limits_.max_positions) + limits_.state_bytes_per_sequence;
  if (limits.kv_memory) {
    spdlog::info("KV budget {} bytes ({}, --kv-memory); one sequence of {} positions takes {} bytes",
                 limits_.state_budget_bytes, mib(limits_.state_budget_bytes), limits_.max_positions, one_sequence);
  } else {
    spdlog::info(
        "KV budget {} bytes ({}: MemAvailable {} less the stage's {} of weights less a margin of {}); "
        "one sequence of {} positions takes {} bytes",
        limits_.state_budget_bytes, mib(limits_.state_budget_bytes), mib(memory_.available),
        mib(memory_.weights), mib(memory_.margin), limits_.max_positions, one_sequence);
  }
  if (backend.name != "cpu") check_device_memory(backend, limits.kv_memory.has_value(), one_sequence);
  if (limits_.state_budget_bytes < one_sequence) {
    spdlog::warn(
        "the KV budget holds less than one sequence of {} positions ({} bytes): lower --ctx or raise --kv-memory",
        limits_.max_positions, one_sequence);
  }
}

void StageEngine::check_device_memory(const StageBackendOptions& backend, bool budget_given, uint64_t one_sequence) {
  // The weights of the range live on the device (uploaded once), and so does the KV
  // cache when the backend keeps its pages (F16): its budget comes out of the device's
  // memory, and the range must hold at least one sequence of --ctx positions. The
  // recurrent state of a hybrid range stays in host memory for now.
  const uint64_t offered = backend.memory ? std::min(*backend.memory, device_memory_bytes_) : device_memory_bytes_;
  const uint64_t weights = stage_weight_bytes(*file_, range_, n_layer());
  const bool kv_on_device = !cache_->page_store().host_memory();
  const std::string layers = "layers " + std::to_string(range_.first) + "-" + std::to_string(range_.last - 1);
  const std::string device = backend.name + " device " + std::to_string(backend.device) + " (" + device_ +
                             ") offers " + std::to_string(offered) + " bytes (" + mib(offered) +
                             (backend.memory && *backend.memory < device_memory_bytes_ ? ", --device-memory" : "") + ")";
  if (weights > offered) {
    throw std::invalid_argument(layers + ": their weights take " + std::to_string(weights) + " bytes (" + mib(weights) +
                                ") but " + device + ": give this stage fewer layers");
  }
  if (!kv_on_device) {
    spdlog::info("{} device {}: the layers' weights take {} of its {}; the KV cache is in host memory", backend.name,
                 backend.device, mib(weights), mib(offered));
    return;
  }
  const uint64_t kv = budget_given ? limits_.state_budget_bytes : one_sequence;
  if (kv > offered - weights) {
    throw std::invalid_argument(
        layers + ": their weights take " + std::to_string(weights) + " bytes (" + mib(weights) + ") and " +
        (budget_given ? "--kv-memory " : "the KV cache of one sequence of " + std::to_string(limits_.max_positions) +
                                             " positions ") +
        std::to_string(kv) + " bytes (" + mib(kv) + ") but " + device +
        (budget_given ? ": lower --kv-memory" : ": lower --ctx") + " or give this stage fewer layers");
  }
  if (!budget_given) limits_.state_budget_bytes = std::min(limits_.state_budget_bytes, offered - weights);
  spdlog::info("{} device {}: the layers' weights take {} of its {}; the KV cache's budget of {} is device memory",
               backend.name, backend.device, mib(weights), mib(offered), mib(limits_.state_budget_bytes));
}

void StageEngine::check_limits(std::span<const model::BatchToken> batch,
                               const std::map<int32_t, int64_t>& next_pos) const {
  // next_pos: per sequence of the batch, the positions it holds after it.
  size_t fresh = 0;
  uint64_t held_by_batch = 0, after = 0;
  for (const auto& [seq_id, n] : next_pos) {
    if (cache_->contains(seq_id)) {
      held_by_batch += cache_->sequence(seq_id).bytes_used();
    } else {
      ++fresh;
      after += cache_->fixed_bytes_per_sequence();  // a new sequence's recurrent state
    }
    after += state::kv_bytes_for_positions(cache_->config(), n);
  }
  if (cache_->size() + fresh > static_cast<size_t>(limits_.max_sequences)) {
    throw LimitError("forward would hold " + std::to_string(cache_->size() + fresh) + " sequences (" +
                     std::to_string(fresh) + " new), exceeding --max-sequences " +
                     std::to_string(limits_.max_sequences));
  }
  const uint64_t total = cache_->bytes_used() - held_by_batch + after;
  if (total > limits_.state_budget_bytes) {
    throw LimitError("forward of " + std::to_string(batch.size()) + " rows would hold " + std::to_string(total) +
                     " bytes of KV, exceeding --kv-memory " + std::to_string(limits_.state_budget_bytes) + " (" +
                     std::to_string(cache_->bytes_used()) + " held now)");
  }
}

void set_output(model::BatchToken& row, protocol::LogitsOutput output) {
  using Output = protocol::LogitsOutput;
  row.argmax_only = output == Output::ARGMAX;
  row.hidden_state = output == Output::HIDDEN || output == Output::MEAN_ADD || output == Output::MEAN_END;
  row.pool = output == Output::MEAN_ADD ? 1 : output == Output::MEAN_END ? 2 : 0;
}

std::vector<float> StageEngine::forward(std::span<const model::BatchToken> batch, const float* hidden,
                                       model::ReducedRows* argmax) {
  if (batch.empty()) throw std::invalid_argument("empty batch");
  if (static_cast<int64_t>(batch.size()) > limits_.max_rows) {
    throw LimitError("forward of " + std::to_string(batch.size()) + " rows exceeds --max-rows " +
                     std::to_string(limits_.max_rows));
  }
  if (!is_first() && hidden == nullptr) throw std::invalid_argument("this stage needs hidden states");
  std::map<int32_t, int64_t> next_pos;  // per sequence: the position its next token must have
  std::map<int32_t, int64_t> rewind;    // sequences whose tokens start below their cached positions
  for (const auto& t : batch) {
    if (is_first() && (t.token < 0 || t.token >= n_vocab())) {
      throw std::invalid_argument("token " + std::to_string(t.token) + " is outside the vocabulary");
    }
    if (t.pos < 0) throw std::invalid_argument("negative position");
    if (t.pos >= limits_.max_positions) {
      throw LimitError("sequence " + std::to_string(t.seq_id) + ": position " + std::to_string(t.pos) +
                       " exceeds --ctx " + std::to_string(limits_.max_positions) + " (positions 0-" +
                       std::to_string(limits_.max_positions - 1) + ")");
    }
    auto [it, fresh] = next_pos.try_emplace(t.seq_id, 0);
    if (fresh) it->second = cache_->positions(t.seq_id);
    const int64_t n_pos = it->second;
    if (fresh && t.pos < n_pos) rewind[t.seq_id] = t.pos;
    it->second = t.pos + 1;
    if (t.pos > n_pos || (!fresh && t.pos != n_pos)) {
      throw std::invalid_argument("sequence " + std::to_string(t.seq_id) + ": position " + std::to_string(t.pos) +
                                  " leaves a gap after " + std::to_string(n_pos) + " cached positions");
    }
  }
  for (const auto& [seq_id, pos] : rewind) {
    if (!cache_->can_truncate(seq_id, pos)) {
      throw std::invalid_argument("sequence " + std::to_string(seq_id) + ": cannot go back to position " +
                                  std::to_string(pos) + ": its recurrent state has no checkpoint there");
    }
  }
  // Checkpoint marks concern only stages with recurrent layers: the others keep KV,
  // which goes back to any position.
  check_limits(batch, next_pos);
  // A sequence continued from an earlier position (the coordinator reusing a cached
  // prompt prefix) drops the positions after it: the cut travels with the tokens, so no
  // separate truncate message can reach a later stage after them.
  for (const auto& [seq_id, pos] : rewind) cache_->truncate(seq_id, pos);
  std::vector<float> out = model_->forward(*be_, batch, hidden, range_, *cache_, argmax);
  ++batches_;
  tokens_ += batch.size();
  if (argmax) pool_hidden(batch, *argmax);
  return out;
}

void StageEngine::pool_hidden(std::span<const model::BatchToken> batch, model::ReducedRows& rows) {
  const auto width = static_cast<size_t>(n_embd());
  if (std::none_of(rows.hidden_rows.begin(), rows.hidden_rows.end(),
                   [&](int32_t r) { return batch[static_cast<size_t>(r)].pool != 0; })) {
    return;
  }
  std::vector<int32_t> kept_rows;
  std::vector<float> kept;
  for (size_t k = 0; k < rows.hidden_rows.size(); ++k) {
    const model::BatchToken& t = batch[static_cast<size_t>(rows.hidden_rows[k])];
    const float* row = rows.hidden.data() + k * width;
    if (t.pool == 0) {
      kept_rows.push_back(rows.hidden_rows[k]);
      kept.insert(kept.end(), row, row + width);
      continue;
    }
    Pool& p = pools_[t.seq_id];
    if (p.sum.empty()) p.sum.assign(width, 0.0);
    for (size_t i = 0; i < width; ++i) p.sum[i] += row[i];
    ++p.rows;
    if (t.pool != 2) continue;
    kept_rows.push_back(rows.hidden_rows[k]);
    for (size_t i = 0; i < width; ++i) kept.push_back(static_cast<float>(p.sum[i] / static_cast<double>(p.rows)));
    pools_.erase(t.seq_id);
  }
  rows.hidden_rows = std::move(kept_rows);
  rows.hidden = std::move(kept);
}

std::optional<StageEngine::Snapshot> StageEngine::snapshot(int32_t seq_id) const {
  auto bytes = cache_->snapshot(seq_id);
  if (!bytes) return std::nullopt;
  return Snapshot{cache_->positions(seq_id), std::move(*bytes)};
}

void StageEngine::restore(int32_t seq_id, std::span<const uint8_t> bytes) {
  // Every claimed length checked against the bytes, then against the limits, before
  // anything is allocated; restored into a fresh state that then replaces the
  // sequence's, so that a refused snapshot leaves it as it was.
  const state::KvCache::SnapshotParts parts = cache_->split_snapshot(bytes);
  const state::KvState kv(cache_->config());
  const std::vector<int64_t> positions = kv.snapshot_positions(parts.kv);
  int64_t n = 0;
  for (int64_t p : positions) n = std::max(n, p);
  if (const auto& rc = cache_->recurrent_config()) n = std::max(n, state::RecurrentState(*rc).snapshot_positions(parts.recurrent));
  if (n > limits_.max_positions) {
    throw LimitError("restore of " + std::to_string(n) + " positions exceeds --ctx " +
                     std::to_string(limits_.max_positions));
  }
  const bool open = cache_->contains(seq_id);
  if (!open && cache_->size() + 1 > static_cast<size_t>(limits_.max_sequences)) {
    throw LimitError("restore would hold " + std::to_string(cache_->size() + 1) +
                     " sequences, exceeding --max-sequences " + std::to_string(limits_.max_sequences));
  }
  const uint64_t held = cache_->bytes_used() - cache_->bytes_used(seq_id);
  const uint64_t total =
      held + state::kv_bytes_for_positions(cache_->config(), n) + cache_->fixed_bytes_per_sequence();
  if (total > limits_.state_budget_bytes) {
    throw LimitError("restore of " + std::to_string(n) + " positions would hold " + std::to_string(total) +
                     " bytes of KV, exceeding --kv-memory " + std::to_string(limits_.state_budget_bytes));
  }
  cache_->restore(seq_id, bytes);
}

}  // namespace pico::worker
