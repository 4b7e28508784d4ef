// A worker's measure of its link to another worker (protocol LinkProbe), for the
// coordinator's placement: heartbeat round trips to the other worker, empty (latency:
// half the fastest) and carrying a probe payload (bandwidth: its bytes over the extra
// time).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "curve.hpp"
#include "protocol.hpp"

namespace pico::worker {

struct LinkResult {
  double latency_seconds = 0;
  double bytes_per_second = 0;
  std::string error;  // empty: measured
};

constexpr uint64_t kMaxLinkProbeBytes = uint64_t{64} << 20;

// Connects to `address` (a CURVE client when own_keys is set: public_key is the other
// worker's) and times 4 empty heartbeats and 3 carrying probe_bytes; error set when a
// round trip takes longer than timeout_ms or the address is not one.
LinkResult measure_link(const std::string& address, const std::string& public_key,
                        const std::optional<net::KeyPair>& own_keys, uint64_t probe_bytes, int timeout_ms = 2000);

// The answer to a LinkProbe (linkMeasured; an error for a probe beyond
// kMaxLinkProbeBytes or without an address).
std::vector<uint8_t> answer_link_probe(protocol::schema::LinkProbe::Reader probe,
                                       const std::optional<net::KeyPair>& own_keys);

}  // namespace pico::worker
