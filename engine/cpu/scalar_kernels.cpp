// Scalar reference dot products: one per weight type, against its dot partner,
// computing what ggml's generic vec_dot computes (integer sums per block, then a
// float accumulation across blocks). They run on every CPU and are the ground truth
// the SIMD kernels are tested against. gemm at this level is vec_dot per pair, so
// it is batch invariant by construction.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/kernels.hpp"
#include "quant/blocks.hpp"
#include "quant/float_convert.hpp"
#include "quant/quantize.hpp"

namespace pico::cpu {
namespace {

using namespace pico::quant;

constexpr int QK = kSuperBlock;

template <class Block>
const Block* blocks(const void* p) {
  return static_cast<const Block*>(p);
}

// ------------------------------------------------------------------ float types
// Products in float, sum in double (ggml's scalar path accumulates in ggml_float).
float dot_f32(int64_t k, const void* w, const void* a) {
  const auto* x = static_cast<const float*>(w);
  const auto* y = static_cast<const float*>(a);
  double sum = 0.0;
  for (int64_t i = 0; i < k; ++i) sum += static_cast<double>(x[i] * y[i]);
  return static_cast<float>(sum);
}

float dot_f16(int64_t k, const void* w, const void* a) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  double sum = 0.0;
  for (int64_t i = 0; i < k; ++i) sum += static_cast<double>(fp16_to_fp32(x[i]) * fp16_to_fp32(y[i]));
  return static_cast<float>(sum);
}

float dot_bf16(int64_t k, const void* w, const void* a) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  double sum = 0.0;
  for (int64_t i = 0; i < k; ++i) sum += static_cast<double>(bf16_to_fp32(x[i]) * bf16_to_fp32(y[i]));
  return static_cast<float>(sum);
}

// ------------------------------------------------------------------ 32-element blocks · Q8_0 / Q8_1
float dot_q4_0(int64_t k, const void* w, const void* a) {
  const auto* x = blocks<BlockQ4_0>(w);
  const auto* y = blocks<BlockQ8_0>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < k / 32; ++i) {
    int sumi = 0;
    for (int j = 0; j < 16; ++j) {
      sumi += ((x[i].qs[j] & 0x0f) - 8) * y[i].qs[j];
      sumi += ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + 16];
    }
    sum += static_cast<float>(sumi) * fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d);
  }
  return sum;
}

float dot_q4_1(int64_t k, const void* w, const void* a) {
  const auto* x = blocks<BlockQ4_1>(w);
  const auto* y = blocks<BlockQ8_1>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < k / 32; ++i) {
    int sumi = 0;
    for (int j = 0; j < 16; ++j) {
      sumi += (x[i].qs[j] & 0x0f) * y[i].qs[j];
      sumi += (x[i].qs[j] >> 4) * y[i].qs[j + 16];
    }
    sum += (fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d)) * static_cast<float>(sumi) +
           fp16_to_fp32(x[i].m) * fp16_to_fp32(y[i].s);
  }
  return sum;
}

// Fifth bit of element j: bit j of the little-endian 32-bit mask, read byte-wise.
inline int bit_of(const uint8_t* mask, int j) { return (mask[j >> 3] >> (j & 7)) & 1; }

float dot_q5_0(int64_t k, const void* w, const void* a) {
  const auto* x = blocks<BlockQ5_0>(w);
  const auto* y = blocks<BlockQ8_0>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < k / 32; ++i) {
    int sumi = 0;
    for (int j = 0; j < 16; ++j) {
      sumi += (((x[i].qs[j] & 0x0f) | (bit_of(x[i].qh, j) << 4)) - 16) * y[i].qs[j];
      sumi += (((x[i].qs[j] >> 4) | (bit_of(x[i].qh, j + 16) << 4)) - 16) * y[i].qs[j + 16];
    }
    sum += (fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d)) * static_cast<float>(sumi);
  }
  return sum;
}

float dot_q5_1(int64_t k, const void* w, const void* a) {
  const auto* x = blocks<BlockQ5_1>(w);
  const auto* y = blocks<BlockQ8_1>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < k / 32; ++i) {
    int sumi = 0;
    for (int j = 0; j < 16; ++j) {
      sumi += ((x[i].qs[j] & 0x0f) | (bit_of(x[i].qh, j) << 4)) * y[i].qs[j];
      sumi += ((x[i].qs[j] >> 4) | (bit_of(x[i].qh, j + 16) << 4)) * y[i].qs[j + 16];
    }
    sum += (fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d)) * static_cast<float>(sumi) +
           fp16_to_fp32(x[i].m) * fp16_to_fp32(y[i].s);
  }
  return sum;
}

float dot_q8_0(int64_t k, const void* w, const void* a) {
  const auto* x = blocks<BlockQ8_0>(w);
  const auto* y = blocks<BlockQ8_0>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < k / 32; ++i) {
    int sumi = 0;
    for (int j = 0; j < 32; ++j) sumi += x[i].qs[j] * y[i].qs[j];
    sum += static_cast<float>(sumi) * (fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d));
  }
  return sum;
}

float dot_iq4_nl(int64_t k, const void* w, const void* a) {
  const auto* x = blocks<BlockIQ4_NL>(w);
  const auto* y = blocks<BlockQ8_0>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < k / 32; ++i) {
    int sumi = 0;
    for (int j = 0; j < 16; ++j) {
      sumi += kIq4nlValues[x[i].qs[j] & 0x0f] * y[i].qs[j];
      sumi += kIq4nlValues[x[i].qs[j] >> 4] * y[i].qs[j + 16];
    }
    sum += (fp16_to_fp32(y[i].d) * fp16_to_fp32(x[i].d)) * static_cast<float>(sumi);
  }
  return sum;
}

float dot_mxfp4(int64_t k, const void* w, const void* a) {
  const auto* x = blocks<BlockMXFP4>(w);
  const auto* y = blocks<BlockQ8_0>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < k / 32; ++i) {
    int sumi = 0;
    for (int j = 0; j < 16; ++j) {
      sumi += kFp4Values[x[i].qs[j] & 0x0f] * y[i].qs[j];
      sumi += kFp4Values[x[i].qs[j] >> 4] * y[i].qs[j + 16];
    }
    sum += (fp16_to_fp32(y[i].d) * e8m0_to_fp32_half(x[i].e)) * static_cast<float>(sumi);
  }
  return sum;
}

// Q6_0 (ik_llama.cpp): low nibbles as Q4_0, bits 4-5 of element j (j < 16) in
// qh[j % 8] >> (4 * (j / 8)), element j + 16 two bits higher.
float dot_q6_0(int64_t k, const void* w, const void* a) {
  const auto* x = blocks<BlockQ6_0>(w);
  const auto* y = blocks<BlockQ8_0>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < k / 32; ++i) {
    int sumi = 0;
    for (int j = 0; j < 16; ++j) {
      const int h = x[i].qh[j % 8] >> (4 * (j / 8));
      sumi += (((x[i].qs[j] & 0x0f) | ((h & 3) << 4)) - 32) * y[i].qs[j];
      sumi += (((x[i].qs[j] >> 4) | (((h >> 2) & 3) << 4)) - 32) * y[i].qs[j + 16];
    }
    sum += static_cast<float>(sumi) * (fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d));
  }
  return sum;
}

// Q1_0: 128 sign bits (element e = bit e % 8 of qs[e / 8]) against four Q8_0 blocks.
float dot_q1_0(int64_t k, const void* w, const void* a) {
  const auto* x = blocks<BlockQ1_0>(w);
  const auto* y = blocks<BlockQ8_0>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < k / 128; ++i) {
    float block_sum = 0.0f;
    for (int s = 0; s < 4; ++s) {
      const BlockQ8_0& yb = y[i * 4 + s];
      int sumi = 0;
      for (int j = 0; j < 32; ++j) {
        const int e = s * 32 + j;
        sumi += ((x[i].qs[e >> 3] >> (e & 7)) & 1) ? yb.qs[j] : -yb.qs[j];
      }
      block_sum += fp16_to_fp32(yb.d) * static_cast<float>(sumi);
    }
    sum += fp16_to_fp32(x[i].d) * block_sum;
  }
  return sum;
}

// Q2_0: 64 two-bit codes (element e in qs[e / 4] bits 2 * (e % 4)), value code - 1,
// against two Q8_0 blocks.
float dot_q2_0(int64_t k, const void* w, const void* a) {
  const auto* x = blocks<BlockQ2_0>(w);
  const auto* y = blocks<BlockQ8_0>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < k / 64; ++i) {
    float block_sum = 0.0f;
    for (int s = 0; s < 2; ++s) {
      const BlockQ8_0& yb = y[i * 2 + s];
      int sumi = 0;
      for (int j = 0; j < 32; ++j) {
        const int e = s * 32 + j;
        sumi += (((x[i].qs[e >> 2] >> (2 * (e & 3))) & 3) - 1) * yb.qs[j];
      }
      block_sum += fp16_to_fp32(yb.d) * static_cast<float>(sumi);
    }
    sum += fp16_to_fp32(x[i].d) * block_sum;
  }
  return sum;
}

// ------------------------------------------------------------------ 256-element super-blocks · Q8_K
float dot_tq1_0(int64_t k, const void* w, const void* a) {
  const auto* x = blocks<BlockTQ1_0>(w);
  const auto* y = blocks<BlockQ8_K>(a);
  static constexpr uint8_t kPow3[6] = {1, 3, 9, 27, 81, 243};
  float sum = 0.0f;
  for (int64_t i = 0; i < k / QK; ++i) {
    // Trit l of a byte q: the top "digit" of q * 3^l read as a fraction of 256.
    auto trit = [](uint8_t q, int l) {
      const auto shifted = static_cast<uint8_t>(q * kPow3[l]);
      return ((shifted * 3) >> 8) - 1;
    };
    int sumi = 0;
    for (int j = 0; j < 32; ++j)
      for (int l = 0; l < 5; ++l) sumi += trit(x[i].qs[j], l) * y[i].qs[l * 32 + j];
    for (int j = 32; j < 48; ++j)
      for (int l = 0; l < 5; ++l) sumi += trit(x[i].qs[j], l) * y[i].qs[160 + l * 16 + (j - 32)];
    for (int l = 0; l < 4; ++l)
      for (int j = 0; j < 4; ++j) sumi += trit(x[i].qh[j], l) * y[i].qs[240 + l * 4 + j];
    sum += static_cast<float>(sumi) * (fp16_to_fp32(x[i].d) * y[i].d);
  }
  return sum;
}

float dot_tq2_0(int64_t k, const void* w, const void* a) {
  const auto* x = blocks<BlockTQ2_0>(w);
  const auto* y = blocks<BlockQ8_K>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < k / QK; ++i) {
    int sumi = 0;
    for (int j = 0; j < 64; j += 32)
      for (int l = 0; l < 4; ++l)
        for (int m = 0; m < 32; ++m) sumi += y[i].qs[j * 4 + l * 32 + m] * (((x[i].qs[j + m] >> (2 * l)) & 3) - 1);
    sum += static_cast<float>(sumi) * (y[i].d * fp16_to_fp32(x[i].d));
  }
  return sum;
}

float dot_q2_K(int64_t k, const void* w, const void* a) {
  const auto* x = blocks<BlockQ2_K>(w);
  const auto* y = blocks<BlockQ8_K>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < k / QK; ++i) {
    int sum_mins = 0;
    for (int j = 0; j < 16; ++j) sum_mins += y[i].bsums[j] * (x[i].scales[j] >> 4);
    int sumi = 0;
    // Element e: half h = e / 128, shift 2 * ((e % 128) / 32), byte 32 * h + e % 32.
    for (int e = 0; e < QK; ++e) {
      const int q = (x[i].qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
      sumi += (x[i].scales[e / 16] & 0x0f) * q * y[i].qs[e];
    }
    const float dall = y[i].d * fp16_to_fp32(x[i].d);
    const float dmin = y[i].d * fp16_to_fp32(x[i].dmin);
    sum += dall * static_cast<float>(sumi) - dmin * static_cast<float>(sum_mins);
  }
  return sum;
}

float dot_q3_K(int64_t k, const void* w, const void* a) {
  const auto* x = blocks<BlockQ3_K>(w);
  const auto* y = blocks<BlockQ8_K>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < k / QK; ++i) {
    // 16 six-bit scales: low nibbles in scales[0..7], high 2 bits in scales[8..11].
    int scales[16];
    for (int j = 0; j < 16; ++j) {
      const int low = (j < 8 ? x[i].scales[j] : x[i].scales[j - 8] >> 4) & 0x0f;
      const int high = (x[i].scales[8 + j % 4] >> (2 * (j / 4))) & 3;
      scales[j] = (low | (high << 4)) - 32;
    }
    int sumi = 0;
    for (int e = 0; e < QK; ++e) {
      const int group = e / 32;  // shift and hmask bit
      const int byte = 32 * (e / 128) + e % 32;
      int q = (x[i].qs[byte] >> (2 * (group % 4))) & 3;
      if (!((x[i].hmask[e % 32] >> group) & 1)) q -= 4;
      sumi += scales[e / 16] * q * y[i].qs[e];
    }
    sum += (fp16_to_fp32(x[i].d) * y[i].d) * static_cast<float>(sumi);
  }
  return sum;
}

// Six-bit scale and min j (0..7) of Q4_K / Q5_K.
inline void scale_min_k4(int j, const uint8_t* q, int& scale, int& min) {
  if (j < 4) {
    scale = q[j] & 63;
    min = q[j + 4] & 63;
  } else {
    scale = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
    min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

float dot_q4_K(int64_t k, const void* w, const void* a) {
  const auto* x = blocks<BlockQ4_K>(w);
  const auto* y = blocks<BlockQ8_K>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < k / QK; ++i) {
    int sumi = 0, sum_mins = 0;
    for (int s = 0; s < 8; ++s) {
      int scale = 0, min = 0;
      scale_min_k4(s, x[i].scales, scale, min);
      sum_mins += min * (y[i].bsums[2 * s] + y[i].bsums[2 * s + 1]);
      const uint8_t* q = x[i].qs + 32 * (s / 2);
      int sub = 0;
      for (int j = 0; j < 32; ++j) sub += ((s & 1) ? q[j] >> 4 : q[j] & 0x0f) * y[i].qs[32 * s + j];
      sumi += scale * sub;
    }
    sum += (fp16_to_fp32(x[i].d) * y[i].d) * static_cast<float>(sumi) -
           (fp16_to_fp32(x[i].dmin) * y[i].d) * static_cast<float>(sum_mins);
  }
  return sum;
}

float dot_q5_K(int64_t k, const void* w, const void* a) {
  const auto* x = blocks<BlockQ5_K>(w);
  const auto* y = blocks<BlockQ8_K>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < k / QK; ++i) {
    int sumi = 0, sum_mins = 0;
    for (int s = 0; s < 8; ++s) {
      int scale = 0, min = 0;
      scale_min_k4(s, x[i].scales, scale, min);
      sum_mins += min * (y[i].bsums[2 * s] + y[i].bsums[2 * s + 1]);
      const uint8_t* q = x[i].qs + 32 * (s / 2);
      int sub = 0;
      for (int j = 0; j < 32; ++j) {
        const int low = (s & 1) ? q[j] >> 4 : q[j] & 0x0f;
        sub += (low | (((x[i].qh[j] >> s) & 1) << 4)) * y[i].qs[32 * s + j];
      }
      sumi += scale * sub;
    }
    sum += (fp16_to_fp32(x[i].d) * y[i].d) * static_cast<float>(sumi) -
           (fp16_to_fp32(x[i].dmin) * y[i].d) * static_cast<float>(sum_mins);
  }
  return sum;
}

float dot_q6_K(int64_t k, const void* w, const void* a) {
  const auto* x = blocks<BlockQ6_K>(w);
  const auto* y = blocks<BlockQ8_K>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < k / QK; ++i) {
    int sumi = 0;
    for (int e = 0; e < QK; ++e) {
      // Half h = e / 128; within it, quarter g = (e % 128) / 32 picks the nibble and
      // the 2-bit field of qh.
      const int h = e / 128, g = (e % 128) / 32, l = e % 32;
      const uint8_t ql = x[i].ql[64 * h + 32 * (g & 1) + l];
      const int low = (g < 2) ? (ql & 0x0f) : (ql >> 4);
      const int high = (x[i].qh[32 * h + l] >> (2 * g)) & 3;
      sumi += x[i].scales[e / 16] * ((low | (high << 4)) - 32) * y[i].qs[e];
    }
    sum += (fp16_to_fp32(x[i].d) * y[i].d) * static_cast<float>(sumi);
  }
  return sum;
}

float dot_iq4_xs(int64_t k, const void* w, const void* a) {
  const auto* x = blocks<BlockIQ4_XS>(w);
  const auto* y = blocks<BlockQ8_K>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < k / QK; ++i) {
    const float d4d8 = fp16_to_fp32(x[i].d) * y[i].d;
    for (int s = 0; s < 8; ++s) {
      const int low = (x[i].scales_l[s / 2] >> (4 * (s % 2))) & 0x0f;
      const int high = (x[i].scales_h >> (2 * s)) & 3;
      const uint8_t* q = x[i].qs + 16 * s;
      int sumi = 0;
      for (int j = 0; j < 16; ++j) {
        sumi += kIq4nlValues[q[j] & 0x0f] * y[i].qs[32 * s + j];
        sumi += kIq4nlValues[q[j] >> 4] * y[i].qs[32 * s + j + 16];
      }
      sum += (d4d8 * static_cast<float>((low | (high << 4)) - 32)) * static_cast<float>(sumi);
    }
  }
  return sum;
}

// ------------------------------------------------------------------ table
template <VecDotFn Dot>
void gemm_by_vec_dot(int64_t k, const void* w, size_t w_row_bytes, int64_t rows, const void* a, size_t a_row_bytes,
                     int64_t cols, float* out, int64_t out_stride) {
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* ab = static_cast<const uint8_t*>(a);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out[c * out_stride + r] = Dot(k, wb + r * w_row_bytes, ab + c * a_row_bytes);
  }
}

template <GgmlType Activation>
void quantize_reference(const float* x, void* out, int64_t k) {
  quantize_row(Activation, x, out, k);
}

// The Q8_0 / Q8_1 activation quantizer llama.cpp runs on x86 (ggml-cpu's
// quantize_row_q8_0/q8_1), which differs from the file-format reference quantizer
// in two roundings: the multiplier is 127 / amax (not 1 / d) and codes round half
// to even (not away from zero). pico uses it on every ISA, so that activations
// round where llama.cpp's do and every host of a cluster gets the same bytes.
// Returns the codes' sum.
int quantize_activation_block32(const float* x, int8_t* qs, float& d_out) {
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f;
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  int sum = 0;
  for (int i = 0; i < 32; ++i) {
    const auto q = static_cast<int>(std::nearbyint(x[i] * id));  // default rounding: half to even
    qs[i] = static_cast<int8_t>(q);
    sum += q;
  }
  d_out = d;
  return sum;
}

void quantize_activation_q8_0(const float* x, void* out, int64_t k) {
  auto* b = static_cast<BlockQ8_0*>(out);
  for (int64_t i = 0; i < k / 32; ++i) {
    float d;
    quantize_activation_block32(x + 32 * i, b[i].qs, d);
    b[i].d = fp32_to_fp16(d);
  }
}

void quantize_activation_q8_1(const float* x, void* out, int64_t k) {
  auto* b = static_cast<BlockQ8_1*>(out);
  for (int64_t i = 0; i < k / 32; ++i) {
    float d;
    const int sum = quantize_activation_block32(x + 32 * i, b[i].qs, d);
    b[i].d = fp32_to_fp16(d);
    b[i].s = fp32_to_fp16(static_cast<float>(sum) * d);
  }
}

template <VecDotFn Dot>
void put(KernelTable& table, GgmlType type) {
  table.vec_dot[slot(type)] = Dot;
  table.gemm[slot(type)] = gemm_by_vec_dot<Dot>;
}

// libm's e^x, as llama.cpp's scalar code (and its vector code's leftovers) uses.
void silu_row_scalar(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + std::exp(-x[i]));
}

double exp_row_scalar(const float* x, int64_t n, float max, float* y) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    y[i] = std::exp(x[i] - max);
    sum += static_cast<double>(y[i]);
  }
  return sum;
}

double centered_squares_row_scalar(const float* x, int64_t n, float mean, float* y) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    y[i] = x[i] - mean;
    sum += static_cast<double>(y[i] * y[i]);
  }
  return sum;
}

// ggml's scalar build: products added in double (ggml_float), updates unfused.
double dot_double(int64_t n, const float* x, const float* y) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * y[i]);
  return sum;
}

float dot_f32_scalar(int64_t n, const float* x, const float* y) { return static_cast<float>(dot_double(n, x, y)); }

void delta_rule_step_scalar(int64_t d, float* state, const float* q, const float* k, const float* v, float decay,
                            float beta, float scale, float* out) {
  for (int64_t j = 0; j < d; ++j) {
    float* row = state + j * d;
    for (int64_t i = 0; i < d; ++i) row[i] *= decay;
    const float u = (v[j] - static_cast<float>(dot_double(d, row, k))) * beta;
    for (int64_t i = 0; i < d; ++i) row[i] += k[i] * u;
    out[j] = static_cast<float>(dot_double(d, row, q)) * scale;
  }
}

void conv_row_scalar(int64_t channels, int64_t taps, const float* window, const float* weights, int64_t stride,
                     float* y) {
  for (int64_t c = 0; c < channels; ++c) {
    float sum = 0.0f;
    for (int64_t i = 0; i < taps; ++i) sum += window[i * stride + c] * weights[i * stride + c];
    y[c] = sum;
  }
}

}  // namespace

void fill_scalar_kernels(KernelTable& table) {
  using T = GgmlType;
  put<dot_f32>(table, T::F32);
  put<dot_f16>(table, T::F16);
  put<dot_bf16>(table, T::BF16);
  put<dot_q4_0>(table, T::Q4_0);
  put<dot_q4_1>(table, T::Q4_1);
  put<dot_q5_0>(table, T::Q5_0);
  put<dot_q5_1>(table, T::Q5_1);
  put<dot_q8_0>(table, T::Q8_0);
  put<dot_iq4_nl>(table, T::IQ4_NL);
  put<dot_mxfp4>(table, T::MXFP4);
  put<dot_q6_0>(table, T::Q6_0);
  put<dot_q1_0>(table, T::Q1_0);
  put<dot_q2_0>(table, T::Q2_0);
  put<dot_tq1_0>(table, T::TQ1_0);
  put<dot_tq2_0>(table, T::TQ2_0);
  put<dot_q2_K>(table, T::Q2_K);
  put<dot_q3_K>(table, T::Q3_K);
  put<dot_q4_K>(table, T::Q4_K);
  put<dot_q5_K>(table, T::Q5_K);
  put<dot_q6_K>(table, T::Q6_K);
  put<dot_iq4_xs>(table, T::IQ4_XS);
  table.quantize[slot(T::F32)] = quantize_reference<T::F32>;
  table.quantize[slot(T::F16)] = quantize_reference<T::F16>;
  table.quantize[slot(T::BF16)] = quantize_reference<T::BF16>;
  table.quantize[slot(T::Q8_0)] = quantize_activation_q8_0;
  table.quantize[slot(T::Q8_1)] = quantize_activation_q8_1;
  table.quantize[slot(T::Q8_K)] = quantize_reference<T::Q8_K>;
  set_row_functions(table, silu_row_scalar, exp_row_scalar, centered_squares_row_scalar);
  set_recurrent_functions(table, delta_rule_step_scalar, conv_row_scalar, dot_f32_scalar);
}

}  // namespace pico::cpu
