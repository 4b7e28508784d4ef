// qwen3moe (Qwen3-30B-A3B, 235B-A22B): qwen3's attention (per-head Q/K RMSNorm, NEOX
// RoPE over the whole head) and, in every layer, a mixture-of-experts FFN in place of
// the dense one: softmax router, the top expert_used_count experts, their weights
// renormalised, no shared expert.
#include <stdexcept>

#include "model/model.hpp"

namespace pico::model {
namespace {

class Qwen3Moe final : public Model {
 public:
  Qwen3Moe(const gguf::Model& file, Hparams hp) : Model(file, std::move(hp)) {}

 protected:
  void load_layer(int32_t il, LayerWeights& l) override {
    load_attention(il, l);
    load_qkv_biases(il, l, false);  // llama.cpp accepts optional Q/K/V biases here
    load_qk_norms(il, l);
    load_moe_ffn(il, l);
  }

  void layer(ForwardContext& ctx, int32_t il, float* x) const override {
    // The layer's router makes pre_norm_layer's FFN the experts.
    pre_norm_layer(ctx, il, x, qk_normed_attention(w_.layers[static_cast<size_t>(il)]));
  }
};

}  // namespace

std::unique_ptr<Model> make_qwen3moe(const gguf::Model& file, Hparams hp) {
  if (hp.n_rot != hp.head_dim_k || hp.head_dim_k != hp.head_dim_v) {
    throw std::invalid_argument("qwen3moe: RoPE must cover the whole head, and K and V heads be equally wide");
  }
  return std::make_unique<Qwen3Moe>(file, std::move(hp));
}

}  // namespace pico::model
