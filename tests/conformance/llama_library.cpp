#include "llama_library.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>

namespace pico::conformance {
namespace fs = std::filesystem;
namespace {

// ---- The ABI of the shipped libllama (node-llama-cpp 3.21.1, llama.cpp v0.4.0 build).
// Enums are int-sized. Sizes and offsets were read from the library's defaults.

struct LlamaModelQuantizeParams {
  int32_t nthread;
  int32_t ftype;
  int32_t output_tensor_type;
  int32_t token_embedding_type;
  bool allow_requantize;
  bool quantize_output_tensor;
  bool only_copy;
  bool pure;
  bool keep_split;
  bool dry_run;
  const void* imatrix;
  const void* kv_overrides;
  const void* tt_overrides;
  const int32_t* prune_layers;
  size_t max_buf_size;
};
static_assert(sizeof(LlamaModelQuantizeParams) == 64);
static_assert(offsetof(LlamaModelQuantizeParams, pure) == 19);

struct LlamaModelParams {
  void* devices;
  const void* tensor_buft_overrides;
  int32_t n_gpu_layers;
  int32_t split_mode;
  int32_t load_mode;
  int32_t lazy_mode;
  int32_t main_gpu;
  const float* tensor_split;
  void* progress_callback;
  void* progress_callback_user_data;
  const void* kv_overrides;
  bool vocab_only;
  bool check_tensors;
  bool use_extra_bufts;  // weight repacking: on by default, as node-llama-cpp leaves it
  bool no_host;
  bool no_alloc;
  bool load_mtp;
};
static_assert(sizeof(LlamaModelParams) == 80);
static_assert(offsetof(LlamaModelParams, vocab_only) == 72);

struct LlamaContextParams {
  uint32_t n_ctx;
  uint32_t n_batch;
  uint32_t n_ubatch;
  uint32_t n_seq_max;
  uint32_t n_rs_seq;
  uint32_t n_outputs_max;
  uint32_t n_outputs_max_per_seq;
  int32_t n_threads;
  int32_t n_threads_batch;
  int32_t ctx_type;
  int32_t rope_scaling_type;
  int32_t pooling_type;
  int32_t attention_type;
  int32_t flash_attn_type;  // -1 auto, 0 disabled, 1 enabled
  float rope_freq_base;
  float rope_freq_scale;
  float yarn_ext_factor;
  float yarn_attn_factor;
  float yarn_beta_fast;
  float yarn_beta_slow;
  uint32_t yarn_orig_ctx;
  float defrag_thold;
  void* cb_eval;
  void* cb_eval_user_data;
  int32_t type_k;  // enum ggml_type
  int32_t type_v;
  void* abort_callback;
  void* abort_callback_data;
  bool embeddings;
  bool offload_kqv;
  bool no_perf;
  bool op_offload;
  bool swa_full;
  bool kv_unified;
  void* samplers;
  size_t n_samplers;
  void* ctx_other;
};
static_assert(sizeof(LlamaContextParams) == 160);
static_assert(offsetof(LlamaContextParams, cb_eval) == 88);
static_assert(offsetof(LlamaContextParams, type_k) == 104);
static_assert(offsetof(LlamaContextParams, embeddings) == 128);
static_assert(offsetof(LlamaContextParams, samplers) == 136);

struct LlamaBatch {
  int32_t n_tokens;
  int32_t* token;
  float* embd;
  int32_t* pos;
  int32_t* n_seq_id;
  int32_t** seq_id;
  int8_t* logits;
};

struct LlamaModel;
struct LlamaContext;
struct LlamaVocab;
constexpr int32_t kGgmlTypeF16 = 1;
constexpr int32_t kFlashAttentionDisabled = 0;

// llama.cpp's log: warnings and errors only (GGML_LOG_LEVEL_WARN 3, ERROR 4).
void quiet_log(int level, const char* text, void*) {
  if (level == 3 || level == 4) std::fputs(text, stderr);
}

template <class Fn>
Fn symbol(void* handle, const char* name, std::string& missing) {
  void* p = dlsym(handle, name);
  if (!p) missing += std::string(missing.empty() ? "" : ", ") + name;
  return reinterpret_cast<Fn>(p);
}

}  // namespace

struct LlamaLibrary::Api {
  LlamaModelQuantizeParams (*quantize_default_params)() = nullptr;
  uint32_t (*model_quantize)(const char*, const char*, const LlamaModelQuantizeParams*) = nullptr;
  LlamaModelParams (*model_default_params)() = nullptr;
  LlamaContextParams (*context_default_params)() = nullptr;
  LlamaModel* (*model_load_from_file)(const char*, LlamaModelParams) = nullptr;
  void (*model_free)(LlamaModel*) = nullptr;
  LlamaContext* (*init_from_model)(LlamaModel*, LlamaContextParams) = nullptr;
  void (*free)(LlamaContext*) = nullptr;
  const LlamaVocab* (*model_get_vocab)(const LlamaModel*) = nullptr;
  int32_t (*vocab_n_tokens)(const LlamaVocab*) = nullptr;
  int32_t (*tokenize)(const LlamaVocab*, const char*, int32_t, int32_t*, int32_t, bool, bool) = nullptr;
  LlamaBatch (*batch_init)(int32_t, int32_t, int32_t) = nullptr;
  void (*batch_free)(LlamaBatch) = nullptr;
  int32_t (*decode)(LlamaContext*, LlamaBatch) = nullptr;
  float* (*get_logits_ith)(LlamaContext*, int32_t) = nullptr;
};

namespace {

// A model and one context over it, freed together.
class Loaded {
 public:
  Loaded(const LlamaLibrary::Api& api, const fs::path& path, const LlamaEvalOptions& o, bool need_context) : api_(api) {
    LlamaModelParams model_params = api.model_default_params();
    model_params.use_extra_bufts = o.repack;
    // $PICO_LLAMA_GPU_LAYERS: a reference computed on a GPU build's device (how far
    // llama.cpp's own GPU backend lands from its CPU: the noise floor of any GPU).
    const char* gpu_layers = std::getenv("PICO_LLAMA_GPU_LAYERS");
    model_params.n_gpu_layers = gpu_layers && *gpu_layers ? std::atoi(gpu_layers) : o.gpu_layers;
    model_ = api.model_load_from_file(path.c_str(), model_params);
    if (!model_) throw std::runtime_error("llama.cpp cannot load " + path.string());
    if (!need_context) return;
    LlamaContextParams p = api.context_default_params();
    p.n_ctx = o.n_ctx;
    p.n_batch = o.batch;
    p.n_ubatch = o.batch;
    p.n_seq_max = 1;
    p.n_threads = o.threads;
    p.n_threads_batch = o.threads;
    p.flash_attn_type = kFlashAttentionDisabled;
    p.type_k = kGgmlTypeF16;
    p.type_v = kGgmlTypeF16;
    p.swa_full = true;
    p.no_perf = true;
    p.cb_eval = reinterpret_cast<void*>(o.eval_callback);
    p.cb_eval_user_data = o.eval_user_data;
    ctx_ = api.init_from_model(model_, p);
    if (!ctx_) {
      api.model_free(model_);
      throw std::runtime_error("llama.cpp cannot create a context for " + path.string());
    }
  }
  ~Loaded() {
    if (ctx_) api_.free(ctx_);
    api_.model_free(model_);
  }
  Loaded(const Loaded&) = delete;
  Loaded& operator=(const Loaded&) = delete;

  const LlamaVocab* vocab() const { return api_.model_get_vocab(model_); }
  int64_t n_vocab() const { return api_.vocab_n_tokens(vocab()); }

  // Decodes ids[first, first + count) at their positions; flags every token's logits
  // (all_logits) or only the last one's.
  void decode(const std::vector<int32_t>& ids, size_t first, size_t count, bool all_logits) {
    LlamaBatch batch = api_.batch_init(static_cast<int32_t>(count), 0, 1);
    for (size_t i = 0; i < count; ++i) {
      batch.token[i] = ids[first + i];
      batch.pos[i] = static_cast<int32_t>(first + i);
      batch.n_seq_id[i] = 1;
      batch.seq_id[i][0] = 0;
      batch.logits[i] = static_cast<int8_t>(all_logits || i + 1 == count);
    }
    batch.n_tokens = static_cast<int32_t>(count);
    const int32_t status = api_.decode(ctx_, batch);
    api_.batch_free(batch);
    if (status != 0) throw std::runtime_error("llama_decode failed: " + std::to_string(status));
  }
  const float* logits(size_t i) const { return api_.get_logits_ith(ctx_, static_cast<int32_t>(i)); }

 private:
  const LlamaLibrary::Api& api_;
  LlamaModel* model_ = nullptr;
  LlamaContext* ctx_ = nullptr;
};

}  // namespace

LlamaLibrary& LlamaLibrary::get() {
  static LlamaLibrary instance;
  return instance;
}

LlamaLibrary::LlamaLibrary() {
  const char* path = std::getenv("PICO_LLAMA_LIB");
  if (!path || !*path) {
    error_ = "PICO_LLAMA_LIB is not set (path of llama.cpp's libllama, e.g. node-llama-cpp's libllama.v0.4.0.so)";
    return;
  }
  // libllama's RUNPATH is $ORIGIN: its libggml*.so beside it load with it.
  void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    error_ = std::string("dlopen failed: ") + dlerror();
    return;
  }
  auto api = std::make_unique<Api>();
  std::string missing;
  auto backend_init = symbol<void (*)()>(handle, "llama_backend_init", missing);
  auto load_all = symbol<void (*)(const char*)>(handle, "ggml_backend_load_all_from_path", missing);
  auto log_set = symbol<void (*)(void (*)(int, const char*, void*), void*)>(handle, "llama_log_set", missing);
  api->quantize_default_params =
      symbol<decltype(api->quantize_default_params)>(handle, "llama_model_quantize_default_params", missing);
  api->model_quantize = symbol<decltype(api->model_quantize)>(handle, "llama_model_quantize", missing);
  api->model_default_params = symbol<decltype(api->model_default_params)>(handle, "llama_model_default_params", missing);
  api->context_default_params =
      symbol<decltype(api->context_default_params)>(handle, "llama_context_default_params", missing);
  api->model_load_from_file = symbol<decltype(api->model_load_from_file)>(handle, "llama_model_load_from_file", missing);
  api->model_free = symbol<decltype(api->model_free)>(handle, "llama_model_free", missing);
  api->init_from_model = symbol<decltype(api->init_from_model)>(handle, "llama_init_from_model", missing);
  api->free = symbol<decltype(api->free)>(handle, "llama_free", missing);
  api->model_get_vocab = symbol<decltype(api->model_get_vocab)>(handle, "llama_model_get_vocab", missing);
  api->vocab_n_tokens = symbol<decltype(api->vocab_n_tokens)>(handle, "llama_vocab_n_tokens", missing);
  api->tokenize = symbol<decltype(api->tokenize)>(handle, "llama_tokenize", missing);
  api->batch_init = symbol<decltype(api->batch_init)>(handle, "llama_batch_init", missing);
  api->batch_free = symbol<decltype(api->batch_free)>(handle, "llama_batch_free", missing);
  api->decode = symbol<decltype(api->decode)>(handle, "llama_decode", missing);
  api->get_logits_ith = symbol<decltype(api->get_logits_ith)>(handle, "llama_get_logits_ith", missing);
  if (!missing.empty()) {
    error_ = std::string(path) + " lacks " + missing;
    return;
  }
  // The CPU backends are plugins loaded from a directory: the library's own.
  load_all(fs::path(path).parent_path().c_str());
  log_set(quiet_log, nullptr);
  backend_init();
  api_ = api.release();  // lives as long as the process (so does the library)
  loaded_ = true;
}

uint32_t LlamaLibrary::quantize(const fs::path& in, const fs::path& out, LlamaFileType ftype, bool pure) const {
  LlamaModelQuantizeParams params = api_->quantize_default_params();
  params.nthread = 2;
  params.ftype = static_cast<int32_t>(ftype);
  params.pure = pure;
  return api_->model_quantize(in.c_str(), out.c_str(), &params);
}

std::vector<int32_t> LlamaLibrary::tokenize(const fs::path& model, const std::string& text) const {
  Loaded m(*api_, model, {}, false);
  std::vector<int32_t> ids(text.size() + 8);
  const auto length = static_cast<int32_t>(text.size());
  const int32_t n = api_->tokenize(m.vocab(), text.data(), length, ids.data(), static_cast<int32_t>(ids.size()), true, false);
  if (n < 0) throw std::runtime_error("llama_tokenize: more tokens than bytes");
  ids.resize(static_cast<size_t>(n));
  return ids;
}

LlamaLogits LlamaLibrary::logits(const fs::path& model, const std::vector<int32_t>& ids,
                                 const LlamaEvalOptions& options) const {
  Loaded m(*api_, model, options, true);
  LlamaLogits out;
  out.n_vocab = m.n_vocab();
  const auto nv = static_cast<size_t>(out.n_vocab);
  out.rows.resize(ids.size() * nv);
  for (size_t start = 0; start < ids.size(); start += options.batch) {
    const size_t count = std::min<size_t>(options.batch, ids.size() - start);
    m.decode(ids, start, count, true);
    for (size_t i = 0; i < count; ++i) std::copy_n(m.logits(i), nv, out.rows.data() + (start + i) * nv);
  }
  return out;
}

std::vector<int32_t> LlamaLibrary::greedy(const fs::path& model, const std::vector<int32_t>& ids, int count,
                                          const LlamaEvalOptions& options) const {
  Loaded m(*api_, model, options, true);
  const int64_t nv = m.n_vocab();
  std::vector<int32_t> all = ids;
  size_t last = 0;
  for (size_t start = 0; start < ids.size(); start += options.batch) {
    const size_t n = std::min<size_t>(options.batch, ids.size() - start);
    m.decode(all, start, n, false);
    last = n - 1;
  }
  std::vector<int32_t> generated;
  while (static_cast<int>(generated.size()) < count) {
    generated.push_back(argmax_row(m.logits(last), nv));
    if (static_cast<int>(generated.size()) == count) break;
    all.push_back(generated.back());
    m.decode(all, all.size() - 1, 1, false);
    last = 0;
  }
  return generated;
}

LlamaSpeed LlamaLibrary::speed(const fs::path& model, int prompt, int generate, int repeat,
                               LlamaEvalOptions options) const {
  options.n_ctx = static_cast<uint32_t>((prompt + generate + 16 + 255) / 256 * 256);
  options.batch = static_cast<uint32_t>(prompt);
  using Clock = std::chrono::steady_clock;
  const auto seconds = [](Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); };
  LlamaSpeed best;
  for (int run = 0; run < repeat; ++run) {
    Loaded m(*api_, model, options, true);
    const int64_t nv = m.n_vocab();
    std::vector<int32_t> ids;
    for (int i = 0; i < prompt; ++i) ids.push_back(static_cast<int32_t>(1000 + (static_cast<int64_t>(i) * 7919) % (nv - 2000)));
    auto start = Clock::now();
    m.decode(ids, 0, ids.size(), false);
    int32_t next = argmax_row(m.logits(ids.size() - 1), nv);  // reading the logits waits for the device
    best.prefill_tps = std::max(best.prefill_tps, prompt / seconds(start));
    start = Clock::now();
    for (int i = 0; i < generate; ++i) {
      ids.push_back(next);
      m.decode(ids, ids.size() - 1, 1, false);
      next = argmax_row(m.logits(0), nv);
    }
    best.decode_tps = std::max(best.decode_tps, generate / seconds(start));
  }
  return best;
}

int32_t argmax_row(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

}  // namespace pico::conformance
