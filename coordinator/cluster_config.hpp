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
//   [security]                 # optional: CURVE on every link (see `pico keygen`)
//   secret_key = "coord.secret"  # this coordinator's secret key file
//
//   [[worker]]
//   address = "tcp://10.0.0.2:7701"
//   layers = "0-15"            # optional: checked against what the worker serves
//   public_key = "w0.public"   # with [security]: the worker's public key (a file or the Z85 key)
//   memory = "6G"              # optional: the most of its memory placement may plan for (pico plan)
//
// Relative key paths are read relative to the file's folder.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "model/model.hpp"

namespace pico::coordinator {

struct WorkerEntry {
  std::string address;
  std::optional<model::LayerRange> layers;
  std::string public_key;  // Z85; empty: an open link
  std::optional<uint64_t> memory;  // placement plans for at most this much of its memory
};

struct ClusterConfig {
  std::vector<WorkerEntry> workers;
  std::optional<int> micro_batch;
  std::optional<int> max_batch_tokens;
  std::optional<std::string> activations;
  std::optional<int> chain_steps;
  std::optional<int64_t> ctx;
  std::optional<int> parallel;
  std::optional<std::string> secret_key;  // [security] secret_key, as a path
};

// Throws std::runtime_error with the file, line and reason.
ClusterConfig load_cluster_config(const std::string& path);

// A cluster's links are all CURVE (a secret key here and a public key for every
// worker) or all open; throws std::invalid_argument naming what is missing.
void check_security(const std::vector<WorkerEntry>& workers, bool have_secret_key);

}  // namespace pico::coordinator
