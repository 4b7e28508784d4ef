// A real pico-worker refuses malformed, truncated and wrong-version messages with an
// error reply, and keeps serving.
#include <gtest/gtest.h>

#include <cmath>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <capnp/serialize.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "net.hpp"
#include "protocol.hpp"

extern char** environ;

namespace pico {
namespace {

using protocol::Envelope;
using protocol::ErrorCode;

class WorkerProtocol : public ::testing::Test {
 protected:
  // Rows enough that the largest legal frame (65536 rows of hidden states, 16 MiB) is
  // beyond the envelope's traversal limit (8 MiB): an oversized envelope reaches the
  // decoder, which refuses it (WorkerLimits sees frames beyond ZeroMQ's limit dropped).
  static void SetUpTestSuite() { start_worker({"--max-rows", "65536"}); }
  // Starts a worker of the model's two layers (or `layers`) with these flags beside the
  // usual ones.
  static void start_worker(const std::vector<std::string>& flags, const std::string& layers = "0-1") {
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
    std::vector<std::string> args{worker, "-m", model, "--layers", layers, "--listen", address_, "-t", "1"};
    args.insert(args.end(), flags.begin(), flags.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ASSERT_EQ(posix_spawn(&pid_, worker.c_str(), nullptr, nullptr, argv.data(), environ), 0);
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
    return ask_on(socket_, header, timeout_ms, payloads);
  }
  // The next answer on `socket`, past the heartbeats a worker sends its owner to see
  // whether it is still connected (echoNanos 0; an answer echoes a stamp).
  std::unique_ptr<protocol::Decoded> next_answer_on(zmq::socket_t& socket, int timeout_ms = 5000) {
    while (true) {
      last_ = net::receive(socket, false, timeout_ms);
      if (!last_) return nullptr;
      auto d = std::make_unique<protocol::Decoded>(last_->header_bytes());
      if (d->which() == Envelope::Body::HEARTBEAT && d->envelope().getBody().getHeartbeat().getEchoNanos() == 0) {
        continue;
      }
      return d;
    }
  }
  std::unique_ptr<protocol::Decoded> ask_on(zmq::socket_t& socket, std::span<const uint8_t> header,
                                            int timeout_ms = 5000,
                                            std::span<const std::vector<uint8_t>> payloads = {}) {
    EXPECT_TRUE(net::send(socket, nullptr, header, payloads));
    return next_answer_on(socket, timeout_ms);
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

// What a forward_message asks beyond its tokens.
struct ForwardAsk {
  uint64_t step = 0;  // 0: 100 + seq
  std::optional<protocol::LogitsOutput> output;  // of the last row (unset: full rows, no list)
  uint32_t chain_steps = 0;
  std::vector<int32_t> stop_tokens;
  uint64_t session = 0;  // Envelope.session
};

ForwardAsk in_session(uint64_t session) {
  ForwardAsk a;
  a.session = session;
  return a;
}

// One forward of `tokens` at positions first_pos.. for seq; the logits of the last one.
std::vector<uint8_t> forward_message(int32_t seq, int32_t first_pos, const std::vector<int32_t>& tokens,
                                     const ForwardAsk& ask = {}) {
  protocol::Builder b;
  b.envelope().setSession(ask.session);
  auto f = b.envelope().getBody().initForward();
  const auto n = static_cast<unsigned>(tokens.size());
  f.setStepId(ask.step ? ask.step : 100 + static_cast<uint64_t>(seq));
  f.setRows(n);
  auto s = f.initSeqIds(n);
  auto p = f.initPositions(n);
  auto t = f.initTokens(n);
  auto w = f.initWantLogits(n);
  for (unsigned i = 0; i < n; ++i) {
    s.set(i, seq);
    p.set(i, first_pos + static_cast<int32_t>(i));
    t.set(i, tokens[i]);
    w.set(i, i + 1 == n);
  }
  if (ask.output) {
    auto out = f.initLogitsOutput(n);
    for (unsigned i = 0; i < n; ++i) out.set(i, *ask.output);
  }
  f.setChainSteps(ask.chain_steps);
  auto stop = f.initStopTokens(static_cast<unsigned>(ask.stop_tokens.size()));
  for (unsigned i = 0; i < ask.stop_tokens.size(); ++i) stop.set(i, ask.stop_tokens[i]);
  return b.encode();
}

// Rows asked as arg max only come back as the index and value of the full row's
// largest logit; the full rows of the same step stay in the payload, in order,
// bit-identical to a step that asked for every row in full.
TEST_F(WorkerProtocol, ReducedRowsAreTheArgmaxOfTheFullRows) {
  using protocol::LogitsOutput;
  const std::vector<std::vector<int32_t>> prompts{{1, 450}, {1, 306, 4966}, {1, 920}};
  // One forward of the three prompts as sequences first_seq, first_seq + 1, ...
  auto forward = [&](int32_t first_seq, const std::vector<LogitsOutput>& per_prompt) {
    protocol::Builder b;
    auto f = b.envelope().getBody().initForward();
    unsigned n = 0;
    for (const auto& p : prompts) n += static_cast<unsigned>(p.size());
    f.setStepId(200 + static_cast<uint64_t>(first_seq));
    f.setRows(n);
    auto s = f.initSeqIds(n);
    auto pos = f.initPositions(n);
    auto t = f.initTokens(n);
    auto w = f.initWantLogits(n);
    auto out = f.initLogitsOutput(per_prompt.empty() ? 0 : n);
    unsigned i = 0;
    for (size_t k = 0; k < prompts.size(); ++k) {
      for (size_t j = 0; j < prompts[k].size(); ++j, ++i) {
        s.set(i, first_seq + static_cast<int32_t>(k));
        pos.set(i, static_cast<int32_t>(j));
        t.set(i, prompts[k][j]);
        w.set(i, j + 1 == prompts[k].size());
        // Rows that want no logits say "argmax" too: it must not matter.
        if (!per_prompt.empty()) out.set(i, j + 1 == prompts[k].size() ? per_prompt[k] : LogitsOutput::ARGMAX);
      }
    }
    return b.encode();
  };
  auto r = ask(forward(51, {}));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->which(), Envelope::Body::LOGITS);
  EXPECT_EQ(r->envelope().getBody().getLogits().getArgmaxIds().size(), 0u);
  ASSERT_EQ(last_->payloads.size(), 1u);
  const size_t n_vocab = 32000;
  ASSERT_EQ(last_->payloads[0].size(), 3 * n_vocab * 4);
  std::vector<float> full(3 * n_vocab);
  std::memcpy(full.data(), last_->payloads[0].data(), full.size() * 4);
  auto row = [&](size_t k) { return std::vector<float>(full.begin() + k * n_vocab, full.begin() + (k + 1) * n_vocab); };
  auto argmax = [&](size_t k) {
    const auto v = row(k);
    return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
  };

  r = ask(forward(61, {LogitsOutput::ARGMAX, LogitsOutput::FULL, LogitsOutput::ARGMAX}));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->which(), Envelope::Body::LOGITS);
  auto l = r->envelope().getBody().getLogits();
  EXPECT_EQ(l.getRows(), 3u);
  ASSERT_EQ(l.getArgmaxIds().size(), 3u);
  ASSERT_EQ(l.getArgmaxLogits().size(), 3u);
  EXPECT_EQ(l.getArgmaxIds()[0], argmax(0));
  EXPECT_EQ(l.getArgmaxIds()[1], -1);
  EXPECT_EQ(l.getArgmaxIds()[2], argmax(2));
  EXPECT_EQ(l.getArgmaxLogits()[0], row(0)[static_cast<size_t>(argmax(0))]);
  EXPECT_EQ(l.getArgmaxLogits()[2], row(2)[static_cast<size_t>(argmax(2))]);
  ASSERT_EQ(last_->payloads.size(), 1u);
  ASSERT_EQ(last_->payloads[0].size(), n_vocab * 4);
  std::vector<float> middle(n_vocab);
  std::memcpy(middle.data(), last_->payloads[0].data(), n_vocab * 4);
  EXPECT_TRUE(middle == row(1)) << "the full row differs from the all-full step's";

  r = ask(forward(71, {LogitsOutput::ARGMAX, LogitsOutput::ARGMAX, LogitsOutput::ARGMAX}));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->which(), Envelope::Body::LOGITS);
  l = r->envelope().getBody().getLogits();
  ASSERT_EQ(l.getArgmaxIds().size(), 3u);
  for (unsigned k = 0; k < 3; ++k) EXPECT_EQ(l.getArgmaxIds()[k], argmax(k));
  ASSERT_EQ(last_->payloads.size(), 1u);
  EXPECT_EQ(last_->payloads[0].size(), 0u);  // no full row

  // An outputs list that is neither empty nor one per row is refused.
  protocol::Builder bad;
  auto f = bad.envelope().getBody().initForward();
  f.setRows(1);
  f.initSeqIds(1).set(0, 81);
  f.initPositions(1).set(0, 0);
  f.initTokens(1).set(0, 1);
  f.initWantLogits(1).set(0, true);
  f.initLogitsOutput(2);
  EXPECT_EQ(refused_with(bad.encode()), ErrorCode::BAD_REQUEST);
  for (int32_t seq : {51, 52, 53, 61, 62, 63, 71, 72, 73}) {
    protocol::Builder close;
    close.envelope().getBody().initClose().setSeqId(seq);
    EXPECT_TRUE(net::send(socket_, nullptr, close.encode()));
  }
  expect_still_serving();
}

// A greedy chain (Forward.chainSteps): the last stage, here also the first, sends
// the next steps to itself and answers each with its arg max, the tokens a
// coordinator would have sent one by one; a stop token, a full row or the end of the
// grant ends the chain.
// A planned worker answers its planner only, so the chain test gets a worker of its own
// (a suite of its own: SetUpTestSuite starts one per suite).
class WorkerChain : public WorkerProtocol {};

TEST_F(WorkerChain, AGreedyChainRunsOnWithoutTheCoordinator) {
  using protocol::LogitsOutput;
  constexpr uint64_t kSession = 0x5e55;  // the plan's; every forward carries it
  protocol::Builder plan;
  plan.envelope().setSession(kSession);
  auto p = plan.envelope().getBody().initPlan();
  p.setStageCount(1);
  p.setChainTo(address_);  // this worker is first and last
  auto ack = ask(plan.encode());
  ASSERT_TRUE(ack);
  ASSERT_EQ(ack->which(), Envelope::Body::PLAN_ACK);

  const std::vector<int32_t> prompt{1, 450, 306};
  // One decode step of seq at pos with token; chain_steps > 0 asks for a chain.
  auto decode = [&](uint64_t step, int32_t seq, int32_t pos, int32_t token, uint32_t chain_steps,
                    const std::vector<int32_t>& stop, LogitsOutput output) {
    return forward_message(seq, pos, {token}, {step, output, chain_steps, stop, kSession});
  };
  struct Answer {
    uint64_t step;
    int32_t position, argmax;
    bool chained, sent_by_last;
  };
  auto next_answer = [&]() -> std::optional<Answer> {
    auto answer = next_answer_on(socket_);
    if (!answer) return std::nullopt;
    const protocol::Decoded& d = *answer;
    EXPECT_EQ(d.which(), Envelope::Body::LOGITS);
    if (d.which() != Envelope::Body::LOGITS) return std::nullopt;
    const auto l = d.envelope().getBody().getLogits();
    EXPECT_EQ(l.getRows(), 1u);
    const int32_t id = l.getArgmaxIds().size() == 1 ? l.getArgmaxIds()[0] : -1;
    return Answer{l.getStepId(), l.getPositions()[0], id, l.getChained(), l.getSentByLast()};
  };
  auto prefill = [&](int32_t seq) {
    auto r = ask(forward_message(seq, 0, prompt, in_session(kSession)));
    EXPECT_TRUE(r && r->which() == Envelope::Body::LOGITS);
    std::vector<float> row(last_->payloads.at(0).size() / 4);
    std::memcpy(row.data(), last_->payloads[0].data(), row.size() * 4);
    return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
  };

  // The greedy tokens one step at a time (seq 90).
  std::vector<int32_t> greedy{prefill(90)};
  for (int32_t k = 0; k < 6; ++k) {
    auto r = ask(decode(500 + static_cast<uint64_t>(k), 90, 3 + k, greedy.back(), 0, {}, LogitsOutput::ARGMAX));
    ASSERT_TRUE(r);
    ASSERT_EQ(r->which(), Envelope::Body::LOGITS);
    EXPECT_FALSE(r->envelope().getBody().getLogits().getChained());
    greedy.push_back(r->envelope().getBody().getLogits().getArgmaxIds()[0]);
  }

  // A chain of 4 more steps after the first (seq 91): answers for steps 600..604.
  ASSERT_EQ(prefill(91), greedy[0]);
  ASSERT_TRUE(net::send(socket_, nullptr, decode(600, 91, 3, greedy[0], 4, {}, LogitsOutput::ARGMAX)));
  for (int32_t k = 0; k < 5; ++k) {
    const auto a = next_answer();
    ASSERT_TRUE(a) << "no answer for chained step " << k;
    EXPECT_EQ(a->step, 600u + static_cast<uint64_t>(k));
    EXPECT_EQ(a->position, 3 + k);
    EXPECT_EQ(a->argmax, greedy[static_cast<size_t>(k) + 1]) << "chained step " << k;
    EXPECT_EQ(a->chained, k < 4);  // the grant's last step answers only
    EXPECT_EQ(a->sent_by_last, k > 0);
  }
  EXPECT_FALSE(net::receive(socket_, false, 300)) << "a step past the grant";

  // A stop token ends the chain at the step that yields it (seq 92).
  ASSERT_EQ(prefill(92), greedy[0]);
  const int32_t stop = greedy[3];
  ASSERT_TRUE(net::send(socket_, nullptr, decode(700, 92, 3, greedy[0], 8, {stop}, LogitsOutput::ARGMAX)));
  size_t answers = 0;
  for (size_t k = 1;; ++k) {
    const auto a = next_answer();
    ASSERT_TRUE(a);
    ++answers;
    EXPECT_EQ(a->argmax, greedy[k]);
    if (greedy[k] == stop) {
      EXPECT_FALSE(a->chained);
      break;
    }
    EXPECT_TRUE(a->chained);
  }
  EXPECT_LE(answers, 3u);
  EXPECT_FALSE(net::receive(socket_, false, 300)) << "a step past the stop token";

  // A full row is not chained, whatever the grant (seq 93).
  ASSERT_EQ(prefill(93), greedy[0]);
  auto r = ask(decode(800, 93, 3, greedy[0], 8, {}, LogitsOutput::FULL));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->which(), Envelope::Body::LOGITS);
  EXPECT_FALSE(r->envelope().getBody().getLogits().getChained());
  EXPECT_FALSE(net::receive(socket_, false, 300));

  // Each chained answer carries the session of the step that started the chain.
  ASSERT_TRUE(net::send(socket_, nullptr, decode(900, 93, 4, greedy[1], 1, {}, LogitsOutput::ARGMAX)));
  for (int k = 0; k < 2; ++k) {
    auto a = next_answer_on(socket_);
    ASSERT_TRUE(a);
    EXPECT_EQ(a->which(), Envelope::Body::LOGITS);
    EXPECT_EQ(a->envelope().getSession(), kSession) << "answer " << k;
  }
  protocol::Builder stats_request;
  stats_request.envelope().getBody().setStatsRequest();
  auto stats = ask(stats_request.encode());
  ASSERT_TRUE(stats);
  ASSERT_EQ(stats->which(), Envelope::Body::STATS);
  EXPECT_EQ(stats->envelope().getBody().getStats().getChainedSteps(), 4u + answers - 1 + 1);
  expect_still_serving();
}

// Rows asked as hidden states come back as the hidden state after the output norm
// instead of logits; rows asked for mean pooling are summed on the worker, in position
// order across forwards, and their mean comes back at the row that ends it.
TEST_F(WorkerProtocol, HiddenRowsAndTheirMeanPooledOnTheLastStage) {
  using protocol::LogitsOutput;
  const std::vector<int32_t> prompt{1, 450, 306, 4966};
  auto forward = [&](uint64_t step, int32_t seq, size_t from, size_t to, const std::vector<LogitsOutput>& outputs) {
    protocol::Builder b;
    auto f = b.envelope().getBody().initForward();
    const auto n = static_cast<unsigned>(to - from);
    f.setStepId(step);
    f.setRows(n);
    auto s = f.initSeqIds(n);
    auto pos = f.initPositions(n);
    auto t = f.initTokens(n);
    auto w = f.initWantLogits(n);
    auto out = f.initLogitsOutput(n);
    for (unsigned i = 0; i < n; ++i) {
      s.set(i, seq);
      pos.set(i, static_cast<int32_t>(from + i));
      t.set(i, prompt[from + i]);
      w.set(i, true);
      out.set(i, outputs[from + i]);
    }
    return b.encode();
  };
  const std::vector<LogitsOutput> hidden(4, LogitsOutput::HIDDEN);
  auto r = ask(forward(300, 81, 0, 4, hidden));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->which(), Envelope::Body::LOGITS);
  auto l = r->envelope().getBody().getLogits();
  EXPECT_EQ(l.getRows(), 0u);
  ASSERT_EQ(l.getHiddenSeqIds().size(), 4u);
  const size_t width = l.getNEmbd();
  ASSERT_GT(width, 0u);
  ASSERT_EQ(l.getHidden().size(), 4 * width);
  std::vector<double> sum(width, 0.0);
  for (unsigned i = 0; i < 4; ++i) {
    EXPECT_EQ(l.getHiddenSeqIds()[i], 81);
    EXPECT_EQ(l.getHiddenPositions()[i], static_cast<int32_t>(i));
    for (size_t k = 0; k < width; ++k) sum[k] += l.getHidden()[static_cast<unsigned>(i * width + k)];
  }
  const std::vector<LogitsOutput> mean{LogitsOutput::MEAN_ADD, LogitsOutput::MEAN_ADD, LogitsOutput::MEAN_ADD,
                                       LogitsOutput::MEAN_END};
  r = ask(forward(301, 82, 0, 2, mean));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->envelope().getBody().getLogits().getHiddenSeqIds().size(), 0u);  // summed, nothing back yet
  r = ask(forward(302, 82, 2, 4, mean));
  ASSERT_TRUE(r);
  l = r->envelope().getBody().getLogits();
  ASSERT_EQ(l.getHiddenSeqIds().size(), 1u);
  EXPECT_EQ(l.getHiddenPositions()[0], 3);
  ASSERT_EQ(l.getHidden().size(), width);
  for (size_t k = 0; k < width; ++k) EXPECT_EQ(l.getHidden()[static_cast<unsigned>(k)], static_cast<float>(sum[k] / 4)) << k;
}

TEST_F(WorkerProtocol, HeartbeatAnswersEchoTheSendersClock) {
  protocol::Builder b;
  b.envelope().getBody().initHeartbeat().setSentNanos(123456789);
  auto r = ask(b.encode());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->which(), Envelope::Body::HEARTBEAT);
  EXPECT_EQ(r->envelope().getBody().getHeartbeat().getEchoNanos(), 123456789u);
  EXPECT_GT(r->envelope().getBody().getHeartbeat().getSentNanos(), 0u);
}

TEST_F(WorkerProtocol, AHeartbeatProbeIsAnsweredOnceItArrivedAndCheckedForItsSize) {
  const auto probe = [](uint64_t bytes) {
    protocol::Builder b;
    auto h = b.envelope().getBody().initHeartbeat();
    h.setSentNanos(42);
    h.setProbeBytes(bytes);
    return b.encode();
  };
  const std::vector<std::vector<uint8_t>> frame{std::vector<uint8_t>(100000, 7)};
  auto r = ask(probe(100000), 5000, frame);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->which(), Envelope::Body::HEARTBEAT);
  EXPECT_EQ(r->envelope().getBody().getHeartbeat().getProbeBytes(), 100000u);
  EXPECT_EQ(r->envelope().getBody().getHeartbeat().getEchoNanos(), 42u);
  EXPECT_TRUE(last_->payloads.empty());  // the bytes are not sent back
  EXPECT_EQ(refused_with(probe(99999), frame), ErrorCode::BAD_REQUEST);  // a frame of another size
  EXPECT_EQ(refused_with(probe(100000)), ErrorCode::BAD_REQUEST);        // no frame
  EXPECT_EQ(refused_with(probe(0), frame), ErrorCode::BAD_REQUEST);      // a frame it did not announce
  expect_still_serving();
}

TEST_F(WorkerProtocol, AnAssignOfItsOwnRangeIsAnsweredAndAnyOtherRefused) {
  const auto assign = [](uint32_t first, uint32_t last) {
    protocol::Builder b;
    auto a = b.envelope().getBody().initAssign();
    a.setFirstLayer(first);
    a.setLastLayer(last);
    return b.encode();
  };
  auto r = ask(assign(0, 2));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->which(), Envelope::Body::ASSIGNED);
  EXPECT_EQ(r->envelope().getBody().getAssigned().getLastLayer(), 2u);
  EXPECT_EQ(refused_with(assign(0, 1)), ErrorCode::BAD_REQUEST);  // started with fixed --layers
  auto caps = ask(hello());
  ASSERT_TRUE(caps);
  EXPECT_FALSE(caps->envelope().getBody().getCapabilities().getMovable());
  expect_still_serving();
}

// A worker started with --layers auto takes its range, then others while it serves
// (POST /cluster/replan {"layers"}): from its owner only, a range of the model only;
// it drops its sequences and serves the new range on the same socket.
class WorkerMoves : public WorkerProtocol {
 protected:
  static void SetUpTestSuite() { start_worker({}, "auto"); }
  static std::vector<uint8_t> assign(uint32_t first, uint32_t last, uint64_t session = 0) {
    protocol::Builder b;
    b.envelope().setSession(session);
    auto a = b.envelope().getBody().initAssign();
    a.setFirstLayer(first);
    a.setLastLayer(last);
    return b.encode();
  }
  // Its capabilities once it serves again (a hello waits in the socket while it loads).
  protocol::schema::Capabilities::Reader capabilities() {
    caps_ = ask(hello(), 20000);
    EXPECT_TRUE(caps_ && caps_->which() == Envelope::Body::CAPABILITIES);
    return caps_->envelope().getBody().getCapabilities();
  }
  std::unique_ptr<protocol::Decoded> caps_;
};

TEST_F(WorkerMoves, AnAutoWorkerTakesAnotherRangeWhileServing) {
  constexpr uint64_t kOwner = 0x0a0a0a0a, kOther = 0x0b0b0b0b;
  auto r = ask(assign(0, 2));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->which(), Envelope::Body::ASSIGNED);
  auto caps = capabilities();
  EXPECT_EQ(caps.getLastLayer(), 2u);
  EXPECT_TRUE(caps.getMovable());
  protocol::Builder plan;
  plan.envelope().setSession(kOwner);
  plan.envelope().getBody().initPlan().setStageCount(1);
  r = ask(plan.encode());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->which(), Envelope::Body::PLAN_ACK);
  r = ask(forward_message(7, 0, {1, 450}, in_session(kOwner)));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->which(), Envelope::Body::LOGITS);

  EXPECT_EQ(refused_with(assign(0, 1, kOther)), ErrorCode::BUSY);  // not its owner
  EXPECT_EQ(refused_with(assign(1, 3, kOwner)), ErrorCode::BAD_REQUEST);  // beyond the model's 2 layers
  EXPECT_EQ(refused_with(assign(1, 1, kOwner)), ErrorCode::BAD_REQUEST);  // empty
  r = ask(assign(0, 1, kOwner));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->which(), Envelope::Body::ASSIGNED);
  caps = capabilities();
  EXPECT_EQ(caps.getFirstLayer(), 0u);
  EXPECT_EQ(caps.getLastLayer(), 1u);
  EXPECT_TRUE(caps.getMovable());
  EXPECT_EQ(caps.getSession(), 0u);  // planned afresh by whoever moved it
  protocol::Builder stats;
  stats.envelope().getBody().setStatsRequest();
  r = ask(stats.encode());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->which(), Envelope::Body::STATS);
  EXPECT_EQ(r->envelope().getBody().getStats().getSequences(), 0u);  // sequence 7 went with the range
  // And back: the whole model again, served.
  r = ask(assign(0, 2));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->which(), Envelope::Body::ASSIGNED);
  EXPECT_EQ(capabilities().getLastLayer(), 2u);
  r = ask(forward_message(8, 0, {1, 450}));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->which(), Envelope::Body::LOGITS);

  // An owner that is gone (a pico-coord that exited) holds nothing, as for a plan: an
  // assign of another session is refused while the owner is connected, then taken.
  {
    zmq::socket_t owner = net::make_dealer(address_, "owner-that-leaves");
    r = ask_on(owner, plan.encode());
    ASSERT_TRUE(r);
    ASSERT_EQ(r->which(), Envelope::Body::PLAN_ACK);
    EXPECT_EQ(refused_with(assign(0, 1, kOther)), ErrorCode::BUSY);
  }
  bool taken = false;
  for (int attempt = 0; attempt < 100 && !taken; ++attempt) {
    r = ask(assign(0, 1, kOther));
    ASSERT_TRUE(r);
    taken = r->which() == Envelope::Body::ASSIGNED;
    if (!taken) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(taken) << "an assign of another session is refused after its owner left";
  EXPECT_EQ(capabilities().getLastLayer(), 1u);
}

TEST_F(WorkerProtocol, ALinkProbeMeasuresTheLinkToTheAddressItNames) {
  const auto probe = [](const std::string& address, uint64_t bytes) {
    protocol::Builder b;
    auto p = b.envelope().getBody().initLinkProbe();
    p.setAddress(address);
    p.setProbeBytes(bytes);
    return b.encode();
  };
  // Another peer that answers heartbeats, as a worker does (echo, probe size).
  const std::string peer_address = "ipc://" + (dir_ / "peer.sock").string();
  std::atomic<bool> stop{false};
  std::atomic<int> answered{0};
  std::thread peer([&] {
    zmq::socket_t router = net::make_router(peer_address);
    while (!stop) {
      auto msg = net::receive(router, true, 50);
      if (!msg) continue;
      protocol::Decoded d(msg->header_bytes());
      const auto h = d.envelope().getBody().getHeartbeat();
      EXPECT_EQ(msg->payloads.size(), h.getProbeBytes() > 0 ? 1u : 0u);
      net::send(router, &msg->peer, protocol::make_heartbeat(h.getSentNanos(), h.getProbeBytes()));
      ++answered;
    }
  });
  auto r = ask(probe(peer_address, 1 << 20), 10000);
  stop = true;
  peer.join();
  EXPECT_EQ(answered.load(), 7);  // 4 empty, 3 carrying the probe
  ASSERT_TRUE(r);
  ASSERT_EQ(r->which(), Envelope::Body::LINK_MEASURED);
  const auto m = r->envelope().getBody().getLinkMeasured();
  EXPECT_EQ(m.getError().size(), 0u) << m.getError().cStr();
  EXPECT_GT(m.getBytesPerSecond(), 0);
  EXPECT_GE(m.getLatencySeconds(), 0);
  // Nothing listens there: measured as an error, within the probe's timeout.
  auto none = ask(probe("ipc://" + (dir_ / "nobody.sock").string(), 1000), 10000);
  ASSERT_TRUE(none);
  ASSERT_EQ(none->which(), Envelope::Body::LINK_MEASURED);
  EXPECT_NE(std::string(none->envelope().getBody().getLinkMeasured().getError().cStr()).find("no answer"),
            std::string::npos);
  EXPECT_EQ(refused_with(probe(address_, 0)), ErrorCode::BAD_REQUEST);
  EXPECT_EQ(refused_with(probe(address_, (uint64_t{64} << 20) + 1)), ErrorCode::BAD_REQUEST);
  EXPECT_EQ(refused_with(probe("", 1000)), ErrorCode::BAD_REQUEST);
  expect_still_serving();
}

TEST_F(WorkerProtocol, CapabilitiesCarryTheWorkersProfile) {
  auto r = ask(hello());
  ASSERT_TRUE(r);
  const auto caps = r->envelope().getBody().getCapabilities();
  const auto profile = caps.getProfile();
  EXPECT_EQ(profile.getBatch(), 64u);
  ASSERT_EQ(profile.getLayers().size(), caps.getModel().getNLayer());  // every layer, not only the range's
  for (auto t : profile.getLayers()) {
    EXPECT_GT(t.getDecodeSeconds(), 0);
    EXPECT_GT(t.getBatchSecondsPerToken(), 0);
  }
  EXPECT_GT(profile.getHead().getDecodeSeconds(), 0);
  EXPECT_GT(profile.getMemoryBytes(), 0u);
}

TEST_F(WorkerProtocol, LogitsCarryTheStagesTimings) {
  const uint64_t before = protocol::steady_nanos();
  auto r = ask(forward_message(31, 0, {1, 450}));
  const uint64_t after = protocol::steady_nanos();
  ASSERT_TRUE(r);
  ASSERT_EQ(r->which(), Envelope::Body::LOGITS);
  const auto timings = r->envelope().getBody().getLogits().getTimings();
  ASSERT_EQ(timings.size(), 1u);
  const auto t = timings[0];
  EXPECT_EQ(t.getStage(), 0u);
  // The same host: the worker's steady clock is this process's.
  EXPECT_LE(t.getIdleSinceNanos(), t.getReceivedNanos());
  EXPECT_GE(t.getReceivedNanos(), before);
  EXPECT_LE(t.getReceivedNanos(), t.getComputeStartNanos());
  EXPECT_LT(t.getComputeStartNanos(), t.getComputeEndNanos());
  EXPECT_LE(t.getComputeEndNanos(), t.getSentNanos());
  EXPECT_LE(t.getSentNanos(), after);
  protocol::Builder close;
  close.envelope().getBody().initClose().setSeqId(31);
  EXPECT_TRUE(net::send(socket_, nullptr, close.encode()));
}

// Traced rows come back with the RMS of their residual after each of the stage's layers
// (the heatmap); a trace list that does not match the rows is refused.
TEST_F(WorkerProtocol, LogitsCarryTheTracedRowsPerLayerRms) {
  auto traced_forward = [](unsigned trace_count) {
    protocol::Builder b;
    auto f = b.envelope().getBody().initForward();
    f.setStepId(77);
    f.setRows(3);
    auto s = f.initSeqIds(3);
    auto p = f.initPositions(3);
    auto t = f.initTokens(3);
    auto w = f.initWantLogits(3);
    auto trace = f.initTrace(trace_count);
    for (unsigned i = 0; i < 3; ++i) {
      s.set(i, 41);
      p.set(i, static_cast<int32_t>(i));
      t.set(i, static_cast<int32_t>(10 + i));
      w.set(i, i == 2);
      if (i < trace_count) trace.set(i, i != 1);
    }
    return b.encode();
  };
  EXPECT_EQ(refused_with(traced_forward(2)), ErrorCode::BAD_REQUEST);
  auto r = ask(traced_forward(3));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->which(), Envelope::Body::LOGITS);
  const auto traces = r->envelope().getBody().getLogits().getLayerTraces();
  ASSERT_EQ(traces.size(), 1u);
  const auto trace = traces[0];
  EXPECT_EQ(trace.getFirstLayer(), 0u);
  const unsigned layers = trace.getLayers();
  EXPECT_GT(layers, 0u);
  ASSERT_EQ(trace.getSeqIds().size(), 2u);  // rows 0 and 2
  EXPECT_EQ(trace.getPositions()[0], 0);
  EXPECT_EQ(trace.getPositions()[1], 2);
  ASSERT_EQ(trace.getRms().size(), 2u * layers);
  for (const float v : trace.getRms()) EXPECT_TRUE(std::isfinite(v) && v > 0.0f) << v;
  protocol::Builder close;
  close.envelope().getBody().initClose().setSeqId(41);
  EXPECT_TRUE(net::send(socket_, nullptr, close.encode()));
  expect_still_serving();
}

// Snapshot a sequence, close it, restore it: decoding goes on with logits bit-identical
// to a sequence that was never closed.
TEST_F(WorkerProtocol, SnapshotAndRestoreContinueBitIdentical) {
  const std::vector<int32_t> prompt{1, 450, 4996, 17354, 1701, 29916};
  auto logits_of = [&](int32_t seq, int32_t pos, const std::vector<int32_t>& tokens) {
    auto r = ask(forward_message(seq, pos, tokens));
    EXPECT_TRUE(r && r->which() == Envelope::Body::LOGITS);
    if (!r || last_->payloads.size() != 1) return std::vector<uint8_t>();
    const auto bytes = last_->payload_bytes(0);
    return std::vector<uint8_t>(bytes.begin(), bytes.end());
  };
  // The reference: never closed.
  logits_of(41, 0, prompt);
  const auto reference = logits_of(41, static_cast<int32_t>(prompt.size()), {3681});
  const auto reference_next = logits_of(41, static_cast<int32_t>(prompt.size()) + 1, {338});
  ASSERT_EQ(reference.size(), 32000u * 4);

  logits_of(42, 0, prompt);
  protocol::Builder sr;
  sr.envelope().getBody().initSnapshotRequest().setSeqId(42);
  auto snap = ask(sr.encode());
  ASSERT_TRUE(snap);
  ASSERT_EQ(snap->which(), Envelope::Body::SNAPSHOT);
  const auto s = snap->envelope().getBody().getSnapshot();
  EXPECT_EQ(s.getSeqId(), 42);
  EXPECT_EQ(s.getNPos(), static_cast<int64_t>(prompt.size()));
  EXPECT_EQ(s.getFirstLayer(), 0u);
  EXPECT_EQ(s.getLastLayer(), 2u);
  ASSERT_EQ(last_->payloads.size(), 1u);
  ASSERT_EQ(last_->payloads[0].size(), s.getBytes());
  const std::vector<uint8_t> state(last_->payload_bytes(0).begin(), last_->payload_bytes(0).end());

  protocol::Builder close;
  close.envelope().getBody().initClose().setSeqId(42);
  ASSERT_TRUE(net::send(socket_, nullptr, close.encode()));
  // Closed: the next position leaves a gap.
  EXPECT_EQ(refused_with(forward_message(42, static_cast<int32_t>(prompt.size()), {3681})),
            ErrorCode::FORWARD_FAILED);

  auto restore = [&](uint32_t first, uint32_t last, std::vector<uint8_t> bytes) {
    protocol::Builder b;
    auto r = b.envelope().getBody().initRestore();
    r.setSeqId(42);
    r.setNPos(static_cast<int64_t>(prompt.size()));
    r.setFirstLayer(first);
    r.setLastLayer(last);
    r.setBytes(bytes.size());
    const std::vector<std::vector<uint8_t>> payload{std::move(bytes)};
    return ask(b.encode(), 5000, payload);
  };
  // Refused: another layer range, a damaged state.
  auto wrong_layers = restore(0, 1, state);
  ASSERT_TRUE(wrong_layers);
  EXPECT_EQ(wrong_layers->which(), Envelope::Body::ERROR);
  auto damaged = state;
  damaged.resize(damaged.size() - 8);
  auto refused = restore(0, 2, damaged);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->which(), Envelope::Body::ERROR);

  auto restored = restore(0, 2, state);
  ASSERT_TRUE(restored);
  ASSERT_EQ(restored->which(), Envelope::Body::RESTORED);
  EXPECT_EQ(restored->envelope().getBody().getRestored().getSeqId(), 42);
  const auto continued = logits_of(42, static_cast<int32_t>(prompt.size()), {3681});
  EXPECT_TRUE(continued == reference) << "logits after restore differ from a sequence never closed";
  EXPECT_TRUE(logits_of(42, static_cast<int32_t>(prompt.size()) + 1, {338}) == reference_next);

  // A sequence not open here has no snapshot.
  protocol::Builder none;
  none.envelope().getBody().initSnapshotRequest().setSeqId(4242);
  EXPECT_EQ(refused_with(none.encode()), ErrorCode::BAD_REQUEST);
  for (int32_t seq : {41, 42}) {
    protocol::Builder c;
    c.envelope().getBody().initClose().setSeqId(seq);
    EXPECT_TRUE(net::send(socket_, nullptr, c.encode()));
  }
  expect_still_serving();
}

// A worker with small limits: each is refused with ErrorCode.limit naming it, before
// anything changes, and the worker keeps serving.
class WorkerLimits : public WorkerProtocol {
 protected:
  // One sequence of up to 300 positions, 8 rows a forward, KV for one and a half pages
  // of 256 positions (2 layers x (K + V) x 2 heads x 16 dims x 2 bytes = 256 bytes a
  // position).
  static constexpr uint64_t kPositionBytes = 256, kBudget = 384 * kPositionBytes;
  static void SetUpTestSuite() {
    start_worker({"--max-rows", "8", "--ctx", "300", "--max-sequences", "1", "--kv-memory", "96K"});
  }
  // Refused with `code`, the text naming the limit.
  void expect_refused(std::span<const uint8_t> header, ErrorCode code, const std::string& text,
                      std::span<const std::vector<uint8_t>> payloads = {}) {
    auto r = ask(header, 5000, payloads);
    ASSERT_TRUE(r) << "no answer";
    ASSERT_EQ(r->which(), Envelope::Body::ERROR) << protocol::body_name(r->which());
    const auto e = r->envelope().getBody().getError();
    EXPECT_EQ(e.getCode(), code) << e.getText().cStr();
    EXPECT_NE(std::string(e.getText().cStr()).find(text), std::string::npos) << e.getText().cStr();
  }
  // Positions [from, to) of seq, 8 at a time; answered with logits.
  void grow(int32_t seq, int32_t from, int32_t to) {
    for (int32_t p = from; p < to; p += 8) {
      std::vector<int32_t> tokens(static_cast<size_t>(std::min(8, to - p)), 29);
      auto r = ask(forward_message(seq, p, tokens));
      ASSERT_TRUE(r);
      ASSERT_EQ(r->which(), Envelope::Body::LOGITS) << "position " << p;
    }
  }
  uint64_t kv_bytes() {
    protocol::Builder b;
    b.envelope().getBody().setStatsRequest();
    auto r = ask(b.encode());
    EXPECT_TRUE(r && r->which() == Envelope::Body::STATS);
    return r ? r->envelope().getBody().getStats().getKvBytes() : 0;
  }
  void close(int32_t seq) {
    protocol::Builder c;
    c.envelope().getBody().initClose().setSeqId(seq);
    EXPECT_TRUE(net::send(socket_, nullptr, c.encode()));
  }
  std::unique_ptr<protocol::Decoded> restore(int32_t seq, const std::vector<uint8_t>& state, uint64_t claimed) {
    protocol::Builder b;
    auto r = b.envelope().getBody().initRestore();
    r.setSeqId(seq);
    r.setFirstLayer(0);
    r.setLastLayer(2);
    r.setBytes(claimed);
    const std::vector<std::vector<uint8_t>> payload{state};
    return ask(b.encode(), 5000, payload);
  }
};

TEST_F(WorkerLimits, CapabilitiesCarryTheLimits) {
  auto r = ask(hello());
  ASSERT_TRUE(r);
  const auto l = r->envelope().getBody().getCapabilities().getLimits();
  EXPECT_EQ(l.getMaxRows(), 8u);
  EXPECT_EQ(l.getMaxPositions(), 300u);
  EXPECT_EQ(l.getMaxSequences(), 1u);
  EXPECT_EQ(l.getStateBudgetBytes(), kBudget);
  EXPECT_EQ(l.getKvBytesPerPosition(), kPositionBytes);
  EXPECT_EQ(l.getStateBytesPerSequence(), 0u);
  EXPECT_EQ(l.getPagePositions(), 256u);
  // The largest legal frame is the largest restore the budget holds, plus header room.
  EXPECT_GE(l.getMaxMessageBytes(), kBudget);
  EXPECT_LT(l.getMaxMessageBytes(), kBudget + (2u << 20));
}

TEST_F(WorkerLimits, RefusesRowsPositionsSequencesAndBudget) {
  std::vector<int32_t> nine(9, 29);
  expect_refused(forward_message(1, 0, nine), ErrorCode::LIMIT, "forward of 9 rows exceeds --max-rows 8");
  expect_refused(forward_message(1, 300, {29}), ErrorCode::LIMIT, "position 300 exceeds --ctx 300");
  grow(1, 0, 256);
  EXPECT_EQ(kv_bytes(), 256 * kPositionBytes);
  expect_refused(forward_message(2, 0, {29}), ErrorCode::LIMIT,
                 "forward would hold 2 sequences (1 new), exceeding --max-sequences 1");
  // A second page would pass the budget of one and a half.
  expect_refused(forward_message(1, 256, {29}), ErrorCode::LIMIT,
                 "would hold 131072 bytes of KV, exceeding --kv-memory 98304");
  EXPECT_EQ(kv_bytes(), 256 * kPositionBytes);  // nothing changed
  // Sequence 1 is as it was: it goes on from 256 positions once it fits (a rewind).
  auto r = ask(forward_message(1, 250, {29, 29}));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->which(), Envelope::Body::LOGITS);
  close(1);
  grow(2, 0, 8);
  close(2);
  expect_still_serving();
}

TEST_F(WorkerLimits, RefusesMessagesBeyondTheLargestLegal) {
  auto r = ask(hello());
  ASSERT_TRUE(r);
  const uint64_t most = r->envelope().getBody().getCapabilities().getLimits().getMaxMessageBytes();
  // Frames each under ZeroMQ's limit, together over it: answered.
  const std::vector<std::vector<uint8_t>> halves(2, std::vector<uint8_t>(most / 2 + 16));
  expect_refused(forward_message(3, 0, {29}), ErrorCode::LIMIT, "exceeds the largest message", halves);
  // One frame over it: ZeroMQ drops the connection before the worker sees the message.
  net::ConnectionMonitor monitor;
  zmq::socket_t big = net::make_dealer(address_, "test-big", {}, &monitor);
  for (int i = 0; i < 500 && !monitor.connected(); ++i) monitor.update(10);
  ASSERT_TRUE(monitor.connected());
  const std::vector<std::vector<uint8_t>> frame{std::vector<uint8_t>(most + 1)};
  ASSERT_TRUE(net::send(big, nullptr, forward_message(3, 0, {29}), frame));
  for (int i = 0; i < 500 && !monitor.lost(); ++i) monitor.update(10);
  EXPECT_TRUE(monitor.lost()) << "the worker took a frame beyond its largest legal message";
  expect_still_serving();
}

TEST_F(WorkerLimits, RefusesARestoreClaimingMoreThanItCarries) {
  grow(4, 0, 16);
  protocol::Builder sr;
  sr.envelope().getBody().initSnapshotRequest().setSeqId(4);
  auto snap = ask(sr.encode());
  ASSERT_TRUE(snap);
  ASSERT_EQ(snap->which(), Envelope::Body::SNAPSHOT);
  const std::vector<uint8_t> state(last_->payload_bytes(0).begin(), last_->payload_bytes(0).end());
  // The envelope claims more bytes than the frame has.
  auto r = restore(4, state, state.size() + 100);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->which(), Envelope::Body::ERROR);
  EXPECT_EQ(r->envelope().getBody().getError().getCode(), ErrorCode::LIMIT);
  // The state claims more positions than its bytes hold (its first layer's count).
  auto lying = state;
  const uint64_t claimed = 1000000;
  std::memcpy(lying.data() + 64, &claimed, 8);
  r = restore(4, lying, lying.size());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->which(), Envelope::Body::ERROR);
  EXPECT_EQ(r->envelope().getBody().getError().getCode(), ErrorCode::BAD_REQUEST);
  EXPECT_NE(std::string(r->envelope().getBody().getError().getText().cStr()).find("claims 1000000 positions"),
            std::string::npos);
  // A new sequence beyond --max-sequences.
  r = restore(5, state, state.size());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->which(), Envelope::Body::ERROR);
  EXPECT_EQ(r->envelope().getBody().getError().getCode(), ErrorCode::LIMIT);
  // Sequence 4 as it was: its state restores over itself.
  r = restore(4, state, state.size());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->which(), Envelope::Body::RESTORED);
  EXPECT_EQ(kv_bytes(), 256 * kPositionBytes);
  close(4);
  expect_still_serving();
}

// One coordinator owns a worker at a time: a plan makes its session the owner; another
// session's sequence messages are refused with busy (dropped: those that have no
// answer), and so is its plan while the owner is connected, unless it takes over,
// which drops the owner's sequences.
class WorkerSessions : public WorkerProtocol {
 protected:
  static std::vector<uint8_t> plan(uint64_t session, bool take_over = false) {
    protocol::Builder b;
    b.envelope().setSession(session);
    auto p = b.envelope().getBody().initPlan();
    p.setStageCount(1);
    p.setTakeOver(take_over);
    return b.encode();
  }
  // Every sequence message kind, of `session`, about sequence `seq`.
  static std::vector<std::pair<std::string, std::vector<uint8_t>>> sequence_messages(uint64_t session, int32_t seq) {
    std::vector<std::pair<std::string, std::vector<uint8_t>>> out;
    auto add = [&](const char* name, auto fill) {
      protocol::Builder b;
      b.envelope().setSession(session);
      fill(b.envelope().getBody());
      out.emplace_back(name, b.encode());
    };
    out.emplace_back("forward", forward_message(seq, 2, {306}, in_session(session)));
    add("close", [&](auto body) { body.initClose().setSeqId(seq); });
    add("open", [&](auto body) { body.initOpen().setSeqId(seq); });
    add("truncate", [&](auto body) {
      auto t = body.initTruncate();
      t.setSeqId(seq);
      t.setPos(1);
    });
    add("snapshotRequest", [&](auto body) { body.initSnapshotRequest().setSeqId(seq); });
    add("restore", [&](auto body) {
      auto r = body.initRestore();
      r.setSeqId(seq);
      r.setFirstLayer(0);
      r.setLastLayer(2);
    });
    return out;
  }
  zmq::socket_t connect(const std::string& id) {
    zmq::socket_t s = net::make_dealer(address_, id);
    auto r = ask_on(s, hello(), 20000);
    EXPECT_TRUE(r && r->which() == Envelope::Body::CAPABILITIES);
    return s;
  }
};

TEST_F(WorkerSessions, OneCoordinatorOwnsTheWorker) {
  constexpr uint64_t kOwner = 0x0a0a0a0a, kOther = 0x0b0b0b0b, kThird = 0x0c0c0c0c;
  EXPECT_EQ(refused_with(plan(0)), ErrorCode::BAD_REQUEST) << "a plan without a session";
  auto ack = ask(plan(kOwner));
  ASSERT_TRUE(ack);
  ASSERT_EQ(ack->which(), Envelope::Body::PLAN_ACK);
  auto r = ask(forward_message(7, 0, {1, 450}, in_session(kOwner)));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->which(), Envelope::Body::LOGITS);
  EXPECT_EQ(r->envelope().getSession(), kOwner);

  zmq::socket_t other = connect("other-coordinator");
  auto caps = ask_on(other, hello());
  ASSERT_TRUE(caps);
  ASSERT_EQ(caps->which(), Envelope::Body::CAPABILITIES);
  EXPECT_EQ(caps->envelope().getBody().getCapabilities().getSession(), kOwner);
  EXPECT_TRUE(caps->envelope().getBody().getCapabilities().getOwnerConnected());
  EXPECT_FALSE(caps->envelope().getBody().getCapabilities().getCurve());
  for (const auto& [name, message] : sequence_messages(kOther, 7)) {
    if (name == "close" || name == "open" || name == "truncate") {
      // No answer to these (none on success either): dropped; the next answer is hello's.
      ASSERT_TRUE(net::send(other, nullptr, message));
      auto next = ask_on(other, hello());
      ASSERT_TRUE(next) << name;
      EXPECT_EQ(next->which(), Envelope::Body::CAPABILITIES) << name << " of another session was answered";
      continue;
    }
    auto a = ask_on(other, message);
    ASSERT_TRUE(a) << name;
    ASSERT_EQ(a->which(), Envelope::Body::ERROR) << name << " of another session was served";
    EXPECT_EQ(a->envelope().getBody().getError().getCode(), ErrorCode::BUSY) << name;
    EXPECT_NE(std::string(a->envelope().getBody().getError().getText().cStr()).find("another coordinator's session"),
              std::string::npos)
        << name;
  }
  auto refused_plan = ask_on(other, plan(kOther));
  ASSERT_TRUE(refused_plan);
  ASSERT_EQ(refused_plan->which(), Envelope::Body::ERROR);
  EXPECT_EQ(refused_plan->envelope().getBody().getError().getCode(), ErrorCode::BUSY);
  EXPECT_NE(std::string(refused_plan->envelope().getBody().getError().getText().cStr()).find("--take-over"),
            std::string::npos);
  // None of that touched the owner's sequence: it goes on where it was.
  r = ask(forward_message(7, 2, {306}, in_session(kOwner)));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->which(), Envelope::Body::LOGITS);

  // Taking over: the old owner hears it at once, and its sequences are gone.
  ack = ask_on(other, plan(kOther, true));
  ASSERT_TRUE(ack);
  ASSERT_EQ(ack->which(), Envelope::Body::PLAN_ACK);
  auto notice = next_answer_on(socket_);
  ASSERT_TRUE(notice) << "the old owner was not told";
  ASSERT_EQ(notice->which(), Envelope::Body::ERROR);
  EXPECT_EQ(notice->envelope().getBody().getError().getCode(), ErrorCode::BUSY);
  EXPECT_NE(std::string(notice->envelope().getBody().getError().getText().cStr()).find("taken over"),
            std::string::npos);
  EXPECT_EQ(refused_with(forward_message(7, 3, {338}, in_session(kOwner))), ErrorCode::BUSY);
  // Sequence 7 of the new session does not exist: its position 3 leaves a gap.
  auto gap = ask_on(other, forward_message(7, 3, {338}, in_session(kOther)));
  ASSERT_TRUE(gap);
  ASSERT_EQ(gap->which(), Envelope::Body::ERROR);
  EXPECT_EQ(gap->envelope().getBody().getError().getCode(), ErrorCode::FORWARD_FAILED);
  auto fresh = ask_on(other, forward_message(7, 0, {1}, in_session(kOther)));
  ASSERT_TRUE(fresh);
  EXPECT_EQ(fresh->which(), Envelope::Body::LOGITS);

  // Once the owner is gone, a new session plans without taking over.
  other.close();
  zmq::socket_t third = connect("third-coordinator");
  std::unique_ptr<protocol::Decoded> third_ack;
  for (int attempt = 0; attempt < 50; ++attempt) {
    third_ack = ask_on(third, plan(kThird));
    if (third_ack && third_ack->which() == Envelope::Body::PLAN_ACK) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the disconnect is not seen yet
  }
  ASSERT_TRUE(third_ack);
  EXPECT_EQ(third_ack->which(), Envelope::Body::PLAN_ACK) << "a gone owner's session still holds the worker";
  expect_still_serving();
}

}  // namespace
}  // namespace pico
