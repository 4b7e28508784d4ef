// What this worker's hardware does with a model, for the coordinator's placement
// (coordinator/placement.hpp): the time of each layer at a batch of one token (decode,
// after a prefill-sized context) and per token of batches of 2, 4, 8 ... tokens up to a
// prefill-sized one (a step's cost is far from a line in its tokens: one token takes a
// matrix-vector product, two already a matrix product), the output head's likewise,
// and the memory the worker offers for weights + KV + state.
// Layers whose tensors have the same names, types and shapes cost the same, so each
// kind of layer is measured once, on its first layer, with the stage's backend and
// thread count. pico-worker measures at start unless a cached profile of the same
// model, backend, device, CPU level, threads and batch exists (`--profile` measures
// anew and prints it); Capabilities carries it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gguf/reader.hpp"
#include "model/model.hpp"
#include "protocol.hpp"
#include "stage_engine.hpp"

namespace pico::worker {

struct LayerTime {
  double decode_seconds = 0;              // one token
  std::vector<double> seconds_per_token;  // per token of a batch of each of WorkerProfile::batches
};

// The batches a profile measures: 2, 4, 8 ... below `batch`, and `batch` (> 1) itself.
std::vector<int> profile_batches(int batch);

struct WorkerProfile {
  uint64_t model_hash = 0;
  std::string backend, isa, device;  // device: "name, driver" (empty on the CPU)
  int device_index = 0;
  int threads = 0;
  int batch = 0;                  // tokens of the prefill-sized batch
  std::vector<int> batches;       // profile_batches(batch): the batches measured, ascending
  std::vector<LayerTime> layers;  // every layer of the model
  LayerTime head;                 // output norm and head, per token
  uint64_t memory_bytes = 0;      // offered for weights + KV + state (measured at start, not cached)
};

struct ProfileOptions {
  int batch = 64;         // tokens of the largest batch (also the decode's context)
  int decode_tokens = 8;  // decode steps timed at most, one token each
  int repeats = 3;        // prefills timed at most; the median is kept
  double budget_seconds = 0.5;  // no further repeat of a measure once it took this long
  // CPUs this process may use over time (its cgroup's quota, model::cpu_quota); 0:
  // none. A run shorter than the quota's period takes a whole CPU and a later one
  // waits, so each run counts at least its CPU time over the quota (a node in a
  // container with a CPU limit, or an emulated slower one, is measured at its
  // sustained speed, not its burst).
  double cpu_quota = 0;
};

// Measures every kind of layer of the model on a backend like the stage's (opened
// anew: the stage's own backend and cache stay untouched).
WorkerProfile measure_profile(const gguf::Model& file, const model::Model& model, const StageBackendOptions& backend,
                              int threads, const ProfileOptions& options = {});

// The memory a worker offers for weights + KV + state: a device backend's memory
// (device_memory_bytes, capped by --device-memory), else MemAvailable less a tenth.
uint64_t offered_memory_bytes(const StageBackendOptions& backend, uint64_t device_memory_bytes);

// The cache: $PICO_CACHE_DIR, else $XDG_CACHE_HOME/pico, else ~/.cache/pico; one JSON
// file per model, backend, device index, CPU level (this host's), threads, batch and
// CPU quota (where one is set).
std::string profile_cache_path(uint64_t model_hash, const StageBackendOptions& backend, int threads, int batch,
                               double cpu_quota = 0);
// nullopt when there is no file, or it does not parse, or it is not a profile of this
// model with n_layer layers on this device (a warning says which).
std::optional<WorkerProfile> load_profile(const std::string& path, uint64_t model_hash, int32_t n_layer,
                                          const std::string& device);
// Written to a temporary file and renamed: a reader never sees half of one. A failure
// is logged, not thrown (the worker serves without its cache).
void save_profile(const std::string& path, const WorkerProfile& profile);

std::string profile_to_json(const WorkerProfile& profile);
// Throws std::invalid_argument naming what is wrong.
WorkerProfile profile_from_json(const std::string& text);

// A table for --profile: each kind of layer once with its layers, the head, the memory.
std::string format_profile(const WorkerProfile& profile);

// Capabilities.profile, both ways. read_profile throws std::invalid_argument for one
// that does not give a finite, non-negative time for each of n_layer layers.
void write_profile(const WorkerProfile& profile, protocol::schema::Profile::Builder out);
std::optional<WorkerProfile> read_profile(protocol::schema::Profile::Reader in, int32_t n_layer);

}  // namespace pico::worker
