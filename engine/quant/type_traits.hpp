// One row per ggml tensor type, numbered as ggml numbers them.
//
// A row says how a type is laid out (elements per block, bytes per block, which
// fields of a block are multi-byte numbers, so that a file of the other byte order
// can be swapped) and, for the quantized types, how to turn blocks into floats and
// back and which activation type its dot product pairs with. Adding a type means
// adding its row here and its kernels in engine/cpu/; nothing else changes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace pico {

enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
  NVFP4 = 40,
  Q1_0 = 41,
  Q2_0 = 42,
  Q6_0 = 133,  // ik_llama.cpp's number and layout
};

// A run of multi-byte numbers inside a block: `count` numbers of `width` bytes
// starting at `offset`. Byte arrays (quants, packed bits) need no entry.
struct BlockField {
  uint16_t offset;
  uint8_t width;  // 2, 4 or 8
  uint16_t count;
};

// Dequantize `count` elements (a multiple of the block size) from `blocks`.
using DequantizeFn = void (*)(const void* blocks, float* out, int64_t count);
// Reference quantizer: `count` floats (a multiple of the block size) into blocks.
using QuantizeFn = void (*)(const float* in, void* blocks, int64_t count);

struct TypeTraits {
  GgmlType type;
  std::string_view name;  // as ggml prints it: "q4_K", "f16", ...
  uint32_t block_size;    // elements per block (1 for plain types)
  uint32_t block_bytes;   // bytes per block
  bool is_quantized;
  std::span<const BlockField> fields;  // multi-byte numbers within one block
  // Reference (scalar) kernels, bit-exact with ggml's (quant/quantize.hpp wraps
  // them). Null where a type has none: no quantizer for the IQ2/IQ3/IQ1 types, no
  // kernels for the integer and f64 types.
  DequantizeFn dequantize = nullptr;
  QuantizeFn quantize = nullptr;
  std::optional<GgmlType> dot_partner;  // activation type of its vec_dot (none for Q8_K)
};

// The row of a type number, or nullptr for numbers that are not a type GGUF files
// may carry (including the retired interleaved types 4, 5, 31-33 and 36-38).
const TypeTraits* find_type(uint32_t type_number);
const TypeTraits& type_traits(GgmlType type);

// Why a type number is refused, for error messages ("retired interleaved type
// Q4_0_4_4 (31): re-convert the model" or "unknown tensor type 77").
std::string_view refusal_reason(uint32_t type_number);

// Bytes of `elements` values of `type`; nullopt if `elements` is not a whole number
// of blocks or the size overflows 64 bits.
std::optional<uint64_t> bytes_of(const TypeTraits& traits, uint64_t elements);

// Reverses the byte order of every multi-byte field of `block_count` blocks.
void byteswap_blocks(const TypeTraits& traits, void* blocks, uint64_t block_count);

std::span<const TypeTraits> all_types();

}  // namespace pico
