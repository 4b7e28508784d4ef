#include "model/model.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "quant/quantize.hpp"
#include "sample/argmax.hpp"

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

void Model::load_weights(backend::Backend& be, LayerRange range) const {
  std::vector<Weight> matrices;
  std::vector<backend::ExpertWeights> experts;
  auto add = [&](const Weight& w) {
    if (w.data) matrices.push_back(w);
  };
  if (range.first == 0) {
    add(w_.tok_embd);
    add(w_.pos_embd);
  }
  if (range.last == hp_.n_layer) add(w_.output);
  for (int32_t il = range.first; il < range.last; ++il) {
    const LayerWeights& l = w_.layers[static_cast<size_t>(il)];
    for (const Weight* w : {&l.wq, &l.wk, &l.wv, &l.wqkv, &l.wo, &l.ffn_gate, &l.ffn_up, &l.ffn_down, &l.ffn_gate_inp,
                            &l.ffn_gate_inp_shexp, &l.ffn_gate_shexp, &l.ffn_up_shexp, &l.ffn_down_shexp, &l.ssm_qkv,
                            &l.ssm_z, &l.ssm_beta, &l.ssm_alpha, &l.ssm_ba, &l.ssm_out})
      add(*w);
    if (l.ssm_conv) add({GgmlType::F32, l.ssm_conv.data, hp_.ssm_conv_channels(), hp_.ssm_conv_kernel});
    if (l.ffn_exps.gate.data) experts.push_back(l.ffn_exps);
  }
  be.load_weights(matrices, experts);
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

namespace {

// Per-head RMSNorm of tokens rows of `heads` heads (rows `stride` apart): one call
// when the rows are dense, else one per token (a row's result is the same either way).
void head_norms(backend::Backend& be, float* x, int64_t stride, int64_t tokens, int64_t heads, int64_t head_dim,
                const float* weight, float eps) {
  if (stride == heads * head_dim) return be.rms_norm(x, weight, head_dim, tokens * heads, eps, x);
  for (int64_t t = 0; t < tokens; ++t) be.rms_norm(x + t * stride, weight, head_dim, heads, eps, x + t * stride);
}

}  // namespace

void Model::attention(ForwardContext& ctx, int32_t il, float* q, float* k, float* v, int64_t stride_q,
                      int64_t stride_kv, int64_t stride_v, const AttentionSpec& spec, float* out) const {
  backend::Backend& be = ctx.be;
  const int64_t n = ctx.n_tokens();
  const int64_t dk = hp_.head_dim_k, dv = hp_.head_dim_v;
  if (spec.q_norm) head_norms(be, q, stride_q, n, hp_.n_head, dk, spec.q_norm, hp_.norm_eps);
  if (spec.k_norm) head_norms(be, k, stride_kv, n, hp_.n_head_kv, dk, spec.k_norm, hp_.norm_eps);
  if (spec.rope.n_dims > 0) {
    be.rope(q, n, stride_q, hp_.n_head, dk, ctx.pos.data(), spec.rope);
    be.rope(k, n, stride_kv, hp_.n_head_kv, dk, ctx.pos.data(), spec.rope);
  }
  // Store every token's K and V first (a later token of the same sequence in this
  // batch sees the earlier ones), then take the views.
  std::vector<backend::KvSlot> slots(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    const BatchToken& bt = ctx.batch[static_cast<size_t>(t)];
    slots[static_cast<size_t>(t)] = {bt.seq_id, bt.pos};
  }
  be.store_kv(ctx.cache, il, slots, k, stride_kv, v, stride_v);
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

Model::Qkv Model::project_qkv(ForwardContext& ctx, const LayerWeights& lw, const float* xn) const {
  const int64_t n = ctx.n_tokens();
  const int64_t nq = hp_.n_head * hp_.head_dim_k, nk = hp_.n_head_kv * hp_.head_dim_k, nv = hp_.n_head_kv * hp_.head_dim_v;
  const Qkv out{ctx.floats(n * nq), ctx.floats(n * nk), ctx.floats(n * nv)};
  if (lw.wqkv) {
    const int64_t row = nq + nk + nv;
    float* fused = ctx.floats(n * row);
    ctx.be.matmul(lw.wqkv, xn, n, fused);
    if (lw.bqkv) ctx.be.add(fused, lw.bqkv.data, row, n, 1, fused);
    ctx.be.copy_rows(fused, row, n, nq, out.q, nq);
    ctx.be.copy_rows(fused + nq, row, n, nk, out.k, nk);
    ctx.be.copy_rows(fused + nq + nk, row, n, nv, out.v, nv);
    return out;
  }
  const Weight ws[3] = {lw.wq, lw.wk, lw.wv};
  float* const ys[3] = {out.q, out.k, out.v};
  ctx.be.matmul_many(ws, xn, n, ys);
  if (lw.bq) ctx.be.add(out.q, lw.bq.data, nq, n, 1, out.q);
  if (lw.bk) ctx.be.add(out.k, lw.bk.data, nk, n, 1, out.k);
  if (lw.bv) ctx.be.add(out.v, lw.bv.data, nv, n, 1, out.v);
  return out;
}

void Model::gated_ffn(ForwardContext& ctx, const LayerWeights& lw, const float* xn, bool gelu, float* out) const {
  swiglu(ctx, lw.ffn_gate, lw.ffn_up, lw.ffn_down, hp_.n_ff, xn, gelu, out);
}

void Model::swiglu(ForwardContext& ctx, const Weight& gate_w, const Weight& up_w, const Weight& down_w, int64_t ff,
                   const float* xn, bool gelu, float* out) const {
  const int64_t n = ctx.n_tokens();
  float* gate = ctx.floats(n * ff);
  float* up = ctx.floats(n * ff);
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
  float* logits = ctx.floats(n * n_expert);
  // The routing stays in activation memory too: int32 expert ids in float-sized slots.
  auto* experts = reinterpret_cast<int32_t*>(ctx.floats(n * k));
  float* weights = ctx.floats(n * k);
  ctx.be.matmul(lw.ffn_gate_inp, xn, n, logits);
  ctx.be.moe_route(logits, n_expert, n, k, hp_.expert_weights_norm, experts, weights);
  ctx.be.moe_ffn(lw.ffn_exps, xn, n, experts, weights, k, out);
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
  float* xn = ctx.floats(n * e);
  ctx.be.rms_norm(x, lw.attn_norm.data, e, n, hp_.norm_eps, xn);
  const Qkv qkv = project_qkv(ctx, lw, xn);
  float* attn = ctx.floats(n * hp_.n_head * hp_.head_dim_v);
  attention(ctx, il, qkv, spec, attn);
  ctx.be.matmul(lw.wo, attn, n, xn);
  residual(ctx, x, xn);
  ctx.be.rms_norm(x, lw.ffn_norm.data, e, n, hp_.norm_eps, xn);
  float* ffn = ctx.floats(n * e);
  if (lw.ffn_gate_inp) {
    moe_ffn(ctx, lw, xn, ffn);
  } else {
    gated_ffn(ctx, lw, xn, false, ffn);
  }
  residual(ctx, x, ffn);
}

std::vector<float> Model::forward(backend::Backend& be, std::span<const BatchToken> batch, const float* hidden,
                                  LayerRange range, state::KvCache& cache, ReducedRows* argmax) const {
  if (argmax) *argmax = {};
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
  if (!recurrent) return forward_part(be, batch, hidden, range, cache, argmax);
  // A checkpoint is the state right after its token: run the batch in stretches that end
  // at such tokens (a token's result does not depend on the stretch it runs in).
  std::vector<float> out;
  size_t begin = 0;
  while (begin < batch.size()) {
    size_t end = begin;
    while (end + 1 < batch.size() && batch[end].checkpoint_keep == 0) ++end;
    ++end;
    const auto part = batch.subspan(begin, end - begin);
    ReducedRows part_argmax;
    std::vector<float> result = forward_part(be, part, hidden ? hidden + begin * static_cast<size_t>(hp_.n_embd) : nullptr,
                                             range, cache, argmax ? &part_argmax : nullptr);
    if (argmax) {
      argmax->ids.insert(argmax->ids.end(), part_argmax.ids.begin(), part_argmax.ids.end());
      argmax->logits.insert(argmax->logits.end(), part_argmax.logits.begin(), part_argmax.logits.end());
      for (const int32_t row : part_argmax.hidden_rows) argmax->hidden_rows.push_back(row + static_cast<int32_t>(begin));
      argmax->hidden.insert(argmax->hidden.end(), part_argmax.hidden.begin(), part_argmax.hidden.end());
      for (const int32_t row : part_argmax.trace_rows) argmax->trace_rows.push_back(row + static_cast<int32_t>(begin));
      argmax->trace.insert(argmax->trace.end(), part_argmax.trace.begin(), part_argmax.trace.end());
    }
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
                                       LayerRange range, state::KvCache& cache, ReducedRows* argmax) const {
  ForwardContext ctx{be, batch, cache, {}};
  const int64_t n = ctx.n_tokens(), e = hp_.n_embd;
  if (n == 0) return {};
  ctx.pos.resize(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) ctx.pos[static_cast<size_t>(t)] = batch[static_cast<size_t>(t)].pos;

  // The residual stream stays in activation memory from the stage's input to its output.
  const backend::ActivationScope pass(be);
  float* x = ctx.floats(n * e);
  if (range.first == 0) {
    embed(ctx, x);
  } else {
    if (!hidden) throw std::invalid_argument("forward: a stage after layer 0 needs hidden states");
    be.upload(hidden, n * e, x);
  }
  // Traced rows: their residual's RMS after each layer, computed on the host in double
  // from a copy of those rows (nothing is done for a batch without them).
  std::vector<int32_t> traced;
  for (int64_t t = 0; t < n; ++t) {
    if (batch[static_cast<size_t>(t)].trace) traced.push_back(static_cast<int32_t>(t));
  }
  if (!traced.empty() && !argmax) throw std::invalid_argument("forward: a traced row needs ReducedRows to return its trace in");
  const auto n_traced = static_cast<int64_t>(traced.size());
  const int32_t n_here = range.last - range.first;
  std::vector<float> trace(static_cast<size_t>(n_traced * n_here)), rows_copy(static_cast<size_t>(n_traced * e));
  for (int32_t il = range.first; il < range.last; ++il) {
    const backend::ActivationScope layer_buffers(be);
    if (observer_) observer_->before_layer(il);
    layer(ctx, il, x);
    if (observer_) observer_->after_layer(il);
    if (n_traced == 0) continue;
    float* gathered = ctx.floats(n_traced * e);
    be.gather_rows(x, e, traced.data(), n_traced, gathered);
    be.download(gathered, n_traced * e, rows_copy.data());
    for (int64_t r = 0; r < n_traced; ++r) {
      double sum = 0;
      for (int64_t i = 0; i < e; ++i) sum += static_cast<double>(rows_copy[static_cast<size_t>(r * e + i)]) * rows_copy[static_cast<size_t>(r * e + i)];
      trace[static_cast<size_t>(r * n_here + (il - range.first))] = static_cast<float>(std::sqrt(sum / static_cast<double>(e)));
    }
  }
  if (n_traced > 0) {
    argmax->trace_rows = std::move(traced);
    argmax->trace = std::move(trace);
  }
  if (range.last < hp_.n_layer) {
    std::vector<float> out(static_cast<size_t>(n * e));
    be.download(x, n * e, out.data());
    return out;
  }

  // Only the rows asked for go through the output norm, and only those that want
  // logits through the head.
  std::vector<int32_t> rows;
  for (int64_t t = 0; t < n; ++t) {
    if (batch[static_cast<size_t>(t)].logits) rows.push_back(static_cast<int32_t>(t));
  }
  const auto n_out = static_cast<int64_t>(rows.size());
  if (n_out == 0) return {};
  float* selected = x;
  if (n_out != n) {
    selected = ctx.floats(n_out * e);
    be.gather_rows(x, e, rows.data(), n_out, selected);
  }
  ForwardContext out_ctx{be, batch.first(static_cast<size_t>(n_out)), cache, {}};  // n_tokens() == n_out
  output_norm(out_ctx, selected);
  std::vector<int32_t> head_rows, head_selected;  // batch indices, and indices into `selected`
  std::vector<int32_t> hidden_selected;
  for (int32_t i = 0; i < static_cast<int32_t>(n_out); ++i) {
    const int32_t row = rows[static_cast<size_t>(i)];
    if (batch[static_cast<size_t>(row)].hidden_state) {
      if (!argmax) throw std::invalid_argument("forward: a hidden-state row needs ReducedRows to return it in");
      argmax->hidden_rows.push_back(row);
      hidden_selected.push_back(i);
    } else {
      head_rows.push_back(row);
      head_selected.push_back(i);
    }
  }
  if (!hidden_selected.empty()) {
    const auto n_hidden = static_cast<int64_t>(hidden_selected.size());
    const float* from = selected;
    if (n_hidden != n_out) {
      float* gathered = ctx.floats(n_hidden * e);
      be.gather_rows(selected, e, hidden_selected.data(), n_hidden, gathered);
      from = gathered;
    }
    argmax->hidden.resize(static_cast<size_t>(n_hidden * e));
    be.download(from, n_hidden * e, argmax->hidden.data());
  }
  const auto n_head = static_cast<int64_t>(head_rows.size());
  if (n_head == 0) return {};
  if (n_head != n_out) {
    float* gathered = ctx.floats(n_head * e);
    be.gather_rows(selected, e, head_selected.data(), n_head, gathered);
    selected = gathered;
  }
  float* device_logits = ctx.floats(n_head * hp_.n_vocab);
  be.matmul(w_.output, selected, n_head, device_logits);
  return logits_out(be, batch, head_rows, device_logits, argmax);
}

std::vector<float> Model::logits_out(backend::Backend& be, std::span<const BatchToken> batch,
                                     std::span<const int32_t> rows, const float* device_logits,
                                     ReducedRows* argmax) const {
  const int64_t vocab = hp_.n_vocab, n_out = static_cast<int64_t>(rows.size());
  const float cap = hp_.final_logit_softcap;
  // Which rows come back whole and which as their arg max only.
  std::vector<int32_t> full, reduced;
  for (int32_t i = 0; i < static_cast<int32_t>(n_out); ++i) {
    (argmax && batch[static_cast<size_t>(rows[static_cast<size_t>(i)])].argmax_only ? reduced : full).push_back(i);
  }
  if (argmax) {
    argmax->ids.assign(static_cast<size_t>(n_out), -1);
    argmax->logits.assign(static_cast<size_t>(n_out), 0.0f);
  }
  if (reduced.empty() || cap > 0.0f) {
    // Every row comes down (the softcap is the host's: the arg max of the capped row).
    std::vector<float> logits(static_cast<size_t>(n_out * vocab));
    be.download(device_logits, n_out * vocab, logits.data());
    if (cap > 0.0f) {
      for (float& l : logits) l = std::tanh(l * (1.0f / cap)) * cap;
    }
    if (reduced.empty()) return logits;
    size_t kept = 0;
    for (int32_t i = 0; i < static_cast<int32_t>(n_out); ++i) {
      const float* row = logits.data() + static_cast<size_t>(i) * static_cast<size_t>(vocab);
      if (batch[static_cast<size_t>(rows[static_cast<size_t>(i)])].argmax_only) {
        const size_t best = sample::first_argmax(row, static_cast<size_t>(vocab));
        argmax->ids[static_cast<size_t>(i)] = static_cast<int32_t>(best);
        argmax->logits[static_cast<size_t>(i)] = row[best];
      } else {
        std::copy(row, row + vocab, logits.data() + kept++ * static_cast<size_t>(vocab));
      }
    }
    logits.resize(kept * static_cast<size_t>(vocab));
    return logits;
  }
  // The arg max rows reduced on the backend, beside the whole rows: one download.
  const auto n_full = static_cast<int64_t>(full.size()), n_reduced = static_cast<int64_t>(reduced.size());
  float* out = be.activations(n_full * vocab + 2 * n_reduced);
  if (n_full > 0) be.gather_rows(device_logits, vocab, full.data(), n_full, out);
  be.argmax_rows(device_logits, vocab, reduced.data(), n_reduced, out + n_full * vocab);
  std::vector<float> host(static_cast<size_t>(n_full * vocab + 2 * n_reduced));
  be.download(out, static_cast<int64_t>(host.size()), host.data());
  const float* pairs = host.data() + n_full * vocab;
  for (int64_t j = 0; j < n_reduced; ++j) {
    int32_t id;
    std::memcpy(&id, pairs + j, sizeof id);
    argmax->ids[static_cast<size_t>(reduced[static_cast<size_t>(j)])] = id;
    argmax->logits[static_cast<size_t>(reduced[static_cast<size_t>(j)])] = pairs[n_reduced + j];
  }
  host.resize(static_cast<size_t>(n_full * vocab));
  return host;
}

}  // namespace pico::model
