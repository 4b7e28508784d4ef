// The neon level (aarch64 baseline Advanced SIMD; 32-bit arm with -mfpu=neon): the
// shared 128-bit kernels, int8 products via widening multiplies (vmull_s8).
#include "cpu/arm/neon_common.hpp"

namespace pico::cpu {

void fill_neon_kernels(KernelTable& table) {
  fill_neon_float_kernels(table);
  fill_neon_int8_kernels(table);
}

}  // namespace pico::cpu
