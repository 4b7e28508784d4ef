#include "net.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include "protocol.hpp"

namespace pico::net {
namespace {

std::string ipc_address(const char* tag) {
  return "ipc:///tmp/pico-net-test-" + std::to_string(::getpid()) + "-" + tag;
}

TEST(Net, RejectsOtherSchemes) {
  EXPECT_THROW(check_address("http://x"), std::invalid_argument);
  EXPECT_NO_THROW(check_address("tcp://127.0.0.1:1"));
  EXPECT_NO_THROW(check_address("ipc:///tmp/x"));
}

TEST(Net, HeaderAndPayloadFramesRoundTrip) {
  const std::string address = ipc_address("frames");
  zmq::socket_t router = make_router(address);
  ConnectionMonitor monitor;
  zmq::socket_t dealer = make_dealer(address, "client-1", {}, &monitor);
  const std::vector<uint8_t> header = protocol::make_heartbeat();
  const std::vector<std::vector<uint8_t>> payloads{{1, 2, 3}, {}, {4}};
  ASSERT_TRUE(send(dealer, nullptr, header, payloads));
  auto got = receive(router, true, 2000);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->peer, "client-1");
  EXPECT_EQ(std::vector<uint8_t>(got->header_bytes().begin(), got->header_bytes().end()), header);
  ASSERT_EQ(got->payloads.size(), 3u);
  EXPECT_EQ(got->payload_bytes(0).size(), 3u);
  EXPECT_EQ(got->payload_bytes(1).size(), 0u);
  EXPECT_EQ(got->payload_bytes(2)[0], 4);
  // And back through the ROUTER by routing id.
  const std::string peer = got->peer;
  ASSERT_TRUE(send(router, &peer, header));
  auto back = receive(dealer, false, 2000);
  ASSERT_TRUE(back.has_value());
  EXPECT_TRUE(back->payloads.empty());
  protocol::Decoded d(back->header_bytes());
  EXPECT_EQ(d.which(), protocol::Envelope::Body::HEARTBEAT);
  monitor.update(100);
  EXPECT_TRUE(monitor.connected());
  EXPECT_FALSE(monitor.lost());
}

TEST(Net, ReceiveTimesOut) {
  zmq::socket_t router = make_router(ipc_address("timeout"));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(receive(router, true, 50).has_value());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(45));
}

TEST(Net, UnknownPeerIsReportedNotDropped) {
  zmq::socket_t router = make_router(ipc_address("unknown"));
  const std::string peer = "nobody";
  EXPECT_FALSE(send(router, &peer, protocol::make_heartbeat()));
}

TEST(Net, MonitorSeesAPeerGo) {
  const std::string address = ipc_address("monitor");
  auto router = std::make_unique<zmq::socket_t>(make_router(address));
  ConnectionMonitor monitor;
  zmq::socket_t dealer = make_dealer(address, "watcher", {}, &monitor);
  for (int i = 0; i < 20 && !monitor.connected(); ++i) monitor.update(100);
  ASSERT_TRUE(monitor.connected());
  router.reset();
  for (int i = 0; i < 20 && !monitor.lost(); ++i) monitor.update(100);
  EXPECT_TRUE(monitor.lost());
}

}  // namespace
}  // namespace pico::net
