#include "engine.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <stdexcept>

#include "engine_sequence.hpp"
#include "sample/argmax.hpp"

namespace pico::coordinator {

namespace {
double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

std::string exceeds_context_message(size_t n_tokens, int64_t ctx) {
  return "request (" + std::to_string(n_tokens) + " tokens) exceeds the available context size (" +
         std::to_string(ctx) + " tokens), try increasing it";
}

std::string StopMatcher::push(const std::string& text) {
  if (matched_) return {};
  held_ += text;
  size_t first = std::string::npos;
  for (const auto& stop : stops_) {
    if (stop.empty()) continue;
    const size_t at = held_.find(stop);
    if (at < first) first = at, word_ = stop;  // the earliest; of those at one place, the first listed
  }
  if (first != std::string::npos) {
    matched_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold back the longest tail of held_ that begins some stop string.
  size_t keep = 0;
  for (const auto& stop : stops_) {
    for (size_t k = std::min(stop.size() - (stop.empty() ? 0 : 1), held_.size()); k > keep; --k) {
      if (held_.compare(held_.size() - k, k, stop, 0, k) == 0) {
        keep = k;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

void Engine::Handle::cancel() {
  if (!engine_) return;
  {
    std::lock_guard lock(engine_->mutex_);
    engine_->cancels_.push_back(id_);
  }
  engine_->cv_.notify_all();
}

Engine::Engine(Pipeline& pipeline, const tokenizer::Tokenizer& tok, SchedulerOptions options, size_t max_queued)
    : pipeline_(pipeline), tok_(tok), options_(options), max_queued_(max_queued) {
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() { stop(); }

void Engine::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Engine::Handle Engine::submit(OnlineRequest request, Callbacks callbacks) {
  if (request.prompt.empty()) throw std::invalid_argument("the prompt has no tokens");
  if (static_cast<int64_t>(request.prompt.size()) >= options_.ctx) {
    throw std::invalid_argument(exceeds_context_message(request.prompt.size(), options_.ctx));
  }
  for (int32_t t : request.prompt) {
    if (t < 0 || static_cast<size_t>(t) >= tok_.vocab_size()) {
      throw std::invalid_argument("token id " + std::to_string(t) + " is out of the vocabulary");
    }
  }
  auto s = std::make_unique<Seq>();
  // The settings /slots shows: the request but its prompt, copied once.
  std::vector<int32_t> prompt = std::move(request.prompt);
  request.prompt.clear();
  s->settings = std::make_shared<const OnlineRequest>(request);
  request.prompt = std::move(prompt);
  s->request = std::move(request);
  s->callbacks = std::move(callbacks);
  std::lock_guard lock(mutex_);
  if (stopping_) throw std::runtime_error("the engine is stopping");
  // Waiting: the requests that will not find a place in the batch when the engine
  // admits the incoming ones.
  const size_t free_places = options_.max_sequences > 0
                                 ? static_cast<size_t>(std::max<int64_t>(0, options_.max_sequences - running_))
                                 : incoming_.size() + 1;
  if (max_queued_ > 0 && incoming_.size() >= free_places && incoming_.size() - free_places >= max_queued_) {
    throw QueueFull("the request queue is full (" + std::to_string(max_queued_) + " requests wait)");
  }
  s->id = next_id_++;
  const int32_t id = s->id;
  incoming_.push_back(std::move(s));
  ++metrics_.queued;
  cv_.notify_all();
  return Handle(this, id);
}

std::string Engine::lost_stage() const {
  std::lock_guard lock(mutex_);
  return lost_stage_;
}

std::vector<SlotInfo> Engine::slots() const {
  std::lock_guard lock(mutex_);
  return slots_;
}

EngineMetrics Engine::metrics() const {
  EngineMetrics m;
  {
    std::lock_guard lock(mutex_);
    m = metrics_;
  }
  m.timings = pipeline_.timings();  // thread-safe on its own
  return m;
}

namespace {
// The sampler chain's probabilities for a pick (llama-server's post_sampling_probs):
// the candidates every stage kept, renormalised, as the free pick saw them (a grammar
// that refused it is not among the stages, as in llama.cpp's sampler); the pick's own
// (log 0 when the chain had dropped it) and the n most probable.
PostSamplingProbs post_sampling_probs(const sample::Sampler& sampler, std::span<const float> logits, int32_t id,
                                      int n) {
  sample::Candidates c = sampler.filter(logits);
  c.softmax();
  PostSamplingProbs out{-std::numeric_limits<float>::infinity(), {}};
  for (const sample::Candidate& candidate : c.items) {
    if (candidate.id == id) out.logprob = std::log(candidate.p);
  }
  const size_t top = std::min(static_cast<size_t>(std::max(n, 0)), c.items.size());
  for (size_t j = 0; j < top; ++j) out.top.push_back({c.items[j].id, std::log(c.items[j].p)});
  return out;
}
}  // namespace

void Engine::emit_token(Seq& s, int32_t id, std::span<const float> logits) {
  TokenEvent ev;
  ev.id = id;
  if (s.post_probs) {
    ev.post_sampling = true;
    ev.logprob = s.post_probs->logprob;
    ev.top = std::move(s.post_probs->top);
    s.post_probs.reset();
  } else if (s.request.logprobs >= 0) {
    const float mx = *std::max_element(logits.begin(), logits.end());
    double sum = 0.0;
    for (float v : logits) sum += std::exp(static_cast<double>(v - mx));
    const float lse = mx + static_cast<float>(std::log(sum));
    ev.logprob = logits[static_cast<size_t>(id)] - lse;
    const size_t n = std::min(static_cast<size_t>(s.request.logprobs), logits.size());
    if (n > 0) {
      std::vector<int32_t> idx(logits.size());
      std::iota(idx.begin(), idx.end(), 0);
      std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(n), idx.end(),
                        [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
      for (size_t j = 0; j < n; ++j) ev.top.push_back({idx[j], logits[static_cast<size_t>(idx[j])] - lse});
    }
  }
  ev.text = s.matcher->push(s.decoder->push(id));
  if (ev.text.find('\n') != std::string::npos) s.has_new_line = true;
  if (s.callbacks.on_token) s.callbacks.on_token(ev);
}

void Engine::release(Seq& s, const std::string& text) {
  if (text.empty() || !s.callbacks.on_token) return;
  if (text.find('\n') != std::string::npos) s.has_new_line = true;
  TokenEvent ev;
  ev.text = text;
  ev.id = -1;
  s.callbacks.on_token(ev);
}

void Engine::finish(Seq& s, const std::string& reason) {
  if (s.done) return;
  s.done = true;
  if (!s.cancelled) {
    // Release what the decoder and the stop matcher still hold (none after a stop match).
    std::string tail = s.matcher->push(s.decoder->flush());
    if (!s.matcher->matched()) tail += s.matcher->flush();
    release(s, tail);
  }
  // A step of a greedy chain may still hold its tokens: then its KV goes once that
  // step finished.
  if (s.steps_inflight == 0) release_kv(s);
  const auto now = Clock::now();
  Usage u;
  u.prompt_tokens = static_cast<int>(s.request.prompt.size());
  u.completion_tokens = s.n_decoded;
  u.cached_tokens = s.n_cached;
  u.kv_tokens = s.n_past;
  if (s.n_decoded > 0) {
    u.prompt_ms = seconds_between(s.t_start, s.t_first) * 1e3;
    u.predicted_ms = seconds_between(s.t_first, now) * 1e3;
  }
  if (s.cancelled) {
    std::lock_guard lock(mutex_);
    ++metrics_.requests_cancelled;
  }
  u.stopping_word = s.matcher->word();
  if (s.callbacks.on_done) s.callbacks.on_done(s.matcher->matched() ? "stop_string" : reason, u);
}

void Engine::fail(Seq& s, const std::string& message) {
  if (s.done) return;
  s.done = true;
  s.failed = true;
  spdlog::warn("request {}: {}", s.id, message);
  if (s.steps_inflight == 0) release_kv(s);
  {
    std::lock_guard lock(mutex_);
    ++metrics_.requests_failed;
  }
  if (s.callbacks.on_error) s.callbacks.on_error(message);
}


void Engine::update_slots() {
  std::vector<SlotInfo> slots;
  int64_t positions = 0;
  for (const auto& s : active_) {
    if (s->done) continue;
    slots.push_back({s->kv_id, s->id, static_cast<int>(s->request.prompt.size()), s->n_cached, s->n_decoded,
                     s->n_past, true, s->prefill_sent < s->request.prompt.size(), s->checkpoints,
                     s->checkpoints.size() * options_.checkpoint_bytes, s->settings, s->has_new_line});
    positions += s->n_past;
  }
  const int active = static_cast<int>(slots.size());
  int64_t kept_positions = 0;
  for (const auto& k : kept_) {
    const int n = static_cast<int>(k.tokens.size());
    slots.push_back({k.kv_id, 0, 0, 0, 0, n, false, false, k.checkpoints, k.checkpoints.size() * options_.checkpoint_bytes,
                     nullptr, false});
    kept_positions += n;
  }
  int64_t checkpoints = 0;
  for (const auto& slot : slots) checkpoints += static_cast<int64_t>(slot.checkpoints.size());
  std::lock_guard lock(mutex_);
  metrics_.active = active;
  metrics_.tokens_in_flight = positions;
  metrics_.kept_sequences = static_cast<int>(kept_.size());
  metrics_.kept_tokens = kept_positions;
  metrics_.checkpoints = checkpoints;
  metrics_.checkpoint_bytes = static_cast<uint64_t>(checkpoints) * options_.checkpoint_bytes;
  slots_ = std::move(slots);
}

void Engine::admit() {
  std::vector<int32_t> cancels;
  std::vector<std::unique_ptr<Seq>> dropped;  // cancelled while queued
  {
    std::lock_guard lock(mutex_);
    cancels.swap(cancels_);
    for (int32_t id : cancels) {
      for (auto it = incoming_.begin(); it != incoming_.end(); ++it) {
        if ((*it)->id != id) continue;
        dropped.push_back(std::move(*it));
        incoming_.erase(it);
        --metrics_.queued;
        break;
      }
    }
    while (!incoming_.empty() &&
           (options_.max_sequences <= 0 || static_cast<int>(active_.size()) < options_.max_sequences)) {
      auto s = std::move(incoming_.front());
      incoming_.pop_front();
      --metrics_.queued;
      ++metrics_.requests;
      active_.push_back(std::move(s));
      running_ = static_cast<int64_t>(active_.size());
    }
  }
  // A lost stage comes back (Pipeline::submit rejoins it) without the KV of the kept
  // sequences: forget them all before one is reused.
  const bool admitted =
      std::any_of(active_.begin(), active_.end(), [](const auto& s) { return !s->sampler && !s->done; });
  if (admitted && !kept_.empty()) {
    if (!pipeline_.lost_stage().empty()) {
      for (const auto& k : kept_) close_sequence(k.kv_id);
      kept_.clear();
    }
  }
  for (auto& s : active_) {
    if (s->sampler || s->done) continue;  // admitted before
    // A request whose sampler cannot be built (invalid parameters) or that runs out of
    // memory here fails alone, before it holds any KV.
    try {
      s->sampler = std::make_unique<sample::Sampler>(s->request.sampling);
      for (int32_t t : s->request.prompt) s->sampler->remember(t);
      s->decoder = std::make_unique<tokenizer::StreamDecoder>(tok_, false, s->request.shown_tokens);
      s->matcher = std::make_unique<StopMatcher>(s->request.stop);
    } catch (const std::exception& e) {
      s->kv_released = true;  // no sequence yet
      fail(*s, std::string("the request cannot start: ") + e.what());
      continue;
    }
    s->argmax_only = s->request.sampling.argmax_suffices() && s->request.logprobs < 0 && !s->request.full_logits &&
                     !s->request.embedding;
    if (s->request.embedding) s->request.cache_prompt = false;  // every position's hidden state is wanted
    reuse_prefix(*s);
    evict_kept();  // the new sequence may push the kept ones over the bounds
    {
      std::lock_guard lock(mutex_);
      metrics_.prompt_tokens += s->request.prompt.size() - static_cast<size_t>(s->n_cached);
      metrics_.prompt_tokens_cached += static_cast<uint64_t>(s->n_cached);
    }
    s->t_start = Clock::now();
    report_progress(*s, s->n_cached);
  }
  for (auto& s : dropped) {
    {
      std::lock_guard lock(mutex_);
      ++metrics_.requests_cancelled;
    }
    Usage u;
    u.prompt_tokens = static_cast<int>(s->request.prompt.size());
    if (s->callbacks.on_done) s->callbacks.on_done("cancelled", u);
  }
  for (int32_t id : cancels) {
    for (auto& s : active_) {
      if (s->id != id || s->done) continue;
      s->cancelled = true;
      // Closed once no step holding its tokens is in flight, so that no stage sees a
      // token of it after the close.
      if (s->steps_inflight == 0) finish(*s, "cancelled");
    }
  }
}

// A step of decode rows only, with nothing else in flight, may start a greedy chain
// when it holds every active sequence (no other would wait for the chain to end), no
// request is queued, and each of its sequences decodes greedily without stop strings.
// The chain never runs past a sequence's max_tokens or the context: chained step j
// yields token n_decoded + 1 + j at position n_past - 1 + j.
ChainGrant Engine::chain_grant(const std::vector<Seq*>& seqs) {
  if (options_.chain_steps <= 0 || !pipeline_.chains_possible() || seqs.empty()) return {};
  {
    std::lock_guard lock(mutex_);
    if (!incoming_.empty()) return {};
  }
  const auto waiting = std::count_if(active_.begin(), active_.end(), [](const auto& s) { return !s->done; });
  if (static_cast<size_t>(waiting) != seqs.size()) return {};
  int64_t steps = options_.chain_steps;
  bool stop_at_eog = false;
  for (const Seq* s : seqs) {
    if (!s->argmax_only || !s->request.stop.empty() || s->cancelled) return {};
    if (s->request.max_tokens > 0) steps = std::min<int64_t>(steps, s->request.max_tokens - s->n_decoded - 1);
    if (options_.recurrent && options_.checkpoint_max > 0 && options_.checkpoint_every_gen > 0) {
      // Chained rows carry no checkpoint marks: end the chain before the next one due
      // (chained step j's row leaves n_past + j positions).
      const int64_t every = options_.checkpoint_every_gen;
      const int64_t generated = s->n_past - static_cast<int64_t>(s->request.prompt.size());
      steps = std::min<int64_t>(steps, every - (generated % every + every) % every - 1);
    }
    steps = std::min<int64_t>(steps, options_.ctx - s->n_past);
    stop_at_eog = stop_at_eog || !s->request.ignore_eos;
  }
  if (steps <= 0) return {};
  ChainGrant grant;
  grant.steps = static_cast<uint32_t>(steps);
  if (stop_at_eog) grant.stop_tokens = tok_.vocab().eog_tokens();
  return grant;
}

void Engine::loop() {
  struct Inflight {
    uint64_t step = 0;  // the pipeline's id
    uint32_t lane = 0;  // the pipeline's lane it runs on
    Clock::time_point submitted;
    int prefill = 0, decode = 0;
    std::vector<Seq*> seqs;   // with tokens in this step
    std::vector<Seq*> wants;  // with a logits row in this step (to sample from)
    // Sequences that asked for prompt progress, with how much of their prompt is
    // evaluated once this step is.
    std::vector<std::pair<Seq*, int>> progress = {};
    // Per sequence in seqs, the positions it holds once this step is done (empty for a
    // chained step: not counted as held).
    std::vector<int32_t> ends = {};
  };
  std::deque<Inflight> inflight;
  // A sequence leaves active_ once done and no step in flight holds its tokens (steps
  // keep pointers to their sequences).
  auto finished_and_released = [](const std::unique_ptr<Seq>& s) { return s->done && s->steps_inflight == 0; };
  auto erase_finished = [&] {
    std::erase_if(active_, finished_and_released);
    std::lock_guard lock(mutex_);
    running_ = static_cast<int64_t>(active_.size());
  };
  // After a pipeline error: the steps it abandoned. LanesLost names the lanes whose
  // steps alone are gone (returned); any other error abandons every step (empty).
  auto forget_steps = [&](const std::exception& e) {
    const auto* lanes_lost = dynamic_cast<const LanesLost*>(&e);
    if (!lanes_lost) {
      inflight.clear();
      return std::vector<uint32_t>{};
    }
    const std::vector<uint32_t>& lost = lanes_lost->lanes();
    std::erase_if(inflight, [&](const Inflight& f) { return std::find(lost.begin(), lost.end(), f.lane) != lost.end(); });
    return lost;
  };
  size_t rr = 0;
  auto last_done = Clock::now();
  bool stats_stale = options_.stage_stats;
  // Fills the pipeline with the next tokens of the active sequences; false when the
  // pipeline failed (every request then failed and active_ is empty).
  // A with_pipeline task that moves layers waits for the steps in flight to finish; no
  // step starts meanwhile, not even the next one of a token just sampled.
  bool draining = false;
  std::function<bool(uint32_t)> fill_lane;
  std::function<bool()> fill;
  fill = [&]() -> bool {
    if (draining) return true;
    // The last stage starts the next steps of a greedy chain itself.
    if (pipeline_.chain_running()) return true;
    // Each lane of the pipeline (Pipeline::lanes) runs the steps of its own sequences.
    for (const uint32_t lane : pipeline_.lanes()) {
      if (!fill_lane(lane)) return false;
    }
    return true;
  };
  fill_lane = [&](uint32_t lane) -> bool {
    // Decoding sequences are split into one group per stage (up to max_inflight), so
    // that with several stages each works on its own group at once instead of all
    // stages taking turns on one batch; with one stage a single group is best.
    int decoding = 0;
    for (const auto& s : active_) {
      if (s->lane == lane && !s->done && !s->cancelled && s->prefill_sent == s->request.prompt.size()) ++decoding;
    }
    const int groups = std::max(1, std::min(static_cast<int>(pipeline_.size()), options_.max_inflight));
    const int decode_group = (decoding + groups - 1) / groups;
    // At most `groups` steps with decoding tokens in flight: a group whose step came back
    // while another group's is out waits for it, and the two merge. Otherwise sequences
    // whose prompts ended in different steps stay in different steps for good, and a
    // one-stage pipeline runs 8 streams as two batches of 4, reading the weights twice.
    auto decode_steps = [&] {
      return static_cast<int>(std::count_if(inflight.begin(), inflight.end(),
                                            [&](const Inflight& f) { return f.lane == lane && f.decode > 0; }));
    };
    auto lane_steps = [&] {
      return static_cast<int>(
          std::count_if(inflight.begin(), inflight.end(), [&](const Inflight& f) { return f.lane == lane; }));
    };

    // Fill the lane.
    while (lane_steps() < options_.max_inflight && !active_.empty()) {
      std::vector<model::BatchToken> batch;
      std::vector<protocol::LogitsOutput> outputs;  // per batch row
      bool any_reduced = false;  // a row asked as arg max or hidden state
      // last: the prompt's last token (mean pooling ends there).
      auto output = [&](const Seq& s, bool logits, bool last = false) {
        const bool hidden = logits && s.request.embedding.has_value();
        const bool argmax = logits && s.argmax_only;
        any_reduced = any_reduced || argmax || hidden;
        if (hidden && *s.request.embedding == Pooling::mean) {
          outputs.push_back(last ? protocol::LogitsOutput::MEAN_END : protocol::LogitsOutput::MEAN_ADD);
        } else {
          outputs.push_back(hidden   ? protocol::LogitsOutput::HIDDEN
                            : argmax ? protocol::LogitsOutput::ARGMAX
                                     : protocol::LogitsOutput::FULL);
        }
      };
      std::vector<Seq*> seqs, wants;
      std::vector<int32_t> ends;
      std::vector<std::pair<Seq*, int>> progress;
      int budget = options_.max_batch_tokens, prefill = 0, decode = 0;
      const int decode_room = decode_steps() < groups ? decode_group : 0;
      for (size_t k = 0; k < active_.size() && budget > 0; ++k) {
        Seq& s = *active_[(rr + k) % active_.size()];
        if (s.lane != lane || s.done || s.awaiting || s.cancelled) continue;
        const auto& prompt = s.request.prompt;
        if (s.replay_sent < s.replay.size()) {
          // After a failover: what the lost KV held, as a prefill, before anything new.
          const size_t n = std::min({s.replay.size() - s.replay_sent, static_cast<size_t>(options_.micro_batch),
                                     static_cast<size_t>(budget)});
          for (size_t j = 0; j < n; ++j) {
            const int32_t t = s.replay[s.replay_sent++];
            const bool logits = s.replay_sent == s.replay.size() && s.replay_logits;
            s.kv_tokens.push_back(t);
            batch.push_back({s.kv_id, s.n_past++, t, logits});
            mark_checkpoint(s, batch.back(), batch.back().pos + 1 == static_cast<int32_t>(prompt.size()));
            output(s, logits);
          }
          seqs.push_back(&s);
          ends.push_back(s.n_past);
          budget -= static_cast<int>(n);
          prefill += static_cast<int>(n);
          if (s.replay_sent == s.replay.size()) {
            s.replay.clear();
            s.replay_sent = 0;
            if (s.replay_logits) {
              s.awaiting = true;
              wants.push_back(&s);
            }
          }
        } else if (s.prefill_sent < prompt.size()) {
          const size_t n = std::min({prompt.size() - s.prefill_sent, static_cast<size_t>(options_.micro_batch),
                                     static_cast<size_t>(budget)});
          for (size_t j = 0; j < n; ++j) {
            const bool last = s.prefill_sent + 1 == prompt.size();
            const bool wanted = s.request.embedding ? wants_hidden(*s.request.embedding, s.prefill_sent, prompt.size()) : last;
            s.kv_tokens.push_back(prompt[s.prefill_sent]);
            batch.push_back({s.kv_id, s.n_past++, prompt[s.prefill_sent++], wanted});
            mark_checkpoint(s, batch.back(), last);
            output(s, wanted, last);
          }
          seqs.push_back(&s);
          ends.push_back(s.n_past);
          if (s.request.return_progress) progress.emplace_back(&s, static_cast<int>(s.prefill_sent));
          budget -= static_cast<int>(n);
          prefill += static_cast<int>(n);
          if (s.prefill_sent == prompt.size()) {
            s.awaiting = true;
            wants.push_back(&s);
          }
        } else if (s.pending && decode < decode_room) {
          s.kv_tokens.push_back(*s.pending);
          batch.push_back({s.kv_id, s.n_past++, *s.pending, true});
          mark_checkpoint(s, batch.back(), false);
          output(s, true);
          seqs.push_back(&s);
          ends.push_back(s.n_past);
          wants.push_back(&s);
          s.pending.reset();
          s.awaiting = true;
          --budget;
          ++decode;
        }
      }
      rr = (rr + 1) % active_.size();
      if (batch.empty()) break;
      const ChainGrant chain = inflight.empty() && prefill == 0 ? chain_grant(seqs) : ChainGrant{};
      // While the web UI's heatmap is open, every stage reports the tokens' per-layer RMS.
      if (layer_trace_.watched()) {
        for (model::BatchToken& t : batch) t.trace = true;
      }
      uint64_t step_id = 0;
      try {
        step_id = pipeline_.submit(batch,
                                   any_reduced ? std::span<const protocol::LogitsOutput>(outputs)
                                               : std::span<const protocol::LogitsOutput>(),
                                   chain, lane);
      } catch (const std::exception& e) {
        spdlog::error("pipeline: {}", e.what());
        const std::vector<uint32_t> lost = forget_steps(e);
        // Replicas took over: the replay goes out now, on the lanes there are now.
        if (recover(e.what(), lost)) return fill();
        stats_stale = false;
        check_stages(false);
        return false;
      }
      for (Seq* sp : seqs) ++sp->steps_inflight;
      inflight.push_back(
          {step_id, lane, Clock::now(), prefill, decode, std::move(seqs), std::move(wants), std::move(progress),
           std::move(ends)});
    }
    return true;
  };
  while (true) {
    if (stats_stale && active_.empty() && inflight.empty()) {
      // Idle: nothing in flight, so a remote stage can answer a stats request.
      std::vector<StageStats> stages;
      try {
        for (size_t i = 0; i < pipeline_.size(); ++i) stages.push_back(pipeline_.stage(i).stats());
        std::lock_guard lock(mutex_);
        metrics_.stages = std::move(stages);
      } catch (const std::exception& e) {
        spdlog::warn("stage stats: {}", e.what());
      }
      stats_stale = false;
    }
    if (active_.empty() && inflight.empty()) {
      // Idle: wakes now and then to see whether a stage was lost (for /health).
      bool work = false;
      {
        std::unique_lock lock(mutex_);
        work = cv_.wait_for(lock, std::chrono::milliseconds(idle_check_ms), [&] {
          return stopping_ || !incoming_.empty() || !cancels_.empty() || !pipeline_tasks_.empty();
        });
        if (stopping_) break;
      }
      check_stages(true);
      if (!work) continue;
    }
    admit();
    stats_stale = options_.stage_stats;  // a cancel may have closed a sequence without a step
    erase_finished();

    draining = run_pipeline_tasks(inflight.empty());
    fill();
    update_slots();
    if (inflight.empty()) continue;

    StepOutput out;
    try {
      out = pipeline_.wait(options_.step_timeout_ms);
    } catch (const StepRefused& e) {
      // Only the requests of that step fail; the other steps go on.
      auto it = std::find_if(inflight.begin(), inflight.end(), [&](const Inflight& f) { return f.step == e.step(); });
      if (it == inflight.end()) {
        spdlog::error("pipeline: {} (a step not in flight)", e.what());
        fail_all(e.what());
        inflight.clear();
        continue;
      }
      const Inflight refused = std::move(*it);
      inflight.erase(it);
      for (Seq* sp : refused.seqs) {
        --sp->steps_inflight;
        fail(*sp, std::string("a stage refused the step: ") + e.what());
        if (sp->done && sp->steps_inflight == 0) release_kv(*sp);
      }
      erase_finished();
      update_slots();
      continue;
    } catch (const std::exception& e) {
      spdlog::error("pipeline: {}", e.what());
      const std::vector<uint32_t> lost = forget_steps(e);
      if (!recover(e.what(), lost)) {
        stats_stale = false;
        check_stages(false);
      }
      continue;
    }
    const auto now = Clock::now();
    if (!out.traces.empty()) layer_trace_.publish(out, static_cast<int32_t>(pipeline_.stage(0).info().identity.n_layer));
    // Steps of different lanes finish in any order; within a lane, in the order submitted.
    const auto finished =
        std::find_if(inflight.begin(), inflight.end(), [&](const Inflight& f) { return f.step == out.step; });
    if (finished == inflight.end()) {
      spdlog::error("pipeline: an answer to step {}, which is not in flight", out.step);
      fail_all("the pipeline answered a step not in flight");
      inflight.clear();
      continue;
    }
    const Inflight step = std::move(*finished);
    inflight.erase(finished);
    for (Seq* sp : step.seqs) --sp->steps_inflight;
    for (size_t k = 0; k < step.ends.size(); ++k) step.seqs[k]->held = std::max(step.seqs[k]->held, step.ends[k]);
    // A greedy chain: the last stage already sent the next step, with these rows' arg
    // maxes, and it is in flight now.
    if (out.chained) {
      for (Seq* sp : step.seqs) ++sp->steps_inflight;
      inflight.push_back({out.step + 1, step.lane, now, 0, step.decode, step.seqs, step.wants});
    }
    {
      // Wall time of this step not already counted for the step before it, split by tokens.
      const double dt = seconds_between(std::max(step.submitted, last_done), now);
      const int total = std::max(1, step.prefill + step.decode);
      std::lock_guard lock(mutex_);
      metrics_.prefill_seconds += dt * step.prefill / total;
      metrics_.decode_seconds += dt * step.decode / total;
      ++metrics_.steps;
    }
    last_done = now;
    stats_stale = options_.stage_stats;
    for (const auto& [sp, processed] : step.progress) {
      if (!sp->done && !sp->cancelled) report_progress(*sp, processed);
    }

    for (Seq* sp : step.seqs) {
      if (sp->cancelled && !sp->done && sp->steps_inflight == 0) finish(*sp, "cancelled");
      if (sp->done && sp->steps_inflight == 0) release_kv(*sp);
    }
    // Sampling first, and with remote stages the next step is submitted as soon as
    // every sequence has its token: the text and callbacks of a sequence that goes on
    // (no stop strings, no limit reached) then run while the stages compute. (A local
    // stage computes inside submit: there its text goes out first, as it is ready.)
    const bool overlap = pipeline_.stage(0).remote();
    auto at_limit = [&](const Seq& s) {
      return (s.request.max_tokens > 0 && s.n_decoded >= s.request.max_tokens) || s.n_past >= options_.ctx;
    };
    struct Deferred {
      Seq* seq;
      size_t row;
      int32_t id;
    };
    std::vector<Deferred> deferred;
    int generated = 0;
    // The answer's rows must fit it: one arg max entry per row when any, each full row
    // inside the values received, each token inside the vocabulary. A row that does
    // not fails its request only.
    const bool argmax_fits = out.argmax.empty() || out.argmax.size() == out.seq_ids.size();
    const size_t n_vocab = out.n_vocab > 0 ? static_cast<size_t>(out.n_vocab) : 0;
    size_t full_rows = 0;  // full rows before row r
    std::vector<Seq*> answered;
    receive_hidden(step.seqs, out);
    for (Seq* w : step.wants) {
      if (!w->request.embedding) continue;
      answered.push_back(w);
      if (!w->done && !w->cancelled) finish_embedding(*w);
    }
    for (size_t r = 0; r < out.seq_ids.size(); ++r) {
      const bool full = !argmax_fits || !out.is_argmax(r);
      const size_t full_index = full_rows;
      if (full) ++full_rows;
      Seq* sp = nullptr;
      for (Seq* w : step.wants) {
        if (w->kv_id == out.seq_ids[r]) sp = w;
      }
      if (!sp) continue;  // a row nobody asked for in this step
      if (std::find(answered.begin(), answered.end(), sp) != answered.end()) {
        fail(*sp, "the last stage answered with two logits rows for this request");
        continue;
      }
      answered.push_back(sp);
      if (sp->done || sp->cancelled) continue;  // a cancelled one ends with its last step
      Seq& s = *sp;
      s.awaiting = false;
      if (s.request.max_tokens == 0) {
        finish(s, "length");  // the prompt evaluated (its KV kept for reuse), nothing sampled
        continue;
      }
      try {
        if (!argmax_fits) throw std::runtime_error("the answer's arg max list does not match its rows");
        std::span<const float> logits;
        int32_t id = 0;
        if (!full) {
          // Greedy without more (argmax_only): the arg max the last stage sent.
          id = out.argmax[r];
        } else {
          if (n_vocab == 0 || (full_index + 1) * n_vocab > out.logits.size()) {
            throw std::runtime_error("a logits row that does not fit the answer (" + std::to_string(out.logits.size()) +
                                     " values for row " + std::to_string(full_index + 1) + " of " +
                                     std::to_string(n_vocab) + ")");
          }
          logits = out.row_logits(r);
          // Greedy without more: the arg max of the full row (an in-process stage's) is
          // the sampler's pick, found faster.
          id = s.argmax_only ? static_cast<int32_t>(sample::first_argmax(logits.data(), logits.size()))
                             : s.sampler->sample(logits);
        }
        if (id < 0 || static_cast<size_t>(id) >= tok_.vocab_size()) {
          throw std::runtime_error("sampled token id " + std::to_string(id) + " is outside the vocabulary");
        }
        if (s.request.post_sampling_probs && s.request.logprobs >= 0 && !logits.empty()) {
          s.post_probs = post_sampling_probs(*s.sampler, logits, id, s.request.logprobs);  // before accept moves it
        }
        s.sampler->accept(id);
        if (s.callbacks.on_sampled) s.callbacks.on_sampled(id, logits);
        if (s.n_decoded == 0) s.t_first = now;
        ++s.n_decoded;
        ++generated;
        if (tok_.is_eog(id) && !s.request.ignore_eos) {
          finish(s, "stop");
          continue;
        }
        if (!out.chained && overlap && s.request.stop.empty() && !at_limit(s)) {
          s.pending = id;
          deferred.push_back({&s, r, id});
          continue;
        }
        emit_token(s, id, logits);
        if (s.matcher->matched()) {
          finish(s, "stop");
        } else if (at_limit(s)) {
          finish(s, "length");  // never in a chain (chain_grant); its KV would wait for the chained step
        } else if (out.chained) {
          // The last stage sent this token on already: it is in the step now in flight.
          s.kv_tokens.push_back(id);
          ++s.n_past;
          s.awaiting = true;
        } else {
          s.pending = id;
        }
      } catch (const std::exception& e) {
        s.pending.reset();
        fail(s, std::string("sampling failed: ") + e.what());
      }
    }
    for (Seq* w : step.wants) {
      if (!w->done && !w->cancelled && std::find(answered.begin(), answered.end(), w) == answered.end()) {
        fail(*w, "the last stage's answer has no logits row for this request");
      }
    }
    if (!deferred.empty() && !fill()) deferred.clear();  // failed: those requests got on_error
    for (const Deferred& d : deferred) {
      if (d.seq->done) continue;
      try {
        emit_token(*d.seq, d.id, out.row_logits(d.row));
      } catch (const std::exception& e) {
        fail(*d.seq, std::string("emitting a token failed: ") + e.what());
      }
    }
    {
      std::lock_guard lock(mutex_);
      metrics_.generated_tokens += static_cast<uint64_t>(generated);
    }
    erase_finished();
    update_slots();
  }
  // Stopping: whatever is left fails.
  {
    std::lock_guard lock(mutex_);
    while (!incoming_.empty()) {
      active_.push_back(std::move(incoming_.front()));
      incoming_.pop_front();
    }
  }
  for (auto& s : active_) {
    if (!s->done && s->callbacks.on_error) s->callbacks.on_error("the server is shutting down");
  }
  {
    std::lock_guard lock(mutex_);
    for (auto& t : pipeline_tasks_) {
      t.done.set_exception(std::make_exception_ptr(std::runtime_error("the server is shutting down")));
    }
    pipeline_tasks_.clear();
  }
  active_.clear();
  for (const auto& k : kept_) close_sequence(k.kv_id);
  kept_.clear();
}

}  // namespace pico::coordinator
