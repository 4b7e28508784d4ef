// qwen35 (Qwen3.5 / Qwen3.6 dense, 0.8B-27B) and qwen35moe (35B-A3B and larger): hybrids
// of Gated DeltaNet linear-attention layers and, every full_attention_interval-th layer,
// gated full attention (query and output gate from one projection, per-head Q/K norms,
// RoPE over the first rope.dimension_count dims). Each layer: x += mixer(norm(x));
// x += ffn(norm(x)), the FFN SwiGLU (qwen35) or a mixture of experts plus a sigmoid-gated
// shared expert (qwen35moe). Value head h reads key head h mod H_k (the converter tiles
// the value heads). The blocks are in gated_delta_net.cpp.
#include <stdexcept>

#include "model/model.hpp"

namespace pico::model {
namespace {

class Qwen35 final : public Model {
 public:
  Qwen35(const gguf::Model& file, Hparams hp) : Model(file, std::move(hp)) {}

 protected:
  void load_layer(int32_t il, LayerWeights& l) override {
    load_hybrid_mixer(il, l, /*fused_beta_alpha=*/false);
    if (hp_.arch == Arch::qwen35moe) {
      load_moe_ffn(il, l);
      load_shared_expert(il, l);
    } else {
      const int64_t e = hp_.n_embd;
      l.ffn_gate = matrix(blk(il, "ffn_gate.weight"), e, hp_.n_ff);
      l.ffn_up = matrix(blk(il, "ffn_up.weight"), e, hp_.n_ff);
      l.ffn_down = matrix(blk(il, "ffn_down.weight"), hp_.n_ff, e);
    }
  }

  void layer(ForwardContext& ctx, int32_t il, float* x) const override {
    hybrid_layer(ctx, il, x, /*grouped_heads=*/false);
  }
};

}  // namespace

std::unique_ptr<Model> make_qwen35(const gguf::Model& file, Hparams hp) {
  return std::make_unique<Qwen35>(file, std::move(hp));
}

}  // namespace pico::model
