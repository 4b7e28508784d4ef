// pico-worker --layers auto: a worker that holds no layer yet. It answers hello with
// what the coordinator's placement needs (model identity, profile, host and backend;
// no range: firstLayer == lastLayer == 0, no limits), heartbeats (clock, bandwidth
// probes) and one assign (protocol Assign): a valid range is answered `assigned` and
// returned, and the worker then loads it and serves on the same socket. Anything else
// is refused, saying the worker waits for its layers.
#pragma once

#include <atomic>
#include <optional>
#include <string>

#include "model/model.hpp"
#include "profile.hpp"
#include "protocol.hpp"
#include "server.hpp"

namespace pico::worker {

struct UnassignedWorker {
  protocol::ModelIdentity identity;
  WorkerProfile profile;
  int threads = 0;
  std::string backend, device;
  uint64_t device_memory_bytes = 0;
};

// The assigned range, and the ROUTER bound at the worker's address (with its ZAP
// handler when keyed) for the worker's Server to go on with: what arrives while the
// range loads waits in it (no rebinding, so no connection races a closing socket).
struct Assignment {
  model::LayerRange layers;
  std::unique_ptr<net::ZapAuthenticator> zap;  // before router: it must outlive it
  zmq::socket_t router;
};

// Serves at listen_address until an assign of a range within the model comes
// (returned, after its answer) or `stop` is set (nullopt).
std::optional<Assignment> wait_for_assignment(const std::string& listen_address, const UnassignedWorker& self,
                                              const Security& security, const std::atomic<bool>& stop,
                                              const net::Timing& timing = {});

}  // namespace pico::worker
