// backend.hpp's Backend over the Vulkan ops, op by op: each call's activations go to
// the device and its results come back before it returns; weight matrices and expert
// stacks are uploaded once, at first use, and kept (keyed by their mapped address:
// the model file's mapping outlives the backend). Attention and the recurrent ops run
// on the CPU backend, because the KV cache and the recurrent state are host memory
// until state storage moves behind the backend (docs/ARCHITECTURE.md, "Device
// backends"); so do weight types the shaders lack.
//
// This is how the whole model runs through the shaders today (conformance against
// llama.cpp, `--backend vulkan`); it is not yet the device-resident stage, which keeps
// activations and state on the device for a whole step.
#pragma once

#include <memory>

#include "backend/backend.hpp"

namespace pico::backend {

// Device `device` of vulkan::list_devices(); `cpu_threads` for the ops left on the CPU.
// Throws std::runtime_error naming what is missing (no device, not usable).
std::unique_ptr<Backend> make_vulkan_backend(int device, int cpu_threads);

}  // namespace pico::backend
