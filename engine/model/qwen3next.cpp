// qwen3next (Qwen3-Next-80B-A3B): qwen35moe's layers (gated attention every
// full_attention_interval-th layer, Gated DeltaNet otherwise, a mixture of experts with a
// shared expert in every layer) with two differences of layout: beta and the decay's
// input come from one projection, ssm_ba, grouped per key head ([r betas | r alphas] for
// each of the H_k groups), and value head h reads key head h / (H_v / H_k). RoPE is NEOX.
#include <stdexcept>

#include "model/model.hpp"

namespace pico::model {
namespace {

class Qwen3Next final : public Model {
 public:
  Qwen3Next(const gguf::Model& file, Hparams hp) : Model(file, std::move(hp)) {}

 protected:
  void load_layer(int32_t il, LayerWeights& l) override {
    if (file_.find_tensor(blk(il, "ssm_in.weight"))) {
      throw std::invalid_argument("qwen3next: the legacy fused ssm_in projection is not supported (convert again)");
    }
    load_hybrid_mixer(il, l, /*fused_beta_alpha=*/true);
    load_moe_ffn(il, l);
    load_shared_expert(il, l);
  }

  void layer(ForwardContext& ctx, int32_t il, float* x) const override {
    hybrid_layer(ctx, il, x, /*grouped_heads=*/true);
  }
};

}  // namespace

std::unique_ptr<Model> make_qwen3next(const gguf::Model& file, Hparams hp) {
  return std::make_unique<Qwen3Next>(file, std::move(hp));
}

}  // namespace pico::model
