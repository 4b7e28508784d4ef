// Which of a stage's weights stay in memory when its range may not fit (PicoLM's niche:
// serving more layers than free RAM, as fast as the disk allows). The weights are read
// in place from the GGUF mapping, so memory holds what the page cache holds of them:
//   - lock (mlock) the most valuable tensors first within a byte budget (--mem): the
//     output head and norms (read whole for every token), attention, a mixture's router
//     and shared experts, the dense FFN, routed experts, then token embeddings (a
//     lookup reads a few rows of them);
//   - prefault: read every weight of the range once at load (a fast first reply);
//   - stream the rest: while a layer computes, a thread of its own asks for the next
//     one's unlocked weights (madvise WILLNEED), and the finished layer's are given back
//     (MADV_PAGEOUT), so that the range cycles through the memory left instead of
//     thrashing it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gguf/reader.hpp"
#include "model/model.hpp"

namespace pico::model {

// The order in which weights are locked (lower first).
enum class WeightClass { Head, Norm, Attention, Router, Ffn, RoutedExperts, Embedding };
// A tensor's class and layer (-1: not a layer's) from its GGUF name.
WeightClass weight_class(std::string_view tensor_name);
int32_t weight_layer(std::string_view tensor_name);

struct ResidencyOptions {
  uint64_t lock_bytes = 0;  // --mem: bytes to lock (0: none locked, nothing streamed)
  bool prefault = false;    // --prefault: read everything at load
};

struct ResidencyReport {
  uint64_t range_bytes = 0;   // the stage's weights in the file
  uint64_t locked_bytes = 0;  // locked (mlock succeeded)
  uint64_t lock_failed_bytes = 0;  // asked but refused (RLIMIT_MEMLOCK without CAP_IPC_LOCK)
  bool streaming = false;     // the range exceeds the budget: prefetch and release per layer
  std::string lock_error;     // the first mlock error
};

class WeightResidency final : public LayerObserver {
 public:
  // The tensors of `range` (token embeddings on the first stage, the head and output
  // norm on the last). progress(done, total) is called while prefaulting.
  WeightResidency(const gguf::Model& file, LayerRange range, int32_t n_layer, const ResidencyOptions& options,
                  const std::function<void(uint64_t done, uint64_t total)>& progress = {});
  ~WeightResidency() override;
  WeightResidency(const WeightResidency&) = delete;
  WeightResidency& operator=(const WeightResidency&) = delete;

  const ResidencyReport& report() const { return report_; }
  void before_layer(int32_t il) override;
  void after_layer(int32_t il) override;

 private:
  struct Piece {
    const uint8_t* data = nullptr;  // page-aligned start within the mapping
    size_t bytes = 0;               // page-rounded length
    int32_t layer = -1;
    WeightClass kind = WeightClass::Head;
    bool locked = false;
  };
  void advise(int32_t layer, int advice);
  void prefetch_loop();
  std::vector<Piece> pieces_;
  LayerRange range_;
  ResidencyReport report_;
  // The read-ahead runs on a thread of its own: madvise(WILLNEED) submits the reads
  // and waits for room in the device's queue, which must not hold up the layer.
  std::mutex mutex_;
  std::condition_variable wake_;
  int32_t wanted_ = -1;  // the layer to read ahead next (-1: none)
  bool stop_ = false;
  std::thread prefetcher_;
};

// The process's anonymous resident memory (RssAnon of /proc/self/status), 0 where unknown.
uint64_t anonymous_resident_bytes();

}  // namespace pico::model
