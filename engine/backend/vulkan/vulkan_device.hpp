// A Vulkan compute device: the instance, one logical device and its compute queue,
// storage buffers, the embedded compute shaders as pipelines, and a command stream
// that records many dispatches and submits them at once. The C API (vulkan.h): a
// translation unit with vulkan.hpp takes four times as long to compile.
//
// Everything here is about running shaders; what they compute is vulkan_ops.hpp's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace pico::backend::vulkan {

// What a device is and what the shaders may assume of it (queried, never assumed).
struct DeviceInfo {
  uint32_t index = 0;
  std::string name;
  std::string driver;            // driver name and version text
  std::string type;              // "discrete", "integrated", "virtual", "cpu", "other"
  uint64_t memory_bytes = 0;     // the largest device-local heap
  uint32_t subgroup_size = 0;
  // Compute shaders may shuffle within a subgroup (subgroupShuffleDown), and its size is
  // a multiple of 32: the matmuls' 32-lane trees then run in registers.
  bool subgroup_tree = false;
  uint32_t shared_memory_bytes = 0;
  uint64_t max_storage_range = 0;       // bytes one storage binding may span
  uint64_t storage_offset_alignment = 0;
  bool usable = false;           // has what pico's shaders need (16/8-bit storage, F16, push descriptors)
  std::string unusable_reason;
};

// Every device the Vulkan loader reports, in its order. Empty when there is no loader
// or no driver; `error` then says why.
std::vector<DeviceInfo> list_devices(std::string* error = nullptr);

// The embedded shaders (shaders/*.comp, compiled to SPIR-V at build time).
enum class Shader : uint32_t {
  // Per weight type, in CMakeLists.txt's order: matmul, get_rows, the experts' matmul,
  // matmul over token tiles.
  matmul_f32,
  get_rows_f32,
  matmul_id_f32,
  matmul_tiled_f32,
  matmul_f16,
  get_rows_f16,
  matmul_id_f16,
  matmul_tiled_f16,
  matmul_bf16,
  get_rows_bf16,
  matmul_id_bf16,
  matmul_tiled_bf16,
  matmul_q8_0,
  get_rows_q8_0,
  matmul_id_q8_0,
  matmul_tiled_q8_0,
  matmul_q4_0,
  get_rows_q4_0,
  matmul_id_q4_0,
  matmul_tiled_q4_0,
  matmul_q4_1,
  get_rows_q4_1,
  matmul_id_q4_1,
  matmul_tiled_q4_1,
  matmul_q5_0,
  get_rows_q5_0,
  matmul_id_q5_0,
  matmul_tiled_q5_0,
  matmul_q5_1,
  get_rows_q5_1,
  matmul_id_q5_1,
  matmul_tiled_q5_1,
  matmul_iq4_nl,
  get_rows_iq4_nl,
  matmul_id_iq4_nl,
  matmul_tiled_iq4_nl,
  matmul_q2_K,
  get_rows_q2_K,
  matmul_id_q2_K,
  matmul_tiled_q2_K,
  matmul_q3_K,
  get_rows_q3_K,
  matmul_id_q3_K,
  matmul_tiled_q3_K,
  matmul_q4_K,
  get_rows_q4_K,
  matmul_id_q4_K,
  matmul_tiled_q4_K,
  matmul_q5_K,
  get_rows_q5_K,
  matmul_id_q5_K,
  matmul_tiled_q5_K,
  matmul_q6_K,
  get_rows_q6_K,
  matmul_id_q6_K,
  matmul_tiled_q6_K,
  rms_norm,
  add,
  mul,
  unary,
  softmax,
  rope,
  layer_norm,
  l2_norm,
  attention_f16,
  ssm_conv,
  delta_rule,
  moe_route,
  moe_combine,
  round_rows,
  store_kv_f16,
  argmax_rows,
  count,
};

class Device;

// A storage buffer in device memory. Move-only; freed with its device's help.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  size_t size() const { return size_; }
  explicit operator bool() const { return buffer_ != 0; }
  uint64_t handle() const { return buffer_; }

 private:
  friend class Device;
  void release();
  Device* device_ = nullptr;
  uint64_t buffer_ = 0;  // VkBuffer
  uint64_t memory_ = 0;  // VkDeviceMemory
  size_t size_ = 0;
  void* mapped_ = nullptr;  // host-visible memory stays mapped
  bool host_cached_ = false;  // mapped memory the host reads at memory speed (not a BAR's)
};

// A range of a buffer bound to one of a shader's bindings.
struct BufferRange {
  const Buffer* buffer = nullptr;
  size_t offset = 0;
  size_t bytes = 0;  // 0: to the end of the buffer
};

class Device {
 public:
  // Opens device `index` of list_devices(); throws std::runtime_error naming what is
  // missing (no loader, no such device, a feature the shaders need).
  static std::unique_ptr<Device> open(uint32_t index);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const DeviceInfo& info() const { return info_; }
  // Bytes of the buffers allocated now (the device's memory accounting).
  uint64_t allocated_bytes() const { return allocated_; }

  // host_visible: memory the host maps (staging), else device-local where there is some.
  Buffer allocate(size_t bytes, bool host_visible = false);
  // Host to device and back, each waiting for the recorded work first. A host-visible
  // buffer is written directly, otherwise through a staging buffer; a download reads
  // host-cached memory directly, anything else (device memory, and device memory the
  // host maps through a BAR, whose reads cross PCIe uncached: milliseconds for a row of
  // logits) through a host-cached readback buffer the device copies into, recorded
  // after the work before it (one submission).
  void upload(Buffer& to, size_t offset, const void* data, size_t bytes);
  void download(const Buffer& from, size_t offset, void* data, size_t bytes);

  // Recorded, in order with the dispatches that use the same bytes (nothing waits): host bytes into `to` (taken
  // now: small ones inside the command buffer, larger ones through staging kept until
  // the submission), and copies between buffers (no alignment asked of the offsets).
  void write(const Buffer& to, size_t offset, const void* data, size_t bytes);
  struct CopyRegion {
    size_t from = 0;
    size_t to = 0;
    size_t bytes = 0;
  };
  void copy(const Buffer& from, const Buffer& to, std::span<const CopyRegion> regions);
  // Recorded: `bytes` zero bytes into `to` at offset (both multiples of 4).
  void zero(const Buffer& to, size_t offset, size_t bytes);

  // Records a dispatch of `groups` workgroups with the buffers bound in order and the
  // push constants, after everything recorded before it that wrote what it binds or
  // bound what it writes (a barrier between; the others may run beside it). It runs
  // once submitted: by submit(), or by the flush after every kDispatchesPerFlush.
  void dispatch(Shader shader, std::span<const BufferRange> buffers, const void* push, size_t push_bytes,
                uint32_t groups_x, uint32_t groups_y = 1, uint32_t groups_z = 1);
  // Submits what was recorded and waits for it. Every kDispatchesPerFlush dispatches
  // the recording so far is submitted without a wait, so that the device runs it while
  // the host records the rest (Vulkan keeps the order of submissions to one queue, and
  // a barrier reaches back into the ones before).
  void submit();
  static constexpr uint32_t kDispatchesPerFlush = 64;
  // Dispatches recorded and submissions waited for since the device was opened, and
  // the submissions made without a wait.
  uint64_t dispatches() const { return dispatches_; }
  uint64_t submissions() const { return submissions_; }
  uint64_t flushes() const { return flushes_; }
  // Barriers recorded between dispatches (one only where a dispatch's bindings meet
  // those of the dispatches since the last one and either side writes).
  uint64_t barriers() const;

  // GPU time per shader, when the device was opened with $PICO_VULKAN_PROFILE set (and
  // its queue has timestamps; a barrier then follows every dispatch, as with
  // $PICO_VULKAN_SERIALIZE, so that none runs beside another): each dispatch's time from the end of the work before it
  // to its own end (its launch, the barrier before it and any transfer recorded in
  // between included; after a flush, the time the device waited for the host's next
  // buffer too), read back at each submit(). The table's first line gives the host's
  // time recording dispatches, waiting in submit(), and working between two waits
  // (recording included). On destruction the table goes to stderr, the costliest
  // first. Empty when not profiling.
  struct ShaderTime {
    const char* shader = nullptr;
    uint64_t dispatches = 0;
    double milliseconds = 0;
  };
  std::vector<ShaderTime> profile() const;
  bool profiling() const;

 private:
  friend class Buffer;
  struct Impl;
  Device();
  void free(Buffer& buffer);
  // A buffer in the first memory type that has all the flags of one of `wanted`, tried
  // in order (VkMemoryPropertyFlags).
  Buffer allocate_memory(size_t bytes, std::span<const uint32_t> wanted);
  std::unique_ptr<Impl> impl_;
  DeviceInfo info_;
  uint64_t allocated_ = 0;
  uint64_t dispatches_ = 0;
  uint64_t submissions_ = 0;
  uint64_t flushes_ = 0;
};

}  // namespace pico::backend::vulkan
