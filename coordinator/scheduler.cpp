#include "scheduler.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <stdexcept>

#include "engine.hpp"

namespace pico::coordinator {

double median_token_interval(const Result& result) {
  const auto& t = result.token_seconds;
  if (t.size() < 2) return 0.0;
  std::vector<double> gaps(t.size() - 1);
  for (size_t i = 1; i < t.size(); ++i) gaps[i - 1] = t[i] - t[i - 1];
  const auto middle = gaps.begin() + static_cast<std::ptrdiff_t>(gaps.size() / 2);
  std::nth_element(gaps.begin(), middle, gaps.end());
  if (gaps.size() % 2 == 1) return *middle;
  return (*middle + *std::max_element(gaps.begin(), middle)) / 2.0;
}

// A fixed set of requests run to completion on an Engine (the online scheduler); the
// calling thread waits for the last one.
std::vector<Result> Scheduler::run(const std::vector<Request>& requests,
                                   const std::function<void(size_t, const std::string&)>& on_text) {
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i].prompt.empty()) throw std::invalid_argument("request " + std::to_string(i) + " has no tokens");
  }
  std::vector<Result> results(requests.size());
  std::mutex mutex;
  std::condition_variable cv;
  size_t remaining = 0;
  std::optional<std::string> error;
  const auto start = std::chrono::steady_clock::now();
  {
    Engine engine(pipeline_, tok_, options_);
    for (size_t i = 0; i < requests.size(); ++i) {
      if (requests[i].n_predict <= 0) continue;
      OnlineRequest r;
      r.prompt = requests[i].prompt;
      r.max_tokens = requests[i].n_predict;
      r.sampling = requests[i].sampling;
      r.full_logits = options_.keep_logits;
      r.ignore_eos = requests[i].ignore_eos;
      Callbacks cb;
      cb.on_sampled = [&, i](int32_t id, std::span<const float> logits) {
        results[i].tokens.push_back(id);
        results[i].token_seconds.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        if (options_.keep_logits) results[i].logits.insert(results[i].logits.end(), logits.begin(), logits.end());
      };
      cb.on_token = [&, i](const TokenEvent& ev) {
        if (ev.text.empty()) return;
        results[i].text += ev.text;
        if (on_text) on_text(i, ev.text);
      };
      cb.on_done = [&](const std::string&, const Usage&) {
        std::lock_guard lock(mutex);
        --remaining;
        cv.notify_all();
      };
      cb.on_error = [&](const std::string& message) {
        std::lock_guard lock(mutex);
        if (!error) error = message;
        --remaining;
        cv.notify_all();
      };
      {
        std::lock_guard lock(mutex);
        ++remaining;
      }
      try {
        engine.submit(std::move(r), std::move(cb));
      } catch (...) {
        std::lock_guard lock(mutex);
        --remaining;
        throw;
      }
    }
    std::unique_lock lock(mutex);
    cv.wait(lock, [&] { return remaining == 0; });
  }
  if (error) throw StageError(*error);
  return results;
}

}  // namespace pico::coordinator
