#include "stage.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "server.hpp"

namespace pico::coordinator {

using protocol::Envelope;

// ---- LocalStage -------------------------------------------------------------

LocalStage::LocalStage(const std::string& model_path, std::optional<model::LayerRange> range, int threads)
    : engine_(model_path, range, threads) {
  info_.name = "local";
  info_.layers = engine_.layers();
  info_.identity = engine_.identity();
  info_.backend = engine_.backend_name();
  info_.threads = static_cast<uint32_t>(engine_.threads());
}

void LocalStage::plan(Stage* next, size_t, size_t) {
  next_ = nullptr;
  if (next) {
    next_ = dynamic_cast<LocalStage*>(next);
    if (!next_) throw StageError("a local stage can only be followed by another local stage");
  }
  last_ = this;
  while (last_->next_) last_ = last_->next_;
}

void LocalStage::submit(uint64_t step, std::span<const model::BatchToken> batch) { run(step, batch, nullptr); }

void LocalStage::run(uint64_t step, std::span<const model::BatchToken> batch, const float* hidden) {
  std::vector<float> out;
  try {
    out = engine_.forward(batch, hidden);
  } catch (const std::exception& e) {
    throw StageError("local stage (layers " + std::to_string(info_.layers.first) + "-" +
                     std::to_string(info_.layers.last - 1) + "): " + e.what());
  }
  if (next_) {
    next_->run(step, batch, out.data());
    return;
  }
  StepOutput o;
  o.step = step;
  o.n_vocab = engine_.n_vocab();
  for (const auto& t : batch) {
    if (!t.logits) continue;
    o.seq_ids.push_back(t.seq_id);
    o.positions.push_back(t.pos);
  }
  o.logits = std::move(out);
  done_.push_back(std::move(o));
}

std::optional<StepOutput> LocalStage::poll(int) {
  if (done_.empty()) return std::nullopt;
  StepOutput o = std::move(done_.front());
  done_.pop_front();
  return o;
}

StageStats LocalStage::stats() {
  StageStats s;
  s.memory_bytes = worker::resident_bytes();
  s.kv_bytes = engine_.kv_bytes();
  s.sequences = static_cast<uint32_t>(engine_.sequences());
  s.batches = engine_.batches();
  s.tokens = engine_.tokens();
  return s;
}

// ---- RemoteStage ------------------------------------------------------------

namespace {

// One routing id for all of this coordinator's connections: the last worker sends
// logits, and every worker its errors, to the peer that sent the plan.
const std::string& coordinator_id() {
  static const std::string id = "coord-" + std::to_string(::getpid()) + "-" +
                                std::to_string(std::chrono::steady_clock::now().time_since_epoch().count() % 1000000);
  return id;
}

std::string error_text(protocol::Envelope::Reader env) {
  const auto e = env.getBody().getError();
  return std::string(e.getText().cStr());
}

}  // namespace

RemoteStage::RemoteStage(const std::string& address, const RemoteOptions& options)
    : address_(address), options_(options) {
  try {
    socket_ = net::make_dealer(address, coordinator_id(), options.timing, &monitor_);
  } catch (const std::exception& e) {
    fail(std::string("cannot connect: ") + e.what());
  }
  info_.name = address;
  protocol::Builder hello;
  hello.envelope().getBody().initHello().setRole("coordinator");
  send(hello.encode());
  auto msg = receive(options_.connect_timeout_ms);
  if (!msg) fail("no answer to hello within " + std::to_string(options_.connect_timeout_ms) + " ms");
  protocol::Decoded d(msg->header_bytes());
  if (d.which() == Envelope::Body::ERROR) fail("refused hello: " + error_text(d.envelope()));
  if (d.which() != Envelope::Body::CAPABILITIES) {
    fail(std::string("answered hello with ") + protocol::body_name(d.which()));
  }
  const auto caps = d.envelope().getBody().getCapabilities();
  info_.layers = {static_cast<int32_t>(caps.getFirstLayer()), static_cast<int32_t>(caps.getLastLayer())};
  info_.identity = protocol::read_identity(caps.getModel());
  info_.isa = caps.getIsa().cStr();
  info_.backend = caps.getBackend().cStr();
  info_.cores = caps.getCores();
  info_.threads = caps.getThreads();
  info_.memory_bytes = caps.getMemoryBytes();
}

void RemoteStage::fail(const std::string& what) const { throw StageError("worker " + address_ + ": " + what); }

void RemoteStage::check_alive() {
  monitor_.update(0);
  if (monitor_.lost()) fail("connection lost (the worker died or stopped answering)");
}

void RemoteStage::send(const std::vector<uint8_t>& header, std::span<const std::vector<uint8_t>> payloads) {
  check_alive();
  if (!net::send(socket_, nullptr, header, payloads)) fail("cannot queue a message (not connected)");
}

std::optional<net::Received> RemoteStage::receive(int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    check_alive();
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    auto msg = net::receive(socket_, false, static_cast<int>(std::clamp<int64_t>(left, 0, 50)));
    if (msg) {
      std::optional<protocol::Decoded> d;
      try {
        d.emplace(msg->header_bytes());
      } catch (const protocol::ProtocolError& e) {
        fail(std::string("unreadable answer: ") + e.what());
      }
      if (d->which() == Envelope::Body::HEARTBEAT) continue;
      return msg;
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
  }
}

void RemoteStage::plan(Stage* next, size_t index, size_t count) {
  std::string next_address;
  if (next) {
    auto* remote = dynamic_cast<RemoteStage*>(next);
    if (!remote) fail("a remote stage can only be followed by another remote stage");
    next_address = remote->address();
  }
  protocol::Builder b;
  auto p = b.envelope().getBody().initPlan();
  p.setNext(next_address);
  p.setStageIndex(static_cast<uint32_t>(index));
  p.setStageCount(static_cast<uint32_t>(count));
  send(b.encode());
  auto msg = receive(options_.connect_timeout_ms);
  if (!msg) fail("no answer to the plan");
  protocol::Decoded d(msg->header_bytes());
  if (d.which() == Envelope::Body::ERROR) fail("refused the plan: " + error_text(d.envelope()));
  if (d.which() != Envelope::Body::PLAN_ACK) {
    fail(std::string("answered the plan with ") + protocol::body_name(d.which()));
  }
}

void RemoteStage::submit(uint64_t step, std::span<const model::BatchToken> batch) {
  protocol::Builder b;
  auto f = b.envelope().getBody().initForward();
  const auto n = static_cast<unsigned>(batch.size());
  f.setStepId(step);
  auto seqs = f.initSeqIds(n);
  auto pos = f.initPositions(n);
  auto tokens = f.initTokens(n);
  auto want = f.initWantLogits(n);
  for (unsigned i = 0; i < n; ++i) {
    seqs.set(i, batch[i].seq_id);
    pos.set(i, batch[i].pos);
    tokens.set(i, batch[i].token);
    want.set(i, batch[i].logits);
  }
  f.setRows(n);
  f.setWidth(0);
  f.setDtype(protocol::DType::F32);
  f.setOutputDtype(options_.activations);
  send(b.encode());
}

void RemoteStage::close(int32_t seq_id) {
  protocol::Builder b;
  b.envelope().getBody().initClose().setSeqId(seq_id);
  send(b.encode());
}

void RemoteStage::truncate(int32_t seq_id, int64_t pos) {
  protocol::Builder b;
  auto t = b.envelope().getBody().initTruncate();
  t.setSeqId(seq_id);
  t.setPos(pos);
  send(b.encode());
}

std::optional<StepOutput> RemoteStage::poll(int timeout_ms) {
  auto msg = receive(timeout_ms);
  if (!msg) return std::nullopt;
  protocol::Decoded d(msg->header_bytes());
  if (d.which() == Envelope::Body::ERROR) {
    const auto e = d.envelope().getBody().getError();
    fail(std::string(e.getText().cStr()) +
         (e.getStepId() ? " (step " + std::to_string(e.getStepId()) + ")" : std::string()));
  }
  if (d.which() != Envelope::Body::LOGITS) fail(std::string("unexpected ") + protocol::body_name(d.which()));
  const auto l = d.envelope().getBody().getLogits();
  StepOutput o;
  o.step = l.getStepId();
  o.n_vocab = l.getNVocab();
  for (auto s : l.getSeqIds()) o.seq_ids.push_back(s);
  for (auto p : l.getPositions()) o.positions.push_back(p);
  if (msg->payloads.size() != 1 || o.seq_ids.size() != l.getRows()) fail("logits without their payload");
  try {
    o.logits = protocol::decode_payload(protocol::DType::F32, msg->payload_bytes(0), l.getRows(), l.getNVocab());
  } catch (const std::exception& e) {
    fail(e.what());
  }
  return o;
}

StageStats RemoteStage::stats() {
  protocol::Builder b;
  b.envelope().getBody().setStatsRequest();
  send(b.encode());
  auto msg = receive(options_.connect_timeout_ms);
  if (!msg) fail("no answer to a stats request");
  protocol::Decoded d(msg->header_bytes());
  if (d.which() != Envelope::Body::STATS) fail(std::string("answered stats with ") + protocol::body_name(d.which()));
  const auto s = d.envelope().getBody().getStats();
  return {s.getMemoryBytes(), s.getKvBytes(), s.getBatches(), s.getTokens(), s.getSequences()};
}

}  // namespace pico::coordinator
