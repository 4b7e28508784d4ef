// The bookkeeping of a backend's activation memory: chunks numbered end to end, one
// bump position through them, released back to a mark (a stack: a forward pass takes
// its buffers layer by layer and gives each layer's back when the layer is done).
// Chunks are kept once made, so a step's buffers land where the last step's did.
// What a chunk is (host memory, a device buffer) is the backend's business.
#pragma once

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <vector>

namespace pico::backend {

class Arena {
 public:
  // Every allocation starts at a multiple of this (any device's storage offset
  // alignment; Vulkan guarantees at most 256).
  static constexpr size_t kAlignment = 256;

  struct Place {
    size_t chunk = 0;
    size_t offset = 0;  // bytes into the chunk
  };
  struct Chunk {
    size_t begin = 0;  // in the end-to-end numbering
    size_t bytes = 0;
  };

  // `add_chunk(bytes)` is called when no chunk has room: it makes chunk
  // chunks().size() of at least `bytes` and returns its size.
  template <class AddChunk>
  Place allocate(size_t bytes, AddChunk&& add_chunk) {
    bytes = std::max<size_t>((bytes + kAlignment - 1) / kAlignment * kAlignment, kAlignment);
    for (size_t i = 0; i < chunks_.size(); ++i) {
      const Chunk& c = chunks_[i];
      if (c.begin + c.bytes <= top_) continue;
      const size_t start = std::max(top_, c.begin);
      if (c.bytes - (start - c.begin) >= bytes) {
        top_ = start + bytes;
        return {i, start - c.begin};
      }
    }
    const size_t begin = chunks_.empty() ? 0 : chunks_.back().begin + chunks_.back().bytes;
    const size_t made = add_chunk(std::max(bytes, kMinChunk));
    if (made < bytes) throw std::logic_error("arena: a chunk smaller than asked for");
    chunks_.push_back({begin, made});
    top_ = begin + bytes;
    return {chunks_.size() - 1, 0};
  }

  size_t mark() const { return top_; }
  void release(size_t mark) {
    if (mark > top_) throw std::logic_error("arena: released to a mark past the top");
    top_ = mark;
  }
  const std::vector<Chunk>& chunks() const { return chunks_; }

 private:
  static constexpr size_t kMinChunk = size_t{16} << 20;
  std::vector<Chunk> chunks_;
  size_t top_ = 0;
};

// Releases a backend's activations taken in its scope.
template <class B>
class ActivationScopeOf {
 public:
  explicit ActivationScopeOf(B& backend) : backend_(backend), mark_(backend.activation_mark()) {}
  ~ActivationScopeOf() { backend_.release_activations(mark_); }
  ActivationScopeOf(const ActivationScopeOf&) = delete;
  ActivationScopeOf& operator=(const ActivationScopeOf&) = delete;

 private:
  B& backend_;
  size_t mark_;
};

}  // namespace pico::backend
