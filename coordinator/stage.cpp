#include "stage.hpp"

#include "slot_file.hpp"

#include <cmath>

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <thread>
#include <utility>

#include "model/memory_room.hpp"
#include "server.hpp"

namespace pico::coordinator {

using protocol::Envelope;

LocalStage::LocalStage(const std::string& model_path, std::optional<model::LayerRange> range, int threads,
                       const worker::StageLimitOptions& limits, const worker::StageBackendOptions& backend)
    : engine_(model_path, range, threads, limits, backend) {
  info_.name = "local";
  info_.layers = engine_.layers();
  info_.identity = engine_.identity();
  info_.backend = engine_.backend_name();
  info_.device = engine_.device();
  info_.device_memory_bytes = engine_.device_memory_bytes();
  info_.threads = static_cast<uint32_t>(engine_.threads());
  info_.limits = engine_.limits();
}

void LocalStage::plan(Stage* next, Stage*, size_t index, size_t) {
  index_ = index;
  next_ = nullptr;
  if (next) {
    next_ = dynamic_cast<LocalStage*>(next);
    if (!next_) throw StageError("a local stage can only be followed by another local stage");
  }
  last_ = this;
  while (last_->next_) last_ = last_->next_;
}

std::span<const float> StepOutput::row_logits(size_t row) const {
  if (is_argmax(row)) return {};
  size_t full = row;  // full rows before this one
  if (!argmax.empty()) full = static_cast<size_t>(std::count(argmax.begin(), argmax.begin() + row, -1));
  const auto n = static_cast<size_t>(n_vocab);
  return {logits.data() + full * n, n};
}

// ---- LocalStage -------------------------------------------------------------

void LocalStage::submit(uint64_t step, std::span<const model::BatchToken> batch,
                        std::span<const protocol::LogitsOutput> outputs, const ChainGrant&) {
  // Rows asked as arg max only are reduced by the last stage's backend (only the arg
  // max leaves a device), as a worker's are.
  std::vector<model::BatchToken> rows(batch.begin(), batch.end());
  if (outputs.size() == rows.size()) {
    for (size_t i = 0; i < rows.size(); ++i) worker::set_output(rows[i], outputs[i]);
  }
  run(step, rows, nullptr, {}, {});
}

void LocalStage::run(uint64_t step, std::span<const model::BatchToken> batch, const float* hidden,
                     std::vector<StageStamp> stamps, std::vector<StageTrace> traces) {
  StageStamp stamp;
  stamp.stage = static_cast<uint32_t>(index_);
  stamp.received = stamp.idle_since = stamp.compute_start = protocol::steady_nanos();
  std::vector<float> out;
  model::ReducedRows argmax;
  try {
    out = engine_.forward(batch, hidden, &argmax);
  } catch (const std::exception& e) {
    throw StageError("local stage (layers " + model::to_string(info_.layers) + "): " + e.what(), step);
  }
  stamp.compute_end = stamp.sent = protocol::steady_nanos();
  stamps.push_back(stamp);
  if (!argmax.trace_rows.empty()) {
    StageTrace trace{info_.layers.first, info_.layers.last - info_.layers.first, {}, {}, std::move(argmax.trace)};
    for (const int32_t row : argmax.trace_rows) {
      trace.seq_ids.push_back(batch[static_cast<size_t>(row)].seq_id);
      trace.positions.push_back(batch[static_cast<size_t>(row)].pos);
    }
    traces.push_back(std::move(trace));
  }
  if (next_) {
    next_->run(step, batch, out.data(), std::move(stamps), std::move(traces));
    return;
  }
  StepOutput o;
  o.step = step;
  o.stamps = std::move(stamps);
  o.traces = std::move(traces);
  o.n_vocab = engine_.n_vocab();
  for (const auto& t : batch) {
    if (!t.logits || t.hidden_state) continue;
    o.seq_ids.push_back(t.seq_id);
    o.positions.push_back(t.pos);
  }
  for (const int32_t row : argmax.hidden_rows) {
    o.hidden_seq_ids.push_back(batch[static_cast<size_t>(row)].seq_id);
    o.hidden_positions.push_back(batch[static_cast<size_t>(row)].pos);
  }
  o.hidden = std::move(argmax.hidden);
  o.n_embd = engine_.n_embd();
  o.logits = std::move(out);
  if (std::any_of(argmax.ids.begin(), argmax.ids.end(), [](int32_t id) { return id >= 0; })) {
    o.argmax = std::move(argmax.ids);
    o.argmax_logits = std::move(argmax.logits);
  }
  done_.push_back(std::move(o));
}

std::optional<StepOutput> LocalStage::poll(int) {
  if (done_.empty()) return std::nullopt;
  StepOutput o = std::move(done_.front());
  done_.pop_front();
  return o;
}

std::optional<std::vector<uint8_t>> LocalStage::snapshot(int32_t seq_id) {
  auto state = engine_.snapshot(seq_id);
  if (!state) return std::nullopt;
  return std::move(state->bytes);
}

void LocalStage::restore(int32_t seq_id, std::span<const uint8_t> state) {
  try {
    engine_.restore(seq_id, state);
  } catch (const std::exception& e) {
    throw StageError(std::string("local stage: restore: ") + e.what());
  }
}

uint64_t Stage::save_slot(int32_t, const std::string&, std::span<const int32_t>) {
  throw StageError("this stage keeps no slots on disk");
}

Stage::SlotRead Stage::restore_slot(int32_t, const std::string&) {
  throw StageError("this stage keeps no slots on disk");
}

uint64_t LocalStage::save_slot(int32_t seq_id, const std::string& name, std::span<const int32_t> tokens) {
  try {
    return worker::save_slot(engine_, seq_id, worker::slot_file_path(slot_dir_, name), tokens);
  } catch (const std::exception& e) {
    throw StageError(std::string("local stage: ") + e.what());
  }
}

Stage::SlotRead LocalStage::restore_slot(int32_t seq_id, const std::string& name) {
  try {
    const std::filesystem::path path = worker::slot_file_path(slot_dir_, name);
    SlotRead read;
    read.tokens = worker::restore_slot(engine_, seq_id, path);
    read.bytes = std::filesystem::file_size(path);
    return read;
  } catch (const std::exception& e) {
    throw StageError(std::string("local stage: ") + e.what());
  }
}

StageStats LocalStage::stats() {
  StageStats s;
  s.memory_bytes = worker::resident_bytes();
  s.kv_bytes = engine_.kv_bytes();
  s.recurrent_bytes = engine_.recurrent_bytes();
  s.checkpoint_bytes = engine_.checkpoint_bytes();
  s.sequences = static_cast<uint32_t>(engine_.sequences());
  s.batches = engine_.batches();
  s.tokens = engine_.tokens();
  s.free_bytes = model::MemoryRoom().available();
  return s;
}

// ---- RemoteStage ------------------------------------------------------------

namespace {

// One routing id for all of this coordinator's connections: the last worker sends
// logits, and every worker its errors, to the peer that sent the plan. It is unique
// per session: a worker's ROUTER hands a routing id over to whoever connects with it.
const std::string& coordinator_id() {
  static const std::string id = "coord-" + protocol::hex(process_session());
  return id;
}

std::string error_text(protocol::Envelope::Reader env) {
  const auto e = env.getBody().getError();
  return std::string(e.getText().cStr());
}

}  // namespace

uint64_t process_session() {
  static const uint64_t session = [] {
    std::random_device rd;
    uint64_t s = 0;
    while (s == 0) s = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    return s;
  }();
  return session;
}

RemoteStage::RemoteStage(const std::string& address, const RemoteOptions& options)
    : address_(address), options_(options) {
  info_.name = address;
  connect();
  hello(options_.connect_timeout_ms);
}

void RemoteStage::connect() {
  monitor_.reset();  // before its socket
  monitor_ = std::make_unique<net::ConnectionMonitor>();
  try {
    socket_ = net::make_dealer(address_, coordinator_id(), options_.timing, monitor_.get(),
                               options_.curve ? &*options_.curve : nullptr);
  } catch (const std::exception& e) {
    fail(std::string("cannot connect: ") + e.what());
  }
}

void RemoteStage::hello(int timeout_ms) {
  protocol::Builder hello;
  hello.envelope().getBody().initHello().setRole("coordinator");
  send(hello);
  auto msg = receive(timeout_ms);
  if (!msg) fail("no answer to hello within " + std::to_string(timeout_ms) + " ms");
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
  info_.device = caps.getDevice().cStr();
  info_.device_memory_bytes = caps.getDeviceMemoryBytes();
  info_.cores = caps.getCores();
  info_.threads = caps.getThreads();
  info_.memory_bytes = caps.getMemoryBytes();
  info_.movable = caps.getMovable();
  const auto limits = caps.getLimits();
  info_.limits.max_rows = limits.getMaxRows();
  info_.limits.max_positions = limits.getMaxPositions();
  info_.limits.max_sequences = limits.getMaxSequences();
  info_.limits.state_budget_bytes = limits.getStateBudgetBytes();
  info_.limits.kv_bytes_per_position = limits.getKvBytesPerPosition();
  info_.limits.state_bytes_per_sequence = limits.getStateBytesPerSequence();
  info_.limits.page_positions = limits.getPagePositions();
  info_.limits.max_message_bytes = limits.getMaxMessageBytes();
  try {
    info_.profile = worker::read_profile(caps.getProfile(), static_cast<int32_t>(info_.identity.n_layer));
  } catch (const std::invalid_argument& e) {
    fail(std::string("sent a malformed profile: ") + e.what());
  }
  // One coordinator owns a worker at a time: another live session's worker is not
  // used unless asked (a hung worker back from a pause is still this session's).
  const uint64_t owner = caps.getSession();
  if (owner != 0 && owner != process_session() && caps.getOwnerConnected() && !(options_.take_over && !planned_)) {
    fail(std::string(planned_ ? "was taken over by" : "serves") + " another coordinator (session " + protocol::hex(owner) +
         "), which is still connected" + (planned_ ? "" : "; pico-coord --take-over takes it over"));
  }
  estimate_clock_offset();
}

RemoteStage::RoundTrip RemoteStage::heartbeat_round_trip(uint64_t probe_bytes, const char* what) {
  RoundTrip r;
  r.sent = protocol::steady_nanos();
  std::vector<zmq::message_t> payload;
  if (probe_bytes > 0) payload.emplace_back(static_cast<size_t>(probe_bytes));
  {
    check_alive();
    if (!net::send(socket_, nullptr, protocol::make_heartbeat_request(r.sent, probe_bytes), std::move(payload))) {
      fail("cannot queue a message (not connected)");
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.connect_timeout_ms);
  while (true) {
    check_alive();
    auto msg = net::receive(socket_, false, 50);
    r.received = protocol::steady_nanos();
    if (!msg) {
      if (std::chrono::steady_clock::now() >= deadline) fail(std::string("no answer to a ") + what);
      continue;
    }
    protocol::Decoded d(msg->header_bytes());
    if (d.which() == Envelope::Body::ERROR) fail(std::string("refused a ") + what + ": " + error_text(d.envelope()));
    if (d.which() != Envelope::Body::HEARTBEAT) continue;
    const auto h = d.envelope().getBody().getHeartbeat();
    if (h.getEchoNanos() != r.sent || h.getProbeBytes() != probe_bytes) continue;  // an answer to an earlier one
    r.worker_clock = h.getSentNanos();
    return r;
  }
}

// NTP style: a few heartbeat round trips; the one with the smallest round trip gives
// the offset, assuming its two legs took equally long.
void RemoteStage::estimate_clock_offset() {
  uint64_t best_rtt = UINT64_MAX;
  for (int i = 0; i < 8; ++i) {
    const RoundTrip r = heartbeat_round_trip(0, "heartbeat");
    if (r.received - r.sent < best_rtt) {
      best_rtt = r.received - r.sent;
      clock_offset_ = static_cast<int64_t>(r.worker_clock) - static_cast<int64_t>(r.sent / 2 + r.received / 2);
    }
  }
  info_.round_trip_seconds = static_cast<double>(best_rtt) * 1e-9;
  spdlog::debug("worker {}: clock offset {} ns (round trip {} ns)", address_, clock_offset_, best_rtt);
}

double RemoteStage::probe_round_trip(uint64_t probe_bytes, int tries) {
  uint64_t best = UINT64_MAX;
  for (int i = 0; i < tries; ++i) {
    const RoundTrip r = heartbeat_round_trip(probe_bytes, "bandwidth probe");
    best = std::min(best, r.received - r.sent);
  }
  return static_cast<double>(best) * 1e-9;
}

void RemoteStage::assign(model::LayerRange layers) {
  protocol::Builder b;
  auto a = b.envelope().getBody().initAssign();
  a.setFirstLayer(static_cast<uint32_t>(layers.first));
  a.setLastLayer(static_cast<uint32_t>(layers.last));
  send(b);
  const auto msg = receive(options_.connect_timeout_ms);
  if (!msg) fail("no answer to its layer assignment");
  protocol::Decoded d(msg->header_bytes());
  if (d.which() == Envelope::Body::ERROR) fail("refused its layers: " + error_text(d.envelope()));
  if (d.which() != Envelope::Body::ASSIGNED) fail(std::string("answered assign with ") + protocol::body_name(d.which()));
}

std::optional<std::pair<double, double>> RemoteStage::probe_link(const std::string& address,
                                                                 const std::string& public_key, uint64_t probe_bytes,
                                                                 std::string* error) {
  protocol::Builder b;
  auto p = b.envelope().getBody().initLinkProbe();
  p.setAddress(address);
  p.setPublicKey(public_key);
  p.setProbeBytes(probe_bytes);
  send(b);
  const auto msg = receive(options_.connect_timeout_ms);
  if (!msg) fail("no answer to a link probe");
  protocol::Decoded d(msg->header_bytes());
  if (d.which() == Envelope::Body::ERROR) fail("refused a link probe: " + error_text(d.envelope()));
  if (d.which() != Envelope::Body::LINK_MEASURED) {
    fail(std::string("answered linkProbe with ") + protocol::body_name(d.which()));
  }
  const auto m = d.envelope().getBody().getLinkMeasured();
  if (m.getError().size() > 0 || !(m.getBytesPerSecond() > 0) || !(m.getLatencySeconds() >= 0) ||
      !std::isfinite(m.getLatencySeconds()) || !std::isfinite(m.getBytesPerSecond())) {
    if (error) *error = m.getError().size() > 0 ? m.getError().cStr() : "an unusable measure";
    return std::nullopt;
  }
  return std::pair{m.getLatencySeconds(), m.getBytesPerSecond()};
}

void RemoteStage::fail(const std::string& what, uint64_t step) const {
  throw StageError("worker " + address_ + ": " + what, step);
}

void RemoteStage::check_alive() {
  if (!up_) fail(lost_reason_ + "; waiting for it to rejoin");
  if (!up()) fail(lost_reason_);
}

bool RemoteStage::up() {
  if (!up_) return false;
  monitor_->update(0);
  if (monitor_->handshake_failure_kind() != net::ConnectionMonitor::Handshake::ok) {
    using H = net::ConnectionMonitor::Handshake;
    const bool keyed = options_.curve.has_value();
    std::string hint;
    switch (monitor_->handshake_failure_kind()) {
      case H::mechanism_mismatch:
        hint = keyed ? "this coordinator has a CURVE key for it (--worker-key), the worker has none (--secret-key)"
                     : "the worker takes CURVE-authenticated peers only (give --secret-key and --worker-key)";
        break;
      case H::key_refused:
        hint = "this coordinator's public key is not in the worker's --authorized-keys";
        break;
      case H::dropped:
        hint = keyed ? "is --worker-key this worker's public key? does the worker use keys (--secret-key)?" : "";
        break;
      default:
        break;
    }
    // An open client fails a handshake only against a keyed server.
    if (!keyed) hint = "the worker takes CURVE-authenticated peers only (give --secret-key and --worker-key)";
    up_ = false;
    lost_reason_ = "the connection's handshake failed: " + monitor_->handshake_failure() +
                   (hint.empty() ? "" : " (" + hint + ")");
    return false;
  }
  if (monitor_->lost()) {
    up_ = false;
    lost_reason_ = "connection lost (the worker died or stopped answering)";
  }
  return up_;
}

void RemoteStage::rejoin() {
  if (up_) return;
  const StageInfo before = info_;
  connect();
  // A fresh connection to a live worker is up at once; to a dead one it never is.
  for (int waited = 0; !monitor_->connected() && waited < options_.rejoin_connect_ms; waited += 10) {
    monitor_->update(10);
  }
  if (!monitor_->connected()) fail(lost_reason_ + "; not back yet");
  up_ = true;
  try {
    hello(options_.rejoin_answer_ms);
  } catch (const StageError&) {
    up_ = false;
    info_ = before;
    throw;
  }
  if (!(info_.identity == before.identity) || info_.layers.first != before.layers.first ||
      info_.layers.last != before.layers.last) {
    up_ = false;
    const StageInfo now = info_;
    info_ = before;
    lost_reason_ = "came back serving " + protocol::to_string(now.identity) + ", layers " +
                   model::to_string(now.layers) + " (before: " + protocol::to_string(before.identity) + ", layers " +
                   model::to_string(before.layers) + ")";
    fail(lost_reason_);
  }
  if (rejoin_check_) {
    if (const std::string short_of = rejoin_check_(info_); !short_of.empty()) {
      up_ = false;
      info_ = before;
      lost_reason_ = "came back with smaller limits than the coordinator was sized for: " + short_of;
      fail(lost_reason_);
    }
  }
  // Sequences closed while it was away (a worker that was only hung still holds them).
  for (int32_t seq : std::exchange(pending_closes_, {})) close(seq);
  spdlog::info("worker {} rejoined (layers {}-{})", address_, info_.layers.first, info_.layers.last - 1);
}

void RemoteStage::send(protocol::Builder& message, std::vector<zmq::message_t>&& payloads) {
  check_alive();
  message.envelope().setSession(process_session());
  if (!net::send(socket_, nullptr, message.encode(), std::move(payloads))) {
    fail("cannot queue a message (not connected)");
  }
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

net::Received RemoteStage::expect(Envelope::Body::Which which, const char* what) {
  while (true) {
    auto msg = receive(options_.connect_timeout_ms);
    if (!msg) {
      fail(std::string("no answer to ") + what + " within " + std::to_string(options_.connect_timeout_ms) + " ms");
    }
    protocol::Decoded d(msg->header_bytes());
    if (d.which() == which) return std::move(*msg);
    if (d.which() == Envelope::Body::LOGITS) continue;  // of a step abandoned earlier
    if (d.which() == Envelope::Body::ERROR) {
      const auto e = d.envelope().getBody().getError();
      if (e.getStepId() != 0 && e.getCode() != protocol::ErrorCode::BUSY) continue;  // an abandoned step's
      fail(std::string("refused ") + what + ": " + e.getText().cStr());
    }
    fail(std::string("answered ") + what + " with " + protocol::body_name(d.which()));
  }
}

void RemoteStage::plan(Stage* next, Stage* chain_to, size_t index, size_t count) {
  std::string next_address, chain_address, next_key, chain_key;
  if (next) {
    auto* remote = dynamic_cast<RemoteStage*>(next);
    if (!remote) fail("a remote stage can only be followed by another remote stage");
    next_address = remote->address();
    next_key = remote->public_key();
  }
  if (chain_to) {
    auto* remote = dynamic_cast<RemoteStage*>(chain_to);
    if (!remote) fail("chained steps go to a remote first stage only");
    chain_address = remote->address();
    chain_key = remote->public_key();
  }
  protocol::Builder b;
  auto p = b.envelope().getBody().initPlan();
  p.setNext(next_address);
  p.setChainTo(chain_address);
  p.setStageIndex(static_cast<uint32_t>(index));
  p.setStageCount(static_cast<uint32_t>(count));
  p.setNextPublicKey(next_key);
  p.setChainToPublicKey(chain_key);
  if (options_.curve) {
    // Its own key too: a lone stage's chain connects to itself.
    const auto& accept = options_.cluster_keys;
    auto list = p.initAcceptKeys(static_cast<unsigned>(accept.size()));
    for (unsigned i = 0; i < accept.size(); ++i) list.set(i, accept[i]);
  }
  p.setTakeOver(options_.take_over && !planned_);
  // Plans go out with nothing in flight: whatever is queued here is stale (late logits,
  // the notice of an earlier take-over) and must not be read as the plan's answer.
  while (net::receive(socket_, false, 0)) {
  }
  send(b);
  expect(Envelope::Body::PLAN_ACK, "the plan");
  planned_ = true;
}

void RemoteStage::submit(uint64_t step, std::span<const model::BatchToken> batch,
                         std::span<const protocol::LogitsOutput> outputs, const ChainGrant& chain) {
  protocol::Builder b;
  auto f = b.envelope().getBody().initForward();
  const auto n = static_cast<unsigned>(batch.size());
  f.setStepId(step);
  auto seqs = f.initSeqIds(n);
  auto pos = f.initPositions(n);
  auto tokens = f.initTokens(n);
  auto want = f.initWantLogits(n);
  const bool checkpoints =
      std::any_of(batch.begin(), batch.end(), [](const model::BatchToken& t) { return t.checkpoint_keep > 0; });
  auto keep = f.initCheckpointKeep(checkpoints ? n : 0);
  const bool traced = std::any_of(batch.begin(), batch.end(), [](const model::BatchToken& t) { return t.trace; });
  auto trace = f.initTrace(traced ? n : 0);
  for (unsigned i = 0; i < n; ++i) {
    seqs.set(i, batch[i].seq_id);
    pos.set(i, batch[i].pos);
    tokens.set(i, batch[i].token);
    want.set(i, batch[i].logits);
    if (checkpoints) keep.set(i, batch[i].checkpoint_keep);
    if (traced) trace.set(i, batch[i].trace);
  }
  f.setRows(n);
  f.setWidth(0);
  f.setDtype(protocol::DType::F32);
  f.setOutputDtype(options_.activations);
  if (!outputs.empty()) {
    if (outputs.size() != n) fail("submit: one logits output per batch row needed", step);
    auto out = f.initLogitsOutput(n);
    for (unsigned i = 0; i < n; ++i) out.set(i, outputs[i]);
  }
  if (chain.steps > 0) {
    f.setChainSteps(chain.steps);
    auto stop = f.initStopTokens(static_cast<unsigned>(chain.stop_tokens.size()));
    for (unsigned i = 0; i < chain.stop_tokens.size(); ++i) stop.set(i, chain.stop_tokens[i]);
  }
  f.setSentNanos(protocol::steady_nanos());
  send(b);
}

void RemoteStage::close(int32_t seq_id) {
  if (!up_) {
    pending_closes_.push_back(seq_id);
    return;
  }
  protocol::Builder b;
  b.envelope().getBody().initClose().setSeqId(seq_id);
  send(b);
}

std::optional<StepOutput> RemoteStage::poll(int timeout_ms) {
  auto msg = receive(timeout_ms);
  if (!msg) return std::nullopt;
  const uint64_t received = protocol::steady_nanos();
  protocol::Decoded d(msg->header_bytes());
  if (d.which() == Envelope::Body::ERROR) {
    const auto e = d.envelope().getBody().getError();
    // This session planned the worker, so a busy worker now serves someone else.
    // It counts as lost: once that coordinator is gone, it rejoins (hello checks the owner).
    if (e.getCode() == protocol::ErrorCode::BUSY && planned_) {
      up_ = false;
      lost_reason_ = std::string("taken over by another coordinator (") + e.getText().cStr() + ")";
      fail(lost_reason_, e.getStepId());
    }
    fail(std::string(e.getText().cStr()) +
             (e.getStepId() ? " (step " + std::to_string(e.getStepId()) + ")" : std::string()),
         e.getStepId());
  }
  if (d.which() != Envelope::Body::LOGITS) fail(std::string("unexpected ") + protocol::body_name(d.which()));
  const auto l = d.envelope().getBody().getLogits();
  StepOutput o;
  o.step = l.getStepId();
  o.n_vocab = l.getNVocab();
  o.sent_nanos = l.getSentNanos();
  o.received_nanos = received;
  o.chained = l.getChained();
  o.sent_by_last = l.getSentByLast();
  for (auto s : l.getSeqIds()) o.seq_ids.push_back(s);
  for (auto p : l.getPositions()) o.positions.push_back(p);
  for (auto t : l.getTimings()) {
    o.stamps.push_back({t.getStage(), t.getReceivedNanos(), t.getIdleSinceNanos(), t.getComputeStartNanos(),
                        t.getComputeEndNanos(), t.getSentNanos()});
  }
  if (msg->payloads.size() != 1 || o.seq_ids.size() != l.getRows()) fail("logits without their payload", o.step);
  for (auto s : l.getHiddenSeqIds()) o.hidden_seq_ids.push_back(s);
  for (auto p : l.getHiddenPositions()) o.hidden_positions.push_back(p);
  o.n_embd = l.getNEmbd();
  if (o.hidden_positions.size() != o.hidden_seq_ids.size() ||
      l.getHidden().size() != o.hidden_seq_ids.size() * static_cast<size_t>(o.n_embd) ||
      (!o.hidden_seq_ids.empty() && o.n_embd != info_.identity.n_embd)) {
    fail("hidden states whose rows do not match their count or the model's width", o.step);
  }
  o.hidden.reserve(l.getHidden().size());
  for (const float v : l.getHidden()) o.hidden.push_back(v);
  for (const auto t : l.getLayerTraces()) {
    StageTrace trace{static_cast<int32_t>(t.getFirstLayer()), static_cast<int32_t>(t.getLayers()), {}, {}, {}};
    const size_t rows = t.getSeqIds().size();
    if (t.getPositions().size() != rows || t.getRms().size() != rows * t.getLayers() ||
        t.getFirstLayer() + t.getLayers() > static_cast<uint64_t>(info_.identity.n_layer)) {
      fail("a layer trace whose rows or layers do not match", o.step);
    }
    for (const auto s : t.getSeqIds()) trace.seq_ids.push_back(s);
    for (const auto p : t.getPositions()) trace.positions.push_back(p);
    for (const float v : t.getRms()) trace.rms.push_back(v);
    o.traces.push_back(std::move(trace));
  }
  const auto ids = l.getArgmaxIds();
  const auto values = l.getArgmaxLogits();
  size_t full_rows = l.getRows();
  if (ids.size() != 0) {
    if (ids.size() != l.getRows() || values.size() != l.getRows()) fail("logits with partial arg max lists", o.step);
    for (unsigned i = 0; i < ids.size(); ++i) {
      if (ids[i] >= static_cast<int64_t>(l.getNVocab())) fail("an arg max outside the vocabulary", o.step);
      o.argmax.push_back(ids[i] < 0 ? -1 : ids[i]);
      o.argmax_logits.push_back(values[i]);
    }
    full_rows = static_cast<size_t>(std::count(o.argmax.begin(), o.argmax.end(), -1));
  }
  try {
    std::vector<float> scratch;
    const float* rows =
        protocol::payload_floats(protocol::DType::F32, msg->payload_bytes(0), full_rows, l.getNVocab(), scratch);
    const size_t n = full_rows * l.getNVocab();
    if (scratch.empty() && msg->payloads[0].size() >= 64) {
      // Read in place: a frame this large keeps its buffer when moved.
      o.logits = LogitsBuffer(std::move(msg->payloads[0]), rows, n, {});
    } else {
      o.logits = LogitsBuffer(scratch.empty() ? std::vector<float>(rows, rows + n) : std::move(scratch));
    }
  } catch (const std::exception& e) {
    fail(e.what(), o.step);
  }
  return o;
}

StageStats RemoteStage::stats() {
  protocol::Builder b;
  b.envelope().getBody().setStatsRequest();
  send(b);
  const auto msg = expect(Envelope::Body::STATS, "a stats request");
  protocol::Decoded d(msg.header_bytes());
  const auto s = d.envelope().getBody().getStats();
  return {s.getMemoryBytes(), s.getKvBytes(),          s.getBatches(),        s.getTokens(),
          s.getSequences(),   s.getChainedSteps(), s.getRecurrentBytes(), s.getCheckpointBytes(),
          s.getFreeBytes()};
}

std::optional<std::vector<uint8_t>> RemoteStage::snapshot(int32_t seq_id) {
  protocol::Builder b;
  b.envelope().getBody().initSnapshotRequest().setSeqId(seq_id);
  send(b);
  while (true) {
    auto msg = receive(options_.connect_timeout_ms);
    if (!msg) fail("no answer to a snapshot request");
    protocol::Decoded d(msg->header_bytes());
    if (d.which() == Envelope::Body::LOGITS) continue;  // of a step abandoned earlier
    if (d.which() == Envelope::Body::ERROR) {
      const auto e = d.envelope().getBody().getError();
      if (e.getStepId() != 0) continue;
      if (e.getCode() == protocol::ErrorCode::BUSY) fail(std::string("refused a snapshot request: ") + e.getText().cStr());
      return std::nullopt;  // not open there
    }
    if (d.which() != Envelope::Body::SNAPSHOT) fail(std::string("answered a snapshot request with ") +
                                                     protocol::body_name(d.which()));
    const auto s = d.envelope().getBody().getSnapshot();
    if (s.getSeqId() != seq_id || msg->payloads.size() != 1 || msg->payloads[0].size() != s.getBytes()) {
      fail("a snapshot without its state");
    }
    const auto bytes = msg->payload_bytes(0);
    return std::vector<uint8_t>(bytes.begin(), bytes.end());
  }
}

void RemoteStage::restore(int32_t seq_id, std::span<const uint8_t> state) {
  protocol::Builder b;
  auto r = b.envelope().getBody().initRestore();
  r.setSeqId(seq_id);
  r.setFirstLayer(static_cast<uint32_t>(info_.layers.first));
  r.setLastLayer(static_cast<uint32_t>(info_.layers.last));
  r.setBytes(state.size());
  std::vector<zmq::message_t> payload;
  payload.emplace_back(state.data(), state.size());
  send(b, std::move(payload));
  const auto msg = expect(Envelope::Body::RESTORED, "a restore");
  protocol::Decoded d(msg.header_bytes());
  if (d.envelope().getBody().getRestored().getSeqId() != seq_id) fail("restored another sequence");
}

uint64_t RemoteStage::save_slot(int32_t seq_id, const std::string& name, std::span<const int32_t> tokens) {
  return slot_file(true, seq_id, name, tokens).bytes;
}

Stage::SlotRead RemoteStage::restore_slot(int32_t seq_id, const std::string& name) {
  return slot_file(false, seq_id, name, {});
}

Stage::SlotRead RemoteStage::slot_file(bool save, int32_t seq_id, const std::string& name,
                                       std::span<const int32_t> tokens) {
  check_alive();
  protocol::Builder b;
  auto r = save ? b.envelope().getBody().initSlotSave() : b.envelope().getBody().initSlotRestore();
  r.setSeqId(seq_id);
  r.setName(name);
  if (save) r.setTokens(kj::arrayPtr(tokens.data(), tokens.size()));
  send(b);
  const char* what = save ? "a slot save" : "a slot restore";
  const auto msg = expect(Envelope::Body::SLOT_DONE, what);
  protocol::Decoded d(msg.header_bytes());
  const auto done = d.envelope().getBody().getSlotDone();
  if (done.getSeqId() != seq_id || done.getName() != name) {
    fail(std::string("answered ") + what + " for another sequence or file");
  }
  SlotRead read;
  for (const int32_t t : done.getTokens()) read.tokens.push_back(t);
  read.bytes = done.getBytes();
  return read;
}

void wait_readable(std::span<Stage* const> stages, int timeout_ms) {
  std::vector<zmq::pollitem_t> items;
  for (Stage* s : stages) {
    auto* remote = dynamic_cast<RemoteStage*>(s);
    if (!remote) {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(timeout_ms, 1)));
      return;
    }
    items.push_back({remote->socket().handle(), 0, ZMQ_POLLIN, 0});
  }
  try {
    // At most 50 ms, as RemoteStage::receive: a lost connection shows at the next poll.
    zmq::poll(items.data(), items.size(), std::chrono::milliseconds(std::clamp(timeout_ms, 0, 50)));
  } catch (const zmq::error_t& e) {
    spdlog::debug("waiting on the stages' sockets: {}", e.what());
  }
}

}  // namespace pico::coordinator
