// llama.cpp itself, in-process: node-llama-cpp's prebuilt libllama (its path in
// $PICO_LLAMA_LIB), loaded at run time with dlopen, for the conformance tests that
// need llama.cpp's quantizer or its logits without a node process per model.
//
// Only the few functions and structs of llama.h that the tests call are declared
// here, field for field as the shipped library lays them out (checked by the
// static_asserts in llama_library.cpp against the sizes and offsets of that build).
// The CPU backend plugins (libggml-cpu-<variant>.so) load from the library's own
// directory: ggml picks the variant that fits the host best, as node-llama-cpp does.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace pico::conformance {

// llama_ftype numbers (include/llama.h).
enum class LlamaFileType : int32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q8_0 = 7,
  Q5_0 = 8,
  Q5_1 = 9,
  Q2_K = 10,
  Q3_K_S = 11,
  Q3_K_M = 12,
  Q4_K_S = 14,
  Q4_K_M = 15,
  Q5_K_S = 16,
  Q5_K_M = 17,
  Q6_K = 18,
  IQ4_NL = 25,
  BF16 = 32,
};

// How llama.cpp evaluates: a context of n_ctx positions (one sequence), prompts in
// batches of `batch` tokens (n_batch = n_ubatch), KV cache F16 (as pico's default),
// no flash attention (pico follows the non-flash path), full-size sliding-window
// cache, `threads` threads. `repack`: llama.cpp's weight repacking for its CPU
// (use_extra_bufts, on by default as node-llama-cpp leaves it); off, every matrix
// multiplies through ggml's plain per-row dot products (or llamafile's sgemm).
// `eval_callback`: llama.cpp's cb_eval (ggml_backend_sched_eval_callback), called with
// each graph node (a ggml_tensor*) first to ask whether to show it, then once computed.
using LlamaEvalCallback = bool (*)(void* tensor, bool ask, void* user_data);
struct LlamaEvalOptions {
  uint32_t n_ctx = 256;
  uint32_t batch = 64;
  int32_t threads = 2;
  bool repack = true;
  LlamaEvalCallback eval_callback = nullptr;
  void* eval_user_data = nullptr;
  // Layers on the library's GPU backend (a Vulkan build's device; 0: none, -1: all).
  int32_t gpu_layers = 0;
};

// llama.cpp's speed on a file, measured as `pico bench` measures pico's (LlamaLibrary::speed).
struct LlamaSpeed {
  double prefill_tps = 0;
  double decode_tps = 0;
};

// The logits after every token of a prompt: rows of n_vocab floats.
struct LlamaLogits {
  int64_t n_vocab = 0;
  std::vector<float> rows;
};

class LlamaLibrary {
 public:
  // The process-wide instance (loads $PICO_LLAMA_LIB on first use).
  static LlamaLibrary& get();
  bool loaded() const { return loaded_; }
  const std::string& error() const { return error_; }

  // llama_model_quantize with the library's default parameters but `ftype`, `pure`
  // and 2 threads. Returns llama.cpp's status (0: success).
  uint32_t quantize(const std::filesystem::path& in, const std::filesystem::path& out, LlamaFileType ftype,
                    bool pure = false) const;

  // llama.cpp's tokenization of `text` with the model's special tokens (BOS/EOS as
  // its metadata says), special-token texts not parsed. Throws std::runtime_error.
  std::vector<int32_t> tokenize(const std::filesystem::path& model, const std::string& text) const;

  // Evaluates `ids` (exactly as given) and returns the logits after each.
  LlamaLogits logits(const std::filesystem::path& model, const std::vector<int32_t>& ids,
                     const LlamaEvalOptions& options = {}) const;

  // Evaluates `ids`, then generates `count` tokens greedily (argmax of the logits,
  // lowest id on ties), one decode per token.
  std::vector<int32_t> greedy(const std::filesystem::path& model, const std::vector<int32_t>& ids, int count,
                              const LlamaEvalOptions& options = {}) const;

  // The prefill of a `prompt`-token prompt in one batch (token i = 1000 + i * 7919 mod
  // (n_vocab - 2000), pico bench's prompt), then `generate` greedy tokens one decode
  // each; options.n_ctx and batch are set to fit. Each figure is the best of `repeat`
  // runs, each on a fresh context; the time of a step includes reading its logits back.
  LlamaSpeed speed(const std::filesystem::path& model, int prompt, int generate, int repeat,
                   LlamaEvalOptions options) const;

  struct Api;  // the library's functions (llama_library.cpp)

 private:
  LlamaLibrary();
  const Api* api_ = nullptr;
  bool loaded_ = false;
  std::string error_;
};

// argmax over a row, the lowest index on ties (as both engines' greedy samplers).
int32_t argmax_row(const float* row, int64_t n);

}  // namespace pico::conformance
