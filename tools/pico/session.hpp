// What the single-node commands (eval, run, chat, bench) share: the engine options
// and a Session (model, backend, one sequence's KV cache) that evaluates tokens.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <ostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "backend/devices.hpp"
#include "cpu/thread_pool.hpp"
#include "gguf/reader.hpp"
#include "load_progress.hpp"
#include "model/model.hpp"
#include "model/residency.hpp"
#include "sample/sampler.hpp"
#include "stage_engine.hpp"
#include "state/kv_cache.hpp"
#include "tokenizer/tokenizer.hpp"

namespace pico::cli {

struct EngineOptions {
  std::string model_path;
  int threads = 0;
  int batch = 64;
  std::string ctk = "f16";
  std::string ctv = "f16";
  bool llama_numerics = false;  // backend::BatchNumerics::as_llama_cpp
  std::string backend = "cpu";
  int device = 0;
  std::string mem;        // --mem: bytes of weights to lock, the rest streamed
  bool prefault = false;  // --prefault
};

inline void add_engine_options(CLI::App* cmd, EngineOptions& o) {
  cmd->add_option("-m,--model", o.model_path, "GGUF model file")->required();
  cmd->add_option("-t,--threads", o.threads, "threads (default: physical cores)");
  cmd->add_option("-b,--batch-size", o.batch, "tokens per forward batch")->check(CLI::PositiveNumber);
  cmd->add_option("--ctk,--cache-type-k", o.ctk, "KV cache type of K: f16 (default), f32, q8_0, q4_0");
  cmd->add_option("--ctv,--cache-type-v", o.ctv, "KV cache type of V: f16 (default), f32, q8_0, q4_0");
  cmd->add_flag("--llama-numerics", o.llama_numerics,
                "attention sums of a one-token batch in llama.cpp's one-token order, to reproduce its "
                "token-by-token numbers bit for bit (results then depend on the batch, as llama.cpp's)");
  cmd->add_option("--backend", o.backend,
                  "cpu (default) or vulkan: the ops through Vulkan compute shaders on --device, one op at a time "
                  "(attention and the recurrent layers stay on the CPU; `pico inspect --devices` lists devices)")
      ->check(CLI::IsMember({"cpu", "vulkan"}));
  cmd->add_option("--device", o.device, "device index of --backend (default 0)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--mem", o.mem,
                  "lock up to BYTES of the weights in memory, the most valuable first (output head and norms, "
                  "attention, router, FFN, experts, embeddings), and stream the rest from the file layer by layer "
                  "(e.g. 300M, 2G; the cpu backend)");
  cmd->add_flag("--prefault", o.prefault, "read every weight at load (a fast first reply), showing progress");
}

inline GgmlType kv_type(const std::string& name) {
  const auto t = state::parse_kv_type(name);
  if (!t) throw std::invalid_argument("unknown KV cache type '" + name + "' (f16, f32, q8_0, q4_0)");
  return *t;
}

// A model, a backend and one sequence's KV cache.
struct Session {
  std::unique_ptr<gguf::Model> file;
  std::unique_ptr<model::Model> model;
  std::unique_ptr<backend::Backend> be;
  std::unique_ptr<state::KvCache> cache;
  std::unique_ptr<model::WeightResidency> residency;  // --mem, --prefault
  int batch = 64;
  // Told after each batch of an evaluation longer than one batch (a long prompt).
  std::function<void(uint64_t done, uint64_t total)> progress;
  int32_t n_past = 0;
  static constexpr uint8_t kCheckpoints = 3;

  explicit Session(const EngineOptions& o) {
    file = gguf::Model::open(o.model_path);
    model = model::Model::load(*file);
    const int threads = o.threads > 0 ? o.threads : cpu::default_thread_count();
    if (o.backend == "cpu") {
      be = backend::make_cpu_backend(threads, o.llama_numerics ? backend::BatchNumerics::as_llama_cpp
                                                               : backend::BatchNumerics::invariant);
    } else {
      if (o.llama_numerics) throw std::invalid_argument("--llama-numerics is a CPU backend mode");
      be = backend::open_backend(o.backend, o.device, threads);
    }
    model->load_weights(*be, model->all_layers());
    if (!o.mem.empty() || o.prefault) {
      if (o.backend != "cpu") throw std::invalid_argument("--mem and --prefault are the cpu backend's");
      model::ResidencyOptions r;
      if (!o.mem.empty()) r.lock_bytes = worker::parse_byte_size(o.mem);
      r.prefault = o.prefault;
      residency = std::make_unique<model::WeightResidency>(*file, model->all_layers(),
                                                          static_cast<int32_t>(model->hparams().n_layer), r,
                                                          worker::progress_bar("prefault"));
      model->set_layer_observer(residency.get());
      worker::log_residency(residency->report());
    }
    cache = model->make_cache(model->all_layers(), kv_type(o.ctk), kv_type(o.ctv), backend::state_stores_of(*be));
    batch = o.batch;
  }

  int64_t n_vocab() const { return model->hparams().n_vocab; }

  // Evaluates ids after what is cached; calls row(i, logits) for each (all_rows) or
  // for the last one only.
  template <class Fn>
  void eval(const std::vector<int32_t>& ids, bool all_rows, Fn&& row) {
    for (size_t start = 0; start < ids.size(); start += static_cast<size_t>(batch)) {
      const size_t end = std::min(ids.size(), start + static_cast<size_t>(batch));
      if (progress && ids.size() > static_cast<size_t>(batch)) progress(start, ids.size());
      std::vector<model::BatchToken> tokens;
      for (size_t i = start; i < end; ++i) tokens.push_back({0, n_past++, ids[i], all_rows || i + 1 == ids.size()});
      // A hybrid model's recurrent state cannot be cut back: keep a checkpoint after the
      // last token so that the next evaluation can reuse what this one computed.
      if (end == ids.size() && model->hparams().is_hybrid()) tokens.back().checkpoint_keep = kCheckpoints;
      const std::vector<float> logits = model->forward(*be, tokens, nullptr, model->all_layers(), *cache);
      if (all_rows) {
        for (size_t i = start; i < end; ++i) row(i, logits.data() + (i - start) * static_cast<size_t>(n_vocab()));
      } else if (end == ids.size()) {
        row(ids.size() - 1, logits.data());
      }
    }
    if (progress && ids.size() > static_cast<size_t>(batch)) progress(ids.size(), ids.size());
  }
};

// The sampling flags of run and chat, as llama.cpp's CLI names them.
inline void add_sampling_options(CLI::App* cmd, sample::SamplingParams& p) {
  cmd->add_option("--temp", p.temperature, "temperature (0: greedy)");
  cmd->add_option("--top-k", p.top_k, "top-k (0: off)");
  cmd->add_option("--top-p", p.top_p, "top-p (1: off)");
  cmd->add_option("--min-p", p.min_p, "min-p (0: off)");
  cmd->add_option("--typical", p.typical_p, "typical-p (1: off)");
  cmd->add_option("--repeat-penalty", p.repeat_penalty, "repetition penalty (1: off)");
  cmd->add_option("--repeat-last-n", p.penalty_last_n, "tokens the penalties look back over");
  cmd->add_option("--presence-penalty", p.presence_penalty, "presence penalty (0: off)");
  cmd->add_option("--frequency-penalty", p.frequency_penalty, "frequency penalty (0: off)");
  cmd->add_option("--seed", p.seed, "sampling seed (default: random)");
}

inline int64_t context_length(const Session& s, int requested) {
  if (requested > 0) return requested;
  return s.model->hparams().n_ctx_train > 0 ? s.model->hparams().n_ctx_train : 4096;
}

inline int32_t argmax(const float* logits, int64_t n) {
  return static_cast<int32_t>(std::max_element(logits, logits + n) - logits);
}

// Makes `cache_ids` (what the session's KV holds) equal to `ids`: keeps the longest
// common prefix (at least one token is always re-evaluated, for its logits), then
// evaluates the rest. `last` gets the logits after the final token.
inline void evaluate_reusing_prefix(Session& s, std::vector<int32_t>& cache_ids, const std::vector<int32_t>& ids,
                                    std::vector<float>& last) {
  size_t keep = 0;
  while (keep < cache_ids.size() && keep < ids.size() && cache_ids[keep] == ids[keep]) ++keep;
  if (keep == ids.size() && keep > 0) --keep;
  // A hybrid model goes back to its newest checkpoint at or below the common prefix.
  if (const state::RecurrentState* r = s.cache->find_recurrent(0); r && !r->can_truncate(static_cast<int64_t>(keep))) {
    size_t best = 0;
    for (int64_t p : r->checkpoint_positions()) {
      if (p <= static_cast<int64_t>(keep)) best = static_cast<size_t>(p);
    }
    keep = best;
  }
  s.cache->truncate(0, static_cast<int64_t>(keep));
  s.n_past = static_cast<int32_t>(keep);
  const std::vector<int32_t> rest(ids.begin() + static_cast<std::ptrdiff_t>(keep), ids.end());
  const int64_t nv = s.n_vocab();
  last.resize(static_cast<size_t>(nv));
  s.eval(rest, false, [&](size_t, const float* row) { std::copy(row, row + nv, last.begin()); });
  cache_ids = ids;
}

// Samples up to n_predict tokens after `last` (the logits after the context),
// streaming their text to `out`; stops at an end-of-generation token (not evaluated,
// not printed) or at the context length. Returns the generated tokens.
inline std::vector<int32_t> generate(Session& s, const tokenizer::Tokenizer& tok, sample::Sampler& sampler,
                                     std::vector<float>& last, int n_predict, int64_t ctx, std::ostream& out) {
  tokenizer::StreamDecoder decoder(tok);
  std::vector<int32_t> generated;
  const int64_t nv = s.n_vocab();
  while (static_cast<int>(generated.size()) < n_predict && s.n_past < ctx) {
    const int32_t id = sampler.sample(last);
    sampler.accept(id);
    if (tok.is_eog(id)) break;
    generated.push_back(id);
    out << decoder.push(id) << std::flush;
    s.eval({id}, false, [&](size_t, const float* row) { std::copy(row, row + nv, last.begin()); });
  }
  out << decoder.flush() << std::flush;
  return generated;
}

}  // namespace pico::cli
