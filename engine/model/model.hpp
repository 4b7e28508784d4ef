// A loaded model: hyperparameters, weights as views into the GGUF mapping, and a
// forward pass over a range of layers for a batch of tokens that may come from
// several sequences at different positions.
//
// One file per architecture family (llama.cpp, qwen2.cpp, qwen3.cpp, qwen3moe.cpp,
// gpt2.cpp, gemma3.cpp) loads its layer weights and computes a layer; this file's Model runs
// the stage: embedding (the stage holding layer 0), the layers, then the output
// norm and head (the stage holding the last layer). Every op goes through a
// backend::Backend.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "gguf/reader.hpp"
#include "model/hparams.hpp"
#include "state/kv_cache.hpp"

namespace pico::model {

using backend::ExpertStack;
using backend::ExpertWeights;
using backend::Weight;

// A 1-D float vector (norm weights, biases): a view into the mapping for F32, else a
// converted copy owned by the model.
struct Vec {
  const float* data = nullptr;
  int64_t n = 0;
  explicit operator bool() const { return data != nullptr; }
};

struct LayerWeights {
  Vec attn_norm, attn_norm_b;
  Weight wq, wk, wv, wqkv, wo;
  Vec bq, bk, bv, bqkv, bo;
  Vec q_norm, k_norm;         // per head (qwen3, gemma3)
  Vec attn_post_norm;         // gemma3
  Vec ffn_norm, ffn_norm_b;
  Weight ffn_gate, ffn_up, ffn_down;
  Vec ffn_up_b, ffn_down_b;
  Vec ffn_post_norm;          // gemma3
  // Mixture of experts (qwen3moe): the router {n_embd, n_expert} and the experts.
  Weight ffn_gate_inp;
  ExpertWeights ffn_exps;
  // The shared expert beside them (qwen35moe, qwen3next): its scalar gate (one row of
  // n_embd) and its SwiGLU FFN.
  Weight ffn_gate_inp_shexp;
  Weight ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp;
  // Linear attention (Gated DeltaNet; qwen35, qwen35moe, qwen3next).
  Weight ssm_qkv;               // attn_qkv: the conv's input, Q | K | V
  Weight ssm_z;                 // attn_gate: the output gate
  Weight ssm_beta, ssm_alpha;   // qwen35: per value head
  Weight ssm_ba;                // qwen3next: beta and alpha, per key head group
  Vec ssm_conv;                 // the conv's weights, tap-major (taps rows of channels)
  Vec ssm_dt_bias, ssm_a;       // per value head
  Vec ssm_norm;                 // per head (head_dim)
  Weight ssm_out;
};

struct Weights {
  Weight tok_embd;
  Weight pos_embd;  // gpt2
  Vec output_norm, output_norm_b;
  Weight output;    // token_embd when the file has no output.weight (tied)
  std::vector<LayerWeights> layers;
};

struct BatchToken {
  int32_t seq_id = 0;
  int32_t pos = 0;
  int32_t token = 0;  // used by the stage holding layer 0
  bool logits = true; // the last stage returns this token's logits
  // > 0: after this token every stage checkpoints the sequence's recurrent state
  // (hybrid models), keeping at most this many checkpoints of it.
  uint8_t checkpoint_keep = 0;
  // With `logits`: only its arg max is wanted (greedy rows), which the last stage
  // returns instead of the row when the caller takes ReducedRows.
  bool argmax_only = false;
  // With `logits`: its hidden state after the output norm is wanted instead of its
  // logits (embeddings), which the last stage returns in ReducedRows.
  bool hidden_state = false;
  // With hidden_state, mean pooling on the last stage (worker::StageEngine): 1 adds the
  // hidden state to its sequence's running sum there and returns nothing; 2 adds it and
  // returns the mean of the sequence's rows so far instead.
  uint8_t pool = 0;
  // Each stage records the RMS of this token's residual stream after each of its
  // layers (ReducedRows::trace): the web UI's activation heatmap.
  bool trace = false;
};

// What the last stage returns besides whole logits rows. Per token with `logits` and
// not hidden_state, in batch order: the arg max of its logits (the first of equal
// maxima, as sample::first_argmax) and that logit for a token with argmax_only, id -1
// for one returned in full. Per hidden_state token, in batch order: its index in the
// batch and its n_embd values after the output norm (in `hidden`), left out of the
// logits and of `ids`.
struct ReducedRows {
  std::vector<int32_t> ids;
  std::vector<float> logits;
  std::vector<int32_t> hidden_rows;
  std::vector<float> hidden;
  // Per `trace` token, in batch order, on every stage: its index in the batch, and the
  // RMS of its residual stream after each layer of the range (range.last - range.first
  // values per token, in `trace`).
  std::vector<int32_t> trace_rows;
  std::vector<float> trace;
};

struct LayerRange {
  int32_t first = 0;
  int32_t last = 0;  // exclusive
};
// "A-B", both inclusive, as --layers takes it.
inline std::string to_string(LayerRange r) { return std::to_string(r.first) + "-" + std::to_string(r.last - 1); }

// Told around each layer a forward pass computes (WeightResidency streams the weights
// of a range larger than its memory budget by it).
class LayerObserver {
 public:
  virtual ~LayerObserver() = default;
  virtual void before_layer(int32_t il) = 0;
  virtual void after_layer(int32_t il) = 0;
};

// What a layer function works with during one forward call.
struct ForwardContext {
  backend::Backend& be;
  std::span<const BatchToken> batch;
  state::KvCache& cache;
  std::vector<int32_t> pos;  // batch positions
  int64_t n_tokens() const { return static_cast<int64_t>(batch.size()); }
  // A buffer of activation memory for count floats (the backend's; given back when the
  // layer ends). The model reads and writes it only through the backend's ops.
  float* floats(int64_t count) const { return be.activations(count); }
};

class Model {
 public:
  // Loads the architecture the metadata names. The file must outlive the model.
  static std::unique_ptr<Model> load(const gguf::Model& file);
  virtual ~Model() = default;

  const Hparams& hparams() const { return hp_; }
  // Told around each layer of every forward pass (null: nobody); not owned.
  void set_layer_observer(LayerObserver* observer) { observer_ = observer; }
  const Weights& weights() const { return w_; }
  LayerRange all_layers() const { return {0, static_cast<int32_t>(hp_.n_layer)}; }

  // The KV cache configuration for a stage's layers (a hybrid model's attention layers
  // only), and the recurrent state's (nullopt when the range has no linear layer).
  state::KvConfig kv_config(LayerRange range, GgmlType k_type = GgmlType::F16, GgmlType v_type = GgmlType::F16) const;
  std::optional<state::RecurrentConfig> recurrent_config(LayerRange range) const;
  // The state a stage keeps for its sequences: kv_config's cache with recurrent_config's
  // state, where a backend keeps them (backend::state_stores_of; the host's by default).
  std::unique_ptr<state::KvCache> make_cache(LayerRange range, GgmlType k_type = GgmlType::F16,
                                             GgmlType v_type = GgmlType::F16,
                                             const state::StateStores& stores = {}) const {
    return std::make_unique<state::KvCache>(kv_config(range, k_type, v_type), recurrent_config(range), stores);
  }

  // Hands the backend the weights a stage running `range` multiplies and looks up (its
  // matrices, expert stacks, the conv's taps), once, at load: a device backend uploads
  // them then instead of at the first step.
  void load_weights(backend::Backend& be, LayerRange range) const;

  // Runs layers [range.first, range.last) for `batch`. The stage holding layer 0
  // embeds the batch's tokens; other stages take `hidden` (batch.size() rows of
  // n_embd). Returns logits (one row of n_vocab per token whose `logits` is set, in
  // batch order) when the range ends with the last layer, else the hidden states
  // after range.last - 1 (every token). Within the batch,
  // a sequence's positions must follow one another and continue its cached state
  // (KV positions are contiguous); the tokens' K and V are stored in `cache`.
  // With `argmax` (the last stage): the argmax_only tokens' rows are reduced to their
  // arg max on the backend, so only it comes back from the device, and left out of the
  // returned logits (which hold the other rows, in order); the hidden_state tokens'
  // normed hidden states come back in it instead of logits (std::invalid_argument for
  // such a token without it).
  std::vector<float> forward(backend::Backend& be, std::span<const BatchToken> batch, const float* hidden,
                             LayerRange range, state::KvCache& cache, ReducedRows* argmax = nullptr) const;

 protected:
  Model(const gguf::Model& file, Hparams hp);

  // Per architecture.
  virtual void load_layer(int32_t il, LayerWeights& layer) = 0;
  virtual void embed(ForwardContext& ctx, float* x) const;
  virtual void layer(ForwardContext& ctx, int32_t il, float* x) const = 0;
  virtual void output_norm(ForwardContext& ctx, float* x) const;

  // Loading helpers: a matrix of `cols` x `rows` (shape checked), or a vector of n.
  Weight matrix(const std::string& name, int64_t cols, int64_t rows, bool required = true) const;
  // A 3-D tensor {cols, rows, n_expert}: n_expert matrices, as a view.
  ExpertStack expert_stack(const std::string& name, int64_t cols, int64_t rows, int64_t n_expert) const;
  Vec vec(const std::string& name, int64_t n, bool required = true);
  // Keeps values the model made (a transposed copy) for its lifetime.
  Vec own(std::vector<float> values);
  // A 1-D tensor of n values as a matrix of one row (a gate vector dotted with the input).
  Weight row_matrix(const std::string& name, int64_t n) const;
  static std::string blk(int32_t il, const std::string& name) { return "blk." + std::to_string(il) + "." + name; }
  // The weights most families share: attn_norm and separate Q, K, V, output
  // projections; optional Q/K/V biases; per-head Q/K norms; a gated FFN with ffn_norm.
  void load_attention(int32_t il, LayerWeights& l);
  void load_qkv_biases(int32_t il, LayerWeights& l, bool required);
  void load_qk_norms(int32_t il, LayerWeights& l);
  void load_gated_ffn(int32_t il, LayerWeights& l);
  // ffn_norm, the router ffn_gate_inp and the experts ffn_{gate,up,down}_exps.
  void load_moe_ffn(int32_t il, LayerWeights& l);

  // Shared blocks for the layer functions.
  struct AttentionSpec {
    const float* q_norm = nullptr;  // per-head RMSNorm weights of Q and K (head_dim_k)
    const float* k_norm = nullptr;
    backend::RopeParams rope;       // n_dims 0: no rope
    int32_t window = 0;
    float scale = 0.0f;             // q.k scale; 0: hparams' attn_scale
  };
  // Q, K, V already projected (tokens rows of n_head*dk, n_head_kv*dk, n_head_kv*dv,
  // rows `stride_*` apart): per-head norms, rope, KV store, attention. Writes
  // tokens rows of n_head * head_dim_v to out.
  void attention(ForwardContext& ctx, int32_t il, float* q, float* k, float* v, int64_t stride_q, int64_t stride_k,
                 int64_t stride_v, const AttentionSpec& spec, float* out) const;
  // Tokens rows of Q (n_head * dk), K (n_head_kv * dk) and V (n_head_kv * dv), in
  // activation memory.
  struct Qkv {
    float* q = nullptr;
    float* k = nullptr;
    float* v = nullptr;
  };
  // attention() over project_qkv's rows (dense strides).
  void attention(ForwardContext& ctx, int32_t il, const Qkv& qkv, const AttentionSpec& spec, float* out) const {
    attention(ctx, il, qkv.q, qkv.k, qkv.v, hp_.n_head * hp_.head_dim_k, hp_.n_head_kv * hp_.head_dim_k,
              hp_.n_head_kv * hp_.head_dim_v, spec, out);
  }
  backend::RopeParams rope_params(float freq_base, float freq_scale) const;
  // qwen3's attention (qwen3, qwen3moe): the layer's per-head Q/K norms, the model's rope.
  AttentionSpec qk_normed_attention(const LayerWeights& lw) const {
    AttentionSpec spec;
    spec.q_norm = lw.q_norm.data;
    spec.k_norm = lw.k_norm.data;
    spec.rope = rope_params(hp_.rope_freq_base, hp_.rope_freq_scale);
    return spec;
  }
  // Q, K, V projections of tokens rows of xn (separate wq/wk/wv, or fused wqkv), plus
  // biases when the layer has them: q rows of n_head*dk, k and v of n_head_kv*dk/dv.
  Qkv project_qkv(ForwardContext& ctx, const LayerWeights& lw, const float* xn) const;
  // down(act(gate(xn)) * up(xn)) with act SiLU (gelu false) or ggml's GELU.
  void gated_ffn(ForwardContext& ctx, const LayerWeights& lw, const float* xn, bool gelu, float* out) const;
  // The mixture of experts: router logits, top-k routing, then the chosen experts'
  // SwiGLU FFNs weighted by their routing weights.
  void moe_ffn(ForwardContext& ctx, const LayerWeights& lw, const float* xn, float* out) const;
  // The shared expert's FFN, gated per token by sigmoid(ffn_gate_inp_shexp . xn), added to out.
  void add_shared_expert(ForwardContext& ctx, const LayerWeights& lw, const float* xn, float* out) const;
  // gated_ffn over explicit weights of width ff.
  void swiglu(ForwardContext& ctx, const Weight& gate, const Weight& up, const Weight& down, int64_t ff,
              const float* xn, bool gelu, float* out) const;

  // Hybrid models (gated_delta_net.cpp). The gated attention layer: Q and its output
  // gate interleaved per head in attn_q, per-head Q/K norms, partial RoPE, then the
  // output times sigmoid(gate). Returns tokens rows of n_embd (before the residual).
  void gated_attention(ForwardContext& ctx, int32_t il, const float* xn, float* out) const;
  // The Gated DeltaNet layer over xn: projections, causal conv with state, SiLU, L2
  // norms, the delta rule, the gated RMSNorm and ssm_out. grouped_heads: value head h
  // reads key head h / (H_v / H_k) (qwen3next) rather than h % H_k (qwen35).
  void gated_delta_net(ForwardContext& ctx, int32_t il, const float* xn, bool grouped_heads, float* out) const;
  // x += mixer(rms_norm(x)); x += ffn(rms_norm(x; post_attention_norm)), the mixer
  // gated attention or the delta net by the layer's kind, the FFN dense or MoE (with
  // its shared expert) by its weights.
  void hybrid_layer(ForwardContext& ctx, int32_t il, float* x, bool grouped_heads) const;
  // Loading: attn_norm, post_attention_norm (as ffn_norm) and the layer's mixer.
  void load_hybrid_mixer(int32_t il, LayerWeights& l, bool fused_beta_alpha);
  void load_shared_expert(int32_t il, LayerWeights& l);

  // x += o, rows of n_embd.
  void residual(ForwardContext& ctx, float* x, const float* o) const;
  // The llama-family layer: x += wo(attention(rms_norm(x))); x += ffn(rms_norm(x)),
  // with SwiGLU, or the mixture of experts when the layer has a router; the families
  // differ only in `spec` (Q/K norms, rope) and weights.
  void pre_norm_layer(ForwardContext& ctx, int32_t il, float* x, const AttentionSpec& spec) const;

  const gguf::Model& file_;
  LayerObserver* observer_ = nullptr;
  Hparams hp_;
  Weights w_;

 private:
  void load_all();
  // One stretch of forward(): the tokens up to a checkpoint (see BatchToken).
  std::vector<float> forward_part(backend::Backend& be, std::span<const BatchToken> batch, const float* hidden,
                                  LayerRange range, state::KvCache& cache, ReducedRows* argmax) const;
  // The logits of the flagged tokens (n_out rows at device_logits) as forward returns
  // them, argmax_only rows reduced when argmax is given.
  std::vector<float> logits_out(backend::Backend& be, std::span<const BatchToken> batch, std::span<const int32_t> rows,
                                const float* device_logits, ReducedRows* argmax) const;
  std::vector<std::vector<float>> owned_;  // converted vectors
};

// Factories (one per architecture file).
std::unique_ptr<Model> make_llama(const gguf::Model& file, Hparams hp);
std::unique_ptr<Model> make_qwen2(const gguf::Model& file, Hparams hp);
std::unique_ptr<Model> make_qwen3(const gguf::Model& file, Hparams hp);
std::unique_ptr<Model> make_qwen3moe(const gguf::Model& file, Hparams hp);
std::unique_ptr<Model> make_qwen35(const gguf::Model& file, Hparams hp);  // and qwen35moe
std::unique_ptr<Model> make_qwen3next(const gguf::Model& file, Hparams hp);
std::unique_ptr<Model> make_gpt2(const gguf::Model& file, Hparams hp);
std::unique_ptr<Model> make_gemma3(const gguf::Model& file, Hparams hp);

}  // namespace pico::model
