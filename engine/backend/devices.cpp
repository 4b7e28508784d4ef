#include "backend/devices.hpp"

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

}  // namespace pico::backend
