#include "state/kv_cache.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <stdexcept>
#include <string>

#include "quant/float_convert.hpp"
#include "quant/quantize.hpp"

namespace pico::state {
namespace {

size_t row_bytes(GgmlType type, int64_t n) {
  const auto bytes = bytes_of(type_traits(type), static_cast<uint64_t>(n));
  if (!bytes) throw std::invalid_argument("KV cache: row of " + std::to_string(n) + " values is not whole blocks of " +
                                          std::string(type_traits(type).name));
  return static_cast<size_t>(*bytes);
}

bool supported(GgmlType type) {
  return type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::Q8_0 || type == GgmlType::Q4_0;
}

void encode_row(GgmlType type, const float* src, uint8_t* dst, int64_t n) {
  switch (type) {
    case GgmlType::F32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); break;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_fp16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      break;
    default: quantize_row(type, src, dst, n); break;
  }
}

void load_head(GgmlType type, const uint8_t* row, int64_t head, int64_t head_dim, float* out) {
  switch (type) {
    case GgmlType::F32: std::memcpy(out, row + head * head_dim * 4, static_cast<size_t>(head_dim) * 4); break;
    case GgmlType::F16: {
      const uint8_t* p = row + head * head_dim * 2;
      for (int64_t i = 0; i < head_dim; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = fp16_to_fp32(h);
      }
      break;
    }
    default: {
      const size_t head_bytes = row_bytes(type, head_dim);
      dequantize_row(type, row + head * head_bytes, out, head_dim);
      break;
    }
  }
}

// Snapshot layout (little or host order, uint64 fields): magic, format version, k and
// v types, k and v row bytes, first layer, layer count; then per layer its positions n
// and n K rows, then n V rows. Pages are not part of it: a snapshot restores into any
// page size.
constexpr uint64_t kSnapshotMagic = 0x5643564b;  // "KVCV"
constexpr uint64_t kSnapshotVersion = 2;
constexpr size_t kSnapshotHeaderWords = 8;

int page_shift_of(int64_t page_positions) {
  int shift = 0;
  while ((int64_t{1} << shift) < page_positions) ++shift;
  return shift;
}

}  // namespace

std::optional<GgmlType> parse_kv_type(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "f32") return GgmlType::F32;
  if (lower == "f16") return GgmlType::F16;
  if (lower == "q8_0") return GgmlType::Q8_0;
  if (lower == "q4_0") return GgmlType::Q4_0;
  return std::nullopt;
}

void validate(const KvConfig& c) {
  if (c.last_layer < c.first_layer || c.first_layer < 0) throw std::invalid_argument("KV cache: bad layer range");
  if (c.n_kv_heads <= 0 || c.head_dim_k <= 0 || c.head_dim_v <= 0) throw std::invalid_argument("KV cache: bad shape");
  if (!supported(c.k_type) || !supported(c.v_type)) {
    throw std::invalid_argument("KV cache: types are f32, f16, q8_0 or q4_0");
  }
  row_bytes(c.k_type, c.head_dim_k);  // each head a whole number of blocks
  row_bytes(c.v_type, c.head_dim_v);
  if (c.page_positions <= 0 || c.page_positions > (int64_t{1} << 20) || (c.page_positions & (c.page_positions - 1))) {
    throw std::invalid_argument("KV cache: page_positions must be a power of two up to 2^20");
  }
  if (!c.attention.empty() && c.attention.size() != static_cast<size_t>(c.last_layer - c.first_layer)) {
    throw std::invalid_argument("KV cache: the attention layer mask does not cover the range");
  }
}

int64_t KvConfig::held_layers() const {
  if (attention.empty()) return last_layer - first_layer;
  return static_cast<int64_t>(std::count(attention.begin(), attention.end(), true));
}

uint64_t kv_bytes_per_position(const KvConfig& c) {
  const uint64_t row =
      row_bytes(c.k_type, c.n_kv_heads * c.head_dim_k) + row_bytes(c.v_type, c.n_kv_heads * c.head_dim_v);
  return row * static_cast<uint64_t>(c.held_layers());
}

uint64_t kv_bytes_for_positions(const KvConfig& c, int64_t positions) {
  if (positions <= 0) return 0;
  const auto pages = (static_cast<uint64_t>(positions) + static_cast<uint64_t>(c.page_positions) - 1) /
                     static_cast<uint64_t>(c.page_positions);
  return pages * static_cast<uint64_t>(c.page_positions) * kv_bytes_per_position(c);
}

KvPageShape page_shape(const KvConfig& c) {
  const auto rows = static_cast<size_t>(c.page_positions);
  return {c.k_type, c.v_type, rows * row_bytes(c.k_type, c.n_kv_heads * c.head_dim_k),
          rows * row_bytes(c.v_type, c.n_kv_heads * c.head_dim_v)};
}

void read_k(const KvLayerView& view, int64_t pos, int64_t head, float* out) {
  load_head(view.k_type, view.k_row(pos), head, view.head_dim_k, out);
}

void read_v(const KvLayerView& view, int64_t pos, int64_t head, float* out) {
  load_head(view.v_type, view.v_row(pos), head, view.head_dim_v, out);
}

KvState::KvState(const KvConfig& config, std::shared_ptr<PageStore> store)
    : config_(config), store_(std::move(store)) {
  validate(config_);
  if (!store_) store_ = host_page_store(page_shape(config_));
  k_row_bytes_ = row_bytes(config_.k_type, config_.n_kv_heads * config_.head_dim_k);
  v_row_bytes_ = row_bytes(config_.v_type, config_.n_kv_heads * config_.head_dim_v);
  page_shift_ = page_shift_of(config_.page_positions);
  layers_.resize(static_cast<size_t>(config_.last_layer - config_.first_layer));
}

int64_t KvState::held_positions() const {
  int64_t n = -1;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (config_.holds(config_.first_layer + static_cast<int32_t>(i))) n = n < 0 ? layers_[i].n : std::min(n, layers_[i].n);
  }
  return std::max<int64_t>(n, 0);
}

KvState::~KvState() {
  for (Layer& l : layers_) keep_pages(l, 0);
}

void KvState::add_page(Layer& l) const {
  // Not zeroed: only rows below n are ever read or copied.
  l.pages.reserve(l.pages.size() + 1);
  l.k_rows.reserve(l.pages.size() + 1);
  l.v_rows.reserve(l.pages.size() + 1);
  const PageStore::Page page = store_->allocate();
  l.pages.push_back(page);
  l.k_rows.push_back(page.k);
  l.v_rows.push_back(page.v);
}

void KvState::keep_pages(Layer& l, int64_t positions) const {
  const auto keep = static_cast<size_t>(pages_for(positions));
  while (l.pages.size() > keep) {
    store_->free(l.pages.back());
    l.pages.pop_back();
    l.k_rows.pop_back();
    l.v_rows.pop_back();
  }
}

uint8_t* KvState::k_row(const Layer& l, int64_t pos) const {
  return l.pages[static_cast<size_t>(pos >> page_shift_)].k +
         static_cast<size_t>(pos & (config_.page_positions - 1)) * k_row_bytes_;
}

uint8_t* KvState::v_row(const Layer& l, int64_t pos) const {
  return l.pages[static_cast<size_t>(pos >> page_shift_)].v +
         static_cast<size_t>(pos & (config_.page_positions - 1)) * v_row_bytes_;
}

template <class Fn>
void KvState::for_each_run(const Layer& l, bool value, Fn&& fn) const {
  const size_t row_bytes = value ? v_row_bytes_ : k_row_bytes_;
  for (int64_t first = 0; first < l.n; first += config_.page_positions) {
    const auto n = static_cast<size_t>(std::min(config_.page_positions, l.n - first));
    fn(value ? v_row(l, first) : k_row(l, first), n * row_bytes);
  }
}

void KvState::store_row(GgmlType type, const float* src, uint8_t* dst, int64_t n, size_t bytes) {
  if (store_->host_memory()) return encode_row(type, src, dst, n);
  std::vector<uint8_t> row(bytes);
  encode_row(type, src, row.data(), n);
  store_->write(dst, row.data(), bytes);
}

const KvState::Layer& KvState::at(int32_t layer) const {
  if (layer < config_.first_layer || layer >= config_.last_layer) {
    throw std::out_of_range("KV cache: layer " + std::to_string(layer) + " is not in this stage");
  }
  return layers_[static_cast<size_t>(layer - config_.first_layer)];
}

void KvState::truncate(int64_t pos) {
  pos = std::max<int64_t>(pos, 0);
  for (Layer& l : layers_) {
    l.n = std::min(l.n, pos);
    keep_pages(l, l.n);
  }
  n_pos_ = std::min(n_pos_, pos);
}

size_t KvState::bytes_used() const {
  size_t pages = 0;
  for (const Layer& l : layers_) pages += l.pages.size();
  return pages * static_cast<size_t>(config_.page_positions) * (k_row_bytes_ + v_row_bytes_);
}

void KvState::write(int32_t layer_index, int64_t pos, const float* k, const float* v) {
  const PageStore::Page rows = place(layer_index, pos);
  store_row(config_.k_type, k, rows.k, config_.n_kv_heads * config_.head_dim_k, k_row_bytes_);
  store_row(config_.v_type, v, rows.v, config_.n_kv_heads * config_.head_dim_v, v_row_bytes_);
}

PageStore::Page KvState::place(int32_t layer_index, int64_t pos) {
  Layer& l = const_cast<Layer&>(at(layer_index));
  if (!config_.holds(layer_index)) {
    throw std::out_of_range("KV cache: layer " + std::to_string(layer_index) + " keeps no K and V");
  }
  if (pos < 0 || pos > l.n) {
    throw std::out_of_range("KV cache: position " + std::to_string(pos) + " after a gap (layer holds " +
                            std::to_string(l.n) + ")");
  }
  if (pos == l.n) {
    if (static_cast<int64_t>(l.pages.size()) < pages_for(pos + 1)) add_page(l);
    l.n = pos + 1;
  }
  n_pos_ = held_positions();
  return {k_row(l, pos), v_row(l, pos)};
}

KvLayerView KvState::layer(int32_t layer_index) const {
  const Layer& l = at(layer_index);
  KvLayerView view;
  view.k_type = config_.k_type;
  view.v_type = config_.v_type;
  view.k_pages = l.k_rows.data();
  view.v_pages = l.v_rows.data();
  view.page_shift = page_shift_;
  view.page_mask = config_.page_positions - 1;
  view.k_row_bytes = k_row_bytes_;
  view.v_row_bytes = v_row_bytes_;
  view.n_pos = l.n;
  view.n_kv_heads = config_.n_kv_heads;
  view.head_dim_k = config_.head_dim_k;
  view.head_dim_v = config_.head_dim_v;
  view.store = store_.get();
  return view;
}

std::vector<uint8_t> KvState::snapshot() const {
  size_t total = kSnapshotHeaderWords * 8;
  for (const Layer& l : layers_) total += 8 + static_cast<size_t>(l.n) * (k_row_bytes_ + v_row_bytes_);
  std::vector<uint8_t> out(total);
  size_t offset = 0;
  auto put = [&](const void* p, size_t n) {
    std::memcpy(out.data() + offset, p, n);
    offset += n;
  };
  const uint64_t header[kSnapshotHeaderWords] = {kSnapshotMagic,
                                                 kSnapshotVersion,
                                                 static_cast<uint64_t>(config_.k_type),
                                                 static_cast<uint64_t>(config_.v_type),
                                                 k_row_bytes_,
                                                 v_row_bytes_,
                                                 static_cast<uint64_t>(config_.first_layer),
                                                 layers_.size()};
  put(header, sizeof header);
  for (const Layer& l : layers_) {
    const auto n = static_cast<uint64_t>(l.n);
    put(&n, sizeof n);
    for (const bool value : {false, true}) {
      for_each_run(l, value, [&](uint8_t* rows, size_t bytes) {
        store_->read(rows, out.data() + offset, bytes);
        offset += bytes;
      });
    }
  }
  return out;
}

std::vector<int64_t> KvState::snapshot_positions(std::span<const uint8_t> snapshot) const {
  if (snapshot.size() < kSnapshotHeaderWords * 8) {
    throw std::invalid_argument("KV snapshot: " + std::to_string(snapshot.size()) + " bytes, shorter than its header");
  }
  uint64_t header[kSnapshotHeaderWords];
  std::memcpy(header, snapshot.data(), sizeof header);
  if (header[0] != kSnapshotMagic) throw std::invalid_argument("KV snapshot: not a KV snapshot (bad magic)");
  if (header[1] != kSnapshotVersion) {
    throw std::invalid_argument("KV snapshot: format version " + std::to_string(header[1]) + ", this stage reads " +
                                std::to_string(kSnapshotVersion));
  }
  if (header[2] != static_cast<uint64_t>(config_.k_type) || header[3] != static_cast<uint64_t>(config_.v_type) ||
      header[4] != k_row_bytes_ || header[5] != v_row_bytes_ ||
      header[6] != static_cast<uint64_t>(config_.first_layer) || header[7] != layers_.size()) {
    throw std::invalid_argument("KV snapshot: another cache configuration (types, row sizes or layers)");
  }
  const uint64_t position_bytes = k_row_bytes_ + v_row_bytes_;
  std::vector<int64_t> positions;
  positions.reserve(layers_.size());
  size_t offset = sizeof header;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (snapshot.size() - offset < 8) {
      throw std::invalid_argument("KV snapshot: truncated before layer " + std::to_string(i));
    }
    uint64_t n = 0;
    std::memcpy(&n, snapshot.data() + offset, 8);
    offset += 8;
    // Divided, not multiplied: a lying n must not overflow into a small product.
    const uint64_t fits = (snapshot.size() - offset) / position_bytes;
    if (n > fits) {
      throw std::invalid_argument("KV snapshot: layer " + std::to_string(i) + " claims " + std::to_string(n) +
                                  " positions, the " + std::to_string(snapshot.size() - offset) +
                                  " bytes left hold at most " + std::to_string(fits));
    }
    offset += static_cast<size_t>(n * position_bytes);
    positions.push_back(static_cast<int64_t>(n));
  }
  if (offset != snapshot.size()) {
    throw std::invalid_argument("KV snapshot: " + std::to_string(snapshot.size() - offset) + " trailing bytes");
  }
  return positions;
}

void KvState::restore(std::span<const uint8_t> snapshot) {
  const std::vector<int64_t> positions = snapshot_positions(snapshot);  // before any allocation
  std::vector<Layer> restored(layers_.size());
  try {
    size_t offset = kSnapshotHeaderWords * 8;
    for (size_t i = 0; i < restored.size(); ++i) {
      Layer& l = restored[i];
      l.n = positions[i];
      offset += 8;
      for (int64_t p = 0; p < pages_for(l.n); ++p) add_page(l);
      for (const bool value : {false, true}) {
        for_each_run(l, value, [&](uint8_t* rows, size_t bytes) {
          store_->write(rows, snapshot.data() + offset, bytes);
          offset += bytes;
        });
      }
    }
  } catch (...) {
    for (Layer& l : restored) keep_pages(l, 0);
    throw;
  }
  for (Layer& l : layers_) keep_pages(l, 0);
  layers_ = std::move(restored);
  n_pos_ = held_positions();
}

KvCache::KvCache(const KvConfig& config, std::optional<RecurrentConfig> recurrent, const StateStores& stores)
    : config_(config), recurrent_(std::move(recurrent)) {
  validate(config_);
  const KvPageShape shape = page_shape(config_);
  store_ = stores.pages ? stores.pages(shape) : host_page_store(shape);
  if (recurrent_) {
    validate(*recurrent_);
    const size_t floats = recurrent_bytes_per_sequence(*recurrent_) / sizeof(float);
    blocks_ = stores.blocks ? stores.blocks(floats) : host_block_store(floats);
  }
}

KvCache::Entry& KvCache::entry(int32_t seq_id) {
  Entry& e = sequences_[seq_id];
  if (!e.kv) {
    e.kv = std::make_unique<KvState>(config_, store_);
    if (recurrent_) e.recurrent = std::make_unique<RecurrentState>(*recurrent_, blocks_);
  }
  return e;
}

KvState& KvCache::sequence(int32_t seq_id) { return *entry(seq_id).kv; }

RecurrentState& KvCache::recurrent(int32_t seq_id) {
  if (!recurrent_) throw std::logic_error("KV cache: this stage keeps no recurrent state");
  return *entry(seq_id).recurrent;
}

const RecurrentState* KvCache::find_recurrent(int32_t seq_id) const {
  auto it = sequences_.find(seq_id);
  return it == sequences_.end() ? nullptr : it->second.recurrent.get();
}

int64_t KvCache::positions(int32_t seq_id) const {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return 0;
  if (it->second.recurrent && config_.held_layers() == 0) return it->second.recurrent->n_pos();
  return it->second.kv->n_pos();
}

bool KvCache::can_truncate(int32_t seq_id, int64_t pos) const {
  const RecurrentState* r = find_recurrent(seq_id);
  return r == nullptr || r->can_truncate(pos);
}

void KvCache::truncate(int32_t seq_id, int64_t pos) {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return;
  if (it->second.recurrent) it->second.recurrent->truncate(pos);  // throws first, changing nothing
  it->second.kv->truncate(pos);
}

size_t KvCache::bytes_used() const {
  size_t total = 0;
  for (const auto& [id, e] : sequences_) total += e.kv->bytes_used() + (e.recurrent ? e.recurrent->bytes_used() : 0);
  return total;
}

size_t KvCache::recurrent_bytes() const {
  size_t total = 0;
  for (const auto& [id, e] : sequences_) total += e.recurrent ? e.recurrent->bytes_used() : 0;
  return total;
}

size_t KvCache::checkpoint_bytes() const {
  size_t total = 0;
  for (const auto& [id, e] : sequences_) total += e.recurrent ? e.recurrent->checkpoint_bytes() : 0;
  return total;
}

size_t KvCache::bytes_used(int32_t seq_id) const {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return 0;
  return it->second.kv->bytes_used() + (it->second.recurrent ? it->second.recurrent->bytes_used() : 0);
}

uint64_t KvCache::fixed_bytes_per_sequence() const {
  return recurrent_ ? recurrent_bytes_per_sequence(*recurrent_) : 0;
}

namespace {
constexpr uint64_t kHybridMagic = 0x5342594853;  // "SHYBS"
}

std::optional<std::vector<uint8_t>> KvCache::snapshot(int32_t seq_id) const {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return std::nullopt;
  std::vector<uint8_t> kv = it->second.kv->snapshot();
  if (!it->second.recurrent) return kv;
  const std::vector<uint8_t> recurrent = it->second.recurrent->snapshot();
  std::vector<uint8_t> out(16 + kv.size() + recurrent.size());
  const uint64_t header[2] = {kHybridMagic, kv.size()};
  std::memcpy(out.data(), header, 16);
  std::memcpy(out.data() + 16, kv.data(), kv.size());
  std::memcpy(out.data() + 16 + kv.size(), recurrent.data(), recurrent.size());
  return out;
}

KvCache::SnapshotParts KvCache::split_snapshot(std::span<const uint8_t> snapshot) const {
  if (!recurrent_) return {snapshot, {}};
  if (snapshot.size() < 16) throw std::invalid_argument("hybrid snapshot: shorter than its header");
  uint64_t header[2];
  std::memcpy(header, snapshot.data(), 16);
  if (header[0] != kHybridMagic) throw std::invalid_argument("hybrid snapshot: not a hybrid model's snapshot (bad magic)");
  if (header[1] > snapshot.size() - 16) {
    throw std::invalid_argument("hybrid snapshot: claims " + std::to_string(header[1]) + " bytes of KV, " +
                                std::to_string(snapshot.size() - 16) + " follow");
  }
  return {snapshot.subspan(16, header[1]), snapshot.subspan(16 + header[1])};
}

void KvCache::restore(int32_t seq_id, std::span<const uint8_t> snapshot) {
  const SnapshotParts parts = split_snapshot(snapshot);
  auto kv = std::make_unique<KvState>(config_, store_);
  kv->restore(parts.kv);
  std::unique_ptr<RecurrentState> recurrent;
  if (recurrent_) {
    recurrent = std::make_unique<RecurrentState>(*recurrent_, blocks_);
    recurrent->restore(parts.recurrent);
  }
  Entry& e = sequences_[seq_id];
  e.kv = std::move(kv);
  e.recurrent = std::move(recurrent);
}

}  // namespace pico::state
