// K-quants: 256-element super-blocks split into 16 or 8 sub-blocks, each with its
// own scale (and for Q2_K, Q4_K, Q5_K a min), the sub-block scales themselves
// quantized against one or two f16 super-block scales.
//
// The quantizers follow ggml's reference (no importance matrix) algorithms: a
// weighted least-squares search for each sub-block's scale (and min) over a range of
// candidate scales, then the sub-block scales quantized to 4, 6 or 8 bits, then every
// element re-rounded against the scale it will actually be decoded with. They use
// the same float operations in the same order, so their output matches ggml's bytes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>

#include "quant/blocks.hpp"
#include "quant/float_convert.hpp"
#include "quant/reference_impl.hpp"

namespace pico::quant {
namespace {

constexpr int QK = kSuperBlock;
constexpr float kGroupMaxEps = 1e-15f;

// The value of largest magnitude, with its sign (the first one on ties).
float signed_absmax(const float* x, int n, float* amax_out = nullptr) {
  float amax = 0.0f;
  float max = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax_out) *amax_out = amax;
  return max;
}

// Symmetric scale for n values, codes in [-nmax, nmax) stored as L + nmax. Weights
// are x^2. Tries 19 candidate scales around -nmax/max and keeps the one whose
// least-squares fit explains most of the weighted signal. Returns the scale.
float symmetric_scale_search(int n, int nmax, const float* x, int8_t* L) {
  float amax;
  const float max = signed_absmax(x, n, &amax);
  if (amax < kGroupMaxEps) {
    std::fill(L, L + n, int8_t{0});
    return 0.0f;
  }
  auto code = [nmax](float v) { return std::clamp(nearest_int(v), -nmax, nmax - 1); };
  float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = code(iscale * x[i]);
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * static_cast<float>(l);
    suml2 += w * static_cast<float>(l) * static_cast<float>(l);
  }
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int step = -9; step <= 9; ++step) {
    if (step == 0) continue;
    iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(step)) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const float l = static_cast<float>(code(iscale * x[i]));
      const float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(nmax + code(iscale * x[i]));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Q3_K's sub-block scale: start from -nmax/max, then up to five passes that move
// single codes when that improves the x^2-weighted fit. Codes stored as L + nmax.
float q3_scale_search(int n, int nmax, const float* x, int8_t* L) {
  float amax;
  const float max = signed_absmax(x, n, &amax);
  if (amax < kGroupMaxEps) {
    std::fill(L, L + n, int8_t{0});
    return 0.0f;
  }
  auto clamp_code = [nmax](int l) { return std::clamp(l, -nmax, nmax - 1); };
  const float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = clamp_code(nearest_int(iscale * x[i]));
    L[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * static_cast<float>(l);
    suml2 += w * static_cast<float>(l) * static_cast<float>(l);
  }
  for (int pass = 0; pass < 5; ++pass) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      const float li = static_cast<float>(L[i]);
      float slx = sumlx - w * x[i] * li;
      if (slx > 0) {
        float sl2 = suml2 - w * li * li;
        const int new_l = clamp_code(nearest_int(x[i] * sl2 / slx));
        if (new_l != L[i]) {
          const float nl = static_cast<float>(new_l);
          slx += w * x[i] * nl;
          sl2 += w * nl * nl;
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = static_cast<int8_t>(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++changed;
          }
        }
      }
    }
    if (!changed) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Scale and min for x ~ scale * L + min with L in [0, nmax] and min <= 0, minimizing
// the weighted squared (or absolute, `use_mad`) error over nstep+1 candidate scales
// (rmin + rdelta*k + nmax) / (max - min). Stores -min in `neg_min`, returns the scale.
float scale_min_search(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* neg_min,
                       float rmin, float rdelta, int nstep, bool use_mad) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    sum_w += weights[i];
    sum_x += weights[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(L, L + n, uint8_t{0});
    *neg_min = -min;
    return 0.0f;
  }
  auto error_of = [use_mad](float diff) { return use_mad ? std::fabs(diff) : diff * diff; };
  float iscale = static_cast<float>(nmax) / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = static_cast<uint8_t>(std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax));
    best_error += weights[i] * error_of(scale * static_cast<float>(L[i]) + min - x[i]);
  }
  if (nstep < 1) {
    *neg_min = -min;
    return scale;
  }
  uint8_t candidate[32];
  for (int step = 0; step <= nstep; ++step) {
    iscale = (rmin + rdelta * static_cast<float>(step) + static_cast<float>(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax);
      candidate[i] = static_cast<uint8_t>(l);
      const float wl = weights[i] * static_cast<float>(l);
      sum_l += wl;
      sum_l2 += wl * static_cast<float>(l);
      sum_xl += wl * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float error = 0;
      for (int i = 0; i < n; ++i) {
        error += weights[i] * error_of(this_scale * static_cast<float>(candidate[i]) + this_min - x[i]);
      }
      if (error < best_error) {
        std::copy(candidate, candidate + n, L);
        best_error = error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *neg_min = -min;
  return scale;
}

// 2-bit codes of 256 elements: byte l of each 32-byte group packs elements
// l, l+32, l+64, l+96 of a 128-element half, two bits each.
void pack_2bit(const uint8_t* L, uint8_t* qs) {
  for (int j = 0; j < QK; j += 128) {
    for (int l = 0; l < 32; ++l) {
      qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
    }
  }
}

// Q4_K/Q5_K: 8 six-bit scales and 8 six-bit mins in 12 bytes. Sub-blocks 0-3 keep
// both in the low 6 bits of bytes 0-3 and 4-7; sub-blocks 4-7 keep their low 4 bits
// in the nibbles of bytes 8-11 and their top 2 bits in the top bits of bytes 0-7.
void scale_min_k4(int j, const uint8_t* q, uint8_t& scale, uint8_t& min) {
  if (j < 4) {
    scale = q[j] & 63;
    min = q[j + 4] & 63;
  } else {
    scale = static_cast<uint8_t>((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
    min = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

void pack_scale_min_k4(const uint8_t* ls, const uint8_t* lm, uint8_t* q) {
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      q[j] = ls[j];
      q[j + 4] = lm[j];
    } else {
      q[j + 4] = static_cast<uint8_t>((ls[j] & 0x0f) | ((lm[j] & 0x0f) << 4));
      q[j - 4] = static_cast<uint8_t>(q[j - 4] | ((ls[j] >> 4) << 6));
      q[j] = static_cast<uint8_t>(q[j] | ((lm[j] >> 4) << 6));
    }
  }
}

// Q3_K: 16 six-bit scales in 12 bytes: low nibbles in bytes 0-7 (scales 0-7 low
// nibble, 8-15 high nibble), top 2 bits in bytes 8-11 (scale j at bits 2*(j/4) of
// byte 8 + j%4). Stored biased by 32.
int q3k_scale(const uint8_t* s, int j) {
  const int low = j < 8 ? (s[j] & 0x0f) : (s[j - 8] >> 4);
  const int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | (high << 4)) - 32;
}

// Q4_K and Q5_K share everything but the code range and the search parameters.
struct ScaleMinSearch {
  int nmax;
  float rmin, rdelta;
  int nstep;
};

// Sub-block scales/mins of one Q4_K/Q5_K super-block: fills d, dmin, the 12 scale
// bytes and the final codes L (0..nmax).
void quantize_scale_min_superblock(const float* x, const ScaleMinSearch& p, uint16_t& d_out, uint16_t& dmin_out,
                                   uint8_t* scale_bytes, uint8_t* L) {
  float scales[8], mins[8], weights[32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const float* xb = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xb[l] * xb[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xb[l]);
    scales[j] = scale_min_search(32, p.nmax, xb, weights, L + 32 * j, &mins[j], p.rmin, p.rdelta, p.nstep, false);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t ls[8], lm[8];
  for (int j = 0; j < 8; ++j) {
    ls[j] = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_scale * scales[j])));
    lm[j] = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_min * mins[j])));
  }
  pack_scale_min_k4(ls, lm, scale_bytes);
  d_out = fp32_to_fp16(max_scale / 63.f);
  dmin_out = fp32_to_fp16(max_min / 63.f);
  const float d_all = fp16_to_fp32(d_out);
  const float m_all = fp16_to_fp32(dmin_out);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    scale_min_k4(j, scale_bytes, sc, m);
    const float d = d_all * sc;
    if (d == 0.0f) continue;
    const float dm = m_all * m;
    for (int ii = 0; ii < 32; ++ii) {
      L[32 * j + ii] = static_cast<uint8_t>(std::clamp(nearest_int((x[32 * j + ii] + dm) / d), 0, p.nmax));
    }
  }
}

}  // namespace

// ---------------------------------------------------------------- Q2_K
// 16 sub-blocks of 16; value = d*scale*q - dmin*min, scale/min 4 bits, q 2 bits.
void dequantize_q2_K(const void* blocks, float* y, int64_t count) {
  const auto* b = static_cast<const BlockQ2_K*>(blocks);
  for (int64_t i = 0; i < count / QK; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    const float min = fp16_to_fp32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    int is = 0;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int part = 0; part < 2; ++part) {
          const uint8_t sc = b[i].scales[is++];
          const float dl = d * static_cast<float>(sc & 0xf);
          const float ml = min * static_cast<float>(sc >> 4);
          for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[l + 16 * part] >> shift) & 3) - ml;
        }
      }
    }
  }
}

void quantize_q2_K(const float* x, void* blocks, int64_t count) {
  auto* b = static_cast<BlockQ2_K*>(blocks);
  constexpr float q4scale = 15.f;
  for (int64_t i = 0; i < count / QK; ++i, x += QK) {
    uint8_t L[QK];
    float scales[16], mins[16], weights[16];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      scales[j] = scale_min_search(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], -0.5f, 0.1f, 15, true);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    if (max_scale > 0) {
      const float iscale = q4scale / max_scale;
      for (int j = 0; j < 16; ++j) b[i].scales[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
      b[i].d = fp32_to_fp16(max_scale / q4scale);
    } else {
      std::fill(std::begin(b[i].scales), std::end(b[i].scales), uint8_t{0});
      b[i].d = fp32_to_fp16(0.f);
    }
    if (max_min > 0) {
      const float iscale = q4scale / max_min;
      for (int j = 0; j < 16; ++j) {
        b[i].scales[j] = static_cast<uint8_t>(b[i].scales[j] | (nearest_int(iscale * mins[j]) << 4));
      }
      b[i].dmin = fp32_to_fp16(max_min / q4scale);
    } else {
      b[i].dmin = fp32_to_fp16(0.f);
    }
    for (int j = 0; j < 16; ++j) {
      const float d = fp16_to_fp32(b[i].d) * static_cast<float>(b[i].scales[j] & 0xf);
      if (d == 0.0f) continue;
      const float dm = fp16_to_fp32(b[i].dmin) * static_cast<float>(b[i].scales[j] >> 4);
      for (int ii = 0; ii < 16; ++ii) {
        L[16 * j + ii] = static_cast<uint8_t>(std::clamp(nearest_int((x[16 * j + ii] + dm) / d), 0, 3));
      }
    }
    pack_2bit(L, b[i].qs);
  }
}

// ---------------------------------------------------------------- Q3_K
// 16 sub-blocks of 16; value = d*scale*(q - 4), scale 6 bits signed, q 3 bits
// (2 low bits in qs as Q2_K, the high bit in hmask: bit k of hmask[l] belongs to
// element 32*k + l).
void dequantize_q3_K(const void* blocks, float* y, int64_t count) {
  const auto* b = static_cast<const BlockQ3_K*>(blocks);
  for (int64_t i = 0; i < count / QK; ++i) {
    const float d_all = fp16_to_fp32(b[i].d);
    const uint8_t* q = b[i].qs;
    const uint8_t* hm = b[i].hmask;
    int is = 0;
    uint8_t m = 1;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int shift = 0; shift < 8; shift += 2, m = static_cast<uint8_t>(m << 1)) {
        for (int part = 0; part < 2; ++part) {
          const float dl = d_all * static_cast<float>(q3k_scale(b[i].scales, is++));
          for (int l = 16 * part; l < 16 * part + 16; ++l) {
            const int code = ((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4);
            *y++ = dl * static_cast<float>(code);
          }
        }
      }
    }
  }
}

void quantize_q3_K(const float* x, void* blocks, int64_t count) {
  auto* b = static_cast<BlockQ3_K*>(blocks);
  for (int64_t i = 0; i < count / QK; ++i, x += QK) {
    int8_t L[QK];
    float scales[16];
    float max_scale = 0, amax = 0;
    for (int j = 0; j < 16; ++j) {
      scales[j] = q3_scale_search(16, 4, x + 16 * j, L + 16 * j);
      if (std::fabs(scales[j]) > amax) {
        amax = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    uint8_t* s = b[i].scales;
    std::fill(s, s + 12, uint8_t{0});
    if (max_scale != 0.0f) {
      const float iscale = -32.f / max_scale;
      for (int j = 0; j < 16; ++j) {
        const int8_t l8 = static_cast<int8_t>(nearest_int(iscale * scales[j]));
        const int l = std::clamp<int>(l8, -32, 31) + 32;
        if (j < 8) {
          s[j] = static_cast<uint8_t>(l & 0xf);
        } else {
          s[j - 8] = static_cast<uint8_t>(s[j - 8] | ((l & 0xf) << 4));
        }
        s[j % 4 + 8] = static_cast<uint8_t>(s[j % 4 + 8] | ((l >> 4) << (2 * (j / 4))));
      }
      b[i].d = fp32_to_fp16(1 / iscale);
    } else {
      b[i].d = fp32_to_fp16(0.f);
    }
    for (int j = 0; j < 16; ++j) {
      const float d = fp16_to_fp32(b[i].d) * static_cast<float>(q3k_scale(s, j));
      if (d == 0.0f) continue;
      for (int ii = 0; ii < 16; ++ii) {
        L[16 * j + ii] = static_cast<int8_t>(std::clamp(nearest_int(x[16 * j + ii] / d), -4, 3) + 4);
      }
    }
    std::fill(std::begin(b[i].hmask), std::end(b[i].hmask), uint8_t{0});
    uint8_t codes[QK];
    for (int j = 0; j < QK; ++j) {
      int l = L[j];
      if (l > 3) {
        b[i].hmask[j % 32] = static_cast<uint8_t>(b[i].hmask[j % 32] | (1u << (j / 32)));
        l -= 4;
      }
      codes[j] = static_cast<uint8_t>(l);
    }
    pack_2bit(codes, b[i].qs);
  }
}

// ---------------------------------------------------------------- Q4_K
// 8 sub-blocks of 32; value = d*scale*q - dmin*min, scale/min 6 bits, q 4 bits
// (byte l of each 32-byte group: element l low nibble, element l+32 high nibble).
void dequantize_q4_K(const void* blocks, float* y, int64_t count) {
  const auto* b = static_cast<const BlockQ4_K*>(blocks);
  for (int64_t i = 0; i < count / QK; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    const float min = fp16_to_fp32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int pair = 0; pair < 4; ++pair, q += 32) {
      uint8_t sc, m;
      scale_min_k4(2 * pair, b[i].scales, sc, m);
      const float d1 = d * sc, m1 = min * m;
      scale_min_k4(2 * pair + 1, b[i].scales, sc, m);
      const float d2 = d * sc, m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xf) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

void quantize_q4_K(const float* x, void* blocks, int64_t count) {
  auto* b = static_cast<BlockQ4_K*>(blocks);
  const ScaleMinSearch search{15, -1.f, 0.1f, 20};
  for (int64_t i = 0; i < count / QK; ++i, x += QK) {
    uint8_t L[QK];
    quantize_scale_min_superblock(x, search, b[i].d, b[i].dmin, b[i].scales, L);
    uint8_t* q = b[i].qs;
    for (int j = 0; j < QK; j += 64, q += 32) {
      for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
    }
  }
}

// ---------------------------------------------------------------- Q5_K
// As Q4_K with a fifth bit: bit 2k (2k+1) of qh[l] for the low (high) nibble of
// byte l of group k.
void dequantize_q5_K(const void* blocks, float* y, int64_t count) {
  const auto* b = static_cast<const BlockQ5_K*>(blocks);
  for (int64_t i = 0; i < count / QK; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    const float min = fp16_to_fp32(b[i].dmin);
    const uint8_t* ql = b[i].qs;
    const uint8_t* qh = b[i].qh;
    for (int pair = 0; pair < 4; ++pair, ql += 32) {
      uint8_t sc, m;
      scale_min_k4(2 * pair, b[i].scales, sc, m);
      const float d1 = d * sc, m1 = min * m;
      scale_min_k4(2 * pair + 1, b[i].scales, sc, m);
      const float d2 = d * sc, m2 = min * m;
      const unsigned u1 = 1u << (2 * pair), u2 = 2u << (2 * pair);
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((ql[l] & 0xf) + ((qh[l] & u1) ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
    }
  }
}

void quantize_q5_K(const float* x, void* blocks, int64_t count) {
  auto* b = static_cast<BlockQ5_K*>(blocks);
  const ScaleMinSearch search{31, -0.5f, 0.1f, 15};
  for (int64_t i = 0; i < count / QK; ++i, x += QK) {
    uint8_t L[QK];
    quantize_scale_min_superblock(x, search, b[i].d, b[i].dmin, b[i].scales, L);
    uint8_t* qh = b[i].qh;
    uint8_t* ql = b[i].qs;
    std::fill(qh, qh + 32, uint8_t{0});
    for (int group = 0; group < 4; ++group, ql += 32) {
      const int n = 64 * group;
      for (int j = 0; j < 32; ++j) {
        int l1 = L[n + j], l2 = L[n + j + 32];
        if (l1 > 15) {
          l1 -= 16;
          qh[j] = static_cast<uint8_t>(qh[j] | (1u << (2 * group)));
        }
        if (l2 > 15) {
          l2 -= 16;
          qh[j] = static_cast<uint8_t>(qh[j] | (2u << (2 * group)));
        }
        ql[j] = static_cast<uint8_t>(l1 | (l2 << 4));
      }
    }
  }
}

// ---------------------------------------------------------------- Q6_K
// 16 sub-blocks of 16; value = d*scale*(q - 32), scale int8, q 6 bits. Per
// 128-element half: ql[l] holds elements l (low) and l+64 (high), ql[l+32] holds
// l+32 and l+96; qh[l] holds the top 2 bits of l, l+32, l+64, l+96.
void dequantize_q6_K(const void* blocks, float* y, int64_t count) {
  const auto* b = static_cast<const BlockQ6_K*>(blocks);
  for (int64_t i = 0; i < count / QK; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    const uint8_t* ql = b[i].ql;
    const uint8_t* qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

void quantize_q6_K(const float* x, void* blocks, int64_t count) {
  auto* b = static_cast<BlockQ6_K*>(blocks);
  for (int64_t i = 0; i < count / QK; ++i, x += QK) {
    int8_t L[QK];
    float scales[16];
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < 16; ++ib) {
      scales[ib] = symmetric_scale_search(16, 32, x + 16 * ib, L + 16 * ib);
      if (std::fabs(scales[ib]) > max_abs_scale) {
        max_abs_scale = std::fabs(scales[ib]);
        max_scale = scales[ib];
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(&b[i], 0, sizeof(BlockQ6_K));
      b[i].d = fp32_to_fp16(0.f);
      continue;
    }
    const float iscale = -128.f / max_scale;
    b[i].d = fp32_to_fp16(1 / iscale);
    for (int ib = 0; ib < 16; ++ib) {
      b[i].scales[ib] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
    }
    for (int j = 0; j < 16; ++j) {
      const float d = fp16_to_fp32(b[i].d) * static_cast<float>(b[i].scales[j]);
      if (d == 0.0f) continue;
      for (int ii = 0; ii < 16; ++ii) {
        L[16 * j + ii] = static_cast<int8_t>(std::clamp(nearest_int(x[16 * j + ii] / d), -32, 31) + 32);
      }
    }
    uint8_t* ql = b[i].ql;
    uint8_t* qh = b[i].qh;
    for (int j = 0; j < QK; j += 128, ql += 64, qh += 32) {
      for (int l = 0; l < 32; ++l) {
        const int c0 = L[j + l], c1 = L[j + l + 32], c2 = L[j + l + 64], c3 = L[j + l + 96];
        ql[l] = static_cast<uint8_t>((c0 & 0xf) | ((c2 & 0xf) << 4));
        ql[l + 32] = static_cast<uint8_t>((c1 & 0xf) | ((c3 & 0xf) << 4));
        qh[l] = static_cast<uint8_t>((c0 >> 4) | ((c1 >> 4) << 2) | ((c2 >> 4) << 4) | ((c3 >> 4) << 6));
      }
    }
  }
}

// ---------------------------------------------------------------- Q8_K
// Activation format of the K-quant dot products: f32 scale, int8 codes, and the sums
// of each 16 codes.
void dequantize_q8_K(const void* blocks, float* y, int64_t count) {
  const auto* b = static_cast<const BlockQ8_K*>(blocks);
  for (int64_t i = 0; i < count / QK; ++i) {
    for (int j = 0; j < QK; ++j) *y++ = b[i].d * static_cast<float>(b[i].qs[j]);
  }
}

void quantize_q8_K(const float* x, void* blocks, int64_t count) {
  auto* b = static_cast<BlockQ8_K*>(blocks);
  for (int64_t i = 0; i < count / QK; ++i, x += QK) {
    float amax;
    const float max = signed_absmax(x, QK, &amax);
    if (amax == 0.0f) {
      std::memset(&b[i], 0, sizeof(BlockQ8_K));
      continue;
    }
    // -127 rather than -128: keeps every code's negation in range for the dot products.
    const float iscale = -127.f / max;
    for (int j = 0; j < QK; ++j) b[i].qs[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * x[j])));
    for (int j = 0; j < 16; ++j) {
      int sum = 0;
      for (int ii = 0; ii < 16; ++ii) sum += b[i].qs[16 * j + ii];
      b[i].bsums[j] = static_cast<int16_t>(sum);
    }
    b[i].d = 1 / iscale;
  }
}

}  // namespace pico::quant
