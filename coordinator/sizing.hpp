// Sizing at connect: the context, the parallel sequences and the batch are cut to what
// every stage holds (StageInfo::limits, from each worker's Capabilities or a local
// stage's StageEngine), so that no stage runs out of KV while serving: for each stage,
// parallel x (KV of one sequence of ctx positions, in whole pages, + its fixed state)
// must fit the stage's budget.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "stage.hpp"

namespace pico::coordinator {

struct SizingRequest {
  int64_t ctx = 0;           // asked for (--ctx / TOML); 0: the model's
  int64_t model_ctx = 0;     // the model's context length (0: unknown, 4096 then)
  int parallel = 32;         // sequences holding KV at once (--parallel)
  int max_batch_tokens = 512;
};

struct Sizing {
  int64_t ctx = 0;
  int parallel = 0;
  int max_batch_tokens = 0;
  std::vector<std::string> notes;  // one line per value cut, naming the stage and the numbers
};

// Not even one sequence of the context fits a stage: the text says the numbers and
// what to change.
class SizingError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A stage's KV for one sequence of ctx positions (whole pages) plus its fixed state.
uint64_t sequence_bytes(const worker::StageLimits& limits, int64_t ctx);

// Throws SizingError when one sequence of the (cut) context does not fit a stage.
Sizing size_for_stages(const std::vector<StageInfo>& stages, const SizingRequest& request);

// Empty when `stage` (a stage rejoining, with the limits it has now) still holds what
// `sized` serves; else why not, in words (the cut size_for_stages would make, or its
// SizingError).
std::string rejoin_shortfall(const StageInfo& stage, const Sizing& sized);

// The coordinator's ZMQ_MAXMSGSIZE: its largest legal answer, the logits of
// max_batch_tokens rows of n_vocab F32 values or the snapshot of one sequence of ctx
// positions (bytes_per_position: the whole model's KV per position, a bound for any
// stage), plus room for the header.
uint64_t coordinator_max_message_bytes(int64_t max_batch_tokens, int64_t n_vocab, int64_t ctx,
                                       uint64_t bytes_per_position);

}  // namespace pico::coordinator
