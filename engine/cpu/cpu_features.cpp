// Feature detection. The only place (with the ISA kernel files and dispatch.cpp)
// that looks at the compiler's target macros.
#include "cpu/cpu_features.hpp"

#include <algorithm>

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#define PICO_CPU_X86 1
#include <cpuid.h>
#include <immintrin.h>
#elif defined(__aarch64__)
#define PICO_CPU_AARCH64 1
#if defined(__linux__)
#include <sys/auxv.h>
#endif
#elif defined(__arm__)
#define PICO_CPU_ARM32 1
#if defined(__linux__)
#include <sys/auxv.h>
#endif
#endif

namespace pico::cpu {
namespace {

#if defined(PICO_CPU_X86)
// XCR0 says which register states the OS saves; AVX needs XMM+YMM (bits 1, 2),
// AVX-512 also the opmask and ZMM states (bits 5-7).
uint64_t read_xcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return f;
  const bool osxsave = (ecx >> 27) & 1u;
  const bool avx = (ecx >> 28) & 1u;
  f.fma = (ecx >> 12) & 1u;
  f.f16c = (ecx >> 29) & 1u;
  if (!osxsave || !avx) return CpuFeatures{};
  const uint64_t xcr0 = read_xcr0();
  const bool ymm_state = (xcr0 & 0x6u) == 0x6u;
  const bool zmm_state = (xcr0 & 0xe6u) == 0xe6u;
  if (!ymm_state) return CpuFeatures{};
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  f.avx2 = (ebx >> 5) & 1u;
  if (zmm_state) {
    f.avx512f = (ebx >> 16) & 1u;
    f.avx512dq = (ebx >> 17) & 1u;
    f.avx512bw = (ebx >> 30) & 1u;
    f.avx512vl = (ebx >> 31) & 1u;
    f.avx512vnni = (ecx >> 11) & 1u;
    unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
    __cpuid_count(7, 1, a1, b1, c1, d1);
    f.avx512bf16 = (a1 >> 5) & 1u;
  }
  return f;
}
#elif defined(PICO_CPU_AARCH64)
CpuFeatures detect() {
  CpuFeatures f;
  f.neon = true;  // mandatory in AArch64
#if defined(__linux__)
  const unsigned long hwcap = getauxval(AT_HWCAP);
  const unsigned long hwcap2 = getauxval(AT_HWCAP2);
  f.dotprod = (hwcap >> 20) & 1ul;  // HWCAP_ASIMDDP
  f.i8mm = (hwcap2 >> 13) & 1ul;    // HWCAP2_I8MM
#endif
  return f;
}
#elif defined(PICO_CPU_ARM32)
CpuFeatures detect() {
  CpuFeatures f;
#if defined(__linux__)
  f.neon = (getauxval(AT_HWCAP) >> 12) & 1ul;  // HWCAP_NEON
#endif
  return f;
}
#else
CpuFeatures detect() { return CpuFeatures{}; }
#endif

}  // namespace

std::string_view level_name(CpuLevel level) {
  switch (level) {
    case CpuLevel::scalar: return "scalar";
    case CpuLevel::avx2: return "avx2";
    case CpuLevel::avx512: return "avx512";
    case CpuLevel::neon: return "neon";
    case CpuLevel::dotprod: return "dotprod";
    case CpuLevel::i8mm: return "i8mm";
  }
  return "unknown";
}

std::optional<CpuLevel> parse_level(std::string_view name) {
  for (CpuLevel level : {CpuLevel::scalar, CpuLevel::avx2, CpuLevel::avx512, CpuLevel::neon,
                         CpuLevel::dotprod, CpuLevel::i8mm}) {
    if (name == level_name(level)) return level;
  }
  return std::nullopt;
}

const CpuFeatures& host_features() {
  static const CpuFeatures features = detect();
  return features;
}

std::vector<CpuLevel> supported_levels() {
  const CpuFeatures& f = host_features();
  std::vector<CpuLevel> levels{CpuLevel::scalar};
#if defined(PICO_CPU_X86)
  if (f.avx2 && f.fma && f.f16c) {
    levels.push_back(CpuLevel::avx2);
    if (f.avx512f && f.avx512bw && f.avx512dq && f.avx512vl && f.avx512vnni) levels.push_back(CpuLevel::avx512);
  }
#elif defined(PICO_CPU_AARCH64)
  levels.push_back(CpuLevel::neon);
  if (f.dotprod) {
    levels.push_back(CpuLevel::dotprod);
    if (f.i8mm) levels.push_back(CpuLevel::i8mm);
  }
#elif defined(PICO_CPU_ARM32)
  if (f.neon) levels.push_back(CpuLevel::neon);
#else
  (void)f;
#endif
  return levels;
}

bool level_supported(CpuLevel level) {
  const auto levels = supported_levels();
  return std::find(levels.begin(), levels.end(), level) != levels.end();
}

CpuLevel best_level() { return supported_levels().back(); }

std::vector<CpuLevel> level_chain(CpuLevel level) {
  switch (level) {
    case CpuLevel::scalar: return {CpuLevel::scalar};
    case CpuLevel::avx2: return {CpuLevel::scalar, CpuLevel::avx2};
    case CpuLevel::avx512: return {CpuLevel::scalar, CpuLevel::avx2, CpuLevel::avx512};
    case CpuLevel::neon: return {CpuLevel::scalar, CpuLevel::neon};
    case CpuLevel::dotprod: return {CpuLevel::scalar, CpuLevel::neon, CpuLevel::dotprod};
    case CpuLevel::i8mm: return {CpuLevel::scalar, CpuLevel::neon, CpuLevel::dotprod, CpuLevel::i8mm};
  }
  return {CpuLevel::scalar};
}

void cpu_relax() {
#if defined(PICO_CPU_X86)
  _mm_pause();
#elif defined(PICO_CPU_AARCH64) || defined(PICO_CPU_ARM32)
  __asm__ __volatile__("yield");
#endif
}

}  // namespace pico::cpu
