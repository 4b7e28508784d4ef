// Block layouts of the quantized GGUF tensor types, byte for byte as files carry
// them (ggml's ggml-common.h and, for Q6_0, ik_llama.cpp define the formats).
//
// Multi-byte fields are in the machine's byte order: a reader on a big-endian host
// swaps them on load (TypeTraits::fields lists them). Every other field is a byte
// array and is read byte by byte, so nothing here depends on the host's byte order.
// f16 fields are raw bits: decode with fp16_to_fp32 (quant/float_convert.hpp).
#pragma once

#include <cstdint>

namespace pico::quant {

inline constexpr int kSuperBlock = 256;  // QK_K: elements of a K-, IQ- or TQ- super-block

// --- legacy: 32 elements, one scale -------------------------------------------------
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];  // element j in the low nibble of qs[j], element j+16 in the high nibble
};
struct BlockQ4_1 {
  uint16_t d, m;  // value = d*q + m
  uint8_t qs[16];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];  // bit j (little-endian over the 4 bytes) = fifth bit of element j
  uint8_t qs[16];
};
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
struct BlockQ8_1 {
  uint16_t d, s;  // s = d * sum(qs)
  int8_t qs[32];
};

// --- low-bit block formats -----------------------------------------------------------
struct BlockQ1_0 {  // 128 elements: sign bits, value = +-d
  uint16_t d;
  uint8_t qs[16];
};
struct BlockQ2_0 {  // 64 elements: 2-bit codes 0..3 -> (code - 1) * d
  uint16_t d;
  uint8_t qs[16];
};
struct BlockQ6_0 {  // 32 elements, value = d * (q - 32), q 6-bit (ik_llama.cpp)
  uint16_t d;
  uint8_t qh[8];   // bits 4-5 of q: qh[k] holds elements k, k+16 (bits 0-3), k+8, k+24 (bits 4-7)
  uint8_t qs[16];  // bits 0-3 of q, nibbles as Q4_0
};
struct BlockMXFP4 {  // 32 elements, value = e2m1 * 2^(e-127)
  uint8_t e;
  uint8_t qs[16];
};
struct BlockNVFP4 {  // 64 elements in 4 sub-blocks of 16, each with a UE4M3 scale
  uint8_t d[4];
  uint8_t qs[32];
};
struct BlockTQ1_0 {  // 256 ternary values: 5 per byte in qs, 4 per byte in qh (base 3)
  uint8_t qs[48];
  uint8_t qh[4];
  uint16_t d;
};
struct BlockTQ2_0 {  // 256 ternary values, 2 bits each
  uint8_t qs[64];
  uint16_t d;
};

// --- K-quants: 256-element super-blocks -----------------------------------------------
struct BlockQ2_K {
  uint8_t scales[16];  // low nibble scale, high nibble min, one per 16 elements
  uint8_t qs[64];
  uint16_t d, dmin;
};
struct BlockQ3_K {
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];  // 16 six-bit scales
  uint16_t d;
};
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];  // 8 six-bit scales and 8 six-bit mins
  uint8_t qs[128];
};
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
struct BlockQ8_K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];  // sums of qs in groups of 16
};

// --- i-quants -----------------------------------------------------------------------
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[16];
};
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;    // 2 high bits of each of the 8 six-bit block scales
  uint8_t scales_l[4];  // 4 low bits of each
  uint8_t qs[128];
};
struct BlockIQ2_XXS {
  uint16_t d;
  uint16_t qs[32];
};
struct BlockIQ2_XS {
  uint16_t d;
  uint16_t qs[32];
  uint8_t scales[8];
};
struct BlockIQ2_S {
  uint16_t d;
  uint8_t qs[64];  // 32 grid indices (low 8 bits), then 32 sign bytes
  uint8_t qh[8];
  uint8_t scales[8];
};
struct BlockIQ3_XXS {
  uint16_t d;
  uint8_t qs[96];  // 64 grid indices, then 8 little-endian uint32 of scales and signs
};
struct BlockIQ3_S {
  uint16_t d;
  uint8_t qs[64];
  uint8_t qh[8];
  uint8_t signs[32];
  uint8_t scales[4];
};
struct BlockIQ1_S {
  uint16_t d;
  uint8_t qs[32];
  uint16_t qh[8];
};
struct BlockIQ1_M {
  uint8_t qs[32];
  uint8_t qh[16];
  uint16_t scales[4];  // 3-bit block scales; the f16 super-block scale is spread over the top nibbles
};

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ1_0) == 18 && sizeof(BlockQ2_0) == 18 && sizeof(BlockQ6_0) == 26);
static_assert(sizeof(BlockMXFP4) == 17 && sizeof(BlockNVFP4) == 36);
static_assert(sizeof(BlockTQ1_0) == 54 && sizeof(BlockTQ2_0) == 66);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 && sizeof(BlockQ8_K) == 292);
static_assert(sizeof(BlockIQ4_NL) == 18 && sizeof(BlockIQ4_XS) == 136);
static_assert(sizeof(BlockIQ2_XXS) == 66 && sizeof(BlockIQ2_XS) == 74 && sizeof(BlockIQ2_S) == 82);
static_assert(sizeof(BlockIQ3_XXS) == 98 && sizeof(BlockIQ3_S) == 110);
static_assert(sizeof(BlockIQ1_S) == 50 && sizeof(BlockIQ1_M) == 56);

// Non-linear 4-bit code book of IQ4_NL and IQ4_XS.
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};
// e2m1 (FP4) values, doubled so that they are integers; index = sign bit, 3 value bits.
inline constexpr int8_t kFp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// Grid points of the IQ2/IQ3/IQ1 formats, expanded once from iq_grids.cpp.
// Each row holds the coordinates of one grid point (as ggml's uint64/uint32 grids
// read byte by byte on a little-endian machine).
struct IqGrids {
  uint8_t iq2xxs[256][8];
  uint8_t iq2xs[512][8];
  uint8_t iq2s[1024][8];
  uint8_t iq3xxs[256][4];
  uint8_t iq3s[512][4];
  int8_t iq1s[2048][8];
};
const IqGrids& iq_grids();

}  // namespace pico::quant
