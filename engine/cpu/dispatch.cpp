// Builds one kernel table per supported level, lowest level first, each level
// overwriting the entries it implements, and picks the active one.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "cpu/kernels.hpp"

namespace pico::cpu {
namespace {

void fill_level(CpuLevel level, KernelTable& table) {
  switch (level) {
    case CpuLevel::scalar: fill_scalar_kernels(table); return;
#if defined(__x86_64__) || defined(_M_X64)
    case CpuLevel::avx2:
      fill_avx2_kernels(table);
      fill_avx2_row_functions(table);
      return;
    case CpuLevel::avx512:
      fill_avx512_kernels(table);
      fill_avx512_row_functions(table);
      return;
#endif
#if defined(__aarch64__) || defined(__arm__)
    case CpuLevel::neon: fill_neon_kernels(table); return;
#endif
#if defined(__aarch64__)
    case CpuLevel::dotprod: fill_dotprod_kernels(table); return;
    case CpuLevel::i8mm: fill_i8mm_kernels(table); return;  // Q8_0, Q4_0; dotprod's serve the rest
#endif
    default: return;  // no kernels of this level in this build (yet): lower levels serve
  }
}

KernelTable build_table(CpuLevel level) {
  KernelTable table;
  for (CpuLevel step : level_chain(level)) {
    KernelTable own;
    fill_level(step, own);
    for (size_t i = 0; i < kTypeSlots; ++i) {
      if (own.vec_dot[i] != nullptr) {
        table.vec_dot[i] = own.vec_dot[i];
        table.gemm[i] = own.gemm[i];
        table.vec_dot_level[i] = step;
      }
      if (own.quantize[i] != nullptr) {
        table.quantize[i] = own.quantize[i];
        table.quantize_level[i] = step;
      }
    }
    if (own.silu_row != nullptr) table.silu_row = own.silu_row;
    if (own.exp_row != nullptr) table.exp_row = own.exp_row;
    if (own.centered_squares_row != nullptr) table.centered_squares_row = own.centered_squares_row;
    if (own.delta_rule_step != nullptr) table.delta_rule_step = own.delta_rule_step;
    if (own.conv_row != nullptr) table.conv_row = own.conv_row;
    if (own.dot_f32_as_ggml != nullptr) table.dot_f32_as_ggml = own.dot_f32_as_ggml;
  }
  table.level = level;
  return table;
}

struct Tables {
  KernelTable by_level[6];
  bool supported[6] = {};
  Tables() {
    for (CpuLevel level : supported_levels()) {
      by_level[static_cast<int>(level)] = build_table(level);
      supported[static_cast<int>(level)] = true;
    }
  }
};

const Tables& tables() {
  static const Tables all;
  return all;
}

CpuLevel initial_level() {
  const char* env = std::getenv("PICO_CPU_LEVEL");
  if (env == nullptr || *env == '\0') return best_level();
  const auto requested = parse_level(env);
  if (!requested) {
    std::fprintf(stderr, "pico: ignoring unknown PICO_CPU_LEVEL=%s\n", env);
    return best_level();
  }
  if (level_supported(*requested)) return *requested;
  // The highest supported level below the requested one on its chain.
  CpuLevel chosen = CpuLevel::scalar;
  for (CpuLevel step : level_chain(*requested)) {
    if (level_supported(step)) chosen = step;
  }
  std::fprintf(stderr, "pico: PICO_CPU_LEVEL=%s not supported here, using %s\n", env,
               std::string(level_name(chosen)).c_str());
  return chosen;
}

std::atomic<const KernelTable*>& active_slot() {
  static std::atomic<const KernelTable*> active{&tables().by_level[static_cast<int>(initial_level())]};
  return active;
}

}  // namespace

void set_kernel(KernelTable& table, GgmlType weight, VecDotFn vec_dot, GemmFn gemm) {
  table.vec_dot[slot(weight)] = vec_dot;
  table.gemm[slot(weight)] = gemm;
}

void set_quantizer(KernelTable& table, GgmlType activation, QuantizeRowFn quantize) {
  table.quantize[slot(activation)] = quantize;
}

void set_recurrent_functions(KernelTable& table, DeltaRuleStepFn delta_rule_step, ConvRowFn conv_row,
                             DotF32Fn dot_f32_as_ggml) {
  table.delta_rule_step = delta_rule_step;
  table.conv_row = conv_row;
  table.dot_f32_as_ggml = dot_f32_as_ggml;
}

void set_row_functions(KernelTable& table, SiluRowFn silu_row, ExpRowFn exp_row,
                       CenteredSquaresRowFn centered_squares_row) {
  table.silu_row = silu_row;
  table.exp_row = exp_row;
  table.centered_squares_row = centered_squares_row;
}

const KernelTable& kernels_for(CpuLevel level) {
  const Tables& all = tables();
  if (!all.supported[static_cast<int>(level)]) {
    throw std::invalid_argument("CPU level " + std::string(level_name(level)) + " is not supported on this host");
  }
  return all.by_level[static_cast<int>(level)];
}

const KernelTable& active_kernels() { return *active_slot().load(std::memory_order_acquire); }

void set_cpu_level(CpuLevel level) { active_slot().store(&kernels_for(level), std::memory_order_release); }

CpuLevel cpu_level() { return active_kernels().level; }

}  // namespace pico::cpu
