// The avx512 level (F, BW, DQ, VL, VNNI): the shared 256-bit kernels recompiled with
// VNNI int8 products (ymm_kernels.hpp), replaced by 512-bit kernels for the types
// whose speed matters most (Q8_0: 16 rows per vector in the GEMM, two rows per
// vector and up to 8 rows per pass in the GEMV, in llama.cpp's float order; Q4_K, Q6_K: 512-bit products;
// F16, BF16, F32: 32 elements per step).
#include "cpu/x86/avx512_intrinsics.hpp"

#include "cpu/x86/k_quant_repack_order_kernels.hpp"
#include "cpu/x86/ymm_kernels.hpp"
#include "cpu/x86/q4_0_family_kernels.hpp"

namespace pico::cpu {
namespace {

// Fixed-order sum of 16 lanes: halves, then the 8-lane sum.
inline float hsum512(__m512 v) {
  return hsum(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

struct ZmmTiles {
  static constexpr int kGemvRows = 1;  // tile shapes: the derived kernels'
  using Acc = __m512;
  static Acc zero() { return _mm512_setzero_ps(); }
  static float reduce(const Acc& acc) { return hsum512(acc); }
};

// ---------------------------------------------------------------- Q8_0 in llama.cpp's float order
// Per output, as llama.cpp's ggml_vec_dot_q8_0_q8_0 (AVX2 code) and its llamafile
// GEMM for 2+ tokens (tinyBLAS_Q0_AVX), which compute alike: per 32-element block b,
// 8 int32 lanes, lane x the exact sum of the products of codes 4x..4x+3; each lane
// converted and fma'd with d_w[b] * d_a[b] into float lane x, the blocks in order; the
// 8 lanes summed at the end in hsum's tree. The one-row dot (vec_dot, GEMV, a few
// tokens) is the shared 256-bit kernel, which runs exactly that loop. The GEMM holds
// 16 weight rows in the lanes of one vector instead: lane x of all 16 rows' outputs in
// one vector (rows interleaved in a decoded panel, the activation dword broadcast),
// so one int8 product instruction per 4 codes of 16 outputs and one scale product
// per block, token and 16 outputs; the conversions and fmas are llama.cpp's own.

// 16 weight rows decoded for the GEMM, per block: the codes as 8 vectors (vector x,
// lane r: codes 4x..4x+3 of row r, plus 128 so that they are unsigned), then the 16
// scales as floats.
constexpr int64_t kLaneBlockBytes = 8 * 64 + 64;

void decode_row_group(const uint8_t* w, size_t w_row_bytes, int64_t rows, int64_t nb, uint8_t* out) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* dst = out + b * kLaneBlockBytes;
    alignas(64) uint32_t codes[16][8] = {};
    alignas(64) float d[16] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const BlockQ8_0* blk = reinterpret_cast<const BlockQ8_0*>(w + r * static_cast<int64_t>(w_row_bytes)) + b;
      _mm256_store_si256(reinterpret_cast<__m256i*>(codes[r]), _mm256_xor_si256(load256(blk->qs), flip));
      d[r] = half_to_float(blk->d);
    }
    auto* vectors = reinterpret_cast<uint32_t*>(dst);
    for (int x = 0; x < 8; ++x)
      for (int r = 0; r < 16; ++r) vectors[16 * x + r] = codes[r][x];
    std::memcpy(dst + 8 * 64, d, 64);
  }
}

// Per token and block, decoded for the GEMM: the codes as 8 dwords (codes 4x..4x+3),
// where lane x's integer sum starts (-128 times the sum of those codes, undoing the
// weights' +128), and the scale. Kept [token group][block][token of the group], so
// that a tile reaches all its tokens' data from one pointer.
struct QuadTokenBlock {
  int32_t codes[8];
  int32_t bias[8];
  float d;
};

// 16 rows x C tokens, lanes X at a time (each lane's chain runs over all blocks before
// the next group of lanes starts), then llama.cpp's hsum tree over the 8 lanes.
template <int C, int X>
void q8_0_lane_tile(const uint8_t* panel, int64_t nb, const QuadTokenBlock* tokens, int64_t rows, float* out,
                    int64_t out_stride) {
  static_assert(8 % X == 0);
  __m512 lanes[C][8];
  for (int x0 = 0; x0 < 8; x0 += X) {
    __m512 acc[C][X];
    PICO_UNROLL for (int c = 0; c < C; ++c)
      PICO_UNROLL for (int x = 0; x < X; ++x) acc[c][x] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* wp = panel + b * kLaneBlockBytes;
      const QuadTokenBlock* t = tokens + b * C;
      const __m512 wd = _mm512_load_ps(reinterpret_cast<const float*>(wp + 8 * 64));
      __m512 d[C];
      PICO_UNROLL for (int c = 0; c < C; ++c) d[c] = _mm512_mul_ps(wd, _mm512_set1_ps(t[c].d));
      PICO_UNROLL for (int x = 0; x < X; ++x) {
        const __m512i wv = _mm512_load_si512(wp + 64 * (x0 + x));
        PICO_UNROLL for (int c = 0; c < C; ++c) {
          const __m512i sum =
              _mm512_dpbusd_epi32(_mm512_set1_epi32(t[c].bias[x0 + x]), wv, _mm512_set1_epi32(t[c].codes[x0 + x]));
          acc[c][x] = _mm512_fmadd_ps(d[c], _mm512_cvtepi32_ps(sum), acc[c][x]);
        }
      }
    }
    PICO_UNROLL for (int c = 0; c < C; ++c)
      PICO_UNROLL for (int x = 0; x < X; ++x) lanes[c][x0 + x] = acc[c][x];
  }
  const __mmask16 valid = rows >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << rows) - 1u);
  for (int c = 0; c < C; ++c) {
    // hsum's tree: (v0 + v4) + (v2 + v6), (v1 + v5) + (v3 + v7), then those two.
    const __m512 even = _mm512_add_ps(_mm512_add_ps(lanes[c][0], lanes[c][4]), _mm512_add_ps(lanes[c][2], lanes[c][6]));
    const __m512 odd = _mm512_add_ps(_mm512_add_ps(lanes[c][1], lanes[c][5]), _mm512_add_ps(lanes[c][3], lanes[c][7]));
    _mm512_mask_storeu_ps(out + c * out_stride, valid, _mm512_add_ps(even, odd));
  }
}

// Decoded weights kept per block of row groups (see tile_driver.hpp's kWeightPanelBytes).
constexpr int64_t kLanePanelBytes = int64_t{256} << 10;

// Below this many tokens the GEMM runs the one-row kernel's tiles (a panel of 16-row
// groups costs more to decode than it saves: matmul_benchmark, 2048 x 4096, one
// thread: 4 tokens 0.80 ms by tiles, 0.82 by the panel; 8 tokens 1.35 and 1.07).
constexpr int64_t kMinPanelTokens = 8;

// The tile: 3 tokens x all 8 lanes (24 accumulators). Per product it loads two
// dwords (the sum's start and the activation codes), which bound it on this Zen 5
// host; 2 x 8, 4 x 4, 6 x 4 and 8 x 2 measured the same or slower.
constexpr int kLaneTileTokens = 3;
constexpr int kLaneTileLanes = 8;

// One activation block for the two-row GEMV: its codes in both halves, where each
// int32 lane's sum starts (-128 times the sum of its 4 codes: the weights come with
// +128), and the scale.
struct PairActivationBlock {
  __m512i codes;
  __m512i bias;
  float d;
};

// The GEMV, rows in pairs: row r's 8 lanes in the lower half of one vector, row
// r + 1's in the upper half, so that per block one int8 product, one conversion and
// one fma serve both rows, each lane's chain exactly the one-row kernel's; several
// rows' chains in flight hide the fma latency that bounds a single row.
// kPairs pairs of rows (contiguous in memory) per pass over the activation.
template <int kPairs>
inline void q8_0_gemv_rows(int64_t nb, const uint8_t* first_row, int64_t row_bytes, const PairActivationBlock* act,
                           float* out) {
  constexpr int64_t kRowsPerPass = 2 * kPairs;
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[kPairs];
  for (int p = 0; p < kPairs; ++p) acc[p] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    // The rows are one contiguous range: prefetch the next pass's in address order,
    // as one stream (interleaved per-row streams ran 2.5x slower from memory).
    prefetch_step(first_row + kRowsPerPass * row_bytes - kPrefetchBytes +
                      kRowsPerPass * b * static_cast<int64_t>(sizeof(BlockQ8_0)),
                  kRowsPerPass * static_cast<int64_t>(sizeof(BlockQ8_0)));
    const PairActivationBlock& t = act[b];
    for (int p = 0; p < kPairs; ++p) {
      const auto* w0 = reinterpret_cast<const BlockQ8_0*>(first_row + 2 * p * row_bytes) + b;
      const auto* w1 = reinterpret_cast<const BlockQ8_0*>(first_row + (2 * p + 1) * row_bytes) + b;
      const __m512i codes =
          _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(load256(w0->qs)), load256(w1->qs), 1), offset);
      const __m512i sum = _mm512_dpbusd_epi32(t.bias, codes, t.codes);
      const __m256i halves =
          _mm256_set_m128i(_mm_set1_epi16(static_cast<short>(w1->d)), _mm_set1_epi16(static_cast<short>(w0->d)));
      const __m512 d = _mm512_mul_ps(_mm512_cvtph_ps(halves), _mm512_set1_ps(t.d));
      acc[p] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sum), acc[p]);
    }
  }
  for (int p = 0; p < kPairs; ++p) {
    out[2 * p] = hsum(_mm512_castps512_ps256(acc[p]));
    out[2 * p + 1] = hsum(_mm512_extractf32x8_ps(acc[p], 1));
  }
}

void q8_0_gemv(int64_t k, const uint8_t* w, size_t w_row_bytes, int64_t rows, const uint8_t* a, float* out) {
  const int64_t nb = k / 32;
  thread_local std::vector<PairActivationBlock> act;
  act.resize(static_cast<size_t>(nb));
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(0x80));
  const auto* ab = reinterpret_cast<const BlockQ8_0*>(a);
  for (int64_t b = 0; b < nb; ++b) {
    PairActivationBlock& t = act[static_cast<size_t>(b)];
    t.codes = _mm512_broadcast_i64x4(load256(ab[b].qs));
    t.bias = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), offset, t.codes));
    t.d = half_to_float(ab[b].d);
  }
  const auto row_bytes = static_cast<int64_t>(w_row_bytes);
  int64_t r = 0;
  // As many rows per pass as keep a pass (the prefetch distance) within ~20 KiB, up
  // to 8: more chains in flight, fewer passes over the activation (one thread, decode
  // of a 2048-wide Q8_0 model: 2 rows 19.3 tok/s, 8 rows 23; 1 GiB GEMV of 4096-wide
  // rows: 8 rows 48 ms, 4 rows 44).
  constexpr int64_t kPassBytes = int64_t{20} << 10;
  if (8 * row_bytes <= kPassBytes) {
    for (; r + 8 <= rows; r += 8) q8_0_gemv_rows<4>(nb, w + r * row_bytes, row_bytes, act.data(), out + r);
  }
  if (4 * row_bytes <= kPassBytes) {
    for (; r + 4 <= rows; r += 4) q8_0_gemv_rows<2>(nb, w + r * row_bytes, row_bytes, act.data(), out + r);
  }
  for (; r + 2 <= rows; r += 2) q8_0_gemv_rows<1>(nb, w + r * row_bytes, row_bytes, act.data(), out + r);
  if (r < rows) out[r] = tiled_vec_dot<Q8_0Kernel>(k, w + r * row_bytes, a);
}

void q8_0_gemm(int64_t k, const void* w, size_t w_row_bytes, int64_t rows, const void* a, size_t a_row_bytes,
               int64_t cols, float* out, int64_t out_stride) {
  if (cols == 1) {
    q8_0_gemv(k, static_cast<const uint8_t*>(w), w_row_bytes, rows, static_cast<const uint8_t*>(a), out);
    return;
  }
  if (cols < kMinPanelTokens) {
    tiled_gemm<Q8_0Kernel>(k, w, w_row_bytes, rows, a, a_row_bytes, cols, out, out_stride);
    return;
  }
  constexpr int C = kLaneTileTokens;
  constexpr int X = kLaneTileLanes;
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* ab = static_cast<const uint8_t*>(a);
  const int64_t nb = k / 32;
  // Every token's blocks, decoded once; the last group's missing tokens stay unused.
  const int64_t token_groups = (cols + C - 1) / C;
  thread_local std::vector<QuadTokenBlock> token_blocks;
  token_blocks.resize(static_cast<size_t>(token_groups * nb * C));
  const __m256i offset = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t c = 0; c < cols; ++c) {
    const auto* blocks = reinterpret_cast<const BlockQ8_0*>(ab + c * static_cast<int64_t>(a_row_bytes));
    QuadTokenBlock* group = token_blocks.data() + (c / C) * nb * C;
    for (int64_t b = 0; b < nb; ++b) {
      QuadTokenBlock& t = group[b * C + c % C];
      const __m256i codes = load256(blocks[b].qs);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(t.codes), codes);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(t.bias), _mm256_sub_epi32(_mm256_setzero_si256(), dot_u8_s8(offset, codes)));
      t.d = half_to_float(blocks[b].d);
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
  thread_local std::vector<QuadTokenBlock> single;
  single.resize(static_cast<size_t>(nb));
  for (int64_t g0 = 0; g0 < n_groups; g0 += groups_per_panel) {
    const int64_t ng = n_groups - g0 < groups_per_panel ? n_groups - g0 : groups_per_panel;
    for (int64_t g = 0; g < ng; ++g) {
      const int64_t r = (g0 + g) * 16;
      decode_row_group(wb + r * static_cast<int64_t>(w_row_bytes), w_row_bytes, rows - r < 16 ? rows - r : 16, nb,
                       panel_bytes + g * group_bytes);
    }
    for (int64_t c = 0; c < cols; c += C) {
      const int64_t n = cols - c < C ? cols - c : C;
      const QuadTokenBlock* group = token_blocks.data() + (c / C) * nb * C;
      for (int64_t g = 0; g < ng; ++g) {
        const int64_t r = (g0 + g) * 16;
        const int64_t nr = rows - r < 16 ? rows - r : 16;
        float* o = out + c * out_stride + r;
        if (n == C) {
          q8_0_lane_tile<C, X>(panel_bytes + g * group_bytes, nb, group, nr, o, out_stride);
          continue;
        }
        for (int64_t j = 0; j < n; ++j) {
          for (int64_t b = 0; b < nb; ++b) single[static_cast<size_t>(b)] = group[b * C + j];
          q8_0_lane_tile<1, 8>(panel_bytes + g * group_bytes, nb, single.data(), nr, o + j * out_stride, out_stride);
        }
      }
    }
  }
}


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
  q4family::fill_kernels(table);  // Q4_0, IQ4_NL in llama.cpp's float order
  set_kernel(table, GgmlType::Q8_0, tiled_vec_dot<Q8_0Kernel>, q8_0_gemm);
  put_kernel<Q6_KZmmKernel>(table, GgmlType::Q6_K);
  put_kernel<Float16Tiles<HalfToFloat16>>(table, GgmlType::F16);
  put_kernel<Float16Tiles<BFloatToFloat16>>(table, GgmlType::BF16);
  put_kernel<Float16Tiles<Float16>>(table, GgmlType::F32);
  set_k_quant_repack_order_kernels_avx512(table);  // Q4_K, Q2_K: llama.cpp's repacked order
}

}  // namespace pico::cpu
