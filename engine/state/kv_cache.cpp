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

void store_row(GgmlType type, const float* src, uint8_t* dst, int64_t n) {
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

constexpr uint32_t kSnapshotMagic = 0x5643564b;  // "KVCV"

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
}

void read_k(const KvLayerView& view, int64_t pos, int64_t head, float* out) {
  load_head(view.k_type, view.k + static_cast<size_t>(pos) * view.k_row_bytes, head, view.head_dim_k, out);
}

void read_v(const KvLayerView& view, int64_t pos, int64_t head, float* out) {
  load_head(view.v_type, view.v + static_cast<size_t>(pos) * view.v_row_bytes, head, view.head_dim_v, out);
}

KvState::KvState(const KvConfig& config) : config_(config) {
  validate(config_);
  k_row_bytes_ = row_bytes(config_.k_type, config_.n_kv_heads * config_.head_dim_k);
  v_row_bytes_ = row_bytes(config_.v_type, config_.n_kv_heads * config_.head_dim_v);
  layers_.resize(static_cast<size_t>(config_.last_layer - config_.first_layer));
}

const KvState::Layer& KvState::at(int32_t layer) const {
  if (layer < config_.first_layer || layer >= config_.last_layer) {
    throw std::out_of_range("KV cache: layer " + std::to_string(layer) + " is not in this stage");
  }
  return layers_[static_cast<size_t>(layer - config_.first_layer)];
}

void KvState::truncate(int64_t pos) {
  pos = std::max<int64_t>(pos, 0);
  for (Layer& l : layers_) l.n = std::min(l.n, pos);
  n_pos_ = std::min(n_pos_, pos);
}

size_t KvState::bytes_used() const {
  size_t total = 0;
  for (const Layer& l : layers_) total += static_cast<size_t>(l.n) * (k_row_bytes_ + v_row_bytes_);
  return total;
}

void KvState::write(int32_t layer_index, int64_t pos, const float* k, const float* v) {
  Layer& l = const_cast<Layer&>(at(layer_index));
  if (pos < 0 || pos > l.n) {
    throw std::out_of_range("KV cache: position " + std::to_string(pos) + " after a gap (layer holds " +
                            std::to_string(l.n) + ")");
  }
  if (pos == l.n) {
    const size_t need = static_cast<size_t>(pos + 1);
    if (l.k.size() < need * k_row_bytes_) {
      const size_t cap = std::max<size_t>(need, 2 * l.k.size() / std::max<size_t>(k_row_bytes_, 1));
      l.k.resize(cap * k_row_bytes_);
      l.v.resize(cap * v_row_bytes_);
    }
    l.n = pos + 1;
  }
  store_row(config_.k_type, k, l.k.data() + static_cast<size_t>(pos) * k_row_bytes_,
            config_.n_kv_heads * config_.head_dim_k);
  store_row(config_.v_type, v, l.v.data() + static_cast<size_t>(pos) * v_row_bytes_,
            config_.n_kv_heads * config_.head_dim_v);
  int64_t n = layers_.empty() ? 0 : layers_.front().n;
  for (const Layer& each : layers_) n = std::min(n, each.n);
  n_pos_ = n;
}

KvLayerView KvState::layer(int32_t layer_index) const {
  const Layer& l = at(layer_index);
  KvLayerView view;
  view.k_type = config_.k_type;
  view.v_type = config_.v_type;
  view.k = l.k.data();
  view.v = l.v.data();
  view.k_row_bytes = k_row_bytes_;
  view.v_row_bytes = v_row_bytes_;
  view.n_pos = l.n;
  view.n_kv_heads = config_.n_kv_heads;
  view.head_dim_k = config_.head_dim_k;
  view.head_dim_v = config_.head_dim_v;
  return view;
}

// Snapshot: magic, k/v row bytes, layer count, then per layer n and its rows.
std::vector<uint8_t> KvState::snapshot() const {
  std::vector<uint8_t> out;
  auto put = [&out](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  };
  const uint64_t header[4] = {kSnapshotMagic, k_row_bytes_, v_row_bytes_, layers_.size()};
  put(header, sizeof header);
  for (const Layer& l : layers_) {
    const uint64_t n = static_cast<uint64_t>(l.n);
    put(&n, sizeof n);
    put(l.k.data(), static_cast<size_t>(l.n) * k_row_bytes_);
    put(l.v.data(), static_cast<size_t>(l.n) * v_row_bytes_);
  }
  return out;
}

void KvState::restore(std::span<const uint8_t> snapshot) {
  size_t offset = 0;
  auto get = [&](void* p, size_t n) {
    if (offset + n > snapshot.size()) throw std::invalid_argument("KV snapshot: truncated");
    std::memcpy(p, snapshot.data() + offset, n);
    offset += n;
  };
  uint64_t header[4];
  get(header, sizeof header);
  if (header[0] != kSnapshotMagic || header[1] != k_row_bytes_ || header[2] != v_row_bytes_ ||
      header[3] != layers_.size()) {
    throw std::invalid_argument("KV snapshot: another cache configuration");
  }
  std::vector<Layer> restored(layers_.size());
  for (Layer& l : restored) {
    uint64_t n = 0;
    get(&n, sizeof n);
    if (n > snapshot.size()) throw std::invalid_argument("KV snapshot: bad length");
    l.n = static_cast<int64_t>(n);
    l.k.resize(n * k_row_bytes_);
    l.v.resize(n * v_row_bytes_);
    get(l.k.data(), l.k.size());
    get(l.v.data(), l.v.size());
  }
  if (offset != snapshot.size()) throw std::invalid_argument("KV snapshot: trailing bytes");
  layers_ = std::move(restored);
  int64_t n = layers_.empty() ? 0 : layers_.front().n;
  for (const Layer& each : layers_) n = std::min(n, each.n);
  n_pos_ = n;
}

KvCache::KvCache(const KvConfig& config) : config_(config) { validate(config_); }

KvState& KvCache::sequence(int32_t seq_id) {
  auto& slot = sequences_[seq_id];
  if (!slot) slot = std::make_unique<KvState>(config_);
  return *slot;
}

void KvCache::truncate(int32_t seq_id, int64_t pos) {
  auto it = sequences_.find(seq_id);
  if (it != sequences_.end()) it->second->truncate(pos);
}

size_t KvCache::bytes_used() const {
  size_t total = 0;
  for (const auto& [id, s] : sequences_) total += s->bytes_used();
  return total;
}

}  // namespace pico::state
