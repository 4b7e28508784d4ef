// The avx512 Q4_K / Q2_K kernels in llama.cpp's repacked-GEMM float order (see
// k_quant_repack_order_kernels.hpp).
//
// Lanes hold outputs. Each output first gets one 512-bit integer accumulator per
// super-block whose 128-bit lane L collects part L of the super-block (Q4_K: chunk L;
// Q2_K: half of chunk L / 2): the codes are arranged at decode time so that every
// int8 product lands in the lane of its chunk. A transposing add tree then turns 16
// such accumulators into one vector per part with one output per lane, and the float
// chains run 16 outputs wide. GEMM tiles are 4 weight rows x 4 tokens (lane 4 r + t);
// GEMV takes 16 rows per vector, streamed one row at a time.
#include "cpu/x86/avx512_intrinsics.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu/tile_driver.hpp"
#include "cpu/x86/k4_scales.hpp"
#include "cpu/x86/k_quant_repack_order_kernels.hpp"
#include "quant/blocks.hpp"

namespace pico::cpu {
namespace {

using quant::BlockQ2_K;
using quant::BlockQ4_K;
using quant::BlockQ8_K;

constexpr int64_t kSuperBlock = 256;

inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

// 128-bit lane k of out[L] = 128-bit lane L of in[k] (a 4 x 4 transpose of lanes).
inline void transpose_lanes(const __m512i in[4], __m512i out[4]) {
  const __m512i p01 = _mm512_shuffle_i64x2(in[0], in[1], _MM_SHUFFLE(1, 0, 1, 0));
  const __m512i p23 = _mm512_shuffle_i64x2(in[2], in[3], _MM_SHUFFLE(1, 0, 1, 0));
  const __m512i q01 = _mm512_shuffle_i64x2(in[0], in[1], _MM_SHUFFLE(3, 2, 3, 2));
  const __m512i q23 = _mm512_shuffle_i64x2(in[2], in[3], _MM_SHUFFLE(3, 2, 3, 2));
  out[0] = _mm512_shuffle_i64x2(p01, p23, _MM_SHUFFLE(2, 0, 2, 0));
  out[1] = _mm512_shuffle_i64x2(p01, p23, _MM_SHUFFLE(3, 1, 3, 1));
  out[2] = _mm512_shuffle_i64x2(q01, q23, _MM_SHUFFLE(2, 0, 2, 0));
  out[3] = _mm512_shuffle_i64x2(q01, q23, _MM_SHUFFLE(3, 1, 3, 1));
}

// 16 accumulators -> 4 vectors: lane o of out[L] = the sum of 128-bit lane L of in[o]
// (exact integer adds, any grouping).
inline void reduce16(const __m512i in[16], __m512i out[4]) {
  __m512i per_group[4];
  for (int g = 0; g < 4; ++g) {
    const __m512i* v = in + 4 * g;
    const __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[0], v[1]), _mm512_unpackhi_epi32(v[0], v[1]));
    const __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2], v[3]), _mm512_unpackhi_epi32(v[2], v[3]));
    // 128-bit lane L, element i: the sum of lane L of v[i].
    per_group[g] = _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
  }
  transpose_lanes(per_group, out);
}

// Element `element` of each 128-bit lane, broadcast within the lane.
inline __m512i broadcast_in_lanes(__m512i v, int element) {
  switch (element) {
    case 0: return _mm512_shuffle_epi32(v, _MM_PERM_AAAA);
    case 1: return _mm512_shuffle_epi32(v, _MM_PERM_BBBB);
    case 2: return _mm512_shuffle_epi32(v, _MM_PERM_CCCC);
    default: return _mm512_shuffle_epi32(v, _MM_PERM_DDDD);
  }
}

// The integer dot of one row and one activation super-block, lane L = part L.
template <class T>
inline __m512i superblock_dot(const typename T::Row& w, const typename T::Activation& a) {
  __m512i acc = _mm512_setzero_si512();
  for (int j = 0; j < 4; ++j) {
    acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(w.codes[j], a.codes[j]), w.scales[T::scale_vector(j)]);
  }
  return acc;
}

// Element L: the sum of 128-bit lane L of `v`.
inline __m128i lane_sums(__m512i v) {
  __m512i x = _mm512_add_epi32(v, _mm512_shuffle_epi32(v, _MM_PERM_BADC));
  x = _mm512_add_epi32(x, _mm512_shuffle_epi32(x, _MM_PERM_CDAB));
  return _mm512_castsi512_si128(_mm512_permutexvar_epi32(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), x));
}

// ---------------------------------------------------------------- per-type decoding
// A weight row's super-block: four vectors of 64 codes (u8) with the int16 scale of
// each code pair, the mins as int16 pairs (in int32 slots) and d, dmin. An activation
// super-block: the matching four vectors of int8 codes, the bsums as int16 pairs that
// meet the min pairs in one vpmaddwd, and d.

// Q4_K: chunk g = sub-blocks 2g (low nibbles of qs[32g, 32g + 32)) and 2g + 1 (high
// nibbles). Vector j, lane g: values 16 j .. 16 j + 15 of chunk g, i.e. activations
// 64 g + 16 j ...
struct Q4_KOrder {
  using Block = BlockQ4_K;
  static constexpr int kScaleVectors = 2;  // vectors 0, 1: sub-block 2g; 2, 3: 2g + 1
  static constexpr int kMinPairs = 4;      // (min 2g, min 2g + 1) per chunk g
  static constexpr int kChunks = 4;
  static constexpr int scale_vector(int j) { return j / 2; }
  static constexpr int chunk_of_pair(int p) { return p; }

  struct Row {
    __m512i codes[4];
    __m512i scales[kScaleVectors];
    __m128i min_pairs;
    float d, dmin;
  };
  struct Activation {
    __m512i codes[4];
    alignas(16) int32_t bsum_pairs[kMinPairs];
    float d;
  };

  // Bytes 0-7: the 8 six-bit scales, 8-15: the 8 mins.
  static __m128i scales_and_mins(const Block* b) {
    const K4Scales k = unpack_k4_scales(b->scales);
    return _mm_set_epi32(static_cast<int>(k.mins_hi), static_cast<int>(k.mins_lo), static_cast<int>(k.scales_hi),
                         static_cast<int>(k.scales_lo));
  }

  static void decode_codes(const Block* b, __m512i codes[4]) {
    const __m512i r0 = _mm512_loadu_si512(b->qs);
    const __m512i r1 = _mm512_loadu_si512(b->qs + 64);
    const __m512i first = _mm512_shuffle_i64x2(r0, r1, _MM_SHUFFLE(2, 0, 2, 0));   // lane g: qs[32 g, +16)
    const __m512i second = _mm512_shuffle_i64x2(r0, r1, _MM_SHUFFLE(3, 1, 3, 1));  // lane g: qs[32 g + 16, +16)
    const __m512i mask = _mm512_set1_epi8(0x0f);
    codes[0] = _mm512_and_si512(first, mask);
    codes[1] = _mm512_and_si512(second, mask);
    codes[2] = _mm512_and_si512(_mm512_srli_epi16(first, 4), mask);
    codes[3] = _mm512_and_si512(_mm512_srli_epi16(second, 4), mask);
  }

  static void decode(const Block* b, Row& out) {
    const __m128i scales_mins = scales_and_mins(b);
    const __m512i wide = _mm512_cvtepu8_epi16(_mm256_zextsi128_si256(scales_mins));  // int16 0-7 scales
    // int16 e of scale vector h: scale 2 (e / 8) + h.
    const __m512i lane_index = _mm512_srli_epi16(
        _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7,
                         6, 5, 4, 3, 2, 1, 0),
        3);
    const __m512i even = _mm512_slli_epi16(lane_index, 1);
    out.scales[0] = _mm512_permutexvar_epi16(even, wide);
    out.scales[1] = _mm512_permutexvar_epi16(_mm512_add_epi16(even, _mm512_set1_epi16(1)), wide);
    out.min_pairs = _mm_cvtepu8_epi16(_mm_srli_si128(scales_mins, 8));
    decode_codes(b, out.codes);
    out.d = half_to_float(b->d);
    out.dmin = half_to_float(b->dmin);
  }

  // GEMV: one row's chunk sums (element g) and mins terms. Unscaled sub-block dots
  // first (vpdpbusd), then the scales as int32 products: the same exact integers as
  // superblock_dot's, with fewer instructions per row.
  static void gemv_row(const Block* b, const Activation& a, __m128i& chunks, __m128i& mins) {
    const __m128i scales_mins = scales_and_mins(b);
    __m512i codes[4];
    decode_codes(b, codes);
    // Lane g: sub-block 2g (vectors 0, 1) and 2g + 1 (vectors 2, 3).
    const __m512i even = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), codes[0], a.codes[0]), codes[1],
                                             a.codes[1]);
    const __m512i odd = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), codes[2], a.codes[2]), codes[3],
                                            a.codes[3]);
    __m512i x = _mm512_add_epi32(_mm512_unpacklo_epi32(even, odd), _mm512_unpackhi_epi32(even, odd));
    x = _mm512_add_epi32(x, _mm512_shuffle_epi32(x, _MM_PERM_BADC));  // lane g: [even, odd, even, odd]
    const __m256i dots = _mm512_castsi512_si256(
        _mm512_permutexvar_epi32(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 13, 12, 9, 8, 5, 4, 1, 0), x));  // sub-block i
    const __m256i scaled = _mm256_mullo_epi32(dots, _mm256_cvtepu8_epi32(scales_mins));
    chunks = _mm_hadd_epi32(_mm256_castsi256_si128(scaled), _mm256_extracti128_si256(scaled, 1));
    mins = _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_srli_si128(scales_mins, 8)),
                          _mm_load_si128(reinterpret_cast<const __m128i*>(a.bsum_pairs)));
  }

  static void decode(const BlockQ8_K* a, Activation& out) {
    __m512i quarter[4];
    for (int i = 0; i < 4; ++i) quarter[i] = _mm512_loadu_si512(a->qs + 64 * i);
    transpose_lanes(quarter, out.codes);  // vector j, lane g: qs[64 g + 16 j, +16)
    int16_t sums32[8];
    for (int i = 0; i < 8; ++i) sums32[i] = static_cast<int16_t>(a->bsums[2 * i] + a->bsums[2 * i + 1]);
    std::memcpy(out.bsum_pairs, sums32, sizeof(sums32));
    out.d = a->d;
  }

  // Per part (128-bit lane) sums -> per chunk sums.
  static void chunk_sums(const __m512i parts[4], __m512i chunks[4]) {
    for (int c = 0; c < 4; ++c) chunks[c] = parts[c];
  }
  static void store_min_pairs(const Row& w, int32_t* out) { _mm_storeu_si128(reinterpret_cast<__m128i*>(out), w.min_pairs); }
};

// Q2_K: chunk h = values 128 h .. 128 h + 127 = the 2-bit fields of qs[32 h, +32).
// Vector j: bytes 0-31 (lanes 0, 1) values 32 j + l of chunk 0, bytes 32-63 (lanes 2,
// 3) of chunk 1, l = the byte; int16 e belongs to sub-block 8 (L / 2) + 2 j + L % 2,
// L = e / 8.
struct Q2_KOrder {
  using Block = BlockQ2_K;
  static constexpr int kScaleVectors = 4;
  static constexpr int kMinPairs = 8;  // (min 2p, min 2p + 1), p = 0..7; chunk p / 4
  static constexpr int kChunks = 2;
  static constexpr int scale_vector(int j) { return j; }
  static constexpr int chunk_of_pair(int p) { return p / 4; }

  struct Row {
    __m512i codes[4];
    __m512i scales[kScaleVectors];
    __m256i min_pairs;
    float d, dmin;
  };
  struct Activation {
    __m512i codes[4];
    alignas(32) int32_t bsum_pairs[kMinPairs];
    float d;
  };

  static void decode(const Block* b, Row& out) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b->scales));
    const __m128i low4 = _mm_set1_epi8(0x0f);
    const __m512i wide = _mm512_cvtepu8_epi16(_mm256_zextsi128_si256(_mm_and_si128(raw, low4)));  // int16 0-15
    const __m512i e = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13,
                                       12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i lane = _mm512_srli_epi16(e, 3);
    // Scale vector j, lane L: sub-block 8 (L / 2) + L % 2 + 2 j.
    const __m512i base = _mm512_add_epi16(_mm512_slli_epi16(_mm512_srli_epi16(lane, 1), 3),
                                          _mm512_and_si512(lane, _mm512_set1_epi16(1)));
    for (int j = 0; j < 4; ++j) {
      out.scales[j] = _mm512_permutexvar_epi16(_mm512_add_epi16(base, _mm512_set1_epi16(static_cast<short>(2 * j))), wide);
    }
    out.min_pairs = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), low4));
    const __m512i q = _mm512_loadu_si512(b->qs);
    const __m512i three = _mm512_set1_epi8(3);
    out.codes[0] = _mm512_and_si512(q, three);
    out.codes[1] = _mm512_and_si512(_mm512_srli_epi16(q, 2), three);
    out.codes[2] = _mm512_and_si512(_mm512_srli_epi16(q, 4), three);
    out.codes[3] = _mm512_and_si512(_mm512_srli_epi16(q, 6), three);
    out.d = half_to_float(b->d);
    out.dmin = half_to_float(b->dmin);
  }

  static void decode(const BlockQ8_K* a, Activation& out) {
    for (int j = 0; j < 4; ++j) {
      const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a->qs + 32 * j));
      const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a->qs + 128 + 32 * j));
      out.codes[j] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    }
    std::memcpy(out.bsum_pairs, a->bsums, sizeof(out.bsum_pairs));
    out.d = a->d;
  }

  static void chunk_sums(const __m512i parts[4], __m512i chunks[4]) {
    chunks[0] = _mm512_add_epi32(parts[0], parts[1]);
    chunks[1] = _mm512_add_epi32(parts[2], parts[3]);
  }
  // GEMV: one row's chunk sums and mins terms (elements 0, 1).
  static void gemv_row(const Block* b, const Activation& a, __m128i& chunks, __m128i& mins) {
    Row w;
    decode(b, w);
    const __m128i parts = lane_sums(superblock_dot<Q2_KOrder>(w, a));
    chunks = _mm_hadd_epi32(parts, parts);
    const __m256i m = _mm256_madd_epi16(w.min_pairs, _mm256_load_si256(reinterpret_cast<const __m256i*>(a.bsum_pairs)));
    const __m128i h = _mm_hadd_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    mins = _mm_hadd_epi32(h, h);
  }
  static void store_min_pairs(const Row& w, int32_t* out) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), w.min_pairs);
  }
};

// The float step of 16 outputs for one super-block, in llama.cpp's order: per chunk
// one FMA into each chain.
template <class T>
inline void float_step(const __m512i chunks[T::kChunks], const __m512i mins[T::kChunks], __m512 d_w, __m512 dmin_w,
                       __m512 d_a, __m512& sums, __m512& min_sums) {
  const __m512 d = _mm512_mul_ps(d_w, d_a);
  const __m512 dmin = _mm512_mul_ps(dmin_w, d_a);
  for (int c = 0; c < T::kChunks; ++c) {
    sums = _mm512_fmadd_ps(_mm512_cvtepi32_ps(chunks[c]), d, sums);
    min_sums = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mins[c]), dmin, min_sums);
  }
}

// ---------------------------------------------------------------- GEMV (and vec_dot)
// Per 16 rows and super-block: each row's chunk sums and mins terms (element c =
// chunk c), and scales.
struct alignas(64) GemvSlot {
  __m128i chunks[16];
  __m128i mins[16];
  float d[16], dmin[16];
};

// 16 rows' 4-element vectors -> 4 vectors: lane r of out[c] = element c of rows[r].
inline void rows_to_lanes(const __m128i rows[16], __m512i out[4]) {
  // 4 rows, row-major (128-bit lane = row) -> chunk-major (128-bit lane c, element =
  // row), the form transpose_lanes takes.
  const __m512i to_chunk_major = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  __m512i by_chunk[4];
  for (int g = 0; g < 4; ++g) {
    by_chunk[g] = _mm512_permutexvar_epi32(to_chunk_major, _mm512_load_si512(reinterpret_cast<const void*>(rows + 4 * g)));
  }
  transpose_lanes(by_chunk, out);
}

// Rows stream from memory one at a time; per super-block each row leaves its integer
// chunk sums in a slot, and every 16 rows the float chains run 16 rows wide.
template <class T>
void gemv(int64_t k, const uint8_t* w, size_t w_row_bytes, int64_t rows, const uint8_t* a, float* out) {
  const int64_t blocks = k / kSuperBlock;
  thread_local std::vector<typename T::Activation> activation;
  thread_local std::vector<GemvSlot> slots;
  activation.resize(static_cast<size_t>(blocks));
  slots.resize(static_cast<size_t>(blocks));
  const auto* ab = reinterpret_cast<const BlockQ8_K*>(a);
  for (int64_t s = 0; s < blocks; ++s) T::decode(ab + s, activation[static_cast<size_t>(s)]);
  const typename T::Activation* act = activation.data();
  GemvSlot* slot = slots.data();
  const auto step_bytes = static_cast<int64_t>(sizeof(typename T::Block));
  for (int64_t r0 = 0; r0 < rows; r0 += 16) {
    const int64_t n = std::min<int64_t>(16, rows - r0);
    for (int64_t i = 0; i < 16; ++i) {
      if (i >= n) {
        for (int64_t s = 0; s < blocks; ++s) {
          slot[s].chunks[i] = slot[s].mins[i] = _mm_setzero_si128();
          slot[s].d[i] = slot[s].dmin[i] = 0.0f;
        }
        continue;
      }
      const uint8_t* row = w + (r0 + i) * static_cast<int64_t>(w_row_bytes);
      for (int64_t s = 0; s < blocks; ++s) {
        prefetch_step(row + s * step_bytes, step_bytes);
        const auto* b = reinterpret_cast<const typename T::Block*>(row) + s;
        T::gemv_row(b, act[s], slot[s].chunks[i], slot[s].mins[i]);
        slot[s].d[i] = half_to_float(b->d);
        slot[s].dmin[i] = half_to_float(b->dmin);
      }
    }
    __m512 sums = _mm512_setzero_ps(), min_sums = _mm512_setzero_ps();
    for (int64_t s = 0; s < blocks; ++s) {
      __m512i chunks[4], mins[4];
      rows_to_lanes(slot[s].chunks, chunks);
      rows_to_lanes(slot[s].mins, mins);
      float_step<T>(chunks, mins, _mm512_load_ps(slot[s].d), _mm512_load_ps(slot[s].dmin), _mm512_set1_ps(act[s].d),
                    sums, min_sums);
    }
    const auto mask = static_cast<__mmask16>((1u << n) - 1u);
    _mm512_mask_storeu_ps(out + r0, mask, _mm512_sub_ps(sums, min_sums));
  }
}

template <class T>
float vec_dot(int64_t k, const void* w, const void* a) {
  float out = 0.0f;
  gemv<T>(k, static_cast<const uint8_t*>(w), 0, 1, static_cast<const uint8_t*>(a), &out);
  return out;
}

// ---------------------------------------------------------------- GEMM: 4 rows x 4 tokens
template <class T>
struct alignas(64) WeightTile {
  __m512i codes[4][4];  // [row][vector]
  __m512i scales[4][T::kScaleVectors];
  int32_t min_pairs[T::kMinPairs / 4][4][4];  // [pair / 4][row][pair % 4]: one vector per 4 pairs
  float d[4], dmin[4];
};

template <class T>
struct alignas(64) ActivationGroup {
  __m512i codes[4][4];                 // [token][vector]
  int32_t bsum_pairs[T::kMinPairs][4];  // [pair][token]
  float d[4];
};

template <class T>
void decode_tile(const uint8_t* const row[4], int64_t blocks, WeightTile<T>* tiles) {
  const auto step_bytes = static_cast<int64_t>(sizeof(typename T::Block));
  for (int r = 0; r < 4; ++r) {
    for (int64_t s = 0; s < blocks; ++s) {
      prefetch_step(row[r] + s * step_bytes, step_bytes);
      typename T::Row decoded;
      T::decode(reinterpret_cast<const typename T::Block*>(row[r]) + s, decoded);
      WeightTile<T>& tile = tiles[s];
      for (int j = 0; j < 4; ++j) tile.codes[r][j] = decoded.codes[j];
      for (int j = 0; j < T::kScaleVectors; ++j) tile.scales[r][j] = decoded.scales[j];
      alignas(32) int32_t pairs[T::kMinPairs];
      T::store_min_pairs(decoded, pairs);
      for (int p = 0; p < T::kMinPairs; ++p) tile.min_pairs[p / 4][r][p % 4] = pairs[p];
      tile.d[r] = decoded.d;
      tile.dmin[r] = decoded.dmin;
    }
  }
}

template <class T>
void decode_group(const uint8_t* const token[4], int64_t blocks, ActivationGroup<T>* groups) {
  for (int t = 0; t < 4; ++t) {
    for (int64_t s = 0; s < blocks; ++s) {
      typename T::Activation decoded;
      T::decode(reinterpret_cast<const BlockQ8_K*>(token[t]) + s, decoded);
      ActivationGroup<T>& group = groups[s];
      for (int j = 0; j < 4; ++j) group.codes[t][j] = decoded.codes[j];
      for (int p = 0; p < T::kMinPairs; ++p) group.bsum_pairs[p][t] = decoded.bsum_pairs[p];
      group.d[t] = decoded.d;
    }
  }
}

// 16 outputs (lane 4 r + t) over all super-blocks.
template <class T>
inline __m512 run_output_tile(const WeightTile<T>* w, const ActivationGroup<T>* a, int64_t blocks) {
  __m512 sums = _mm512_setzero_ps(), min_sums = _mm512_setzero_ps();
  // Lane o: row o / 4 (from d[0..3] / dmin[0..3], i.e. floats 0-3 / 4-7 of the tile's pair).
  const __m512i row_of_lane = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  const __m512i row_of_lane_dmin = _mm512_add_epi32(row_of_lane, _mm512_set1_epi32(4));
  for (int64_t s = 0; s < blocks; ++s) {
    const WeightTile<T>& wt = w[s];
    const ActivationGroup<T>& ag = a[s];
    __m512i acc[16];
    PICO_UNROLL for (int o = 0; o < 16; ++o) acc[o] = _mm512_setzero_si512();
    PICO_UNROLL for (int j = 0; j < 4; ++j) {
      PICO_UNROLL for (int r = 0; r < 4; ++r) {
        const __m512i codes = wt.codes[r][j];
        const __m512i scales = wt.scales[r][T::scale_vector(j)];
        PICO_UNROLL for (int t = 0; t < 4; ++t) {
          acc[4 * r + t] = _mm512_dpwssd_epi32(acc[4 * r + t], _mm512_maddubs_epi16(codes, ag.codes[t][j]), scales);
        }
      }
    }
    __m512i parts[4], chunks[4];
    reduce16(acc, parts);
    T::chunk_sums(parts, chunks);
    __m512i mins[T::kChunks];
    for (int c = 0; c < T::kChunks; ++c) mins[c] = _mm512_setzero_si512();
    PICO_UNROLL for (int p = 0; p < T::kMinPairs; ++p) {
      const __m512i row_pairs = broadcast_in_lanes(_mm512_load_si512(wt.min_pairs[p / 4]), p % 4);
      const __m512i token_pairs = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(ag.bsum_pairs[p])));
      const int c = T::chunk_of_pair(p);
      mins[c] = _mm512_add_epi32(mins[c], _mm512_madd_epi16(row_pairs, token_pairs));
    }
    const __m512 row_scales = _mm512_castps256_ps512(_mm256_load_ps(wt.d));  // d[0..3], dmin[0..3]
    const __m512 d_a = _mm512_broadcast_f32x4(_mm_load_ps(ag.d));
    float_step<T>(chunks, mins, _mm512_permutexvar_ps(row_of_lane, row_scales),
                  _mm512_permutexvar_ps(row_of_lane_dmin, row_scales), d_a, sums, min_sums);
  }
  return _mm512_sub_ps(sums, min_sums);
}

template <class T>
void gemm(int64_t k, const void* w, size_t w_row_bytes, int64_t rows, const void* a, size_t a_row_bytes, int64_t cols,
          float* out, int64_t out_stride) {
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* abytes = static_cast<const uint8_t*>(a);
  if (cols == 1) {
    gemv<T>(k, wb, w_row_bytes, rows, abytes, out);
    return;
  }
  const int64_t blocks = k / kSuperBlock;
  const int64_t row_tiles = (rows + 3) / 4;
  const auto tile_bytes = static_cast<int64_t>(sizeof(WeightTile<T>)) * blocks;
  const int64_t block_tiles = std::min<int64_t>(row_tiles, std::max<int64_t>(1, static_cast<int64_t>(kWeightPanelBytes) / tile_bytes));
  thread_local std::vector<WeightTile<T>> weights;
  thread_local std::vector<ActivationGroup<T>> activations;
  weights.resize(static_cast<size_t>(block_tiles * blocks));
  activations.resize(static_cast<size_t>(blocks));
  for (int64_t tile0 = 0; tile0 < row_tiles; tile0 += block_tiles) {
    const int64_t tiles = std::min(block_tiles, row_tiles - tile0);
    for (int64_t i = 0; i < tiles; ++i) {
      // Rows past the end repeat the last row; their outputs are not stored.
      const uint8_t* row[4];
      for (int r = 0; r < 4; ++r) row[r] = wb + std::min(4 * (tile0 + i) + r, rows - 1) * static_cast<int64_t>(w_row_bytes);
      decode_tile<T>(row, blocks, weights.data() + i * blocks);
    }
    for (int64_t c0 = 0; c0 < cols; c0 += 4) {
      const uint8_t* token[4];
      for (int t = 0; t < 4; ++t) token[t] = abytes + std::min(c0 + t, cols - 1) * static_cast<int64_t>(a_row_bytes);
      decode_group<T>(token, blocks, activations.data());
      const int64_t n_tokens = std::min<int64_t>(4, cols - c0);
      for (int64_t i = 0; i < tiles; ++i) {
        alignas(64) float result[16];
        _mm512_store_ps(result, run_output_tile<T>(weights.data() + i * blocks, activations.data(), blocks));
        const int64_t r_first = 4 * (tile0 + i);
        const int64_t n_rows = std::min<int64_t>(4, rows - r_first);
        for (int64_t t = 0; t < n_tokens; ++t) {
          for (int64_t r = 0; r < n_rows; ++r) out[(c0 + t) * out_stride + r_first + r] = result[4 * r + t];
        }
      }
    }
  }
}

}  // namespace

void set_k_quant_repack_order_kernels_avx512(KernelTable& table) {
  set_kernel(table, GgmlType::Q4_K, vec_dot<Q4_KOrder>, gemm<Q4_KOrder>);
  set_kernel(table, GgmlType::Q2_K, vec_dot<Q2_KOrder>, gemm<Q2_KOrder>);
}

}  // namespace pico::cpu
