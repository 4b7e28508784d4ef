#include "layer_trace.hpp"

#include <limits>
#include <map>
#include <utility>

namespace pico::coordinator {

std::vector<TracedToken> LayerTraceHub::Watcher::take() {
  std::lock_guard lock(mutex_);
  std::vector<TracedToken> out(std::make_move_iterator(queued_.begin()), std::make_move_iterator(queued_.end()));
  queued_.clear();
  return out;
}

void LayerTraceHub::Watcher::push(const TracedToken& token) {
  std::lock_guard lock(mutex_);
  if (queued_.size() == kMaxQueued) queued_.pop_front();
  queued_.push_back(token);
}

std::shared_ptr<LayerTraceHub::Watcher> LayerTraceHub::watch() {
  auto watcher = std::make_shared<Watcher>(count_);
  std::lock_guard lock(mutex_);
  std::erase_if(watchers_, [](const std::weak_ptr<Watcher>& w) { return w.expired(); });
  watchers_.push_back(watcher);
  return watcher;
}

void LayerTraceHub::publish(const StepOutput& out, int32_t n_layer) {
  if (out.traces.empty() || n_layer <= 0) return;
  // Per (sequence, position), in the order the first stage listed them.
  std::map<std::pair<int32_t, int32_t>, size_t> index;
  std::vector<TracedToken> tokens;
  for (const StageTrace& trace : out.traces) {
    for (size_t r = 0; r < trace.seq_ids.size(); ++r) {
      const auto key = std::make_pair(trace.seq_ids[r], trace.positions[r]);
      auto [it, fresh] = index.try_emplace(key, tokens.size());
      if (fresh) {
        tokens.push_back({key.first, key.second, std::vector<float>(static_cast<size_t>(n_layer),
                                                                   std::numeric_limits<float>::quiet_NaN())});
      }
      for (int32_t l = 0; l < trace.layers; ++l) {
        const int32_t layer = trace.first_layer + l;
        if (layer >= 0 && layer < n_layer) {
          tokens[it->second].rms[static_cast<size_t>(layer)] = trace.rms[r * static_cast<size_t>(trace.layers) + static_cast<size_t>(l)];
        }
      }
    }
  }
  std::lock_guard lock(mutex_);
  for (const auto& weak : watchers_) {
    if (auto w = weak.lock()) {
      for (const TracedToken& t : tokens) w->push(t);
    }
  }
}

}  // namespace pico::coordinator
