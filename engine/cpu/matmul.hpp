// y = W x for a weight matrix of any supported type: y[t * rows + r] = dot(row r of
// W, row t of x). Each x row is quantized once to W's dot partner type (as llama.cpp
// quantizes activations), then rows of W are split across the pool's threads.
//
// Results are bit-identical whatever the number of tokens, the thread count and the
// split (see kernels.hpp on batch invariance).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu/kernels.hpp"
#include "cpu/thread_pool.hpp"
#include "quant/type_traits.hpp"

namespace pico::cpu {

// The activation type x is quantized to for weights of `w_type`.
GgmlType activation_type(GgmlType w_type);

// Bytes of one quantized activation row of length k for weights of `w_type`.
size_t activation_row_bytes(GgmlType w_type, int64_t k);

// Quantizes `tokens` rows of k floats for weights of `w_type` into `out`
// (tokens * activation_row_bytes bytes), in parallel over tokens.
void quantize_activations(const ThreadPool& pool, GgmlType w_type, const float* x, int64_t k, int64_t tokens,
                          void* out);

// The matmul with activations already quantized by quantize_activations (lets one
// quantized input feed several weight matrices, e.g. Q, K and V).
void matmul_quantized(const ThreadPool& pool, GgmlType w_type, const void* w, int64_t rows, int64_t k,
                      const void* x_quantized, int64_t tokens, float* y);

// Quantizes x into a per-calling-thread scratch buffer, then matmul_quantized.
// Throws std::invalid_argument for a type without kernels or k not a whole number of
// blocks.
void matmul(const ThreadPool& pool, GgmlType w_type, const void* w, int64_t rows, int64_t k, const float* x,
            int64_t tokens, float* y);

}  // namespace pico::cpu
