#include "state/page_store.hpp"

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

}  // namespace

std::shared_ptr<PageStore> host_page_store(const KvPageShape& shape) { return std::make_shared<HostPageStore>(shape); }

}  // namespace pico::state
