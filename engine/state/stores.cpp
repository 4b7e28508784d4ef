#include "state/stores.hpp"

#include <algorithm>
#include <cstring>

namespace pico::state {
namespace {

class HostPageStore final : public PageStore {
 public:
  explicit HostPageStore(const KvPageShape& shape) : PageStore(shape) {}
  bool host_memory() const override { return true; }
  Page allocate() override {
    auto k = std::make_unique_for_overwrite<uint8_t[]>(shape().k_bytes);
    auto v = std::make_unique_for_overwrite<uint8_t[]>(shape().v_bytes);
    return {k.release(), v.release()};
  }
  void free(Page page) override {
    delete[] page.k;
    delete[] page.v;
  }
  void write(uint8_t* to, const void* from, size_t bytes) override { std::memcpy(to, from, bytes); }
  void read(const uint8_t* from, void* to, size_t bytes) const override { std::memcpy(to, from, bytes); }
};

class HostBlockStore final : public BlockStore {
 public:
  explicit HostBlockStore(size_t block_floats) : BlockStore(block_floats) {}
  bool host_memory() const override { return true; }
  float* allocate() override { return new float[block_floats()](); }
  void free(float* block) override { delete[] block; }
  void copy(const float* from, float* to) override { std::copy_n(from, block_floats(), to); }
  void zero(float* block) override { std::fill_n(block, block_floats(), 0.0f); }
  void write(float* to, const float* from) override { std::copy_n(from, block_floats(), to); }
  void read(const float* from, float* to) const override { std::copy_n(from, block_floats(), to); }
};

}  // namespace

std::shared_ptr<PageStore> host_page_store(const KvPageShape& shape) { return std::make_shared<HostPageStore>(shape); }
std::shared_ptr<BlockStore> host_block_store(size_t block_floats) {
  return std::make_shared<HostBlockStore>(block_floats);
}

}  // namespace pico::state
