// cluster.toml: the workers in pipeline order, and scheduler settings.
//
//   [scheduler]
//   micro_batch = 32
//   max_batch_tokens = 512
//   activations = "f32"        # f32, f16, q8_0: hidden states between workers
//   chain_steps = 8            # greedy chains (SchedulerOptions::chain_steps; 0: never)
//   ctx = 4096                 # positions per sequence (default: the model's; --ctx wins)
//   parallel = 32              # sequences at once (--parallel wins); both cut to the workers' limits
//
//   [[worker]]
//   address = "tcp://10.0.0.2:7701"
//   layers = "0-15"            # optional: checked against what the worker serves
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "model/model.hpp"

namespace pico::coordinator {

struct WorkerEntry {
  std::string address;
  std::optional<model::LayerRange> layers;
};

struct ClusterConfig {
  std::vector<WorkerEntry> workers;
  std::optional<int> micro_batch;
  std::optional<int> max_batch_tokens;
  std::optional<std::string> activations;
  std::optional<int> chain_steps;
  std::optional<int64_t> ctx;
  std::optional<int> parallel;
};

// Throws std::runtime_error with the file, line and reason.
ClusterConfig load_cluster_config(const std::string& path);

}  // namespace pico::coordinator
