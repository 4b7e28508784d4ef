#include "backend/devices.hpp"

#include <stdexcept>
#include <utility>

namespace pico::backend {

DeviceListing list_compute_devices() {
  DeviceListing all;
  // CUDA and HIP join here, each a function of its own folder.
  for (DeviceListing part : {list_vulkan_devices()}) {
    for (ComputeDevice& device : part.devices) all.devices.push_back(std::move(device));
    for (std::string& note : part.notes) all.notes.push_back(std::move(note));
  }
  return all;
}

std::unique_ptr<Backend> open_backend(const std::string& backend, int device, int cpu_threads) {
  if (backend == "cpu") return make_cpu_backend(cpu_threads);
  if (backend == "vulkan") return open_vulkan_backend(device, cpu_threads);
  throw std::invalid_argument("unknown backend \"" + backend + "\" (cpu, vulkan)");
}

std::string missing_device(const std::string& backend, int device) {
  if (backend == "cpu") return "";
  if (backend != "vulkan") return "unknown backend \"" + backend + "\"";
  const DeviceListing listing = list_vulkan_devices();
  for (const ComputeDevice& d : listing.devices) {
    if (static_cast<int>(d.index) != device) continue;
    return d.usable ? "" : "vulkan device " + std::to_string(device) + " (" + d.name + "): " + d.unusable_reason;
  }
  std::string why = "no vulkan device " + std::to_string(device);
  for (const std::string& note : listing.notes) why += "; " + note;
  return why;
}

}  // namespace pico::backend
