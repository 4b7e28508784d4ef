// qwen3: llama's layer with a per-head RMSNorm of Q and K before RoPE, RoPE in NEOX
// mode (pairs i, i + d/2), no biases.
#include "model/model.hpp"

namespace pico::model {
namespace {

class Qwen3 final : public Model {
 public:
  Qwen3(const gguf::Model& file, Hparams hp) : Model(file, std::move(hp)) {}

 protected:
  void load_layer(int32_t il, LayerWeights& l) override {
    load_attention(il, l);
    load_qk_norms(il, l);
    load_gated_ffn(il, l);
  }

  void layer(ForwardContext& ctx, int32_t il, float* x) const override {
    pre_norm_layer(ctx, il, x, qk_normed_attention(w_.layers[static_cast<size_t>(il)]));
  }
};

}  // namespace

std::unique_ptr<Model> make_qwen3(const gguf::Model& file, Hparams hp) {
  return std::make_unique<Qwen3>(file, std::move(hp));
}

}  // namespace pico::model
