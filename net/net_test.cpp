#include "net.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

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

// Counts its destructions: tells when ZeroMQ released a buffer handed over to it.
struct Tracked {
  uint8_t value = 0;
  static inline std::atomic<int> destroyed{0};
  ~Tracked() { ++destroyed; }
};

TEST(Net, OwnedFramesAreSentWithoutACopy) {
  // Over inproc:// a frame reaches the receiver as it was sent, so the receiver sees
  // the very buffer the sender handed over if no one copied it.
  zmq::socket_t router(context(), zmq::socket_type::router);
  router.bind("inproc://pico-net-test-zero-copy");
  zmq::socket_t dealer(context(), zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::routing_id, "zc");
  dealer.connect("inproc://pico-net-test-zero-copy");
  std::vector<float> values(4096);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
  const std::vector<float> expected = values;
  const void* buffer = values.data();
  std::vector<zmq::message_t> frames;
  frames.push_back(owned_frame(std::move(values)));
  EXPECT_EQ(frames[0].data(), buffer);
  ASSERT_TRUE(send(dealer, nullptr, protocol::make_heartbeat(), std::move(frames)));
  auto got = receive(router, true, 2000);
  ASSERT_TRUE(got.has_value());
  ASSERT_EQ(got->payloads.size(), 1u);
  EXPECT_EQ(got->payloads[0].data(), buffer) << "the payload was copied on its way";
  ASSERT_EQ(got->payloads[0].size(), expected.size() * sizeof(float));
  EXPECT_EQ(std::memcmp(got->payloads[0].data(), expected.data(), got->payloads[0].size()), 0);
}

TEST(Net, OwnedFramesRoundTripAndAreReleased) {
  const std::string address = ipc_address("owned");
  zmq::socket_t router = make_router(address);
  zmq::socket_t dealer = make_dealer(address, "owner");
  Tracked::destroyed = 0;
  std::vector<zmq::message_t> frames;
  {
    std::vector<Tracked> tracked(100);
    for (size_t i = 0; i < tracked.size(); ++i) tracked[i].value = static_cast<uint8_t>(i * 3);
    frames.push_back(owned_frame(std::move(tracked)));
  }
  frames.push_back(owned_frame(std::vector<uint8_t>{}));  // an empty frame stays a frame
  frames.push_back(owned_frame(std::vector<uint8_t>{7, 8, 9}));
  EXPECT_EQ(Tracked::destroyed.load(), 0);  // owned by the frame now
  ASSERT_TRUE(send(dealer, nullptr, protocol::make_heartbeat(), std::move(frames)));
  auto got = receive(router, true, 2000);
  ASSERT_TRUE(got.has_value());
  ASSERT_EQ(got->payloads.size(), 3u);
  ASSERT_EQ(got->payload_bytes(0).size(), 100u);
  for (size_t i = 0; i < 100; ++i) EXPECT_EQ(got->payload_bytes(0)[i], static_cast<uint8_t>(i * 3));
  EXPECT_EQ(got->payload_bytes(1).size(), 0u);
  EXPECT_EQ(got->payload_bytes(2).size(), 3u);
  EXPECT_EQ(got->payload_bytes(2)[2], 9);
  // ZeroMQ released the buffer once sent (from its I/O thread).
  for (int i = 0; i < 200 && Tracked::destroyed.load() < 100; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(Tracked::destroyed.load(), 100);
}

}  // namespace
}  // namespace pico::net
