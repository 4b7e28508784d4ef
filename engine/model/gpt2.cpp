// gpt2: learned position embeddings, LayerNorm with bias, fused QKV projection with
// bias, output projection with bias, GELU feed-forward (up, GELU, down, with biases).
#include "model/model.hpp"

namespace pico::model {
namespace {

class Gpt2 final : public Model {
 public:
  Gpt2(const gguf::Model& file, Hparams hp) : Model(file, std::move(hp)) {}

 protected:
  void load_layer(int32_t il, LayerWeights& l) override {
    if (il == 0) w_.pos_embd = matrix("position_embd.weight", hp_.n_embd, hp_.n_ctx_train);
    const int64_t e = hp_.n_embd, nq = hp_.n_head * hp_.head_dim_k;
    const int64_t nqkv = nq + hp_.n_head_kv * (hp_.head_dim_k + hp_.head_dim_v);
    l.attn_norm = vec(blk(il, "attn_norm.weight"), e);
    l.attn_norm_b = vec(blk(il, "attn_norm.bias"), e);
    l.wqkv = matrix(blk(il, "attn_qkv.weight"), e, nqkv);
    l.bqkv = vec(blk(il, "attn_qkv.bias"), nqkv);
    l.wo = matrix(blk(il, "attn_output.weight"), hp_.n_head * hp_.head_dim_v, e);
    l.bo = vec(blk(il, "attn_output.bias"), e);
    l.ffn_norm = vec(blk(il, "ffn_norm.weight"), e);
    l.ffn_norm_b = vec(blk(il, "ffn_norm.bias"), e);
    l.ffn_up = matrix(blk(il, "ffn_up.weight"), e, hp_.n_ff);
    l.ffn_up_b = vec(blk(il, "ffn_up.bias"), hp_.n_ff);
    l.ffn_down = matrix(blk(il, "ffn_down.weight"), hp_.n_ff, e);
    l.ffn_down_b = vec(blk(il, "ffn_down.bias"), e);
  }

  void embed(ForwardContext& ctx, float* x) const override {
    Model::embed(ctx, x);
    const int64_t n = ctx.n_tokens();
    float* pos = ctx.floats(n * hp_.n_embd);
    ctx.be.get_rows(w_.pos_embd, ctx.pos.data(), n, pos);
    ctx.be.add(x, pos, hp_.n_embd, n, n, x);
  }

  void output_norm(ForwardContext& ctx, float* x) const override {
    ctx.be.layer_norm(x, w_.output_norm.data, w_.output_norm_b.data, hp_.n_embd, ctx.n_tokens(), hp_.norm_eps, x);
  }

  void layer(ForwardContext& ctx, int32_t il, float* x) const override {
    const LayerWeights& lw = w_.layers[static_cast<size_t>(il)];
    const int64_t n = ctx.n_tokens(), e = hp_.n_embd;
    float* xn = ctx.floats(n * e);
    ctx.be.layer_norm(x, lw.attn_norm.data, lw.attn_norm_b.data, e, n, hp_.norm_eps, xn);
    const Qkv qkv = project_qkv(ctx, lw, xn);
    AttentionSpec spec;  // no rope
    float* attn = ctx.floats(n * hp_.n_head * hp_.head_dim_v);
    attention(ctx, il, qkv, spec, attn);
    ctx.be.matmul(lw.wo, attn, n, xn);
    ctx.be.add(xn, lw.bo.data, e, n, 1, xn);
    residual(ctx, x, xn);
    ctx.be.layer_norm(x, lw.ffn_norm.data, lw.ffn_norm_b.data, e, n, hp_.norm_eps, xn);
    float* up = ctx.floats(n * hp_.n_ff);
    ctx.be.matmul(lw.ffn_up, xn, n, up);
    ctx.be.add(up, lw.ffn_up_b.data, hp_.n_ff, n, 1, up);
    ctx.be.gelu(up, n * hp_.n_ff, up);
    ctx.be.matmul(lw.ffn_down, up, n, xn);
    ctx.be.add(xn, lw.ffn_down_b.data, e, n, 1, xn);
    residual(ctx, x, xn);
  }
};

}  // namespace

std::unique_ptr<Model> make_gpt2(const gguf::Model& file, Hparams hp) {
  return std::make_unique<Gpt2>(file, std::move(hp));
}

}  // namespace pico::model
