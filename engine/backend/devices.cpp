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

}  // namespace pico::backend
