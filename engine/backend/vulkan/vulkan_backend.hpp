// backend.hpp's Backend over the Vulkan ops. A forward pass's activations live in
// device memory (Backend::activations(): addresses the host cannot touch, each naming a
// place in a device buffer), so the ops between a stage's input and its output record
// dispatches and copies without waiting; the device runs them when the host needs a
// result (a download, or an op left on the CPU). Weight matrices and expert stacks are
// uploaded once, at first use, and kept (keyed by their mapped address: the model
// file's mapping outlives the backend). Attention and the recurrent ops run on the CPU
// backend, because the KV cache and the recurrent state are host memory until state
// storage moves behind the backend (docs/ARCHITECTURE.md, "Device backends"); each of
// them downloads its inputs (one submission) and writes its result back; so do weight
// types the shaders lack. Ops handed host pointers (tests, tools) copy them in and out.
#pragma once

#include <memory>

#include "backend/backend.hpp"

namespace pico::backend {

// Device `device` of vulkan::list_devices(); `cpu_threads` for the ops left on the CPU.
// Throws std::runtime_error naming what is missing (no device, not usable).
std::unique_ptr<Backend> make_vulkan_backend(int device, int cpu_threads);

}  // namespace pico::backend
