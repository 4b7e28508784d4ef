// The SPIR-V of shaders/*.comp, compiled by glslc at build time and embedded (the
// generated vulkan_shaders.cpp), with what a pipeline needs to know of each.
#pragma once

#include <cstdint>
#include <span>

#include "backend/vulkan/vulkan_device.hpp"

namespace pico::backend::vulkan {

// Every shader declares 128 bytes of push constants at most (Vulkan's guaranteed
// minimum) and a workgroup of WG invocations (specialization constant 0), a power of
// two: its reductions run over a fixed tree of WG leaves on every device.
inline constexpr uint32_t kPushConstantBytes = 128;
inline constexpr uint32_t kWorkgroupSize = 64;

struct ShaderCode {
  std::span<const uint32_t> words;
  uint32_t bindings = 0;  // storage buffers 0 .. bindings - 1
};

ShaderCode shader_code(Shader shader);
const char* shader_name(Shader shader);

}  // namespace pico::backend::vulkan
