// The engine's record of one request (engine.cpp, engine_sequences.cpp): its sampler
// and text state, and what its sequence holds on the stages.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "engine.hpp"

namespace pico::coordinator {

using Clock = std::chrono::steady_clock;

// A pick's probabilities after the sampler chain: its own (as a log) and the most
// probable candidates'.
struct PostSamplingProbs {
  float logprob = 0.0f;
  std::vector<TokenProb> top;
};

// Which prompt tokens' hidden states an embedding request pools (prompt token `index`
// of `n`), and which come back to the coordinator: for mean pooling the last stage
// sums them (in position order) and returns their mean at the last token.
inline bool wants_hidden(Pooling pooling, size_t index, size_t n) {
  switch (pooling) {
    case Pooling::cls:
      return index == 0;
    case Pooling::last:
      return index + 1 == n;
    default:
      return true;
  }
}
inline bool returns_hidden(Pooling pooling, size_t index, size_t n) {
  return pooling == Pooling::mean ? index + 1 == n : wants_hidden(pooling, index, n);
}

struct Engine::Seq {
  int32_t id = 0;     // the request's (Handle::id)
  int32_t kv_id = 0;  // the sequence's on the stages (a kept one's when its prefix is reused)
  uint32_t lane = 0;  // the pipeline's lane that holds it (Pipeline::lanes)
  OnlineRequest request;
  std::shared_ptr<const OnlineRequest> settings;  // request without its prompt, for /slots
  bool has_new_line = false;                      // a newline among the text released so far
  Callbacks callbacks;
  std::unique_ptr<sample::Sampler> sampler;
  std::unique_ptr<tokenizer::StreamDecoder> decoder;
  std::unique_ptr<StopMatcher> matcher;
  size_t prefill_sent = 0;
  int32_t n_past = 0;
  int n_cached = 0;                  // prompt tokens reused from a kept sequence
  std::vector<int32_t> kv_tokens;    // the token of each position sent (n_past of them)
  std::vector<int32_t> checkpoints;  // positions its stages checkpointed (as they evict them)
  int steps_inflight = 0;            // steps in flight holding tokens of this sequence
  // Positions every stage of its lane holds for it: those of the steps that came back
  // (for a replay on the same workers, Pipeline::kept_its_workers).
  int32_t held = 0;
  // After a failover: the tokens its lost KV held, sent again from position 0 (the
  // last one asking for logits when its step was waiting for them); batch invariance
  // makes the replayed KV and logits bit-identical to the lost ones.
  std::vector<int32_t> replay;
  size_t replay_sent = 0;
  bool replay_logits = false;
  bool argmax_only = false;          // the last stage returns its rows' arg max only
  // An embedding request's hidden states received so far, in position order (for
  // mean pooling the one mean the last stage returns).
  std::vector<std::vector<float>> hidden_rows;
  int32_t hidden_next = 0;  // the position of the next hidden state expected
  int n_decoded = 0;
  std::optional<int32_t> pending;
  // The sampler chain's probabilities for the last pick, until it is emitted
  // (OnlineRequest::post_sampling_probs).
  std::optional<PostSamplingProbs> post_probs;
  bool awaiting = false;
  bool cancelled = false;
  bool done = false;
  bool failed = false;  // its KV is closed, never kept
  bool kv_released = false;
  Clock::time_point t_start, t_first;
};

}  // namespace pico::coordinator
