// The arg max of a logits row, as std::max_element picks it (the first of equal
// maxima; a NaN is never picked unless it comes first), without its serial chain of
// compares through memory: ~7 us instead of ~90 us over 32000 floats, on the path of
// every greedy token (the sampler's greedy path, and a pipeline's last stage, which
// sends only the arg max: see protocol's LogitsOutput).
#pragma once

#include <cstddef>

namespace pico::sample {

inline size_t first_argmax(const float* x, size_t n) {
  if (n == 0 || x[0] != x[0]) return 0;  // empty, or a leading NaN (std::max_element keeps it)
  // The largest value, over independent lanes (x > m ? x : m never takes a NaN, and m
  // starts as a number). Which lane holds it does not matter: its first index is
  // searched for next.
  constexpr size_t kLanes = 16;
  float lanes[kLanes];
  for (float& l : lanes) l = x[0];
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) lanes[j] = x[i + j] > lanes[j] ? x[i + j] : lanes[j];
  }
  float best = x[0];
  for (; i < n; ++i) best = x[i] > best ? x[i] : best;
  for (float l : lanes) best = l > best ? l : best;
  // Its first index (-0 equals +0, as for std::max_element, which keeps the first of
  // equal values), found a chunk at a time.
  constexpr size_t kChunk = 64;
  i = 0;
  for (; i + kChunk <= n; i += kChunk) {
    bool found = false;
    for (size_t j = 0; j < kChunk; ++j) found |= x[i + j] == best;
    if (found) break;
  }
  for (; i < n; ++i) {
    if (x[i] == best) return i;
  }
  return 0;  // not reached: best is one of the values
}

}  // namespace pico::sample
