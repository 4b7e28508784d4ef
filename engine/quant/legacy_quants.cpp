// The first generation of ggml block formats: 32 elements per block, one f16 scale
// (and an f16 offset for the _1 variants). Element j of a block sits in the low
// nibble of byte j and element j+16 in the high nibble; the fifth bit of the Q5
// formats is bit j of a little-endian 32-bit mask.
//
// The quantizers are ggml's reference ones, byte for byte: the scale comes from the
// extreme value alone and each element is rounded with the same float operations
// (including ggml's truncating casts), so a model quantized here is identical to one
// quantized by llama.cpp.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <iterator>

#include "quant/blocks.hpp"
#include "quant/float_convert.hpp"
#include "quant/reference_impl.hpp"

namespace pico::quant {
namespace {

constexpr int kBlock = 32;
constexpr int kHalf = kBlock / 2;

// The value of largest magnitude, with its sign (the first one on ties).
float signed_absmax(const float* x, int n) {
  float amax = 0.0f;
  float max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

float absmax(const float* x, int n) {
  float amax = 0.0f;
  for (int j = 0; j < n; ++j) amax = std::max(amax, std::fabs(x[j]));
  return amax;
}

void min_max(const float* x, int n, float& min, float& max) {
  min = FLT_MAX;
  max = -FLT_MAX;
  for (int j = 0; j < n; ++j) {
    if (x[j] < min) min = x[j];
    if (x[j] > max) max = x[j];
  }
}

float inverse_or_zero(float d) { return d != 0.0f ? 1.0f / d : 0.0f; }

// Fifth bit of element j (0..31) from the 4-byte little-endian mask.
int high_bit(const uint8_t* qh, int j) { return (qh[j >> 3] >> (j & 7)) & 1; }
void set_high_bit(uint8_t* qh, int j) { qh[j >> 3] = static_cast<uint8_t>(qh[j >> 3] | (1u << (j & 7))); }

// ggml rounds these formats with a cast that truncates: (int8_t)(v + 0.5) style.
int truncate_to_int(float v) { return static_cast<int>(v); }

}  // namespace

// ---------------------------------------------------------------- Q4_0: d * (q - 8)
void dequantize_q4_0(const void* blocks, float* out, int64_t count) {
  const auto* b = static_cast<const BlockQ4_0*>(blocks);
  for (int64_t i = 0; i < count / kBlock; ++i, out += kBlock) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kHalf; ++j) {
      out[j] = static_cast<float>((b[i].qs[j] & 0x0f) - 8) * d;
      out[j + kHalf] = static_cast<float>((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void quantize_q4_0(const float* in, void* blocks, int64_t count) {
  auto* b = static_cast<BlockQ4_0*>(blocks);
  for (int64_t i = 0; i < count / kBlock; ++i, in += kBlock) {
    const float d = signed_absmax(in, kBlock) / -8;
    const float id = inverse_or_zero(d);
    b[i].d = fp32_to_fp16(d);
    for (int j = 0; j < kHalf; ++j) {
      const int lo = std::min(15, truncate_to_int(in[j] * id + 8.5f));
      const int hi = std::min(15, truncate_to_int(in[j + kHalf] * id + 8.5f));
      b[i].qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

// ---------------------------------------------------------------- Q4_1: d * q + m
void dequantize_q4_1(const void* blocks, float* out, int64_t count) {
  const auto* b = static_cast<const BlockQ4_1*>(blocks);
  for (int64_t i = 0; i < count / kBlock; ++i, out += kBlock) {
    const float d = fp16_to_fp32(b[i].d);
    const float m = fp16_to_fp32(b[i].m);
    for (int j = 0; j < kHalf; ++j) {
      out[j] = static_cast<float>(b[i].qs[j] & 0x0f) * d + m;
      out[j + kHalf] = static_cast<float>(b[i].qs[j] >> 4) * d + m;
    }
  }
}

void quantize_q4_1(const float* in, void* blocks, int64_t count) {
  auto* b = static_cast<BlockQ4_1*>(blocks);
  for (int64_t i = 0; i < count / kBlock; ++i, in += kBlock) {
    float min, max;
    min_max(in, kBlock, min, max);
    const float d = (max - min) / 15;
    const float id = inverse_or_zero(d);
    b[i].d = fp32_to_fp16(d);
    b[i].m = fp32_to_fp16(min);
    for (int j = 0; j < kHalf; ++j) {
      const int lo = std::min(15, truncate_to_int((in[j] - min) * id + 0.5f));
      const int hi = std::min(15, truncate_to_int((in[j + kHalf] - min) * id + 0.5f));
      b[i].qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

// ---------------------------------------------------------------- Q5_0: d * (q - 16)
void dequantize_q5_0(const void* blocks, float* out, int64_t count) {
  const auto* b = static_cast<const BlockQ5_0*>(blocks);
  for (int64_t i = 0; i < count / kBlock; ++i, out += kBlock) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kHalf; ++j) {
      const int lo = (b[i].qs[j] & 0x0f) | (high_bit(b[i].qh, j) << 4);
      const int hi = (b[i].qs[j] >> 4) | (high_bit(b[i].qh, j + kHalf) << 4);
      out[j] = static_cast<float>(lo - 16) * d;
      out[j + kHalf] = static_cast<float>(hi - 16) * d;
    }
  }
}

void quantize_q5_0(const float* in, void* blocks, int64_t count) {
  auto* b = static_cast<BlockQ5_0*>(blocks);
  for (int64_t i = 0; i < count / kBlock; ++i, in += kBlock) {
    const float d = signed_absmax(in, kBlock) / -16;
    const float id = inverse_or_zero(d);
    b[i].d = fp32_to_fp16(d);
    std::fill(std::begin(b[i].qh), std::end(b[i].qh), uint8_t{0});
    for (int j = 0; j < kHalf; ++j) {
      const int lo = std::min(31, truncate_to_int(in[j] * id + 16.5f));
      const int hi = std::min(31, truncate_to_int(in[j + kHalf] * id + 16.5f));
      b[i].qs[j] = static_cast<uint8_t>((lo & 0x0f) | ((hi & 0x0f) << 4));
      if (lo & 0x10) set_high_bit(b[i].qh, j);
      if (hi & 0x10) set_high_bit(b[i].qh, j + kHalf);
    }
  }
}

// ---------------------------------------------------------------- Q5_1: d * q + m
void dequantize_q5_1(const void* blocks, float* out, int64_t count) {
  const auto* b = static_cast<const BlockQ5_1*>(blocks);
  for (int64_t i = 0; i < count / kBlock; ++i, out += kBlock) {
    const float d = fp16_to_fp32(b[i].d);
    const float m = fp16_to_fp32(b[i].m);
    for (int j = 0; j < kHalf; ++j) {
      const int lo = (b[i].qs[j] & 0x0f) | (high_bit(b[i].qh, j) << 4);
      const int hi = (b[i].qs[j] >> 4) | (high_bit(b[i].qh, j + kHalf) << 4);
      out[j] = static_cast<float>(lo) * d + m;
      out[j + kHalf] = static_cast<float>(hi) * d + m;
    }
  }
}

void quantize_q5_1(const float* in, void* blocks, int64_t count) {
  auto* b = static_cast<BlockQ5_1*>(blocks);
  for (int64_t i = 0; i < count / kBlock; ++i, in += kBlock) {
    float min, max;
    min_max(in, kBlock, min, max);
    const float d = (max - min) / 31;
    const float id = inverse_or_zero(d);
    b[i].d = fp32_to_fp16(d);
    b[i].m = fp32_to_fp16(min);
    std::fill(std::begin(b[i].qh), std::end(b[i].qh), uint8_t{0});
    for (int j = 0; j < kHalf; ++j) {
      // No clamp: (max - min) * id rounds to at most 31.
      const int lo = truncate_to_int((in[j] - min) * id + 0.5f) & 0xff;
      const int hi = truncate_to_int((in[j + kHalf] - min) * id + 0.5f) & 0xff;
      b[i].qs[j] = static_cast<uint8_t>((lo & 0x0f) | ((hi & 0x0f) << 4));
      if (lo & 0x10) set_high_bit(b[i].qh, j);
      if (hi & 0x10) set_high_bit(b[i].qh, j + kHalf);
    }
  }
}

// ---------------------------------------------------------------- Q8_0: d * q
void dequantize_q8_0(const void* blocks, float* out, int64_t count) {
  const auto* b = static_cast<const BlockQ8_0*>(blocks);
  for (int64_t i = 0; i < count / kBlock; ++i, out += kBlock) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kBlock; ++j) out[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

void quantize_q8_0(const float* in, void* blocks, int64_t count) {
  auto* b = static_cast<BlockQ8_0*>(blocks);
  for (int64_t i = 0; i < count / kBlock; ++i, in += kBlock) {
    const float d = absmax(in, kBlock) / 127;
    const float id = inverse_or_zero(d);
    b[i].d = fp32_to_fp16(d);
    for (int j = 0; j < kBlock; ++j) b[i].qs[j] = static_cast<int8_t>(std::round(in[j] * id));
  }
}

// ---------------------------------------------------------------- Q8_1: d * q, s = d * sum(q)
// ggml has no dequantizer for Q8_1 (it is an activation format); this one ignores s.
void dequantize_q8_1(const void* blocks, float* out, int64_t count) {
  const auto* b = static_cast<const BlockQ8_1*>(blocks);
  for (int64_t i = 0; i < count / kBlock; ++i, out += kBlock) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kBlock; ++j) out[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

void quantize_q8_1(const float* in, void* blocks, int64_t count) {
  auto* b = static_cast<BlockQ8_1*>(blocks);
  for (int64_t i = 0; i < count / kBlock; ++i, in += kBlock) {
    const float d = absmax(in, kBlock) / 127;
    const float id = inverse_or_zero(d);
    b[i].d = fp32_to_fp16(d);
    int sum = 0;
    for (int j = 0; j < kBlock; ++j) {
      b[i].qs[j] = static_cast<int8_t>(std::round(in[j] * id));
      sum += b[i].qs[j];
    }
    b[i].s = fp32_to_fp16(static_cast<float>(sum) * d);
  }
}

}  // namespace pico::quant
