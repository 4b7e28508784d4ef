// What the host CPU can run, and the instruction-set levels the kernels come in.
//
// Levels form one chain per architecture (x86: scalar < avx2 < avx512; aarch64:
// scalar < neon < dotprod < i8mm; 32-bit arm: scalar < neon). A level's kernel table
// holds its own kernels plus, where it has none for a type, those of the levels below.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace pico::cpu {

enum class CpuLevel : uint8_t { scalar, avx2, avx512, neon, dotprod, i8mm };

std::string_view level_name(CpuLevel level);
std::optional<CpuLevel> parse_level(std::string_view name);

struct CpuFeatures {
  // x86
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false, avx512vnni = false;
  bool avx512bf16 = false;
  // arm
  bool neon = false, dotprod = false, i8mm = false;
};

// Detected once (CPUID + XGETBV on x86, getauxval on Linux/arm).
const CpuFeatures& host_features();

// The levels of this build's architecture that the host runs, lowest first
// (always starts with scalar).
std::vector<CpuLevel> supported_levels();
bool level_supported(CpuLevel level);
CpuLevel best_level();

// The levels below `level` on its chain, lowest first, ending with `level` itself.
std::vector<CpuLevel> level_chain(CpuLevel level);

// A pause for spin-wait loops (PAUSE on x86, YIELD on arm, nothing elsewhere).
void cpu_relax();

}  // namespace pico::cpu
