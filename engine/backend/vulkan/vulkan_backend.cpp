#include "backend/vulkan/vulkan_backend.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "backend/vulkan/vulkan_device.hpp"
#include "backend/vulkan/vulkan_ops.hpp"
#include "cpu/matmul.hpp"

namespace pico::backend {
namespace {

using vulkan::Buffer;
using vulkan::BufferRange;

size_t floats(int64_t count) { return static_cast<size_t>(count) * sizeof(float); }
size_t ints(int64_t count) { return static_cast<size_t>(count) * sizeof(int32_t); }

// Addresses reserved with PROT_NONE: never readable or writable by the host, each
// naming device memory through its owner's bookkeeping (activations, KV pages, state).
class Reservation {
 public:
  Reservation(size_t bytes, const char* what) : bytes_(bytes) {
    void* at = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (at == MAP_FAILED) throw std::runtime_error(std::string("vulkan: cannot reserve addresses for ") + what);
    base_ = static_cast<uint8_t*>(at);
  }
  ~Reservation() { munmap(base_, bytes_); }
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;
  uint8_t* base() const { return base_; }
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_;
  uint8_t* base_ = nullptr;
};

// A KV cache's pages in device memory: page i is K pool rows and V pool rows [i *
// page_positions, (i + 1) * page_positions), so a K row and its V row share an index
// (the attention shader's page tables count rows). Each pool is one buffer, grown by
// doubling with a copy on the device, up to what one storage binding spans. The
// pages' addresses are reserved with PROT_NONE: the cache reaches their bytes only
// through write() and read().
class DevicePageStore final : public state::PageStore {
 public:
  DevicePageStore(std::shared_ptr<vulkan::Device> device, const state::KvPageShape& shape, const void* owner)
      : PageStore(shape), device_(std::move(device)), owner_(owner) {
    const uint64_t range = device_->info().max_storage_range;
    max_pages_ = static_cast<size_t>(std::min(range / shape.k_bytes, range / shape.v_bytes));
    if (max_pages_ == 0)
      throw std::runtime_error("vulkan: a KV page of " + std::to_string(std::max(shape.k_bytes, shape.v_bytes)) +
                               " bytes is larger than one storage binding spans (" + std::to_string(range) + ")");
    reserved_ = std::make_unique<Reservation>(max_pages_ * (shape.k_bytes + shape.v_bytes), "KV pages");
    base_ = reserved_->base();
  }

  const void* owner() const { return owner_; }
  const Buffer& k_pool() const { return k_pool_; }
  const Buffer& v_pool() const { return v_pool_; }
  const uint8_t* k_base() const { return base_; }
  const uint8_t* v_base() const { return base_ + max_pages_ * shape().k_bytes; }
  size_t pages() const { return capacity_; }

  bool host_memory() const override { return false; }
  Page allocate() override {
    if (free_.empty()) grow();
    const size_t i = free_.back();
    free_.pop_back();
    return {base_ + i * shape().k_bytes, base_ + max_pages_ * shape().k_bytes + i * shape().v_bytes};
  }
  void free(Page page) override { free_.push_back(static_cast<size_t>(page.k - base_) / shape().k_bytes); }
  void write(uint8_t* to, const void* from, size_t bytes) override {
    const BufferRange at = where(to);
    device_->write(*at.buffer, at.offset, from, bytes);
  }
  void read(const uint8_t* from, void* to, size_t bytes) const override {
    const BufferRange at = where(from);
    device_->download(*at.buffer, at.offset, to, bytes);
  }

 private:
  BufferRange where(const uint8_t* p) const {
    if (p < base_ || p >= base_ + reserved_->bytes()) throw std::logic_error("vulkan: an address outside the KV pages");
    if (p >= v_base()) return {&v_pool_, static_cast<size_t>(p - v_base()), 0};
    return {&k_pool_, static_cast<size_t>(p - base_), 0};
  }
  void grow() {
    if (capacity_ >= max_pages_)
      throw std::runtime_error("vulkan: the KV cache is full: " + std::to_string(capacity_) + " pages of " +
                               std::to_string(shape().k_bytes) + " bytes reach what one storage binding spans (" +
                               std::to_string(device_->info().max_storage_range) + " bytes)");
    const size_t next = std::min(max_pages_, std::max<size_t>(capacity_ * 2, 16));
    Buffer k = device_->allocate(next * shape().k_bytes), v = device_->allocate(next * shape().v_bytes);
    if (capacity_ > 0) {
      const vulkan::Device::CopyRegion k_all{0, 0, capacity_ * shape().k_bytes}, v_all{0, 0, capacity_ * shape().v_bytes};
      device_->copy(k_pool_, k, {&k_all, 1});
      device_->copy(v_pool_, v, {&v_all, 1});
    }  // the old pools, released below, live until the recorded copies have run
    k_pool_ = std::move(k);
    v_pool_ = std::move(v);
    for (size_t i = next; i-- > capacity_;) free_.push_back(i);  // the lowest index first
    capacity_ = next;
  }

  std::shared_ptr<vulkan::Device> device_;
  const void* owner_;
  size_t max_pages_ = 0, capacity_ = 0;
  std::unique_ptr<Reservation> reserved_;
  uint8_t* base_ = nullptr;  // reserved_'s
  Buffer k_pool_, v_pool_;
  std::vector<size_t> free_;
};

// A hybrid model's recurrent state in device memory: blocks of one sequence's state
// (or a checkpoint) in chunks of a few blocks, each chunk one buffer within what a
// storage binding spans, added as sequences come (nothing moves). Addresses reserved
// with PROT_NONE, as the KV pages'.
class DeviceBlockStore final : public state::BlockStore {
 public:
  DeviceBlockStore(std::shared_ptr<vulkan::Device> device, size_t block_floats, const void* owner)
      : BlockStore(block_floats), device_(std::move(device)), owner_(owner), block_bytes_(block_floats * sizeof(float)) {
    const uint64_t range = device_->info().max_storage_range;
    if (block_bytes_ == 0 || block_bytes_ > range)
      throw std::invalid_argument("vulkan: a recurrent state of " + std::to_string(block_bytes_) +
                                  " bytes does not fit one storage binding (" + std::to_string(range) + ")");
    per_chunk_ = static_cast<size_t>(std::min<uint64_t>(range / block_bytes_, 16));
    max_chunks_ = std::max<size_t>(1, (size_t{1} << 40) / (per_chunk_ * block_bytes_));
    reserved_ = std::make_unique<Reservation>(max_chunks_ * per_chunk_ * block_bytes_, "recurrent state");
    base_ = reserved_->base();
  }

  const void* owner() const { return owner_; }
  // Where p (inside a block) lies: its chunk's buffer and the offset in it.
  BufferRange where(const void* p) const {
    const auto* b = static_cast<const uint8_t*>(p);
    if (b < base_ || b >= base_ + chunks_.size() * per_chunk_ * block_bytes_)
      throw std::logic_error("vulkan: an address outside the recurrent state's blocks");
    const auto offset = static_cast<size_t>(b - base_), chunk_bytes = per_chunk_ * block_bytes_;
    return {&chunks_[offset / chunk_bytes], offset % chunk_bytes, 0};
  }

  bool host_memory() const override { return false; }
  float* allocate() override {
    if (free_.empty()) add_chunk();
    const size_t i = free_.back();
    free_.pop_back();
    float* block = reinterpret_cast<float*>(base_ + i * block_bytes_);
    zero(block);
    return block;
  }
  void free(float* block) override {
    free_.push_back(static_cast<size_t>(reinterpret_cast<uint8_t*>(block) - base_) / block_bytes_);
  }
  void copy(const float* from, float* to) override {
    const BufferRange a = where(from), b = where(to);
    const vulkan::Device::CopyRegion region{a.offset, b.offset, block_bytes_};
    device_->copy(*a.buffer, *b.buffer, {&region, 1});
  }
  void zero(float* block) override {
    const BufferRange at = where(block);
    device_->zero(*at.buffer, at.offset, block_bytes_);
  }
  void write(float* to, const float* from) override {
    const BufferRange at = where(to);
    device_->write(*at.buffer, at.offset, from, block_bytes_);
  }
  void read(const float* from, float* to) const override {
    const BufferRange at = where(from);
    device_->download(*at.buffer, at.offset, to, block_bytes_);
  }

 private:
  void add_chunk() {
    if (chunks_.size() == max_chunks_) throw std::runtime_error("vulkan: recurrent state past the addresses reserved for it");
    chunks_.push_back(device_->allocate(per_chunk_ * block_bytes_));
    const size_t first = (chunks_.size() - 1) * per_chunk_;
    for (size_t i = first + per_chunk_; i-- > first;) free_.push_back(i);  // the lowest index first
  }

  std::shared_ptr<vulkan::Device> device_;
  const void* owner_;
  size_t block_bytes_ = 0, per_chunk_ = 0, max_chunks_ = 0;
  std::unique_ptr<Reservation> reserved_;
  uint8_t* base_ = nullptr;  // reserved_'s
  std::deque<Buffer> chunks_;  // deque: a recorded range's buffer stays where it is
  std::vector<size_t> free_;
};

class VulkanBackend final : public Backend {
 public:
  VulkanBackend(std::shared_ptr<vulkan::Device> device, int cpu_threads)
      : device_(std::move(device)), ops_(*device_), cpu_(make_cpu_backend(cpu_threads)) {
    // Addresses for activation memory: never readable or writable by the host.
    reserved_ = reservation_.base();
    alignment_ = std::max<size_t>(device_->info().storage_offset_alignment, 4);
  }

  const char* name() const override { return "vulkan"; }
  uint64_t submissions() const override { return device_->submissions(); }
  uint64_t dispatches() const override { return device_->dispatches(); }
  uint64_t barriers() const override { return device_->barriers(); }

  bool supports(Op op, GgmlType type) const override {
    return vulkan::Ops::supports(op, type) || cpu_->supports(op, type);
  }

  // Device memory, chunk by chunk, each at its place among the reserved addresses.
  float* activations(int64_t count) override {
    const Arena::Place at = arena_.allocate(floats(count), [&](size_t bytes) {
      const size_t begin = arena_.chunks().empty() ? 0 : arena_.chunks().back().begin + arena_.chunks().back().bytes;
      if (bytes > kReserved - begin)
        throw std::runtime_error("vulkan: activation memory past the " + std::to_string(kReserved >> 30) +
                                 " GiB of addresses reserved for it");
      chunks_.push_back(device_->allocate(bytes));
      return bytes;
    });
    return reinterpret_cast<float*>(reserved_ + arena_.chunks()[at.chunk].begin + at.offset);
  }
  size_t activation_mark() const override { return arena_.mark(); }
  void release_activations(size_t mark) override { arena_.release(mark); }

  void upload(const float* host, int64_t count, float* to) override {
    if (const auto at = resident(to)) return device_->write(*at->buffer, at->offset, host, floats(count));
    std::memcpy(to, host, floats(count));
  }
  void download(const float* from, int64_t count, float* host) override {
    if (const auto at = resident(from)) return device_->download(*at->buffer, at->offset, host, floats(count));
    std::memcpy(host, from, floats(count));
  }

  void copy_rows(const float* x, int64_t x_stride, int64_t rows, int64_t n, float* y, int64_t y_stride) override {
    std::vector<vulkan::Device::CopyRegion> regions;
    for (int64_t r = 0; r < rows; ++r) regions.push_back({floats(r * x_stride), floats(r * y_stride), floats(n)});
    copy(x, floats(rows > 0 ? (rows - 1) * x_stride + n : 0), y, regions);
  }

  void gather_rows(const float* x, int64_t n, const int32_t* ids, int64_t count, float* y) override {
    std::vector<vulkan::Device::CopyRegion> regions;
    int64_t x_rows = 0;
    for (int64_t i = 0; i < count; ++i) {
      if (ids[i] < 0) throw std::out_of_range("vulkan: gather_rows: a negative row id");
      regions.push_back({floats(ids[i] * n), floats(i * n), floats(n)});
      x_rows = std::max<int64_t>(x_rows, ids[i] + 1);
    }
    copy(x, floats(x_rows * n), y, regions);
  }

  void argmax_rows(const float* x, int64_t n, const int32_t* rows, int64_t count, float* out) override {
    if (count <= 0) return;
    int32_t x_rows = 0;
    for (int64_t i = 0; i < count; ++i) {
      if (rows[i] < 0) throw std::out_of_range("vulkan: argmax_rows: a negative row");
      x_rows = std::max(x_rows, rows[i] + 1);
    }
    Call call(*this);
    const BufferRange dx = call.in(x, floats(x_rows * n));
    const BufferRange dr = call.in(rows, ints(count));
    ops_.argmax_rows(dx, n, x_rows, dr, count, call.out(out, floats(2 * count)));
    call.finish();
  }

  void scale_rows(float* x, int64_t n, int64_t rows, const float* factors) override {
    Call call(*this);
    const BufferRange df = call.in(factors, floats(rows));
    ops_.scale_rows(call.in_out(x, floats(n * rows)), df, n, rows);
    call.finish();
  }

  void load_weights(std::span<const Weight> matrices, std::span<const ExpertWeights> experts) override {
    for (const Weight& w : matrices)
      if (vulkan::Ops::supports(Op::matmul, w.type)) weight(w);
    for (const ExpertWeights& w : experts)
      if (supports_experts(w)) expert_stacks(w);
  }
  uint64_t weight_bytes() const override { return weight_bytes_; }

  // F16 K and V live in device memory, where the attention shader reads them; other
  // cache types stay on the host with the CPU's attention.
  std::shared_ptr<state::PageStore> kv_page_store(const state::KvPageShape& shape) override {
    if (shape.k_type != GgmlType::F16 || shape.v_type != GgmlType::F16) return state::host_page_store(shape);
    return std::make_shared<DevicePageStore>(device_, shape, this);
  }

  // Recurrent state lives in device memory where the conv and delta-rule shaders
  // update it in place; a state too large for one storage binding stays on the host.
  std::shared_ptr<state::BlockStore> state_block_store(size_t block_floats) override {
    if (block_floats == 0 || block_floats * sizeof(float) > device_->info().max_storage_range)
      return state::host_block_store(block_floats);
    return std::make_shared<DeviceBlockStore>(device_, block_floats, this);
  }

  void store_kv(state::KvCache& cache, int32_t layer, std::span<const KvSlot> slots, const float* k, int64_t k_stride,
                const float* v, int64_t v_stride) override {
    if (slots.empty()) return;
    const state::KvConfig& c = cache.config();
    const int64_t nk = c.n_kv_heads * c.head_dim_k, nv = c.n_kv_heads * c.head_dim_v;
    if (const DevicePageStore* store = own_store(&cache.page_store()); store && nk % 2 == 0 && nv % 2 == 0) {
      std::vector<uint32_t> rows(slots.size());
      for (size_t t = 0; t < slots.size(); ++t) {
        const state::PageStore::Page at = cache.sequence(slots[t].seq_id).place(layer, slots[t].pos);
        rows[t] = static_cast<uint32_t>(static_cast<size_t>(at.k - store->k_base()) / floats(nk / 2));
      }
      const auto count = static_cast<int64_t>(slots.size());
      Call call(*this);
      const BufferRange dr = call.in(rows.data(), rows.size() * sizeof(uint32_t));
      ops_.store_kv_f16(call.in(k, floats((count - 1) * k_stride + nk)), nk, k_stride, dr, count, store->k_pool());
      ops_.store_kv_f16(call.in(v, floats((count - 1) * v_stride + nv)), nv, v_stride, dr, count, store->v_pool());
      return call.finish();
    }
    const auto last = static_cast<int64_t>(slots.size()) - 1;
    std::vector<float> k_copy, v_copy;
    const float* hk = on_host(k, last * k_stride + c.n_kv_heads * c.head_dim_k, k_copy);
    const float* hv = on_host(v, last * v_stride + c.n_kv_heads * c.head_dim_v, v_copy);
    cpu_->store_kv(cache, layer, slots, hk, k_stride, hv, v_stride);
  }

  void matmul(const Weight& w, const float* x, int64_t tokens, float* y) override {
    matmul_many({&w, 1}, x, tokens, {&y, 1});
  }

  // x goes to the device once per activation type among the weights (Q, K and V share it).
  void matmul_many(std::span<const Weight> ws, const float* x, int64_t tokens, std::span<float* const> ys) override {
    Call call(*this);
    std::optional<GgmlType> rounded_for;
    BufferRange dx;
    std::vector<float> x_copy;
    for (size_t i = 0; i < ws.size(); ++i) {
      const Weight& w = ws[i];
      if (!vulkan::Ops::supports(Op::matmul, w.type)) {
        const float* hx = on_host(x, tokens * w.cols, x_copy);
        to(ys[i], tokens * w.rows, [&](float* y) { cpu_->matmul(w, hx, tokens, y); });
        continue;
      }
      const GgmlType a_type = cpu::activation_type(w.type);
      if (rounded_for != a_type) {
        dx = activations_for(call, w.type, x, tokens, w.cols);
        rounded_for = a_type;
      }
      ops_.matmul(weight(w), dx, tokens, call.out(ys[i], floats(tokens * w.rows)));
    }
    call.finish();
  }

  void get_rows(const Weight& table, const int32_t* ids, int64_t count, float* out) override {
    if (!vulkan::Ops::supports(Op::get_rows, table.type)) {
      return to(out, count * table.cols, [&](float* y) { cpu_->get_rows(table, ids, count, y); });
    }
    for (int64_t i = 0; i < count; ++i)
      if (ids[i] < 0 || ids[i] >= table.rows)
        throw std::out_of_range("vulkan: get_rows: id " + std::to_string(ids[i]) + " outside the table");
    Call call(*this);
    const vulkan::DeviceWeight& dt = weight(table);
    ops_.get_rows(dt, call.in(ids, ints(count)), count, call.out(out, floats(count * table.cols)));
    call.finish();
  }

  void rms_norm(const float* x, const float* w, int64_t n, int64_t rows, float eps, float* y) override {
    Call call(*this);
    const BufferRange dx = call.in(x, floats(n * rows));
    const BufferRange dw = w ? call.in(w, floats(n)) : BufferRange{};
    ops_.rms_norm(dx, dw, n, rows, eps, call.out(y, floats(n * rows)));
    call.finish();
  }

  void layer_norm(const float* x, const float* w, const float* b, int64_t n, int64_t rows, float eps,
                  float* y) override {
    Call call(*this);
    const BufferRange dx = call.in(x, floats(n * rows));
    const BufferRange dw = w ? call.in(w, floats(n)) : BufferRange{};
    const BufferRange db = b ? call.in(b, floats(n)) : BufferRange{};
    ops_.layer_norm(dx, dw, db, n, rows, eps, call.out(y, floats(n * rows)));
    call.finish();
  }

  void rope(float* x, int64_t tokens, int64_t row_stride, int64_t heads, int64_t head_dim, const int32_t* pos,
            const RopeParams& params) override {
    if (tokens == 0) return;
    Call call(*this);
    const BufferRange dx = call.in_out(x, floats((tokens - 1) * row_stride + heads * head_dim));
    ops_.rope(dx, tokens, row_stride, heads, head_dim, call.in(pos, ints(tokens)), params);
    call.finish();
  }

  void attention(const float* q, int64_t q_row_stride, std::span<const AttentionQuery> queries,
                 const AttentionParams& params, float* out) override {
    if (queries.empty()) return;
    const auto n = static_cast<int64_t>(queries.size());
    if (const DevicePageStore* store = own_store(queries.front().kv.store)) {
      return device_attention(*store, q, q_row_stride, queries, params, out);
    }
    std::vector<float> q_copy;
    const float* hq = on_host(q, (n - 1) * q_row_stride + params.n_head * params.head_dim_k, q_copy);
    to(out, n * params.n_head * params.head_dim_v, [&](float* y) { cpu_->attention(hq, q_row_stride, queries, params, y); });
  }

  void add(const float* a, const float* b, int64_t n, int64_t rows, int64_t b_rows, float* y) override {
    binary(&vulkan::Ops::add, a, b, n, rows, b_rows, y);
  }
  void mul(const float* a, const float* b, int64_t n, int64_t rows, int64_t b_rows, float* y) override {
    binary(&vulkan::Ops::mul, a, b, n, rows, b_rows, y);
  }

  void scale(float* x, int64_t count, float factor) override {
    Call call(*this);
    ops_.scale(call.in_out(x, floats(count)), count, factor);
    call.finish();
  }

  void silu(const float* x, int64_t n, int64_t rows, float* y) override { unary(&vulkan::Ops::silu, x, n * rows, y); }
  void gelu(const float* x, int64_t count, float* y) override { unary(&vulkan::Ops::gelu, x, count, y); }
  void gelu_erf(const float* x, int64_t count, float* y) override { unary(&vulkan::Ops::gelu_erf, x, count, y); }
  void sigmoid(const float* x, int64_t count, float* y) override { unary(&vulkan::Ops::sigmoid, x, count, y); }
  void softplus(const float* x, int64_t count, float* y) override { unary(&vulkan::Ops::softplus, x, count, y); }

  void softmax(float* x, int64_t n, int64_t rows) override {
    Call call(*this);
    ops_.softmax(call.in_out(x, floats(n * rows)), n, rows);
    call.finish();
  }

  void l2_norm(const float* x, int64_t n, int64_t rows, float eps, float* y) override {
    Call call(*this);
    const BufferRange dx = call.in(x, floats(n * rows));
    ops_.l2_norm(dx, n, rows, eps, call.out(y, floats(n * rows)));
    call.finish();
  }

  void ssm_conv(const float* x, int64_t channels, const float* weights, int64_t taps,
                std::span<const RecurrentSequence> sequences, float* y) override {
    const int64_t rows = total_rows(sequences);
    if (const DeviceBlockStore* store = own_blocks(sequences); store && rows > 0) {
      Call call(*this);
      const BufferRange dx = call.in(x, floats(rows * channels));
      const vulkan::DeviceWeight& dw = weight({GgmlType::F32, weights, channels, taps});
      const BufferRange dy = call.out(y, floats(rows * channels));
      for_each_chunk(call, *store, sequences, [&](BufferRange list, int64_t n, const Buffer& states) {
        ops_.ssm_conv(dx, channels, {&dw.buffer, 0, 0}, taps, list, n, states, rows, dy);
      });
      return call.finish();
    }
    std::vector<float> x_copy;
    const float* hx = on_host(x, rows * channels, x_copy);
    to(y, rows * channels, [&](float* hy) { cpu_->ssm_conv(hx, channels, weights, taps, sequences, hy); });
  }

  void delta_rule(const float* q, const float* k, const float* v, int64_t row_stride, const float* log_decay,
                  const float* beta, std::span<const RecurrentSequence> sequences, const DeltaRuleParams& params,
                  float* out) override {
    const int64_t rows = total_rows(sequences);
    if (rows == 0) return;
    const int64_t qk_span = (rows - 1) * row_stride + params.n_k_heads * params.head_dim;
    const int64_t v_span = (rows - 1) * row_stride + params.n_v_heads * params.head_dim;
    if (const DeviceBlockStore* store = own_blocks(sequences)) {
      Call call(*this);
      const BufferRange dq = call.in(q, floats(qk_span)), dk = call.in(k, floats(qk_span)), dv = call.in(v, floats(v_span));
      const BufferRange dg = call.in(log_decay, floats(rows * params.n_v_heads));
      const BufferRange db = call.in(beta, floats(rows * params.n_v_heads));
      const BufferRange dout = call.out(out, floats(rows * params.n_v_heads * params.head_dim));
      for_each_chunk(call, *store, sequences, [&](BufferRange list, int64_t n, const Buffer& states) {
        ops_.delta_rule(dq, dk, dv, row_stride, dg, db, list, n, states, params, rows, dout);
      });
      return call.finish();
    }
    std::vector<float> q_copy, k_copy, v_copy, g_copy, b_copy;
    const float* hq = on_host(q, qk_span, q_copy);
    const float* hk = on_host(k, qk_span, k_copy);
    const float* hv = on_host(v, v_span, v_copy);
    const float* hg = on_host(log_decay, rows * params.n_v_heads, g_copy);
    const float* hb = on_host(beta, rows * params.n_v_heads, b_copy);
    to(out, rows * params.n_v_heads * params.head_dim,
       [&](float* y) { cpu_->delta_rule(hq, hk, hv, row_stride, hg, hb, sequences, params, y); });
  }

  void moe_route(const float* logits, int64_t n_expert, int64_t tokens, int64_t k, bool normalize, int32_t* experts,
                 float* weights) override {
    Call call(*this);
    const BufferRange dl = call.in(logits, floats(n_expert * tokens));
    ops_.moe_route(dl, n_expert, tokens, k, normalize, call.out(experts, ints(tokens * k)),
                   call.out(weights, floats(tokens * k)));
    call.finish();
  }

  void moe_ffn(const ExpertWeights& w, const float* x, int64_t tokens, const int32_t* experts, const float* weights,
               int64_t k, float* out) override {
    if (!supports_experts(w)) {
      std::vector<float> x_copy, w_copy, e_copy;
      const float* hx = on_host(x, tokens * w.gate.cols, x_copy);
      const float* hw = on_host(weights, tokens * k, w_copy);
      const auto* he = reinterpret_cast<const int32_t*>(on_host(reinterpret_cast<const float*>(experts), tokens * k, e_copy));
      return to(out, tokens * w.down.rows, [&](float* y) { cpu_->moe_ffn(w, hx, tokens, he, hw, k, y); });
    }
    Call call(*this);
    const vulkan::DeviceExperts& dexp = expert_stacks(w);
    const BufferRange dx = activations_for(call, w.gate.type, x, tokens, w.gate.cols);
    const BufferRange de = call.in(experts, ints(tokens * k));
    const BufferRange dw = call.in(weights, floats(tokens * k));
    const size_t scratch_bytes = ops_.moe_scratch_bytes(dexp, tokens, k);
    if (moe_scratch_.size() < scratch_bytes) moe_scratch_ = device_->allocate(scratch_bytes + scratch_bytes / 2);
    ops_.moe_ffn(dexp, dx, tokens, de, dw, k, moe_scratch_, call.out(out, floats(tokens * w.down.rows)));
    call.finish();
  }

 private:
  static constexpr size_t kReserved = size_t{64} << 30;

  // The store of the sequences' states, when it is one of this backend's.
  const DeviceBlockStore* own_blocks(std::span<const RecurrentSequence> sequences) const {
    if (sequences.empty()) return nullptr;
    const auto* device = dynamic_cast<const DeviceBlockStore*>(sequences.front().store);
    if (!device || device->owner() != this) return nullptr;
    for (const RecurrentSequence& s : sequences)
      if (s.store != device) throw std::logic_error("vulkan: one recurrent call over two caches");
    return device;
  }

  // The store, when it is one of this backend's.
  const DevicePageStore* own_store(const state::PageStore* store) const {
    const auto* device = dynamic_cast<const DevicePageStore*>(store);
    return device && device->owner() == this ? device : nullptr;
  }

  // Attention over KV pages in `store`: each query's page table (its sequence's pages as
  // first rows, shared by queries of the same sequence) goes in with the queries.
  void device_attention(const DevicePageStore& store, const float* q, int64_t q_row_stride,
                        std::span<const AttentionQuery> queries, const AttentionParams& params, float* out) {
    const auto n = static_cast<int64_t>(queries.size());
    std::vector<vulkan::DeviceQuery> device_queries;
    std::vector<uint32_t> pages;
    int64_t max_keys = 1;
    for (size_t i = 0; i < queries.size(); ++i) {
      const AttentionQuery& query = queries[i];
      const state::KvLayerView& kv = query.kv;
      if (kv.store != &store) throw std::logic_error("vulkan: one attention call over two caches");
      uint32_t table = static_cast<uint32_t>(pages.size());
      size_t same = 0;
      while (same < i && !queries[same].kv.same_rows(kv)) ++same;
      if (same < i) {
        table = device_queries[same].page_table;
      } else {
        const int64_t n_pages = (kv.n_pos + kv.page_mask) >> kv.page_shift;
        for (int64_t p = 0; p < n_pages; ++p)
          pages.push_back(static_cast<uint32_t>(static_cast<size_t>(kv.k_pages[p] - store.k_base()) / kv.k_row_bytes));
      }
      const int64_t first = params.window > 0 ? std::max<int64_t>(0, query.pos - params.window + 1) : 0;
      const int64_t last = std::min<int64_t>(query.pos, kv.n_pos - 1);
      max_keys = std::max(max_keys, last - first + 1);
      device_queries.push_back({static_cast<uint32_t>(query.pos), static_cast<uint32_t>(kv.n_pos), table, 0});
    }
    if (pages.empty()) pages.push_back(0);
    const state::KvLayerView& kv = queries.front().kv;
    const vulkan::DeviceKvLayer layer{&store.k_pool(), &store.v_pool(), kv.n_kv_heads, kv.head_dim_k, kv.head_dim_v,
                                      kv.page_shift};
    Call call(*this);
    const BufferRange dq = call.in(q, floats((n - 1) * q_row_stride + params.n_head * params.head_dim_k));
    const BufferRange info = call.in(device_queries.data(), device_queries.size() * sizeof(vulkan::DeviceQuery));
    const BufferRange table = call.in(pages.data(), pages.size() * sizeof(uint32_t));
    ops_.attention(dq, q_row_stride, layer, info, table, n, max_keys, params,
                   call.out(out, floats(n * params.n_head * params.head_dim_v)));
    call.finish();
  }

  // Where activation memory at p lies on the device (nullopt: p is host memory).
  std::optional<BufferRange> resident(const void* p) const {
    const auto address = reinterpret_cast<uintptr_t>(p), base = reinterpret_cast<uintptr_t>(reserved_);
    if (address < base || address >= base + kReserved) return std::nullopt;
    const size_t offset = address - base;
    const auto& chunks = arena_.chunks();
    auto it = std::upper_bound(chunks.begin(), chunks.end(), offset,
                               [](size_t o, const Arena::Chunk& c) { return o < c.begin; });
    if (it == chunks.begin() || offset >= std::prev(it)->begin + std::prev(it)->bytes)
      throw std::logic_error("vulkan: an address among the reserved ones that no activation chunk holds");
    const auto i = static_cast<size_t>(std::prev(it) - chunks.begin());
    return BufferRange{&chunks_[i], offset - chunks[i].begin, 0};
  }

  // One op's operands on the device. Activation memory is bound where it lies (through
  // an aligned copy when its offset is not one the device binds); host memory goes in
  // through recorded writes into host_input()'s places, and host results come back in
  // finish(), which submits. Temporaries are activation memory given back when the call
  // ends (a later op reusing them writes what this one's work bound, so the device puts
  // a barrier between).
  class Call {
   public:
    explicit Call(VulkanBackend& be) : be_(be), scope_(be) {
      if (be_.open_calls_++ == 0) be_.reuse_host_inputs();
    }
    ~Call() { --be_.open_calls_; }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

    BufferRange in(const void* p, size_t bytes) {
      if (const auto at = in_place(p, bytes)) return *at;
      return copy_of(p, bytes);
    }
    BufferRange out(void* p, size_t bytes) {
      if (const auto at = in_place(p, bytes)) return *at;
      const BufferRange t = temp(bytes);
      back_.push_back({t, p});
      return t;
    }
    BufferRange in_out(void* p, size_t bytes) {
      if (const auto at = in_place(p, bytes)) return *at;
      const BufferRange t = copy_of(p, bytes);
      back_.push_back({t, p});
      return t;
    }
    // Activation memory for the op's own use, given back when the call ends.
    BufferRange temp(size_t bytes) {
      const BufferRange r = *be_.resident(be_.activations(static_cast<int64_t>((bytes + 3) / 4)));
      return {r.buffer, r.offset, bytes};
    }
    // A fresh device copy of the bytes at p, which the op may change.
    BufferRange copy_of(const void* p, size_t bytes) {
      const auto at = be_.resident(p);
      if (!at) return be_.host_input(p, bytes);
      const BufferRange t = temp(bytes);
      const vulkan::Device::CopyRegion region{at->offset, t.offset, bytes};
      be_.device_->copy(*at->buffer, *t.buffer, {&region, 1});
      return t;
    }
    void finish() {
      for (const Back& b : back_) {
        if (const auto at = be_.resident(b.to)) {
          const vulkan::Device::CopyRegion region{b.from.offset, at->offset, b.from.bytes};
          be_.device_->copy(*b.from.buffer, *at->buffer, {&region, 1});
        } else {
          be_.device_->download(*b.from.buffer, b.from.offset, b.to, b.from.bytes);
        }
      }
      back_.clear();
    }

   private:
    struct Back {
      BufferRange from;
      void* to;
    };
    // The activations at p bound where they lie: nullopt for host memory or an offset
    // the device does not bind.
    std::optional<BufferRange> in_place(const void* p, size_t bytes) const {
      const auto at = be_.resident(p);
      if (!at || at->offset % be_.alignment_ != 0) return std::nullopt;
      return BufferRange{at->buffer, at->offset, bytes};
    }
    VulkanBackend& be_;
    ActivationScope scope_;
    std::vector<Back> back_;
  };

  // Runs op(list, n, states) once per chunk of `store` that holds some of the
  // sequences' states, with those sequences as DeviceSequence (state offsets in floats
  // within the chunk). Sequences are independent: how they are grouped changes nothing.
  template <class Op>
  void for_each_chunk(Call& call, const DeviceBlockStore& store, std::span<const RecurrentSequence> sequences, Op&& op) {
    std::vector<std::pair<const Buffer*, std::vector<vulkan::DeviceSequence>>> groups;
    for (const RecurrentSequence& s : sequences) {
      const BufferRange conv = store.where(s.conv_state), ssm = store.where(s.ssm_state);
      if (conv.buffer != ssm.buffer) throw std::logic_error("vulkan: a sequence's states in two chunks");
      auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == conv.buffer; });
      if (it == groups.end()) it = groups.insert(groups.end(), {conv.buffer, {}});
      it->second.push_back({static_cast<uint32_t>(s.first_row), static_cast<uint32_t>(s.rows),
                            static_cast<uint32_t>(conv.offset / sizeof(float)),
                            static_cast<uint32_t>(ssm.offset / sizeof(float))});
    }
    for (const auto& [states, list] : groups) {
      const BufferRange dl = call.in(list.data(), list.size() * sizeof(vulkan::DeviceSequence));
      op(dl, static_cast<int64_t>(list.size()), *states);
    }
  }

  // x as a matmul over `w_type` multiplies it: rounded on the device to the type's dot
  // partner (Q8_0, Q8_1, Q8_K, F16, BF16; Ops::round_rows) into a temporary, as the CPU backend's
  // matmul (and llama.cpp's) rounds it; F32 weights take x as it is.
  BufferRange activations_for(Call& call, GgmlType w_type, const float* x, int64_t rows, int64_t cols) {
    if (cpu::activation_type(w_type) == GgmlType::F32) return call.in(x, floats(rows * cols));
    const BufferRange rounded = call.temp(floats(rows * cols));
    ops_.round_rows(call.in(x, floats(rows * cols)), cols, rows, w_type, rounded);
    return rounded;
  }

  // What an op left on the CPU reads: x itself on the host, or a download of the
  // activations at x into `copy` (which submits the work recorded so far).
  const float* on_host(const float* x, int64_t count, std::vector<float>& copy) {
    const auto at = resident(x);
    if (!at) return x;
    copy.resize(static_cast<size_t>(count));
    device_->download(*at->buffer, at->offset, copy.data(), floats(count));
    return copy.data();
  }
  // Runs an op left on the CPU that writes count floats for y: into y on the host, or
  // into a host buffer then written to the activations at y (recorded, no wait).
  template <class Op>
  void to(float* y, int64_t count, Op&& op) {
    const auto at = resident(y);
    if (!at) return op(y);
    std::vector<float> result(static_cast<size_t>(count));
    op(result.data());
    device_->write(*at->buffer, at->offset, result.data(), floats(count));
  }

  // Copies `regions` (byte offsets from x and y) from the x_bytes at x to y, wherever
  // each lies.
  void copy(const float* x, size_t x_bytes, float* y, std::span<const vulkan::Device::CopyRegion> regions) {
    const auto from = resident(x), into = resident(y);
    if (from && into) {
      std::vector<vulkan::Device::CopyRegion> moved(regions.begin(), regions.end());
      for (auto& r : moved) {
        r.from += from->offset;
        r.to += into->offset;
      }
      return device_->copy(*from->buffer, *into->buffer, moved);
    }
    std::vector<uint8_t> x_copy;
    const auto* hx = reinterpret_cast<const uint8_t*>(x);
    if (from) {
      x_copy.resize(x_bytes);
      device_->download(*from->buffer, from->offset, x_copy.data(), x_bytes);
      hx = x_copy.data();
    }
    for (const auto& r : regions) {
      if (into) {
        device_->write(*into->buffer, into->offset + r.to, hx + r.from, r.bytes);
      } else {
        std::memcpy(reinterpret_cast<uint8_t*>(y) + r.to, hx + r.from, r.bytes);
      }
    }
  }

  static int64_t total_rows(std::span<const RecurrentSequence> sequences) {
    int64_t rows = 0;
    for (const RecurrentSequence& s : sequences) rows = std::max(rows, s.first_row + s.rows);
    return rows;
  }

  using Binary = void (vulkan::Ops::*)(BufferRange, BufferRange, int64_t, int64_t, int64_t, BufferRange);
  void binary(Binary op, const float* a, const float* b, int64_t n, int64_t rows, int64_t b_rows, float* y) {
    Call call(*this);
    const BufferRange da = call.in(a, floats(n * rows));
    const BufferRange db = call.in(b, floats(n * b_rows));
    (ops_.*op)(da, db, n, rows, b_rows, call.out(y, floats(n * rows)));
    call.finish();
  }
  using Unary = void (vulkan::Ops::*)(BufferRange, int64_t, BufferRange);
  void unary(Unary op, const float* x, int64_t count, float* y) {
    Call call(*this);
    const BufferRange dx = call.in(x, floats(count));
    (ops_.*op)(dx, count, call.out(y, floats(count)));
    call.finish();
  }

  static bool supports_experts(const ExpertWeights& w) {
    return vulkan::Ops::supports(Op::moe_ffn, w.gate.type) && w.up.type == w.gate.type && w.down.type == w.gate.type;
  }
  // Uploaded once per matrix (keyed by where it is mapped and its shape).
  const vulkan::DeviceWeight& weight(const Weight& w) {
    const auto key = std::make_tuple(w.data, w.type, w.cols, w.rows);
    auto it = weights_.find(key);
    if (it == weights_.end()) {
      it = weights_.emplace(key, ops_.upload(w)).first;
      weight_bytes_ += it->second.buffer.size();
    }
    return it->second;
  }
  // Host bytes an op reads (positions, page tables, KV rows...), each in a place of its
  // own until the submission: from the arena, the next op's input would take the bytes
  // the last op still reads, a write after read that needs a barrier between ops that
  // need none. A bump allocator (a larger buffer when one fills), reset once a
  // submission has waited and no op holds a range of it (reuse_host_inputs, as an
  // outermost Call begins).
  void reuse_host_inputs() {
    if (device_->submissions() == input_epoch_) return;
    input_epoch_ = device_->submissions();
    input_used_ = 0;
    // The largest alone: what the other ones held was read by work that has run.
    while (input_buffers_.size() > 1) input_buffers_.pop_front();
  }
  BufferRange host_input(const void* p, size_t bytes) {
    const size_t aligned = (bytes + alignment_ - 1) / alignment_ * alignment_;
    if (input_buffers_.empty() || aligned > input_buffers_.back().size() - input_used_) {
      // A new, larger buffer; the ones before stay (ranges into them are recorded).
      const size_t last = input_buffers_.empty() ? 0 : input_buffers_.back().size();
      input_buffers_.push_back(device_->allocate(std::max({aligned, 2 * last, size_t{64} << 10})));
      input_used_ = 0;
    }
    Buffer& buffer = input_buffers_.back();
    const BufferRange r{&buffer, input_used_, bytes};
    input_used_ += aligned;
    device_->write(buffer, r.offset, p, bytes);
    return r;
  }
  const vulkan::DeviceExperts& expert_stacks(const ExpertWeights& w) {
    auto it = experts_.find(w.gate.data);
    if (it == experts_.end()) {
      it = experts_.emplace(w.gate.data, ops_.upload(w)).first;
      weight_bytes_ += it->second.gate.buffer.size() + it->second.up.buffer.size() + it->second.down.buffer.size();
    }
    return it->second;
  }

  std::shared_ptr<vulkan::Device> device_;  // shared with the KV page stores, which may outlive the backend
  vulkan::Ops ops_;
  std::unique_ptr<Backend> cpu_;
  Reservation reservation_{kReserved, "activation memory"};
  uint8_t* reserved_ = nullptr;  // reservation_'s
  size_t alignment_ = 4;
  Arena arena_;
  std::deque<Buffer> chunks_;  // deque: a recorded range's buffer stays where it is
  Buffer moe_scratch_;
  std::map<std::tuple<const void*, GgmlType, int64_t, int64_t>, vulkan::DeviceWeight> weights_;
  std::map<const void*, vulkan::DeviceExperts> experts_;
  std::deque<Buffer> input_buffers_;  // host_input()'s, the one in use last (deque: ranges keep their buffer)
  size_t input_used_ = 0;
  uint64_t input_epoch_ = 0;  // the submissions when input_used_ counted from 0
  int open_calls_ = 0;        // Calls alive (an op's may hold host inputs)
  uint64_t weight_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_vulkan_backend(int device, int cpu_threads) {
  std::string error;
  const std::vector<vulkan::DeviceInfo> devices = vulkan::list_devices(&error);
  if (device < 0 || static_cast<size_t>(device) >= devices.size())
    throw std::runtime_error("vulkan: no device " + std::to_string(device) + " (" +
                             (devices.empty() ? error : std::to_string(devices.size()) + " found") + ")");
  const vulkan::DeviceInfo& info = devices[static_cast<size_t>(device)];
  if (!info.usable) throw std::runtime_error("vulkan: device " + std::to_string(device) + " (" + info.name +
                                             ") is not usable: " + info.unusable_reason);
  return std::make_unique<VulkanBackend>(vulkan::Device::open(info.index), cpu_threads);
}

}  // namespace pico::backend
