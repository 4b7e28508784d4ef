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
// Storage buffers a shader binds at most (delta_rule's 8).
inline constexpr uint32_t kMaxBindings = 8;
inline constexpr uint32_t kWorkgroupSize = 64;
// RMSNorm and LayerNorm take a row per workgroup, of 256 (every device pico opens has
// them): a decode step's single row of 2048 is loaded in two rounds, not eight.
inline constexpr uint32_t kRowWorkgroupSize = 256;
inline uint32_t workgroup_size(Shader shader) {
  return shader == Shader::rms_norm || shader == Shader::layer_norm ? kRowWorkgroupSize : kWorkgroupSize;
}

struct ShaderCode {
  std::span<const uint32_t> words;
  uint32_t bindings = 0;  // storage buffers 0 .. bindings - 1
};

ShaderCode shader_code(Shader shader);

// The bindings (bit i: binding i) a shader may write: those not declared `readonly`,
// read from its SPIR-V's decorations. The device puts a barrier only between dispatches
// whose bindings meet where one of them writes.
uint32_t written_bindings(std::span<const uint32_t> words);
const char* shader_name(Shader shader);

}  // namespace pico::backend::vulkan
