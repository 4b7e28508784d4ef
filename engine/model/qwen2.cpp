// qwen2: llama's layer with Q, K and V biases and RoPE in NEOX mode (pairs i, i + d/2;
// hparams set rope_neox for this architecture).
#include "model/model.hpp"

namespace pico::model {
namespace {

class Qwen2 final : public Model {
 public:
  Qwen2(const gguf::Model& file, Hparams hp) : Model(file, std::move(hp)) {}

 protected:
  void load_layer(int32_t il, LayerWeights& l) override {
    load_attention(il, l);
    load_qkv_biases(il, l, true);
    load_gated_ffn(il, l);
  }

  void layer(ForwardContext& ctx, int32_t il, float* x) const override {
    AttentionSpec spec;
    spec.rope = rope_params(hp_.rope_freq_base, hp_.rope_freq_scale);
    pre_norm_layer(ctx, il, x, spec);
  }
};

}  // namespace

std::unique_ptr<Model> make_qwen2(const gguf::Model& file, Hparams hp) {
  return std::make_unique<Qwen2>(file, std::move(hp));
}

}  // namespace pico::model
