#include "net.hpp"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <stdexcept>

namespace pico::net {

zmq::context_t& context() {
  static zmq::context_t ctx(1);
  return ctx;
}

namespace {
std::atomic<int64_t> g_max_message_bytes{int64_t{1} << 31};
}  // namespace

void set_max_message_bytes(int64_t bytes) { g_max_message_bytes = bytes; }
int64_t max_message_bytes() { return g_max_message_bytes.load(); }

void check_address(const std::string& address) {
  if (address.rfind("tcp://", 0) != 0 && address.rfind("ipc://", 0) != 0) {
    throw std::invalid_argument("address '" + address + "' is neither tcp://host:port nor ipc://path");
  }
}

namespace {

void configure(zmq::socket_t& s, const Timing& t) {
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::heartbeat_ivl, t.heartbeat_ivl_ms);
  s.set(zmq::sockopt::heartbeat_timeout, t.heartbeat_timeout_ms);
  s.set(zmq::sockopt::heartbeat_ttl, t.heartbeat_timeout_ms);
  s.set(zmq::sockopt::reconnect_ivl, t.reconnect_ivl_ms);
  s.set(zmq::sockopt::reconnect_ivl_max, 1000);
  s.set(zmq::sockopt::maxmsgsize, max_message_bytes());
}

}  // namespace

zmq::socket_t make_router(const std::string& bind_address, const Timing& timing, const KeyPair* curve) {
  check_address(bind_address);
  zmq::socket_t s(context(), zmq::socket_type::router);
  configure(s, timing);
  if (curve) set_curve_server(s, *curve);
  s.set(zmq::sockopt::router_mandatory, 1);
  // A peer that reconnects under the same routing id (a coordinator whose worker was
  // hung, then came back) takes its id over instead of being ignored.
  s.set(zmq::sockopt::router_handover, 1);
  s.bind(bind_address);
  return s;
}

zmq::socket_t make_dealer(const std::string& address, const std::string& routing_id, const Timing& timing,
                          ConnectionMonitor* monitor, const Curve* curve) {
  check_address(address);
  zmq::socket_t s(context(), zmq::socket_type::dealer);
  configure(s, timing);
  if (curve) set_curve_client(s, *curve);
  if (!routing_id.empty()) s.set(zmq::sockopt::routing_id, zmq::buffer(routing_id));
  if (monitor) monitor->watch(s, routing_id.empty() ? std::string("dealer") : routing_id);
  s.connect(address);
  return s;
}

bool send(zmq::socket_t& socket, const std::string* peer, std::span<const uint8_t> header,
          std::span<const std::vector<uint8_t>> payloads) {
  try {
    const auto more = zmq::send_flags::sndmore | zmq::send_flags::dontwait;
    if (peer && !socket.send(zmq::buffer(*peer), more)) return false;
    const bool last_is_header = payloads.empty();
    if (!socket.send(zmq::buffer(header.data(), header.size()),
                     last_is_header ? zmq::send_flags::dontwait : more)) {
      return false;
    }
    for (size_t i = 0; i < payloads.size(); ++i) {
      const auto flags = i + 1 == payloads.size() ? zmq::send_flags::dontwait : more;
      // The frame's bytes are copied: a payload may be freed right after the call.
      if (!socket.send(zmq::buffer(payloads[i].data(), payloads[i].size()), flags)) return false;
    }
    return true;
  } catch (const zmq::error_t&) {
    return false;  // EHOSTUNREACH: the peer is gone
  }
}

bool send(zmq::socket_t& socket, const std::string* peer, std::span<const uint8_t> header,
          std::vector<zmq::message_t>&& payloads) {
  try {
    const auto more = zmq::send_flags::sndmore | zmq::send_flags::dontwait;
    if (peer && !socket.send(zmq::buffer(*peer), more)) return false;
    if (!socket.send(zmq::buffer(header.data(), header.size()),
                     payloads.empty() ? zmq::send_flags::dontwait : more)) {
      return false;
    }
    for (size_t i = 0; i < payloads.size(); ++i) {
      // The frame is moved into ZeroMQ: its buffer is freed by ZeroMQ once sent.
      if (!socket.send(payloads[i], i + 1 == payloads.size() ? zmq::send_flags::dontwait : more)) return false;
    }
    return true;
  } catch (const zmq::error_t&) {
    return false;  // EHOSTUNREACH: the peer is gone
  }
}

bool routable(zmq::socket_t& router, const std::string& peer, std::span<const uint8_t> probe) {
  try {
    if (!router.send(zmq::buffer(peer), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) return true;
    (void)router.send(zmq::buffer(probe.data(), probe.size()), zmq::send_flags::dontwait);
    return true;
  } catch (const zmq::error_t& e) {
    return e.num() != EHOSTUNREACH;
  }
}

std::optional<Received> receive(zmq::socket_t& socket, bool from_router, int timeout_ms) {
  std::vector<zmq::message_t> frames;
  try {
    // A blocking recv with a timeout: on the hot path (a forward, logits) it makes
    // fewer system calls after the wake-up than zmq_poll followed by recv.
    socket.set(zmq::sockopt::rcvtimeo, timeout_ms);
    zmq::message_t first;
    if (!socket.recv(first)) return std::nullopt;  // timed out
    bool more = first.more();
    frames.push_back(std::move(first));
    while (more) {  // a multipart message arrives whole: its other frames are there
      zmq::message_t m;
      if (!socket.recv(m, zmq::recv_flags::dontwait)) break;
      more = m.more();
      frames.push_back(std::move(m));
    }
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return std::nullopt;  // a signal: let the caller look at its stop flag
    throw;
  }
  if (frames.empty()) return std::nullopt;
  Received r;
  size_t i = 0;
  if (from_router) r.peer = frames[i++].to_string();
  if (i < frames.size()) r.header = std::move(frames[i++]);
  for (; i < frames.size(); ++i) r.payloads.push_back(std::move(frames[i]));
  return r;
}

void ConnectionMonitor::watch(zmq::socket_t& socket, const std::string& name) {
  static std::atomic<int> counter{0};
  init(socket, "inproc://monitor-" + name + "-" + std::to_string(counter++),
       ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
           ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
           ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
}

// A client sees these (checked with libzmq 4.3.4): a CURVE server refusing its key
// (ZAP 400) as an auth failure, without reconnecting; a server key that does not match
// the server's secret as a failure without detail (the server drops the connection),
// retried at every reconnect; mechanisms that differ (CURVE against none) as a
// protocol error, or, when the server dropped the connection before the client read
// why, as a failure without detail.
void ConnectionMonitor::on_event_handshake_failed_no_detail(const zmq_event_t& e, const char*) {
  if (handshake_failure_.empty()) {
    handshake_kind_ = Handshake::dropped;
    handshake_failure_ = "the peer dropped the connection during the handshake (" +
                         std::string(zmq_strerror(e.value)) + ")";
  }
}

void ConnectionMonitor::on_event_handshake_failed_protocol(const zmq_event_t& e, const char*) {
  if (!handshake_failure_.empty()) return;
  handshake_kind_ = e.value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH ? Handshake::mechanism_mismatch
                                                                          : Handshake::protocol_error;
  switch (e.value) {
    case ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
      handshake_failure_ = "the two sides' security does not match (CURVE keys on one side only)";
      break;
    case ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
      handshake_failure_ = "a CURVE cryptographic error (the keys do not belong together)";
      break;
    default: {
      char code[16];
      std::snprintf(code, sizeof code, "0x%x", static_cast<unsigned>(e.value));
      handshake_failure_ = std::string("a ZMTP protocol error during the handshake (") + code + ")";
    }
  }
}

void ConnectionMonitor::on_event_handshake_failed_auth(const zmq_event_t& e, const char*) {
  if (handshake_failure_.empty()) {
    handshake_kind_ = Handshake::key_refused;
    handshake_failure_ = "the peer refused this side's CURVE key (status " + std::to_string(e.value) +
                         "): it is not among the peer's authorized keys";
  }
}

void ConnectionMonitor::update(int timeout_ms) {
  // Bounded: a peer that keeps connecting and failing (an address that refuses, a
  // handshake that keeps failing) queues events as fast as they are read, and an
  // unbounded drain would never return. The rest waits for the next call.
  constexpr int kMaxEventsPerUpdate = 64;
  if (!check_event(timeout_ms)) return;
  for (int events = 1; events < kMaxEventsPerUpdate && check_event(0); ++events) {
  }
}

}  // namespace pico::net
