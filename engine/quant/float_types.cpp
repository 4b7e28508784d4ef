// Rows of the plain float types: f32 (a copy), f16 and bf16.
#include <cstring>

#include "quant/float_convert.hpp"
#include "quant/reference_impl.hpp"

namespace pico::quant {

void dequantize_f32(const void* blocks, float* out, int64_t count) {
  std::memcpy(out, blocks, static_cast<size_t>(count) * sizeof(float));
}
void quantize_f32(const float* in, void* blocks, int64_t count) {
  std::memcpy(blocks, in, static_cast<size_t>(count) * sizeof(float));
}

void dequantize_f16(const void* blocks, float* out, int64_t count) {
  const auto* h = static_cast<const uint16_t*>(blocks);
  for (int64_t i = 0; i < count; ++i) out[i] = fp16_to_fp32(h[i]);
}
void quantize_f16(const float* in, void* blocks, int64_t count) {
  auto* h = static_cast<uint16_t*>(blocks);
  for (int64_t i = 0; i < count; ++i) h[i] = fp32_to_fp16(in[i]);
}

void dequantize_bf16(const void* blocks, float* out, int64_t count) {
  const auto* h = static_cast<const uint16_t*>(blocks);
  for (int64_t i = 0; i < count; ++i) out[i] = bf16_to_fp32(h[i]);
}
void quantize_bf16(const float* in, void* blocks, int64_t count) {
  auto* h = static_cast<uint16_t*>(blocks);
  for (int64_t i = 0; i < count; ++i) h[i] = fp32_to_bf16(in[i]);
}

}  // namespace pico::quant
