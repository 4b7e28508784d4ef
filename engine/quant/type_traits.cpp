#include "quant/type_traits.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>

#include "quant/reference_impl.hpp"

namespace pico {
namespace {

// Block layouts (offsets in bytes) of the fields that are numbers wider than a byte.
constexpr BlockField kScalar2[] = {{0, 2, 1}};
constexpr BlockField kScalar4[] = {{0, 4, 1}};
constexpr BlockField kScalar8[] = {{0, 8, 1}};
constexpr BlockField kHalfAt0[] = {{0, 2, 1}};            // d first (q4_0, q5_0, q8_0, iq4_nl, q1_0, q2_0, q6_0, iq2_xxs...)
constexpr BlockField kTwoHalvesAt0[] = {{0, 2, 2}};       // d, m/dmin/s (q4_1, q5_1, q8_1, q4_K, q5_K)
constexpr BlockField kQ2K[] = {{80, 2, 2}};               // scales[16], qs[64], d, dmin
constexpr BlockField kQ3K[] = {{108, 2, 1}};              // hmask[32], qs[64], scales[12], d
constexpr BlockField kQ6K[] = {{208, 2, 1}};              // ql[128], qh[64], scales[16], d
constexpr BlockField kQ8K[] = {{0, 4, 1}, {260, 2, 16}};  // d (f32), qs[256], bsums[16]
constexpr BlockField kIQ2XXS[] = {{0, 2, 33}};            // d, qs as 32 uint16
constexpr BlockField kIQ2XS[] = {{0, 2, 33}};             // d, qs as 32 uint16, scales[8]
constexpr BlockField kIQ1S[] = {{0, 2, 1}, {34, 2, 8}};   // d, qs[32], qh as 8 uint16
constexpr BlockField kIQ4XS[] = {{0, 2, 2}};              // d, scales_h, scales_l[4], qs[128]
constexpr BlockField kIQ1M[] = {{48, 2, 4}};              // qs[32], qh[16], scales as 4 uint16
constexpr BlockField kTQ1[] = {{52, 2, 1}};               // qs[48], qh[4], d
constexpr BlockField kTQ2[] = {{64, 2, 1}};               // qs[64], d
constexpr BlockField kNone[] = {{0, 0, 0}};

std::span<const BlockField> none() { return std::span<const BlockField>(kNone, 0); }

TypeTraits plain(GgmlType type, std::string_view name, uint32_t bytes, std::span<const BlockField> fields) {
  return TypeTraits{type, name, 1, bytes, false, fields, nullptr, nullptr, std::nullopt};
}
TypeTraits blocked(GgmlType type, std::string_view name, uint32_t block, uint32_t bytes,
                   std::span<const BlockField> fields) {
  return TypeTraits{type, name, block, bytes, true, fields, nullptr, nullptr, std::nullopt};
}

std::array<TypeTraits, 36> make_table() {
  using T = GgmlType;
  return {{
      plain(T::F32, "f32", 4, kScalar4),
      plain(T::F16, "f16", 2, kScalar2),
      blocked(T::Q4_0, "q4_0", 32, 18, kHalfAt0),
      blocked(T::Q4_1, "q4_1", 32, 20, kTwoHalvesAt0),
      blocked(T::Q5_0, "q5_0", 32, 22, kHalfAt0),
      blocked(T::Q5_1, "q5_1", 32, 24, kTwoHalvesAt0),
      blocked(T::Q8_0, "q8_0", 32, 34, kHalfAt0),
      blocked(T::Q8_1, "q8_1", 32, 36, kTwoHalvesAt0),
      blocked(T::Q2_K, "q2_K", 256, 84, kQ2K),
      blocked(T::Q3_K, "q3_K", 256, 110, kQ3K),
      blocked(T::Q4_K, "q4_K", 256, 144, kTwoHalvesAt0),
      blocked(T::Q5_K, "q5_K", 256, 176, kTwoHalvesAt0),
      blocked(T::Q6_K, "q6_K", 256, 210, kQ6K),
      blocked(T::Q8_K, "q8_K", 256, 292, kQ8K),
      blocked(T::IQ2_XXS, "iq2_xxs", 256, 66, kIQ2XXS),
      blocked(T::IQ2_XS, "iq2_xs", 256, 74, kIQ2XS),
      blocked(T::IQ3_XXS, "iq3_xxs", 256, 98, kHalfAt0),
      blocked(T::IQ1_S, "iq1_s", 256, 50, kIQ1S),
      blocked(T::IQ4_NL, "iq4_nl", 32, 18, kHalfAt0),
      blocked(T::IQ3_S, "iq3_s", 256, 110, kHalfAt0),
      blocked(T::IQ2_S, "iq2_s", 256, 82, kHalfAt0),
      blocked(T::IQ4_XS, "iq4_xs", 256, 136, kIQ4XS),
      plain(T::I8, "i8", 1, none()),
      plain(T::I16, "i16", 2, kScalar2),
      plain(T::I32, "i32", 4, kScalar4),
      plain(T::I64, "i64", 8, kScalar8),
      plain(T::F64, "f64", 8, kScalar8),
      blocked(T::IQ1_M, "iq1_m", 256, 56, kIQ1M),
      plain(T::BF16, "bf16", 2, kScalar2),
      blocked(T::TQ1_0, "tq1_0", 256, 54, kTQ1),
      blocked(T::TQ2_0, "tq2_0", 256, 66, kTQ2),
      blocked(T::MXFP4, "mxfp4", 32, 17, none()),
      blocked(T::NVFP4, "nvfp4", 64, 36, none()),
      blocked(T::Q1_0, "q1_0", 128, 18, kHalfAt0),
      blocked(T::Q2_0, "q2_0", 64, 18, kHalfAt0),
      blocked(T::Q6_0, "q6_0", 32, 26, kHalfAt0),
  }};
}

// The reference kernels of engine/quant/ (reference_impl.hpp) and the activation
// type each type's dot product pairs with (ggml-cpu's vec_dot_type). The IQ2, IQ3 and
// IQ1 types have a dequantizer only.
struct Kernels {
  GgmlType type;
  DequantizeFn dequantize;
  QuantizeFn quantize;
  std::optional<GgmlType> dot_partner;
};

std::array<Kernels, 31> kernel_table() {
  using T = GgmlType;
  namespace q = quant;
  return {{
      {T::F32, q::dequantize_f32, q::quantize_f32, T::F32},
      {T::F16, q::dequantize_f16, q::quantize_f16, T::F16},
      {T::BF16, q::dequantize_bf16, q::quantize_bf16, T::BF16},
      {T::Q4_0, q::dequantize_q4_0, q::quantize_q4_0, T::Q8_0},
      {T::Q4_1, q::dequantize_q4_1, q::quantize_q4_1, T::Q8_1},
      {T::Q5_0, q::dequantize_q5_0, q::quantize_q5_0, T::Q8_0},
      {T::Q5_1, q::dequantize_q5_1, q::quantize_q5_1, T::Q8_1},
      {T::Q8_0, q::dequantize_q8_0, q::quantize_q8_0, T::Q8_0},
      {T::Q8_1, q::dequantize_q8_1, q::quantize_q8_1, T::Q8_1},
      {T::Q2_K, q::dequantize_q2_K, q::quantize_q2_K, T::Q8_K},
      {T::Q3_K, q::dequantize_q3_K, q::quantize_q3_K, T::Q8_K},
      {T::Q4_K, q::dequantize_q4_K, q::quantize_q4_K, T::Q8_K},
      {T::Q5_K, q::dequantize_q5_K, q::quantize_q5_K, T::Q8_K},
      {T::Q6_K, q::dequantize_q6_K, q::quantize_q6_K, T::Q8_K},
      {T::Q8_K, q::dequantize_q8_K, q::quantize_q8_K, std::nullopt},  // activations only
      {T::IQ2_XXS, q::dequantize_iq2_xxs, nullptr, T::Q8_K},
      {T::IQ2_XS, q::dequantize_iq2_xs, nullptr, T::Q8_K},
      {T::IQ2_S, q::dequantize_iq2_s, nullptr, T::Q8_K},
      {T::IQ3_XXS, q::dequantize_iq3_xxs, nullptr, T::Q8_K},
      {T::IQ3_S, q::dequantize_iq3_s, nullptr, T::Q8_K},
      {T::IQ1_S, q::dequantize_iq1_s, nullptr, T::Q8_K},
      {T::IQ1_M, q::dequantize_iq1_m, nullptr, T::Q8_K},
      {T::IQ4_NL, q::dequantize_iq4_nl, q::quantize_iq4_nl, T::Q8_0},
      {T::IQ4_XS, q::dequantize_iq4_xs, q::quantize_iq4_xs, T::Q8_K},
      {T::TQ1_0, q::dequantize_tq1_0, q::quantize_tq1_0, T::Q8_K},
      {T::TQ2_0, q::dequantize_tq2_0, q::quantize_tq2_0, T::Q8_K},
      {T::MXFP4, q::dequantize_mxfp4, q::quantize_mxfp4, T::Q8_0},
      {T::NVFP4, q::dequantize_nvfp4, q::quantize_nvfp4, T::Q8_0},
      {T::Q1_0, q::dequantize_q1_0, q::quantize_q1_0, T::Q8_0},
      {T::Q2_0, q::dequantize_q2_0, q::quantize_q2_0, T::Q8_0},
      {T::Q6_0, q::dequantize_q6_0, q::quantize_q6_0, T::Q8_0},
      // The integer and f64 rows carry no kernels.
  }};
}

std::array<TypeTraits, 36> make_table_with_kernels() {
  std::array<TypeTraits, 36> rows = make_table();
  for (const Kernels& k : kernel_table()) {
    for (TypeTraits& row : rows) {
      if (row.type != k.type) continue;
      row.dequantize = k.dequantize;
      row.quantize = k.quantize;
      row.dot_partner = k.dot_partner;
    }
  }
  return rows;
}

std::array<TypeTraits, 36>& table() {
  static std::array<TypeTraits, 36> rows = make_table_with_kernels();
  return rows;
}

void reverse_bytes(uint8_t* p, unsigned width) { std::reverse(p, p + width); }

}  // namespace

std::span<const TypeTraits> all_types() { return table(); }

const TypeTraits* find_type(uint32_t type_number) {
  for (const TypeTraits& row : table()) {
    if (static_cast<uint32_t>(row.type) == type_number) return &row;
  }
  return nullptr;
}

const TypeTraits& type_traits(GgmlType type) {
  const TypeTraits* row = find_type(static_cast<uint32_t>(type));
  // Every enumerator has a row; a miss is a programming error caught by the tests.
  return row ? *row : table()[0];
}

std::string_view refusal_reason(uint32_t type_number) {
  switch (type_number) {
    case 4: return "retired type Q4_2 (4): no longer readable, re-convert the model";
    case 5: return "retired type Q4_3 (5): no longer readable, re-convert the model";
    case 31: return "retired interleaved type Q4_0_4_4 (31): GGUF files no longer carry it, re-convert the model";
    case 32: return "retired interleaved type Q4_0_4_8 (32): GGUF files no longer carry it, re-convert the model";
    case 33: return "retired interleaved type Q4_0_8_8 (33): GGUF files no longer carry it, re-convert the model";
    case 36: return "retired interleaved type IQ4_NL_4_4 (36): GGUF files no longer carry it, re-convert the model";
    case 37: return "retired interleaved type IQ4_NL_4_8 (37): GGUF files no longer carry it, re-convert the model";
    case 38: return "retired interleaved type IQ4_NL_8_8 (38): GGUF files no longer carry it, re-convert the model";
    default: return find_type(type_number) ? std::string_view{} : std::string_view{"unknown tensor type"};
  }
}

std::optional<uint64_t> bytes_of(const TypeTraits& traits, uint64_t elements) {
  if (elements % traits.block_size != 0) return std::nullopt;
  const uint64_t blocks = elements / traits.block_size;
  if (blocks != 0 && traits.block_bytes > UINT64_MAX / blocks) return std::nullopt;
  return blocks * traits.block_bytes;
}

void byteswap_blocks(const TypeTraits& traits, void* blocks, uint64_t block_count) {
  auto* bytes = static_cast<uint8_t*>(blocks);
  for (uint64_t b = 0; b < block_count; ++b) {
    uint8_t* block = bytes + b * traits.block_bytes;
    for (const BlockField& field : traits.fields) {
      for (unsigned i = 0; i < field.count; ++i) reverse_bytes(block + field.offset + i * field.width, field.width);
    }
  }
}

}  // namespace pico
