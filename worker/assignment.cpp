#include "assignment.hpp"

#include <spdlog/spdlog.h>

#include "link_probe.hpp"

namespace pico::worker {

using protocol::Envelope;
using protocol::ErrorCode;

std::optional<Assignment> wait_for_assignment(const std::string& listen_address, const UnassignedWorker& self,
                                              const Security& security, const std::atomic<bool>& stop,
                                              const net::Timing& timing) {
  std::unique_ptr<net::ZapAuthenticator> zap = make_authenticator(security);
  zmq::socket_t router = net::make_router(listen_address, timing, security.keys ? &*security.keys : nullptr);
  const uint32_t n_layer = self.identity.n_layer;
  while (!stop.load()) {
    auto msg = net::receive(router, true, 100);
    if (!msg) continue;
    const auto reply = [&](const std::vector<uint8_t>& header) {
      if (!net::send(router, &msg->peer, header)) spdlog::warn("could not reply to peer {}", msg->peer);
    };
    std::optional<protocol::Decoded> decoded;
    try {
      decoded.emplace(msg->header_bytes());
    } catch (const std::exception& e) {
      reply(protocol::make_error(ErrorCode::MALFORMED, e.what()));
      continue;
    }
    const auto body = decoded->envelope().getBody();
    switch (decoded->which()) {
      case Envelope::Body::HELLO: {
        protocol::Builder b;
        auto caps = b.envelope().getBody().initCapabilities();
        write_host_capabilities(caps, self.threads, self.backend, self.device, self.device_memory_bytes);
        protocol::write_identity(self.identity, caps.initModel());
        write_profile(self.profile, caps.initProfile());
        caps.setCurve(security.keys.has_value());
        reply(b.encode());
        break;
      }
      case Envelope::Body::HEARTBEAT:
        reply(heartbeat_answer(body.getHeartbeat(), *msg));
        break;
      case Envelope::Body::LINK_PROBE:
        reply(answer_link_probe(body.getLinkProbe(), security.keys));
        break;
      case Envelope::Body::ASSIGN: {
        const uint32_t first = body.getAssign().getFirstLayer(), last = body.getAssign().getLastLayer();
        if (first >= last || last > n_layer) {
          reply(protocol::make_error(ErrorCode::BAD_REQUEST, "assign: layers [" + std::to_string(first) + ", " +
                                                                 std::to_string(last) + ") are not within the model's " +
                                                                 std::to_string(n_layer) + " layers"));
          break;
        }
        protocol::Builder b;
        auto done = b.envelope().getBody().initAssigned();
        done.setFirstLayer(first);
        done.setLastLayer(last);
        reply(b.encode());
        spdlog::info("assigned layers {}-{}", first, last - 1);
        return Assignment{{static_cast<int32_t>(first), static_cast<int32_t>(last)}, std::move(zap), std::move(router)};
      }
      default:
        reply(protocol::make_error(ErrorCode::BAD_REQUEST,
                                   std::string("this worker holds no layers until the coordinator assigns them "
                                               "(--layers auto); it does not take ") +
                                       protocol::body_name(decoded->which()) + " yet"));
    }
  }
  return std::nullopt;
}

}  // namespace pico::worker
