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
    const int64_t e = hp_.n_embd, nq = hp_.n_head * hp_.head_dim_k;
    const int64_t nk = hp_.n_head_kv * hp_.head_dim_k, nv = hp_.n_head_kv * hp_.head_dim_v;
    l.attn_norm = vec(blk(il, "attn_norm.weight"), e);
    l.wq = matrix(blk(il, "attn_q.weight"), e, nq);
    l.wk = matrix(blk(il, "attn_k.weight"), e, nk);
    l.wv = matrix(blk(il, "attn_v.weight"), e, nv);
    l.bq = vec(blk(il, "attn_q.bias"), nq, false);  // some llama fine-tunes carry biases
    l.bk = vec(blk(il, "attn_k.bias"), nk, false);
    l.bv = vec(blk(il, "attn_v.bias"), nv, false);
    l.wo = matrix(blk(il, "attn_output.weight"), hp_.n_head * hp_.head_dim_v, e);
    l.ffn_norm = vec(blk(il, "ffn_norm.weight"), e);
    l.ffn_gate = matrix(blk(il, "ffn_gate.weight"), e, hp_.n_ff);
    l.ffn_up = matrix(blk(il, "ffn_up.weight"), e, hp_.n_ff);
    l.ffn_down = matrix(blk(il, "ffn_down.weight"), hp_.n_ff, e);
  }

  void layer(ForwardContext& ctx, int32_t il, float* x) const override {
    const LayerWeights& lw = w_.layers[static_cast<size_t>(il)];
    const int64_t n = ctx.n_tokens(), e = hp_.n_embd;
    std::vector<float> xn(static_cast<size_t>(n * e)), q, k, v;
    ctx.be.rms_norm(x, lw.attn_norm.data, e, n, hp_.norm_eps, xn.data());
    project_qkv(ctx, lw, xn.data(), q, k, v);
    AttentionSpec spec;
    spec.rope = rope_params(hp_.rope_freq_base, hp_.rope_freq_scale);
    std::vector<float> attn(static_cast<size_t>(n * hp_.n_head * hp_.head_dim_v));
    attention(ctx, il, q, k, v, spec, attn.data());
    ctx.be.matmul(lw.wo, attn.data(), n, xn.data());
    residual(ctx, x, xn.data());
    ctx.be.rms_norm(x, lw.ffn_norm.data, e, n, hp_.norm_eps, xn.data());
    std::vector<float> ffn(static_cast<size_t>(n * e));
    gated_ffn(ctx, lw, xn.data(), false, ffn.data());
    residual(ctx, x, ffn.data());
  }
};

}  // namespace

std::unique_ptr<Model> make_llama(const gguf::Model& file, Hparams hp) {
  return std::make_unique<Llama>(file, std::move(hp));
}

}  // namespace pico::model
