// The attention KV cache: per sequence, per layer, one K row and one V row per
// position, stored as F16 by default (as llama.cpp stores them: each value rounded to
// F16), or as F32, Q8_0 or Q4_0 (-ctk / -ctv). A row is n_kv_heads * head_dim values,
// head after head; quantized rows need head_dim to be a multiple of the block size
// so that each head is a whole number of blocks.
//
// Rows live in fixed pages of page_positions positions, allocated as a sequence grows
// and freed when it is truncated: growing never moves rows already written (no
// doubling and copying in the middle of a step), and the bytes a sequence holds are
// whole pages, known in advance (kv_bytes_for_positions), which is what budgets count.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "quant/type_traits.hpp"
#include "state/stores.hpp"
#include "state/recurrent_state.hpp"
#include "state/sequence_state.hpp"

namespace pico::state {

struct KvConfig {
  int32_t first_layer = 0;  // the stage's layers: [first_layer, last_layer)
  int32_t last_layer = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim_k = 0;
  int64_t head_dim_v = 0;
  GgmlType k_type = GgmlType::F16;
  GgmlType v_type = GgmlType::F16;
  int64_t page_positions = 256;  // positions per page, a power of two
  // Per layer of the range: whether it keeps K and V (a hybrid model's linear-attention
  // layers keep recurrent state instead). Empty: every layer.
  std::vector<bool> attention;

  bool holds(int32_t layer) const {
    return layer >= first_layer && layer < last_layer &&
           (attention.empty() || attention[static_cast<size_t>(layer - first_layer)]);
  }
  int64_t held_layers() const;
};

// Parses "f32", "f16", "q8_0", "q4_0" (case-insensitive); nullopt otherwise.
std::optional<GgmlType> parse_kv_type(std::string_view name);
// Throws std::invalid_argument when the cache cannot store rows of this config.
void validate(const KvConfig& config);
// Bytes of K and V rows one position takes over all the config's layers.
uint64_t kv_bytes_per_position(const KvConfig& config);
// Bytes a sequence of `positions` positions holds: whole pages, every layer.
uint64_t kv_bytes_for_positions(const KvConfig& config, int64_t positions);
// The size of the config's pages.
KvPageShape page_shape(const KvConfig& config);

// Read access to one layer of one sequence (valid until that sequence is next written
// or truncated): row p lives in page p >> page_shift, at (p & page_mask) rows into it.
// The pages are the store's: host memory to read in place, or a device's (its backend
// binds them; see page_store.hpp).
struct KvLayerView {
  GgmlType k_type = GgmlType::F16;
  GgmlType v_type = GgmlType::F16;
  const uint8_t* const* k_pages = nullptr;
  const uint8_t* const* v_pages = nullptr;
  int page_shift = 0;
  int64_t page_mask = 0;
  size_t k_row_bytes = 0;
  size_t v_row_bytes = 0;
  int64_t n_pos = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim_k = 0;
  int64_t head_dim_v = 0;
  const PageStore* store = nullptr;

  const uint8_t* k_row(int64_t pos) const {
    return k_pages[pos >> page_shift] + static_cast<size_t>(pos & page_mask) * k_row_bytes;
  }
  const uint8_t* v_row(int64_t pos) const {
    return v_pages[pos >> page_shift] + static_cast<size_t>(pos & page_mask) * v_row_bytes;
  }
  // Both views read the same rows (the same layer of the same sequence).
  bool same_rows(const KvLayerView& other) const { return k_pages == other.k_pages && v_pages == other.v_pages; }
};

// Dequantizes head `head` of row `pos` of K (or V) into out (head_dim floats).
void read_k(const KvLayerView& view, int64_t pos, int64_t head, float* out);
void read_v(const KvLayerView& view, int64_t pos, int64_t head, float* out);

class KvState final : public SequenceState {
 public:
  // Pages from `store` (host memory when null).
  explicit KvState(const KvConfig& config, std::shared_ptr<PageStore> store = nullptr);
  ~KvState() override;
  KvState(const KvState&) = delete;
  KvState& operator=(const KvState&) = delete;

  int64_t n_pos() const override { return n_pos_; }
  void truncate(int64_t pos) override;
  size_t bytes_used() const override;
  std::vector<uint8_t> snapshot() const override;
  // Checks every length the snapshot claims against the bytes it has before anything
  // is allocated (std::invalid_argument naming the first that does not fit).
  void restore(std::span<const uint8_t> snapshot) override;
  // The positions a snapshot would restore in each layer, checked as restore() checks
  // it, without allocating for its rows.
  std::vector<int64_t> snapshot_positions(std::span<const uint8_t> snapshot) const;

  const KvConfig& config() const { return config_; }
  // Stores the K and V rows (n_kv_heads * head_dim floats each) of `layer` at `pos`,
  // rounded to the cache types. pos <= n_pos (positions are contiguous); writing at
  // n_pos grows the state once every layer of the stage holds it (n_pos counts
  // positions written in the first layer of the stage).
  void write(int32_t layer, int64_t pos, const float* k, const float* v);
  // Where the K and V rows of `layer` at `pos` go, the state grown to hold them as
  // write() grows it, for a backend that writes them itself (in the store's memory).
  PageStore::Page place(int32_t layer, int64_t pos);
  KvLayerView layer(int32_t layer) const;
  const PageStore& store() const { return *store_; }

 private:
  struct Layer {
    std::vector<PageStore::Page> pages;
    std::vector<const uint8_t*> k_rows, v_rows;  // the pages' addresses, for views
    int64_t n = 0;                               // positions held in this layer
  };
  const Layer& at(int32_t layer) const;
  int64_t held_positions() const;  // the fewest positions of a layer that keeps K and V
  void add_page(Layer& layer) const;
  void keep_pages(Layer& layer, int64_t positions) const;  // frees the pages past `positions`
  uint8_t* k_row(const Layer& layer, int64_t pos) const;
  uint8_t* v_row(const Layer& layer, int64_t pos) const;
  void store_row(GgmlType type, const float* src, uint8_t* dst, int64_t n, size_t bytes);
  // fn(rows, bytes) for the layer's K (or V) rows a page at a time, in position order: a
  // page's rows are contiguous, one transfer each from or to a device's store.
  template <class Fn>
  void for_each_run(const Layer& layer, bool value, Fn&& fn) const;
  int64_t pages_for(int64_t positions) const { return (positions + config_.page_positions - 1) >> page_shift_; }

  KvConfig config_;
  std::shared_ptr<PageStore> store_;
  size_t k_row_bytes_ = 0, v_row_bytes_ = 0;
  int page_shift_ = 0;
  std::vector<Layer> layers_;
  int64_t n_pos_ = 0;
};

// The states of many sequences, by id, for one stage's layers: the KV cache of its
// attention layers and, for a hybrid model, the recurrent state of its linear layers.
class KvCache {
 public:
  // KV pages and recurrent state blocks from the stores `stores` makes (a backend's), or
  // host memory.
  explicit KvCache(const KvConfig& config, std::optional<RecurrentConfig> recurrent = std::nullopt,
                   const StateStores& stores = {});
  const KvConfig& config() const { return config_; }
  const PageStore& page_store() const { return *store_; }
  // The recurrent state's store (null without a recurrent config).
  const BlockStore* block_store() const { return blocks_.get(); }
  const std::optional<RecurrentConfig>& recurrent_config() const { return recurrent_; }
  // The sequence's KV, created empty on first use (with its recurrent state).
  KvState& sequence(int32_t seq_id);
  // The sequence's recurrent state (std::logic_error without a recurrent config).
  RecurrentState& recurrent(int32_t seq_id);
  const RecurrentState* find_recurrent(int32_t seq_id) const;
  bool contains(int32_t seq_id) const { return sequences_.count(seq_id) != 0; }
  // Positions the sequence holds on this stage (0 when it is not open).
  int64_t positions(int32_t seq_id) const;
  void remove(int32_t seq_id) { sequences_.erase(seq_id); }
  void clear() { sequences_.clear(); }
  // Whether truncate(seq_id, pos) can be done (the recurrent state goes back only to a
  // checkpoint or to nothing).
  bool can_truncate(int32_t seq_id, int64_t pos) const;
  // Throws std::invalid_argument, changing nothing, when it cannot be done.
  void truncate(int32_t seq_id, int64_t pos);
  size_t bytes_used() const;  // KV, recurrent state and checkpoints
  // The parts of bytes_used(): recurrent states with their checkpoints, and those checkpoints.
  size_t recurrent_bytes() const;
  size_t checkpoint_bytes() const;
  size_t bytes_used(int32_t seq_id) const;  // one sequence's (0 when it is not open)
  size_t size() const { return sequences_.size(); }
  // Fixed bytes per open sequence (its recurrent state; 0 without one).
  uint64_t fixed_bytes_per_sequence() const;

  // A sequence's state (nullopt when it is not open): the KV snapshot, and for a hybrid
  // stage the recurrent one after it.
  std::optional<std::vector<uint8_t>> snapshot(int32_t seq_id) const;
  struct SnapshotParts {
    std::span<const uint8_t> kv, recurrent;
  };
  // Splits a snapshot() of this configuration (std::invalid_argument when it is not one).
  SnapshotParts split_snapshot(std::span<const uint8_t> snapshot) const;
  // Replaces the sequence's state with a snapshot already checked by split_snapshot and
  // the parts' own checks.
  void restore(int32_t seq_id, std::span<const uint8_t> snapshot);

 private:
  struct Entry {
    std::unique_ptr<KvState> kv;
    std::unique_ptr<RecurrentState> recurrent;
  };
  Entry& entry(int32_t seq_id);
  KvConfig config_;
  std::optional<RecurrentConfig> recurrent_;
  std::shared_ptr<PageStore> store_;
  std::shared_ptr<BlockStore> blocks_;
  std::map<int32_t, Entry> sequences_;
};

}  // namespace pico::state
