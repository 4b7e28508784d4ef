#include "backend/vulkan/vulkan_device.hpp"

#include <vulkan/vulkan.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <utility>

#include "backend/vulkan/vulkan_shaders.hpp"

namespace pico::backend::vulkan {
namespace {

// A Vulkan structure zeroed but for its type tag.
template <class T>
T make(VkStructureType type) {
  T value{};
  value.sType = type;
  return value;
}

std::string result_text(VkResult r) {
  switch (r) {
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "no compatible Vulkan driver (VK_ERROR_INCOMPATIBLE_DRIVER)";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "out of host memory";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "out of device memory";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "an extension is missing";
    case VK_ERROR_FEATURE_NOT_PRESENT: return "a feature is missing";
    case VK_ERROR_DEVICE_LOST: return "device lost";
    default: return "VkResult " + std::to_string(static_cast<int>(r));
  }
}

void check(VkResult r, const char* what) {
  if (r != VK_SUCCESS) throw std::runtime_error(std::string("vulkan: ") + what + ": " + result_text(r));
}

VkInstance create_instance() {
  VkApplicationInfo app = make<VkApplicationInfo>(VK_STRUCTURE_TYPE_APPLICATION_INFO);
  app.pApplicationName = "pico";
  app.apiVersion = VK_API_VERSION_1_2;
  VkInstanceCreateInfo create = make<VkInstanceCreateInfo>(VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO);
  create.pApplicationInfo = &app;
  VkInstance instance = VK_NULL_HANDLE;
  check(vkCreateInstance(&create, nullptr, &instance), "creating an instance");
  return instance;
}

std::vector<VkPhysicalDevice> physical_devices(VkInstance instance) {
  uint32_t count = 0;
  check(vkEnumeratePhysicalDevices(instance, &count, nullptr), "listing devices");
  std::vector<VkPhysicalDevice> devices(count);
  check(vkEnumeratePhysicalDevices(instance, &count, devices.data()), "listing devices");
  devices.resize(count);
  return devices;
}

bool has_extension(VkPhysicalDevice device, const char* name) {
  uint32_t count = 0;
  vkEnumerateDeviceExtensionProperties(device, nullptr, &count, nullptr);
  std::vector<VkExtensionProperties> extensions(count);
  vkEnumerateDeviceExtensionProperties(device, nullptr, &count, extensions.data());
  return std::any_of(extensions.begin(), extensions.end(),
                     [&](const VkExtensionProperties& e) { return std::strcmp(e.extensionName, name) == 0; });
}

const char* type_name(VkPhysicalDeviceType type) {
  switch (type) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "cpu";
    default: return "other";
  }
}

// The features pico's shaders use, as the device reports them.
struct Features {
  VkPhysicalDeviceVulkan11Features v11 = make<VkPhysicalDeviceVulkan11Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES);
  VkPhysicalDeviceVulkan12Features v12 = make<VkPhysicalDeviceVulkan12Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES);
  VkPhysicalDeviceFeatures2 all = make<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
  explicit Features(VkPhysicalDevice device) {
    all.pNext = &v11;
    v11.pNext = &v12;
    vkGetPhysicalDeviceFeatures2(device, &all);
  }
  Features(const Features&) = delete;
};

DeviceInfo describe(VkPhysicalDevice device, uint32_t index) {
  VkPhysicalDeviceSubgroupProperties subgroup = make<VkPhysicalDeviceSubgroupProperties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES);
  VkPhysicalDeviceDriverProperties driver = make<VkPhysicalDeviceDriverProperties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES);
  subgroup.pNext = &driver;
  VkPhysicalDeviceProperties2 properties = make<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2);
  properties.pNext = &subgroup;
  vkGetPhysicalDeviceProperties2(device, &properties);
  VkPhysicalDeviceMemoryProperties memory;
  vkGetPhysicalDeviceMemoryProperties(device, &memory);

  DeviceInfo info;
  info.index = index;
  info.name = properties.properties.deviceName;
  info.driver = std::string(driver.driverName) + " " + driver.driverInfo;
  info.type = type_name(properties.properties.deviceType);
  for (uint32_t h = 0; h < memory.memoryHeapCount; ++h) {
    if (memory.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
      info.memory_bytes = std::max<uint64_t>(info.memory_bytes, memory.memoryHeaps[h].size);
  }
  const VkPhysicalDeviceLimits& limits = properties.properties.limits;
  info.subgroup_size = subgroup.subgroupSize;
  info.subgroup_tree = subgroup.subgroupSize >= 32 && subgroup.subgroupSize % 32 == 0 &&
                       (subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) != 0 &&
                       (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_SHUFFLE_RELATIVE_BIT) != 0 &&
                       std::getenv("PICO_VULKAN_NO_SUBGROUP_TREE") == nullptr;
  info.shared_memory_bytes = limits.maxComputeSharedMemorySize;
  info.max_storage_range = limits.maxStorageBufferRange;
  info.storage_offset_alignment = limits.minStorageBufferOffsetAlignment;

  const Features features(device);
  std::string missing;
  const auto need = [&](bool have, const char* what) {
    if (!have) missing += std::string(missing.empty() ? "" : ", ") + what;
  };
  need(features.v11.storageBuffer16BitAccess, "16-bit storage");
  need(features.v12.storageBuffer8BitAccess, "8-bit storage");
  need(features.v12.shaderFloat16, "F16 arithmetic");
  need(features.v12.shaderInt8, "int8 arithmetic");
  need(has_extension(device, VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME), VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME);
  need(limits.maxPushConstantsSize >= 128, "128 bytes of push constants");
  need(limits.maxComputeWorkGroupInvocations >= 256, "256 invocations per workgroup");
  info.usable = missing.empty();
  if (!info.usable) info.unusable_reason = "lacks " + missing;
  return info;
}

// Flags of a memory type for buffers: device-local first, host-visible when possible.
uint32_t pick_memory_type(const VkPhysicalDeviceMemoryProperties& memory, uint32_t allowed, VkMemoryPropertyFlags want) {
  for (uint32_t t = 0; t < memory.memoryTypeCount; ++t) {
    if ((allowed & (1u << t)) && (memory.memoryTypes[t].propertyFlags & want) == want) return t;
  }
  return UINT32_MAX;
}

}  // namespace

std::vector<DeviceInfo> list_devices(std::string* error) {
  std::vector<DeviceInfo> out;
  VkInstance instance = VK_NULL_HANDLE;
  try {
    instance = create_instance();
    const auto devices = physical_devices(instance);
    for (uint32_t i = 0; i < devices.size(); ++i) out.push_back(describe(devices[i], i));
    if (devices.empty() && error) *error = "the Vulkan loader reports no device";
  } catch (const std::exception& e) {
    if (error) *error = e.what();
  }
  if (instance) vkDestroyInstance(instance, nullptr);
  return out;
}

// ---- Buffer -------------------------------------------------------------------

Buffer::Buffer(Buffer&& other) noexcept { *this = std::move(other); }

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    device_ = std::exchange(other.device_, nullptr);
    buffer_ = std::exchange(other.buffer_, 0);
    memory_ = std::exchange(other.memory_, 0);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, nullptr);
    host_cached_ = std::exchange(other.host_cached_, false);
  }
  return *this;
}

Buffer::~Buffer() { release(); }

void Buffer::release() {
  if (device_ && buffer_) device_->free(*this);
  device_ = nullptr;
  buffer_ = memory_ = 0;
  size_ = 0;
  mapped_ = nullptr;
  host_cached_ = false;
}

// ---- Device -------------------------------------------------------------------

struct Device::Impl {
  VkInstance instance = VK_NULL_HANDLE;
  VkPhysicalDevice physical = VK_NULL_HANDLE;
  VkPhysicalDeviceMemoryProperties memory{};
  VkDevice device = VK_NULL_HANDLE;
  VkQueue queue = VK_NULL_HANDLE;
  uint32_t queue_family = 0;
  VkCommandPool pool = VK_NULL_HANDLE;
  VkCommandBuffer commands = VK_NULL_HANDLE;  // the one being recorded
  VkFence fence = VK_NULL_HANDLE;
  bool recording = false;
  // Command buffers submitted without a wait (flush()) since the last submit(), and
  // spare ones for the next recordings.
  std::vector<VkCommandBuffer> flushed;
  std::vector<VkCommandBuffer> spare_commands;
  uint32_t dispatches_in_buffer = 0;
  // Recorded or submitted work that no wait has seen end yet.
  bool busy() const { return recording || !flushed.empty(); }
  PFN_vkCmdPushDescriptorSetKHR push_descriptor_set = nullptr;
  struct Pipeline {
    VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
    VkPipelineLayout layout = VK_NULL_HANDLE;
    VkPipeline pipeline = VK_NULL_HANDLE;
    VkShaderModule module = VK_NULL_HANDLE;
    uint32_t bindings = 0;
    uint32_t written = 0;  // written_bindings()
  };
  std::array<Pipeline, static_cast<size_t>(Shader::count)> pipelines{};
  Buffer staging;
  Buffer readback;  // host-cached where the device has such memory: download()'s
  bool always_readback = false;  // $PICO_VULKAN_READBACK: every download through it (tests)
  std::vector<Buffer> pending_staging;  // write()'s until submitted, then spare for the next ones
  std::vector<Buffer> spare_staging;
  std::vector<Buffer> retired;  // buffers released while recording, until the recorded work has run
  // $PICO_VULKAN_PROFILE: a timestamp at the start of each command buffer and after
  // each dispatch (up to kProfileQueries a submission); the shader of each interval.
  static constexpr uint32_t kProfileQueries = 16384;
  VkQueryPool queries = VK_NULL_HANDLE;
  double nanoseconds_per_tick = 0;
  uint32_t queries_used = 0;
  std::vector<Shader> timed;
  std::array<ShaderTime, static_cast<size_t>(Shader::count)> times{};
  // When profiling: the host's time recording dispatches and waiting for the device.
  double recording_ms = 0, waiting_ms = 0, between_ms = 0, submitting_ms = 0, transfers_ms = 0;
  // Adds the time since `since` to `total` when profiling.
  struct Timer {
    const bool on;
    double& total;
    const std::chrono::steady_clock::time_point since;
    Timer(bool profiling, double& into)
        : on(profiling), total(into), since(on ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point()) {}
    ~Timer() {
      if (on) total += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count();
    }
    Timer(const Timer&) = delete;
  };
  std::chrono::steady_clock::time_point last_wait_end{};  // none yet: the epoch

  Pipeline& pipeline(Device& owner, Shader shader);
  void begin();
  // Submits the command buffer being recorded without waiting (the device starts on it
  // while the host records the next).
  void flush();
  // The buffer ranges the dispatches and transfers since the last barrier used, and
  // whether each wrote: the next one waits for those before it only where what it uses
  // meets one of them and either side writes (Q, K and V's matmuls run side by side, as
  // do a layer's other independent ops); a submission waits for all of them.
  struct Access {
    VkBuffer buffer = VK_NULL_HANDLE;
    size_t offset = 0, bytes = 0;
    bool written = false;
  };
  std::vector<Access> unsynchronized;
  // A barrier after every dispatch: when profiling (each timestamp then times its own
  // dispatch) or with $PICO_VULKAN_SERIALIZE (to compare).
  bool serialize = false;
  uint64_t barriers = 0;
  // Records a barrier after the work in `unsynchronized` (none if it is empty): the
  // dispatches and transfers after it, and with `host_stage` the host's reads, see what
  // it wrote.
  void barrier(bool host_stage = false);
  // Before recording work that uses `accesses`: a barrier if they meet the unsynchronized
  // ones; then they are unsynchronized too (followed by a barrier when serializing).
  void order(std::span<const Access> accesses);
  void ordered();
};

Device::Device() : impl_(std::make_unique<Impl>()) {}

std::unique_ptr<Device> Device::open(uint32_t index) {
  std::unique_ptr<Device> d(new Device());
  Impl& m = *d->impl_;
  m.instance = create_instance();
  const auto devices = physical_devices(m.instance);
  if (index >= devices.size())
    throw std::runtime_error("vulkan: no device " + std::to_string(index) + " (the loader reports " +
                             std::to_string(devices.size()) + ")");
  m.physical = devices[index];
  d->info_ = describe(m.physical, index);
  if (!d->info_.usable) throw std::runtime_error("vulkan: device " + d->info_.name + " " + d->info_.unusable_reason);
  vkGetPhysicalDeviceMemoryProperties(m.physical, &m.memory);

  uint32_t families = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(m.physical, &families, nullptr);
  std::vector<VkQueueFamilyProperties> family(families);
  vkGetPhysicalDeviceQueueFamilyProperties(m.physical, &families, family.data());
  m.queue_family = UINT32_MAX;
  for (uint32_t f = 0; f < families && m.queue_family == UINT32_MAX; ++f) {
    if (family[f].queueFlags & VK_QUEUE_COMPUTE_BIT) m.queue_family = f;
  }
  if (m.queue_family == UINT32_MAX) throw std::runtime_error("vulkan: device " + d->info_.name + " has no compute queue");

  const float priority = 1.0f;
  VkDeviceQueueCreateInfo queue = make<VkDeviceQueueCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO);
  queue.queueFamilyIndex = m.queue_family;
  queue.queueCount = 1;
  queue.pQueuePriorities = &priority;
  VkPhysicalDeviceVulkan11Features v11 = make<VkPhysicalDeviceVulkan11Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES);
  v11.storageBuffer16BitAccess = VK_TRUE;
  VkPhysicalDeviceVulkan12Features v12 = make<VkPhysicalDeviceVulkan12Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES);
  v12.storageBuffer8BitAccess = VK_TRUE;
  v12.shaderFloat16 = VK_TRUE;
  v12.shaderInt8 = VK_TRUE;
  v11.pNext = &v12;
  const char* extensions[] = {VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME};
  VkDeviceCreateInfo create = make<VkDeviceCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO);
  create.pNext = &v11;
  create.queueCreateInfoCount = 1;
  create.pQueueCreateInfos = &queue;
  create.enabledExtensionCount = 1;
  create.ppEnabledExtensionNames = extensions;
  check(vkCreateDevice(m.physical, &create, nullptr, &m.device), "creating the device");
  vkGetDeviceQueue(m.device, m.queue_family, 0, &m.queue);
  m.push_descriptor_set =
      reinterpret_cast<PFN_vkCmdPushDescriptorSetKHR>(vkGetDeviceProcAddr(m.device, "vkCmdPushDescriptorSetKHR"));
  if (!m.push_descriptor_set) throw std::runtime_error("vulkan: vkCmdPushDescriptorSetKHR is missing");

  VkCommandPoolCreateInfo pool = make<VkCommandPoolCreateInfo>(VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO);
  pool.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pool.queueFamilyIndex = m.queue_family;
  check(vkCreateCommandPool(m.device, &pool, nullptr, &m.pool), "creating a command pool");
  VkCommandBufferAllocateInfo allocate = make<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
  allocate.commandPool = m.pool;
  allocate.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  allocate.commandBufferCount = 1;
  check(vkAllocateCommandBuffers(m.device, &allocate, &m.commands), "allocating a command buffer");
  m.spare_commands.push_back(m.commands);
  m.commands = VK_NULL_HANDLE;
  VkFenceCreateInfo fence = make<VkFenceCreateInfo>(VK_STRUCTURE_TYPE_FENCE_CREATE_INFO);
  check(vkCreateFence(m.device, &fence, nullptr, &m.fence), "creating a fence");
  m.always_readback = std::getenv("PICO_VULKAN_READBACK") != nullptr;
  const char* profile = std::getenv("PICO_VULKAN_PROFILE");
  if (profile && *profile && family[m.queue_family].timestampValidBits > 0) {
    VkQueryPoolCreateInfo pool_info = make<VkQueryPoolCreateInfo>(VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO);
    pool_info.queryType = VK_QUERY_TYPE_TIMESTAMP;
    pool_info.queryCount = Impl::kProfileQueries;
    check(vkCreateQueryPool(m.device, &pool_info, nullptr, &m.queries), "creating a timestamp query pool");
    VkPhysicalDeviceProperties properties;
    vkGetPhysicalDeviceProperties(m.physical, &properties);
    m.nanoseconds_per_tick = properties.limits.timestampPeriod;
  }
  m.serialize = m.queries != VK_NULL_HANDLE || std::getenv("PICO_VULKAN_SERIALIZE") != nullptr;
  return d;
}

Device::~Device() {
  Impl& m = *impl_;
  m.recording = false;  // work never submitted is dropped: every buffer below is freed now
  if (m.device) vkDeviceWaitIdle(m.device);
  if (m.queries) {
    std::fprintf(stderr,
                 "vulkan profile (%s, a barrier after each dispatch): %llu dispatches in %llu submissions (%llu "
                 "without a wait); host: %.3f ms "
                 "recording dispatches, %.3f ms recording transfers, %.3f ms ending and submitting command buffers, "
                 "%.3f ms waiting for the device, %.3f ms from a wait's end to the next wait (all of these but the "
                 "waits included)\n",
                 info_.name.c_str(), static_cast<unsigned long long>(dispatches_),
                 static_cast<unsigned long long>(submissions_ + flushes_), static_cast<unsigned long long>(flushes_),
                 m.recording_ms, m.transfers_ms, m.submitting_ms, m.waiting_ms, m.between_ms);
    std::fprintf(stderr, "vulkan profile (%s): shader, dispatches, GPU ms, us per dispatch\n", info_.name.c_str());
    for (const ShaderTime& t : profile())
      std::fprintf(stderr, "  %-22s %10llu %12.3f %10.2f\n", t.shader, static_cast<unsigned long long>(t.dispatches),
                   t.milliseconds, 1000.0 * t.milliseconds / static_cast<double>(t.dispatches));
    vkDestroyQueryPool(m.device, m.queries, nullptr);
  }
  m.staging = Buffer();
  m.readback = Buffer();
  m.pending_staging.clear();
  m.spare_staging.clear();
  m.retired.clear();
  for (auto& p : m.pipelines) {
    if (p.pipeline) vkDestroyPipeline(m.device, p.pipeline, nullptr);
    if (p.layout) vkDestroyPipelineLayout(m.device, p.layout, nullptr);
    if (p.set_layout) vkDestroyDescriptorSetLayout(m.device, p.set_layout, nullptr);
    if (p.module) vkDestroyShaderModule(m.device, p.module, nullptr);
  }
  if (m.fence) vkDestroyFence(m.device, m.fence, nullptr);
  if (m.pool) vkDestroyCommandPool(m.device, m.pool, nullptr);
  if (m.device) vkDestroyDevice(m.device, nullptr);
  if (m.instance) vkDestroyInstance(m.instance, nullptr);
}

Buffer Device::allocate(size_t bytes, bool host_visible) {
  // Device-local and host-visible (UMA, resizable BAR) when there is such a type, else
  // device-local (copies through staging), else whatever is host-visible.
  const uint32_t local = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
  const uint32_t visible = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  if (host_visible) {
    const uint32_t wanted[] = {local | visible, visible};
    return allocate_memory(bytes, wanted);
  }
  const uint32_t wanted[] = {local | visible, local, visible};
  return allocate_memory(bytes, wanted);
}

Buffer Device::allocate_memory(size_t bytes, std::span<const uint32_t> wanted) {
  Impl& m = *impl_;
  Buffer b;
  bytes = std::max<size_t>(bytes, 4);
  VkBufferCreateInfo create = make<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
  create.size = bytes;
  create.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  create.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VkBuffer buffer = VK_NULL_HANDLE;
  check(vkCreateBuffer(m.device, &create, nullptr, &buffer), "creating a buffer");
  VkMemoryRequirements needs;
  vkGetBufferMemoryRequirements(m.device, buffer, &needs);
  uint32_t type = UINT32_MAX;
  for (size_t i = 0; i < wanted.size() && type == UINT32_MAX; ++i) type = pick_memory_type(m.memory, needs.memoryTypeBits, wanted[i]);
  if (type == UINT32_MAX) {
    vkDestroyBuffer(m.device, buffer, nullptr);
    throw std::runtime_error("vulkan: no memory type for a storage buffer");
  }
  VkMemoryAllocateInfo allocate = make<VkMemoryAllocateInfo>(VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO);
  allocate.allocationSize = needs.size;
  allocate.memoryTypeIndex = type;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  const VkResult r = vkAllocateMemory(m.device, &allocate, nullptr, &memory);
  if (r != VK_SUCCESS) {
    vkDestroyBuffer(m.device, buffer, nullptr);
    check(r, ("allocating " + std::to_string(bytes) + " bytes").c_str());
  }
  check(vkBindBufferMemory(m.device, buffer, memory, 0), "binding buffer memory");
  const VkMemoryPropertyFlags flags = m.memory.memoryTypes[type].propertyFlags;
  const VkMemoryPropertyFlags visible = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  if ((flags & visible) == visible) {
    check(vkMapMemory(m.device, memory, 0, VK_WHOLE_SIZE, 0, &b.mapped_), "mapping a buffer");
    b.host_cached_ = (flags & VK_MEMORY_PROPERTY_HOST_CACHED_BIT) != 0;
  }
  b.device_ = this;
  b.buffer_ = reinterpret_cast<uint64_t>(buffer);
  b.memory_ = reinterpret_cast<uint64_t>(memory);
  b.size_ = bytes;
  allocated_ += bytes;
  return b;
}

void Device::free(Buffer& b) {
  Impl& m = *impl_;
  if (m.busy()) {
    // Recorded work may still use it: destroyed after the submission, not freed under
    // it, and without a wait now (a step's scratch that grows, a pool that doubles).
    // Moved whole (b's release() finds it empty), so no field is left behind.
    m.retired.push_back(std::move(b));
    return;
  }
  if (b.mapped_) vkUnmapMemory(m.device, reinterpret_cast<VkDeviceMemory>(b.memory_));
  vkDestroyBuffer(m.device, reinterpret_cast<VkBuffer>(b.buffer_), nullptr);
  vkFreeMemory(m.device, reinterpret_cast<VkDeviceMemory>(b.memory_), nullptr);
  allocated_ -= b.size_;
}

void Device::upload(Buffer& to, size_t offset, const void* data, size_t bytes) {
  if (offset > to.size_ || bytes > to.size_ - offset) throw std::out_of_range("vulkan: upload past a buffer's end");
  Impl& m = *impl_;
  if (m.busy()) submit();
  if (to.mapped_) {
    std::memcpy(static_cast<uint8_t*>(to.mapped_) + offset, data, bytes);
    return;
  }
  constexpr size_t kStaging = size_t{64} << 20;
  if (!m.staging) m.staging = allocate(kStaging, true);
  for (size_t done = 0; done < bytes; done += kStaging) {
    const size_t n = std::min(kStaging, bytes - done);
    std::memcpy(m.staging.mapped_, static_cast<const uint8_t*>(data) + done, n);
    m.begin();  // nothing before it: submitted above
    // Tracked, so that the submission's barrier makes the copy visible to later work.
    const Impl::Access written{reinterpret_cast<VkBuffer>(to.buffer_), offset + done, n, true};
    m.order({&written, 1});
    const VkBufferCopy region{0, offset + done, n};
    vkCmdCopyBuffer(m.commands, reinterpret_cast<VkBuffer>(m.staging.buffer_), reinterpret_cast<VkBuffer>(to.buffer_), 1,
                    &region);
    submit();
  }
}

void Device::download(const Buffer& from, size_t offset, void* data, size_t bytes) {
  if (offset > from.size_ || bytes > from.size_ - offset) throw std::out_of_range("vulkan: download past a buffer's end");
  Impl& m = *impl_;
  if (from.mapped_ && from.host_cached_ && !m.always_readback) {
    if (m.busy()) submit();
    std::memcpy(data, static_cast<const uint8_t*>(from.mapped_) + offset, bytes);
    return;
  }
  constexpr size_t kReadback = size_t{64} << 20;
  if (m.readback.size() < std::min(bytes, kReadback)) {
    const uint32_t visible = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    const uint32_t wanted[] = {visible | VK_MEMORY_PROPERTY_HOST_CACHED_BIT, visible};
    m.readback = allocate_memory(std::min(std::max(bytes, size_t{1} << 20), kReadback), wanted);
  }
  for (size_t done = 0; done < bytes; done += m.readback.size()) {
    const size_t n = std::min(m.readback.size(), bytes - done);
    m.begin();
    m.barrier();  // the copy after all the work before it (a submission follows)
    const VkBufferCopy region{offset + done, 0, n};
    vkCmdCopyBuffer(m.commands, reinterpret_cast<VkBuffer>(from.buffer_), reinterpret_cast<VkBuffer>(m.readback.buffer_),
                    1, &region);
    VkMemoryBarrier barrier = make<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
    barrier.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
    barrier.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
    vkCmdPipelineBarrier(m.commands, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &barrier, 0, nullptr,
                         0, nullptr);
    submit();
    std::memcpy(static_cast<uint8_t*>(data) + done, m.readback.mapped_, n);
  }
}

void Device::write(const Buffer& to, size_t offset, const void* data, size_t bytes) {
  if (offset > to.size_ || bytes > to.size_ - offset) throw std::out_of_range("vulkan: write past a buffer's end");
  if (bytes == 0) return;
  Impl& m = *impl_;
  const Impl::Timer timer(m.queries != VK_NULL_HANDLE, m.transfers_ms);
  m.begin();
  const Impl::Access written{reinterpret_cast<VkBuffer>(to.buffer_), offset, bytes, true};
  m.order({&written, 1});
  // vkCmdUpdateBuffer keeps up to 64 KiB in the command buffer, in whole words.
  if (bytes <= 65536 && bytes % 4 == 0 && offset % 4 == 0) {
    vkCmdUpdateBuffer(m.commands, reinterpret_cast<VkBuffer>(to.buffer_), offset, bytes, data);
  } else {
    auto spare = std::find_if(m.spare_staging.begin(), m.spare_staging.end(),
                              [&](const Buffer& b) { return b.size() >= bytes; });
    if (spare == m.spare_staging.end()) {
      m.pending_staging.push_back(allocate(bytes, true));
    } else {
      m.pending_staging.push_back(std::move(*spare));
      m.spare_staging.erase(spare);
    }
    Buffer& staging = m.pending_staging.back();
    std::memcpy(staging.mapped_, data, bytes);
    const VkBufferCopy region{0, offset, bytes};
    vkCmdCopyBuffer(m.commands, reinterpret_cast<VkBuffer>(staging.buffer_), reinterpret_cast<VkBuffer>(to.buffer_), 1,
                    &region);
  }
  m.ordered();
}

void Device::copy(const Buffer& from, const Buffer& to, std::span<const CopyRegion> regions) {
  if (regions.empty()) return;
  std::vector<VkBufferCopy> copies(regions.size());
  for (size_t i = 0; i < regions.size(); ++i) {
    const CopyRegion& r = regions[i];
    if (r.from > from.size_ || r.bytes > from.size_ - r.from || r.to > to.size_ || r.bytes > to.size_ - r.to)
      throw std::out_of_range("vulkan: a copy past a buffer's end");
    copies[i] = {r.from, r.to, r.bytes};
  }
  Impl& m = *impl_;
  const Impl::Timer timer(m.queries != VK_NULL_HANDLE, m.transfers_ms);
  m.begin();
  std::vector<Impl::Access> accesses;
  for (const CopyRegion& r : regions) {
    accesses.push_back({reinterpret_cast<VkBuffer>(from.buffer_), r.from, r.bytes, false});
    accesses.push_back({reinterpret_cast<VkBuffer>(to.buffer_), r.to, r.bytes, true});
  }
  m.order(accesses);
  vkCmdCopyBuffer(m.commands, reinterpret_cast<VkBuffer>(from.buffer_), reinterpret_cast<VkBuffer>(to.buffer_),
                  static_cast<uint32_t>(copies.size()), copies.data());
  m.ordered();
}

void Device::zero(const Buffer& to, size_t offset, size_t bytes) {
  if (bytes == 0) return;
  if (offset % 4 != 0 || bytes % 4 != 0) throw std::invalid_argument("vulkan: zero: an offset or size not in words");
  if (offset > to.size_ || bytes > to.size_ - offset) throw std::out_of_range("vulkan: zero: past a buffer's end");
  Impl& m = *impl_;
  m.begin();
  const Impl::Access written{reinterpret_cast<VkBuffer>(to.buffer_), offset, bytes, true};
  m.order({&written, 1});
  vkCmdFillBuffer(m.commands, reinterpret_cast<VkBuffer>(to.buffer_), offset, bytes, 0);
  m.ordered();
}

void Device::Impl::barrier(bool host_stage) {
  if (unsynchronized.empty()) return;
  VkMemoryBarrier barrier = make<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
  barrier.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  barrier.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                          VK_ACCESS_TRANSFER_WRITE_BIT | (host_stage ? VK_ACCESS_HOST_READ_BIT : 0);
  vkCmdPipelineBarrier(commands, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                       VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT |
                           (host_stage ? VK_PIPELINE_STAGE_HOST_BIT : 0),
                       0, 1, &barrier, 0, nullptr, 0, nullptr);
  unsynchronized.clear();
  ++barriers;
}

void Device::Impl::order(std::span<const Access> accesses) {
  const bool meets = std::any_of(accesses.begin(), accesses.end(), [&](const Access& a) {
    return std::any_of(unsynchronized.begin(), unsynchronized.end(), [&](const Access& b) {
      return a.buffer == b.buffer && a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes &&
             (a.written || b.written);
    });
  });
  if (meets) barrier();
  unsynchronized.insert(unsynchronized.end(), accesses.begin(), accesses.end());
}

// After recording what order() was given: a barrier when serializing.
void Device::Impl::ordered() {
  if (serialize) barrier();
}

void Device::Impl::begin() {
  if (recording) return;
  if (spare_commands.empty()) {
    VkCommandBufferAllocateInfo allocate = make<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
    allocate.commandPool = pool;
    allocate.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    allocate.commandBufferCount = 1;
    VkCommandBuffer more = VK_NULL_HANDLE;
    check(vkAllocateCommandBuffers(device, &allocate, &more), "allocating a command buffer");
    spare_commands.push_back(more);
  }
  commands = spare_commands.back();
  spare_commands.pop_back();
  dispatches_in_buffer = 0;
  VkCommandBufferBeginInfo begin = make<VkCommandBufferBeginInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO);
  begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  check(vkBeginCommandBuffer(commands, &begin), "beginning a command buffer");
  recording = true;
  if (queries && flushed.empty()) {  // timestamps count from the first buffer after a wait
    vkCmdResetQueryPool(commands, queries, 0, kProfileQueries);
    vkCmdWriteTimestamp(commands, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, queries, 0);
    queries_used = 1;
    timed.clear();
  }
}

Device::Impl::Pipeline& Device::Impl::pipeline(Device& owner, Shader shader) {
  Pipeline& p = pipelines[static_cast<size_t>(shader)];
  if (p.pipeline) return p;
  const ShaderCode code = shader_code(shader);
  p.bindings = code.bindings;
  if (p.bindings > kMaxBindings)
    throw std::logic_error("vulkan: shader " + std::string(shader_name(shader)) + " binds over " + std::to_string(kMaxBindings) + " buffers");
  p.written = written_bindings(code.words);
  VkShaderModuleCreateInfo module = make<VkShaderModuleCreateInfo>(VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO);
  module.codeSize = code.words.size() * sizeof(uint32_t);
  module.pCode = code.words.data();
  check(vkCreateShaderModule(device, &module, nullptr, &p.module), "creating a shader module");
  std::vector<VkDescriptorSetLayoutBinding> bindings(code.bindings);
  for (uint32_t i = 0; i < code.bindings; ++i) {
    bindings[i].binding = i;
    bindings[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    bindings[i].descriptorCount = 1;
    bindings[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
  }
  VkDescriptorSetLayoutCreateInfo set = make<VkDescriptorSetLayoutCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO);
  set.flags = VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR;
  set.bindingCount = code.bindings;
  set.pBindings = bindings.data();
  check(vkCreateDescriptorSetLayout(device, &set, nullptr, &p.set_layout), "creating a descriptor set layout");
  const VkPushConstantRange push{VK_SHADER_STAGE_COMPUTE_BIT, 0, kPushConstantBytes};
  VkPipelineLayoutCreateInfo layout = make<VkPipelineLayoutCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO);
  layout.setLayoutCount = 1;
  layout.pSetLayouts = &p.set_layout;
  layout.pushConstantRangeCount = 1;
  layout.pPushConstantRanges = &push;
  check(vkCreatePipelineLayout(device, &layout, nullptr, &p.layout), "creating a pipeline layout");
  // The workgroup size is a specialization constant (id 0): the shaders reduce in a
  // fixed tree over it, the same on every device.
  // Constant 1: the matmuls' 32-lane trees through subgroup shuffles (the same sums).
  const std::array<uint32_t, 2> constants{workgroup_size(shader), owner.info().subgroup_tree ? 1u : 0u};
  const std::array<VkSpecializationMapEntry, 2> entries{{{0, 0, sizeof(uint32_t)}, {1, sizeof(uint32_t), sizeof(uint32_t)}}};
  VkSpecializationInfo specialization{2, entries.data(), sizeof constants, constants.data()};
  VkComputePipelineCreateInfo create = make<VkComputePipelineCreateInfo>(VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO);
  create.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
  create.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  create.stage.module = p.module;
  create.stage.pName = "main";
  create.stage.pSpecializationInfo = &specialization;
  create.layout = p.layout;
  check(vkCreateComputePipelines(device, VK_NULL_HANDLE, 1, &create, nullptr, &p.pipeline), "creating a pipeline");
  return p;
}

void Device::dispatch(Shader shader, std::span<const BufferRange> buffers, const void* push, size_t push_bytes,
                      uint32_t groups_x, uint32_t groups_y, uint32_t groups_z) {
  Impl& m = *impl_;
  Impl::Pipeline& p = m.pipeline(*this, shader);
  if (buffers.size() != p.bindings)
    throw std::invalid_argument("vulkan: shader " + std::string(shader_name(shader)) + " takes " +
                                std::to_string(p.bindings) + " buffers, given " + std::to_string(buffers.size()));
  if (push_bytes > kPushConstantBytes) throw std::invalid_argument("vulkan: push constants over 128 bytes");
  if (groups_x == 0 || groups_y == 0 || groups_z == 0) return;
  std::optional<Impl::Timer> recording(std::in_place, m.queries != VK_NULL_HANDLE, m.recording_ms);
  m.begin();
  // On the stack: a step records hundreds of dispatches.
  std::array<VkDescriptorBufferInfo, kMaxBindings> infos{};
  std::array<VkWriteDescriptorSet, kMaxBindings> writes{};
  std::array<Impl::Access, kMaxBindings> accesses{};
  for (size_t i = 0; i < buffers.size(); ++i) {
    const BufferRange& r = buffers[i];
    if (!r.buffer || !*r.buffer) throw std::invalid_argument("vulkan: an unbound buffer");
    if (r.offset > r.buffer->size()) throw std::invalid_argument("vulkan: a binding starts past its buffer's end");
    const size_t bytes = r.bytes ? r.bytes : r.buffer->size() - r.offset;
    if (bytes > r.buffer->size() - r.offset) throw std::invalid_argument("vulkan: a binding runs past its buffer's end");
    if (r.offset % std::max<uint64_t>(info_.storage_offset_alignment, 1) != 0)
      throw std::invalid_argument("vulkan: a binding offset the device does not accept");
    if (bytes > info_.max_storage_range)
      throw std::invalid_argument("vulkan: a binding of " + std::to_string(bytes) + " bytes, over the device's " +
                                  std::to_string(info_.max_storage_range));
    infos[i] = {reinterpret_cast<VkBuffer>(r.buffer->handle()), r.offset, bytes};
    accesses[i] = {infos[i].buffer, r.offset, bytes, ((p.written >> i) & 1u) != 0};
    writes[i] = make<VkWriteDescriptorSet>(VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET);
    writes[i].dstBinding = static_cast<uint32_t>(i);
    writes[i].descriptorCount = 1;
    writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    writes[i].pBufferInfo = &infos[i];
  }
  m.order(std::span(accesses.data(), buffers.size()));
  vkCmdBindPipeline(m.commands, VK_PIPELINE_BIND_POINT_COMPUTE, p.pipeline);
  m.push_descriptor_set(m.commands, VK_PIPELINE_BIND_POINT_COMPUTE, p.layout, 0, static_cast<uint32_t>(buffers.size()),
                        writes.data());
  std::array<uint8_t, kPushConstantBytes> constants{};
  if (push_bytes) std::memcpy(constants.data(), push, push_bytes);
  vkCmdPushConstants(m.commands, p.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, kPushConstantBytes, constants.data());
  vkCmdDispatch(m.commands, groups_x, groups_y, groups_z);
  if (m.queries && m.queries_used < Impl::kProfileQueries) {
    vkCmdWriteTimestamp(m.commands, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, m.queries, m.queries_used++);
    m.timed.push_back(shader);
  }
  m.ordered();
  ++dispatches_;
  recording.reset();  // the flush is timed as submitting
  if (++m.dispatches_in_buffer >= kDispatchesPerFlush) {
    m.flush();
    ++flushes_;
  }
}

void Device::Impl::flush() {
  if (!recording) return;
  const Timer timer(queries != VK_NULL_HANDLE, submitting_ms);
  recording = false;
  check(vkEndCommandBuffer(commands), "ending a command buffer");
  VkSubmitInfo submit = make<VkSubmitInfo>(VK_STRUCTURE_TYPE_SUBMIT_INFO);
  submit.commandBufferCount = 1;
  submit.pCommandBuffers = &commands;
  check(vkQueueSubmit(queue, 1, &submit, VK_NULL_HANDLE), "submitting");
  flushed.push_back(commands);
  commands = VK_NULL_HANDLE;
}

void Device::submit() {
  Impl& m = *impl_;
  if (!m.busy()) return;
  // The fence goes with a command buffer, empty when everything went by flushes (an
  // empty submission's fence crashed lavapipe 22.3).
  std::optional<Impl::Timer> submitting(std::in_place, m.queries != VK_NULL_HANDLE, m.submitting_ms);
  m.begin();
  m.barrier(true);  // the host reads what the work wrote once the fence says so
  m.recording = false;
  check(vkEndCommandBuffer(m.commands), "ending a command buffer");
  VkSubmitInfo submit = make<VkSubmitInfo>(VK_STRUCTURE_TYPE_SUBMIT_INFO);
  submit.commandBufferCount = 1;
  m.flushed.push_back(m.commands);
  m.commands = VK_NULL_HANDLE;
  submit.pCommandBuffers = &m.flushed.back();
  check(vkQueueSubmit(m.queue, 1, &submit, m.fence), "submitting");
  submitting.reset();
  const auto started = m.queries ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
  check(vkWaitForFences(m.device, 1, &m.fence, VK_TRUE, UINT64_MAX), "waiting for the device");
  if (m.queries) {
    const auto now = std::chrono::steady_clock::now();
    m.waiting_ms += std::chrono::duration<double, std::milli>(now - started).count();
    if (m.last_wait_end != std::chrono::steady_clock::time_point())
      m.between_ms += std::chrono::duration<double, std::milli>(started - m.last_wait_end).count();
    m.last_wait_end = now;
  }
  if (m.queries && m.queries_used > 1) {
    std::vector<uint64_t> ticks(m.queries_used);
    check(vkGetQueryPoolResults(m.device, m.queries, 0, m.queries_used, ticks.size() * sizeof(uint64_t), ticks.data(),
                                sizeof(uint64_t), VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT),
          "reading timestamps");
    for (size_t i = 0; i < m.timed.size(); ++i) {
      ShaderTime& t = m.times[static_cast<size_t>(m.timed[i])];
      ++t.dispatches;
      t.milliseconds += static_cast<double>(ticks[i + 1] - ticks[i]) * m.nanoseconds_per_tick * 1e-6;
    }
  }
  check(vkResetFences(m.device, 1, &m.fence), "resetting a fence");
  for (VkCommandBuffer c : m.flushed) {
    check(vkResetCommandBuffer(c, 0), "resetting a command buffer");
    m.spare_commands.push_back(c);
  }
  m.flushed.clear();
  // Kept for the next writes (at most a few: a step's largest host results).
  for (Buffer& b : m.pending_staging) m.spare_staging.push_back(std::move(b));
  m.pending_staging.clear();
  if (m.spare_staging.size() > 8) m.spare_staging.erase(m.spare_staging.begin(), m.spare_staging.end() - 8);
  m.retired.clear();
  ++submissions_;
}

uint64_t Device::barriers() const { return impl_->barriers; }

bool Device::profiling() const { return impl_->queries != VK_NULL_HANDLE; }

std::vector<Device::ShaderTime> Device::profile() const {
  std::vector<ShaderTime> out;
  for (size_t i = 0; i < impl_->times.size(); ++i) {
    if (impl_->times[i].dispatches == 0) continue;
    out.push_back(impl_->times[i]);
    out.back().shader = shader_name(static_cast<Shader>(i));
  }
  std::sort(out.begin(), out.end(), [](const ShaderTime& a, const ShaderTime& b) { return a.milliseconds > b.milliseconds; });
  return out;
}

}  // namespace pico::backend::vulkan
