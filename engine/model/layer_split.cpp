#include "model/layer_split.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace pico::model {

std::vector<LayerRange> balanced_layer_split(const std::vector<uint64_t>& layer_bytes, uint64_t head_bytes,
                                             int stages) {
  const auto n = static_cast<int>(layer_bytes.size());
  if (stages < 1 || stages > n) {
    throw std::invalid_argument("cannot split " + std::to_string(n) + " layers into " + std::to_string(stages) +
                                " stages");
  }
  std::vector<uint64_t> prefix(static_cast<size_t>(n) + 1, 0);
  for (int i = 0; i < n; ++i) prefix[static_cast<size_t>(i) + 1] = prefix[static_cast<size_t>(i)] + layer_bytes[static_cast<size_t>(i)];
  const auto load = [&](int first, int last, bool is_last) {
    return prefix[static_cast<size_t>(last)] - prefix[static_cast<size_t>(first)] + (is_last ? head_bytes : 0);
  };
  // best[s][i]: the smallest largest-stage load of layers i..n-1 over stages s..stages-1;
  // cut[s][i]: where stage s ends in that split (the latest such end on ties, so that
  // earlier stages take more).
  constexpr uint64_t kNone = std::numeric_limits<uint64_t>::max();
  const auto rows = static_cast<size_t>(stages) + 1, cols = static_cast<size_t>(n) + 1;
  std::vector<uint64_t> best(rows * cols, kNone);
  std::vector<int> cut(rows * cols, n);
  const auto at = [cols](int s, int i) { return static_cast<size_t>(s) * cols + static_cast<size_t>(i); };
  best[at(stages, n)] = 0;
  for (int s = stages - 1; s >= 0; --s) {
    const int remaining = stages - s;
    for (int i = n - remaining; i >= s; --i) {
      for (int end = i + 1; end <= n - (remaining - 1); ++end) {
        const uint64_t rest = best[at(s + 1, end)];
        if (rest == kNone) continue;
        const uint64_t worst = std::max(load(i, end, s == stages - 1), rest);
        if (worst <= best[at(s, i)]) {
          best[at(s, i)] = worst;
          cut[at(s, i)] = end;
        }
      }
    }
  }
  std::vector<LayerRange> ranges;
  int first = 0;
  for (int s = 0; s < stages; ++s) {
    const int end = cut[at(s, first)];
    ranges.push_back({first, end});
    first = end;
  }
  return ranges;
}

std::vector<LayerRange> balanced_layer_split(const gguf::Model& file, int stages) {
  std::vector<uint64_t> layer_bytes;
  uint64_t output = 0, embedding = 0;
  for (const gguf::TensorInfo& t : file.tensors()) {
    if (t.name == "output.weight") output = t.bytes;
    if (t.name == "token_embd.weight") embedding = t.bytes;
    if (t.name.rfind("blk.", 0) != 0) continue;
    const size_t layer = std::stoul(t.name.substr(4, t.name.find('.', 4) - 4));
    if (layer >= layer_bytes.size()) layer_bytes.resize(layer + 1, 0);
    layer_bytes[layer] += t.bytes;
  }
  return balanced_layer_split(layer_bytes, output != 0 ? output : embedding, stages);
}

std::string format_layer_ranges(const std::vector<LayerRange>& ranges) {
  std::string out;
  for (const LayerRange& r : ranges) {
    out += (out.empty() ? "" : ",") + std::to_string(r.first) + "-" + std::to_string(r.last - 1);
  }
  return out;
}


bool stage_reads(const gguf::Model& file, const std::string& name, LayerRange range, int32_t n_layer) {
  if (name.rfind("blk.", 0) == 0) {
    const int layer = std::atoi(name.c_str() + 4);
    return layer >= range.first && layer < range.last;
  }
  const bool first = range.first == 0, last = range.last == n_layer;
  if (name.rfind("token_embd.", 0) == 0) return first || (last && !file.find_tensor("output.weight"));
  if (name.rfind("output", 0) == 0) return last;
  return true;  // rope factors and the like: small, and any stage may read them
}

}  // namespace pico::model
