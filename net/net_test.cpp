#include "net.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
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

// ---- CURVE -------------------------------------------------------------------

// libzmq's CURVE test vectors (tests/testutil_security.cpp): key pairs that belong together.
const char* const kServerPublic = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7";
const char* const kServerSecret = "JTKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6";
const char* const kClientPublic = "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID";
const char* const kClientSecret = "D:)Q[IlAW!ahhC2ac:9*A}h:p?([4%wOTJ%JR%cs";

class KeyFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("pico-keys-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text, std::filesystem::perms mode =
                                                                           std::filesystem::perms::owner_read |
                                                                           std::filesystem::perms::owner_write) {
    const auto path = dir_ / name;
    std::ofstream(path) << text;
    std::filesystem::permissions(path, mode);
    return path.string();
  }
  std::filesystem::path dir_;
};

std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

TEST(Curve, Z85Keys) {
  EXPECT_TRUE(is_z85_key(kServerPublic));
  EXPECT_FALSE(is_z85_key(std::string(kServerPublic).substr(0, 39)));
  EXPECT_FALSE(is_z85_key(std::string(kServerPublic) + "x"));
  EXPECT_FALSE(is_z85_key(std::string(39, 'a') + "\""));  // '"' is not in the alphabet
  EXPECT_EQ(public_key_of(kServerSecret), kServerPublic);
  EXPECT_EQ(public_key_of(kClientSecret), kClientPublic);
  EXPECT_THROW(public_key_of("short"), std::invalid_argument);
  const KeyPair a = generate_key_pair(), b = generate_key_pair();
  EXPECT_NE(a.secret_key, b.secret_key);
  EXPECT_EQ(public_key_of(a.secret_key), a.public_key);
}

TEST_F(KeyFiles, ReadsKeyFilesAndNamesTheBadOnes) {
  const KeyPair k = read_secret_key_file(write("c.secret", std::string(kClientSecret) + "\n"));
  EXPECT_EQ(k.secret_key, kClientSecret);
  EXPECT_EQ(k.public_key, kClientPublic);
  EXPECT_EQ(read_public_key_file(write("s.public", std::string("  ") + kServerPublic + "\r\n")), kServerPublic);
  const std::string open_secret = write("open.secret", kClientSecret, std::filesystem::perms::owner_read |
                                                                       std::filesystem::perms::group_read);
  EXPECT_NE(what_of([&] { read_secret_key_file(open_secret); }).find("readable by other users"), std::string::npos);
  const std::string bad = write("bad.public", "not a key");
  EXPECT_NE(what_of([&] { read_public_key_file(bad); }).find(bad), std::string::npos);
  EXPECT_NE(what_of([&] { read_public_key_file((dir_ / "missing").string()); }).find("cannot read"), std::string::npos);
  const std::string big = write("big.public", std::string(10000, 'a'));
  EXPECT_NE(what_of([&] { read_public_key_file(big); }).find("not a key file"), std::string::npos);
  // A command-line value: the key itself or a file holding it.
  EXPECT_EQ(public_key_from(kServerPublic), kServerPublic);
  EXPECT_EQ(public_key_from((dir_ / "s.public").string()), kServerPublic);
}

TEST_F(KeyFiles, AuthorizedKeysSkipCommentsAndBlankLines) {
  const std::string path = write("authorized", std::string("# the coordinator\n") + kClientPublic + "\n\n   \n" +
                                                   "  " + kServerPublic + "  \n# end");
  EXPECT_EQ(read_authorized_keys(path), (std::vector<std::string>{kClientPublic, kServerPublic}));
  const std::string bad = write("bad", std::string(kClientPublic) + "\nnot-a-key\n");
  EXPECT_NE(what_of([&] { read_authorized_keys(bad); }).find(bad + ":2:"), std::string::npos);
  const std::string none = write("none", "# nobody\n\n");
  EXPECT_NE(what_of([&] { read_authorized_keys(none); }).find("lists no key"), std::string::npos);
}

TEST_F(KeyFiles, WritesKeyPairsWithoutOverwriting) {
  const std::string name = (dir_ / "node").string();
  const KeyPair k = write_key_files(name);
  EXPECT_EQ(read_secret_key_file(name + ".secret").secret_key, k.secret_key);
  EXPECT_EQ(read_public_key_file(name + ".public"), k.public_key);
  EXPECT_EQ(public_key_of(k.secret_key), k.public_key);
  const auto mode = std::filesystem::status(name + ".secret").permissions();
  EXPECT_EQ(mode & (std::filesystem::perms::group_all | std::filesystem::perms::others_all),
            std::filesystem::perms::none);
  EXPECT_NE(what_of([&] { write_key_files(name); }).find("exists"), std::string::npos);
  EXPECT_EQ(read_secret_key_file(name + ".secret").secret_key, k.secret_key);  // untouched
}

// A keyed ROUTER with its ZAP handler, and clients of every kind against it.
class CurveLink : public ::testing::Test {
 protected:
  // Connects a client (null: no CURVE) and says one message; true when the ROUTER got it.
  bool reaches(const Curve* curve, ConnectionMonitor& monitor, const std::string& tag) {
    zmq::socket_t dealer = make_dealer(address_, tag, {}, &monitor, curve);
    // send() never waits: a socket whose connection is not set up yet (seen once in the
    // sanitized run, on a loaded machine) says no, so it is asked again for a while.
    bool sent = false;
    for (int i = 0; i < 300 && !(sent = send(dealer, nullptr, protocol::make_heartbeat())); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_TRUE(sent);
    auto got = receive(router_, true, 1500);
    monitor.update(100);
    return got.has_value();
  }
  std::vector<std::string> refused_;
  std::mutex refused_mutex_;
  ZapAuthenticator zap_{{kClientPublic}, [this](const std::string&, const std::string& key) {
                          std::lock_guard lock(refused_mutex_);
                          refused_.push_back(key);
                        }};
  KeyPair server_{kServerPublic, kServerSecret};
  zmq::socket_t router_ = make_router("tcp://127.0.0.1:*", {}, &server_);
  std::string address_ = router_.get(zmq::sockopt::last_endpoint);
};

TEST_F(CurveLink, AcceptsAuthorizedKeysOnly) {
  ConnectionMonitor ok;
  const Curve client{{kClientPublic, kClientSecret}, kServerPublic};
  EXPECT_TRUE(reaches(&client, ok, "authorized"));
  EXPECT_TRUE(ok.handshake_succeeded());
  EXPECT_EQ(ok.handshake_failure_kind(), ConnectionMonitor::Handshake::ok);

  ConnectionMonitor stranger;
  const Curve other{generate_key_pair(), kServerPublic};
  EXPECT_FALSE(reaches(&other, stranger, "stranger"));
  EXPECT_EQ(stranger.handshake_failure_kind(), ConnectionMonitor::Handshake::key_refused);
  {
    std::lock_guard lock(refused_mutex_);
    EXPECT_EQ(refused_, std::vector<std::string>{other.own.public_key});
  }
  // A session may add keys (Plan.acceptKeys); a fresh connection with one gets in.
  zap_.set_session_keys({other.own.public_key});
  ConnectionMonitor admitted;
  EXPECT_TRUE(reaches(&other, admitted, "admitted"));
  zap_.set_session_keys({});
  EXPECT_FALSE(zap_.accepts(other.own.public_key));
  EXPECT_TRUE(zap_.accepts(kClientPublic));
}

TEST_F(CurveLink, ReportsMismatchedSecurityAndWrongServerKeys) {
  ConnectionMonitor open;
  EXPECT_FALSE(reaches(nullptr, open, "open"));
  // The server reports the mismatch and drops the connection: the client reads the
  // report, or sees the connection dropped first (a race, mostly the former over TCP).
  const auto kind = open.handshake_failure_kind();
  EXPECT_TRUE(kind == ConnectionMonitor::Handshake::mechanism_mismatch ||
              kind == ConnectionMonitor::Handshake::dropped)
      << open.handshake_failure();
  EXPECT_FALSE(open.handshake_succeeded());

  ConnectionMonitor wrong;
  const Curve misled{{kClientPublic, kClientSecret}, generate_key_pair().public_key};
  EXPECT_FALSE(reaches(&misled, wrong, "misled"));
  EXPECT_EQ(wrong.handshake_failure_kind(), ConnectionMonitor::Handshake::dropped);
}

TEST(Net, RoutableSeesAPeerGo) {
  const std::string address = ipc_address("routable");
  zmq::socket_t router = make_router(address);
  auto dealer = std::make_unique<zmq::socket_t>(make_dealer(address, "peer"));
  ASSERT_TRUE(send(*dealer, nullptr, protocol::make_heartbeat()));
  ASSERT_TRUE(receive(router, true, 2000).has_value());
  const auto probe = protocol::make_heartbeat();
  EXPECT_TRUE(routable(router, "peer", probe));
  EXPECT_FALSE(routable(router, "someone-else", probe));
  dealer.reset();
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    gone = !routable(router, "peer", probe);
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(gone);
}

}  // namespace
}  // namespace pico::net
