// The online scheduler: a long-lived engine loop in its own thread over a Pipeline.
// submit() hands it a request with callbacks; the request joins the running batch at
// the next step (continuous batching: one prompt micro-batch per sequence in prefill,
// the last sampled token of each sequence in decode, up to max_inflight steps in
// flight). A request ends at an end-of-generation token, at max_tokens, at the
// context length, at one of its stop strings (matched across token boundaries and
// never emitted: text that could begin a stop string is held back), or when
// cancelled; its sequence is then closed on every stage, or, with
// SchedulerOptions::cache_sequences, kept (its KV stays on the stages) so that a later
// request with a common prompt prefix computes only the rest (it continues the kept
// sequence from the end of the common prefix; each stage drops the positions after it
// when that token arrives). A cancelled sequence is closed once no
// step holding its tokens is in flight (during prefill too). Callbacks run on the
// engine thread and must not block. With remote stages, a token that does not end its
// request (and whose request has no stop strings) goes on to the stages before its
// text and on_token, which then run while the stages compute.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "scheduler.hpp"
#include "layer_trace.hpp"

namespace pico::coordinator {

struct TokenProb {
  int32_t id = 0;
  float logprob = 0.0f;
};

struct TokenEvent {
  std::string text;  // text released with this token (may be empty: held back or partial UTF-8)
  int32_t id = 0;
  float logprob = 0.0f;            // log-softmax of the raw logits (when logprobs were asked)
  std::vector<TokenProb> top;      // the top_logprobs most likely tokens
  // logprob and top are the logs of the sampler chain's probabilities instead
  // (OnlineRequest::post_sampling_probs).
  bool post_sampling = false;
};

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;      // prompt tokens whose KV was reused (not computed)
  int kv_tokens = 0;          // positions the sequence's KV held at the end
  double prompt_ms = 0.0;     // first submit to first sampled token
  double predicted_ms = 0.0;  // first sampled token to the end
  std::string stopping_word;  // the stop string that ended it ("" for none)
};

// How an embedding request's hidden states become its embedding (llama.cpp's pooling
// types): none keeps one row per prompt token; mean averages them; cls takes the first
// token's, last the last token's.
enum class Pooling { none, mean, cls, last };
// Throws std::invalid_argument unless "none", "mean", "cls" or "last".
Pooling parse_pooling(const std::string& text);
const char* to_string(Pooling pooling);

struct OnlineRequest {
  std::vector<int32_t> prompt;
  int max_tokens = 128;           // < 0: no limit (the context); 0: evaluate the prompt only (KV kept for reuse)
  sample::SamplingParams sampling;
  std::vector<std::string> stop;  // stop strings
  bool ignore_eos = false;
  int logprobs = -1;              // < 0: none; >= 0: the token's logprob and this many top ones
  // With logprobs: the probabilities the sampler chain left (its candidates after every
  // stage, renormalised: llama-server's post_sampling_probs), not the raw logits'.
  bool post_sampling_probs = false;
  bool cache_prompt = true;       // reuse the KV of a kept sequence with a common prompt prefix
  // on_sampled wants every full logits row. Otherwise a request sampled greedily
  // without logprobs asks the last stage for each row's arg max only (a token id
  // instead of n_vocab floats per token), and on_sampled gets an empty row.
  bool full_logits = false;
  // An embedding instead of text: the prompt's hidden states after the output norm,
  // pooled so, go to Callbacks::on_embedding; nothing is sampled (max_tokens, the
  // sampling and the stop strings do not apply) and no kept prefix is reused (every
  // position's state is wanted).
  std::optional<Pooling> embedding;
  // Report the prompt's evaluation as it goes (Callbacks::on_prompt_progress; llama-
  // server's return_progress).
  bool return_progress = false;
  // Control tokens whose text the reply shows (a chat format's tool-call and thinking
  // tags, which the reply's parsers read: llama-server's preserved tokens).
  std::vector<int32_t> shown_tokens;
};

// How far a request's prompt is evaluated (llama-server's prompt_progress): processed
// counts the prompt's tokens in the sequence so far, the reused ones (cache) included.
struct PromptProgress {
  int total = 0, cache = 0, processed = 0;
  int64_t time_ms = 0;  // since the request started
};

struct Callbacks {
  // Every sampled token, end-of-generation ones included, with the logits row it was
  // sampled from (valid during the call; empty unless OnlineRequest::full_logits or the
  // sampling needs the full row); before on_token. Optional.
  std::function<void(int32_t id, std::span<const float> logits)> on_sampled;
  std::function<void(const TokenEvent&)> on_token;
  std::function<void(const std::string& finish_reason, const Usage&)> on_done;  // "stop" (end of generation), "stop_string", "length", "cancelled"
  std::function<void(const std::string& message)> on_error;
  // An embedding request's result, before on_done: one pooled row of n_embd values (one
  // per prompt token with Pooling::none), not normalised.
  std::function<void(std::vector<std::vector<float>> rows)> on_embedding;
  // With OnlineRequest::return_progress: once when it starts (the reused prefix counted),
  // then after each step that evaluated some of its prompt.
  std::function<void(const PromptProgress&)> on_prompt_progress;
};

// A sequence holding KV on the stages: an active request's, or a kept one (idle).
struct SlotInfo {
  int32_t id = 0;    // the sequence id on the stages
  int32_t task = 0;  // the request's id (Handle::id); 0 for a kept sequence
  int n_prompt = 0, n_cached = 0, n_decoded = 0, n_past = 0;
  bool processing = true;
  bool prefill = true;
  std::vector<int32_t> checkpoints;  // positions of its recurrent-state checkpoints (hybrid models)
  uint64_t checkpoint_bytes = 0;     // what they take over every stage
  // An active request's settings (its OnlineRequest without the prompt; null for a
  // kept sequence), and whether its released text has had a newline.
  std::shared_ptr<const OnlineRequest> settings;
  bool has_new_line = false;
};

struct EngineMetrics {
  uint64_t requests = 0, requests_failed = 0, requests_cancelled = 0, steps = 0;
  uint64_t prompt_tokens = 0;         // computed (the reused ones excluded)
  uint64_t prompt_tokens_cached = 0;  // reused from a kept sequence's KV
  uint64_t generated_tokens = 0;
  uint64_t replayed_tokens = 0;  // positions computed again after a failover (Pipeline::fail_over)
  // Sequences that resumed after a failover from a standby's copy (Pipeline::
  // copy_to_standbys) or on the workers of their lane that kept them, and the positions
  // that were not computed again thanks to it.
  uint64_t resumed_sequences = 0, resumed_tokens = 0;
  double prefill_seconds = 0.0, decode_seconds = 0.0;
  int active = 0, queued = 0;
  int64_t tokens_in_flight = 0;  // positions held by active sequences
  int kept_sequences = 0;        // idle sequences kept for prefix reuse
  int64_t kept_tokens = 0;       // positions they hold
  int64_t checkpoints = 0;       // recurrent-state checkpoints held on the stages (hybrid models)
  uint64_t checkpoint_bytes = 0;
  std::vector<StageStats> stages;  // per stage, as of the last time the engine went idle
  PipelineTimings timings;         // per stage compute/queue/transfer times (Pipeline::timings)
};

// Engine::submit refused a request because max_queued requests wait already.
class QueueFull : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The message of a prompt that does not fit the context (llama-server's words).
std::string exceeds_context_message(size_t n_tokens, int64_t ctx);

class Engine {
 public:
  class Handle {
   public:
    Handle() = default;
    void cancel();
    int32_t id() const { return id_; }

   private:
    friend class Engine;
    Handle(Engine* engine, int32_t id) : engine_(engine), id_(id) {}
    Engine* engine_ = nullptr;
    int32_t id_ = 0;
  };

  // max_queued: requests that may wait for a place in the batch (0: no limit).
  Engine(Pipeline& pipeline, const tokenizer::Tokenizer& tok, SchedulerOptions options, size_t max_queued = 0);
  ~Engine();  // stops the loop; pending requests get on_error
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Thread-safe. Throws std::invalid_argument for an empty prompt, a token id outside
  // the vocabulary or a prompt that does not fit the context; QueueFull when
  // max_queued requests wait already. Anything that fails later (building its sampler,
  // sampling, a logits row that does not fit, an allocation, a step a stage refused)
  // fails this request alone: on_error, its sequence closed; the others go on.
  Handle submit(OnlineRequest request, Callbacks callbacks);
  void stop();
  // Thread-safe: "stage I (NAME)" of the first stage found lost, empty while all are up.
  // The engine looks while idle too (every idle_check_ms), and tries to get a lost
  // stage back then (every rejoin_interval_ms).
  std::string lost_stage() const;
  static constexpr int idle_check_ms = 500;
  static constexpr int rejoin_interval_ms = 2000;

  // Runs fn on the engine thread between steps, where the pipeline may be used (it is
  // the engine thread's alone). drain: only once no step is in flight (no new step
  // starts meanwhile); fn returning true then says that it moved layers to other
  // workers (Pipeline::activate), and every sequence is replayed there, as after a
  // failover. The future holds fn's result, or its exception.
  std::future<bool> with_pipeline(std::function<bool(Pipeline&)> fn, bool drain = false);
  // Inside a draining with_pipeline fn (the engine thread, nothing in flight): the ids of
  // every sequence whose state is on the stages (running and kept), for
  // Pipeline::hand_over; nullopt when their state cannot move so (a hybrid model's
  // checkpoints stay on the worker that made them: those replay).
  std::optional<std::vector<int32_t>> sequences_on_stages() const;
  // On the engine thread (a with_pipeline fn): every sequence whose state is on the
  // stages, with the positions it holds there once the steps in flight finish, for
  // Pipeline::copy_to_standbys; empty for a hybrid model (its checkpoints stay on the
  // worker that made them) and without embedding requests (they replay in full).
  std::vector<SequenceLength> sequence_lengths() const;

  // Slots on disk (worker/slot_file.hpp), run between steps with none in flight. save:
  // idle slot `slot` (a kept sequence) to file `name` on every stage, each on its own
  // disk; restore: the file into a new kept sequence (its id in SlotFileResult::slot),
  // which later requests with a common prompt prefix continue; erase: forgets idle slot
  // `slot` (closed on every stage). The future throws std::invalid_argument for a slot
  // that is not idle, StageError when a stage refused (a restore then holds nothing).
  enum class SlotAction { save, restore, erase };
  struct SlotFileResult {
    int32_t slot = 0;
    size_t tokens = 0;
    uint64_t bytes = 0;  // the state's bytes over every stage
    double ms = 0;
  };
  std::future<SlotFileResult> slot_file(SlotAction action, int32_t slot, const std::string& name);

  std::vector<SlotInfo> slots() const;
  EngineMetrics metrics() const;
  const SchedulerOptions& options() const { return options_; }
  const tokenizer::Tokenizer& tokenizer() const { return tok_; }
  // The per-layer activations of the tokens computed while someone watches (the web UI).
  LayerTraceHub& layer_trace() { return layer_trace_; }

 private:
  struct Seq;
  struct Kept {  // a finished sequence whose KV stays on the stages
    int32_t kv_id = 0;
    std::vector<int32_t> tokens;  // one per position held
    uint64_t last_used = 0;
    std::vector<int32_t> checkpoints;  // positions its recurrent state can go back to
    uint32_t lane = 0;                 // the pipeline's lane that holds it
  };
  // Where a sequence that continues no kept one goes: the lane whose step with it is
  // shortest by the profiles and links, else the one with the fewest unfinished
  // sequences (the first such). joining: the sequence (what its logits rows return);
  // null: counted as returning full rows.
  uint32_t quietest_lane(const Seq* joining) const;
  // Marks `row` for a checkpoint when the policy wants one after it, and records it.
  void mark_checkpoint(Seq& s, model::BatchToken& row, bool prompt_end);
  // on_prompt_progress with `processed` of its prompt's tokens evaluated (return_progress only).
  void report_progress(Seq& s, int processed);
  void loop();
  void admit();
  void reuse_prefix(Seq& s);
  void evict_kept();
  void close_sequence(int32_t kv_id);
  void finish(Seq& s, const std::string& reason);
  // Fails one request (on_error); its sequence is closed once no step holds its tokens.
  void fail(Seq& s, const std::string& message);
  // Publishes which stage is lost; while idle, forgets the kept sequences when one is
  // (it comes back without their KV) and tries to get it back.
  void check_stages(bool idle);
  // A finished sequence's KV: kept for prefix reuse or closed on the stages, once no
  // step holding its tokens is in flight.
  void release_kv(Seq& s);
  ChainGrant chain_grant(const std::vector<Seq*>& seqs);
  // The text a sampled token releases (and its logprobs when asked), to on_token.
  void emit_token(Seq& s, int32_t id, std::span<const float> logits);
  void fail_all(const std::string& message);
  // After a pipeline error (every step in flight abandoned): when replicas took the
  // place of every lost worker (Pipeline::fail_over), replays every active sequence
  // there and returns true; otherwise fails every request (fail_all). `lanes` (after
  // LanesLost: only those lanes' steps were abandoned): only those lanes are mended
  // and only their sequences replay; the other lanes run on.
  bool recover(const std::string& message, std::span<const uint32_t> lanes = {});
  // Every active sequence, or only those of `lanes`, replays (see recover).
  void replay_all(std::span<const uint32_t> lanes = {});
  // Runs the with_pipeline tasks due (the draining ones only when nothing is in
  // flight); true while a draining one waits.
  bool run_pipeline_tasks(bool nothing_in_flight);
  void release(Seq& s, const std::string& text);
  // Embedding requests: the hidden states of a step's answer added to their sequences
  // (a row out of order fails its request), and a request's embedding once its prompt's
  // last step came back.
  void receive_hidden(const std::vector<Seq*>& seqs, const StepOutput& out);
  void finish_embedding(Seq& s);
  void update_slots();

  Pipeline& pipeline_;
  LayerTraceHub layer_trace_;
  const tokenizer::Tokenizer& tok_;
  SchedulerOptions options_;
  size_t max_queued_ = 0;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Seq>> incoming_;
  struct PipelineTask {
    std::function<bool(Pipeline&)> fn;
    bool drain = false;
    std::promise<bool> done;
  };
  std::deque<PipelineTask> pipeline_tasks_;
  std::vector<int32_t> cancels_;
  bool stopping_ = false;
  int32_t next_id_ = 1;
  std::vector<SlotInfo> slots_;
  EngineMetrics metrics_;
  std::string lost_stage_;
  int64_t running_ = 0;  // sequences in active_ (the places taken in the batch)

  // Engine thread only.
  std::vector<std::unique_ptr<Seq>> active_;
  std::vector<Kept> kept_;
  int32_t next_kv_id_ = 1;
  uint64_t use_tick_ = 0;
  std::chrono::steady_clock::time_point last_rejoin_{}, last_standby_rejoin_{};
  std::thread thread_;
};

// Stop-string matching for streamed text: push() returns the text that can be released
// now (no stop string can start in it); a match sets matched() and drops the rest.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  std::string push(const std::string& text);
  std::string flush() { return std::exchange(held_, std::string()); }
  bool matched() const { return matched_; }
  const std::string& word() const { return word_; }  // the stop string matched ("" before)

 private:
  std::vector<std::string> stops_;
  std::string held_;
  std::string word_;
  bool matched_ = false;
};

}  // namespace pico::coordinator
