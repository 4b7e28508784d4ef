#include "net.hpp"

#include <atomic>
#include <cerrno>
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

zmq::socket_t make_router(const std::string& bind_address, const Timing& timing) {
  check_address(bind_address);
  zmq::socket_t s(context(), zmq::socket_type::router);
  configure(s, timing);
  s.set(zmq::sockopt::router_mandatory, 1);
  // A peer that reconnects under the same routing id (a coordinator whose worker was
  // hung, then came back) takes its id over instead of being ignored.
  s.set(zmq::sockopt::router_handover, 1);
  s.bind(bind_address);
  return s;
}

zmq::socket_t make_dealer(const std::string& address, const std::string& routing_id, const Timing& timing,
                          ConnectionMonitor* monitor) {
  check_address(address);
  zmq::socket_t s(context(), zmq::socket_type::dealer);
  configure(s, timing);
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
       ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED);
}

void ConnectionMonitor::update(int timeout_ms) {
  if (!check_event(timeout_ms)) return;
  while (check_event(0)) {
  }
}

}  // namespace pico::net
