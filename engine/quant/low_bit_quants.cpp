// Ternary (TQ1_0, TQ2_0), binary (Q1_0), 2-bit (Q2_0), FP4 (MXFP4, NVFP4) and
// ik_llama.cpp's Q6_0 formats, with ggml's reference quantizers.
#include <algorithm>
#include <cmath>
#include <iterator>

#include "quant/blocks.hpp"
#include "quant/float_convert.hpp"
#include "quant/reference_impl.hpp"

namespace pico::quant {
namespace {

constexpr int QK = kSuperBlock;

float absmax(const float* x, int n) {
  float amax = 0.0f;
  for (int j = 0; j < n; ++j) amax = std::max(amax, std::fabs(x[j]));
  return amax;
}

// Ternary code of x/d: -1, 0, 1 -> 0, 1, 2 (round half away from zero).
int trit(float v) { return static_cast<int>(std::lround(v)) + 1; }

// Nearest doubled-e2m1 code for x at scale d (the first one on ties).
uint8_t nearest_fp4(float x, float d) {
  int best = 0;
  float best_err = std::fabs(static_cast<float>(kFp4Values[0]) * d - x);
  for (int i = 1; i < 16; ++i) {
    const float err = std::fabs(static_cast<float>(kFp4Values[i]) * d - x);
    if (err < best_err) {
      best = i;
      best_err = err;
    }
  }
  return static_cast<uint8_t>(best);
}

// TQ1_0 stores 5 (or 4) trits per byte as a fixed-point fraction of 3^5: byte =
// ceil(t * 256 / 243) for the base-3 number t. Digit n is recovered as the integer
// part of 3 * frac(byte * 3^n / 256).
uint8_t pack_trits(int t) { return static_cast<uint8_t>((t * 256 + 242) / 243); }
int unpack_trit(uint8_t byte, int n) {
  static constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  const auto shifted = static_cast<uint8_t>(byte * kPow3[n]);
  return ((shifted * 3) >> 8) - 1;
}

}  // namespace

// ---------------------------------------------------------------- TQ1_0
// Element order: qs[0..31] hold elements m + 32n (n = 0..4, most significant trit
// first), qs[32..47] hold 160 + m + 16n, qh[0..3] hold 240 + j + 4n (n = 0..3).
void dequantize_tq1_0(const void* blocks, float* y, int64_t count) {
  const auto* b = static_cast<const BlockTQ1_0*>(blocks);
  for (int64_t i = 0; i < count / QK; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    for (int n = 0; n < 5; ++n) {
      for (int m = 0; m < 32; ++m) *y++ = static_cast<float>(unpack_trit(b[i].qs[m], n)) * d;
    }
    for (int n = 0; n < 5; ++n) {
      for (int m = 0; m < 16; ++m) *y++ = static_cast<float>(unpack_trit(b[i].qs[32 + m], n)) * d;
    }
    for (int n = 0; n < 4; ++n) {
      for (int j = 0; j < 4; ++j) *y++ = static_cast<float>(unpack_trit(b[i].qh[j], n)) * d;
    }
  }
}

void quantize_tq1_0(const float* x, void* blocks, int64_t count) {
  auto* b = static_cast<BlockTQ1_0*>(blocks);
  for (int64_t i = 0; i < count / QK; ++i) {
    const float d = absmax(x, QK);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    for (int m = 0; m < 32; ++m) {
      int t = 0;
      for (int n = 0; n < 5; ++n) t = t * 3 + trit(x[m + 32 * n] * id);
      b[i].qs[m] = pack_trits(t);
    }
    x += 160;
    for (int m = 0; m < 16; ++m) {
      int t = 0;
      for (int n = 0; n < 5; ++n) t = t * 3 + trit(x[m + 16 * n] * id);
      b[i].qs[32 + m] = pack_trits(t);
    }
    x += 80;
    for (int j = 0; j < 4; ++j) {
      int t = 0;
      for (int n = 0; n < 4; ++n) t = t * 3 + trit(x[j + 4 * n] * id);
      b[i].qh[j] = pack_trits(t * 3);  // four trits, in the top positions
    }
    x += 16;
  }
}

// ---------------------------------------------------------------- TQ2_0
// Byte m of each 32-byte group holds elements m + 32l (l = 0..3), 2 bits each.
void dequantize_tq2_0(const void* blocks, float* y, int64_t count) {
  const auto* b = static_cast<const BlockTQ2_0*>(blocks);
  for (int64_t i = 0; i < count / QK; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < 64; j += 32) {
      for (int l = 0; l < 4; ++l) {
        for (int m = 0; m < 32; ++m) *y++ = static_cast<float>(((b[i].qs[j + m] >> (2 * l)) & 3) - 1) * d;
      }
    }
  }
}

void quantize_tq2_0(const float* x, void* blocks, int64_t count) {
  auto* b = static_cast<BlockTQ2_0*>(blocks);
  for (int64_t i = 0; i < count / QK; ++i) {
    const float d = absmax(x, QK);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    for (int j = 0; j < 64; j += 32, x += 128) {
      for (int m = 0; m < 32; ++m) {
        int q = 0;
        for (int n = 0; n < 4; ++n) q += (trit(x[m + 32 * n] * id) & 3) << (2 * n);
        b[i].qs[j + m] = static_cast<uint8_t>(q);
      }
    }
  }
}

// ---------------------------------------------------------------- MXFP4
// 32 e2m1 values (nibbles as Q4_0) times 2^(e - 127).
void dequantize_mxfp4(const void* blocks, float* y, int64_t count) {
  const auto* b = static_cast<const BlockMXFP4*>(blocks);
  for (int64_t i = 0; i < count / 32; ++i, y += 32) {
    const float d = e8m0_to_fp32_half(b[i].e);
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>(kFp4Values[b[i].qs[j] & 0x0f]) * d;
      y[j + 16] = static_cast<float>(kFp4Values[b[i].qs[j] >> 4]) * d;
    }
  }
}

void quantize_mxfp4(const float* x, void* blocks, int64_t count) {
  auto* b = static_cast<BlockMXFP4*>(blocks);
  for (int64_t i = 0; i < count / 32; ++i, x += 32) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    // The largest e2m1 magnitude is 6 = 1.5 * 2^2: exponent floor(log2(amax)) - 2.
    int e = amax > 0.0f ? static_cast<int>(std::floor(std::log2(amax))) - 2 + 127 : 0;
    e = std::clamp(e, 0, 255);  // (ggml wraps for amax below 2^-125)
    b[i].e = static_cast<uint8_t>(e);
    const float d = e8m0_to_fp32_half(b[i].e);
    for (int j = 0; j < 16; ++j) {
      b[i].qs[j] = static_cast<uint8_t>(nearest_fp4(x[j], d) | (nearest_fp4(x[j + 16], d) << 4));
    }
  }
}

// ---------------------------------------------------------------- NVFP4
// 4 sub-blocks of 16 e2m1 values, each with a UE4M3 scale; nibbles as Q4_0 within a
// sub-block (8 bytes each).
void dequantize_nvfp4(const void* blocks, float* y, int64_t count) {
  const auto* b = static_cast<const BlockNVFP4*>(blocks);
  for (int64_t i = 0; i < count / 64; ++i) {
    for (int s = 0; s < 4; ++s, y += 16) {
      const float d = ue4m3_to_fp32_half(b[i].d[s]);
      const uint8_t* qs = b[i].qs + 8 * s;
      for (int j = 0; j < 8; ++j) {
        y[j] = static_cast<float>(kFp4Values[qs[j] & 0x0f]) * d;
        y[j + 8] = static_cast<float>(kFp4Values[qs[j] >> 4]) * d;
      }
    }
  }
}

void quantize_nvfp4(const float* x, void* blocks, int64_t count) {
  auto* b = static_cast<BlockNVFP4*>(blocks);
  for (int64_t i = 0; i < count / 64; ++i) {
    for (int s = 0; s < 4; ++s, x += 16) {
      float amax = 0.0f;
      for (int j = 0; j < 16; ++j) amax = std::max(amax, std::fabs(x[j]));
      b[i].d[s] = fp32_to_ue4m3(amax / 6.0f);  // 6 = largest e2m1 magnitude
      const float d = ue4m3_to_fp32_half(b[i].d[s]);
      uint8_t* qs = b[i].qs + 8 * s;
      for (int j = 0; j < 8; ++j) qs[j] = static_cast<uint8_t>(nearest_fp4(x[j], d) | (nearest_fp4(x[j + 8], d) << 4));
    }
  }
}

// ---------------------------------------------------------------- Q1_0
// 128 sign bits (bit j%8 of byte j/8; set = +d), d = mean |x|.
void dequantize_q1_0(const void* blocks, float* y, int64_t count) {
  const auto* b = static_cast<const BlockQ1_0*>(blocks);
  for (int64_t i = 0; i < count / 128; ++i, y += 128) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < 128; ++j) y[j] = (b[i].qs[j / 8] >> (j % 8)) & 1 ? d : -d;
  }
}

void quantize_q1_0(const float* x, void* blocks, int64_t count) {
  auto* b = static_cast<BlockQ1_0*>(blocks);
  for (int64_t i = 0; i < count / 128; ++i, x += 128) {
    float sum_abs = 0.0f;
    for (int j = 0; j < 128; ++j) sum_abs += std::fabs(x[j]);
    b[i].d = fp32_to_fp16(sum_abs / 128);
    std::fill(std::begin(b[i].qs), std::end(b[i].qs), uint8_t{0});
    for (int j = 0; j < 128; ++j) {
      if (x[j] >= 0.0f) b[i].qs[j / 8] = static_cast<uint8_t>(b[i].qs[j / 8] | (1u << (j % 8)));
    }
  }
}

// ---------------------------------------------------------------- Q2_0
// 64 codes of 2 bits (bits 2*(j%4) of byte j/4): value = (code - 1) * d, d = max |x|.
void dequantize_q2_0(const void* blocks, float* y, int64_t count) {
  const auto* b = static_cast<const BlockQ2_0*>(blocks);
  for (int64_t i = 0; i < count / 64; ++i, y += 64) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < 64; ++j) y[j] = static_cast<float>(((b[i].qs[j / 4] >> (2 * (j % 4))) & 3) - 1) * d;
  }
}

void quantize_q2_0(const float* x, void* blocks, int64_t count) {
  auto* b = static_cast<BlockQ2_0*>(blocks);
  for (int64_t i = 0; i < count / 64; ++i, x += 64) {
    float amax = 0.0f;
    for (int j = 0; j < 64; ++j) {
      if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]);
    }
    const float d = amax;
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    std::fill(std::begin(b[i].qs), std::end(b[i].qs), uint8_t{0});
    for (int j = 0; j < 64; ++j) {
      const int q = std::clamp(static_cast<int>(std::round(x[j] * id)) + 1, 0, 3);
      b[i].qs[j / 4] = static_cast<uint8_t>(b[i].qs[j / 4] | (q << (2 * (j % 4))));
    }
  }
}

// ---------------------------------------------------------------- Q6_0 (ik_llama.cpp)
// As Q5_0 with two high bits: value = d * (q - 32). Element j (j < 16) has its low
// nibble in qs[j] low, element j+16 in qs[j] high; their bits 4-5 sit in qh[j % 8]
// at bit 4*(j/8) (element j) and 4*(j/8) + 2 (element j+16).
void dequantize_q6_0(const void* blocks, float* y, int64_t count) {
  const auto* b = static_cast<const BlockQ6_0*>(blocks);
  for (int64_t i = 0; i < count / 32; ++i, y += 32) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < 16; ++j) {
      const int h = b[i].qh[j % 8] >> (4 * (j / 8));
      const int q0 = ((b[i].qs[j] & 0x0f) | ((h & 3) << 4)) - 32;
      const int q1 = ((b[i].qs[j] >> 4) | (((h >> 2) & 3) << 4)) - 32;
      y[j] = static_cast<float>(q0) * d;
      y[j + 16] = static_cast<float>(q1) * d;
    }
  }
}

void quantize_q6_0(const float* x, void* blocks, int64_t count) {
  auto* b = static_cast<BlockQ6_0*>(blocks);
  for (int64_t i = 0; i < count / 32; ++i, x += 32) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -32;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    std::fill(std::begin(b[i].qh), std::end(b[i].qh), uint8_t{0});
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(63, static_cast<int>(x[j] * id + 32.5f));
      const int q1 = std::min(63, static_cast<int>(x[j + 16] * id + 32.5f));
      b[i].qs[j] = static_cast<uint8_t>((q0 & 0x0f) | ((q1 & 0x0f) << 4));
      const int h = (q0 >> 4) | ((q1 >> 4) << 2);
      b[i].qh[j % 8] = static_cast<uint8_t>(b[i].qh[j % 8] | (h << (4 * (j / 8))));
    }
  }
}

}  // namespace pico::quant
