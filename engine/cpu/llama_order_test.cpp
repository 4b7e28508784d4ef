// The x86 SIMD kernels that follow llama.cpp's float operations (Q8_0, Q3_K, Q5_K)
// against a plain C++ model of those operations, written from llama.cpp's AVX2 code
// (ggml-cpu/arch/x86/quants.c: ggml_vec_dot_q8_0_q8_0, _q3_K_q8_K, _q5_K_q8_K; the
// llamafile GEMM computes Q8_0 alike): per block, 8 int32 lanes, lane x the exact sum
// of the products at positions 4x..4x+3 of every 32 codes; each lane converted and
// fma'd into float lane x; the 8 lanes summed in hsum_float_8's tree. Every output of
// vec_dot and gemm, at every x86 SIMD level, must equal the model's bit for bit.
// (ggml_matmul_crosscheck_test checks the same against llama.cpp's own library.)
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/kernels.hpp"
#include "cpu/test_support.hpp"
#include "quant/blocks.hpp"
#include "quant/float_convert.hpp"

namespace pico::cpu {
namespace {

// The models are of llama.cpp's x86 code; other hosts have no kernel that follows it.
#if defined(__x86_64__) || defined(_M_X64)

using quant::BlockQ3_K;
using quant::BlockQ5_K;
using quant::BlockQ8_0;
using quant::BlockQ8_K;
using pico::fp16_to_fp32;
using test::partner;
using test::random_rows;
using test::row_bytes;

using Lanes = std::array<float, 8>;

// hsum_float_8: upper half + lower half, then lanes 0 + 2 and 1 + 3, then those two.
float hsum_tree(const Lanes& v) {
  const float s0 = v[4] + v[0], s1 = v[5] + v[1], s2 = v[6] + v[2], s3 = v[7] + v[3];
  return (s0 + s2) + (s1 + s3);
}

float model_q8_0(int64_t k, const uint8_t* w_row, const uint8_t* a_row) {
  const auto* w = reinterpret_cast<const BlockQ8_0*>(w_row);
  const auto* a = reinterpret_cast<const BlockQ8_0*>(a_row);
  Lanes acc{};
  for (int64_t b = 0; b < k / 32; ++b) {
    const float d = fp16_to_fp32(w[b].d) * fp16_to_fp32(a[b].d);
    for (int x = 0; x < 8; ++x) {
      int32_t sum = 0;
      for (int j = 4 * x; j < 4 * x + 4; ++j) sum += w[b].qs[j] * a[b].qs[j];
      acc[static_cast<size_t>(x)] = std::fma(d, static_cast<float>(sum), acc[static_cast<size_t>(x)]);
    }
  }
  return hsum_tree(acc);
}

// The 16 signed scales of a Q3_K super-block.
std::array<int, 16> q3_K_scales(const uint8_t* s) {
  std::array<int, 16> out{};
  for (int j = 0; j < 16; ++j) {
    const int low4 = j < 8 ? (s[j] & 0x0f) : (s[j - 8] >> 4);
    const int high2 = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[static_cast<size_t>(j)] = (low4 | (high2 << 4)) - 32;
  }
  return out;
}

float model_q3_K(int64_t k, const uint8_t* w_row, const uint8_t* a_row) {
  const auto* w = reinterpret_cast<const BlockQ3_K*>(w_row);
  const auto* a = reinterpret_cast<const BlockQ8_K*>(a_row);
  Lanes acc{};
  for (int64_t i = 0; i < k / 256; ++i) {
    const auto scales = q3_K_scales(w[i].scales);
    std::array<int32_t, 8> sum{};
    for (int e = 0; e < 256; ++e) {
      const int half = e / 128, group = (e % 128) / 32, l = e % 32;
      const int low = (w[i].qs[32 * half + l] >> (2 * group)) & 3;
      const int high = (w[i].hmask[l] >> (4 * half + group)) & 1;
      sum[static_cast<size_t>((e % 32) / 4)] += scales[static_cast<size_t>(e / 16)] * (low + 4 * high - 4) * a[i].qs[e];
    }
    const float d = a[i].d * fp16_to_fp32(w[i].d);
    for (size_t x = 0; x < 8; ++x) acc[x] = std::fma(d, static_cast<float>(sum[x]), acc[x]);
  }
  return hsum_tree(acc);
}

// Scale and min of sub-block j of a Q4_K / Q5_K super-block.
void k4_scale_min(int j, const uint8_t* q, int& scale, int& min) {
  if (j < 4) {
    scale = q[j] & 63;
    min = q[j + 4] & 63;
  } else {
    scale = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
    min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// The mins go to a float of their own, one fma per super-block (llama.cpp's build
// contracts `summs += dmin * sum`), added after the lanes' tree.
float model_q5_K(int64_t k, const uint8_t* w_row, const uint8_t* a_row) {
  const auto* w = reinterpret_cast<const BlockQ5_K*>(w_row);
  const auto* a = reinterpret_cast<const BlockQ8_K*>(a_row);
  Lanes acc{};
  float mins_acc = 0.0f;
  for (int64_t i = 0; i < k / 256; ++i) {
    std::array<int32_t, 8> sum{};
    int32_t mins = 0;
    for (int sub = 0; sub < 8; ++sub) {
      int scale = 0, min = 0;
      k4_scale_min(sub, w[i].scales, scale, min);
      int32_t activation_sum = 0;
      for (int l = 0; l < 32; ++l) {
        const int e = 32 * sub + l;
        const uint8_t byte = w[i].qs[32 * (sub / 2) + l];
        const int code = ((sub % 2 == 0) ? (byte & 0x0f) : (byte >> 4)) + 16 * ((w[i].qh[l] >> sub) & 1);
        sum[static_cast<size_t>(l / 4)] += scale * code * a[i].qs[e];
        activation_sum += a[i].qs[e];
      }
      mins += min * activation_sum;
    }
    const float d = a[i].d * fp16_to_fp32(w[i].d);
    const float dmin = -a[i].d * fp16_to_fp32(w[i].dmin);
    for (size_t x = 0; x < 8; ++x) acc[x] = std::fma(d, static_cast<float>(sum[x]), acc[x]);
    mins_acc = std::fma(dmin, static_cast<float>(mins), mins_acc);
  }
  return hsum_tree(acc) + mins_acc;
}

using ModelFn = float (*)(int64_t, const uint8_t*, const uint8_t*);

struct Case {
  GgmlType type;
  ModelFn model;
  int64_t k;
};

bool follows_llama_order(CpuLevel level) { return level == CpuLevel::avx2 || level == CpuLevel::avx512; }

TEST(LlamaOrderKernels, EveryOutputEqualsTheModelOfLlamaCppsOperations) {
  // 37 rows: two full groups of 16 and a rest; 1, 3 and 17 tokens: the one-row dot,
  // the small-batch path and the panel GEMM with a partial token group.
  const Case cases[] = {{GgmlType::Q8_0, model_q8_0, 320}, {GgmlType::Q3_K, model_q3_K, 512},
                        {GgmlType::Q5_K, model_q5_K, 512}};
  const int64_t rows = 37;
  int levels_checked = 0;
  for (CpuLevel level : supported_levels()) {
    if (!follows_llama_order(level)) continue;
    ++levels_checked;
    const KernelTable& table = kernels_for(level);
    for (const Case& c : cases) {
      const std::string where = std::string(type_traits(c.type).name) + " @ " + std::string(level_name(level));
      const size_t wb = row_bytes(c.type, c.k), ab = row_bytes(partner(c.type), c.k);
      const auto w = random_rows(c.type, rows, c.k, 21);
      for (int64_t tokens : {1, 3, 17}) {
        const auto a = random_rows(partner(c.type), tokens, c.k, 22 + static_cast<uint32_t>(tokens));
        std::vector<float> out(static_cast<size_t>(rows * tokens));
        table.gemm[slot(c.type)](c.k, w.data(), wb, rows, a.data(), ab, tokens, out.data(), rows);
        for (int64_t t = 0; t < tokens; ++t) {
          for (int64_t r = 0; r < rows; ++r) {
            const uint8_t* wr = w.data() + static_cast<size_t>(r) * wb;
            const uint8_t* ar = a.data() + static_cast<size_t>(t) * ab;
            const float want = c.model(c.k, wr, ar);
            const float got = out[static_cast<size_t>(t * rows + r)];
            const float dot = table.vec_dot[slot(c.type)](c.k, wr, ar);
            ASSERT_EQ(std::memcmp(&want, &got, sizeof(float)), 0)
                << where << " gemm, tokens=" << tokens << " r=" << r << " t=" << t << " want " << want << " got " << got;
            ASSERT_EQ(std::memcmp(&want, &dot, sizeof(float)), 0) << where << " vec_dot r=" << r << " t=" << t;
          }
        }
      }
    }
  }
  if (levels_checked == 0) GTEST_SKIP() << "this host has no AVX2";
}

#endif  // x86-64

}  // namespace
}  // namespace pico::cpu
