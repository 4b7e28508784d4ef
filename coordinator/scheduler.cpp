#include "scheduler.hpp"

#include <spdlog/spdlog.h>

#include <map>
#include <memory>
#include <optional>
#include <stdexcept>

namespace pico::coordinator {

namespace {

struct Sequence {
  size_t index = 0;
  int32_t id = 0;
  const Request* request = nullptr;
  std::unique_ptr<sample::Sampler> sampler;
  std::unique_ptr<tokenizer::StreamDecoder> decoder;
  size_t prefill_sent = 0;          // prompt tokens submitted
  int32_t n_past = 0;               // positions submitted
  std::optional<int32_t> pending;   // sampled, not yet submitted
  bool awaiting = false;            // logits of this sequence are in flight
  bool done = false;
};

}  // namespace

std::vector<Result> Scheduler::run(const std::vector<Request>& requests,
                                   const std::function<void(size_t, const std::string&)>& on_text) {
  std::vector<Result> results(requests.size());
  std::vector<Sequence> seqs(requests.size());
  std::map<int32_t, Sequence*> by_id;
  size_t active = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i].prompt.empty()) throw std::invalid_argument("request " + std::to_string(i) + " has no tokens");
    auto& s = seqs[i];
    s.index = i;
    s.id = static_cast<int32_t>(i + 1);
    s.request = &requests[i];
    s.sampler = std::make_unique<sample::Sampler>(requests[i].sampling);
    for (int32_t t : requests[i].prompt) s.sampler->accept(t);
    s.decoder = std::make_unique<tokenizer::StreamDecoder>(tok_);
    by_id[s.id] = &s;
    if (requests[i].n_predict > 0) {
      ++active;
    } else {
      s.done = true;
    }
  }

  auto finish = [&](Sequence& s) {
    s.done = true;
    --active;
    const std::string tail = s.decoder->flush();
    results[s.index].text += tail;
    if (on_text && !tail.empty()) on_text(s.index, tail);
    pipeline_.close(s.id);
  };

  int inflight = 0;
  size_t rr = 0;  // round-robin start, so that no sequence starves under the token budget
  while (active > 0) {
    while (inflight < options_.max_inflight) {
      std::vector<model::BatchToken> batch;
      int budget = options_.max_batch_tokens;
      for (size_t k = 0; k < seqs.size() && budget > 0; ++k) {
        Sequence& s = seqs[(rr + k) % seqs.size()];
        if (s.done || s.awaiting) continue;
        const auto& prompt = s.request->prompt;
        if (s.prefill_sent < prompt.size()) {
          const size_t n = std::min({prompt.size() - s.prefill_sent, static_cast<size_t>(options_.micro_batch),
                                     static_cast<size_t>(budget)});
          for (size_t j = 0; j < n; ++j) {
            const bool last = s.prefill_sent + 1 == prompt.size();
            batch.push_back({s.id, s.n_past++, prompt[s.prefill_sent++], last});
          }
          budget -= static_cast<int>(n);
          if (s.prefill_sent == prompt.size()) s.awaiting = true;
        } else if (s.pending) {
          batch.push_back({s.id, s.n_past++, *s.pending, true});
          s.pending.reset();
          s.awaiting = true;
          --budget;
        }
      }
      rr = (rr + 1) % seqs.size();
      if (batch.empty()) break;
      pipeline_.submit(batch);
      ++inflight;
    }
    if (inflight == 0) throw std::logic_error("scheduler: nothing in flight and nothing to submit");
    const StepOutput out = pipeline_.wait(options_.step_timeout_ms);
    --inflight;
    for (size_t r = 0; r < out.seq_ids.size(); ++r) {
      auto it = by_id.find(out.seq_ids[r]);
      if (it == by_id.end()) throw StageError("logits for an unknown sequence " + std::to_string(out.seq_ids[r]));
      Sequence& s = *it->second;
      if (s.done) continue;
      s.awaiting = false;
      const float* row = out.logits.data() + r * static_cast<size_t>(out.n_vocab);
      const std::span<const float> logits(row, static_cast<size_t>(out.n_vocab));
      const int32_t id = s.sampler->sample(logits);
      s.sampler->accept(id);
      Result& res = results[s.index];
      res.tokens.push_back(id);
      if (options_.keep_logits) res.logits.insert(res.logits.end(), logits.begin(), logits.end());
      if (tok_.is_eog(id)) {
        finish(s);
        continue;
      }
      const std::string piece = s.decoder->push(id);
      res.text += piece;
      if (on_text && !piece.empty()) on_text(s.index, piece);
      if (static_cast<int>(res.tokens.size()) >= s.request->n_predict || s.n_past >= options_.ctx) {
        finish(s);
      } else {
        s.pending = id;
      }
    }
  }
  // Drain steps still in flight (none in a normal run: every sequence awaited its logits).
  while (inflight-- > 0) pipeline_.wait(options_.step_timeout_ms);
  return results;
}

}  // namespace pico::coordinator
