#include "model/residency.hpp"
#include "model/layer_split.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

namespace pico::model {

namespace {

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

// Reclaimed at once (Linux 5.4+) rather than left for the kernel to find.
#ifdef MADV_PAGEOUT
constexpr int kGiveBack = MADV_PAGEOUT;
#else
constexpr int kGiveBack = MADV_DONTNEED;
#endif

// Kept free beside a read-ahead for what the step allocates meanwhile.
constexpr uint64_t kMargin = uint64_t{8} << 20;

size_t page_size() {
  const long page = ::sysconf(_SC_PAGESIZE);
  return page > 0 ? static_cast<size_t>(page) : 4096;
}

}  // namespace

int32_t weight_layer(std::string_view name) {
  if (!name.starts_with("blk.")) return -1;
  int32_t layer = 0;
  size_t i = 4;
  if (i >= name.size() || name[i] < '0' || name[i] > '9') return -1;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) layer = layer * 10 + (name[i] - '0');
  return layer;
}

WeightClass weight_class(std::string_view name) {
  if (name.starts_with("output")) return WeightClass::Head;  // output.weight, output_norm
  if (name.starts_with("token_embd") || name.starts_with("position_embd")) return WeightClass::Embedding;
  if (contains(name, "norm")) return WeightClass::Norm;
  if (contains(name, "_exps")) return WeightClass::RoutedExperts;
  if (contains(name, "ffn_gate_inp") || contains(name, "_shexp")) return WeightClass::Router;
  if (contains(name, ".ffn_")) return WeightClass::Ffn;
  return WeightClass::Attention;  // attn_*, ssm_* (a hybrid's mixer), and the rest of a layer
}

WeightResidency::WeightResidency(const gguf::Model& file, LayerRange range, int32_t n_layer,
                                 const ResidencyOptions& options,
                                 const std::function<void(uint64_t, uint64_t)>& progress)
    : range_(range), room_(options.room) {
  if (!room_) room_ = [this] { return memory_.available(); };
  const size_t page = page_size();
  const bool tied = file.find_tensor("output.weight") == nullptr;
  for (const gguf::TensorInfo& t : file.tensors()) {
    if (t.bytes == 0 || !stage_reads(file, t.name, range, n_layer)) continue;
    const int32_t layer = weight_layer(t.name);
    const WeightClass kind = weight_class(t.name);
    const auto bytes = file.file(t.file_index).bytes();
    if (t.file_offset + t.bytes > bytes.size()) continue;
    const auto start = reinterpret_cast<uintptr_t>(bytes.data() + t.file_offset);
    const uintptr_t aligned = start / page * page;
    Piece p;
    p.data = reinterpret_cast<const uint8_t*>(aligned);
    p.bytes = (start + t.bytes - aligned + page - 1) / page * page;
    p.layer = layer;
    // A tied head is read whole for every token: it is worth what the head is.
    p.kind = kind == WeightClass::Embedding && tied && range.last == n_layer ? WeightClass::Head : kind;
    pieces_.push_back(p);
    report_.range_bytes += t.bytes;
  }
  // Most valuable first; within a class, in layer order.
  std::stable_sort(pieces_.begin(), pieces_.end(), [](const Piece& a, const Piece& b) {
    return a.kind != b.kind ? a.kind < b.kind : a.layer < b.layer;
  });
  if (options.prefault) {
    uint64_t done = 0, total = 0;
    for (const Piece& p : pieces_) total += p.bytes;
    volatile uint8_t sink = 0;
    for (const Piece& p : pieces_) {
      ::madvise(const_cast<uint8_t*>(p.data), p.bytes, MADV_WILLNEED);
      for (size_t off = 0; off < p.bytes; off += page) sink = sink + p.data[off];
      done += p.bytes;
      if (progress) progress(done, total);
    }
  }
  if (options.lock_bytes > 0) {
    uint64_t budget = options.lock_bytes;
    for (Piece& p : pieces_) {
      if (p.bytes > budget) continue;  // a smaller, less valuable one may still fit
      if (::mlock(p.data, p.bytes) == 0) {
        p.locked = true;
        budget -= p.bytes;
        report_.locked_bytes += p.bytes;
      } else {
        report_.lock_failed_bytes += p.bytes;
        if (report_.lock_error.empty()) report_.lock_error = std::strerror(errno);
      }
    }
    report_.streaming = report_.range_bytes > options.lock_bytes;
  }
  if (report_.streaming) {
    for (const Piece& p : pieces_) streamed_bytes_ += p.locked || p.layer < 0 ? 0 : p.bytes;
    prefetcher_ = std::thread([this] { prefetch_loop(); });
  }
}

WeightResidency::~WeightResidency() {
  if (prefetcher_.joinable()) {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_one();
    prefetcher_.join();
  }
  for (const Piece& p : pieces_) {
    if (p.locked) ::munlock(p.data, p.bytes);
  }
}

void WeightResidency::advise(int32_t layer, int advice) {
  for (const Piece& p : pieces_) {
    if (p.layer == layer && !p.locked) ::madvise(const_cast<uint8_t*>(p.data), p.bytes, advice);
  }
}

void WeightResidency::prefetch_loop() {
  std::unique_lock lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return stop_ || wanted_ >= 0; });
    if (stop_) return;
    const int32_t layer = wanted_, computing = computing_;
    wanted_ = -1;
    lock.unlock();
    read_ahead(layer, computing);
    lock.lock();
  }
}

void WeightResidency::read_ahead(int32_t layer, int32_t computing) {
  if (layer == range_.first) {
    // Once per token: can the streamed weights mostly stay? When what they could occupy
    // (what they hold now and the room left) is under half of them, every token re-reads
    // nearly all of them anyway; then each layer is given back as it finishes, which
    // keeps the cgroup off its limit, where the kernel would reclaim the pages just read
    // ahead first (measured: 2.84 against 2.40 tok/s at a quarter of the weights).
    const uint64_t could_hold = residency(-1).first + room_();
    tight_.store(could_hold < streamed_bytes_ / 2, std::memory_order_relaxed);
  }
  const uint64_t missing = residency(layer).second;
  if (missing > 0 && !tight_.load(std::memory_order_relaxed)) {
    uint64_t release = bytes_to_release(missing, room_(), kMargin);
    for (const int32_t finished : release_order(range_, computing)) {
      if (release == 0) break;
      release -= std::min(release, page_out(finished, release));
    }
  }
  advise(layer, MADV_WILLNEED);
}

// Resident bytes of the unlocked weights of `layer` (all layers when -1) and those missing.
std::pair<uint64_t, uint64_t> WeightResidency::residency(int32_t layer) const {
  const size_t page = page_size();
  uint64_t resident_bytes = 0, missing = 0;
  std::vector<unsigned char> resident;
  for (const Piece& p : pieces_) {
    if (p.locked || p.layer < 0 || (layer >= 0 && p.layer != layer)) continue;
    resident.assign(p.bytes / page, 0);
    if (::mincore(const_cast<uint8_t*>(p.data), p.bytes, resident.data()) != 0) continue;
    for (const unsigned char r : resident) ((r & 1) ? resident_bytes : missing) += page;
  }
  return {resident_bytes, missing};
}

// Gives back at least `most` resident bytes of the layer's unlocked weights where it has
// them (the tail of each tensor first), one madvise per tensor; the bytes given back.
uint64_t WeightResidency::page_out(int32_t layer, uint64_t most) {
  const size_t page = page_size();
  uint64_t freed = 0;
  std::vector<unsigned char> resident;
  for (const Piece& p : pieces_) {
    if (freed >= most) break;
    if (p.layer != layer || p.locked) continue;
    const size_t pages = p.bytes / page;
    resident.assign(pages, 0);
    if (::mincore(const_cast<uint8_t*>(p.data), p.bytes, resident.data()) != 0) continue;
    size_t first = pages;
    uint64_t here = 0;
    while (first > 0 && freed + here < most) here += (resident[--first] & 1) ? page : 0;
    if (here == 0) continue;
    ::madvise(const_cast<uint8_t*>(p.data + first * page), (pages - first) * page, kGiveBack);
    freed += here;
  }
  return freed;
}

void WeightResidency::before_layer(int32_t il) {
  if (!report_.streaming) return;
  // The next layer's weights are read ahead while this one computes; after the last
  // layer, the first (the next token's).
  {
    std::lock_guard lock(mutex_);
    wanted_ = il + 1 < range_.last ? il + 1 : range_.first;
    computing_ = il;
  }
  wake_.notify_one();
}

void WeightResidency::after_layer(int32_t il) {
  if (report_.streaming && tight_.load(std::memory_order_relaxed)) {
    advise(il, kGiveBack);
  }
}

uint64_t bytes_to_release(uint64_t missing, uint64_t room, uint64_t margin) {
  const uint64_t wanted = missing + margin;
  return missing == 0 || room >= wanted ? 0 : wanted - room;
}

std::vector<int32_t> release_order(LayerRange range, int32_t computing) {
  std::vector<int32_t> order;
  const int32_t n = range.last - range.first;
  if (n < 3 || computing < range.first || computing >= range.last) return order;
  for (int32_t back = 1; back <= n - 2; ++back) {
    order.push_back(range.first + ((computing - range.first - back) % n + n) % n);
  }
  return order;
}

uint64_t anonymous_resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.starts_with("RssAnon:")) return std::stoull(line.substr(8)) * 1024;  // "RssAnon:  1234 kB"
  }
  return 0;
}

}  // namespace pico::model
