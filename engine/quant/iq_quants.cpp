// i-quants. IQ4_NL and IQ4_XS map 4-bit codes through a non-linear code book
// (kIq4nlValues) and have quantizers here. The IQ2, IQ3 and IQ1 formats pick
// 8- or 4-element points of a fixed grid (iq_grids.cpp) plus sign bits; only their
// dequantizers are implemented (their encoders need neighbour tables and an
// importance matrix to be worth using; ggml has no reference encoder for several).
#include <algorithm>
#include <bit>
#include <cmath>

#include "quant/blocks.hpp"
#include "quant/float_convert.hpp"
#include "quant/reference_impl.hpp"

namespace pico::quant {
namespace {

constexpr int QK = kSuperBlock;
constexpr float kGroupMaxEps = 1e-15f;

// ---------------------------------------------------------------- shared helpers

// Index of the code book entry nearest to x (the lower one on ties). `values` is
// sorted ascending.
int nearest_value_index(const int8_t* values, int n, float x) {
  if (x <= values[0]) return 0;
  if (x >= values[n - 1]) return n - 1;
  int lo = 0, hi = n - 1;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (x < values[mid]) hi = mid; else lo = mid;
  }
  return x - static_cast<float>(values[hi - 1]) < static_cast<float>(values[hi]) - x ? hi - 1 : hi;
}

// Sign byte of the IQ2/IQ3 formats from its 7-bit code: the eighth sign makes the
// number of minus signs even.
uint8_t sign_byte(unsigned code7) {
  return static_cast<uint8_t>(code7 | (static_cast<unsigned>(std::popcount(code7) & 1) << 7));
}

float sign_of(unsigned signs, int bit) { return (signs >> bit) & 1u ? -1.f : 1.f; }

uint32_t load_le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

// Scale search for one block of 32 of the non-linear 4-bit formats, x^2 weights:
// least-squares scale for the codes nearest to x/d, over the starting guess and 2*ntry+1
// candidate scales (values[0] + t)/max. Writes the codes of the starting guess into
// L (the caller re-rounds) and returns the scale (0 for an all-zero block).
float iq4_block_scale(const float* xb, const int8_t* values, uint8_t* L, int ntry) {
  float weight[32];
  for (int j = 0; j < 32; ++j) weight[j] = xb[j] * xb[j];
  float amax = 0, max = 0;
  for (int j = 0; j < 32; ++j) {
    const float ax = std::fabs(xb[j]);
    if (ax > amax) {
      amax = ax;
      max = xb[j];
    }
  }
  if (amax < kGroupMaxEps) return 0.0f;
  const float v0 = static_cast<float>(values[0]);
  float d = ntry > 0 ? -max / v0 : max / v0;
  float id = 1 / d;
  float sumqx = 0, sumq2 = 0;
  for (int j = 0; j < 32; ++j) {
    const int l = nearest_value_index(values, 16, id * xb[j]);
    L[j] = static_cast<uint8_t>(l);
    const float q = static_cast<float>(values[l]);
    sumqx += weight[j] * q * xb[j];
    sumq2 += weight[j] * q * q;
  }
  d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
  float best = d * sumqx;
  for (int t = -ntry; t <= ntry; ++t) {
    id = static_cast<float>(t + values[0]) / max;
    sumqx = sumq2 = 0;
    for (int j = 0; j < 32; ++j) {
      const float q = static_cast<float>(values[nearest_value_index(values, 16, id * xb[j])]);
      sumqx += weight[j] * q * xb[j];
      sumq2 += weight[j] * q * q;
    }
    if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
      d = sumqx / sumq2;
      best = d * sumqx;
    }
  }
  return d;
}

void pack_nibbles32(const uint8_t* L, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>(L[j] | (L[16 + j] << 4));
}

// ggml's IQ4 quantizers try 7 candidate scales either side of the starting guess.
constexpr int kIq4Tries = 7;

}  // namespace

// ---------------------------------------------------------------- IQ4_NL
void dequantize_iq4_nl(const void* blocks, float* y, int64_t count) {
  const auto* b = static_cast<const BlockIQ4_NL*>(blocks);
  for (int64_t i = 0; i < count / 32; ++i, y += 32) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < 16; ++j) {
      y[j] = d * static_cast<float>(kIq4nlValues[b[i].qs[j] & 0xf]);
      y[j + 16] = d * static_cast<float>(kIq4nlValues[b[i].qs[j] >> 4]);
    }
  }
}

// As ggml's quantize_iq4_nl without an importance matrix (which searches scales;
// ggml's quantize_row_iq4_nl_ref skips the search).
void quantize_iq4_nl(const float* x, void* blocks, int64_t count) {
  auto* b = static_cast<BlockIQ4_NL*>(blocks);
  for (int64_t i = 0; i < count / 32; ++i, x += 32) {
    uint8_t L[32];
    const float d = iq4_block_scale(x, kIq4nlValues, L, kIq4Tries);
    b[i].d = fp32_to_fp16(d);
    const float id = d != 0.0f ? 1 / d : 0.0f;
    for (int j = 0; j < 32; ++j) L[j] = static_cast<uint8_t>(nearest_value_index(kIq4nlValues, 16, id * x[j]));
    pack_nibbles32(L, b[i].qs);
  }
}

// ---------------------------------------------------------------- IQ4_XS
// 8 blocks of 32 with 6-bit block scales (biased by 32) against one f16 scale.
void dequantize_iq4_xs(const void* blocks, float* y, int64_t count) {
  const auto* b = static_cast<const BlockIQ4_XS*>(blocks);
  for (int64_t i = 0; i < count / QK; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    const uint8_t* qs = b[i].qs;
    for (int ib = 0; ib < 8; ++ib, y += 32, qs += 16) {
      const int ls = ((b[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) | (((b[i].scales_h >> (2 * ib)) & 3) << 4);
      const float dl = d * static_cast<float>(ls - 32);
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * static_cast<float>(kIq4nlValues[qs[j] & 0xf]);
        y[j + 16] = dl * static_cast<float>(kIq4nlValues[qs[j] >> 4]);
      }
    }
  }
}

void quantize_iq4_xs(const float* x, void* blocks, int64_t count) {
  auto* b = static_cast<BlockIQ4_XS*>(blocks);
  for (int64_t i = 0; i < count / QK; ++i, x += QK) {
    uint8_t L[QK];
    float scales[8];
    float max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < 8; ++ib) {
      scales[ib] = iq4_block_scale(x + 32 * ib, kIq4nlValues, L + 32 * ib, kIq4Tries);
      if (std::fabs(scales[ib]) > amax_scale) {
        amax_scale = std::fabs(scales[ib]);
        max_scale = scales[ib];
      }
    }
    const float d = -max_scale / 32;
    b[i].d = fp32_to_fp16(d);
    b[i].scales_h = 0;
    const float id = d != 0.0f ? 1 / d : 0.f;
    for (int ib = 0; ib < 8; ++ib) {
      const int l = std::clamp(nearest_int(id * scales[ib]), -32, 31);
      const float dl = d * static_cast<float>(l);
      const float idl = dl != 0.0f ? 1 / dl : 0.f;
      for (int j = 0; j < 32; ++j) {
        L[32 * ib + j] = static_cast<uint8_t>(nearest_value_index(kIq4nlValues, 16, idl * x[32 * ib + j]));
      }
      const int biased = l + 32;
      if (ib % 2 == 0) {
        b[i].scales_l[ib / 2] = static_cast<uint8_t>(biased & 0xf);
      } else {
        b[i].scales_l[ib / 2] = static_cast<uint8_t>(b[i].scales_l[ib / 2] | ((biased & 0xf) << 4));
      }
      b[i].scales_h = static_cast<uint16_t>(b[i].scales_h | ((biased >> 4) << (2 * ib)));
    }
    for (int ib = 0; ib < 8; ++ib) pack_nibbles32(L + 32 * ib, b[i].qs + 16 * ib);
  }
}

// ---------------------------------------------------------------- IQ2_XXS
// Per 32 elements: 4 grid indices (8 bits each) and a 32-bit word of four 7-bit sign
// codes and a 4-bit scale.
void dequantize_iq2_xxs(const void* blocks, float* y, int64_t count) {
  const auto* b = static_cast<const BlockIQ2_XXS*>(blocks);
  const IqGrids& grids = iq_grids();
  for (int64_t i = 0; i < count / QK; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    for (int ib32 = 0; ib32 < 8; ++ib32) {
      const uint16_t* q = b[i].qs + 4 * ib32;
      const uint8_t index[4] = {static_cast<uint8_t>(q[0] & 0xff), static_cast<uint8_t>(q[0] >> 8),
                                static_cast<uint8_t>(q[1] & 0xff), static_cast<uint8_t>(q[1] >> 8)};
      const uint32_t word = static_cast<uint32_t>(q[2]) | (static_cast<uint32_t>(q[3]) << 16);
      const float db = d * (0.5f + static_cast<float>(word >> 28)) * 0.25f;
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint8_t* grid = grids.iq2xxs[index[l]];
        const uint8_t signs = sign_byte((word >> (7 * l)) & 127);
        for (int j = 0; j < 8; ++j) y[j] = db * static_cast<float>(grid[j]) * sign_of(signs, j);
      }
    }
  }
}

// ---------------------------------------------------------------- IQ2_XS
// Per 8 elements a 16-bit word: 9-bit grid index, 7-bit sign code; 4-bit scale per 16.
void dequantize_iq2_xs(const void* blocks, float* y, int64_t count) {
  const auto* b = static_cast<const BlockIQ2_XS*>(blocks);
  const IqGrids& grids = iq_grids();
  for (int64_t i = 0; i < count / QK; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    for (int ib32 = 0; ib32 < 8; ++ib32) {
      const float db[2] = {d * (0.5f + static_cast<float>(b[i].scales[ib32] & 0xf)) * 0.25f,
                           d * (0.5f + static_cast<float>(b[i].scales[ib32] >> 4)) * 0.25f};
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint16_t code = b[i].qs[4 * ib32 + l];
        const uint8_t* grid = grids.iq2xs[code & 511];
        const uint8_t signs = sign_byte(code >> 9);
        for (int j = 0; j < 8; ++j) y[j] = db[l / 2] * static_cast<float>(grid[j]) * sign_of(signs, j);
      }
    }
  }
}

// ---------------------------------------------------------------- IQ2_S
// 10-bit grid indices (low 8 bits in qs, 2 high bits in qh), explicit sign bytes.
void dequantize_iq2_s(const void* blocks, float* y, int64_t count) {
  const auto* b = static_cast<const BlockIQ2_S*>(blocks);
  const IqGrids& grids = iq_grids();
  for (int64_t i = 0; i < count / QK; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    const uint8_t* qs = b[i].qs;
    const uint8_t* signs = b[i].qs + QK / 8;
    for (int ib32 = 0; ib32 < 8; ++ib32, qs += 4, signs += 4) {
      const float db[2] = {d * (0.5f + static_cast<float>(b[i].scales[ib32] & 0xf)) * 0.25f,
                           d * (0.5f + static_cast<float>(b[i].scales[ib32] >> 4)) * 0.25f};
      for (int l = 0; l < 4; ++l, y += 8) {
        const int index = qs[l] | ((b[i].qh[ib32] << (8 - 2 * l)) & 0x300);
        const uint8_t* grid = grids.iq2s[index];
        for (int j = 0; j < 8; ++j) y[j] = db[l / 2] * static_cast<float>(grid[j]) * sign_of(signs[l], j);
      }
    }
  }
}

// ---------------------------------------------------------------- IQ3_XXS
// 4-element grid points (8-bit indices); per 32 elements a little-endian 32-bit word
// of four 7-bit sign codes and a 4-bit scale.
void dequantize_iq3_xxs(const void* blocks, float* y, int64_t count) {
  const auto* b = static_cast<const BlockIQ3_XXS*>(blocks);
  const IqGrids& grids = iq_grids();
  for (int64_t i = 0; i < count / QK; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    const uint8_t* qs = b[i].qs;
    const uint8_t* scales_and_signs = b[i].qs + QK / 4;
    for (int ib32 = 0; ib32 < 8; ++ib32, qs += 8) {
      const uint32_t word = load_le32(scales_and_signs + 4 * ib32);
      const float db = d * (0.5f + static_cast<float>(word >> 28)) * 0.5f;
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint8_t signs = sign_byte((word >> (7 * l)) & 127);
        const uint8_t* grid1 = grids.iq3xxs[qs[2 * l]];
        const uint8_t* grid2 = grids.iq3xxs[qs[2 * l + 1]];
        for (int j = 0; j < 4; ++j) {
          y[j] = db * static_cast<float>(grid1[j]) * sign_of(signs, j);
          y[j + 4] = db * static_cast<float>(grid2[j]) * sign_of(signs, j + 4);
        }
      }
    }
  }
}

// ---------------------------------------------------------------- IQ3_S
// 9-bit grid indices (high bit in qh), explicit sign bytes, 4-bit odd scales per 32.
void dequantize_iq3_s(const void* blocks, float* y, int64_t count) {
  const auto* b = static_cast<const BlockIQ3_S*>(blocks);
  const IqGrids& grids = iq_grids();
  for (int64_t i = 0; i < count / QK; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    const uint8_t* qs = b[i].qs;
    const uint8_t* signs = b[i].signs;
    for (int ib32 = 0; ib32 < 8; ++ib32, qs += 8, signs += 4) {
      const uint8_t packed_scale = b[i].scales[ib32 / 2];
      const int s = ib32 % 2 == 0 ? (packed_scale & 0xf) : (packed_scale >> 4);
      const float db = d * static_cast<float>(1 + 2 * s);
      const uint8_t qh = b[i].qh[ib32];
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint8_t* grid1 = grids.iq3s[qs[2 * l] | ((qh << (8 - 2 * l)) & 256)];
        const uint8_t* grid2 = grids.iq3s[qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256)];
        for (int j = 0; j < 4; ++j) {
          y[j] = db * static_cast<float>(grid1[j]) * sign_of(signs[l], j);
          y[j + 4] = db * static_cast<float>(grid2[j]) * sign_of(signs[l], j + 4);
        }
      }
    }
  }
}

// ---------------------------------------------------------------- IQ1_S / IQ1_M
// Grid points with coordinates in {-1, 0, 1}, shifted by +-1/8.
constexpr float kIq1Delta = 0.125f;

void dequantize_iq1_s(const void* blocks, float* y, int64_t count) {
  const auto* b = static_cast<const BlockIQ1_S*>(blocks);
  const IqGrids& grids = iq_grids();
  for (int64_t i = 0; i < count / QK; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    const uint8_t* qs = b[i].qs;
    for (int ib = 0; ib < 8; ++ib, qs += 4) {
      const unsigned qh = b[i].qh[ib];
      const float dl = d * static_cast<float>(2 * ((qh >> 12) & 7) + 1);
      const float delta = (qh & 0x8000) ? -kIq1Delta : kIq1Delta;
      for (int l = 0; l < 4; ++l, y += 8) {
        const int8_t* grid = grids.iq1s[qs[l] | (((qh >> (3 * l)) & 7) << 8)];
        for (int j = 0; j < 8; ++j) y[j] = dl * (static_cast<float>(grid[j]) + delta);
      }
    }
  }
}

void dequantize_iq1_m(const void* blocks, float* y, int64_t count) {
  const auto* b = static_cast<const BlockIQ1_M*>(blocks);
  const IqGrids& grids = iq_grids();
  for (int64_t i = 0; i < count / QK; ++i) {
    const uint16_t* sc = b[i].scales;
    const auto scale_bits = static_cast<uint16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) |
                                                  (sc[3] & 0xf000));
    const float d = fp16_to_fp32(scale_bits);
    const uint8_t* qs = b[i].qs;
    const uint8_t* qh = b[i].qh;
    for (int ib = 0; ib < 8; ++ib, qs += 4, qh += 2) {
      const int shift = 6 * (ib % 2);
      const float dl1 = d * static_cast<float>(2 * ((sc[ib / 2] >> shift) & 7) + 1);
      const float dl2 = d * static_cast<float>(2 * ((sc[ib / 2] >> (shift + 3)) & 7) + 1);
      const int index[4] = {qs[0] | ((qh[0] << 8) & 0x700), qs[1] | ((qh[0] << 4) & 0x700),
                            qs[2] | ((qh[1] << 8) & 0x700), qs[3] | ((qh[1] << 4) & 0x700)};
      const float delta[4] = {(qh[0] & 0x08) ? -kIq1Delta : kIq1Delta, (qh[0] & 0x80) ? -kIq1Delta : kIq1Delta,
                              (qh[1] & 0x08) ? -kIq1Delta : kIq1Delta, (qh[1] & 0x80) ? -kIq1Delta : kIq1Delta};
      for (int l = 0; l < 4; ++l, y += 8) {
        const float dl = l < 2 ? dl1 : dl2;
        const int8_t* grid = grids.iq1s[index[l]];
        for (int j = 0; j < 8; ++j) y[j] = dl * (static_cast<float>(grid[j]) + delta[l]);
      }
    }
  }
}

}  // namespace pico::quant
