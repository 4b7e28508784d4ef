// The orders in which llama.cpp adds attention's products over an F16 KV cache, so that
// pico's scores and outputs are its floats. llama.cpp multiplies the F16 cache by F16
// queries (K) or F16 probabilities (V): every product is exact in float, so only the
// grouping of the additions matters. Two orders, chosen by llama.cpp per batch:
//  - batched (several tokens; llamafile's tinyBLAS): element i of the sum goes to vector
//    lane i % lanes, each lane one chain from the first element on, then the lanes
//    are added in a tree (halves, down to 4 lanes, then (0 + 2) + (1 + 3));
//  - one token (ggml_vec_dot_f16): 4 vectors of lanes each take turns (element i to
//    vector (i / lanes) % 4), the vectors are added (0 + 2) + (1 + 3), then the lanes
//    (the AVX-512 build: the tree above; the AVX2 build: (0 + 1) + (2 + 3) after the
//    halves); elements past the last whole group of 4 vectors are added in double.
// lanes: 16 for llama.cpp's AVX-512 builds, 8 for its AVX2 build.
#pragma once

#include <cstdint>
#include <vector>

namespace pico::backend {

struct SumOrder {
  int64_t lanes = 16;        // 16 or 8
  int64_t accumulators = 1;  // 1: batched order; 4: one-token order
  bool pairs_last = false;   // the lanes' last step (0 + 1) + (2 + 3) (AVX2 one-token)

  int64_t group() const { return lanes * accumulators; }
};

// Adds sums[0..order.lanes) (destroyed) as llama.cpp's horizontal sum does.
inline float add_lanes(float* sums, const SumOrder& order) {
  for (int64_t half = order.lanes / 2; half >= 4; half /= 2) {
    for (int64_t l = 0; l < half; ++l) sums[l] = sums[l] + sums[l + half];
  }
  return order.pairs_last ? (sums[0] + sums[1]) + (sums[2] + sums[3]) : (sums[0] + sums[2]) + (sums[1] + sums[3]);
}

// sums[a * lanes + l] for a < accumulators: the vectors added (0 + 2) + (1 + 3) into
// the first (a single accumulator is left as it is).
inline void add_accumulators(float* sums, const SumOrder& order) {
  if (order.accumulators == 1) return;
  const int64_t w = order.lanes;
  for (int64_t l = 0; l < w; ++l) sums[l] = (sums[l] + sums[2 * w + l]) + (sums[w + l] + sums[3 * w + l]);
}

// a . b over n elements whose products are exact in float.
template <int64_t kLanes, int64_t kAccumulators>
float dot_in_order(const float* a, const float* b, int64_t n, const SumOrder& order) {
  float sums[kLanes * kAccumulators] = {};
  constexpr int64_t kGroup = kLanes * kAccumulators;
  const int64_t whole = kAccumulators == 1 ? n : n - n % kGroup;
  int64_t i = 0;
  for (; i + kGroup <= whole; i += kGroup) {
    for (int64_t e = 0; e < kGroup; ++e) sums[e] = sums[e] + a[i + e] * b[i + e];
  }
  for (; i < whole; ++i) sums[i % kLanes] = sums[i % kLanes] + a[i] * b[i];  // batched order's last lanes
  add_accumulators(sums, order);
  double total = add_lanes(sums, order);
  for (; i < n; ++i) total += static_cast<double>(a[i] * b[i]);
  return static_cast<float>(total);
}

inline float dot_in_order(const float* a, const float* b, int64_t n, const SumOrder& order) {
  if (order.lanes == 16) return order.accumulators == 1 ? dot_in_order<16, 1>(a, b, n, order) : dot_in_order<16, 4>(a, b, n, order);
  return order.accumulators == 1 ? dot_in_order<8, 1>(a, b, n, order) : dot_in_order<8, 4>(a, b, n, order);
}

// out[i] = the slots sums[e * n + i] (e < order.group(); destroyed) added as
// add_accumulators then add_lanes add one column, all n columns side by side (so the
// additions vectorize over i).
inline void add_slot_rows(float* sums, int64_t n, const SumOrder& order, float* out) {
  const auto add_row = [&](int64_t to, int64_t from) {
    for (int64_t i = 0; i < n; ++i) sums[to * n + i] = sums[to * n + i] + sums[from * n + i];
  };
  const int64_t w = order.lanes;
  if (order.accumulators == 4) {
    for (int64_t l = 0; l < w; ++l) {
      add_row(l, 2 * w + l);
      add_row(w + l, 3 * w + l);
      add_row(l, w + l);
    }
  }
  for (int64_t half = w / 2; half >= 4; half /= 2) {
    for (int64_t l = 0; l < half; ++l) add_row(l, l + half);
  }
  for (int64_t i = 0; i < n; ++i) {
    out[i] = order.pairs_last ? (sums[i] + sums[n + i]) + (sums[2 * n + i] + sums[3 * n + i])
                              : (sums[i] + sums[2 * n + i]) + (sums[n + i] + sums[3 * n + i]);
  }
}

// out[i] = sum over keys j of weights[j] * values[j * n + i]; key j is KV cell
// first + j of a row that llama.cpp pads to whole groups (masked cells weigh 0 and
// add nothing), so cell c is in accumulator (c / lanes) % accumulators, lane c % lanes.
inline void weighted_sum_in_order(const float* weights, const float* values, int64_t count, int64_t n, int64_t first,
                                  const SumOrder& order, float* out) {
  thread_local std::vector<float> sums;
  const int64_t group = order.group();
  sums.assign(static_cast<size_t>(group * n), 0.0f);
  for (int64_t j = 0; j < count; ++j) {
    float* slot = sums.data() + ((first + j) % group) * n;
    const float* v = values + j * n;
    const float w = weights[j];
    for (int64_t i = 0; i < n; ++i) slot[i] = slot[i] + w * v[i];
  }
  add_slot_rows(sums.data(), n, order, out);
}

}  // namespace pico::backend
