// The x86 Q4_K / Q2_K kernels against a plain model of llama.cpp's repacked GEMM
// (ggml-cpu/arch/x86/repack.cpp, ggml_gemm_q4_K_8x8_q8_K / ggml_gemm_q2_K_8x8_q8_K):
// per output, exact integer sums per chunk of a super-block (Q4_K 64 values, Q2_K
// 128), each added with one fused multiply-add into a sums chain (scale d_w * d_a)
// and a mins chain (dmin_w * d_a), result sums - mins; at avx2, Q2_K as llama.cpp's
// AVX2 vec_dot. Bit for bit, for vec_dot and for GEMM batches of several shapes. (ggml_matmul_crosscheck_test checks the same
// against llama.cpp's own library.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu/kernels.hpp"
#include "cpu/test_support.hpp"
#include "quant/blocks.hpp"
#include "quant/float_convert.hpp"

namespace pico::cpu {
namespace {

using quant::BlockQ2_K;
using quant::BlockQ4_K;
using quant::BlockQ8_K;
using test::random_rows;
using test::row_bytes;

// Per chunk of one super-block: the integer sum of scale x dot and of min x bsum.
struct ChunkSums {
  int64_t sum[4] = {}, min[4] = {};
  int chunks = 0;
};

int64_t dot(const uint8_t* codes, const int8_t* a, int n) {
  int64_t s = 0;
  for (int i = 0; i < n; ++i) s += static_cast<int64_t>(codes[i]) * a[i];
  return s;
}
int64_t code_sum(const int8_t* a, int n) {
  int64_t s = 0;
  for (int i = 0; i < n; ++i) s += a[i];
  return s;
}

ChunkSums q4_k_chunks(const BlockQ4_K& w, const BlockQ8_K& a) {
  // Six-bit scales and mins of the 8 sub-blocks (ggml's get_scale_min_k4 layout).
  uint8_t scale[8], min[8];
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      scale[j] = w.scales[j] & 63;
      min[j] = w.scales[j + 4] & 63;
    } else {
      scale[j] = static_cast<uint8_t>((w.scales[j + 4] & 0xf) | ((w.scales[j - 4] >> 6) << 4));
      min[j] = static_cast<uint8_t>((w.scales[j + 4] >> 4) | ((w.scales[j] >> 6) << 4));
    }
  }
  ChunkSums out;
  out.chunks = 4;
  for (int g = 0; g < 4; ++g) {
    uint8_t lo[32], hi[32];
    for (int l = 0; l < 32; ++l) {
      lo[l] = w.qs[32 * g + l] & 0xf;
      hi[l] = w.qs[32 * g + l] >> 4;
    }
    out.sum[g] = scale[2 * g] * dot(lo, a.qs + 64 * g, 32) + scale[2 * g + 1] * dot(hi, a.qs + 64 * g + 32, 32);
    out.min[g] = min[2 * g] * code_sum(a.qs + 64 * g, 32) + min[2 * g + 1] * code_sum(a.qs + 64 * g + 32, 32);
  }
  return out;
}

ChunkSums q2_k_chunks(const BlockQ2_K& w, const BlockQ8_K& a) {
  ChunkSums out;
  out.chunks = 2;
  for (int h = 0; h < 2; ++h) {
    for (int shift = 0; shift < 4; ++shift) {
      for (int half = 0; half < 2; ++half) {
        const int sub = 8 * h + 2 * shift + half;
        const int first = 128 * h + 32 * shift + 16 * half;
        uint8_t codes[16];
        for (int l = 0; l < 16; ++l) codes[l] = (w.qs[32 * h + 16 * half + l] >> (2 * shift)) & 3;
        out.sum[h] += (w.scales[sub] & 0xf) * dot(codes, a.qs + first, 16);
        out.min[h] += (w.scales[sub] >> 4) * code_sum(a.qs + first, 16);
      }
    }
  }
  return out;
}

template <class Block>
float model_dot(int64_t k, const uint8_t* w_row, const uint8_t* a_row) {
  const auto* w = reinterpret_cast<const Block*>(w_row);
  const auto* a = reinterpret_cast<const BlockQ8_K*>(a_row);
  float sums = 0.0f, mins = 0.0f;
  for (int64_t s = 0; s < k / 256; ++s) {
    ChunkSums c;
    if constexpr (std::is_same_v<Block, BlockQ4_K>) {
      c = q4_k_chunks(w[s], a[s]);
    } else {
      c = q2_k_chunks(w[s], a[s]);
    }
    const float d = fp16_to_fp32(w[s].d) * a[s].d;
    const float dmin = fp16_to_fp32(w[s].dmin) * a[s].d;
    for (int i = 0; i < c.chunks; ++i) {
      sums = std::fma(static_cast<float>(c.sum[i]), d, sums);
      mins = std::fma(static_cast<float>(c.min[i]), dmin, mins);
    }
  }
  return sums - mins;
}

// Q2_K as ggml_vec_dot_q2_K_q8_K's AVX2 code (what an AVX2-only llama.cpp runs: it
// does not repack Q2_K): 8 float lanes, lane l fed per super-block the exact integer
// sums of its bytes 4l..4l+3 of every 32-code group, mins term first; the lanes
// summed as ggml's hsum_float_8.
float model_q2_k_vec_dot(int64_t k, const uint8_t* w_row, const uint8_t* a_row) {
  const auto* w = reinterpret_cast<const BlockQ2_K*>(w_row);
  const auto* a = reinterpret_cast<const BlockQ8_K*>(a_row);
  float acc[8] = {};
  for (int64_t s = 0; s < k / 256; ++s) {
    const float d = a[s].d * fp16_to_fp32(w[s].d);
    const float neg_dmin = -a[s].d * fp16_to_fp32(w[s].dmin);
    for (int l = 0; l < 8; ++l) {
      const int64_t mins = (w[s].scales[2 * l] >> 4) * a[s].bsums[2 * l] + (w[s].scales[2 * l + 1] >> 4) * a[s].bsums[2 * l + 1];
      int64_t sums = 0;
      for (int h = 0; h < 2; ++h) {
        for (int shift = 0; shift < 4; ++shift) {
          const int sub = 8 * h + 2 * shift + (l >= 4 ? 1 : 0);
          for (int b = 4 * l; b < 4 * l + 4; ++b) {
            const int code = (w[s].qs[32 * h + b] >> (2 * shift)) & 3;
            sums += (w[s].scales[sub] & 0xf) * code * a[s].qs[128 * h + 32 * shift + b];
          }
        }
      }
      acc[l] = std::fma(neg_dmin, static_cast<float>(mins), acc[l]);
      acc[l] = std::fma(d, static_cast<float>(sums), acc[l]);
    }
  }
  float r[4];
  for (int i = 0; i < 4; ++i) r[i] = acc[i + 4] + acc[i];
  return (r[0] + r[2]) + (r[1] + r[3]);
}

using ModelFn = float (*)(int64_t k, const uint8_t* w_row, const uint8_t* a_row);

void expect_model_order(GgmlType type, CpuLevel level, ModelFn model) {
  if (!level_supported(level)) GTEST_SKIP() << "host lacks " << level_name(level);
  const KernelTable& table = kernels_for(level);
  const int64_t k = 1024, rows = 37, tokens = 21;
  const auto w = random_rows(type, rows, k, 21);
  const auto a = random_rows(GgmlType::Q8_K, tokens, k, 22);
  const size_t wb = row_bytes(type, k), ab = row_bytes(GgmlType::Q8_K, k);
  auto bits_equal = [](float x, float y) { return std::memcmp(&x, &y, sizeof(float)) == 0; };
  for (int64_t n : {1, 3, 4, 5, 8, 21}) {
    for (int64_t r_count : {1, 7, 37}) {
      std::vector<float> y(static_cast<size_t>(r_count * n));
      table.gemm[slot(type)](k, w.data(), wb, r_count, a.data(), ab, n, y.data(), r_count);
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t r = 0; r < r_count; ++r) {
          const float want = model(k, w.data() + r * wb, a.data() + t * ab);
          ASSERT_TRUE(bits_equal(want, y[static_cast<size_t>(t * r_count + r)]))
              << "gemm tokens=" << n << " rows=" << r_count << " r=" << r << " t=" << t << " want " << want << " got "
              << y[static_cast<size_t>(t * r_count + r)];
        }
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float want = model(k, w.data() + r * wb, a.data());
    ASSERT_TRUE(bits_equal(want, table.vec_dot[slot(type)](k, w.data() + r * wb, a.data()))) << "vec_dot r=" << r;
  }
}

TEST(KQuantRepackOrder, Q4_KAtAvx512MatchesLlamaRepackedGemm) {
  expect_model_order(GgmlType::Q4_K, CpuLevel::avx512, model_dot<BlockQ4_K>);
}
TEST(KQuantRepackOrder, Q4_KAtAvx2MatchesLlamaRepackedGemm) {
  expect_model_order(GgmlType::Q4_K, CpuLevel::avx2, model_dot<BlockQ4_K>);
}
TEST(KQuantRepackOrder, Q2_KAtAvx512MatchesLlamaRepackedGemm) {
  expect_model_order(GgmlType::Q2_K, CpuLevel::avx512, model_dot<BlockQ2_K>);
}
TEST(KQuantRepackOrder, Q2_KAtAvx2MatchesLlamaAvx2VecDot) {
  expect_model_order(GgmlType::Q2_K, CpuLevel::avx2, model_q2_k_vec_dot);
}

}  // namespace
}  // namespace pico::cpu
