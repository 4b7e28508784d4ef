// The avx2 level (AVX2 + FMA + F16C): the shared 256-bit kernels, int8 products via
// vpmaddubsw + vpmaddwd.
#include "cpu/x86/k_quant_repack_order_kernels.hpp"
#include "cpu/x86/ymm_kernels.hpp"
#include "cpu/x86/q4_0_family_kernels.hpp"

namespace pico::cpu {

void fill_avx2_kernels(KernelTable& table) {
  fill_ymm_kernels(table);
  q4family::fill_kernels(table);  // Q4_0, IQ4_NL in llama.cpp's float order
  set_k_quant_repack_order_kernels_avx2(table);  // Q4_K, Q2_K in llama.cpp's float order
}

}  // namespace pico::cpu
