// The activation heatmap's data (the web UI): per traced token, the RMS of its residual
// stream after each layer of the model, put together from every stage's trace of a step
// (StepOutput::traces). The engine traces tokens only while someone watches, so that a
// cluster nobody looks at does no work for it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "stage.hpp"

namespace pico::coordinator {

struct TracedToken {
  int32_t seq_id = 0, pos = 0;
  std::vector<float> rms;  // one per layer of the model; NaN for a layer no stage reported
};

class LayerTraceHub {
 public:
  // Tokens published while it lives, oldest first; at most kMaxQueued wait (the oldest
  // go first when a watcher does not keep up).
  class Watcher {
   public:
    static constexpr size_t kMaxQueued = 4096;
    explicit Watcher(std::shared_ptr<std::atomic<int>> count) : count_(std::move(count)) { ++*count_; }
    ~Watcher() { --*count_; }
    Watcher(const Watcher&) = delete;
    Watcher& operator=(const Watcher&) = delete;
    std::vector<TracedToken> take();
    void push(const TracedToken& token);

   private:
    std::shared_ptr<std::atomic<int>> count_;
    std::mutex mutex_;
    std::deque<TracedToken> queued_;
  };

  std::shared_ptr<Watcher> watch();
  // Someone watches: the engine marks its tokens traced.
  bool watched() const { return *count_ > 0; }
  // A step's traces, merged per token, to every watcher. n_layer: the model's.
  void publish(const StepOutput& out, int32_t n_layer);

 private:
  std::shared_ptr<std::atomic<int>> count_ = std::make_shared<std::atomic<int>>(0);
  std::mutex mutex_;
  std::vector<std::weak_ptr<Watcher>> watchers_;
};

}  // namespace pico::coordinator
