// The blocks of the Qwen3.5 / Qwen3-Next hybrids (qwen35.cpp, qwen3next.cpp): gated
// full attention, the Gated DeltaNet linear-attention layer with its recurrent state,
// and the layer around them. Math and float order as llama.cpp's qwen35 / qwen3next
// graphs (src/models/qwen35.cpp, delta-net-base.cpp) on its CPU backend.
#include <algorithm>
#include <cstring>
#include <map>
#include <stdexcept>

#include "model/model.hpp"

namespace pico::model {

Vec Model::own(std::vector<float> values) {
  std::vector<float>& kept = owned_.emplace_back(std::move(values));
  return Vec{kept.data(), static_cast<int64_t>(kept.size())};
}

Weight Model::row_matrix(const std::string& name, int64_t n) const {
  const gguf::TensorInfo* t = file_.find_tensor(name);
  if (!t) throw std::invalid_argument("model lacks tensor " + name);
  if (static_cast<int64_t>(t->elements) != n || t->shape.empty() || static_cast<int64_t>(t->shape[0]) != n) {
    throw std::invalid_argument("tensor " + name + " has shape other than {" + std::to_string(n) + "}");
  }
  return Weight{t->type, file_.tensor_data(*t).data(), n, 1};
}

void Model::load_hybrid_mixer(int32_t il, LayerWeights& l, bool fused_beta_alpha) {
  const int64_t e = hp_.n_embd;
  l.attn_norm = vec(blk(il, "attn_norm.weight"), e);
  l.ffn_norm = vec(blk(il, "post_attention_norm.weight"), e);  // the norm before the FFN
  if (!hp_.is_recurrent(il)) {
    const int64_t hd = hp_.head_dim_k;
    l.wq = matrix(blk(il, "attn_q.weight"), e, 2 * hp_.n_head * hd);  // query and gate per head
    l.wk = matrix(blk(il, "attn_k.weight"), e, hp_.n_head_kv * hd);
    l.wv = matrix(blk(il, "attn_v.weight"), e, hp_.n_head_kv * hd);
    l.wo = matrix(blk(il, "attn_output.weight"), hp_.n_head * hd, e);
    load_qk_norms(il, l);
    return;
  }
  const int64_t d = hp_.ssm_d_state, hv = hp_.ssm_n_v_heads, channels = hp_.ssm_conv_channels();
  const int64_t taps = hp_.ssm_conv_kernel;
  l.ssm_qkv = matrix(blk(il, "attn_qkv.weight"), e, channels);
  l.ssm_z = matrix(blk(il, "attn_gate.weight"), e, hv * d);
  if (fused_beta_alpha) {
    l.ssm_ba = matrix(blk(il, "ssm_ba.weight"), e, 2 * hv);
  } else {
    l.ssm_beta = matrix(blk(il, "ssm_beta.weight"), e, hv);
    l.ssm_alpha = matrix(blk(il, "ssm_alpha.weight"), e, hv);
  }
  // {taps, channels} in the file (each channel's taps together); the kernel reads a tap
  // of every channel at once.
  const Vec conv = vec(blk(il, "ssm_conv1d.weight"), taps * channels);
  std::vector<float> tap_major(static_cast<size_t>(taps * channels));
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t i = 0; i < taps; ++i) tap_major[static_cast<size_t>(i * channels + c)] = conv.data[c * taps + i];
  }
  l.ssm_conv = own(std::move(tap_major));
  l.ssm_dt_bias = vec(blk(il, "ssm_dt.bias"), hv);
  l.ssm_a = vec(blk(il, "ssm_a"), hv);
  l.ssm_norm = vec(blk(il, "ssm_norm.weight"), d);
  l.ssm_out = matrix(blk(il, "ssm_out.weight"), hv * d, e);
}

void Model::load_shared_expert(int32_t il, LayerWeights& l) {
  const int64_t e = hp_.n_embd, ff = hp_.n_ff_shexp;
  l.ffn_gate_inp_shexp = row_matrix(blk(il, "ffn_gate_inp_shexp.weight"), e);
  l.ffn_gate_shexp = matrix(blk(il, "ffn_gate_shexp.weight"), e, ff);
  l.ffn_up_shexp = matrix(blk(il, "ffn_up_shexp.weight"), e, ff);
  l.ffn_down_shexp = matrix(blk(il, "ffn_down_shexp.weight"), ff, e);
}

void Model::gated_attention(ForwardContext& ctx, int32_t il, const float* xn, float* out) const {
  const LayerWeights& lw = w_.layers[static_cast<size_t>(il)];
  const int64_t n = ctx.n_tokens(), hd = hp_.head_dim_k, nq = hp_.n_head * hd, nkv = hp_.n_head_kv * hd;
  float* qg = ctx.floats(n * 2 * nq);
  const Qkv qkv{ctx.floats(n * nq), ctx.floats(n * nkv), ctx.floats(n * nkv)};
  const Weight ws[3] = {lw.wq, lw.wk, lw.wv};
  float* const ys[3] = {qg, qkv.k, qkv.v};
  ctx.be.matmul_many(ws, xn, n, ys);
  // Head h of a row: its query at 2h * hd, its output gate right after it.
  float* gate = ctx.floats(n * nq);
  ctx.be.copy_rows(qg, 2 * hd, n * hp_.n_head, hd, qkv.q, hd);
  ctx.be.copy_rows(qg + hd, 2 * hd, n * hp_.n_head, hd, gate, hd);
  AttentionSpec spec = qk_normed_attention(lw);  // rope over the first n_rot dims of each head
  float* attn = ctx.floats(n * nq);
  attention(ctx, il, qkv, spec, attn);
  ctx.be.sigmoid(gate, n * nq, gate);
  ctx.be.mul(attn, gate, nq, n, n, attn);
  ctx.be.matmul(lw.wo, attn, n, out);
}

void Model::gated_delta_net(ForwardContext& ctx, int32_t il, const float* xn, bool grouped_heads, float* out) const {
  const LayerWeights& lw = w_.layers[static_cast<size_t>(il)];
  backend::Backend& be = ctx.be;
  const int64_t n = ctx.n_tokens(), e = hp_.n_embd;
  const int64_t d = hp_.ssm_d_state, hk = hp_.ssm_n_k_heads, hv = hp_.ssm_n_v_heads;
  const int64_t channels = hp_.ssm_conv_channels(), key_dim = hk * d, value_dim = hv * d;

  // The recurrence runs each sequence's tokens in order: work in an order that groups
  // the batch by sequence (a stable sort; the identity for a batch already grouped).
  std::vector<int32_t> order(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) order[static_cast<size_t>(t)] = static_cast<int32_t>(t);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return ctx.batch[static_cast<size_t>(a)].seq_id < ctx.batch[static_cast<size_t>(b)].seq_id;
  });
  bool grouped = true;
  for (int64_t t = 0; t < n && grouped; ++t) grouped = order[static_cast<size_t>(t)] == t;
  const float* input = xn;
  if (!grouped) {
    float* sorted = ctx.floats(n * e);
    be.gather_rows(xn, e, order.data(), n, sorted);
    input = sorted;
  }
  std::vector<backend::RecurrentSequence> sequences;
  for (int64_t t = 0; t < n; ++t) {
    const int32_t seq_id = ctx.batch[static_cast<size_t>(order[static_cast<size_t>(t)])].seq_id;
    if (sequences.empty() || ctx.batch[static_cast<size_t>(order[static_cast<size_t>(t - 1)])].seq_id != seq_id) {
      state::RecurrentState& rs = ctx.cache.recurrent(seq_id);
      sequences.push_back({t, 0, rs.conv(il), rs.ssm(il), &rs.store()});
    }
    ++sequences.back().rows;
  }

  // Projections: the conv's input, the output gate z, and per value head beta and the
  // decay's input.
  float* mixed = ctx.floats(n * channels);
  float* z = ctx.floats(n * value_dim);
  float* beta = ctx.floats(n * hv);
  float* alpha = ctx.floats(n * hv);
  if (lw.ssm_ba) {
    // qwen3next: per key head group g, r = H_v / H_k betas then r alphas; value head
    // g * r + j takes the j-th of each.
    float* ba = ctx.floats(n * 2 * hv);
    const Weight ws[3] = {lw.ssm_qkv, lw.ssm_z, lw.ssm_ba};
    float* const ys[3] = {mixed, z, ba};
    be.matmul_many(ws, input, n, ys);
    const int64_t r = hv / hk;
    be.copy_rows(ba, 2 * r, n * hk, r, beta, r);
    be.copy_rows(ba + r, 2 * r, n * hk, r, alpha, r);
  } else {
    const Weight ws[4] = {lw.ssm_qkv, lw.ssm_z, lw.ssm_beta, lw.ssm_alpha};
    float* const ys[4] = {mixed, z, beta, alpha};
    be.matmul_many(ws, input, n, ys);
  }
  be.sigmoid(beta, n * hv, beta);
  // g = softplus(alpha + dt_bias) * A: the log of the state's decay, <= 0.
  be.add(alpha, lw.ssm_dt_bias.data, hv, n, 1, alpha);
  be.softplus(alpha, n * hv, alpha);
  be.mul(alpha, lw.ssm_a.data, hv, n, 1, alpha);

  float* conv = ctx.floats(n * channels);
  be.ssm_conv(mixed, channels, lw.ssm_conv.data, hp_.ssm_conv_kernel, sequences, conv);
  be.silu(conv, channels, n, conv);
  // Q and K heads lie together at the start of each row: L2-normalise them in one go.
  for (int64_t t = 0; t < n; ++t) be.l2_norm(conv + t * channels, d, 2 * hk, hp_.norm_eps, conv + t * channels);

  float* core = ctx.floats(n * value_dim);
  backend::DeltaRuleParams params{hk, hv, d, grouped_heads};
  be.delta_rule(conv, conv + key_dim, conv + 2 * key_dim, channels, alpha, beta, sequences, params, core);

  // Gated RMSNorm per value head: rms_norm(o; ssm_norm) * SiLU(z).
  be.rms_norm(core, lw.ssm_norm.data, d, n * hv, hp_.norm_eps, core);
  be.silu(z, value_dim, n, z);
  be.mul(core, z, value_dim, n, n, core);
  if (grouped) {
    be.matmul(lw.ssm_out, core, n, out);
    return;
  }
  // Back to the batch's order: out row order[t] = projected row t.
  float* projected = ctx.floats(n * e);
  be.matmul(lw.ssm_out, core, n, projected);
  std::vector<int32_t> position_in_order(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) position_in_order[static_cast<size_t>(order[static_cast<size_t>(t)])] = static_cast<int32_t>(t);
  be.gather_rows(projected, e, position_in_order.data(), n, out);
}

void Model::hybrid_layer(ForwardContext& ctx, int32_t il, float* x, bool grouped_heads) const {
  const LayerWeights& lw = w_.layers[static_cast<size_t>(il)];
  const int64_t n = ctx.n_tokens(), e = hp_.n_embd;
  float* xn = ctx.floats(n * e);
  float* mixer = ctx.floats(n * e);
  ctx.be.rms_norm(x, lw.attn_norm.data, e, n, hp_.norm_eps, xn);
  if (hp_.is_recurrent(il)) {
    gated_delta_net(ctx, il, xn, grouped_heads, mixer);
  } else {
    gated_attention(ctx, il, xn, mixer);
  }
  residual(ctx, x, mixer);
  ctx.be.rms_norm(x, lw.ffn_norm.data, e, n, hp_.norm_eps, xn);
  if (lw.ffn_gate_inp) {
    moe_ffn(ctx, lw, xn, mixer);
    if (lw.ffn_gate_inp_shexp) add_shared_expert(ctx, lw, xn, mixer);
  } else {
    gated_ffn(ctx, lw, xn, false, mixer);
  }
  residual(ctx, x, mixer);
}

void Model::add_shared_expert(ForwardContext& ctx, const LayerWeights& lw, const float* xn, float* out) const {
  const int64_t n = ctx.n_tokens(), e = hp_.n_embd;
  float* shared = ctx.floats(n * e);
  float* gate = ctx.floats(n);
  swiglu(ctx, lw.ffn_gate_shexp, lw.ffn_up_shexp, lw.ffn_down_shexp, hp_.n_ff_shexp, xn, false, shared);
  ctx.be.matmul(lw.ffn_gate_inp_shexp, xn, n, gate);
  ctx.be.sigmoid(gate, n, gate);
  ctx.be.scale_rows(shared, e, n, gate);
  ctx.be.add(out, shared, e, n, n, out);
}

}  // namespace pico::model
