// gemma3: embedding scaled by sqrt(n_embd), RMSNorm before and after attention and
// feed-forward, per-head Q/K RMSNorm, Q pre-scaled, RoPE in NEOX mode with a local
// base (10000) on sliding-window layers, GELU-gated feed-forward. The GGUF norm
// weights already include gemma's +1.
#include <cmath>

#include "model/model.hpp"

namespace pico::model {
namespace {

class Gemma3 final : public Model {
 public:
  Gemma3(const gguf::Model& file, Hparams hp) : Model(file, std::move(hp)) {}

 protected:
  void load_layer(int32_t il, LayerWeights& l) override {
    const int64_t e = hp_.n_embd;
    load_attention(il, l);
    load_qk_norms(il, l);
    l.attn_post_norm = vec(blk(il, "post_attention_norm.weight"), e);
    load_gated_ffn(il, l);
    l.ffn_post_norm = vec(blk(il, "post_ffw_norm.weight"), e);
  }

  void embed(ForwardContext& ctx, float* x) const override {
    Model::embed(ctx, x);
    ctx.be.scale(x, ctx.n_tokens() * hp_.n_embd, std::sqrt(static_cast<float>(hp_.n_embd)));
  }

  void layer(ForwardContext& ctx, int32_t il, float* x) const override {
    const LayerWeights& lw = w_.layers[static_cast<size_t>(il)];
    const int64_t n = ctx.n_tokens(), e = hp_.n_embd;
    std::vector<float> xn(static_cast<size_t>(n * e)), q, k, v;
    ctx.be.rms_norm(x, lw.attn_norm.data, e, n, hp_.norm_eps, xn.data());
    project_qkv(ctx, lw, xn.data(), q, k, v);
    // Per-head norms and rope, then Q scaled before the product (as llama.cpp does).
    const bool swa = hp_.is_swa(il);
    const int64_t dk = hp_.head_dim_k;
    for (int64_t t = 0; t < n; ++t) {
      ctx.be.rms_norm(q.data() + t * hp_.n_head * dk, lw.q_norm.data, dk, hp_.n_head, hp_.norm_eps,
                      q.data() + t * hp_.n_head * dk);
      ctx.be.rms_norm(k.data() + t * hp_.n_head_kv * dk, lw.k_norm.data, dk, hp_.n_head_kv, hp_.norm_eps,
                      k.data() + t * hp_.n_head_kv * dk);
    }
    const backend::RopeParams rope = swa ? rope_params(hp_.rope_freq_base_swa, hp_.rope_freq_scale_swa)
                                         : rope_params(hp_.rope_freq_base, hp_.rope_freq_scale);
    ctx.be.rope(q.data(), n, hp_.n_head * dk, hp_.n_head, dk, ctx.pos.data(), rope);
    ctx.be.rope(k.data(), n, hp_.n_head_kv * dk, hp_.n_head_kv, dk, ctx.pos.data(), rope);
    ctx.be.scale(q.data(), static_cast<int64_t>(q.size()), hp_.attn_scale);
    AttentionSpec spec;  // norms and rope done above
    spec.window = swa ? hp_.n_swa : 0;
    spec.scale = 1.0f;
    std::vector<float> attn(static_cast<size_t>(n * hp_.n_head * hp_.head_dim_v));
    attention(ctx, il, q, k, v, spec, attn.data());
    ctx.be.matmul(lw.wo, attn.data(), n, xn.data());
    ctx.be.rms_norm(xn.data(), lw.attn_post_norm.data, e, n, hp_.norm_eps, xn.data());
    residual(ctx, x, xn.data());
    ctx.be.rms_norm(x, lw.ffn_norm.data, e, n, hp_.norm_eps, xn.data());
    std::vector<float> ffn(static_cast<size_t>(n * e));
    gated_ffn(ctx, lw, xn.data(), true, ffn.data());
    ctx.be.rms_norm(ffn.data(), lw.ffn_post_norm.data, e, n, hp_.norm_eps, ffn.data());
    residual(ctx, x, ffn.data());
  }
};

}  // namespace

std::unique_ptr<Model> make_gemma3(const gguf::Model& file, Hparams hp) {
  return std::make_unique<Gemma3>(file, std::move(hp));
}

}  // namespace pico::model
