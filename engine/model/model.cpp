#include "model/model.hpp"

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "quant/quantize.hpp"

namespace pico::model {

Model::Model(const gguf::Model& file, Hparams hp) : file_(file), hp_(std::move(hp)) {}

std::unique_ptr<Model> Model::load(const gguf::Model& file) {
  const gguf::TensorInfo* embd = file.find_tensor("token_embd.weight");
  if (!embd || embd->shape.size() != 2) throw std::invalid_argument("model has no 2-D token_embd.weight");
  Hparams hp = read_hparams(file.metadata(), static_cast<int64_t>(embd->shape[1]));
  std::unique_ptr<Model> model;
  switch (hp.arch) {
    case Arch::llama: model = make_llama(file, std::move(hp)); break;
    case Arch::qwen2: model = make_qwen2(file, std::move(hp)); break;
    case Arch::qwen3: model = make_qwen3(file, std::move(hp)); break;
    case Arch::qwen3moe: model = make_qwen3moe(file, std::move(hp)); break;
    case Arch::qwen35:
    case Arch::qwen35moe: model = make_qwen35(file, std::move(hp)); break;
    case Arch::qwen3next: model = make_qwen3next(file, std::move(hp)); break;
    case Arch::gpt2: model = make_gpt2(file, std::move(hp)); break;
    case Arch::gemma3: model = make_gemma3(file, std::move(hp)); break;
  }
  model->load_all();
  return model;
}

void Model::load_all() {
  const int64_t n_embd = hp_.n_embd;
  w_.tok_embd = matrix("token_embd.weight", n_embd, hp_.n_vocab);
  w_.output_norm = vec("output_norm.weight", n_embd);
  w_.output_norm_b = vec("output_norm.bias", n_embd, false);
  w_.output = matrix("output.weight", n_embd, hp_.n_vocab, false);
  if (!w_.output) w_.output = w_.tok_embd;
  w_.layers.resize(static_cast<size_t>(hp_.n_layer));
  for (int32_t il = 0; il < hp_.n_layer; ++il) load_layer(il, w_.layers[static_cast<size_t>(il)]);
}

Weight Model::matrix(const std::string& name, int64_t cols, int64_t rows, bool required) const {
  const gguf::TensorInfo* t = file_.find_tensor(name);
  if (!t) {
    if (required) throw std::invalid_argument("model lacks tensor " + name);
    return {};
  }
  if (t->shape.size() != 2 || static_cast<int64_t>(t->shape[0]) != cols || static_cast<int64_t>(t->shape[1]) != rows) {
    throw std::invalid_argument("tensor " + name + " has shape other than {" + std::to_string(cols) + ", " +
                                std::to_string(rows) + "}");
  }
  return Weight{t->type, file_.tensor_data(*t).data(), cols, rows};
}

ExpertStack Model::expert_stack(const std::string& name, int64_t cols, int64_t rows, int64_t n_expert) const {
  const gguf::TensorInfo* t = file_.find_tensor(name);
  if (!t) throw std::invalid_argument("model lacks tensor " + name);
  if (t->shape.size() != 3 || static_cast<int64_t>(t->shape[0]) != cols || static_cast<int64_t>(t->shape[1]) != rows ||
      static_cast<int64_t>(t->shape[2]) != n_expert) {
    throw std::invalid_argument("tensor " + name + " has shape other than {" + std::to_string(cols) + ", " +
                                std::to_string(rows) + ", " + std::to_string(n_expert) + "}");
  }
  if (!bytes_of(type_traits(t->type), static_cast<uint64_t>(cols))) {
    throw std::invalid_argument("tensor " + name + ": rows of " + std::to_string(cols) + " values do not fill whole " +
                                std::string(type_traits(t->type).name) + " blocks");
  }
  return ExpertStack{t->type, file_.tensor_data(*t).data(), cols, rows, n_expert};
}

Vec Model::vec(const std::string& name, int64_t n, bool required) {
  const gguf::TensorInfo* t = file_.find_tensor(name);
  if (!t) {
    if (required) throw std::invalid_argument("model lacks tensor " + name);
    return {};
  }
  if (static_cast<int64_t>(t->elements) != n) {
    throw std::invalid_argument("tensor " + name + " has " + std::to_string(t->elements) + " values, not " +
                                std::to_string(n));
  }
  const auto data = file_.tensor_data(*t);
  if (t->type == GgmlType::F32 && reinterpret_cast<uintptr_t>(data.data()) % alignof(float) == 0) {
    return Vec{reinterpret_cast<const float*>(data.data()), n};
  }
  std::vector<float>& copy = owned_.emplace_back(static_cast<size_t>(n));
  dequantize_row(t->type, data.data(), copy.data(), n);
  return Vec{copy.data(), n};
}

state::KvConfig Model::kv_config(LayerRange range, GgmlType k_type, GgmlType v_type) const {
  state::KvConfig c;
  c.first_layer = range.first;
  c.last_layer = range.last;
  c.n_kv_heads = hp_.n_head_kv;
  c.head_dim_k = hp_.head_dim_k;
  c.head_dim_v = hp_.head_dim_v;
  c.k_type = k_type;
  c.v_type = v_type;
  if (hp_.is_hybrid()) {
    for (int32_t il = range.first; il < range.last; ++il) c.attention.push_back(!hp_.is_recurrent(il));
  }
  return c;
}

std::optional<state::RecurrentConfig> Model::recurrent_config(LayerRange range) const {
  state::RecurrentConfig c;
  c.first_layer = range.first;
  c.last_layer = range.last;
  for (int32_t il = range.first; il < range.last; ++il) c.recurrent.push_back(hp_.is_recurrent(il));
  if (c.layers() == 0) return std::nullopt;
  c.conv_taps = hp_.ssm_conv_kernel;
  c.conv_channels = hp_.ssm_conv_channels();
  c.n_v_heads = hp_.ssm_n_v_heads;
  c.head_dim = hp_.ssm_d_state;
  return c;
}

void Model::embed(ForwardContext& ctx, float* x) const {
  std::vector<int32_t> ids(ctx.batch.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = ctx.batch[i].token;
  ctx.be.get_rows(w_.tok_embd, ids.data(), ctx.n_tokens(), x);
}

void Model::output_norm(ForwardContext& ctx, float* x) const {
  ctx.be.rms_norm(x, w_.output_norm.data, hp_.n_embd, ctx.n_tokens(), hp_.norm_eps, x);
}

backend::RopeParams Model::rope_params(float freq_base, float freq_scale) const {
  backend::RopeParams p;
  p.n_dims = hp_.n_rot;
  p.neox = hp_.rope_neox;
  p.freq_base = freq_base;
  p.freq_scale = freq_scale;
  p.ext_factor = hp_.yarn_ext_factor;
  p.attn_factor = hp_.yarn_attn_factor;
  p.beta_fast = hp_.yarn_beta_fast;
  p.beta_slow = hp_.yarn_beta_slow;
  p.n_ctx_orig = hp_.rope_n_ctx_orig;
  return p;
}

void Model::attention(ForwardContext& ctx, int32_t il, float* q, float* k, float* v, int64_t stride_q,
                      int64_t stride_kv, int64_t stride_v, const AttentionSpec& spec, float* out) const {
  backend::Backend& be = ctx.be;
  const int64_t n = ctx.n_tokens();
  const int64_t dk = hp_.head_dim_k, dv = hp_.head_dim_v;
  for (int64_t t = 0; t < n; ++t) {
    if (spec.q_norm) be.rms_norm(q + t * stride_q, spec.q_norm, dk, hp_.n_head, hp_.norm_eps, q + t * stride_q);
    if (spec.k_norm) be.rms_norm(k + t * stride_kv, spec.k_norm, dk, hp_.n_head_kv, hp_.norm_eps, k + t * stride_kv);
  }
  if (spec.rope.n_dims > 0) {
    be.rope(q, n, stride_q, hp_.n_head, dk, ctx.pos.data(), spec.rope);
    be.rope(k, n, stride_kv, hp_.n_head_kv, dk, ctx.pos.data(), spec.rope);
  }
  // Store every token's K and V first (a later token of the same sequence in this
  // batch sees the earlier ones), then take the views.
  for (int64_t t = 0; t < n; ++t) {
    const BatchToken& bt = ctx.batch[static_cast<size_t>(t)];
    ctx.cache.sequence(bt.seq_id).write(il, bt.pos, k + t * stride_kv, v + t * stride_v);
  }
  std::vector<backend::AttentionQuery> queries(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    const BatchToken& bt = ctx.batch[static_cast<size_t>(t)];
    queries[static_cast<size_t>(t)] = {bt.pos, ctx.cache.sequence(bt.seq_id).layer(il)};
  }
  backend::AttentionParams p;
  p.n_head = hp_.n_head;
  p.n_head_kv = hp_.n_head_kv;
  p.head_dim_k = dk;
  p.head_dim_v = dv;
  p.scale = spec.scale != 0.0f ? spec.scale : hp_.attn_scale;
  p.window = spec.window;
  be.attention(q, stride_q, queries, p, out);
}

void Model::project_qkv(ForwardContext& ctx, const LayerWeights& lw, const float* xn, std::vector<float>& q,
                        std::vector<float>& k, std::vector<float>& v) const {
  const int64_t n = ctx.n_tokens();
  const int64_t nq = hp_.n_head * hp_.head_dim_k, nk = hp_.n_head_kv * hp_.head_dim_k, nv = hp_.n_head_kv * hp_.head_dim_v;
  q.resize(static_cast<size_t>(n * nq));
  k.resize(static_cast<size_t>(n * nk));
  v.resize(static_cast<size_t>(n * nv));
  if (lw.wqkv) {
    std::vector<float> fused(static_cast<size_t>(n * (nq + nk + nv)));
    ctx.be.matmul(lw.wqkv, xn, n, fused.data());
    if (lw.bqkv) ctx.be.add(fused.data(), lw.bqkv.data, nq + nk + nv, n, 1, fused.data());
    for (int64_t t = 0; t < n; ++t) {
      const float* row = fused.data() + t * (nq + nk + nv);
      std::memcpy(q.data() + t * nq, row, static_cast<size_t>(nq) * 4);
      std::memcpy(k.data() + t * nk, row + nq, static_cast<size_t>(nk) * 4);
      std::memcpy(v.data() + t * nv, row + nq + nk, static_cast<size_t>(nv) * 4);
    }
    return;
  }
  const Weight ws[3] = {lw.wq, lw.wk, lw.wv};
  float* const ys[3] = {q.data(), k.data(), v.data()};
  ctx.be.matmul_many(ws, xn, n, ys);
  if (lw.bq) ctx.be.add(q.data(), lw.bq.data, nq, n, 1, q.data());
  if (lw.bk) ctx.be.add(k.data(), lw.bk.data, nk, n, 1, k.data());
  if (lw.bv) ctx.be.add(v.data(), lw.bv.data, nv, n, 1, v.data());
}

void Model::gated_ffn(ForwardContext& ctx, const LayerWeights& lw, const float* xn, bool gelu, float* out) const {
  swiglu(ctx, lw.ffn_gate, lw.ffn_up, lw.ffn_down, hp_.n_ff, xn, gelu, out);
}

void Model::swiglu(ForwardContext& ctx, const Weight& gate_w, const Weight& up_w, const Weight& down_w, int64_t ff,
                   const float* xn, bool gelu, float* out) const {
  const int64_t n = ctx.n_tokens();
  // Per-thread scratch, kept between calls: a prompt's gate and up are megabytes, and
  // allocating (and zeroing) them in every layer cost page faults and memsets.
  thread_local std::vector<float> gate_buffer, up_buffer;
  const auto size = static_cast<size_t>(n * ff);
  if (gate_buffer.size() < size) gate_buffer.resize(size);
  if (up_buffer.size() < size) up_buffer.resize(size);
  float* gate = gate_buffer.data();
  float* up = up_buffer.data();
  const Weight ws[2] = {gate_w, up_w};
  float* const ys[2] = {gate, up};
  ctx.be.matmul_many(ws, xn, n, ys);
  if (gelu) {
    ctx.be.gelu(gate, n * ff, gate);
  } else {
    ctx.be.silu(gate, ff, n, gate);
  }
  ctx.be.mul(gate, up, ff, n, n, gate);
  ctx.be.matmul(down_w, gate, n, out);
}

void Model::moe_ffn(ForwardContext& ctx, const LayerWeights& lw, const float* xn, float* out) const {
  const int64_t n = ctx.n_tokens(), n_expert = hp_.n_expert, k = hp_.n_expert_used;
  std::vector<float> logits(static_cast<size_t>(n * n_expert)), weights(static_cast<size_t>(n * k));
  std::vector<int32_t> experts(static_cast<size_t>(n * k));
  ctx.be.matmul(lw.ffn_gate_inp, xn, n, logits.data());
  ctx.be.moe_route(logits.data(), n_expert, n, k, hp_.expert_weights_norm, experts.data(), weights.data());
  ctx.be.moe_ffn(lw.ffn_exps, xn, n, experts.data(), weights.data(), k, out);
}

void Model::residual(ForwardContext& ctx, float* x, const float* o) const {
  ctx.be.add(o, x, hp_.n_embd, ctx.n_tokens(), ctx.n_tokens(), x);
}

void Model::load_attention(int32_t il, LayerWeights& l) {
  const int64_t e = hp_.n_embd, nq = hp_.n_head * hp_.head_dim_k;
  const int64_t nk = hp_.n_head_kv * hp_.head_dim_k, nv = hp_.n_head_kv * hp_.head_dim_v;
  l.attn_norm = vec(blk(il, "attn_norm.weight"), e);
  l.wq = matrix(blk(il, "attn_q.weight"), e, nq);
  l.wk = matrix(blk(il, "attn_k.weight"), e, nk);
  l.wv = matrix(blk(il, "attn_v.weight"), e, nv);
  l.wo = matrix(blk(il, "attn_output.weight"), hp_.n_head * hp_.head_dim_v, e);
}

void Model::load_qkv_biases(int32_t il, LayerWeights& l, bool required) {
  l.bq = vec(blk(il, "attn_q.bias"), hp_.n_head * hp_.head_dim_k, required);
  l.bk = vec(blk(il, "attn_k.bias"), hp_.n_head_kv * hp_.head_dim_k, required);
  l.bv = vec(blk(il, "attn_v.bias"), hp_.n_head_kv * hp_.head_dim_v, required);
}

void Model::load_qk_norms(int32_t il, LayerWeights& l) {
  l.q_norm = vec(blk(il, "attn_q_norm.weight"), hp_.head_dim_k);
  l.k_norm = vec(blk(il, "attn_k_norm.weight"), hp_.head_dim_k);
}

void Model::load_gated_ffn(int32_t il, LayerWeights& l) {
  const int64_t e = hp_.n_embd;
  l.ffn_norm = vec(blk(il, "ffn_norm.weight"), e);
  l.ffn_gate = matrix(blk(il, "ffn_gate.weight"), e, hp_.n_ff);
  l.ffn_up = matrix(blk(il, "ffn_up.weight"), e, hp_.n_ff);
  l.ffn_down = matrix(blk(il, "ffn_down.weight"), hp_.n_ff, e);
}

void Model::load_moe_ffn(int32_t il, LayerWeights& l) {
  const int64_t e = hp_.n_embd, ff = hp_.n_ff_exp, n_expert = hp_.n_expert;
  if (!l.ffn_norm) l.ffn_norm = vec(blk(il, "ffn_norm.weight"), e);  // hybrids load post_attention_norm
  l.ffn_gate_inp = matrix(blk(il, "ffn_gate_inp.weight"), e, n_expert);
  l.ffn_exps.gate = expert_stack(blk(il, "ffn_gate_exps.weight"), e, ff, n_expert);
  l.ffn_exps.up = expert_stack(blk(il, "ffn_up_exps.weight"), e, ff, n_expert);
  l.ffn_exps.down = expert_stack(blk(il, "ffn_down_exps.weight"), ff, e, n_expert);
}

void Model::pre_norm_layer(ForwardContext& ctx, int32_t il, float* x, const AttentionSpec& spec) const {
  const LayerWeights& lw = w_.layers[static_cast<size_t>(il)];
  const int64_t n = ctx.n_tokens(), e = hp_.n_embd;
  std::vector<float> xn(static_cast<size_t>(n * e)), q, k, v;
  ctx.be.rms_norm(x, lw.attn_norm.data, e, n, hp_.norm_eps, xn.data());
  project_qkv(ctx, lw, xn.data(), q, k, v);
  std::vector<float> attn(static_cast<size_t>(n * hp_.n_head * hp_.head_dim_v));
  attention(ctx, il, q, k, v, spec, attn.data());
  ctx.be.matmul(lw.wo, attn.data(), n, xn.data());
  residual(ctx, x, xn.data());
  ctx.be.rms_norm(x, lw.ffn_norm.data, e, n, hp_.norm_eps, xn.data());
  std::vector<float> ffn(static_cast<size_t>(n * e));
  if (lw.ffn_gate_inp) {
    moe_ffn(ctx, lw, xn.data(), ffn.data());
  } else {
    gated_ffn(ctx, lw, xn.data(), false, ffn.data());
  }
  residual(ctx, x, ffn.data());
}

std::vector<float> Model::forward(backend::Backend& be, std::span<const BatchToken> batch, const float* hidden,
                                  LayerRange range, state::KvCache& cache) const {
  if (range.first < 0 || range.last > hp_.n_layer || range.first >= range.last) {
    throw std::invalid_argument("forward: bad layer range");
  }
  const auto& kc = cache.config();
  if (kc.first_layer > range.first || kc.last_layer < range.last) {
    throw std::invalid_argument("forward: the KV cache does not hold these layers");
  }
  const bool recurrent = recurrent_config(range).has_value();
  if (recurrent && (!cache.recurrent_config() || cache.recurrent_config()->first_layer != range.first ||
                    cache.recurrent_config()->last_layer != range.last)) {
    throw std::invalid_argument("forward: the cache holds no recurrent state for these layers");
  }
  if (!recurrent) return forward_part(be, batch, hidden, range, cache);
  // A checkpoint is the state right after its token: run the batch in stretches that end
  // at such tokens (a token's result does not depend on the stretch it runs in).
  std::vector<float> out;
  size_t begin = 0;
  while (begin < batch.size()) {
    size_t end = begin;
    while (end + 1 < batch.size() && batch[end].checkpoint_keep == 0) ++end;
    ++end;
    const auto part = batch.subspan(begin, end - begin);
    std::vector<float> result = forward_part(be, part, hidden ? hidden + begin * static_cast<size_t>(hp_.n_embd) : nullptr,
                                             range, cache);
    // The sequences' recurrent states now hold their tokens.
    for (const BatchToken& t : part) cache.recurrent(t.seq_id).set_n_pos(t.pos + 1);
    const BatchToken& last = part.back();
    if (last.checkpoint_keep > 0) cache.recurrent(last.seq_id).checkpoint(last.checkpoint_keep);
    if (out.empty()) {
      out = std::move(result);
    } else {
      out.insert(out.end(), result.begin(), result.end());
    }
    begin = end;
  }
  return out;
}

std::vector<float> Model::forward_part(backend::Backend& be, std::span<const BatchToken> batch, const float* hidden,
                                       LayerRange range, state::KvCache& cache) const {
  ForwardContext ctx{be, batch, cache, {}};
  const int64_t n = ctx.n_tokens();
  if (n == 0) return {};
  ctx.pos.resize(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) ctx.pos[static_cast<size_t>(t)] = batch[static_cast<size_t>(t)].pos;

  std::vector<float> x(static_cast<size_t>(n * hp_.n_embd));
  if (range.first == 0) {
    embed(ctx, x.data());
  } else {
    if (!hidden) throw std::invalid_argument("forward: a stage after layer 0 needs hidden states");
    std::memcpy(x.data(), hidden, x.size() * sizeof(float));
  }
  for (int32_t il = range.first; il < range.last; ++il) layer(ctx, il, x.data());
  if (range.last < hp_.n_layer) return x;

  // Only the rows asked for go through the output norm and head.
  int64_t n_out = 0;
  for (int64_t t = 0; t < n; ++t) {
    if (!batch[static_cast<size_t>(t)].logits) continue;
    if (n_out != t) {
      std::memmove(x.data() + n_out * hp_.n_embd, x.data() + t * hp_.n_embd, static_cast<size_t>(hp_.n_embd) * 4);
    }
    ++n_out;
  }
  if (n_out == 0) return {};
  ForwardContext out_ctx{be, batch.first(static_cast<size_t>(n_out)), cache, {}};  // n_tokens() == n_out
  output_norm(out_ctx, x.data());
  std::vector<float> logits(static_cast<size_t>(n_out * hp_.n_vocab));
  be.matmul(w_.output, x.data(), n_out, logits.data());
  if (hp_.final_logit_softcap > 0.0f) {
    const float cap = hp_.final_logit_softcap;
    for (float& l : logits) l = std::tanh(l * (1.0f / cap)) * cap;
  }
  return logits;
}

}  // namespace pico::model
