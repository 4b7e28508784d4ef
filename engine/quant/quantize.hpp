// Row-level entry points to the reference (scalar) dequantizers and quantizers of
// the type table. These are the slow, exact paths: conversion of whole tensors,
// tests, and the ground truth the optimized kernels are checked against.
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/type_traits.hpp"

namespace pico {

// True when `type` has a reference quantizer (every type except the IQ2/IQ3/IQ1
// families and the plain integer types).
bool has_quantizer(GgmlType type);
bool has_dequantizer(GgmlType type);

// `n` elements of `type` at `src` (n / block_size blocks) into n floats.
// Throws std::invalid_argument if the type has no dequantizer or n is not a
// multiple of its block size.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

// n floats into n / block_size blocks of `type`. Throws std::invalid_argument if the
// type has no quantizer or n is not a multiple of its block size.
void quantize_row(GgmlType type, const float* src, void* dst, int64_t n);

// `rows` rows of `row_length` floats, each quantized on its own (blocks never span
// rows). Returns the bytes written. Throws std::invalid_argument as quantize_row does,
// checking row_length against the block size.
size_t quantize_tensor(GgmlType type, const float* src, void* dst, int64_t rows, int64_t row_length);

}  // namespace pico
