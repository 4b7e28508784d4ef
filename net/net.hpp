// The ZeroMQ transport: one ROUTER per worker (bound at --listen), DEALERs toward it
// (the coordinator, one per worker, and each worker toward the next stage). A message
// is a Cap'n Proto envelope frame followed by zero or more payload frames; a ROUTER
// sees the sender's routing id first. Liveness: ZMTP heartbeats on every socket (the
// I/O thread answers them, so a busy worker is not taken for a dead one) and a socket
// monitor that reports when a peer's connection drops.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "curve.hpp"

namespace pico::net {

// Timings shared by both sides.
struct Timing {
  int heartbeat_ivl_ms = 200;      // ZMTP PING interval
  int heartbeat_timeout_ms = 1000; // no traffic for this long: the connection is dropped
  int reconnect_ivl_ms = 100;
};

zmq::context_t& context();

// ZMQ_MAXMSGSIZE of the sockets made from now on: the largest frame a peer may send
// one (a larger frame drops that peer's connection). ZeroMQ copies socket options
// when it binds or connects, so this is set before the sockets are made. Default 2 GiB.
void set_max_message_bytes(int64_t bytes);
int64_t max_message_bytes();

// tcp://host:port or ipc://path (throws std::invalid_argument otherwise).
void check_address(const std::string& address);

// A bound ROUTER that reports unroutable sends (ROUTER_MANDATORY) instead of dropping them.
// With `curve` it is a CURVE server with that key pair (a ZapAuthenticator decides
// which clients get in).
zmq::socket_t make_router(const std::string& bind_address, const Timing& timing = {},
                          const KeyPair* curve = nullptr);
class ConnectionMonitor;
// A DEALER connected to `address`; `routing_id` names it to the ROUTER (empty: zmq's).
// A monitor given here watches the socket from before it connects. With `curve` it is
// a CURVE client.
zmq::socket_t make_dealer(const std::string& address, const std::string& routing_id = {}, const Timing& timing = {},
                          ConnectionMonitor* monitor = nullptr, const Curve* curve = nullptr);

// Whether a ROUTER still has a connection to `peer`: sends it `probe` (a message the
// peer ignores) and reports false only when the routing id is unknown (EHOSTUNREACH:
// the peer disconnected, or its heartbeats stopped past the timeout). A peer whose
// queue is full counts as connected.
bool routable(zmq::socket_t& router, const std::string& peer, std::span<const uint8_t> probe);

// A received message: the sender (ROUTER sockets only), the header frame, payloads.
struct Received {
  std::string peer;
  zmq::message_t header;
  std::vector<zmq::message_t> payloads;
  std::span<const uint8_t> header_bytes() const {
    return {static_cast<const uint8_t*>(header.data()), header.size()};
  }
  std::span<const uint8_t> payload_bytes(size_t i) const {
    return {static_cast<const uint8_t*>(payloads.at(i).data()), payloads.at(i).size()};
  }
};

// Sends [peer] header payloads... as one multipart message. Returns false when the
// message could not be queued (peer unknown to a ROUTER, or the queue is full).
bool send(zmq::socket_t& socket, const std::string* peer, std::span<const uint8_t> header,
          std::span<const std::vector<uint8_t>> payloads = {});

// A frame that owns its buffer: the vector is moved in and ZeroMQ frees it once the
// frame is sent, so the payload is never copied on our side (zero-copy send).
template <class T>
zmq::message_t owned_frame(std::vector<T>&& buffer) {
  if (buffer.empty()) return zmq::message_t();
  auto* owner = new std::vector<T>(std::move(buffer));
  return zmq::message_t(
      owner->data(), owner->size() * sizeof(T),
      [](void*, void* hint) { delete static_cast<std::vector<T>*>(hint); }, owner);
}

// As send() above, handing the frames over to ZeroMQ (see owned_frame).
bool send(zmq::socket_t& socket, const std::string* peer, std::span<const uint8_t> header,
          std::vector<zmq::message_t>&& payloads);

// Receives one message within timeout (ms; -1 waits forever), or nullopt. With
// `from_router`, the first frame is the sender's id. A message with no header frame
// comes back with an empty header (the caller answers it as malformed).
std::optional<Received> receive(zmq::socket_t& socket, bool from_router, int timeout_ms);

// Watches a socket's connection: connected() once a peer is up, lost() once it went
// down after that; handshake_failure() once a ZMTP handshake failed (security
// mechanisms that do not match, a wrong server key, a client key the server refused).
class ConnectionMonitor : private zmq::monitor_t {
 public:
  void watch(zmq::socket_t& socket, const std::string& name);
  // Reads pending events, at most 64 a call (waits up to timeout_ms for the first).
  void update(int timeout_ms = 0);
  bool connected() const { return connected_; }
  bool lost() const { return lost_; }
  bool handshake_succeeded() const { return handshake_succeeded_; }
  enum class Handshake { ok, mechanism_mismatch, key_refused, dropped, protocol_error };
  // The first failed handshake: what kind, and in words (empty while none failed).
  Handshake handshake_failure_kind() const { return handshake_kind_; }
  const std::string& handshake_failure() const { return handshake_failure_; }

 private:
  void on_event_connected(const zmq_event_t&, const char*) override { connected_ = true; }
  void on_event_disconnected(const zmq_event_t&, const char*) override {
    if (connected_) lost_ = true;
  }
  void on_event_handshake_succeeded(const zmq_event_t&, const char*) override { handshake_succeeded_ = true; }
  void on_event_handshake_failed_no_detail(const zmq_event_t& e, const char*) override;
  void on_event_handshake_failed_protocol(const zmq_event_t& e, const char*) override;
  void on_event_handshake_failed_auth(const zmq_event_t& e, const char*) override;
  bool connected_ = false;
  bool lost_ = false;
  bool handshake_succeeded_ = false;
  Handshake handshake_kind_ = Handshake::ok;
  std::string handshake_failure_;
};

}  // namespace pico::net
