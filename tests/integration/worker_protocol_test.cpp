// A real pico-worker refuses malformed, truncated and wrong-version messages with an
// error reply, and keeps serving.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <capnp/serialize.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "net.hpp"
#include "protocol.hpp"

extern char** environ;

namespace pico {
namespace {

using protocol::Envelope;
using protocol::ErrorCode;

class WorkerProtocol : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* build = std::getenv("PICO_IT_BUILD");
    ASSERT_NE(build, nullptr) << "PICO_IT_BUILD is not set";
    dir_ = std::filesystem::temp_directory_path() / ("pico-worker-protocol-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    const std::string model = (dir_ / "m.gguf").string();
    const std::string mk = std::string(build) + "/tools/pico/pico mkmodel --arch llama --vocab llama2 --layers 2 "
                           "--embd 64 --ff 128 --heads 4 --kv-heads 2 -o " + model + " > /dev/null";
    ASSERT_EQ(std::system(mk.c_str()), 0);
    address_ = "ipc://" + (dir_ / "worker.sock").string();
    const std::string worker = std::string(build) + "/worker/pico-worker";
    const char* argv[] = {worker.c_str(), "-m", model.c_str(), "--layers", "0-1", "--listen", address_.c_str(),
                          "-t", "1", nullptr};
    ASSERT_EQ(posix_spawn(&pid_, worker.c_str(), nullptr, nullptr, const_cast<char**>(argv), environ), 0);
  }
  static void TearDownTestSuite() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status = 0;
      ::waitpid(pid_, &status, 0);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the worker did not stop cleanly";
    }
    std::filesystem::remove_all(dir_);
  }

  void SetUp() override {
    socket_ = net::make_dealer(address_, "test-" + std::to_string(counter_++));
    // The DEALER holds the hello until the worker has loaded and bound.
    auto r = ask(hello(), 20000);
    ASSERT_TRUE(r) << "the worker does not answer hello";
    ASSERT_EQ(r->which(), Envelope::Body::CAPABILITIES);
  }

  static std::vector<uint8_t> hello() {
    protocol::Builder b;
    b.envelope().getBody().initHello().setRole("test");
    return b.encode();
  }

  std::unique_ptr<protocol::Decoded> ask(std::span<const uint8_t> header, int timeout_ms = 5000,
                                         std::span<const std::vector<uint8_t>> payloads = {}) {
    EXPECT_TRUE(net::send(socket_, nullptr, header, payloads));
    last_ = net::receive(socket_, false, timeout_ms);
    if (!last_) return nullptr;
    return std::make_unique<protocol::Decoded>(last_->header_bytes());
  }

  ErrorCode refused_with(std::span<const uint8_t> header, std::span<const std::vector<uint8_t>> payloads = {}) {
    auto r = ask(header, 5000, payloads);
    if (!r) {
      ADD_FAILURE() << "no answer";
      return ErrorCode::INTERNAL;
    }
    if (r->which() != Envelope::Body::ERROR) {
      ADD_FAILURE() << "answered " << protocol::body_name(r->which());
      return ErrorCode::INTERNAL;
    }
    return r->envelope().getBody().getError().getCode();
  }

  void expect_still_serving() {
    auto r = ask(hello());
    ASSERT_TRUE(r);
    ASSERT_EQ(r->which(), Envelope::Body::CAPABILITIES);
    EXPECT_EQ(r->envelope().getBody().getCapabilities().getLastLayer(), 2u);
    auto hb = ask(protocol::make_heartbeat());
    ASSERT_TRUE(hb);
    EXPECT_EQ(hb->which(), Envelope::Body::HEARTBEAT);
  }

  static inline std::filesystem::path dir_;
  static inline std::string address_;
  static inline pid_t pid_ = 0;
  static inline int counter_ = 0;
  zmq::socket_t socket_;
  std::optional<net::Received> last_;
};

TEST_F(WorkerProtocol, RefusesGarbage) {
  const std::vector<uint8_t> odd{1, 2, 3, 4, 5};
  EXPECT_EQ(refused_with(odd), ErrorCode::MALFORMED);
  const std::vector<uint8_t> ones(64, 0xff);
  EXPECT_EQ(refused_with(ones), ErrorCode::MALFORMED);
  const std::vector<uint8_t> empty;
  EXPECT_EQ(refused_with(empty), ErrorCode::MALFORMED);
  expect_still_serving();
}

TEST_F(WorkerProtocol, RefusesTruncated) {
  auto bytes = hello();
  bytes.resize(bytes.size() - 8);
  EXPECT_EQ(refused_with(bytes), ErrorCode::MALFORMED);
  expect_still_serving();
}

TEST_F(WorkerProtocol, RefusesWrongVersion) {
  protocol::Builder b;
  b.envelope().setVersion(protocol::kVersion + 7);
  b.envelope().getBody().initHello().setRole("from the future");
  EXPECT_EQ(refused_with(b.encode()), ErrorCode::WRONG_VERSION);
  expect_still_serving();
}

TEST_F(WorkerProtocol, RefusesOversizedAndInconsistentForwards) {
  {
    capnp::MallocMessageBuilder m;
    auto e = m.initRoot<Envelope>();
    e.setVersion(protocol::kVersion);
    auto f = e.getBody().initForward();
    f.setRows(3);
    f.initTokens(static_cast<unsigned>(protocol::kTraversalLimitWords * 2 + 8));
    const auto words = capnp::messageToFlatArray(m);
    const auto bytes = words.asBytes();
    EXPECT_EQ(refused_with(std::span<const uint8_t>(bytes.begin(), bytes.size())), ErrorCode::MALFORMED);
  }
  {
    protocol::Builder b;
    auto f = b.envelope().getBody().initForward();
    f.setRows(2);
    f.initSeqIds(1);
    EXPECT_EQ(refused_with(b.encode()), ErrorCode::BAD_REQUEST);
  }
  {
    protocol::Builder b;  // a token outside the vocabulary
    auto f = b.envelope().getBody().initForward();
    f.setRows(1);
    f.initSeqIds(1).set(0, 5);
    f.initPositions(1).set(0, 0);
    f.initTokens(1).set(0, 1 << 30);
    f.initWantLogits(1).set(0, true);
    EXPECT_EQ(refused_with(b.encode()), ErrorCode::FORWARD_FAILED);
  }
  expect_still_serving();
}

TEST_F(WorkerProtocol, ServesAForwardAndStats) {
  protocol::Builder b;
  auto f = b.envelope().getBody().initForward();
  f.setStepId(9);
  f.setRows(2);
  auto s = f.initSeqIds(2);
  s.set(0, 1);
  s.set(1, 1);
  auto p = f.initPositions(2);
  p.set(0, 0);
  p.set(1, 1);
  auto t = f.initTokens(2);
  t.set(0, 1);
  t.set(1, 450);
  auto w = f.initWantLogits(2);
  w.set(0, false);
  w.set(1, true);
  auto r = ask(b.encode());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->which(), Envelope::Body::LOGITS);
  const auto l = r->envelope().getBody().getLogits();
  EXPECT_EQ(l.getStepId(), 9u);
  EXPECT_EQ(l.getRows(), 1u);
  EXPECT_EQ(l.getNVocab(), 32000u);
  ASSERT_EQ(last_->payloads.size(), 1u);
  EXPECT_EQ(last_->payloads[0].size(), 32000u * 4);
  protocol::Builder sr;
  sr.envelope().getBody().setStatsRequest();
  auto stats = ask(sr.encode());
  ASSERT_TRUE(stats);
  ASSERT_EQ(stats->which(), Envelope::Body::STATS);
  EXPECT_GT(stats->envelope().getBody().getStats().getMemoryBytes(), 0u);
  EXPECT_GT(stats->envelope().getBody().getStats().getKvBytes(), 0u);
  EXPECT_EQ(stats->envelope().getBody().getStats().getSequences(), 1u);
  protocol::Builder close;
  close.envelope().getBody().initClose().setSeqId(1);
  EXPECT_TRUE(net::send(socket_, nullptr, close.encode()));
}

}  // namespace
}  // namespace pico
