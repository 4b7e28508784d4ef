// What a worker's profile (pico-worker --profile: time per layer at batch 1 and at
// batches of 2 ... 64) predicts for a range of its layers: the slow-worker watch's
// reference, the replan's ranking and the choice of a lane for a new sequence.
#pragma once

#include <cstddef>
#include <optional>

#include "stage.hpp"

namespace pico::coordinator {

// A worker's profiled time per token for layers [first, last) (+ the head when `head`):
// nullopt without a profile covering them.
std::optional<double> profiled_seconds(const StageInfo& info, model::LayerRange layers, bool head, bool batch);
// What its profile predicts for a step of `tokens` tokens through those layers: per
// layer, the placement's layer_step_seconds.
std::optional<double> predicted_step_seconds(const StageInfo& info, model::LayerRange layers, bool head, size_t tokens);

}  // namespace pico::coordinator
