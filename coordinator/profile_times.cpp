#include "profile_times.hpp"

#include "placement.hpp"

namespace pico::coordinator {

namespace {
// The sum of time(a layer's measures) over layers [first, last) of the worker's profile
// (+ the head's); nullopt without a profile covering them.
template <class Time>
std::optional<double> over_profile(const StageInfo& info, model::LayerRange layers, bool head, Time&& time) {
  if (!info.profile || layers.last > static_cast<int32_t>(info.profile->layers.size())) return std::nullopt;
  double total = head ? time(info.profile->head) : 0.0;
  for (int32_t l = layers.first; l < layers.last; ++l) total += time(info.profile->layers[static_cast<size_t>(l)]);
  return total;
}
}  // namespace

std::optional<double> profiled_seconds(const StageInfo& info, model::LayerRange layers, bool head, bool batch) {
  return over_profile(info, layers, head, [&](const worker::LayerTime& t) {
    return batch && !t.seconds_per_token.empty() ? t.seconds_per_token.back() : t.decode_seconds;
  });
}

std::optional<double> predicted_step_seconds(const StageInfo& info, model::LayerRange layers, bool head, size_t tokens) {
  return over_profile(info, layers, head, [&](const worker::LayerTime& t) {
    return layer_step_seconds(t.decode_seconds, info.profile->batches, t.seconds_per_token, static_cast<double>(tokens));
  });
}

}  // namespace pico::coordinator
