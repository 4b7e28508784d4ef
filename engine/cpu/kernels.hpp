// The kernel table: per weight type, the dot product of one weight row with one
// activation row (in the weight type's dot partner format, see TypeTraits), and the
// same over a block of rows x tokens; per activation type, the quantizer of a float
// row into it.
//
// Batch invariance: for a given (type, level), gemm computes every output with
// exactly the float operations, in the same order, that vec_dot uses for that row and
// token. So an output never depends on the batch it was computed in.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "cpu/cpu_features.hpp"
#include "quant/type_traits.hpp"

namespace pico::cpu {

// Dot product of a weight row `w` with an activation row `a`, `k` elements each.
using VecDotFn = float (*)(int64_t k, const void* w, const void* a);

// out[c * out_stride + r] = dot(weight row r, activation row c) for r < rows,
// c < cols. Rows of `w` are `w_row_bytes` apart, rows of `a` `a_row_bytes` apart.
using GemmFn = void (*)(int64_t k, const void* w, size_t w_row_bytes, int64_t rows, const void* a,
                        size_t a_row_bytes, int64_t cols, float* out, int64_t out_stride);

// `k` floats into one activation row (k a multiple of the block size), byte for
// byte what quant's reference quantizer writes.
using QuantizeRowFn = void (*)(const float* x, void* out, int64_t k);

// Row functions whose roundings the model shares with llama.cpp. Its CPU build works
// on whole vectors counted from the start of a row (leftovers one by one), computes
// e^x with a vector polynomial per ISA (libm's expf on the leftovers) and adds vector
// lanes in a fixed tree; a level that has llama.cpp's vector code fills these, the
// others inherit the scalar ones.
//
// y[i] = x[i] / (1 + e^-x[i]) over one row of n.
using SiluRowFn = void (*)(const float* x, int64_t n, float* y);
// y[i] = e^(x[i] - max) over one row of n; returns the sum of y, added up as ggml's
// soft_max does (per vector, in double).
using ExpRowFn = double (*)(const float* x, int64_t n, float max, float* y);
// y[i] = x[i] - mean over one row of n; returns the sum of y[i]^2 as ggml's LayerNorm
// adds them (per vector, in double).
using CenteredSquaresRowFn = double (*)(const float* x, int64_t n, float mean, float* y);

// The recurrent (linear-attention) layers' inner loops, as llama.cpp's CPU ops run them.
//
// One token of the gated delta rule for one head (GGML_OP_GATED_DELTA_NET): `state`
// holds d rows of d floats (row j is column j of the d x d state S, the key index
// fastest). For each row j: row *= decay; u = (v[j] - dot(row, k)) * beta;
// row += k * u (each element one fused multiply-add); out[j] = dot(row, q) * scale.
// The rows are independent, so each is finished before the next is read. `dot` adds
// as ggml_vec_dot_f32 does at the level (vector accumulators, its reduction tree, then
// the leftovers), so that the state evolves as llama.cpp's.
using DeltaRuleStepFn = void (*)(int64_t d, float* state, const float* q, const float* k, const float* v,
                                 float decay, float beta, float scale, float* out);
// One output row of a causal depthwise convolution: y[c] = sum over taps i of
// window[i * stride + c] * weights[i * stride + c] for c < channels (window: `taps`
// input rows `stride` apart, oldest first; weights: tap-major, rows as far apart). The terms are added in tap order as
// llama.cpp's ssm_conv compiles for the level: rounded products for the first multiple
// of 8 taps (AVX-512) or of 4 (AVX2), fused multiply-adds after (at the scalar level:
// rounded products throughout).
using ConvRowFn = void (*)(int64_t channels, int64_t taps, const float* window, const float* weights, int64_t stride,
                           float* y);
// The dot product of two float rows of n as ggml_vec_dot_f32 adds them at the level:
// the delta rule's dot, and llama.cpp's F32 matrix times one token (its prompt
// batches go through llamafile's sgemm, whose order the F32 gemm follows).
using DotF32Fn = float (*)(int64_t n, const float* x, const float* y);

// Indexed by ggml type number (Q6_0 = 133 is the largest).
inline constexpr size_t kTypeSlots = 134;

inline size_t slot(GgmlType type) { return static_cast<size_t>(type); }

struct KernelTable {
  std::array<VecDotFn, kTypeSlots> vec_dot{};      // by weight type
  std::array<GemmFn, kTypeSlots> gemm{};           // by weight type
  std::array<QuantizeRowFn, kTypeSlots> quantize{};  // by activation type
  // The level whose code fills each entry (after falling back to lower levels).
  std::array<CpuLevel, kTypeSlots> vec_dot_level{};
  std::array<CpuLevel, kTypeSlots> quantize_level{};
  SiluRowFn silu_row = nullptr;
  ExpRowFn exp_row = nullptr;
  CenteredSquaresRowFn centered_squares_row = nullptr;
  DeltaRuleStepFn delta_rule_step = nullptr;
  ConvRowFn conv_row = nullptr;
  DotF32Fn dot_f32_as_ggml = nullptr;
  CpuLevel level = CpuLevel::scalar;
};

// The table in use: the best level the host runs, or PICO_CPU_LEVEL
// (scalar|avx2|avx512|neon|dotprod|i8mm; lowered to the best supported level when the
// host lacks it), or what set_cpu_level chose last.
const KernelTable& active_kernels();

// The table of one level. Throws std::invalid_argument if the host lacks it.
const KernelTable& kernels_for(CpuLevel level);

// Switches the active table (tests, comparisons). Throws std::invalid_argument if the
// host lacks the level. Not meant to race with running kernels.
void set_cpu_level(CpuLevel level);
CpuLevel cpu_level();

// Entry setters for the ISA files. Out of line on purpose: an ISA file must not
// instantiate inline library code (std::array::operator[] ...) with its target flags,
// since the linker may keep that copy for everyone.
void set_kernel(KernelTable& table, GgmlType weight, VecDotFn vec_dot, GemmFn gemm);
void set_quantizer(KernelTable& table, GgmlType activation, QuantizeRowFn quantize);
void set_recurrent_functions(KernelTable& table, DeltaRuleStepFn delta_rule_step, ConvRowFn conv_row,
                             DotF32Fn dot_f32_as_ggml);
void set_row_functions(KernelTable& table, SiluRowFn silu_row, ExpRowFn exp_row,
                       CenteredSquaresRowFn centered_squares_row);

// Each ISA file fills the entries it has; missing ones stay null and are taken from
// the level below by the dispatcher.
void fill_scalar_kernels(KernelTable& table);
void fill_avx2_kernels(KernelTable& table);
void fill_avx512_kernels(KernelTable& table);
void fill_avx2_row_functions(KernelTable& table);
void fill_avx512_row_functions(KernelTable& table);
void fill_neon_kernels(KernelTable& table);
void fill_dotprod_kernels(KernelTable& table);
void fill_i8mm_kernels(KernelTable& table);

}  // namespace pico::cpu
