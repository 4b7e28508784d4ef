// The avx512 level (F, BW, DQ, VL, VNNI): the shared 256-bit kernels recompiled with
// VNNI int8 products (ymm_kernels.hpp), replaced by 512-bit kernels for the types
// whose speed matters most (Q4_0, Q8_0: four blocks per step; Q4_K, Q6_K: 512-bit
// products; F16, BF16, F32: 32 elements per step).
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics pass an "undefined" vector as the unused merge operand
// and then warn about it (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "cpu/x86/ymm_kernels.hpp"

namespace pico::cpu {
namespace {

// Fixed-order sum of 16 lanes: halves, then the 8-lane sum.
inline float hsum512(__m512 v) {
  return hsum(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

struct ZmmTiles {
  static constexpr int kRows = 4, kCols = 4, kGemvRows = 1;
  using Acc = __m512;
  static Acc zero() { return _mm512_setzero_ps(); }
  static float reduce(const Acc& acc) { return hsum512(acc); }
};

// Four 32-element blocks as two vectors: the first and second halves of each block's
// codes ([block 0, 1, 2, 3] in 128-bit lanes), so that int32 lane i of both vpdpbusd
// products belongs to block i / 4; for activations, the bias that starts the integer
// sums. Blocks beyond k in the last group are zero codes.
struct Activation4 {
  __m512i lo, hi;
  __m512i bias;
};

inline int64_t blocks_in_step4(int64_t s, int64_t k) {
  const int64_t n = (k - 128 * s) / 32;
  return n < 4 ? n : 4;
}
// The last step's codes: blocks 0..n-1, zeros after.
[[gnu::noinline]] __m512i partial_codes(const BlockQ4_0* b, int64_t n) {
  alignas(64) uint8_t q[64] = {};
  for (int64_t i = 0; i < n; ++i) std::memcpy(q + 16 * i, b[i].qs, 16);
  return _mm512_load_si512(q);
}
// Blocks first, first + 1 of the last step (zeros from block n on).
[[gnu::noinline]] __m512i partial_codes(const BlockQ8_0* b, int64_t n, int64_t first) {
  alignas(64) int8_t q[64] = {};
  for (int64_t i = first; i < n && i < first + 2; ++i) std::memcpy(q + 32 * (i - first), b[i].qs, 32);
  return _mm512_load_si512(q);
}

// Four Q8_0 blocks (n of them real) split into halves (see Activation4).
inline void q8_0_halves4(const BlockQ8_0* b, int64_t n, __m512i& lo, __m512i& hi) {
  __m512i a01, a23;
  if (n == 4) [[likely]] {
    a01 = _mm512_inserti64x4(_mm512_castsi256_si512(load256(b[0].qs)), load256(b[1].qs), 1);
    a23 = _mm512_inserti64x4(_mm512_castsi256_si512(load256(b[2].qs)), load256(b[3].qs), 1);
  } else {
    a01 = partial_codes(b, n, 0);
    a23 = partial_codes(b, n, 2);
  }
  // 128-bit lanes: a01 = [b0 0-15, b0 16-31, b1 0-15, b1 16-31], a23 likewise.
  lo = _mm512_shuffle_i64x2(a01, a23, _MM_SHUFFLE(2, 0, 2, 0));
  hi = _mm512_shuffle_i64x2(a01, a23, _MM_SHUFFLE(3, 1, 3, 1));
}

// Q8_0 activations of step s against weights offset by +offset (to make them
// unsigned): the bias -offset * sum(a) starts the integer sums.
inline Activation4 q8_0_activation4(const uint8_t* row, int64_t s, int64_t k, char offset) {
  const BlockQ8_0* b = block_at<BlockQ8_0>(row, 4 * s);
  const int64_t n = blocks_in_step4(s, k);
  Activation4 a;
  q8_0_halves4(b, n, a.lo, a.hi);
  const __m512i o = _mm512_set1_epi8(offset);
  const __m512i sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), o, a.lo), o, a.hi);
  a.bias = _mm512_sub_epi32(_mm512_setzero_si512(), sum);
  return a;
}

// ---------------------------------------------------------------- Q4_0, Q8_0: one float lane per block
// Per output: the exact integer sum s_b of each block b, its scale product
// d_w[b] * d_a[b], and 16 float chains, chain j = fma over the blocks b = j, j + 16,
// ... in order, summed at the end in hsum512's fixed tree. vec_dot keeps the chains
// as the lanes of one vector; the GEMM puts 16 weight rows in the lanes instead
// (rows interleaved in a decoded panel, the activation dword broadcast), runs the
// chains one after the other and adds them in the same tree: one int8 product per
// 4 codes of 16 outputs and 3 float operations per block of 16 outputs, against
// 3 float operations per 4 blocks of each output with the blocks in the lanes.
template <class Block>
struct BlockLaneTraits;

template <>
struct BlockLaneTraits<BlockQ4_0> {
  static constexpr char kOffset = 8;  // code u holds the value u - 8
  static void codes4(const BlockQ4_0* b, int64_t n, __m512i& lo, __m512i& hi) {
    __m512i raw;
    if (n == 4) [[likely]] {
      raw = _mm512_inserti32x4(_mm512_castsi128_si512(load128(b[0].qs)), load128(b[1].qs), 1);
      raw = _mm512_inserti32x4(raw, load128(b[2].qs), 2);
      raw = _mm512_inserti32x4(raw, load128(b[3].qs), 3);
    } else {
      raw = partial_codes(b, n);
    }
    const __m512i mask = _mm512_set1_epi8(0x0f);
    lo = _mm512_and_si512(raw, mask);
    hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), mask);
  }
  // The 32 codes in element order.
  static __m256i codes32(const BlockQ4_0* b) { return unpack_nibbles(b->qs); }
};

template <>
struct BlockLaneTraits<BlockQ8_0> {
  static constexpr char kOffset = static_cast<char>(0x80);  // code u holds the value u - 128
  static void codes4(const BlockQ8_0* b, int64_t n, __m512i& lo, __m512i& hi) {
    q8_0_halves4(b, n, lo, hi);
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    lo = _mm512_xor_si512(lo, flip);
    hi = _mm512_xor_si512(hi, flip);
  }
  static __m256i codes32(const BlockQ8_0* b) {
    return _mm256_xor_si256(load256(b->qs), _mm256_set1_epi8(static_cast<char>(0x80)));
  }
};

// The f16 scales of blocks 0..n-1 (n <= 16) of `row` as floats, 0 beyond: packed
// in general registers (a vpgatherdd or a store-and-reload here made the one-row dot
// several times slower).
template <class Block>
inline __m512 scales16(const uint8_t* row, int64_t n) {
  const Block* b = reinterpret_cast<const Block*>(row);
  const auto d = [&](int i) { return i < n ? static_cast<uint64_t>(b[i].d) : uint64_t{0}; };
  const auto four = [&](int i) { return static_cast<int64_t>(d(i) | (d(i + 1) << 16) | (d(i + 2) << 32) | (d(i + 3) << 48)); };
  if (n >= 16) [[likely]] {
    const auto full = [&](int i) {
      return static_cast<int64_t>(static_cast<uint64_t>(b[i].d) | (static_cast<uint64_t>(b[i + 1].d) << 16) |
                                  (static_cast<uint64_t>(b[i + 2].d) << 32) | (static_cast<uint64_t>(b[i + 3].d) << 48));
    };
    return _mm512_cvtph_ps(_mm256_set_epi64x(full(12), full(8), full(4), full(0)));
  }
  return _mm512_cvtph_ps(_mm256_set_epi64x(four(12), four(8), four(4), four(0)));
}

// Lanes 2i and 2i + 1 of (a, b) added, a's pairs in lanes 0-7, b's in 8-15.
inline __m512i add_pairs(__m512i a, __m512i b) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  return _mm512_add_epi32(_mm512_permutex2var_epi32(a, even, b), _mm512_permutex2var_epi32(a, odd, b));
}

// An activation row decoded for the one-row dot: per 4 blocks the halves and the
// bias (Activation4 without scales), per 16 blocks the scales.
struct BlockLaneActivation {
  struct Scales {
    __m512 d;
  };
  std::vector<Activation4> quads;
  std::vector<Scales> scales;
};

inline void prepare_activation(const uint8_t* a, int64_t k, char offset, BlockLaneActivation& out) {
  const int64_t nb = k / 32;
  out.quads.resize(static_cast<size_t>((nb + 3) / 4));
  out.scales.resize(static_cast<size_t>((nb + 15) / 16));
  for (int64_t q = 0; q < (nb + 3) / 4; ++q) out.quads[static_cast<size_t>(q)] = q8_0_activation4(a, q, k, offset);
  for (int64_t g = 0; g < (nb + 15) / 16; ++g) {
    out.scales[static_cast<size_t>(g)].d = scales16<BlockQ8_0>(a + g * 16 * static_cast<int64_t>(sizeof(BlockQ8_0)), nb - 16 * g);
  }
}

template <class Block>
inline float block_lane_row_dot(int64_t k, const uint8_t* w, const BlockLaneActivation& a) {
  const int64_t nb = k / 32;
  const auto* wb = reinterpret_cast<const Block*>(w);
  __m512 chains = _mm512_setzero_ps();
  for (int64_t g = 0; g * 16 < nb; ++g) {
    const int64_t n = nb - 16 * g < 16 ? nb - 16 * g : 16;
    __m512i p[4];
    for (int q = 0; q < 4; ++q) {
      const int64_t first = 16 * g + 4 * q;
      const int64_t m = nb - first < 4 ? (nb - first < 0 ? 0 : nb - first) : 4;
      if (m == 0) {
        p[q] = _mm512_setzero_si512();
        continue;
      }
      // Weight rows stream from memory in the GEMV: keep reads in flight (see prefetch_step).
      prefetch_step(reinterpret_cast<const uint8_t*>(wb + first), 4 * static_cast<int64_t>(sizeof(Block)));
      __m512i lo, hi;
      BlockLaneTraits<Block>::codes4(wb + first, m, lo, hi);
      const Activation4& act = a.quads[static_cast<size_t>(first / 4)];
      p[q] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(act.bias, lo, act.lo), hi, act.hi);
    }
    // Lane i of p[q] belongs to block 4 q + i / 4: two rounds of pair sums put block
    // b's sum in lane b.
    const __m512i sums = add_pairs(add_pairs(p[0], p[1]), add_pairs(p[2], p[3]));
    const __m512 d = _mm512_mul_ps(scales16<Block>(w + g * 16 * static_cast<int64_t>(sizeof(Block)), n),
                                   a.scales[static_cast<size_t>(g)].d);
    const __mmask16 valid = n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1u);
    chains = _mm512_mask3_fmadd_ps(d, _mm512_cvtepi32_ps(sums), chains, valid);
  }
  return hsum512(chains);
}

template <class Block>
float block_lane_vec_dot(int64_t k, const void* w, const void* a) {
  thread_local BlockLaneActivation act;
  prepare_activation(static_cast<const uint8_t*>(a), k, BlockLaneTraits<Block>::kOffset, act);
  return block_lane_row_dot<Block>(k, static_cast<const uint8_t*>(w), act);
}

// 16 weight rows decoded for the GEMM, per block: the codes as 8 vectors (vector x,
// lane r: codes 4x..4x+3 of row r, unsigned), then the 16 scales.
constexpr int64_t kLaneBlockBytes = 8 * 64 + 64;

template <class Block>
void decode_row_group(const uint8_t* w, size_t w_row_bytes, int64_t rows, int64_t nb, uint8_t* out) {
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* dst = out + b * kLaneBlockBytes;
    alignas(64) uint32_t codes[16][8] = {};
    alignas(64) float d[16] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const Block* blk = reinterpret_cast<const Block*>(w + r * static_cast<int64_t>(w_row_bytes)) + b;
      _mm256_store_si256(reinterpret_cast<__m256i*>(codes[r]), BlockLaneTraits<Block>::codes32(blk));
      d[r] = half_to_float(blk->d);
    }
    auto* vectors = reinterpret_cast<uint32_t*>(dst);
    for (int x = 0; x < 8; ++x)
      for (int r = 0; r < 16; ++r) vectors[16 * x + r] = codes[r][x];
    std::memcpy(dst + 8 * 64, d, 64);
  }
}

// Per activation row (token), per block: the bias -offset * sum(a) and the scale.
struct LaneTokenBlock {
  int32_t bias;
  float d;
};

// 16 rows x C tokens: every chain of every output, then the tree.
template <int C>
void block_lane_tile(const uint8_t* panel, int64_t nb, const uint8_t* const* a_rows, const LaneTokenBlock* const* tb,
                     int64_t rows, float* out, int64_t out_stride) {
  __m512 chains[C][16];
  for (int j = 0; j < 16; ++j) {
    __m512 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
    for (int64_t b = j; b < nb; b += 16) {
      const uint8_t* wp = panel + b * kLaneBlockBytes;
      __m512i p[C];
      for (int c = 0; c < C; ++c) p[c] = _mm512_set1_epi32(tb[c][b].bias);
      for (int x = 0; x < 8; ++x) {
        const __m512i wv = _mm512_load_si512(wp + 64 * x);
        for (int c = 0; c < C; ++c) {
          int32_t dword;
          std::memcpy(&dword, a_rows[c] + b * static_cast<int64_t>(sizeof(BlockQ8_0)) + 2 + 4 * x, 4);
          p[c] = _mm512_dpbusd_epi32(p[c], wv, _mm512_set1_epi32(dword));
        }
      }
      const __m512 wd = _mm512_load_ps(reinterpret_cast<const float*>(wp + 8 * 64));
      for (int c = 0; c < C; ++c) {
        acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(wd, _mm512_set1_ps(tb[c][b].d)), _mm512_cvtepi32_ps(p[c]), acc[c]);
      }
    }
    for (int c = 0; c < C; ++c) chains[c][j] = acc[c];
  }
  const __mmask16 valid = rows >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << rows) - 1u);
  for (int c = 0; c < C; ++c) {
    __m512 v[8];
    for (int i = 0; i < 8; ++i) v[i] = _mm512_add_ps(chains[c][i], chains[c][i + 8]);
    for (int i = 0; i < 4; ++i) v[i] = _mm512_add_ps(v[i], v[i + 4]);
    for (int i = 0; i < 2; ++i) v[i] = _mm512_add_ps(v[i], v[i + 2]);
    _mm512_mask_storeu_ps(out + c * out_stride, valid, _mm512_add_ps(v[0], v[1]));
  }
}

// Decoded weights kept per block of row groups (see tile_driver.hpp's kWeightPanelBytes).
constexpr int64_t kLanePanelBytes = int64_t{256} << 10;

// Below this many tokens the GEMM runs row by row (matmul_benchmark, Q4_0/Q8_0
// 2048 x 4096, one thread: 4 and 8 tokens took 1.3 and 1.7 ms through the panel
// against 0.7 and 1.4 ms row by row; 16 tokens about equal).
constexpr int64_t kMinPanelTokens = 16;

template <class Block>
void block_lane_gemm(int64_t k, const void* w, size_t w_row_bytes, int64_t rows, const void* a, size_t a_row_bytes,
                     int64_t cols, float* out, int64_t out_stride) {
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* ab = static_cast<const uint8_t*>(a);
  const int64_t nb = k / 32;
  if (cols < kMinPanelTokens) {
    // Few tokens (batched decode): decoding a panel would cost more than it saves, so
    // each weight row, read once, meets every token's prepared activation in turn.
    thread_local std::vector<BlockLaneActivation> acts;
    if (acts.size() < static_cast<size_t>(cols)) acts.resize(static_cast<size_t>(cols));
    for (int64_t c = 0; c < cols; ++c) {
      prepare_activation(ab + c * static_cast<int64_t>(a_row_bytes), k, BlockLaneTraits<Block>::kOffset,
                         acts[static_cast<size_t>(c)]);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* row = wb + r * static_cast<int64_t>(w_row_bytes);
      for (int64_t c = 0; c < cols; ++c) {
        out[c * out_stride + r] = block_lane_row_dot<Block>(k, row, acts[static_cast<size_t>(c)]);
      }
    }
    return;
  }
  // Every token's bias and scale per block.
  thread_local std::vector<LaneTokenBlock> token_blocks;
  token_blocks.resize(static_cast<size_t>(cols * nb));
  for (int64_t c = 0; c < cols; ++c) {
    const auto* blocks = reinterpret_cast<const BlockQ8_0*>(ab + c * static_cast<int64_t>(a_row_bytes));
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i q = load256(blocks[b].qs);
      const __m256i sum = dot_u8_s8(_mm256_set1_epi8(BlockLaneTraits<Block>::kOffset), q);
      token_blocks[static_cast<size_t>(c * nb + b)] = {-hsum_i32(sum), half_to_float(blocks[b].d)};
    }
  }
  const int64_t group_bytes = nb * kLaneBlockBytes;
  int64_t groups_per_panel = kLanePanelBytes / (group_bytes == 0 ? 1 : group_bytes);
  if (groups_per_panel < 1) groups_per_panel = 1;
  const int64_t n_groups = (rows + 15) / 16;
  if (groups_per_panel > n_groups) groups_per_panel = n_groups;
  struct alignas(64) Line {
    uint8_t bytes[64];
  };
  thread_local std::vector<Line> panel;
  panel.resize(static_cast<size_t>(groups_per_panel * group_bytes / 64));
  auto* panel_bytes = reinterpret_cast<uint8_t*>(panel.data());
  constexpr int C = 4;
  for (int64_t g0 = 0; g0 < n_groups; g0 += groups_per_panel) {
    const int64_t ng = n_groups - g0 < groups_per_panel ? n_groups - g0 : groups_per_panel;
    for (int64_t g = 0; g < ng; ++g) {
      const int64_t r = (g0 + g) * 16;
      decode_row_group<Block>(wb + r * static_cast<int64_t>(w_row_bytes), w_row_bytes, rows - r < 16 ? rows - r : 16, nb,
                              panel_bytes + g * group_bytes);
    }
    for (int64_t c = 0; c < cols; c += C) {
      const int64_t n = cols - c < C ? cols - c : C;
      const uint8_t* a_rows[C];
      const LaneTokenBlock* tb[C];
      for (int64_t j = 0; j < n; ++j) {
        a_rows[j] = ab + (c + j) * static_cast<int64_t>(a_row_bytes);
        tb[j] = token_blocks.data() + (c + j) * nb;
      }
      for (int64_t g = 0; g < ng; ++g) {
        const int64_t r = (g0 + g) * 16;
        const int64_t nr = rows - r < 16 ? rows - r : 16;
        float* o = out + c * out_stride + r;
        if (n == C) {
          block_lane_tile<C>(panel_bytes + g * group_bytes, nb, a_rows, tb, nr, o, out_stride);
        } else {
          for (int64_t j = 0; j < n; ++j) block_lane_tile<1>(panel_bytes + g * group_bytes, nb, a_rows + j, tb + j, nr, o + j * out_stride, out_stride);
        }
      }
    }
  }
}

// Q4_K x Q8_K with 512-bit products: each 32 bytes of codes become one vector of
// [low nibbles (sub-block 2j), high nibbles (sub-block 2j + 1)], matching 64
// consecutive activations, weighted by the two sub-block scales in one vpermw. The
// integer sums (exact) are folded to 8 lanes, then the same float steps as the
// 256-bit kernel: 4 product instructions per super-block instead of 16, and no
// per-sub-block broadcasts. load_w decodes a super-block (codes, scales, mins) once,
// so that a GEMM tile reuses it for all its tokens.
struct Q4_KZmmKernel : SuperBlockTiles<BlockQ4_K> {
  struct W {
    __m512i codes[4];
    __m512i scales[4];  // int16, per 16-bit pair of codes
    __m256i mins;       // int16, the min of each 16 activations (pairs with bsums)
    __m256 d, dmin;     // broadcast
  };
  static W load_w(const uint8_t* row, int64_t s, int64_t) {
    const BlockQ4_K* b = block_at<BlockQ4_K>(row, s);
    W w;
    const __m128i sm = decode_scales_k4(b->scales);
    const __m512i scales16 = _mm512_cvtepu8_epi16(_mm256_zextsi128_si256(sm));  // lanes 0-7: the scales
    const __m512i upper_half = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(1), 1);
    const __m512i mask = _mm512_set1_epi8(0x0f);
    for (int j = 0; j < 4; ++j) {
      const __m256i q = load256(b->qs + 32 * j);
      w.codes[j] = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1), mask);
      w.scales[j] = _mm512_permutexvar_epi16(_mm512_add_epi16(upper_half, _mm512_set1_epi16(static_cast<short>(2 * j))), scales16);
    }
    const __m128i mins = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
    w.mins = _mm256_set_m128i(_mm_unpackhi_epi16(mins, mins), _mm_unpacklo_epi16(mins, mins));
    w.d = _mm256_set1_ps(half_to_float(b->d));
    w.dmin = _mm256_set1_ps(half_to_float(b->dmin));
    return w;
  }
  static void step(Acc& acc, const W& w, A a) {
    // vpdpwssd: the scaled pair sums added in one instruction (exact, as madd + add).
    __m512i sumi = _mm512_setzero_si512();
    for (int j = 0; j < 4; ++j) {
      sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(w.codes[j], _mm512_loadu_si512(a->qs + 64 * j)), w.scales[j]);
    }
    const __m256i sum8 = _mm256_add_epi32(_mm512_castsi512_si256(sumi), _mm512_extracti64x4_epi64(sumi, 1));
    // d_w * d_a in every lane: the same product as the scalar one, then broadcast.
    const __m256 ad = _mm256_set1_ps(a->d);
    acc = _mm256_fmadd_ps(_mm256_mul_ps(w.d, ad), _mm256_cvtepi32_ps(sum8), acc);
    acc = _mm256_fnmadd_ps(_mm256_mul_ps(w.dmin, ad), _mm256_cvtepi32_ps(_mm256_madd_epi16(bsums16(a), w.mins)), acc);
  }
};

// Q6_K x Q8_K with 512-bit products, the super-block decoded once in load_w: four
// vectors of 64 unsigned codes u (value u - 32), each matching 64 consecutive
// activations, with the int16 scale of each 16 codes. Folded to 8 lanes, the
// integer sums equal the 256-bit kernel's lane for lane (exact), and the float steps
// are its own: identical results.
struct Q6_KZmmKernel : SuperBlockTiles<BlockQ6_K> {
  struct W {
    __m512i codes[4];
    __m512i scales[4];  // int16, per 16-bit pair of codes
    __m256i scales16;   // the 16 scales as int16 (pair with bsums)
    __m256 d;           // broadcast
  };
  static W load_w(const uint8_t* row, int64_t s, int64_t) {
    const BlockQ6_K* b = block_at<BlockQ6_K>(row, s);
    W w;
    const __m256i mask = _mm256_set1_epi8(0x0f);
    const __m256i two = _mm256_set1_epi8(3);
    const __m128i scales8 = load128(b->scales);
    const __m512i wide = _mm512_cvtepi8_epi16(_mm256_zextsi128_si256(scales8));  // lanes 0-15
    for (int h = 0; h < 2; ++h) {
      const __m256i ql_a = load256(b->ql + 64 * h);
      const __m256i ql_b = load256(b->ql + 64 * h + 32);
      const __m256i qh = load256(b->qh + 32 * h);
      const __m256i u0 = _mm256_or_si256(_mm256_and_si256(ql_a, mask), _mm256_slli_epi16(_mm256_and_si256(qh, two), 4));
      const __m256i u1 = _mm256_or_si256(_mm256_and_si256(ql_b, mask),
                                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), two), 4));
      const __m256i u2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql_a, 4), mask),
                                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), two), 4));
      const __m256i u3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql_b, 4), mask),
                                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), two), 4));
      w.codes[2 * h] = _mm512_inserti64x4(_mm512_castsi256_si512(u0), u1, 1);
      w.codes[2 * h + 1] = _mm512_inserti64x4(_mm512_castsi256_si512(u2), u3, 1);
    }
    // int16 lane i of vector q: the scale of codes 64 q + 2 i, i.e. scale 4 q + i / 8.
    const auto ones = static_cast<int64_t>(0x0001000100010001ull);
    const __m512i lane_group = _mm512_set_epi64(3 * ones, 3 * ones, 2 * ones, 2 * ones, ones, ones, 0, 0);
    for (int q = 0; q < 4; ++q) {
      w.scales[q] = _mm512_permutexvar_epi16(_mm512_add_epi16(lane_group, _mm512_set1_epi16(static_cast<short>(4 * q))), wide);
    }
    w.scales16 = _mm256_cvtepi8_epi16(scales8);
    w.d = _mm256_set1_ps(half_to_float(b->d));
    return w;
  }
  static void step(Acc& acc, const W& w, A a) {
    __m512i sumi = _mm512_setzero_si512();
    for (int q = 0; q < 4; ++q) {
      sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(w.codes[q], _mm512_loadu_si512(a->qs + 64 * q)), w.scales[q]);
    }
    const __m256i sum8 = _mm256_add_epi32(_mm512_castsi512_si256(sumi), _mm512_extracti64x4_epi64(sumi, 1));
    const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(bsums16(a), w.scales16), 5);
    acc = _mm256_fmadd_ps(_mm256_mul_ps(w.d, _mm256_set1_ps(a->d)), _mm256_cvtepi32_ps(_mm256_sub_epi32(sum8, offset)), acc);
  }
};

// Float rows, 32 elements per step into two accumulators (elements 0-15 and 16-31
// of each step), summed at the end: the one-row GEMV was bound by the latency of a
// single FMA chain. The tail is a masked load (zeros beyond k).
template <class Convert>
struct Float16Tiles : ZmmTiles {
  static constexpr int64_t kStep = 32;
  static constexpr int kRows = 2, kCols = 6;  // 24 accumulators, 4 weight registers
  struct Acc {
    __m512 even, odd;
  };
  struct W {
    __m512 v0, v1;
  };
  using A = W;
  static Acc zero() { return {_mm512_setzero_ps(), _mm512_setzero_ps()}; }
  static float reduce(const Acc& acc) { return hsum512(_mm512_add_ps(acc.even, acc.odd)); }
  static __m512 load16(const uint8_t* row, int64_t first, int64_t k) {
    const int64_t n = k - first;
    const auto mask = n >= 16  ? static_cast<__mmask16>(0xffff)
                      : n <= 0 ? static_cast<__mmask16>(0)
                               : static_cast<__mmask16>((1u << n) - 1u);
    return Convert::load16(row + first * Convert::kBytes, mask);
  }
  static W load(const uint8_t* row, int64_t s, int64_t k) { return {load16(row, 32 * s, k), load16(row, 32 * s + 16, k)}; }
  static W load_w(const uint8_t* row, int64_t s, int64_t k) { return load(row, s, k); }
  static A load_a(const uint8_t* row, int64_t s, int64_t k) { return load(row, s, k); }
  static void step(Acc& acc, const W& w, const A& a) {
    acc.even = _mm512_fmadd_ps(w.v0, a.v0, acc.even);
    acc.odd = _mm512_fmadd_ps(w.v1, a.v1, acc.odd);
  }
};

struct HalfToFloat16 {
  static constexpr int64_t kBytes = 2;
  static __m512 load16(const uint8_t* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
};
struct BFloatToFloat16 {
  static constexpr int64_t kBytes = 2;
  static __m512 load16(const uint8_t* p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
  }
};
struct Float16 {
  static constexpr int64_t kBytes = 4;
  static __m512 load16(const uint8_t* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
};

}  // namespace

void fill_avx512_kernels(KernelTable& table) {
  fill_ymm_kernels(table);
  set_kernel(table, GgmlType::Q4_0, block_lane_vec_dot<BlockQ4_0>, block_lane_gemm<BlockQ4_0>);
  set_kernel(table, GgmlType::Q8_0, block_lane_vec_dot<BlockQ8_0>, block_lane_gemm<BlockQ8_0>);
  put_kernel<Q4_KZmmKernel>(table, GgmlType::Q4_K);
  put_kernel<Q6_KZmmKernel>(table, GgmlType::Q6_K);
  put_kernel<Float16Tiles<HalfToFloat16>>(table, GgmlType::F16);
  put_kernel<Float16Tiles<BFloatToFloat16>>(table, GgmlType::BF16);
  put_kernel<Float16Tiles<Float16>>(table, GgmlType::F32);
}

}  // namespace pico::cpu
