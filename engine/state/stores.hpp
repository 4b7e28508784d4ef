// Where a stage's sequence state lives: the KV cache's pages (PageStore) and the
// recurrent state's blocks (BlockStore: a sequence's state, or a checkpoint of it).
//
// The host's stores are ordinary memory, which the CPU backend reads and writes in
// place. A device backend's stores keep them in device memory at addresses the host
// cannot touch (as its activation memory): the cache moves their bytes only through
// the store, and the backend that made the store binds them where they lie, so a step
// reads and updates the state without a copy to the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "quant/type_traits.hpp"

namespace pico::state {

struct KvPageShape {
  GgmlType k_type = GgmlType::F16;
  GgmlType v_type = GgmlType::F16;
  size_t k_bytes = 0;  // bytes of one page's K rows, and of its V rows
  size_t v_bytes = 0;
};

// A page is a pair: K rows and V rows of the same positions, allocated and freed
// together, so a device reads both at one row index.
class PageStore {
 public:
  struct Page {
    uint8_t* k = nullptr;
    uint8_t* v = nullptr;
  };
  virtual ~PageStore() = default;
  const KvPageShape& shape() const { return shape_; }
  // Whether the host reads and writes pages in place (else only through read / write).
  virtual bool host_memory() const = 0;
  // A page (its bytes not cleared: the cache reads only rows it wrote), and back.
  virtual Page allocate() = 0;
  virtual void free(Page page) = 0;
  // Bytes into / out of a page (`to` / `from` inside one page's K or V rows).
  virtual void write(uint8_t* to, const void* from, size_t bytes) = 0;
  virtual void read(const uint8_t* from, void* to, size_t bytes) const = 0;

 protected:
  explicit PageStore(const KvPageShape& shape) : shape_(shape) {}

 private:
  KvPageShape shape_;
};

// Blocks of block_floats() floats: one sequence's recurrent state, or a checkpoint.
class BlockStore {
 public:
  virtual ~BlockStore() = default;
  size_t block_floats() const { return floats_; }
  virtual bool host_memory() const = 0;
  // A block of zeros, and back.
  virtual float* allocate() = 0;
  virtual void free(float* block) = 0;
  // Whole blocks: one into another, zeros into one, from and to the host.
  virtual void copy(const float* from, float* to) = 0;
  virtual void zero(float* block) = 0;
  virtual void write(float* to, const float* from) = 0;
  virtual void read(const float* from, float* to) const = 0;

 protected:
  explicit BlockStore(size_t block_floats) : floats_(block_floats) {}

 private:
  size_t floats_;
};

// Pages and blocks in host memory.
std::shared_ptr<PageStore> host_page_store(const KvPageShape& shape);
std::shared_ptr<BlockStore> host_block_store(size_t block_floats);

// How a cache gets its stores: a backend's (backend::state_stores_of), or the host's
// where one is empty.
struct StateStores {
  std::function<std::shared_ptr<PageStore>(const KvPageShape&)> pages;
  std::function<std::shared_ptr<BlockStore>(size_t block_floats)> blocks;
};

}  // namespace pico::state
