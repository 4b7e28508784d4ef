#include "backend/vulkan/vulkan_backend.hpp"

#include <algorithm>
#include <array>
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

class VulkanBackend final : public Backend {
 public:
  VulkanBackend(std::unique_ptr<vulkan::Device> device, int cpu_threads)
      : device_(std::move(device)), ops_(*device_), cpu_(make_cpu_backend(cpu_threads)) {}

  const char* name() const override { return "vulkan"; }

  bool supports(Op op, GgmlType type) const override {
    return vulkan::Ops::supports(op, type) || cpu_->supports(op, type);
  }

  void matmul(const Weight& w, const float* x, int64_t tokens, float* y) override {
    matmul_many({&w, 1}, x, tokens, {&y, 1});
  }

  // x goes to the device once per activation type among the weights (Q, K and V share it).
  void matmul_many(std::span<const Weight> ws, const float* x, int64_t tokens, std::span<float* const> ys) override {
    std::optional<GgmlType> uploaded;
    for (size_t i = 0; i < ws.size(); ++i) {
      const Weight& w = ws[i];
      if (!vulkan::Ops::supports(Op::matmul, w.type)) {
        cpu_->matmul(w, x, tokens, ys[i]);
        continue;
      }
      const GgmlType a_type = cpu::activation_type(w.type);
      if (uploaded != a_type) {
        put_activations(w.type, x, tokens, w.cols);
        uploaded = a_type;
      }
      Buffer& dy = slot(kOutput, floats(tokens * w.rows));
      ops_.matmul(weight(w), {&slots_[kInput], 0, 0}, tokens, {&dy, 0, 0});
      get(dy, ys[i], floats(tokens * w.rows));
    }
  }

  void get_rows(const Weight& table, const int32_t* ids, int64_t count, float* out) override {
    if (!vulkan::Ops::supports(Op::get_rows, table.type)) return cpu_->get_rows(table, ids, count, out);
    for (int64_t i = 0; i < count; ++i)
      if (ids[i] < 0 || ids[i] >= table.rows)
        throw std::out_of_range("vulkan: get_rows: id " + std::to_string(ids[i]) + " outside the table");
    const vulkan::DeviceWeight& dt = weight(table);
    const BufferRange did = put(kIds, ids, static_cast<size_t>(count) * sizeof(int32_t));
    Buffer& dout = slot(kOutput, floats(count * table.cols));
    ops_.get_rows(dt, did, count, {&dout, 0, 0});
    get(dout, out, floats(count * table.cols));
  }

  void rms_norm(const float* x, const float* w, int64_t n, int64_t rows, float eps, float* y) override {
    const BufferRange dx = put(kInput, x, floats(n * rows));
    const BufferRange dw = w ? put(kVector, w, floats(n)) : BufferRange{};
    Buffer& dy = slot(kOutput, floats(n * rows));
    ops_.rms_norm(dx, dw, n, rows, eps, {&dy, 0, 0});
    get(dy, y, floats(n * rows));
  }

  void layer_norm(const float* x, const float* w, const float* b, int64_t n, int64_t rows, float eps,
                  float* y) override {
    const BufferRange dx = put(kInput, x, floats(n * rows));
    const BufferRange dw = w ? put(kVector, w, floats(n)) : BufferRange{};
    const BufferRange db = b ? put(kSecond, b, floats(n)) : BufferRange{};
    Buffer& dy = slot(kOutput, floats(n * rows));
    ops_.layer_norm(dx, dw, db, n, rows, eps, {&dy, 0, 0});
    get(dy, y, floats(n * rows));
  }

  void rope(float* x, int64_t tokens, int64_t row_stride, int64_t heads, int64_t head_dim, const int32_t* pos,
            const RopeParams& params) override {
    if (tokens == 0) return;
    const size_t bytes = floats((tokens - 1) * row_stride + heads * head_dim);
    const BufferRange dx = put(kInput, x, bytes);
    const BufferRange dpos = put(kIds, pos, static_cast<size_t>(tokens) * sizeof(int32_t));
    ops_.rope(dx, tokens, row_stride, heads, head_dim, dpos, params);
    get(*dx.buffer, x, bytes);
  }

  void attention(const float* q, int64_t q_row_stride, std::span<const AttentionQuery> queries,
                 const AttentionParams& params, float* out) override {
    cpu_->attention(q, q_row_stride, queries, params, out);
  }

  void add(const float* a, const float* b, int64_t n, int64_t rows, int64_t b_rows, float* y) override {
    binary(&vulkan::Ops::add, a, b, n, rows, b_rows, y);
  }
  void mul(const float* a, const float* b, int64_t n, int64_t rows, int64_t b_rows, float* y) override {
    binary(&vulkan::Ops::mul, a, b, n, rows, b_rows, y);
  }

  void scale(float* x, int64_t count, float factor) override {
    const BufferRange dx = put(kInput, x, floats(count));
    ops_.scale(dx, count, factor);
    get(*dx.buffer, x, floats(count));
  }

  void silu(const float* x, int64_t n, int64_t rows, float* y) override { unary(&vulkan::Ops::silu, x, n * rows, y); }
  void gelu(const float* x, int64_t count, float* y) override { unary(&vulkan::Ops::gelu, x, count, y); }
  void gelu_erf(const float* x, int64_t count, float* y) override { unary(&vulkan::Ops::gelu_erf, x, count, y); }
  void sigmoid(const float* x, int64_t count, float* y) override { unary(&vulkan::Ops::sigmoid, x, count, y); }
  void softplus(const float* x, int64_t count, float* y) override { unary(&vulkan::Ops::softplus, x, count, y); }

  void softmax(float* x, int64_t n, int64_t rows) override {
    const BufferRange dx = put(kInput, x, floats(n * rows));
    ops_.softmax(dx, n, rows);
    get(*dx.buffer, x, floats(n * rows));
  }

  void l2_norm(const float* x, int64_t n, int64_t rows, float eps, float* y) override {
    const BufferRange dx = put(kInput, x, floats(n * rows));
    Buffer& dy = slot(kOutput, floats(n * rows));
    ops_.l2_norm(dx, n, rows, eps, {&dy, 0, 0});
    get(dy, y, floats(n * rows));
  }

  void ssm_conv(const float* x, int64_t channels, const float* weights, int64_t taps,
                std::span<const RecurrentSequence> sequences, float* y) override {
    cpu_->ssm_conv(x, channels, weights, taps, sequences, y);
  }

  void delta_rule(const float* q, const float* k, const float* v, int64_t row_stride, const float* log_decay,
                  const float* beta, std::span<const RecurrentSequence> sequences, const DeltaRuleParams& params,
                  float* out) override {
    cpu_->delta_rule(q, k, v, row_stride, log_decay, beta, sequences, params, out);
  }

  void moe_route(const float* logits, int64_t n_expert, int64_t tokens, int64_t k, bool normalize, int32_t* experts,
                 float* weights) override {
    const BufferRange dl = put(kInput, logits, floats(n_expert * tokens));
    Buffer& de = slot(kIds, static_cast<size_t>(tokens * k) * sizeof(int32_t));
    Buffer& dw = slot(kOutput, floats(tokens * k));
    ops_.moe_route(dl, n_expert, tokens, k, normalize, {&de, 0, 0}, {&dw, 0, 0});
    get(de, experts, static_cast<size_t>(tokens * k) * sizeof(int32_t));
    get(dw, weights, floats(tokens * k));
  }

  void moe_ffn(const ExpertWeights& w, const float* x, int64_t tokens, const int32_t* experts, const float* weights,
               int64_t k, float* out) override {
    if (!vulkan::Ops::supports(Op::moe_ffn, w.gate.type) || w.up.type != w.gate.type || w.down.type != w.gate.type)
      return cpu_->moe_ffn(w, x, tokens, experts, weights, k, out);
    const vulkan::DeviceExperts& dexp = expert_stacks(w);
    const int64_t n_embd = w.gate.cols;
    const BufferRange dx = put_activations(w.gate.type, x, tokens, n_embd);
    const BufferRange de = put(kIds, experts, static_cast<size_t>(tokens * k) * sizeof(int32_t));
    const BufferRange dw = put(kVector, weights, floats(tokens * k));
    Buffer& scratch = slot(kScratch, ops_.moe_scratch_bytes(dexp, tokens, k));
    Buffer& dy = slot(kOutput, floats(tokens * w.down.rows));
    ops_.moe_ffn(dexp, dx, tokens, de, dw, k, scratch, {&dy, 0, 0});
    get(dy, out, floats(tokens * w.down.rows));
  }

 private:
  // Reused buffers, one per role in a call (each call submits and reads back before
  // returning, so nothing recorded still uses them when the next call refills them).
  enum Slot { kInput, kSecond, kVector, kIds, kOutput, kScratch, kSlots };

  static size_t floats(int64_t count) { return static_cast<size_t>(count) * sizeof(float); }

  Buffer& slot(Slot s, size_t bytes) {
    Buffer& b = slots_[s];
    if (b.size() < bytes) b = device_->allocate(std::max<size_t>(bytes + bytes / 2, 256));
    return b;
  }
  BufferRange put(Slot s, const void* data, size_t bytes) {
    Buffer& b = slot(s, bytes);
    device_->upload(b, 0, data, bytes);
    return {&b, 0, 0};
  }
  void get(const Buffer& b, void* out, size_t bytes) {
    device_->submit();
    device_->download(b, 0, out, bytes);
  }

  using Binary = void (vulkan::Ops::*)(BufferRange, BufferRange, int64_t, int64_t, int64_t, BufferRange);
  void binary(Binary op, const float* a, const float* b, int64_t n, int64_t rows, int64_t b_rows, float* y) {
    const BufferRange da = put(kInput, a, floats(n * rows));
    const BufferRange db = put(kSecond, b, floats(n * b_rows));
    Buffer& dy = slot(kOutput, floats(n * rows));
    (ops_.*op)(da, db, n, rows, b_rows, {&dy, 0, 0});
    get(dy, y, floats(n * rows));
  }
  using Unary = void (vulkan::Ops::*)(BufferRange, int64_t, BufferRange);
  void unary(Unary op, const float* x, int64_t count, float* y) {
    const BufferRange dx = put(kInput, x, floats(count));
    Buffer& dy = slot(kOutput, floats(count));
    (ops_.*op)(dx, count, {&dy, 0, 0});
    get(dy, y, floats(count));
  }

  // The activations in kInput as the CPU backend's matmul (and llama.cpp's) sees them:
  // rounded on the device to the weight type's dot partner (Q8_0, Q8_1, Q8_K, F16,
  // BF16; Ops::round_rows), so that the float shaders multiply the same values.
  BufferRange put_activations(GgmlType w_type, const float* x, int64_t rows, int64_t cols) {
    const BufferRange dx = put(kInput, x, floats(rows * cols));
    ops_.round_rows(dx, cols, rows, w_type);
    return dx;
  }

  // Uploaded once per matrix (keyed by where it is mapped and its shape).
  const vulkan::DeviceWeight& weight(const Weight& w) {
    const auto key = std::make_tuple(w.data, w.type, w.cols, w.rows);
    auto it = weights_.find(key);
    if (it == weights_.end()) it = weights_.emplace(key, ops_.upload(w)).first;
    return it->second;
  }
  const vulkan::DeviceExperts& expert_stacks(const ExpertWeights& w) {
    auto it = experts_.find(w.gate.data);
    if (it == experts_.end()) it = experts_.emplace(w.gate.data, ops_.upload(w)).first;
    return it->second;
  }

  std::unique_ptr<vulkan::Device> device_;
  vulkan::Ops ops_;
  std::unique_ptr<Backend> cpu_;
  std::array<Buffer, kSlots> slots_;
  std::map<std::tuple<const void*, GgmlType, int64_t, int64_t>, vulkan::DeviceWeight> weights_;
  std::map<const void*, vulkan::DeviceExperts> experts_;
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
