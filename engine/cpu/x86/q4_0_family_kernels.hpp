// Q4_0 and IQ4_NL against Q8_0 in llama.cpp's float order, for the avx2 and avx512
// levels (included by avx2_kernels.cpp and avx512_kernels.cpp; internal linkage, see
// tile_driver.hpp).
//
// Per output, as llama.cpp's repacked x86 kernels (ggml-cpu/arch/x86/repack.cpp,
// gemv_/gemm_q4_b32_8x8_q8_0_lut_avx, every path and token count alike): the exact
// integer sum s_b of each 32-element block b, then one chain from 0 over the blocks in
// order, acc = fma(float(s_b), d_w[b] * d_a[b], acc), no final reduction. So pico's
// logits equal llama.cpp's to the bit where the activations are quantized alike.
//
// One chain per output is latency-bound in a one-row dot, so the GEMV and GEMM put
// L::kRows weight rows (16 with AVX-512, 8 with AVX2) in the lanes of one vector: per
// block, the rows' code bytes are loaded and transposed in registers (lane r, vector
// x: codes 4x..4x+3 of row r), and each token meets them with its code dwords
// broadcast, one int8 product per 4 codes of every row. The decoded block serves up to
// L::kTokens tokens before the next one is loaded, so 2-8 tokens cost far less than
// that many GEMVs. vec_dot does the same operations on one output, in scalar code.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu/kernels.hpp"
#include "cpu/x86/ymm_kernels.hpp"  // primitives (load128, half_to_float, dot_u8_s8 ...)
#include "quant/blocks.hpp"

namespace pico::cpu {
namespace {
namespace q4family {

static_assert(sizeof(quant::BlockQ4_0) == 18 && sizeof(quant::BlockIQ4_NL) == 18 && sizeof(quant::BlockQ8_0) == 34);
constexpr int64_t kWeightBlockBytes = 18;  // f16 scale, then 16 bytes of nibbles

// The two weight types: block layout alike, the value of code u differs.
struct Q4_0Values {
  static int value(int u) { return u - 8; }
};
struct IQ4_NLValues {
  static int value(int u) { return quant::kIq4nlValues[u]; }
};

// 16 bytes holding the 16 values u + offset of the codes u, for vpshufb.
template <class Values>
inline __m128i shifted_table(int offset) {
  alignas(16) int8_t t[16];
  for (int u = 0; u < 16; ++u) t[u] = static_cast<int8_t>(Values::value(u) + offset);
  return _mm_load_si128(reinterpret_cast<const __m128i*>(t));
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
// ---------------------------------------------------------------- AVX-512: 16 rows per vector
// Codes as unsigned bytes u + kOffset (Q4_0: the nibble itself, offset 8; IQ4_NL: its
// value + 128), vpdpbusd against the signed activation codes, and the bias
// -kOffset * sum(a) starting each sum: exact.
template <class Values>
struct Lanes {
  static constexpr int kRows = 16;
  static constexpr int kTokens = 8;
  static constexpr bool kIsQ4_0 = std::is_same_v<Values, Q4_0Values>;
  static constexpr int kOffset = kIsQ4_0 ? 8 : 128;
  using I = __m512i;
  using F = __m512;

  // A block of kRows rows: x[j], lane r: codes 4j..4j+3 of row r (unsigned); the scales.
  struct alignas(64) Group {
    I x[8];
    F d;
  };

  // p: the code bytes of row 0's block; rows `stride` bytes apart.
  static void load_codes(const uint8_t* p, int64_t stride, Group& d) {
    // m[q], 128-bit lane i: row 4i + q. Transposing the 4 x 4 dwords of each lane
    // across m[0..3] leaves dword j of row 4i + q in u[j], lane 4i + q.
    I m[4];
    for (int q = 0; q < 4; ++q) {
      I v = _mm512_castsi128_si512(load128(p + q * stride));
      v = _mm512_inserti32x4(v, load128(p + (q + 4) * stride), 1);
      v = _mm512_inserti32x4(v, load128(p + (q + 8) * stride), 2);
      m[q] = _mm512_inserti32x4(v, load128(p + (q + 12) * stride), 3);
    }
    const I t0 = _mm512_unpacklo_epi32(m[0], m[1]), t1 = _mm512_unpackhi_epi32(m[0], m[1]);
    const I t2 = _mm512_unpacklo_epi32(m[2], m[3]), t3 = _mm512_unpackhi_epi32(m[2], m[3]);
    const I u[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2), _mm512_unpacklo_epi64(t1, t3),
                    _mm512_unpackhi_epi64(t1, t3)};
    const I mask = _mm512_set1_epi8(0x0f);
    for (int j = 0; j < 4; ++j) {
      d.x[j] = _mm512_and_si512(u[j], mask);  // codes 4j..4j+3 (low nibbles)
      d.x[j + 4] = _mm512_and_si512(_mm512_srli_epi16(u[j], 4), mask);  // codes 16+4j.. (high nibbles)
    }
    if constexpr (!kIsQ4_0) {
      const I table = _mm512_broadcast_i32x4(shifted_table<Values>(kOffset));
      for (auto& x : d.x) x = _mm512_shuffle_epi8(table, x);
    }
  }

  // The f16 scales at `p` + offsets[r] (the blocks' first bytes), as floats.
  static F scales(const uint8_t* p, I offsets) {
    const I words = _mm512_i32gather_epi32(offsets, p, 1);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words));
  }
  static I row_offsets(int64_t stride) {
    const auto s = static_cast<int32_t>(stride);
    return _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                              _mm512_set1_epi32(s));
  }

  // Every row's exact s_b against the 32 codes `a` (as 8 dwords).
  static I block_sums(const Group& w, const int32_t* a, int32_t bias) {
    I even = _mm512_set1_epi32(bias), odd = _mm512_setzero_si512();
    for (int x = 0; x < 8; x += 2) {
      even = _mm512_dpbusd_epi32(even, w.x[x], _mm512_set1_epi32(a[x]));
      odd = _mm512_dpbusd_epi32(odd, w.x[x + 1], _mm512_set1_epi32(a[x + 1]));
    }
    return _mm512_add_epi32(even, odd);
  }

  static F zero() { return _mm512_setzero_ps(); }
  static F step(F acc, I sums, F d_w, float d_a) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_mul_ps(d_w, _mm512_set1_ps(d_a)), acc);
  }
  static void store(float* out, F v, int64_t rows) {
    const auto valid = rows >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << rows) - 1u);
    _mm512_mask_storeu_ps(out, valid, v);
  }
};
#else
// ---------------------------------------------------------------- AVX2: 8 rows per vector
// Q4_0: unsigned nibbles (offset 8) in vpmaddubsw; the 8 pair sums of a lane stay
// below 2^15 (16 products of at most 15 * 128), so they add up in int16 before one
// vpmaddwd. IQ4_NL: signed values, vpmaddubsw on |w| and a with w's sign (pairs below
// 2^15), each widened to int32.
template <class Values>
struct Lanes {
  static constexpr int kRows = 8;
  static constexpr int kTokens = 4;
  static constexpr bool kIsQ4_0 = std::is_same_v<Values, Q4_0Values>;
  static constexpr int kOffset = kIsQ4_0 ? 8 : 0;
  using I = __m256i;
  using F = __m256;

  struct alignas(32) Group {
    I x[8];
    F d;
  };

  static void load_codes(const uint8_t* p, int64_t stride, Group& d) {
    // m[q], 128-bit lane i: row 4i + q (see the AVX-512 version).
    I m[4];
    for (int q = 0; q < 4; ++q) m[q] = _mm256_set_m128i(load128(p + (q + 4) * stride), load128(p + q * stride));
    const I t0 = _mm256_unpacklo_epi32(m[0], m[1]), t1 = _mm256_unpackhi_epi32(m[0], m[1]);
    const I t2 = _mm256_unpacklo_epi32(m[2], m[3]), t3 = _mm256_unpackhi_epi32(m[2], m[3]);
    const I u[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2), _mm256_unpacklo_epi64(t1, t3),
                    _mm256_unpackhi_epi64(t1, t3)};
    const I mask = _mm256_set1_epi8(0x0f);
    for (int j = 0; j < 4; ++j) {
      d.x[j] = _mm256_and_si256(u[j], mask);
      d.x[j + 4] = _mm256_and_si256(_mm256_srli_epi16(u[j], 4), mask);
    }
    if constexpr (!kIsQ4_0) {
      const __m128i t = shifted_table<Values>(0);
      const I table = _mm256_set_m128i(t, t);
      for (auto& x : d.x) x = _mm256_shuffle_epi8(table, x);
    }
  }

  static F scales(const uint8_t* p, I offsets) {
    const I words = _mm256_i32gather_epi32(reinterpret_cast<const int*>(p), offsets, 1);
    // Low 16 bits of each dword, packed in order into the low 128 bits.
    const I low = _mm256_and_si256(words, _mm256_set1_epi32(0xffff));
    const I packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(low, low), 0x08);
    return _mm256_cvtph_ps(_mm256_castsi256_si128(packed));
  }
  static I row_offsets(int64_t stride) {
    const auto s = static_cast<int32_t>(stride);
    return _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(s));
  }

  static I block_sums(const Group& w, const int32_t* a, int32_t bias) {
    const I ones = _mm256_set1_epi16(1);
    if constexpr (kIsQ4_0) {
      I pairs = _mm256_setzero_si256();
      for (int x = 0; x < 8; ++x) pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(w.x[x], _mm256_set1_epi32(a[x])));
      return _mm256_add_epi32(_mm256_madd_epi16(pairs, ones), _mm256_set1_epi32(bias));
    } else {
      I sums = _mm256_set1_epi32(bias);
      for (int x = 0; x < 8; ++x) {
        const I signed_a = _mm256_sign_epi8(_mm256_set1_epi32(a[x]), w.x[x]);
        sums = _mm256_add_epi32(sums, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w.x[x]), signed_a), ones));
      }
      return sums;
    }
  }

  static F zero() { return _mm256_setzero_ps(); }
  static F step(F acc, I sums, F d_w, float d_a) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(d_w, _mm256_set1_ps(d_a)), acc);
  }
  static void store(float* out, F v, int64_t rows) {
    if (rows >= 8) {
      _mm256_storeu_ps(out, v);
      return;
    }
    alignas(32) float tmp[8];
    _mm256_store_ps(tmp, v);
    std::memcpy(out, tmp, static_cast<size_t>(rows) * sizeof(float));
  }
};
#endif

// One output the way the lanes compute it: exact block sums, one fma chain.
template <class Values>
float vec_dot(int64_t k, const void* w, const void* a) {
  const auto* wb = static_cast<const quant::BlockQ4_0*>(w);  // IQ4_NL has the same layout
  const auto* ab = static_cast<const quant::BlockQ8_0*>(a);
  float acc = 0.0f;
  for (int64_t b = 0; b < k / 32; ++b) {
    int32_t sum = 0;
    for (int j = 0; j < 16; ++j) {
      sum += Values::value(wb[b].qs[j] & 0x0f) * ab[b].qs[j];
      sum += Values::value(wb[b].qs[j] >> 4) * ab[b].qs[j + 16];
    }
    const float d = half_to_float(wb[b].d) * half_to_float(ab[b].d);
    acc = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(static_cast<float>(sum)), _mm_set_ss(d), _mm_set_ss(acc)));
  }
  return acc;
}

// A growable per-thread buffer of a trivial T. Not std::vector<int32_t> or <uint8_t>:
// those would instantiate library code with this file's target flags, which the linker
// may then keep for every caller (see set_kernel in kernels.hpp).
template <class T>
struct Scratch {
  T* data = nullptr;
  size_t size = 0;
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { delete[] data; }
  T* get(int64_t n) {
    if (static_cast<size_t>(n) > size) {
      delete[] data;
      data = new T[static_cast<size_t>(n)];
      size = static_cast<size_t>(n);
    }
    return data;
  }
};

// The activations of a chunk of C tokens, packed per block for the tiles: the codes
// of token c as 8 dwords at [8 c], its bias (-kOffset * sum of its codes) at
// [8 C + c], its scale's bits at [9 C + c]; 10 C int32 per block. Chunks of
// L::kTokens tokens one after the other, the last one possibly shorter.
constexpr int64_t kPackedWords = 10;

// (Out of line: once per call, and the tiles' loop stays compact.)
template <int kOffset>
[[gnu::noinline]] int32_t* pack_activations(const uint8_t* a, size_t a_row_bytes, int64_t cols, int64_t nb,
                                            int kTokens, Scratch<int32_t>& scratch) {
  int32_t* packed = scratch.get(cols * nb * kPackedWords);
  for (int64_t c0 = 0; c0 < cols; c0 += kTokens) {
    const int64_t n = cols - c0 < kTokens ? cols - c0 : kTokens;
    int32_t* chunk = packed + c0 * nb * kPackedWords;
    for (int64_t j = 0; j < n; ++j) {
      const auto* blocks = reinterpret_cast<const quant::BlockQ8_0*>(a + (c0 + j) * static_cast<int64_t>(a_row_bytes));
      for (int64_t b = 0; b < nb; ++b) {
        int32_t* record = chunk + b * kPackedWords * n;
        std::memcpy(record + 8 * j, blocks[b].qs, 32);
        int sum = 0;
        if constexpr (kOffset != 0) sum = hsum_i32(dot_u8_s8(_mm256_set1_epi8(1), load256(blocks[b].qs)));
        record[8 * n + j] = -kOffset * sum;
        const float d = half_to_float(blocks[b].d);
        std::memcpy(record + 9 * n + j, &d, 4);
      }
    }
  }
  return packed;
}

// Spreads the prefetches of the next row group (`lines` cache lines from `next`) over
// the blocks of the current one, so that it streams in while this one computes (a
// GEMV's weights come from memory; 16 interleaved row streams are more than the
// hardware prefetcher follows well).
struct GroupPrefetch {
  const uint8_t* next = nullptr;
  int64_t lines = 0;
  int64_t per_block = 0;
  void at_block(int64_t b) const {
    if (next == nullptr) return;
    const int64_t end = (b + 1) * per_block < lines ? (b + 1) * per_block : lines;
    for (int64_t i = b * per_block; i < end; ++i) __builtin_prefetch(next + i * 64);
  }
};

// Weight blocks decoded from the raw rows as the tile goes.
template <class L>
struct RawRows {
  const uint8_t* w;
  int64_t stride;
  typename L::I offsets;
  GroupPrefetch prefetch;
  void block(int64_t b, typename L::Group& g) const {
    const uint8_t* p = w + b * kWeightBlockBytes;
    L::load_codes(p + 2, stride, g);
    g.d = L::scales(p, offsets);
    prefetch.at_block(b);
  }
};

// Weight blocks decoded beforehand (several token chunks meet each).
template <class L>
struct DecodedRows {
  const typename L::Group* groups;
  void block(int64_t b, typename L::Group& g) const { g = groups[b]; }
};

// One group of L::kRows rows (`rows` of them real) x C tokens, all blocks.
template <class L, int C, class Source>
void group_tile(const Source& source, int64_t nb, const int32_t* act, float* out, int64_t out_stride, int64_t rows) {
  using F = typename L::F;
  F acc[C];
  for (int c = 0; c < C; ++c) acc[c] = L::zero();
  for (int64_t b = 0; b < nb; ++b) {
    typename L::Group g;
    source.block(b, g);
    const int32_t* record = act + b * kPackedWords * C;
    for (int c = 0; c < C; ++c) {
      float d_a;
      std::memcpy(&d_a, record + 9 * C + c, 4);
      acc[c] = L::step(acc[c], L::block_sums(g, record + 8 * c, record[8 * C + c]), g.d, d_a);
    }
  }
  for (int c = 0; c < C; ++c) L::store(out + c * out_stride, acc[c], rows);
}

template <class L, class Source>
void group_tokens(int n, const Source& source, int64_t nb, const int32_t* act, float* out, int64_t out_stride,
                  int64_t rows) {
  static_assert(L::kTokens == 4 || L::kTokens == 8);
  switch (n) {
    case 1: return group_tile<L, 1>(source, nb, act, out, out_stride, rows);
    case 2: return group_tile<L, 2>(source, nb, act, out, out_stride, rows);
    case 3: return group_tile<L, 3>(source, nb, act, out, out_stride, rows);
    default: break;
  }
  if constexpr (L::kTokens == 8) {
    switch (n) {
      case 4: return group_tile<L, 4>(source, nb, act, out, out_stride, rows);
      case 5: return group_tile<L, 5>(source, nb, act, out, out_stride, rows);
      case 6: return group_tile<L, 6>(source, nb, act, out, out_stride, rows);
      case 7: return group_tile<L, 7>(source, nb, act, out, out_stride, rows);
      default: return group_tile<L, 8>(source, nb, act, out, out_stride, rows);
    }
  } else {
    return group_tile<L, 4>(source, nb, act, out, out_stride, rows);
  }
}

// Decoded weights kept per block of row groups, over all token chunks: about half an
// L2 cache.
constexpr int64_t kPanelBytes = int64_t{512} << 10;

template <class Values>
void gemm(int64_t k, const void* w, size_t w_row_bytes, int64_t rows, const void* a, size_t a_row_bytes, int64_t cols,
          float* out, int64_t out_stride) {
  using L = Lanes<Values>;
  using Group = typename L::Group;
  constexpr int R = L::kRows;
  const auto* wb = static_cast<const uint8_t*>(w);
  const int64_t nb = k / 32;
  const auto stride = static_cast<int64_t>(w_row_bytes);
  if (rows <= 0 || cols <= 0) return;
  if (nb == 0) {
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t r = 0; r < rows; ++r) out[c * out_stride + r] = 0.0f;
    return;
  }

  thread_local Scratch<int32_t> act_scratch;
  const int32_t* act =
      pack_activations<L::kOffset>(static_cast<const uint8_t*>(a), a_row_bytes, cols, nb, L::kTokens, act_scratch);

  // A last group of fewer than R rows (or rows too far apart for the gather's int32
  // offsets) is copied into a buffer of R rows first, the missing ones zeros.
  thread_local Scratch<uint8_t> tail_scratch;
  constexpr int64_t kMaxOffset = std::numeric_limits<int32_t>::max();
  const bool far_apart = stride > kMaxOffset / R;
  const auto rows_of = [&](int64_t g, int64_t& nr) -> RawRows<L> {
    const int64_t r0 = g * R;
    nr = rows - r0 < R ? rows - r0 : R;
    RawRows<L> src{wb + r0 * stride, stride, L::row_offsets(stride), {}};
    if (nr < R || far_apart) {
      const int64_t compact = nb * kWeightBlockBytes;
      uint8_t* tail = tail_scratch.get(R * compact);
      for (int64_t i = 0; i < nr; ++i) {
        std::memcpy(tail + i * compact, src.w + i * stride, static_cast<size_t>(compact));
      }
      std::memset(tail + nr * compact, 0, static_cast<size_t>((R - nr) * compact));
      src = {tail, compact, L::row_offsets(compact), {}};
    } else if (r0 + R < rows) {
      const int64_t next_rows = rows - (r0 + R) < R ? rows - (r0 + R) : R;
      src.prefetch.next = src.w + R * stride;
      src.prefetch.lines = (next_rows * stride + 63) / 64;
      src.prefetch.per_block = (src.prefetch.lines + nb - 1) / nb;
    }
    return src;
  };

  const int64_t n_groups = (rows + R - 1) / R;
  if (cols <= L::kTokens) {
    // One token chunk: each block decoded in registers and used at once.
    for (int64_t g = 0; g < n_groups; ++g) {
      int64_t nr;
      const RawRows<L> src = rows_of(g, nr);
      group_tokens<L>(static_cast<int>(cols), src, nb, act, out + g * R, out_stride, nr);
    }
    return;
  }
  // Several chunks: a block of row groups decoded once into a panel, then every chunk
  // over it.
  thread_local std::vector<Group> panel;
  int64_t panel_groups = kPanelBytes / (nb * static_cast<int64_t>(sizeof(Group)));
  if (panel_groups < 1) panel_groups = 1;
  if (panel_groups > n_groups) panel_groups = n_groups;
  panel.resize(static_cast<size_t>(panel_groups * nb));
  for (int64_t g0 = 0; g0 < n_groups; g0 += panel_groups) {
    const int64_t g_end = g0 + panel_groups < n_groups ? g0 + panel_groups : n_groups;
    for (int64_t g = g0; g < g_end; ++g) {
      int64_t nr;
      const RawRows<L> src = rows_of(g, nr);
      Group* dst = panel.data() + (g - g0) * nb;
      for (int64_t b = 0; b < nb; ++b) src.block(b, dst[b]);
    }
    for (int64_t c0 = 0; c0 < cols; c0 += L::kTokens) {
      const int n = static_cast<int>(cols - c0 < L::kTokens ? cols - c0 : L::kTokens);
      const int32_t* chunk = act + c0 * nb * kPackedWords;
      for (int64_t g = g0; g < g_end; ++g) {
        const int64_t r0 = g * R;
        const DecodedRows<L> src{panel.data() + (g - g0) * nb};
        group_tokens<L>(n, src, nb, chunk, out + c0 * out_stride + r0, out_stride, rows - r0 < R ? rows - r0 : R);
      }
    }
  }
}

inline void fill_kernels(KernelTable& table) {
  set_kernel(table, GgmlType::Q4_0, vec_dot<Q4_0Values>, gemm<Q4_0Values>);
  set_kernel(table, GgmlType::IQ4_NL, vec_dot<IQ4_NLValues>, gemm<IQ4_NLValues>);
}

}  // namespace q4family
}  // namespace
}  // namespace pico::cpu
