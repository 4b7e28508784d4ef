#include "sample/dry.hpp"

#include <algorithm>
#include <cmath>

#include "sample/sampler.hpp"

namespace pico::sample {

bool DryBreakers::breaks_alone(int32_t token) const {
  const auto [first, last] = heads.equal_range(token);
  return std::any_of(first, last, [](const auto& entry) { return entry.second.empty(); });
}

DryBreakers make_dry_breakers(std::span<const std::string> breakers, int32_t n_vocab,
                              const std::function<std::string(int32_t)>& text,
                              const std::function<std::vector<int32_t>(std::string_view)>& tokenize) {
  constexpr size_t kMaxBytes = 40, kMaxTail = 20;
  DryBreakers out;
  std::vector<std::string> texts(static_cast<size_t>(std::max(n_vocab, 0)));
  for (int32_t id = 0; id < n_vocab; ++id) texts[static_cast<size_t>(id)] = text(id);
  for (std::string breaker : breakers) {
    if (breaker.empty()) continue;
    if (breaker.size() > kMaxBytes) breaker.resize(kMaxBytes);
    for (int32_t id = 0; id < n_vocab; ++id) {
      const std::string& word = texts[static_cast<size_t>(id)];
      if (word.find(breaker) != std::string::npos) {
        out.heads.emplace(id, std::vector<int32_t>());
        continue;
      }
      // Every place where the word's end starts the breaker: the breaker's rest follows.
      for (size_t at = word.find(breaker[0]); at != std::string::npos; at = word.find(breaker[0], at + 1)) {
        const size_t overlap = word.size() - at;  // < breaker.size(): it is not inside the word
        if (word.compare(at, overlap, breaker, 0, overlap) != 0) continue;
        std::vector<int32_t> tail = tokenize(std::string_view(breaker).substr(overlap));
        if (tail.size() > kMaxTail) tail.resize(kMaxTail);
        const auto [first, last] = out.heads.equal_range(id);
        if (std::none_of(first, last, [&](const auto& entry) { return entry.second == tail; })) {
          out.heads.emplace(id, std::move(tail));
        }
      }
    }
  }
  return out;
}

void DryHistory::accept(int32_t token) {
  if (last_n_ == 0) return;
  tokens_.push_back(token);
  if (tokens_.size() > static_cast<size_t>(last_n_)) tokens_.pop_front();
}

void DryHistory::apply(Candidates& c, float multiplier, float base, int32_t allowed_length,
                       const DryBreakers* breakers) const {
  if (multiplier == 0.0f || base < 1.0f || last_n_ == 0) return;
  const int n = static_cast<int>(tokens_.size());
  if (n <= allowed_length) return;
  // back(i): the i-th token from the end (0: the last one).
  auto back = [&](int i) { return tokens_[static_cast<size_t>(n - 1 - i)]; };

  // 1. The nearest breaker from the end bounds how long a repeat may count.
  int limit = n;
  if (breakers) {
    for (int i = 0; i < n; ++i) {
      const auto [first, last] = breakers->heads.equal_range(back(i));
      int longest = -1;
      for (auto it = first; it != last; ++it) {
        const auto& tail = it->second;
        const int len = static_cast<int>(tail.size());
        if (len <= longest || len > i) continue;
        bool match = true;
        for (int o = 0; o < len && match; ++o) match = tail[static_cast<size_t>(o)] == back(i - o - 1);
        if (match) longest = len;
      }
      if (longest >= 0) {
        limit = i - longest;
        break;
      }
    }
  }
  if (limit < allowed_length) return;

  // 2. For each k, how many of the last tokens also end k tokens earlier: the Z-function
  // of the history read backwards (z[k] = common prefix of back(0..) and back(k..)),
  // bounded by the limit.
  std::vector<int> z(static_cast<size_t>(n), 0);
  for (int k = 1, left = 0, right = 0; k < n; ++k) {  // [left, right): the rightmost match found
    int m = k < right ? std::min(right - k, z[static_cast<size_t>(k - left)]) : 0;
    while (k + m < n && back(m) == back(k + m)) ++m;
    z[static_cast<size_t>(k)] = m;
    if (k + m > right) left = k, right = k + m;
  }

  // 3. The token after each such earlier copy would extend the repeat: per token, the
  // longest repeat it would extend.
  std::unordered_map<int32_t, int> extends;
  for (int k = 1; k < n; ++k) {
    const int len = std::min(z[static_cast<size_t>(k)], limit);
    if (len < allowed_length) continue;
    const int32_t next = back(k - 1);
    int& best = extends[next];
    best = std::max(best, len);
  }
  if (extends.empty()) return;

  // 4. The penalty, its exponent bounded so that base^exponent stays a float.
  constexpr float kFloatMaxLog = 88.7228391f;
  const int max_exponent = base > 1.000001f ? static_cast<int>(kFloatMaxLog / std::log(base)) : 0;
  for (Candidate& cand : c.items) {
    const auto it = extends.find(cand.id);
    if (it == extends.end() || (breakers && breakers->breaks_alone(cand.id))) continue;
    int exponent = it->second - allowed_length;
    if (max_exponent > 0 && exponent > max_exponent) exponent = max_exponent;
    const auto penalty = static_cast<float>(multiplier * std::pow(static_cast<double>(base), exponent));
    cand.logit -= penalty;
  }
  c.sorted = false;
}

}  // namespace pico::sample
