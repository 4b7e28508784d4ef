// The dotprod level (aarch64, Armv8.2-A DotProd): the int8 kernels of the shared
// 128-bit set with SDOT (vdotq_s32). Float kernels come from the neon level.
#include "cpu/arm/neon_common.hpp"

#if !defined(__ARM_FEATURE_DOTPROD)
#error "dotprod_kernels.cpp must be compiled with +dotprod"
#endif

namespace pico::cpu {

void fill_dotprod_kernels(KernelTable& table) { fill_neon_int8_kernels(table); }

}  // namespace pico::cpu
