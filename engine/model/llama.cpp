// llama / mistral: RMSNorm, RoPE in normal mode (pairs 2i, 2i+1), grouped-query
// attention, SwiGLU feed-forward.
#include "model/model.hpp"

namespace pico::model {
namespace {

class Llama final : public Model {
 public:
  Llama(const gguf::Model& file, Hparams hp) : Model(file, std::move(hp)) {}

 protected:
  void load_layer(int32_t il, LayerWeights& l) override {
    load_attention(il, l);
    load_qkv_biases(il, l, false);  // some llama fine-tunes carry biases
    load_gated_ffn(il, l);
  }

  void layer(ForwardContext& ctx, int32_t il, float* x) const override {
    AttentionSpec spec;
    spec.rope = rope_params(hp_.rope_freq_base, hp_.rope_freq_scale);
    pre_norm_layer(ctx, il, x, spec);
  }
};

}  // namespace

std::unique_ptr<Model> make_llama(const gguf::Model& file, Hparams hp) {
  return std::make_unique<Llama>(file, std::move(hp));
}

}  // namespace pico::model
