#include "link_probe.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "net.hpp"

namespace pico::worker {

using protocol::Envelope;

namespace {

// The fastest round trip of `tries` heartbeats carrying probe_bytes (seconds); nullopt
// when one is not answered within timeout_ms.
std::optional<double> fastest_round_trip(zmq::socket_t& dealer, uint64_t probe_bytes, int tries, int timeout_ms) {
  double best = 1e30;
  for (int i = 0; i < tries; ++i) {
    const uint64_t t0 = protocol::steady_nanos();
    std::vector<zmq::message_t> payload;
    if (probe_bytes > 0) payload.emplace_back(static_cast<size_t>(probe_bytes));
    if (!net::send(dealer, nullptr, protocol::make_heartbeat_request(t0, probe_bytes), std::move(payload))) {
      return std::nullopt;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      auto msg = net::receive(dealer, false, static_cast<int>(left.count()));
      const uint64_t t2 = protocol::steady_nanos();
      if (!msg) return std::nullopt;
      try {
        protocol::Decoded d(msg->header_bytes());
        if (d.which() != Envelope::Body::HEARTBEAT) continue;
        const auto answer = d.envelope().getBody().getHeartbeat();
        if (answer.getEchoNanos() != t0 || answer.getProbeBytes() != probe_bytes) continue;
      } catch (const std::exception&) {
        continue;
      }
      best = std::min(best, static_cast<double>(t2 - t0) * 1e-9);
      break;
    }
  }
  return best;
}

}  // namespace

LinkResult measure_link(const std::string& address, const std::string& public_key,
                        const std::optional<net::KeyPair>& own_keys, uint64_t probe_bytes, int timeout_ms) {
  LinkResult r;
  try {
    const net::Curve curve{own_keys ? *own_keys : net::KeyPair{}, public_key};
    zmq::socket_t dealer = net::make_dealer(address, "link-probe-" + std::to_string(::getpid()), {}, nullptr,
                                            own_keys ? &curve : nullptr);
    dealer.set(zmq::sockopt::linger, 0);
    const std::optional<double> empty = fastest_round_trip(dealer, 0, 4, timeout_ms);
    const std::optional<double> loaded = empty ? fastest_round_trip(dealer, probe_bytes, 3, timeout_ms) : std::nullopt;
    if (!loaded) {
      r.error = "no answer from " + address + " within " + std::to_string(timeout_ms) + " ms";
      return r;
    }
    r.latency_seconds = *empty / 2;
    const double bytes = static_cast<double>(probe_bytes);
    r.bytes_per_second = bytes / std::max(*loaded - *empty, bytes / 1e11);
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  return r;
}

std::vector<uint8_t> answer_link_probe(protocol::schema::LinkProbe::Reader probe,
                                       const std::optional<net::KeyPair>& own_keys) {
  const std::string address = probe.getAddress().cStr();
  const uint64_t bytes = probe.getProbeBytes();
  if (address.empty() || bytes == 0 || bytes > kMaxLinkProbeBytes) {
    return protocol::make_error(protocol::ErrorCode::BAD_REQUEST,
                                "linkProbe: an address and 1 to " + std::to_string(kMaxLinkProbeBytes) +
                                    " probe bytes (got " + std::to_string(bytes) + ")");
  }
  const LinkResult r = measure_link(address, probe.getPublicKey().cStr(), own_keys, bytes);
  protocol::Builder b;
  auto m = b.envelope().getBody().initLinkMeasured();
  m.setAddress(address);
  m.setLatencySeconds(r.latency_seconds);
  m.setBytesPerSecond(r.bytes_per_second);
  m.setError(r.error);
  return b.encode();
}

}  // namespace pico::worker
