// The Vulkan part of backend/devices.hpp: its devices, and opening one as a backend.
#include <string>

#include "backend/devices.hpp"
#include "backend/vulkan/vulkan_backend.hpp"
#include "backend/vulkan/vulkan_device.hpp"

namespace pico::backend {

DeviceListing list_vulkan_devices() {
  DeviceListing listing;
  std::string error;
  for (const vulkan::DeviceInfo& info : vulkan::list_devices(&error)) {
    ComputeDevice device;
    device.backend = "vulkan";
    device.index = info.index;
    device.name = info.name;
    device.driver = info.driver;
    device.type = info.type;
    device.memory_bytes = info.memory_bytes;
    device.limits = {{"subgroup", std::to_string(info.subgroup_size) + (info.subgroup_tree ? " (shuffles)" : "")},
                     {"shared memory", std::to_string(info.shared_memory_bytes / 1024) + " KiB"},
                     {"binding range", std::to_string(info.max_storage_range >> 20) + " MiB"},
                     {"offset alignment", std::to_string(info.storage_offset_alignment)}};
    device.usable = info.usable;
    device.unusable_reason = info.unusable_reason;
    listing.devices.push_back(std::move(device));
  }
  if (listing.devices.empty()) listing.notes.push_back("vulkan: no device (" + error + ")");
  return listing;
}

std::unique_ptr<Backend> open_vulkan_backend(int device, int cpu_threads) {
  return make_vulkan_backend(device, cpu_threads);
}

}  // namespace pico::backend
