// Where a KV cache keeps its pages of rows. A page is a pair: K rows and V rows of the
// same positions, allocated and freed together, so a device reads both at one row index.
//
// The host's store is ordinary memory, which the CPU backend's attention reads in place.
// A device backend's store keeps pages in device memory at addresses the host cannot
// touch (as its activation memory): the cache writes and reads their bytes only through
// the store, and the backend that made the store binds them where they lie.
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

// Pages in host memory.
std::shared_ptr<PageStore> host_page_store(const KvPageShape& shape);

// How a cache gets its store: a backend's (Backend::kv_page_store), or the host's.
using PageStoreMaker = std::function<std::shared_ptr<PageStore>(const KvPageShape&)>;

}  // namespace pico::state
