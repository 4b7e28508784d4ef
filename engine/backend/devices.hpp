// The compute devices this build can run stages on, whatever backend drives them:
// what `pico inspect --devices` prints and what a worker reports in its capabilities. Each device backend folder supplies its part (vulkan/vulkan_listing.cpp);
// a backend left out of the build supplies a note saying so (CMake picks the file, so
// no backend name is tested for with the preprocessor here or in the callers).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"

namespace pico::backend {

struct ComputeDevice {
  std::string backend;  // "vulkan"
  uint32_t index = 0;   // within its backend: what `--device N` selects
  std::string name;
  std::string driver;
  std::string type;     // "discrete", "integrated", "virtual", "cpu", "other"
  uint64_t memory_bytes = 0;
  std::vector<std::pair<std::string, std::string>> limits;  // what the kernels query, as label and value
  bool usable = false;
  std::string unusable_reason;
};

struct DeviceListing {
  std::vector<ComputeDevice> devices;
  std::vector<std::string> notes;  // per backend with no device: why ("vulkan: not in this build", ...)
};

// Every backend's devices; never throws (a missing driver is a note).
DeviceListing list_compute_devices();

// The backend a stage runs on: "cpu" (`device` ignored) or "vulkan" (its device
// `device`; the ops it lacks run on `cpu_threads` CPU threads). Throws
// std::invalid_argument for an unknown name, std::runtime_error when the backend is not
// in this build or the device cannot be opened (the message says which).
std::unique_ptr<Backend> open_backend(const std::string& backend, int device, int cpu_threads);
// Why `backend` has no usable device `device` here (not in this build, no driver, no
// such device, or the device lacks what the shaders need), or empty when it has one,
// which open_backend must then open. For tests that need a device: they skip saying
// this, and fail when a device that is there does not open.
std::string missing_device(const std::string& backend, int device);

// One backend's part (each implemented in the backend's folder, or by a stub when the
// build leaves that backend out).
DeviceListing list_vulkan_devices();
std::unique_ptr<Backend> open_vulkan_backend(int device, int cpu_threads);

}  // namespace pico::backend
