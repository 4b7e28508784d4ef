// The ordered stages of one model: checked at connect (model identity, layer
// coverage with no gap and no overlap), planned (each stage learns the next), then
// driven step by step: submit a batch to the first stage, wait for its logits from
// the last.
#pragma once

#include <memory>
#include <vector>

#include "stage.hpp"

namespace pico::coordinator {

class Pipeline {
 public:
  // Throws StageError when the stages do not form the model `expected` with n_layer
  // layers.
  Pipeline(std::vector<std::unique_ptr<Stage>> stages, const protocol::ModelIdentity& expected);

  size_t size() const { return stages_.size(); }
  Stage& stage(size_t i) { return *stages_.at(i); }

  // Starts a step; returns its id.
  uint64_t submit(std::span<const model::BatchToken> batch);
  // The next finished step (steps finish in the order submitted). Throws StageError
  // on an error from any stage, a lost stage, or no answer within timeout_ms.
  StepOutput wait(int timeout_ms);
  void close(int32_t seq_id);
  void truncate(int32_t seq_id, int64_t pos);

 private:
  std::vector<std::unique_ptr<Stage>> stages_;
  uint64_t next_step_ = 1;
};

// The coverage check alone (for tests): stages' [first, last) in order must tile
// [0, n_layer). Throws StageError naming the stages at fault.
void check_coverage(const std::vector<StageInfo>& stages, int32_t n_layer);

}  // namespace pico::coordinator
