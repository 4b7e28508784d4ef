#include "engine.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <optional>
#include <stdexcept>

namespace pico::coordinator {

using Clock = std::chrono::steady_clock;

namespace {
double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace

std::string StopMatcher::push(const std::string& text) {
  if (matched_) return {};
  held_ += text;
  size_t first = std::string::npos;
  for (const auto& stop : stops_) {
    if (stop.empty()) continue;
    first = std::min(first, held_.find(stop));
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

struct Engine::Seq {
  int32_t id = 0;
  OnlineRequest request;
  Callbacks callbacks;
  std::unique_ptr<sample::Sampler> sampler;
  std::unique_ptr<tokenizer::StreamDecoder> decoder;
  std::unique_ptr<StopMatcher> matcher;
  size_t prefill_sent = 0;
  int32_t n_past = 0;
  int n_decoded = 0;
  std::optional<int32_t> pending;
  bool awaiting = false;
  bool cancelled = false;
  bool done = false;
  Clock::time_point t_start, t_first;
};

void Engine::Handle::cancel() {
  if (!engine_) return;
  {
    std::lock_guard lock(engine_->mutex_);
    engine_->cancels_.push_back(id_);
  }
  engine_->cv_.notify_all();
}

Engine::Engine(Pipeline& pipeline, const tokenizer::Tokenizer& tok, SchedulerOptions options)
    : pipeline_(pipeline), tok_(tok), options_(options) {
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
    throw std::invalid_argument("the prompt has " + std::to_string(request.prompt.size()) +
                                " tokens; the context holds " + std::to_string(options_.ctx));
  }
  for (int32_t t : request.prompt) {
    if (t < 0 || static_cast<size_t>(t) >= tok_.vocab_size()) {
      throw std::invalid_argument("token id " + std::to_string(t) + " is out of the vocabulary");
    }
  }
  auto s = std::make_unique<Seq>();
  s->request = std::move(request);
  s->callbacks = std::move(callbacks);
  std::lock_guard lock(mutex_);
  if (stopping_) throw std::runtime_error("the engine is stopping");
  s->id = next_id_++;
  const int32_t id = s->id;
  incoming_.push_back(std::move(s));
  ++metrics_.queued;
  cv_.notify_all();
  return Handle(this, id);
}

std::vector<SlotInfo> Engine::slots() const {
  std::lock_guard lock(mutex_);
  return slots_;
}

EngineMetrics Engine::metrics() const {
  std::lock_guard lock(mutex_);
  return metrics_;
}

void Engine::release(Seq& s, const std::string& text) {
  if (text.empty() || !s.callbacks.on_token) return;
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
  try {
    pipeline_.close(s.id);
  } catch (const std::exception& e) {
    spdlog::warn("closing sequence {}: {}", s.id, e.what());
  }
  const auto now = Clock::now();
  Usage u;
  u.prompt_tokens = static_cast<int>(s.request.prompt.size());
  u.completion_tokens = s.n_decoded;
  if (s.n_decoded > 0) {
    u.prompt_ms = seconds_between(s.t_start, s.t_first) * 1e3;
    u.predicted_ms = seconds_between(s.t_first, now) * 1e3;
  }
  if (s.callbacks.on_done) s.callbacks.on_done(s.matcher->matched() ? "stop_string" : reason, u);
}

void Engine::fail_all(const std::string& message) {
  for (auto& s : active_) {
    if (s->done) continue;
    s->done = true;
    try {
      pipeline_.close(s->id);
    } catch (const std::exception&) {
    }
    if (s->callbacks.on_error) s->callbacks.on_error(message);
  }
  std::lock_guard lock(mutex_);
  metrics_.requests_failed += active_.size();
  active_.clear();
}

void Engine::update_slots() {
  std::vector<SlotInfo> slots;
  int64_t positions = 0;
  for (const auto& s : active_) {
    if (s->done) continue;
    slots.push_back({s->id, static_cast<int>(s->request.prompt.size()), s->n_decoded, s->n_past,
                     s->prefill_sent < s->request.prompt.size()});
    positions += s->n_past;
  }
  std::lock_guard lock(mutex_);
  metrics_.active = static_cast<int>(slots.size());
  metrics_.tokens_in_flight = positions;
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
      metrics_.prompt_tokens += s->request.prompt.size();
      s->sampler = std::make_unique<sample::Sampler>(s->request.sampling);
      for (int32_t t : s->request.prompt) s->sampler->accept(t);
      s->decoder = std::make_unique<tokenizer::StreamDecoder>(tok_);
      s->matcher = std::make_unique<StopMatcher>(s->request.stop);
      s->t_start = Clock::now();
      active_.push_back(std::move(s));
    }
  }
  for (auto& s : dropped) {
    if (s->callbacks.on_done) s->callbacks.on_done("cancelled", Usage{static_cast<int>(s->request.prompt.size())});
  }
  for (int32_t id : cancels) {
    for (auto& s : active_) {
      if (s->id != id || s->done) continue;
      s->cancelled = true;
      if (!s->awaiting) finish(*s, "cancelled");  // else when its logits come back
    }
  }
}

void Engine::loop() {
  struct Inflight {
    Clock::time_point submitted;
    int prefill = 0, decode = 0;
  };
  std::deque<Inflight> inflight;
  size_t rr = 0;
  auto last_done = Clock::now();
  bool stats_stale = options_.stage_stats;
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
    {
      std::unique_lock lock(mutex_);
      if (active_.empty() && inflight.empty()) {
        cv_.wait(lock, [&] { return stopping_ || !incoming_.empty() || !cancels_.empty(); });
      }
      if (stopping_) break;
    }
    admit();
    std::erase_if(active_, [](const auto& s) { return s->done; });

    // Fill the pipeline.
    while (static_cast<int>(inflight.size()) < options_.max_inflight && !active_.empty()) {
      std::vector<model::BatchToken> batch;
      int budget = options_.max_batch_tokens, prefill = 0, decode = 0;
      for (size_t k = 0; k < active_.size() && budget > 0; ++k) {
        Seq& s = *active_[(rr + k) % active_.size()];
        if (s.done || s.awaiting || s.cancelled) continue;
        const auto& prompt = s.request.prompt;
        if (s.prefill_sent < prompt.size()) {
          const size_t n = std::min({prompt.size() - s.prefill_sent, static_cast<size_t>(options_.micro_batch),
                                     static_cast<size_t>(budget)});
          for (size_t j = 0; j < n; ++j) {
            const bool last = s.prefill_sent + 1 == prompt.size();
            batch.push_back({s.id, s.n_past++, prompt[s.prefill_sent++], last});
          }
          budget -= static_cast<int>(n);
          prefill += static_cast<int>(n);
          if (s.prefill_sent == prompt.size()) s.awaiting = true;
        } else if (s.pending) {
          batch.push_back({s.id, s.n_past++, *s.pending, true});
          s.pending.reset();
          s.awaiting = true;
          --budget;
          ++decode;
        }
      }
      rr = (rr + 1) % active_.size();
      if (batch.empty()) break;
      try {
        pipeline_.submit(batch);
      } catch (const std::exception& e) {
        spdlog::error("pipeline: {}", e.what());
        fail_all(e.what());
        inflight.clear();
        stats_stale = false;
        break;
      }
      inflight.push_back({Clock::now(), prefill, decode});
    }
    update_slots();
    if (inflight.empty()) continue;

    StepOutput out;
    try {
      out = pipeline_.wait(options_.step_timeout_ms);
    } catch (const std::exception& e) {
      spdlog::error("pipeline: {}", e.what());
      fail_all(e.what());
      inflight.clear();
      stats_stale = false;
      continue;
    }
    const auto now = Clock::now();
    const Inflight step = inflight.front();
    inflight.pop_front();
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

    int generated = 0;
    for (size_t r = 0; r < out.seq_ids.size(); ++r) {
      Seq* sp = nullptr;
      for (auto& s : active_) {
        if (s->id == out.seq_ids[r]) sp = s.get();
      }
      if (!sp || sp->done) continue;
      Seq& s = *sp;
      s.awaiting = false;
      if (s.cancelled) {
        finish(s, "cancelled");
        continue;
      }
      const std::span<const float> logits(out.logits.data() + r * static_cast<size_t>(out.n_vocab),
                                          static_cast<size_t>(out.n_vocab));
      const int32_t id = s.sampler->sample(logits);
      s.sampler->accept(id);
      if (s.callbacks.on_sampled) s.callbacks.on_sampled(id, logits);
      if (s.n_decoded == 0) s.t_first = now;
      ++s.n_decoded;
      ++generated;
      if (tok_.is_eog(id) && !s.request.ignore_eos) {
        finish(s, "stop");
        continue;
      }
      TokenEvent ev;
      ev.id = id;
      if (s.request.logprobs >= 0) {
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
      if (s.callbacks.on_token) s.callbacks.on_token(ev);
      if (s.matcher->matched()) {
        finish(s, "stop");
      } else if ((s.request.max_tokens > 0 && s.n_decoded >= s.request.max_tokens) || s.n_past >= options_.ctx) {
        finish(s, "length");
      } else {
        s.pending = id;
      }
    }
    {
      std::lock_guard lock(mutex_);
      metrics_.generated_tokens += static_cast<uint64_t>(generated);
    }
    std::erase_if(active_, [](const auto& s) { return s->done; });
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
  active_.clear();
}

}  // namespace pico::coordinator
