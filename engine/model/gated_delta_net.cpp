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
  std::vector<float> qg(static_cast<size_t>(n * 2 * nq)), k(static_cast<size_t>(n * nkv)), v(k.size());
  const Weight ws[3] = {lw.wq, lw.wk, lw.wv};
  float* const ys[3] = {qg.data(), k.data(), v.data()};
  ctx.be.matmul_many(ws, xn, n, ys);
  // Head h of a row: its query at 2h * hd, its output gate right after it.
  std::vector<float> q(static_cast<size_t>(n * nq)), gate(q.size());
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < hp_.n_head; ++h) {
      const float* src = qg.data() + t * 2 * nq + 2 * h * hd;
      std::memcpy(q.data() + t * nq + h * hd, src, static_cast<size_t>(hd) * sizeof(float));
      std::memcpy(gate.data() + t * nq + h * hd, src + hd, static_cast<size_t>(hd) * sizeof(float));
    }
  }
  AttentionSpec spec = qk_normed_attention(lw);  // rope over the first n_rot dims of each head
  std::vector<float> attn(static_cast<size_t>(n * nq));
  attention(ctx, il, q, k, v, spec, attn.data());
  ctx.be.sigmoid(gate.data(), n * nq, gate.data());
  ctx.be.mul(attn.data(), gate.data(), nq, n, n, attn.data());
  ctx.be.matmul(lw.wo, attn.data(), n, out);
}

void Model::gated_delta_net(ForwardContext& ctx, int32_t il, const float* xn, bool grouped_heads, float* out) const {
  const LayerWeights& lw = w_.layers[static_cast<size_t>(il)];
  backend::Backend& be = ctx.be;
  const int64_t n = ctx.n_tokens(), e = hp_.n_embd;
  const int64_t d = hp_.ssm_d_state, hk = hp_.ssm_n_k_heads, hv = hp_.ssm_n_v_heads;
  const int64_t channels = hp_.ssm_conv_channels(), key_dim = hk * d, value_dim = hv * d;

  // The recurrence runs each sequence's tokens in order: work in an order that groups
  // the batch by sequence (a stable sort; the identity for a batch already grouped).
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) order[static_cast<size_t>(t)] = t;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return ctx.batch[static_cast<size_t>(a)].seq_id < ctx.batch[static_cast<size_t>(b)].seq_id;
  });
  bool grouped = true;
  for (int64_t t = 0; t < n && grouped; ++t) grouped = order[static_cast<size_t>(t)] == t;
  std::vector<float> sorted;
  const float* input = xn;
  if (!grouped) {
    sorted.resize(static_cast<size_t>(n * e));
    for (int64_t t = 0; t < n; ++t) {
      std::memcpy(sorted.data() + t * e, xn + order[static_cast<size_t>(t)] * e, static_cast<size_t>(e) * sizeof(float));
    }
    input = sorted.data();
  }
  std::vector<backend::RecurrentSequence> sequences;
  for (int64_t t = 0; t < n; ++t) {
    const int32_t seq_id = ctx.batch[static_cast<size_t>(order[static_cast<size_t>(t)])].seq_id;
    if (sequences.empty() || ctx.batch[static_cast<size_t>(order[static_cast<size_t>(t - 1)])].seq_id != seq_id) {
      state::RecurrentState& rs = ctx.cache.recurrent(seq_id);
      sequences.push_back({t, 0, rs.conv(il), rs.ssm(il)});
    }
    ++sequences.back().rows;
  }

  // Projections: the conv's input, the output gate z, and per value head beta and the
  // decay's input.
  std::vector<float> mixed(static_cast<size_t>(n * channels)), z(static_cast<size_t>(n * value_dim));
  std::vector<float> beta(static_cast<size_t>(n * hv)), alpha(beta.size());
  if (lw.ssm_ba) {
    // qwen3next: per key head group g, r = H_v / H_k betas then r alphas; value head
    // g * r + j takes the j-th of each.
    std::vector<float> ba(static_cast<size_t>(n * 2 * hv));
    const Weight ws[3] = {lw.ssm_qkv, lw.ssm_z, lw.ssm_ba};
    float* const ys[3] = {mixed.data(), z.data(), ba.data()};
    be.matmul_many(ws, input, n, ys);
    const int64_t r = hv / hk;
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t g = 0; g < hk; ++g) {
        for (int64_t j = 0; j < r; ++j) {
          beta[static_cast<size_t>(t * hv + g * r + j)] = ba[static_cast<size_t>(t * 2 * hv + g * 2 * r + j)];
          alpha[static_cast<size_t>(t * hv + g * r + j)] = ba[static_cast<size_t>(t * 2 * hv + g * 2 * r + r + j)];
        }
      }
    }
  } else {
    const Weight ws[4] = {lw.ssm_qkv, lw.ssm_z, lw.ssm_beta, lw.ssm_alpha};
    float* const ys[4] = {mixed.data(), z.data(), beta.data(), alpha.data()};
    be.matmul_many(ws, input, n, ys);
  }
  be.sigmoid(beta.data(), n * hv, beta.data());
  // g = softplus(alpha + dt_bias) * A: the log of the state's decay, <= 0.
  be.add(alpha.data(), lw.ssm_dt_bias.data, hv, n, 1, alpha.data());
  be.softplus(alpha.data(), n * hv, alpha.data());
  be.mul(alpha.data(), lw.ssm_a.data, hv, n, 1, alpha.data());

  std::vector<float> conv(mixed.size());
  be.ssm_conv(mixed.data(), channels, lw.ssm_conv.data, hp_.ssm_conv_kernel, sequences, conv.data());
  be.silu(conv.data(), channels, n, conv.data());
  // Q and K heads lie together at the start of each row: L2-normalise them in one go.
  for (int64_t t = 0; t < n; ++t) be.l2_norm(conv.data() + t * channels, d, 2 * hk, hp_.norm_eps, conv.data() + t * channels);

  std::vector<float> core(static_cast<size_t>(n * value_dim));
  backend::DeltaRuleParams params{hk, hv, d, grouped_heads};
  be.delta_rule(conv.data(), conv.data() + key_dim, conv.data() + 2 * key_dim, channels, alpha.data(), beta.data(),
                sequences, params, core.data());

  // Gated RMSNorm per value head: rms_norm(o; ssm_norm) * SiLU(z).
  be.rms_norm(core.data(), lw.ssm_norm.data, d, n * hv, hp_.norm_eps, core.data());
  be.silu(z.data(), value_dim, n, z.data());
  be.mul(core.data(), z.data(), value_dim, n, n, core.data());
  if (grouped) {
    be.matmul(lw.ssm_out, core.data(), n, out);
    return;
  }
  std::vector<float> projected(static_cast<size_t>(n * e));
  be.matmul(lw.ssm_out, core.data(), n, projected.data());
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(out + order[static_cast<size_t>(t)] * e, projected.data() + t * e, static_cast<size_t>(e) * sizeof(float));
  }
}

void Model::hybrid_layer(ForwardContext& ctx, int32_t il, float* x, bool grouped_heads) const {
  const LayerWeights& lw = w_.layers[static_cast<size_t>(il)];
  const int64_t n = ctx.n_tokens(), e = hp_.n_embd;
  std::vector<float> xn(static_cast<size_t>(n * e)), mixer(static_cast<size_t>(n * e));
  ctx.be.rms_norm(x, lw.attn_norm.data, e, n, hp_.norm_eps, xn.data());
  if (hp_.is_recurrent(il)) {
    gated_delta_net(ctx, il, xn.data(), grouped_heads, mixer.data());
  } else {
    gated_attention(ctx, il, xn.data(), mixer.data());
  }
  residual(ctx, x, mixer.data());
  ctx.be.rms_norm(x, lw.ffn_norm.data, e, n, hp_.norm_eps, xn.data());
  if (lw.ffn_gate_inp) {
    moe_ffn(ctx, lw, xn.data(), mixer.data());
    if (lw.ffn_gate_inp_shexp) add_shared_expert(ctx, lw, xn.data(), mixer.data());
  } else {
    gated_ffn(ctx, lw, xn.data(), false, mixer.data());
  }
  residual(ctx, x, mixer.data());
}

void Model::add_shared_expert(ForwardContext& ctx, const LayerWeights& lw, const float* xn, float* out) const {
  const int64_t n = ctx.n_tokens(), e = hp_.n_embd;
  std::vector<float> shared(static_cast<size_t>(n * e)), gate(static_cast<size_t>(n));
  swiglu(ctx, lw.ffn_gate_shexp, lw.ffn_up_shexp, lw.ffn_down_shexp, hp_.n_ff_shexp, xn, false, shared.data());
  ctx.be.matmul(lw.ffn_gate_inp_shexp, xn, n, gate.data());
  ctx.be.sigmoid(gate.data(), n, gate.data());
  for (int64_t t = 0; t < n; ++t) ctx.be.scale(shared.data() + t * e, e, gate[static_cast<size_t>(t)]);
  ctx.be.add(out, shared.data(), e, n, n, out);
}

}  // namespace pico::model
