// The scheduler: runs many requests (sequences) at once through a Pipeline. Each step
// batches the next tokens of every active sequence: one micro-batch of the prompt for
// a sequence in prefill, its last sampled token for one in decode. Several steps may
// be in flight, so that prefill micro-batches of a sequence flow through the stages
// back to back (stage k works on chunk i+1 while stage k+1 works on chunk i); a
// sequence in decode waits for its logits before its next token.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "pipeline.hpp"
#include "sample/sampler.hpp"
#include "tokenizer/tokenizer.hpp"

namespace pico::coordinator {

struct Request {
  std::vector<int32_t> prompt;  // token ids (already with BOS when the model wants one)
  int n_predict = 128;
  sample::SamplingParams sampling;
  bool ignore_eos = false;  // generate n_predict tokens whatever they are (benchmarks)
};

struct Result {
  std::vector<int32_t> tokens;  // generated
  std::string text;
  std::vector<float> logits;    // with keep_logits: the row each generated token was sampled from
  // When each token was sampled, in seconds since the request was submitted.
  std::vector<double> token_seconds;
};

// The median time between consecutive sampled tokens of one request (seconds; 0 with
// fewer than two): unlike a mean, unmoved by a few steps that another process slowed.
double median_token_interval(const Result& result);

struct SchedulerOptions {
  int micro_batch = 32;        // prompt tokens of one sequence per step
  int max_batch_tokens = 512;  // tokens per step over all sequences
  int max_inflight = 4;        // steps in flight
  int step_timeout_ms = 30000;
  // Greedy chains (ChainGrant): with remote stages only, when one step holds every
  // active sequence and each decodes greedily (arg max only, no stop strings), the last
  // stage may run up to this many steps after it without the coordinator (0: never).
  // A request that arrives meanwhile, or a cancel, waits for the chain to end.
  int chain_steps = 8;
  int64_t ctx = 4096;          // a sequence stops at this many positions
  bool stage_stats = false;    // online engine: ask the stages for their stats when idle (for /metrics)
  int max_sequences = 0;       // online engine: sequences in the batch at once (0: no limit); others queue
  // Online engine, prompt-prefix reuse: finished sequences whose KV stays on the stages
  // for later requests sharing a prefix (0: none kept). At most cache_sequences of
  // them, holding at most cache_tokens positions (0: no limit), and, with
  // max_sequences, never more sequences holding KV than max_sequences (active ones
  // first); the least recently used goes first.
  int cache_sequences = 0;
  int64_t cache_tokens = 0;
  bool keep_logits = false;
  // Hybrid models (recurrent layers): their state cannot be cut back, so every stage
  // checkpoints it after the tokens the engine marks: every checkpoint_every prompt
  // positions, after the prompt's last token, and every checkpoint_every_gen generated
  // tokens (0: never), keeping at most checkpoint_max per sequence (0: none; no prefix
  // reuse then). A reuse starts from the newest checkpoint at or below the common prefix.
  bool recurrent = false;
  int checkpoint_every = 256;
  int checkpoint_every_gen = 64;
  int checkpoint_max = 3;
  uint64_t checkpoint_bytes = 0;  // one checkpoint over every stage (for /slots and /metrics)
};

class Scheduler {
 public:
  Scheduler(Pipeline& pipeline, const tokenizer::Tokenizer& tok, SchedulerOptions options)
      : pipeline_(pipeline), tok_(tok), options_(options) {}
  // Runs every request to completion on an Engine (engine.hpp) started for the call.
  // on_text(i, piece) streams request i's text (from the engine's thread).
  // Throws StageError when the pipeline fails (every request fails with it).
  std::vector<Result> run(const std::vector<Request>& requests,
                          const std::function<void(size_t, const std::string&)>& on_text = {});

 private:
  Pipeline& pipeline_;
  const tokenizer::Tokenizer& tok_;
  SchedulerOptions options_;
};

}  // namespace pico::coordinator
