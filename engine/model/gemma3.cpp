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
    float* xn = ctx.floats(n * e);
    ctx.be.rms_norm(x, lw.attn_norm.data, e, n, hp_.norm_eps, xn);
    const Qkv qkv = project_qkv(ctx, lw, xn);
    // Per-head norms and rope, then Q scaled before the product (as llama.cpp does).
    const bool swa = hp_.is_swa(il);
    const int64_t dk = hp_.head_dim_k;
    ctx.be.rms_norm(qkv.q, lw.q_norm.data, dk, n * hp_.n_head, hp_.norm_eps, qkv.q);
    ctx.be.rms_norm(qkv.k, lw.k_norm.data, dk, n * hp_.n_head_kv, hp_.norm_eps, qkv.k);
    const backend::RopeParams rope = swa ? rope_params(hp_.rope_freq_base_swa, hp_.rope_freq_scale_swa)
                                         : rope_params(hp_.rope_freq_base, hp_.rope_freq_scale);
    ctx.be.rope(qkv.q, n, hp_.n_head * dk, hp_.n_head, dk, ctx.pos.data(), rope);
    ctx.be.rope(qkv.k, n, hp_.n_head_kv * dk, hp_.n_head_kv, dk, ctx.pos.data(), rope);
    ctx.be.scale(qkv.q, n * hp_.n_head * dk, hp_.attn_scale);
    AttentionSpec spec;  // norms and rope done above
    spec.window = swa ? hp_.n_swa : 0;
    spec.scale = 1.0f;
    float* attn = ctx.floats(n * hp_.n_head * hp_.head_dim_v);
    attention(ctx, il, qkv, spec, attn);
    ctx.be.matmul(lw.wo, attn, n, xn);
    ctx.be.rms_norm(xn, lw.attn_post_norm.data, e, n, hp_.norm_eps, xn);
    residual(ctx, x, xn);
    ctx.be.rms_norm(x, lw.ffn_norm.data, e, n, hp_.norm_eps, xn);
    float* ffn = ctx.floats(n * e);
    gated_ffn(ctx, lw, xn, true, ffn);
    ctx.be.rms_norm(ffn, lw.ffn_post_norm.data, e, n, hp_.norm_eps, ffn);
    residual(ctx, x, ffn);
  }
};

}  // namespace

std::unique_ptr<Model> make_gemma3(const gguf::Model& file, Hparams hp) {
  return std::make_unique<Gemma3>(file, std::move(hp));
}

}  // namespace pico::model
