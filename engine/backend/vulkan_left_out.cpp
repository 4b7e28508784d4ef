// The Vulkan part of the device listing in a build without Vulkan (PICO_VULKAN=OFF).
#include <stdexcept>

#include "backend/devices.hpp"

namespace pico::backend {

DeviceListing list_vulkan_devices() { return {{}, {"vulkan: not in this build (configured with PICO_VULKAN=OFF)"}}; }

std::unique_ptr<Backend> open_vulkan_backend(int, int) {
  throw std::runtime_error("vulkan: not in this build (configured with PICO_VULKAN=OFF)");
}

}  // namespace pico::backend
