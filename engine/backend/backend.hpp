// The operations a model forward pass calls, behind one small interface, so that a
// GPU backend can own a range of layers (their weights and KV) while the model files
// stay the same. Plain virtual functions over float buffers; row-major rows.
//
// Activation memory: the model takes the buffers of a forward pass from the backend
// (activations()), and moves data between them and the host only through upload() and
// download(). On the CPU they are host memory; on a device backend they are addresses
// the host cannot touch that name device memory (as CUDA's unified addressing does), so
// a forward pass keeps its activations on the device from the stage's input to its
// output, and a stray host access faults instead of reading stale values. Every op
// also accepts host pointers (tests, tools): a device backend copies those in and out.
//
// Numerics follow llama.cpp's CPU backend (ggml-cpu) float operation for float
// operation: matmul quantizes activations to the weight type's dot partner, SiLU and
// softmax use its vector e^x, RoPE its angles (powf/cosf/sinf) and fused rotation,
// GELU its F16 table, attention its summation order (ggml_op_trace_test checks the
// elementwise ops node for node). Every op treats each row on its own, so a row's
// result does not depend on the batch it came in (batch invariance; see
// BatchNumerics for the one exception llama.cpp itself makes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "backend/arena.hpp"
#include "quant/type_traits.hpp"
#include "state/kv_cache.hpp"

namespace pico::backend {

class Backend;
// The page stores of `be` for a KV cache (state::KvCache's maker).
state::StateStores state_stores_of(Backend& be);

enum class Op {
  matmul,
  get_rows,
  rms_norm,
  layer_norm,
  rope,
  attention,
  add,
  mul,
  scale,
  silu,
  gelu,
  gelu_erf,
  softmax,
  moe_route,  // router softmax, top-k, renormalisation
  moe_ffn,    // the experts' SwiGLU FFNs (type: the expert matrices')
  sigmoid,
  softplus,
  l2_norm,
  ssm_conv,    // causal depthwise convolution with its state (linear-attention layers)
  delta_rule,  // the gated delta rule's recurrence
};

// A weight matrix: `rows` rows of `cols` values of `type`, row after row.
struct Weight {
  GgmlType type = GgmlType::F32;
  const void* data = nullptr;
  int64_t cols = 0;
  int64_t rows = 0;
  explicit operator bool() const { return data != nullptr; }
};

// n_expert matrices of one shape stored one after another: a 3-D GGUF tensor
// {cols, rows, n_expert} (ffn_gate_exps, ffn_up_exps, ffn_down_exps).
struct ExpertStack {
  GgmlType type = GgmlType::F32;
  const void* data = nullptr;
  int64_t cols = 0;
  int64_t rows = 0;
  int64_t n_expert = 0;
  explicit operator bool() const { return data != nullptr; }
  size_t expert_bytes() const {
    return static_cast<size_t>(bytes_of(type_traits(type), static_cast<uint64_t>(cols)).value()) * static_cast<size_t>(rows);
  }
  // Expert e's matrix: a view into the stack, nothing copied.
  Weight expert(int64_t e) const {
    return Weight{type, static_cast<const uint8_t*>(data) + static_cast<size_t>(e) * expert_bytes(), cols, rows};
  }
};

// A mixture-of-experts FFN's experts: down(SiLU(gate x) * up x) per expert.
struct ExpertWeights {
  ExpertStack gate, up, down;  // gate/up {n_embd, n_ff_exp, E}, down {n_ff_exp, n_embd, E}
};

struct RopeParams {
  int32_t n_dims = 0;   // leading dimensions of each head that rotate
  bool neox = false;    // pairs (i, i + n_dims/2); normal mode: pairs (2i, 2i+1)
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;  // 1 / linear scaling factor
  // YaRN (ext_factor 0: off).
  float ext_factor = 0.0f;
  float attn_factor = 1.0f;
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  int32_t n_ctx_orig = 0;
};

// One query token of an attention call: its position and its sequence's KV layer
// (which already holds this token's own K and V at `pos`).
struct AttentionQuery {
  int32_t pos = 0;
  state::KvLayerView kv;
};

struct AttentionParams {
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim_k = 0;
  int64_t head_dim_v = 0;
  float scale = 1.0f;       // applied to q . k
  int32_t window = 0;       // > 0: keys with pos - key_pos >= window are masked (sliding window)
  float softcap = 0.0f;     // > 0: scores = softcap * tanh(scores / softcap)
};

// The tokens of one sequence in a call over recurrent layers: rows [first_row,
// first_row + rows) of the inputs, in position order, and the sequence's state for the
// layer, updated in place.
struct RecurrentSequence {
  int64_t first_row = 0;
  int64_t rows = 0;
  float* conv_state = nullptr;  // ssm_conv: taps - 1 rows of channels, oldest first
  float* ssm_state = nullptr;   // delta_rule: per value head, head_dim rows of head_dim
  // Whose memory the states are (RecurrentState::store(); null: host memory).
  const state::BlockStore* store = nullptr;
};

struct DeltaRuleParams {
  int64_t n_k_heads = 0;   // query and key heads
  int64_t n_v_heads = 0;   // value heads (a multiple of n_k_heads)
  int64_t head_dim = 0;    // of every head
  // Which key head value head h reads: h / (n_v_heads / n_k_heads) (grouped, qwen3next)
  // or h % n_k_heads (tiled, qwen35).
  bool grouped_heads = false;
};

// Where one token's K and V rows go: its sequence and position (store_kv).
struct KvSlot {
  int32_t seq_id = 0;
  int32_t pos = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual bool supports(Op op, GgmlType type) const = 0;

  // Activation memory for `count` floats, uninitialised, valid until a
  // release_activations() to a mark taken before it. One forward pass at a time per
  // backend (a stage runs its batches in order).
  virtual float* activations(int64_t count) = 0;
  virtual size_t activation_mark() const = 0;
  virtual void release_activations(size_t mark) = 0;
  // count floats from the host into activation memory, and back. download() is where
  // a device backend submits the work recorded so far and waits for it.
  virtual void upload(const float* host, int64_t count, float* activations) = 0;
  virtual void download(const float* activations, int64_t count, float* host) = 0;
  // y row r (at y + r * y_stride) = x row r (at x + r * x_stride), n floats, for rows rows.
  virtual void copy_rows(const float* x, int64_t x_stride, int64_t rows, int64_t n, float* y, int64_t y_stride) = 0;
  // y row i = x row ids[i], rows of n (ids on the host; y must not overlap x).
  virtual void gather_rows(const float* x, int64_t n, const int32_t* ids, int64_t count, float* y) = 0;
  // x row r *= factors[r], in place, rows of n.
  virtual void scale_rows(float* x, int64_t n, int64_t rows, const float* factors) = 0;
  // For i < count: out[i] = the arg max of row rows[i] of x (rows of n; the first of
  // equal maxima, NaNs never picked unless one leads: sample::first_argmax) as int32 in
  // a float slot, out[count + i] its value. rows on the host.
  virtual void argmax_rows(const float* x, int64_t n, const int32_t* rows, int64_t count, float* out) = 0;
  // Stores token t's K row (k + t * k_stride) and V row (v + t * v_stride) in layer
  // `layer` of `cache` at slots[t] (KvState::write's rounding and rules), in slot order.
  virtual void store_kv(state::KvCache& cache, int32_t layer, std::span<const KvSlot> slots, const float* k,
                        int64_t k_stride, const float* v, int64_t v_stride) = 0;
  // The weights of the stage's layers, handed over once at load (Model::load_weights):
  // a device backend uploads them there, so that no step uploads a weight; the CPU
  // reads the mapping in place. Weights not handed over still work (uploaded at first use).
  virtual void load_weights(std::span<const Weight> matrices, std::span<const ExpertWeights> experts) {
    (void)matrices;
    (void)experts;
  }
  // Bytes of weights the backend holds in its own memory (0 on the CPU).
  virtual uint64_t weight_bytes() const { return 0; }
  // Where a KV cache of sequences this backend runs keeps its pages (Model::make_cache
  // asks): host memory here; a device backend's memory where its attention reads it.
  // The cache must not outlive the backend.
  virtual std::shared_ptr<state::PageStore> kv_page_store(const state::KvPageShape& shape) {
    return state::host_page_store(shape);
  }
  // Likewise the blocks of a hybrid model's recurrent state and its checkpoints.
  virtual std::shared_ptr<state::BlockStore> state_block_store(size_t block_floats) {
    return state::host_block_store(block_floats);
  }
  // Times the backend handed the work it recorded to its device and waited for it (0
  // on the CPU, which does each op as it is called): what a step costs in round trips.
  virtual uint64_t submissions() const { return 0; }
  // Work it recorded for its device, and the barriers between (one only where a piece
  // of work needs what another did); 0 on the CPU.
  virtual uint64_t dispatches() const { return 0; }
  virtual uint64_t barriers() const { return 0; }

  // y[t * w.rows + r] = dot(row r of w, row t of x) for tokens rows of x (w.cols each).
  virtual void matmul(const Weight& w, const float* x, int64_t tokens, float* y) = 0;
  // Several weights over the same input (Q, K, V; gate, up): the input is quantized
  // once per distinct activation type. ys[i] receives tokens * ws[i].rows values.
  virtual void matmul_many(std::span<const Weight> ws, const float* x, int64_t tokens, std::span<float* const> ys) = 0;
  // out row i = row ids[i] of table, dequantized to float.
  virtual void get_rows(const Weight& table, const int32_t* ids, int64_t count, float* out) = 0;

  // y = x / sqrt(mean(x^2) + eps) * w (w may be null), rows of n.
  virtual void rms_norm(const float* x, const float* w, int64_t n, int64_t rows, float eps, float* y) = 0;
  // y = (x - mean) / sqrt(var + eps) * w + b (w, b may be null).
  virtual void layer_norm(const float* x, const float* w, const float* b, int64_t n, int64_t rows, float eps,
                          float* y) = 0;
  // Rotates, in place, `heads` heads of head_dim values per token; token t's heads
  // start at x + t * row_stride, at position pos[t].
  virtual void rope(float* x, int64_t tokens, int64_t row_stride, int64_t heads, int64_t head_dim,
                    const int32_t* pos, const RopeParams& params) = 0;
  // out row t (n_head * head_dim_v) = softmax(scale * q_t . K[0..pos]) V for each head;
  // q rows are n_head * head_dim_k floats, query q_row_stride apart. Head h reads KV
  // head h / (n_head / n_head_kv). Each query's keys are visited in the same order
  // whatever the batch.
  virtual void attention(const float* q, int64_t q_row_stride, std::span<const AttentionQuery> queries,
                         const AttentionParams& params, float* out) = 0;

  // Elementwise over rows of n: y = a + b (b broadcast over rows when b_rows == 1).
  virtual void add(const float* a, const float* b, int64_t n, int64_t rows, int64_t b_rows, float* y) = 0;
  virtual void mul(const float* a, const float* b, int64_t n, int64_t rows, int64_t b_rows, float* y) = 0;
  virtual void scale(float* x, int64_t count, float factor) = 0;
  // x / (1 + e^-x) over rows of n, each row on its own (llama.cpp's vector e^x runs
  // from each row's start).
  virtual void silu(const float* x, int64_t n, int64_t rows, float* y) = 0;
  // ggml's GELU: the tanh approximation, through its F16 lookup table.
  virtual void gelu(const float* x, int64_t count, float* y) = 0;
  virtual void gelu_erf(const float* x, int64_t count, float* y) = 0;
  // In place, rows of n.
  virtual void softmax(float* x, int64_t n, int64_t rows) = 0;
  // y = 1 / (1 + e^-x), libm's e^x (ggml's sigmoid).
  virtual void sigmoid(const float* x, int64_t count, float* y) = 0;
  // y = log(1 + e^x), and x itself above 20 (ggml's softplus).
  virtual void softplus(const float* x, int64_t count, float* y) = 0;
  // y = x / max(|x|, eps) over rows of n, the squares added in double (ggml's l2_norm).
  virtual void l2_norm(const float* x, int64_t n, int64_t rows, float eps, float* y) = 0;

  // The causal depthwise convolution of the linear-attention layers: for each
  // sequence, its rows of x (`channels` values each) continue the inputs held in its
  // conv_state; y row t, channel c = sum over taps i of weights[i * channels + c] *
  // X[t + i][c], where X is the state's taps - 1 rows followed by the sequence's rows
  // (tap taps - 1 meets the row itself; tap order as llama.cpp's ssm_conv). The state
  // becomes the last taps - 1 rows of X.
  virtual void ssm_conv(const float* x, int64_t channels, const float* weights, int64_t taps,
                        std::span<const RecurrentSequence> sequences, float* y) = 0;
  // The gated delta rule, token by token in position order (the same order for a
  // prompt and for decoding, so a token's result does not depend on its batch): per
  // value head h with state S (head_dim x head_dim), key head kh (see DeltaRuleParams),
  // for each token: S *= e^g; u = beta (v - S^T k); S += k u^T; out = S^T q / sqrt(head_dim),
  // with g = log_decay[row * n_v_heads + h], beta = beta[row * n_v_heads + h]. q and k
  // rows hold n_k_heads heads, v and out rows n_v_heads heads, rows `row_stride` apart
  // in q, k and v (out rows are dense). llama.cpp's GGML_OP_GATED_DELTA_NET float for float.
  virtual void delta_rule(const float* q, const float* k, const float* v, int64_t row_stride, const float* log_decay,
                          const float* beta, std::span<const RecurrentSequence> sequences,
                          const DeltaRuleParams& params, float* out) = 0;

  // Mixture-of-experts routing of `tokens` rows of n_expert router logits: the
  // softmax over all experts (as softmax()), the k most probable experts in
  // descending order of probability (ties: the lower index first) into experts[t*k + j],
  // and their probabilities into weights[t*k + j], divided by their sum (in double,
  // clamped below at 2^-14, as llama.cpp) when `normalize`.
  virtual void moe_route(const float* logits, int64_t n_expert, int64_t tokens, int64_t k, bool normalize,
                         int32_t* experts, float* weights) = 0;
  // out row t = sum over j = 0..k-1, in that order, of weights[t*k + j] * FFN_e(x_t)
  // with e = experts[t*k + j] and FFN_e(x) = down_e(SiLU(gate_e x) * up_e x): each
  // product rounded, then added left to right (llama.cpp's order). Tokens are grouped
  // by expert, one matmul per chosen expert over just its tokens, and only the chosen
  // experts' matrices are read. A row's result does not depend on the other rows.
  virtual void moe_ffn(const ExpertWeights& w, const float* x, int64_t tokens, const int32_t* experts,
                       const float* weights, int64_t k, float* out) = 0;
};

// Gives back, when it ends, the activations a backend handed out in its scope.
using ActivationScope = ActivationScopeOf<Backend>;

// How results may depend on the batch. llama.cpp adds attention's products in one
// order when a batch holds one token and in another when it holds several, so its
// numbers depend on the batch. invariant (the default): every query computed in
// llama.cpp's several-token order whatever its batch, so a token's result never
// depends on the batch it came in (what pipelining, concurrent requests and replaying
// a sequence rely on). as_llama_cpp: a one-token batch in llama.cpp's one-token order,
// so that decoding token by token reproduces llama.cpp's numbers bit for bit.
enum class BatchNumerics { invariant, as_llama_cpp };

// The CPU backend over engine/cpu, with its own thread pool of `threads` threads.
std::unique_ptr<Backend> make_cpu_backend(int threads, BatchNumerics numerics = BatchNumerics::invariant);

inline state::StateStores state_stores_of(Backend& be) {
  return {[&be](const state::KvPageShape& shape) { return be.kv_page_store(shape); },
          [&be](size_t block_floats) { return be.state_block_store(block_floats); }};
}

}  // namespace pico::backend
