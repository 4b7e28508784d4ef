// Which of a stage's weights stay in memory when its range may not fit (PicoLM's niche:
// serving more layers than free RAM, as fast as the disk allows). The weights are read
// in place from the GGUF mapping, so memory holds what the page cache holds of them:
//   - lock (mlock) the most valuable tensors first within a byte budget (--mem): the
//     output head and norms (read whole for every token), attention, a mixture's router
//     and shared experts, the dense FFN, routed experts, then token embeddings (a
//     lookup reads a few rows of them);
//   - prefault: read every weight of the range once at load (a fast first reply);
//   - stream the rest: while a layer computes, a thread of its own asks for the next
//     one's unlocked weights (madvise WILLNEED). When what it lacks of them does not fit
//     in the memory left (MemoryRoom: the cgroup's room, MemAvailable), it first gives
//     back (MADV_PAGEOUT) as much of the layers computed last as must go: those are
//     needed again only after every other layer, so the range cycles through the memory
//     there is, re-reading per token only what does not fit, instead of thrashing it.
//     When the streamed weights mostly cannot stay, each layer is given back as it ends.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gguf/reader.hpp"
#include "model/memory_room.hpp"
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
  // The memory left to fill (empty: MemoryRoom's, this process's cgroup and MemAvailable).
  std::function<uint64_t()> room;
};

// Bytes to give back before reading `missing` bytes with `room` left, keeping `margin`
// free for everything else: 0 when it fits.
uint64_t bytes_to_release(uint64_t missing, uint64_t room, uint64_t margin);
// The layers whose weights may be given back while `computing` runs, in the order in
// which they are needed again last first: the ones computed before it, backwards around
// the range, never the one computing nor the next.
std::vector<int32_t> release_order(LayerRange range, int32_t computing);

struct ResidencyReport {
  uint64_t range_bytes = 0;   // the stage's weights in the file
  uint64_t locked_bytes = 0;  // locked (mlock succeeded)
  uint64_t lock_failed_bytes = 0;  // asked but refused (RLIMIT_MEMLOCK without CAP_IPC_LOCK)
  bool streaming = false;     // the range exceeds the budget: read ahead per layer, release as needed
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
  void read_ahead(int32_t layer, int32_t computing);
  std::pair<uint64_t, uint64_t> residency(int32_t layer) const;
  uint64_t page_out(int32_t layer, uint64_t most);
  std::vector<Piece> pieces_;
  LayerRange range_;
  ResidencyReport report_;
  // The read-ahead runs on a thread of its own: madvise(WILLNEED) submits the reads
  // and waits for room in the device's queue, which must not hold up the layer.
  std::mutex mutex_;
  std::condition_variable wake_;
  int32_t wanted_ = -1;  // the layer to read ahead next (-1: none)
  int32_t computing_ = -1;
  std::function<uint64_t()> room_;
  MemoryRoom memory_;
  uint64_t streamed_bytes_ = 0;     // the unlocked weights of the layers
  std::atomic<bool> tight_{false};  // they mostly cannot stay: give each layer back as it ends
  bool stop_ = false;
  std::thread prefetcher_;
};

// The process's anonymous resident memory (RssAnon of /proc/self/status), 0 where unknown.
uint64_t anonymous_resident_bytes();

}  // namespace pico::model
