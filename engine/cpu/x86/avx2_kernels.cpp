// The avx2 level (AVX2 + FMA + F16C): the shared 256-bit kernels, int8 products via
// vpmaddubsw + vpmaddwd.
#include "cpu/x86/ymm_kernels.hpp"

namespace pico::cpu {

void fill_avx2_kernels(KernelTable& table) { fill_ymm_kernels(table); }

}  // namespace pico::cpu
