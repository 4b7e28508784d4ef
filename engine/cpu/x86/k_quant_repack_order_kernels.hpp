// Q4_K and Q2_K against Q8_K in the float order of llama.cpp's repacked x86 GEMM
// (the kernels llama.cpp runs for these types with weight repacking on, its default):
// per output, exact integer sums over chunks of a super-block (Q4_K: 64 values, two
// sub-blocks; Q2_K: 128 values, eight sub-blocks), each folded into two float chains,
//   sums += float(sum over the chunk of scale * dot) * (d_w * d_a)
//   mins += float(sum over the chunk of min * bsum)  * (dmin_w * d_a)
// with one FMA each, chunk by chunk; the result is sums - mins. Every output is its
// own chain, so vec_dot, GEMV and GEMM give identical bits (batch invariance), and
// the lanes of a vector can hold any outputs.
#pragma once

#include "cpu/kernels.hpp"

namespace pico::cpu {

// Set the Q4_K and Q2_K entries of `table`. avx512 (AVX-512 F/BW/DQ/VL + VNNI): both
// in the repacked order above. avx2 (AVX2 + FMA + F16C): Q4_K in that order too (an
// AVX2-only llama.cpp repacks Q4_K), Q2_K in the order of llama.cpp's AVX2
// ggml_vec_dot_q2_K_q8_K (it repacks Q2_K only on AVX-512 CPUs).
void set_k_quant_repack_order_kernels_avx512(KernelTable& table);
void set_k_quant_repack_order_kernels_avx2(KernelTable& table);

}  // namespace pico::cpu
