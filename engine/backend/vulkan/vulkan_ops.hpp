// The ops of backend.hpp over device buffers: what a device-resident stage records,
// one dispatch each, into its device's command stream (nothing runs until
// Device::submit). Every output is reduced in one fixed order (a strided share per
// invocation, then a fixed tree over the workgroup), the same for a token alone and
// in a batch: batch invariance on the device.
#pragma once

#include <cstdint>

#include "backend/backend.hpp"
#include "backend/vulkan/vulkan_device.hpp"

namespace pico::backend::vulkan {

// A weight matrix uploaded to the device once (at load), in its file's type.
struct DeviceWeight {
  GgmlType type = GgmlType::F32;
  int64_t cols = 0;
  int64_t rows = 0;
  size_t row_bytes = 0;
  Buffer buffer;
};

// A MoE layer's experts uploaded once: each stack's n_expert matrices one after another
// in one buffer (rows: one expert's).
struct DeviceExperts {
  DeviceWeight gate, up, down;
  int64_t n_expert = 0;
};

// A layer's KV cache in device memory: F16 rows of n_kv_heads heads (K and V at the same
// row index), a sequence's positions in pages of 2^page_shift rows.
struct DeviceKvLayer {
  const Buffer* k = nullptr;
  const Buffer* v = nullptr;
  int64_t n_kv_heads = 0;
  int64_t head_dim_k = 0;
  int64_t head_dim_v = 0;
  int page_shift = 0;
};

// One query of an attention call, as the device reads it: its position, the positions
// its sequence's cache holds, and where its sequence's page table starts (the first row
// of each page, in position order).
struct DeviceQuery {
  uint32_t pos = 0;
  uint32_t n_pos = 0;
  uint32_t page_table = 0;
  uint32_t unused = 0;
};

// One sequence of a recurrent call, as the device reads it: its rows [first_row,
// first_row + rows) of the inputs, and where its conv state and delta-rule state start
// (in floats) in the state buffers.
struct DeviceSequence {
  uint32_t first_row = 0;
  uint32_t rows = 0;
  uint32_t conv_state = 0;
  uint32_t ssm_state = 0;
};

class Ops {
 public:
  explicit Ops(Device& device) : device_(device) {}

  Device& device() { return device_; }
  // The ops and weight types these shaders cover (others stay on the CPU for now).
  static bool supports(Op op, GgmlType type);

  DeviceWeight upload(const Weight& w);
  DeviceExperts upload(const ExpertWeights& w);

  // y row t (at y + t * y_stride floats) = w x_t for tokens rows of x (w.cols floats each).
  void matmul(const DeviceWeight& w, BufferRange x, int64_t tokens, BufferRange y, int64_t y_stride);
  void matmul(const DeviceWeight& w, BufferRange x, int64_t tokens, BufferRange y) {
    matmul(w, x, tokens, y, w.rows);
  }
  // out row i = table row ids[i] (ids: count int32 on the device; an id outside the
  // table leaves its row unwritten: the caller checks ids on the host).
  void get_rows(const DeviceWeight& table, BufferRange ids, int64_t count, BufferRange out);
  // weight: n floats, or a null buffer for none.
  void rms_norm(BufferRange x, BufferRange weight, int64_t n, int64_t rows, float eps, BufferRange y);
  void add(BufferRange a, BufferRange b, int64_t n, int64_t rows, int64_t b_rows, BufferRange y);
  void mul(BufferRange a, BufferRange b, int64_t n, int64_t rows, int64_t b_rows, BufferRange y);
  // x row r *= factors[r], in place, rows of n.
  void scale_rows(BufferRange x, BufferRange factors, int64_t n, int64_t rows);
  void layer_norm(BufferRange x, BufferRange weight, BufferRange bias, int64_t n, int64_t rows, float eps, BufferRange y);
  void l2_norm(BufferRange x, int64_t n, int64_t rows, float eps, BufferRange y);
  // Elementwise over count floats (backend.hpp's definitions).
  void silu(BufferRange x, int64_t count, BufferRange y);
  void sigmoid(BufferRange x, int64_t count, BufferRange y);
  void softplus(BufferRange x, int64_t count, BufferRange y);
  void gelu(BufferRange x, int64_t count, BufferRange y);
  void gelu_erf(BufferRange x, int64_t count, BufferRange y);
  void scale(BufferRange x, int64_t count, float factor);
  void softmax(BufferRange x, int64_t n, int64_t rows);
  // `rows` rows of n floats of x into y (which may be x) rounded to the values of the
  // activations a matmul over `weight_type` multiplies on the CPU (its dot partner: F32
  // copies them as they are; F16, BF16, Q8_0, Q8_1, Q8_K), as cpu::quantize_activations
  // then dequantized. One dispatch, no copy before it.
  void round_rows(BufferRange x, int64_t n, int64_t rows, GgmlType weight_type, BufferRange y);
  // K or V rows into a KV pool of F16 rows (DeviceKvLayer's k or v): row s of x (n
  // floats, n even, at s * x_stride) rounded to F16 (as fp32_to_fp16) into pool row
  // rows[s] (count uint32 on the device).
  void store_kv_f16(BufferRange x, int64_t n, int64_t x_stride, BufferRange rows, int64_t count, const Buffer& pool);
  // backend.hpp's argmax_rows: rows (count uint32 on the device) of x, rows of n floats;
  // out: count indices, then count values' bits.
  void argmax_rows(BufferRange x, int64_t n, int64_t x_rows, BufferRange rows, int64_t count, BufferRange out);
  // backend.hpp's attention over a device KV cache: queries (n_queries DeviceQuery) and
  // page_table on the device; max_keys bounds the keys any query sees (its scores' room).
  void attention(BufferRange q, int64_t q_row_stride, const DeviceKvLayer& kv, BufferRange queries,
                 BufferRange page_table, int64_t n_queries, int64_t max_keys, const AttentionParams& params,
                 BufferRange out);
  // backend.hpp's ssm_conv and delta_rule over n_sequences DeviceSequence (on the device),
  // the states updated in place in conv_states / ssm_states; `rows` is the inputs' row count.
  void ssm_conv(BufferRange x, int64_t channels, BufferRange weights, int64_t taps, BufferRange sequences,
                int64_t n_sequences, const Buffer& conv_states, int64_t rows, BufferRange y);
  void delta_rule(BufferRange q, BufferRange k, BufferRange v, int64_t row_stride, BufferRange log_decay,
                  BufferRange beta, BufferRange sequences, int64_t n_sequences, const Buffer& ssm_states,
                  const DeltaRuleParams& params, int64_t rows, BufferRange out);
  // backend.hpp's moe_route: experts (int32) and weights, k per token, on the device.
  void moe_route(BufferRange logits, int64_t n_expert, int64_t tokens, int64_t k, bool normalize, BufferRange experts,
                 BufferRange weights);
  // backend.hpp's moe_ffn: each token's k chosen experts (experts, weights from
  // moe_route) on that token, only their matrices read; the intermediate rows in
  // `scratch` (at least moe_scratch_bytes, not used by anything else until submitted).
  void moe_ffn(const DeviceExperts& w, BufferRange x, int64_t tokens, BufferRange experts, BufferRange weights,
               int64_t k, const Buffer& scratch, BufferRange out);
  size_t moe_scratch_bytes(const DeviceExperts& w, int64_t tokens, int64_t k) const;
  // Rotates, in place, `heads` heads of head_dim per token (token t's at t * row_stride
  // floats), at positions pos (tokens int32 on the device).
  void rope(BufferRange x, int64_t tokens, int64_t row_stride, int64_t heads, int64_t head_dim, BufferRange pos,
            const RopeParams& params);

 private:
  enum class UnaryOp : uint32_t { silu, sigmoid, softplus, gelu, gelu_erf, scale };
  DeviceWeight upload_rows(GgmlType type, int64_t cols, int64_t rows, const void* data);
  struct MoeParts {
    size_t gate, up, down, end;  // byte offsets in the scratch buffer, and its size
  };
  MoeParts moe_parts(const DeviceExperts& w, int64_t tokens, int64_t k) const;
  // Output row s = expert ids[s]'s matrix of w times x row s (x_per_slot) or row
  // s / slots_per_token.
  void matmul_id(const DeviceWeight& w, int64_t n_expert, BufferRange x, bool x_per_slot, int64_t slots_per_token,
                 BufferRange ids, int64_t slots, BufferRange y);
  void unary(UnaryOp op, BufferRange x, int64_t count, BufferRange y, float factor = 1.0f);
  void elementwise(Shader shader, BufferRange a, BufferRange b, int64_t n, int64_t rows, int64_t b_rows, BufferRange y);
  Device& device_;
  Buffer scores_;  // attention's scratch, grown as needed
};

}  // namespace pico::backend::vulkan
