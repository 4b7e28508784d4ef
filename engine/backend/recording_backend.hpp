// Test support: a Backend that forwards every op to another one and records what the
// model asked for: the weight bytes each op was handed (matmul weights whole, the
// rows get_rows reads, and for moe_ffn only the chosen experts' matrices, which is
// all moe_test proves the CPU op reads) and every routing decision.
#pragma once

#include <cstdint>
#include <set>
#include <vector>

#include "backend/backend.hpp"

namespace pico::backend {

class RecordingBackend final : public Backend {
 public:
  explicit RecordingBackend(Backend& inner) : inner_(inner) {}

  uint64_t weight_bytes = 0;
  // Per moe_route call and token: the chosen experts and their weights.
  std::vector<std::vector<int32_t>> routes;
  std::vector<std::vector<float>> route_weights;

  const char* name() const override { return "recording"; }
  bool supports(Op op, GgmlType type) const override { return inner_.supports(op, type); }

  uint64_t submissions() const override { return inner_.submissions(); }
  float* activations(int64_t count) override { return inner_.activations(count); }
  size_t activation_mark() const override { return inner_.activation_mark(); }
  void release_activations(size_t mark) override { inner_.release_activations(mark); }
  void upload(const float* host, int64_t count, float* to) override { inner_.upload(host, count, to); }
  void download(const float* from, int64_t count, float* host) override { inner_.download(from, count, host); }
  void copy_rows(const float* x, int64_t x_stride, int64_t rows, int64_t n, float* y, int64_t y_stride) override {
    inner_.copy_rows(x, x_stride, rows, n, y, y_stride);
  }
  void argmax_rows(const float* x, int64_t n, const int32_t* rows, int64_t count, float* out) override {
    inner_.argmax_rows(x, n, rows, count, out);
  }
  void gather_rows(const float* x, int64_t n, const int32_t* ids, int64_t count, float* y) override {
    inner_.gather_rows(x, n, ids, count, y);
  }
  void scale_rows(float* x, int64_t n, int64_t rows, const float* factors) override {
    inner_.scale_rows(x, n, rows, factors);
  }
  void store_kv(state::KvCache& cache, int32_t layer, std::span<const KvSlot> slots, const float* k, int64_t k_stride,
                const float* v, int64_t v_stride) override {
    inner_.store_kv(cache, layer, slots, k, k_stride, v, v_stride);
  }

  void matmul(const Weight& w, const float* x, int64_t tokens, float* y) override {
    weight_bytes += bytes(w);
    inner_.matmul(w, x, tokens, y);
  }
  void matmul_many(std::span<const Weight> ws, const float* x, int64_t tokens, std::span<float* const> ys) override {
    for (const Weight& w : ws) weight_bytes += bytes(w);
    inner_.matmul_many(ws, x, tokens, ys);
  }
  void get_rows(const Weight& table, const int32_t* ids, int64_t count, float* out) override {
    weight_bytes += static_cast<uint64_t>(count) * bytes(Weight{table.type, table.data, table.cols, 1});
    inner_.get_rows(table, ids, count, out);
  }
  void rms_norm(const float* x, const float* w, int64_t n, int64_t rows, float eps, float* y) override {
    inner_.rms_norm(x, w, n, rows, eps, y);
  }
  void layer_norm(const float* x, const float* w, const float* b, int64_t n, int64_t rows, float eps,
                  float* y) override {
    inner_.layer_norm(x, w, b, n, rows, eps, y);
  }
  void rope(float* x, int64_t tokens, int64_t row_stride, int64_t heads, int64_t head_dim, const int32_t* pos,
            const RopeParams& params) override {
    inner_.rope(x, tokens, row_stride, heads, head_dim, pos, params);
  }
  void attention(const float* q, int64_t q_row_stride, std::span<const AttentionQuery> queries,
                 const AttentionParams& params, float* out) override {
    inner_.attention(q, q_row_stride, queries, params, out);
  }
  void add(const float* a, const float* b, int64_t n, int64_t rows, int64_t b_rows, float* y) override {
    inner_.add(a, b, n, rows, b_rows, y);
  }
  void mul(const float* a, const float* b, int64_t n, int64_t rows, int64_t b_rows, float* y) override {
    inner_.mul(a, b, n, rows, b_rows, y);
  }
  void scale(float* x, int64_t count, float factor) override { inner_.scale(x, count, factor); }
  void silu(const float* x, int64_t n, int64_t rows, float* y) override { inner_.silu(x, n, rows, y); }
  void gelu(const float* x, int64_t count, float* y) override { inner_.gelu(x, count, y); }
  void gelu_erf(const float* x, int64_t count, float* y) override { inner_.gelu_erf(x, count, y); }
  void softmax(float* x, int64_t n, int64_t rows) override { inner_.softmax(x, n, rows); }
  void sigmoid(const float* x, int64_t count, float* y) override { inner_.sigmoid(x, count, y); }
  void softplus(const float* x, int64_t count, float* y) override { inner_.softplus(x, count, y); }
  void l2_norm(const float* x, int64_t n, int64_t rows, float eps, float* y) override {
    inner_.l2_norm(x, n, rows, eps, y);
  }
  void ssm_conv(const float* x, int64_t channels, const float* weights, int64_t taps,
                std::span<const RecurrentSequence> sequences, float* y) override {
    inner_.ssm_conv(x, channels, weights, taps, sequences, y);
  }
  void delta_rule(const float* q, const float* k, const float* v, int64_t row_stride, const float* log_decay,
                  const float* beta, std::span<const RecurrentSequence> sequences, const DeltaRuleParams& params,
                  float* out) override {
    inner_.delta_rule(q, k, v, row_stride, log_decay, beta, sequences, params, out);
  }

  void moe_route(const float* logits, int64_t n_expert, int64_t tokens, int64_t k, bool normalize, int32_t* experts,
                 float* weights) override {
    inner_.moe_route(logits, n_expert, tokens, k, normalize, experts, weights);
    const std::vector<int32_t> chosen = host_ints(experts, tokens * k);
    std::vector<float> chosen_weights(static_cast<size_t>(tokens * k));
    inner_.download(weights, tokens * k, chosen_weights.data());
    for (int64_t t = 0; t < tokens; ++t) {
      routes.emplace_back(chosen.begin() + t * k, chosen.begin() + (t + 1) * k);
      route_weights.emplace_back(chosen_weights.begin() + t * k, chosen_weights.begin() + (t + 1) * k);
    }
  }
  void moe_ffn(const ExpertWeights& w, const float* x, int64_t tokens, const int32_t* experts, const float* weights,
               int64_t k, float* out) override {
    const std::vector<int32_t> routed = host_ints(experts, tokens * k);
    const std::set<int32_t> chosen(routed.begin(), routed.end());
    weight_bytes += chosen.size() * (w.gate.expert_bytes() + w.up.expert_bytes() + w.down.expert_bytes());
    inner_.moe_ffn(w, x, tokens, experts, weights, k, out);
  }

 private:
  // Expert ids wherever they are (activation memory holds them in float-sized slots).
  std::vector<int32_t> host_ints(const int32_t* ids, int64_t count) {
    std::vector<int32_t> out(static_cast<size_t>(count));
    inner_.download(reinterpret_cast<const float*>(ids), count, reinterpret_cast<float*>(out.data()));
    return out;
  }
  static uint64_t bytes(const Weight& w) {
    return bytes_of(type_traits(w.type), static_cast<uint64_t>(w.cols)).value() * static_cast<uint64_t>(w.rows);
  }

  Backend& inner_;
};

}  // namespace pico::backend
