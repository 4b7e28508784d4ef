// The sequences' KV on the stages: kept after a request for prompt-prefix reuse
// (evicted least recently used first), recurrent-state checkpoints, closed once no step
// holds its tokens; and when a stage is lost: failover to a replica and the replay of
// every sequence there, or the failure of every request; pipeline work that must run
// between steps (Engine::with_pipeline).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <span>
#include <stdexcept>

#include "engine.hpp"
#include "engine_sequence.hpp"
#include "placement.hpp"
#include "state/recurrent_state.hpp"

namespace pico::coordinator {

void Engine::check_stages(bool idle) {
  std::string lost;
  auto find_lost = [&] {
    for (const uint32_t lane : pipeline_.lanes()) {
      for (size_t i = 0; i < pipeline_.size() && lost.empty(); ++i) {
        Stage& s = pipeline_.stage(i, lane);
        if (!s.up()) lost = "stage " + std::to_string(i) + " (" + s.info().name + ")";
      }
    }
  };
  find_lost();
  if (!lost.empty() && idle) {
    // It comes back without the KV of the kept sequences, and a replica has none.
    for (const auto& k : kept_) close_sequence(k.kv_id);
    kept_.clear();
    try {
      pipeline_.fail_over();
      pipeline_.forget_taken_over();  // nothing to replay: idle
    } catch (const std::exception& e) {
      spdlog::warn("failover: {}", e.what());
    }
    lost.clear();
    find_lost();
  }
  if (idle) {
    const auto now = Clock::now();
    if (now - last_standby_rejoin_ >= std::chrono::milliseconds(rejoin_interval_ms)) {
      last_standby_rejoin_ = now;
      pipeline_.rejoin_standbys();
    }
  }
  if (!lost.empty() && idle) {
    const auto now = Clock::now();
    if (now - last_rejoin_ >= std::chrono::milliseconds(rejoin_interval_ms)) {
      last_rejoin_ = now;
      try {
        pipeline_.rejoin_lost();
      } catch (const StageError& e) {
        spdlog::debug("rejoin: {}", e.what());
      }
      lost.clear();
      find_lost();
    }
  }
  std::lock_guard lock(mutex_);
  if (lost != lost_stage_) {
    if (lost.empty()) {
      spdlog::info("every stage is up");
    } else {
      spdlog::warn("{} is lost", lost);
    }
  }
  lost_stage_ = std::move(lost);
}

uint32_t Engine::quietest_lane(const Seq* joining) const {
  // Per lane: its unfinished sequences, and what its workers' profiles and its links
  // predict for a step with one more (Pipeline::predicted_step_seconds, as the
  // placement's predict_lanes counts it; a greedy sequence's rows return their arg max
  // only, not a row of logits). With every lane profiled, the new sequence
  // goes where that step is shortest (a faster lane takes more sequences); steps within
  // a tenth of each other (the noise of profiles of like machines) count as equal, and
  // then, or without profiles, it goes to the lane with fewest.
  const std::vector<uint32_t> lanes = pipeline_.lanes();
  struct Load {
    uint32_t lane;
    long sequences;
    std::optional<double> step;
  };
  std::vector<Load> loads;
  bool profiled = true;
  for (const uint32_t lane : lanes) {
    long n = 0, full_rows = joining && joining->argmax_only ? 0 : 1;
    for (const auto& s : active_) {
      if (s->lane != lane || s->done || !s->sampler || s.get() == joining) continue;
      ++n;
      full_rows += s->argmax_only ? 0 : 1;
    }
    const auto step = lanes.size() > 1 ? pipeline_.predicted_step_seconds(lane, static_cast<size_t>(n) + 1,
                                                                          static_cast<size_t>(full_rows))
                                       : std::optional<double>();
    profiled = profiled && step.has_value();
    loads.push_back({lane, n, step});
  }
  const Load* best = &loads.front();
  for (const Load& l : loads) {
    const bool first = profiled ? takes_the_sequence_first(*l.step, l.sequences, *best->step, best->sequences)
                                : l.sequences < best->sequences;
    if (first) best = &l;
  }
  return best->lane;
}

void Engine::release_kv(Seq& s) {
  if (s.kv_released) return;
  s.kv_released = true;
  if (!s.cancelled && !s.failed && options_.cache_sequences > 0) {
    // Keep its KV for a later request with a common prefix (every step of it is done).
    // The stages may hold one position more (a chained step past the end): a reuse cuts
    // it, as it cuts any position after the common prefix.
    kept_.push_back({s.kv_id, std::move(s.kv_tokens), ++use_tick_, std::move(s.checkpoints), s.lane});
    evict_kept();
  } else {
    close_sequence(s.kv_id);
  }
}

void Engine::close_sequence(int32_t kv_id) {
  try {
    pipeline_.close(kv_id);
  } catch (const std::exception& e) {
    spdlog::warn("closing sequence {}: {}", kv_id, e.what());
  }
}

void Engine::evict_kept() {
  // Every sequence that holds KV on the stages or is about to: a finished one whose last
  // step is still in flight holds it until release_kv.
  const auto running = std::count_if(active_.begin(), active_.end(), [](const auto& s) { return !s->kv_released; });
  auto over = [&] {
    if (kept_.empty()) return false;
    if (static_cast<int>(kept_.size()) > options_.cache_sequences) return true;
    if (options_.max_sequences > 0 && static_cast<int64_t>(kept_.size()) + running > options_.max_sequences) {
      return true;
    }
    if (options_.cache_tokens > 0) {
      int64_t held = 0;
      for (const auto& k : kept_) held += static_cast<int64_t>(k.tokens.size());
      if (held > options_.cache_tokens) return true;
    }
    return false;
  };
  while (over()) {
    auto lru = std::min_element(kept_.begin(), kept_.end(),
                                [](const Kept& a, const Kept& b) { return a.last_used < b.last_used; });
    close_sequence(lru->kv_id);
    kept_.erase(lru);
  }
}

// Takes the kept sequence with the longest common prefix with s's prompt, if any: s
// continues it from the end of that prefix and computes only the rest. At least the
// last prompt token is always computed, for its logits. A prefix under a tenth of the
// prompt is not worth the kept sequence it would cut (as llama.cpp's default slot
// similarity): s then starts a fresh sequence.
void Engine::reuse_prefix(Seq& s) {
  const auto& prompt = s.request.prompt;
  auto best = kept_.end();
  size_t best_len = 0;
  const std::vector<uint32_t> lanes = pipeline_.lanes();
  if (s.request.cache_prompt) {
    for (auto it = kept_.begin(); it != kept_.end(); ++it) {
      if (std::find(lanes.begin(), lanes.end(), it->lane) == lanes.end()) continue;  // its lane ended
      const size_t limit = std::min(it->tokens.size(), prompt.size() - 1);
      size_t n = 0;
      while (n < limit && it->tokens[n] == prompt[n]) ++n;
      if (options_.recurrent) {
        // The recurrent state goes back only to a checkpoint: the newest within the prefix.
        size_t at = 0;
        for (int32_t c : it->checkpoints) {
          if (static_cast<size_t>(c) <= n) at = std::max(at, static_cast<size_t>(c));
        }
        n = at;
      }
      if (n > best_len && 10 * n > prompt.size()) best = it, best_len = n;
    }
  }
  if (best == kept_.end()) {
    s.kv_id = next_kv_id_++;
    s.lane = quietest_lane(&s);
    s.held = 0;
    return;
  }
  // No truncate message: each stage cuts the sequence when its next token arrives at
  // position best_len (StageEngine::forward). A message sent to every stage directly
  // could reach a later stage after that token, which comes through the stages before.
  s.kv_id = best->kv_id;
  s.lane = best->lane;  // where its KV is
  pipeline_.cut_copies(s.kv_id, static_cast<int32_t>(best_len));
  // The stages drop the checkpoints after the one they go back to.
  for (int32_t c : best->checkpoints) {
    if (static_cast<size_t>(c) <= best_len) s.checkpoints.push_back(c);
  }
  kept_.erase(best);
  s.n_cached = static_cast<int>(best_len);
  s.n_past = static_cast<int32_t>(best_len);
  s.held = s.n_past;
  s.prefill_sent = best_len;
  s.kv_tokens.assign(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(best_len));
}

void Engine::report_progress(Seq& s, int processed) {
  if (!s.request.return_progress || !s.callbacks.on_prompt_progress) return;
  PromptProgress p;
  p.total = static_cast<int>(s.request.prompt.size());
  p.cache = s.n_cached;
  p.processed = processed;
  p.time_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - s.t_start).count();
  s.callbacks.on_prompt_progress(p);
}

void Engine::mark_checkpoint(Seq& s, model::BatchToken& row, bool prompt_end) {
  if (!options_.recurrent || options_.checkpoint_max <= 0) return;
  const int64_t after = row.pos + 1;  // positions held after the row
  const auto prompt = static_cast<int64_t>(s.request.prompt.size());
  const bool wanted = after <= prompt ? (prompt_end || (options_.checkpoint_every > 0 && after % options_.checkpoint_every == 0))
                                      : (options_.checkpoint_every_gen > 0 && (after - prompt) % options_.checkpoint_every_gen == 0);
  if (!wanted) return;
  const int keep = std::min(options_.checkpoint_max, 255);
  row.checkpoint_keep = static_cast<uint8_t>(keep);
  // The same bookkeeping as each stage's (state::RecurrentState::checkpoint).
  auto& c = s.checkpoints;
  while (!c.empty() && c.back() >= after) c.pop_back();
  c.push_back(static_cast<int32_t>(after));
  while (c.size() > static_cast<size_t>(keep)) {
    const std::vector<int64_t> positions(c.begin(), c.end());
    c.erase(c.begin() + static_cast<std::ptrdiff_t>(state::checkpoint_to_evict(positions)));
  }
}

void Engine::fail_all(const std::string& message) {
  // The stages' state is unknown after a failure: nothing kept is trusted either.
  for (const auto& k : kept_) close_sequence(k.kv_id);
  kept_.clear();
  for (auto& s : active_) {
    if (!s->kv_released) close_sequence(s->kv_id);
    s->kv_released = true;
    if (s->done) continue;
    s->done = true;
    if (s->callbacks.on_error) s->callbacks.on_error(message);
  }
  std::lock_guard lock(mutex_);
  metrics_.requests_failed += active_.size();
  active_.clear();
  running_ = 0;
}

bool Engine::recover(const std::string& what, std::span<const uint32_t> lanes) {
  bool replaced = false, failed = false;
  try {
    replaced = pipeline_.fail_over(lanes);
  } catch (const std::exception& e) {
    spdlog::error("failover: {}", e.what());
    failed = true;
  }
  // Only some lanes' steps abandoned: those lanes replay even with nothing replaced
  // (their workers are up again, and hold what their steps that came back computed).
  if (failed || (!replaced && lanes.empty())) {
    fail_all(what);
    return false;
  }
  replay_all(lanes);
  return true;
}

void Engine::replay_all(std::span<const uint32_t> only) {
  // The surviving stages hold the sequences up to wherever the abandoned steps got. A
  // worker that took a position over holds a sequence as far as its standby copy
  // (Pipeline::copied_prefix): the sequence replays from there under its id (each
  // stage cuts it on arrival there; the replaced worker closes it). Otherwise the
  // sequence starts again from position 0, under a new id (the old one is closed
  // everywhere, a lost worker told when it rejoins).
  // With `only`, the other lanes' sequences (and kept ones) run on untouched.
  auto replays = [&](uint32_t lane) { return only.empty() || std::find(only.begin(), only.end(), lane) != only.end(); };
  const std::vector<uint32_t> lanes = pipeline_.lanes();
  // A kept sequence stays kept as far as every worker of its lane holds it: all of it
  // where the lane kept its workers, else as far as the copies of the workers that took
  // positions over. One whose lane ended goes to the running lane whose workers hold
  // the longest copy of it (Pipeline::adopt_copies). None held: closed. A hybrid model's
  // recurrent state has no copies, and goes back only to a checkpoint: closed.
  size_t kept_on = 0, kept_replayed = 0;
  std::erase_if(kept_, [&](Kept& k) {
    if (!replays(k.lane)) return false;
    ++kept_replayed;
    const auto held_on_a_lane = [&]() -> int32_t {
      if (options_.recurrent) return 0;
      if (std::find(lanes.begin(), lanes.end(), k.lane) != lanes.end()) {
        return pipeline_.kept_its_workers(k.lane) ? static_cast<int32_t>(k.tokens.size())
                                                  : pipeline_.copied_prefix(k.kv_id, k.lane);
      }
      int32_t most = 0;
      std::optional<uint32_t> best;
      for (uint32_t lane : lanes) {
        const int32_t n = pipeline_.copies_in_lane(k.kv_id, lane);
        if (n > most) best = lane, most = n;
      }
      if (best) {
        pipeline_.adopt_copies(k.kv_id, *best);
        k.lane = *best;
      }
      return most;
    };
    const int32_t held = std::min(held_on_a_lane(), static_cast<int32_t>(k.tokens.size()));
    if (held <= 0) {
      close_sequence(k.kv_id);
      return true;
    }
    // The workers it left (a lost one when it rejoins) hold a stale state of it. The
    // positions past `held` are cut where a reuse continues it.
    pipeline_.close_on_replaced(k.kv_id);
    k.tokens.resize(static_cast<size_t>(held));
    ++kept_on;
    return false;
  });
  size_t replayed = 0, tokens = 0, resumed = 0, resumed_tokens = 0;
  // The sequences whose lane ended (embedding requests too) go onto the quietest lanes,
  // one at a time, first: where they go decides what they resume from.
  std::vector<Seq*> moved;
  for (auto& sp : active_) {
    if (!sp->done && replays(sp->lane) && std::find(lanes.begin(), lanes.end(), sp->lane) == lanes.end()) {
      moved.push_back(sp.get());
    }
  }
  for (Seq* s : moved) s->lane = 0;  // counted by quietest_lane as on no lane
  for (Seq* s : moved) s->lane = quietest_lane(s);
  for (auto& sp : active_) {
    Seq& s = *sp;
    const bool lane_ended = std::find(moved.begin(), moved.end(), sp.get()) != moved.end();
    if (!replays(s.lane) && !lane_ended) continue;
    s.steps_inflight = 0;  // every step of its lane in flight is gone
    if ((s.done || s.cancelled || s.request.embedding) && !s.kv_released) close_sequence(s.kv_id);
    if (s.done) {
      s.kv_released = true;
      continue;
    }
    if (s.cancelled) {
      s.kv_released = true;
      finish(s, "cancelled");
      continue;
    }
    if (s.request.embedding) {
      // Its prompt again from the start, with the hidden states it pools (those received
      // come back the same: batch invariance).
      tokens += s.kv_tokens.size();
      s.kv_id = next_kv_id_++;
      s.kv_tokens.clear();
      s.checkpoints.clear();
      s.n_past = 0;
      s.awaiting = false;
      s.prefill_sent = 0;
      s.hidden_rows.clear();
      s.hidden_next = 0;
      ++replayed;
      continue;
    }
    std::vector<int32_t> again = std::move(s.kv_tokens);
    bool logits = s.awaiting;
    if (s.replay_sent < s.replay.size()) {  // lost again while replaying
      again.insert(again.end(), s.replay.begin() + static_cast<std::ptrdiff_t>(s.replay_sent), s.replay.end());
      logits = s.replay_logits;
    }
    // A row that wants logits is sent again, however far the copy goes. A lane that kept
    // its workers holds what its steps that came back computed; a sequence whose lane
    // ended goes on from the copies its new lane's workers hold (Pipeline::adopt_copies).
    const auto room = static_cast<int32_t>(again.size()) - (logits ? 1 : 0);
    const int32_t held = lane_ended                           ? pipeline_.adopt_copies(s.kv_id, s.lane)
                         : pipeline_.kept_its_workers(s.lane) ? s.held
                                                              : pipeline_.copied_prefix(s.kv_id, s.lane);
    const int32_t from = options_.recurrent || s.kv_released ? 0 : std::clamp(held, 0, room);
    if (from > 0) {
      pipeline_.close_on_replaced(s.kv_id);
      // Every active worker holds it up to `from` at least; a standby's copy beyond may
      // be ahead of a worker that just took over, until the next copies.
      pipeline_.cut_copies(s.kv_id, from);
      ++resumed;
      resumed_tokens += static_cast<size_t>(from);
    } else {
      if (!s.kv_released) close_sequence(s.kv_id);
      s.kv_id = next_kv_id_++;
    }
    s.kv_tokens.assign(again.begin(), again.begin() + from);
    s.checkpoints.clear();
    s.n_past = from;
    s.held = from;
    s.awaiting = false;
    s.replay.assign(again.begin() + from, again.end());
    s.replay_sent = 0;
    s.replay_logits = logits;
    ++replayed;
    tokens += s.replay.size();
  }
  pipeline_.forget_taken_over();
  spdlog::warn("failover: {} sequences replay {} tokens on the new chain ({} of them from copies or their "
               "lane's workers, {} tokens not replayed; {} moved to another lane); {} of their lanes' {} kept "
               "sequences stay kept",
               replayed, tokens, resumed, resumed_tokens, moved.size(), kept_on, kept_replayed);
  std::lock_guard lock(mutex_);
  metrics_.replayed_tokens += tokens;
  metrics_.resumed_sequences += resumed;
  metrics_.resumed_tokens += resumed_tokens;
}

std::vector<SequenceLength> Engine::sequence_lengths() const {
  std::vector<SequenceLength> out;
  if (options_.recurrent) return out;
  for (const auto& sp : active_) {
    if (sp->kv_released || sp->request.embedding) continue;
    out.push_back({sp->kv_id, static_cast<int32_t>(sp->kv_tokens.size()), sp->lane});
  }
  for (const Kept& k : kept_) out.push_back({k.kv_id, static_cast<int32_t>(k.tokens.size()), k.lane});
  return out;
}

std::future<bool> Engine::with_pipeline(std::function<bool(Pipeline&)> fn, bool drain) {
  PipelineTask task{std::move(fn), drain, {}};
  std::future<bool> result = task.done.get_future();
  {
    std::lock_guard lock(mutex_);
    if (stopping_) throw std::runtime_error("the engine is stopping");
    pipeline_tasks_.push_back(std::move(task));
  }
  cv_.notify_all();
  return result;
}

std::optional<std::vector<int32_t>> Engine::sequences_on_stages() const {
  if (options_.recurrent) return std::nullopt;
  std::vector<int32_t> ids;
  for (const auto& sp : active_) {
    if (!sp->kv_released) ids.push_back(sp->kv_id);
  }
  for (const Kept& k : kept_) ids.push_back(k.kv_id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

bool Engine::run_pipeline_tasks(bool nothing_in_flight) {
  std::deque<PipelineTask> due;
  bool draining = false;
  {
    std::lock_guard lock(mutex_);
    std::deque<PipelineTask> later;
    for (auto& t : pipeline_tasks_) (t.drain && !nothing_in_flight ? later : due).push_back(std::move(t));
    pipeline_tasks_.swap(later);
    draining = !pipeline_tasks_.empty();
  }
  bool moved = false;
  for (auto& t : due) {
    try {
      const bool result = t.fn(pipeline_);
      moved = moved || (t.drain && result);
      t.done.set_value(result);
    } catch (...) {
      t.done.set_exception(std::current_exception());
    }
  }
  if (moved) replay_all();
  return draining;
}

Pooling parse_pooling(const std::string& text) {
  for (const Pooling p : {Pooling::none, Pooling::mean, Pooling::cls, Pooling::last}) {
    if (text == to_string(p)) return p;
  }
  throw std::invalid_argument("pooling '" + text + "' is not none, mean, cls or last");
}

const char* to_string(Pooling pooling) {
  switch (pooling) {
    case Pooling::none:
      return "none";
    case Pooling::mean:
      return "mean";
    case Pooling::cls:
      return "cls";
    case Pooling::last:
      return "last";
  }
  return "?";
}

void Engine::receive_hidden(const std::vector<Seq*>& seqs, const StepOutput& out) {
  const auto width = static_cast<size_t>(std::max<int64_t>(out.n_embd, 0));
  for (size_t r = 0; r < out.hidden_seq_ids.size(); ++r) {
    Seq* sp = nullptr;
    for (Seq* s : seqs) {
      if (s->kv_id == out.hidden_seq_ids[r] && s->request.embedding) sp = s;
    }
    if (!sp || sp->done || sp->cancelled) continue;  // a row nobody asked for, or for a request that ended
    Seq& s = *sp;
    const size_t n = s.request.prompt.size();
    // The next position whose hidden state comes back.
    size_t expected = static_cast<size_t>(s.hidden_next);
    while (expected < n && !returns_hidden(*s.request.embedding, expected, n)) ++expected;
    if (width == 0 || (r + 1) * width > out.hidden.size() || expected >= n ||
        out.hidden_positions[r] != static_cast<int32_t>(expected)) {
      fail(s, "the last stage answered with a hidden state this request did not expect next");
      continue;
    }
    const std::span<const float> row(out.hidden.data() + r * width, width);
    s.hidden_rows.emplace_back(row.begin(), row.end());
    s.hidden_next = static_cast<int32_t>(expected + 1);
  }
}

void Engine::finish_embedding(Seq& s) {
  s.awaiting = false;
  const size_t n = s.request.prompt.size();
  size_t wanted = 0;
  for (size_t i = 0; i < n; ++i) wanted += returns_hidden(*s.request.embedding, i, n) ? 1 : 0;
  if (s.hidden_rows.size() != wanted) {
    fail(s, "the last stage's answers lack hidden states of this request's prompt");
    return;
  }
  std::vector<std::vector<float>> rows = std::move(s.hidden_rows);
  s.hidden_rows.clear();
  try {
    if (s.callbacks.on_embedding) s.callbacks.on_embedding(std::move(rows));
  } catch (const std::exception& e) {
    fail(s, std::string("delivering the embedding failed: ") + e.what());
    return;
  }
  finish(s, "stop");
}

std::future<Engine::SlotFileResult> Engine::slot_file(SlotAction action, int32_t slot, const std::string& name) {
  auto out = std::make_shared<SlotFileResult>();
  std::future<bool> done = with_pipeline(
      [this, action, slot, name, out](Pipeline& p) {
        const auto t0 = Clock::now();
        auto kept = std::find_if(kept_.begin(), kept_.end(), [&](const Kept& k) { return k.kv_id == slot; });
        if (action != SlotAction::restore && kept == kept_.end()) {
          const bool busy = std::any_of(active_.begin(), active_.end(),
                                        [&](const auto& s) { return s->kv_id == slot && !s->kv_released; });
          throw std::invalid_argument(busy ? "slot " + std::to_string(slot) + " is processing a request"
                                           : "no idle slot " + std::to_string(slot) + " (GET /slots lists them)");
        }
        if (action == SlotAction::save) {
          for (size_t i = 0; i < p.size(); ++i) out->bytes += p.stage(i, kept->lane).save_slot(slot, name, kept->tokens);
          out->slot = slot;
          out->tokens = kept->tokens.size();
          kept->last_used = ++use_tick_;
        } else if (action == SlotAction::erase) {
          out->slot = slot;
          out->tokens = kept->tokens.size();
          close_sequence(kept->kv_id);
          kept_.erase(kept);
        } else {
          const int32_t kv_id = next_kv_id_++;
          const uint32_t lane = quietest_lane(nullptr);
          std::vector<int32_t> tokens;
          try {
            for (size_t i = 0; i < p.size(); ++i) {
              Stage::SlotRead read = p.stage(i, lane).restore_slot(kv_id, name);
              out->bytes += read.bytes;
              std::vector<int32_t> held = std::move(read.tokens);
              if (i > 0 && held != tokens) {
                throw StageError("stage " + std::to_string(i) + "'s slot file " + name +
                                 " holds other tokens than stage 0's (files of different saves)");
              }
              tokens = std::move(held);
            }
            if (static_cast<int64_t>(tokens.size()) >= options_.ctx) {
              throw std::invalid_argument("slot file " + name + " holds " + std::to_string(tokens.size()) +
                                          " tokens, more than the context");
            }
            for (const int32_t t : tokens) {
              if (t < 0 || static_cast<size_t>(t) >= tok_.vocab_size()) {
                throw std::invalid_argument("slot file " + name + " holds a token outside the vocabulary");
              }
            }
          } catch (...) {
            close_sequence(kv_id);
            throw;
          }
          out->slot = kv_id;
          out->tokens = tokens.size();
          // The recurrent state's checkpoints came back too, but not where they lie: a
          // hybrid model's restored slot is continued from its end only.
          std::vector<int32_t> checkpoints;
          if (options_.recurrent) checkpoints.push_back(static_cast<int32_t>(tokens.size()));
          kept_.push_back({kv_id, std::move(tokens), ++use_tick_, std::move(checkpoints), lane});
          evict_kept();
        }
        out->ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        update_slots();
        return false;  // no layers moved
      },
      true);
  return std::async(std::launch::deferred, [done = std::move(done), out]() mutable {
    done.get();
    return *out;
  });
}

}  // namespace pico::coordinator
