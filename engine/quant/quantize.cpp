#include "quant/quantize.hpp"

#include <stdexcept>
#include <string>

namespace pico {
namespace {

void check_length(const TypeTraits& row, int64_t n, const char* what) {
  if (n < 0 || n % row.block_size != 0) {
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(n) + " elements of " +
                                std::string(row.name) + " are not a whole number of " +
                                std::to_string(row.block_size) + "-element blocks");
  }
}

}  // namespace

bool has_quantizer(GgmlType type) { return type_traits(type).quantize != nullptr; }
bool has_dequantizer(GgmlType type) { return type_traits(type).dequantize != nullptr; }

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  const TypeTraits& row = type_traits(type);
  if (!row.dequantize) {
    throw std::invalid_argument("dequantize_row: type " + std::string(row.name) + " has no dequantizer");
  }
  check_length(row, n, "dequantize_row");
  if (n > 0) row.dequantize(src, dst, n);
}

void quantize_row(GgmlType type, const float* src, void* dst, int64_t n) {
  const TypeTraits& row = type_traits(type);
  if (!row.quantize) {
    throw std::invalid_argument("quantize_row: type " + std::string(row.name) + " has no quantizer");
  }
  check_length(row, n, "quantize_row");
  if (n > 0) row.quantize(src, dst, n);
}

size_t quantize_tensor(GgmlType type, const float* src, void* dst, int64_t rows, int64_t row_length) {
  const TypeTraits& row = type_traits(type);
  if (!row.quantize) {
    throw std::invalid_argument("quantize_tensor: type " + std::string(row.name) + " has no quantizer");
  }
  check_length(row, row_length, "quantize_tensor: row");
  if (rows < 0) throw std::invalid_argument("quantize_tensor: negative row count");
  const size_t row_bytes = static_cast<size_t>(row_length / row.block_size) * row.block_bytes;
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t r = 0; r < rows; ++r) {
    if (row_length > 0) row.quantize(src + r * row_length, out + static_cast<size_t>(r) * row_bytes, row_length);
  }
  return static_cast<size_t>(rows) * row_bytes;
}

}  // namespace pico
