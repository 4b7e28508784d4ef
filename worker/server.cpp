#include "server.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <tuple>
#include <thread>

#include "link_probe.hpp"
#include "model/memory_room.hpp"
#include "sample/argmax.hpp"
#include "slot_file.hpp"
#include "cpu/cpu_features.hpp"

namespace pico::worker {

using protocol::DType;
using protocol::Envelope;
using protocol::ErrorCode;
using protocol::LogitsOutput;

uint64_t resident_bytes() {
  std::ifstream in("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

uint64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

void write_host_capabilities(protocol::schema::Capabilities::Builder caps, int threads, const std::string& backend,
                             const std::string& device, uint64_t device_memory_bytes) {
  caps.setIsa(std::string(cpu::level_name(cpu::best_level())));
  caps.setCores(std::thread::hardware_concurrency());
  caps.setThreads(static_cast<uint32_t>(threads));
  caps.setMemoryBytes(physical_memory_bytes());
  caps.setBackend(backend);
  caps.setDevice(device);
  caps.setDeviceMemoryBytes(device_memory_bytes);
}

std::vector<uint8_t> heartbeat_answer(protocol::schema::Heartbeat::Reader heartbeat, const net::Received& msg) {
  // The answer carries this worker's clock and echoes the sender's (clock offset), and
  // the size of a bandwidth probe once all of it arrived.
  const uint64_t probe = heartbeat.getProbeBytes();
  const size_t expected_frames = probe > 0 ? 1 : 0;
  if (msg.payloads.size() != expected_frames || (probe > 0 && msg.payloads[0].size() != probe)) {
    return protocol::make_error(ErrorCode::BAD_REQUEST, "a heartbeat carries one payload frame of probeBytes (" +
                                                            std::to_string(probe) + ") bytes, or none without it");
  }
  return protocol::make_heartbeat(heartbeat.getSentNanos(), probe);
}

std::unique_ptr<net::ZapAuthenticator> make_authenticator(const Security& security) {
  if (!security.keys) return nullptr;
  return std::make_unique<net::ZapAuthenticator>(
      security.authorized_keys, [](const std::string& address, const std::string& key) {
        spdlog::warn("refused a connection from {}: {}", address.empty() ? "(unknown address)" : address,
                     key.empty() ? std::string("not a CURVE client")
                                 : "its key " + key + " is not authorized (--authorized-keys, or the plan's stages)");
      });
}

bool local_only(const std::string& address) {
  if (address.rfind("ipc://", 0) == 0) return true;
  for (const char* prefix : {"tcp://127.", "tcp://localhost:", "tcp://[::1]:"}) {
    if (address.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

Server::Server(StageEngine& engine, const std::string& listen_address, const net::Timing& timing,
               const Security& security)
    : engine_(engine),
      timing_(timing),
      keys_(security.keys),
      zap_(make_authenticator(security)),
      router_(net::make_router(listen_address, timing, keys_ ? &*keys_ : nullptr)) {
  log_security(listen_address, security);
}

Server::Server(StageEngine& engine, zmq::socket_t bound_router, std::unique_ptr<net::ZapAuthenticator> zap,
               const std::string& listen_address, const net::Timing& timing, const Security& security)
    : engine_(engine), timing_(timing), keys_(security.keys), zap_(std::move(zap)), router_(std::move(bound_router)) {
  log_security(listen_address, security);
}

void Server::log_security(const std::string& listen_address, const Security& security) const {
  if (keys_) {
    spdlog::info("CURVE: public key {}, {} authorized key(s)", keys_->public_key, security.authorized_keys.size());
  } else if (!local_only(listen_address)) {
    spdlog::warn("{} is not a loopback address and this worker has no keys (--secret-key, --authorized-keys): the "
                 "link is unencrypted and anyone who reaches the port can use this worker",
                 listen_address);
  }
}

void Server::run(const std::atomic<bool>& stop) {
  idle_since_nanos_ = protocol::steady_nanos();
  while (!stop.load() && !moved_to_) serve_one(100);
}

std::pair<zmq::socket_t, std::unique_ptr<net::ZapAuthenticator>> Server::release_socket() {
  next_monitor_.reset();  // before the sockets they watch
  chain_monitor_.reset();
  next_.reset();
  chain_to_.reset();
  return {std::move(router_), std::move(zap_)};
}

bool Server::serve_one(int timeout_ms) {
  if (idle_since_nanos_ == 0) idle_since_nanos_ = protocol::steady_nanos();
  auto msg = net::receive(router_, true, timeout_ms);
  if (!msg) return false;
  received_nanos_ = protocol::steady_nanos();
  finished_nanos_ = 0;
  handle(*msg);
  // Idle from the moment a forward's output was handed over (being descheduled
  // after that is not this stage's work), or from now after any other message.
  idle_since_nanos_ = finished_nanos_ ? finished_nanos_ : protocol::steady_nanos();
  return true;
}

void Server::handle_assign(const std::string& peer, protocol::schema::Assign::Reader a) {
  // The range served is assigned already; another one only to a --layers auto worker,
  // by its owner (or anyone while it has none or its owner is gone): it answers, then
  // run() returns and the worker loads that range on the same socket.
  const model::LayerRange r = engine_.layers();
  const model::LayerRange wanted{static_cast<int32_t>(std::min<uint32_t>(a.getFirstLayer(), INT32_MAX)),
                                 static_cast<int32_t>(std::min<uint32_t>(a.getLastLayer(), INT32_MAX))};
  auto assigned = [&] {
    protocol::Builder b;
    auto done = b.envelope().getBody().initAssigned();
    done.setFirstLayer(a.getFirstLayer());
    done.setLastLayer(a.getLastLayer());
    reply(peer, b.encode());
  };
  const std::string served = model::to_string(r);
  if (wanted.first == r.first && wanted.last == r.last) {
    assigned();
  } else if (!movable_) {
    reply(peer, protocol::make_error(ErrorCode::BAD_REQUEST, "this worker serves layers " + served +
                                                                 "; one started with fixed --layers takes no other range "
                                                                 "(start it with --layers auto)"));
  } else if (owned_by_another_connected()) {
    reply(peer, protocol::make_error(ErrorCode::BUSY, "another coordinator's session owns this worker, and it is "
                                                      "still connected",
                                     0, message_session_));
  } else if (wanted.first < 0 || wanted.first >= wanted.last || wanted.last > engine_.n_layer()) {
    reply(peer, protocol::make_error(ErrorCode::BAD_REQUEST,
                                     "layers [" + std::to_string(a.getFirstLayer()) + ", " +
                                         std::to_string(a.getLastLayer()) + ") are not a range of this model's " +
                                         std::to_string(engine_.n_layer()) + " layers"));
  } else {
    spdlog::info("moving from layers {} to layers {}-{}: its sequences are dropped", served, wanted.first,
                 wanted.last - 1);
    assigned();
    moved_to_ = wanted;
  }
}

void Server::reply(const std::string& peer, const std::vector<uint8_t>& header) {
  if (!net::send(router_, &peer, header)) spdlog::warn("could not reply to peer {}", peer);
}

void Server::report(const std::string& peer, ErrorCode code, const std::string& text, uint64_t step) {
  spdlog::warn("refused: {}", text);
  const std::string& to = coordinator_.empty() ? peer : coordinator_;
  reply(to, protocol::make_error(code, text, step, message_session_));
}

void Server::handle(net::Received& msg) {
  std::optional<protocol::Decoded> decoded;
  try {
    decoded.emplace(msg.header_bytes());
  } catch (const protocol::ProtocolError& e) {
    // Straight back to the sender: it is the one speaking nonsense.
    spdlog::warn("refused a message from {}: {}", msg.peer, e.what());
    reply(msg.peer, protocol::make_error(e.code(), e.what()));
    return;
  }
  const auto env = decoded->envelope();
  const auto body = env.getBody();
  message_session_ = env.getSession();
  try {
    switch (decoded->which()) {
      case Envelope::Body::OPEN:
      case Envelope::Body::CLOSE:
      case Envelope::Body::TRUNCATE:
      case Envelope::Body::SNAPSHOT_REQUEST:
      case Envelope::Body::RESTORE:
      case Envelope::Body::SLOT_SAVE:
      case Envelope::Body::SLOT_RESTORE:
      case Envelope::Body::FORWARD:
        if (!admit(msg.peer, decoded->which(),
                   decoded->which() == Envelope::Body::FORWARD ? body.getForward().getStepId() : 0)) {
          return;
        }
        break;
      default:
        break;  // hello, heartbeat and stats are open to any peer; a plan checks itself
    }
    switch (decoded->which()) {
      case Envelope::Body::HELLO: {
        protocol::Builder b;
        auto caps = b.envelope().getBody().initCapabilities();
        write_host_capabilities(caps, engine_.threads(), engine_.backend_name(), engine_.device(),
                                engine_.device_memory_bytes());
        caps.setFirstLayer(static_cast<uint32_t>(engine_.layers().first));
        caps.setLastLayer(static_cast<uint32_t>(engine_.layers().last));
        protocol::write_identity(engine_.identity(), caps.initModel());
        const StageLimits& l = engine_.limits();
        auto limits = caps.initLimits();
        limits.setMaxRows(static_cast<uint32_t>(l.max_rows));
        limits.setMaxPositions(static_cast<uint32_t>(l.max_positions));
        limits.setMaxSequences(static_cast<uint32_t>(l.max_sequences));
        limits.setStateBudgetBytes(l.state_budget_bytes);
        limits.setKvBytesPerPosition(l.kv_bytes_per_position);
        limits.setStateBytesPerSequence(l.state_bytes_per_sequence);
        limits.setPagePositions(static_cast<uint32_t>(l.page_positions));
        limits.setMaxMessageBytes(l.max_message_bytes);
        caps.setSession(session_);
        caps.setOwnerConnected(owner_connected());
        caps.setCurve(keys_.has_value());
        caps.setMovable(movable_);
        if (profile_) write_profile(*profile_, caps.initProfile());
        reply(msg.peer, b.encode());
        break;
      }
      case Envelope::Body::PLAN:
        handle_plan(msg.peer, body.getPlan());
        break;
      case Envelope::Body::OPEN:
        break;  // state is created on the first forward
      case Envelope::Body::CLOSE:
        engine_.close(body.getClose().getSeqId());
        break;
      case Envelope::Body::TRUNCATE:
        engine_.truncate(body.getTruncate().getSeqId(), body.getTruncate().getPos());
        break;
      case Envelope::Body::FORWARD:
        // The chain toward the first stage connects once its plan is surely there.
        if (!chain_to_ && !chain_address_.empty()) connect_chain();
        if (next_monitor_ && !next_monitor_->handshake_succeeded()) {
          next_monitor_->update(0);  // until the link is up: no poll per forward after that
          if (!next_monitor_->handshake_failure().empty()) {
            report(msg.peer, ErrorCode::UNAVAILABLE,
                   "the link to the next stage (" + next_address_ + ") failed: " + next_monitor_->handshake_failure(),
                   body.getForward().getStepId());
            break;
          }
        }
        handle_forward(msg.peer, env, msg);
        break;
      case Envelope::Body::STATS_REQUEST: {
        protocol::Builder b;
        auto s = b.envelope().getBody().initStats();
        s.setMemoryBytes(resident_bytes());
        s.setKvBytes(engine_.kv_bytes());
        s.setRecurrentBytes(engine_.recurrent_bytes());
        s.setCheckpointBytes(engine_.checkpoint_bytes());
        s.setSequences(static_cast<uint32_t>(engine_.sequences()));
        s.setBatches(engine_.batches());
        s.setTokens(engine_.tokens());
        s.setChainedSteps(chained_steps_);
        s.setFreeBytes(model::MemoryRoom().available());
        reply(msg.peer, b.encode());
        break;
      }
      case Envelope::Body::HEARTBEAT:
        reply(msg.peer, heartbeat_answer(body.getHeartbeat(), msg));
        break;
      case Envelope::Body::LINK_PROBE:
        reply(msg.peer, answer_link_probe(body.getLinkProbe(), keys_));
        break;
      case Envelope::Body::ASSIGN:
        handle_assign(msg.peer, body.getAssign());
        break;
      case Envelope::Body::SNAPSHOT_REQUEST:
        answer_snapshot(msg.peer, body.getSnapshotRequest().getSeqId());
        break;
      case Envelope::Body::RESTORE:
        handle_restore(msg.peer, env, msg);
        break;
      case Envelope::Body::SLOT_SAVE:
      case Envelope::Body::SLOT_RESTORE:
        handle_slot(msg.peer, env);
        break;
      default:
        reply(msg.peer, protocol::make_error(ErrorCode::BAD_REQUEST, std::string("a worker does not take ") +
                                                                         protocol::body_name(decoded->which())));
    }
  } catch (const kj::Exception& e) {
    reply(msg.peer, protocol::make_error(ErrorCode::MALFORMED, e.getDescription().cStr(), 0, message_session_));
  } catch (const std::exception& e) {
    reply(msg.peer, protocol::make_error(ErrorCode::BAD_REQUEST, e.what(), 0, message_session_));
  }
}

// The frames of a message together (ZeroMQ's own limit is per frame).
static uint64_t message_bytes(const net::Received& msg) {
  uint64_t total = msg.header.size();
  for (const auto& p : msg.payloads) total += p.size();
  return total;
}

bool Server::owner_connected() {
  return !coordinator_.empty() && net::routable(router_, coordinator_, protocol::make_heartbeat());
}

bool Server::owned_by_another_connected() {
  return session_ != 0 && message_session_ != session_ && owner_connected();
}

bool Server::admit(const std::string& peer, Envelope::Body::Which which, uint64_t step) {
  if (session_ == 0 || message_session_ == session_) return true;
  // A previous stage (or the last stage's chain) still planned by the old session:
  // nobody there reads answers, so the step is dropped.
  if (which == Envelope::Body::FORWARD && (peer.rfind("stage-", 0) == 0 || peer.rfind("chain-", 0) == 0)) {
    spdlog::info("dropped step {} of session {} from {}: this worker serves session {}", step, protocol::hex(message_session_),
                 peer, protocol::hex(session_));
    return false;
  }
  // Open, close and truncate have no answer: an error would reach the sender unasked,
  // in the middle of its next exchange (a taken-over coordinator closing its sequences
  // just before it plans again), so they are dropped; its next forward hears busy.
  if (which == Envelope::Body::OPEN || which == Envelope::Body::CLOSE || which == Envelope::Body::TRUNCATE) {
    spdlog::info("dropped a {} of session {} from {}: this worker serves session {}", protocol::body_name(which),
                 protocol::hex(message_session_), peer, protocol::hex(session_));
    return false;
  }
  const std::string text = std::string("busy: this worker serves another coordinator's session (") + protocol::hex(session_) +
                           "), not this " + protocol::body_name(which) + "'s session (" + protocol::hex(message_session_) + ")";
  spdlog::warn("refused: {} (from {})", text, peer);
  reply(peer, protocol::make_error(ErrorCode::BUSY, text, step, message_session_));
  return false;
}

void Server::handle_plan(const std::string& peer, protocol::schema::Plan::Reader plan) {
  auto refuse = [&](ErrorCode code, const std::string& text) {
    spdlog::warn("refused a plan from {}: {}", peer, text);
    reply(peer, protocol::make_error(code, text, 0, message_session_));
  };
  const uint64_t session = message_session_;
  if (session == 0) return refuse(ErrorCode::BAD_REQUEST, "a plan must carry its coordinator's session (Envelope.session)");
  const bool new_owner = session != session_;
  if (!plan.getTakeOver() && owned_by_another_connected()) {
    return refuse(ErrorCode::BUSY, "busy: this worker serves another coordinator's session (" + protocol::hex(session_) +
                                       "), which is still connected (pico-coord --take-over takes it over)");
  }
  const std::string next = plan.getNext().cStr();
  if (next.empty() != engine_.is_last()) {
    return refuse(ErrorCode::BAD_REQUEST, engine_.is_last() ? "this stage holds the last layer: no next stage"
                                                            : "this stage ends at layer " +
                                                                  std::to_string(engine_.layers().last) +
                                                                  " and needs a next stage");
  }
  const std::string chain_to = engine_.is_last() ? plan.getChainTo().cStr() : "";
  std::vector<std::string> accept;
  for (auto key : plan.getAcceptKeys()) accept.emplace_back(key.cStr());
  const std::string next_key = plan.getNextPublicKey().cStr();
  const std::string chain_key = plan.getChainToPublicKey().cStr();
  // The keys a plan names must fit this worker: a keyed worker talks CURVE only, an
  // open one has no key pair to talk it with.
  const std::tuple<const std::string&, const char*, const std::string&> links[] = {
      {next_key, "next stage", next}, {chain_key, "chain", chain_to}};
  for (const auto& [key, link, address] : links) {
    if (address.empty()) continue;
    if (keys_ && !net::is_z85_key(key)) {
      return refuse(ErrorCode::BAD_REQUEST, std::string("this worker uses CURVE: the plan needs the ") + link + " (" +
                                                address + ")'s Z85 public key");
    }
    if (!keys_ && !key.empty()) {
      return refuse(ErrorCode::BAD_REQUEST, std::string("the plan names a CURVE key for the ") + link +
                                                ", but this worker has no key pair (--secret-key)");
    }
  }
  for (const auto& key : accept) {
    if (!net::is_z85_key(key)) return refuse(ErrorCode::BAD_REQUEST, "plan: acceptKeys holds a key that is not Z85");
  }
  if (new_owner) {
    if (session_ != 0) {
      spdlog::warn("session {} takes this worker over from session {}{}: {} sequence(s) dropped", protocol::hex(session),
                   protocol::hex(session_), plan.getTakeOver() ? " (take-over)" : " (its coordinator is gone)",
                   engine_.sequences());
    }
    engine_.close_all();  // sequence ids are per session
    // The old owner, if still there, hears it at once rather than at its next step.
    if (session_ != 0 && !coordinator_.empty() && coordinator_ != peer) {
      (void)net::send(router_, &coordinator_,
                      protocol::make_error(ErrorCode::BUSY, "busy: taken over by another coordinator's session (" +
                                                                protocol::hex(session) + ")",
                                           0, session_));
    }
  }
  session_ = session;
  coordinator_ = peer;
  stage_index_ = plan.getStageIndex();
  if (zap_) zap_->set_session_keys(accept);
  // Every plan connects afresh: after a rejoin, batches queued toward the old next
  // stage are dropped rather than delivered to its successor.
  next_monitor_.reset();  // before their sockets
  chain_monitor_.reset();
  chain_failure_logged_ = false;
  next_.reset();
  next_address_.clear();
  chain_to_.reset();
  chain_address_ = chain_to;
  chain_key_ = chain_key;
  if (!next.empty()) {
    const net::Curve curve{keys_ ? *keys_ : net::KeyPair{}, next_key};
    next_monitor_ = std::make_unique<net::ConnectionMonitor>();
    next_.emplace(net::make_dealer(
        next, "stage-" + std::to_string(engine_.layers().first) + "-" + std::to_string(::getpid()), timing_,
        next_monitor_.get(), keys_ ? &curve : nullptr));
    next_address_ = next;
  }
  spdlog::info("plan: stage {} of {}, next {}, session {}", plan.getStageIndex() + 1, plan.getStageCount(),
               next.empty() ? "(coordinator)" : next, protocol::hex(session));
  protocol::Builder b;
  b.envelope().setSession(session);
  b.envelope().getBody().setPlanAck();
  reply(peer, b.encode());
}

void Server::connect_chain() {
  const net::Curve curve{keys_ ? *keys_ : net::KeyPair{}, chain_key_};
  chain_monitor_ = std::make_unique<net::ConnectionMonitor>();
  chain_to_.emplace(net::make_dealer(chain_address_, "chain-" + std::to_string(::getpid()), timing_,
                                     chain_monitor_.get(), keys_ ? &curve : nullptr));
}

void Server::handle_forward(const std::string& peer, Envelope::Reader env, net::Received& msg) {
  const auto f = env.getBody().getForward();
  const uint64_t step = f.getStepId();
  const size_t rows = f.getRows();
  const StageLimits& limits = engine_.limits();
  if (rows > static_cast<uint64_t>(limits.max_rows)) {
    report(peer, ErrorCode::LIMIT,
           "forward of " + std::to_string(rows) + " rows exceeds --max-rows " + std::to_string(limits.max_rows), step);
    return;
  }
  if (message_bytes(msg) > limits.max_message_bytes) {
    report(peer, ErrorCode::LIMIT,
           "forward of " + std::to_string(message_bytes(msg)) + " bytes exceeds the largest message, " +
               std::to_string(limits.max_message_bytes) + " bytes",
           step);
    return;
  }
  const auto seqs = f.getSeqIds();
  const auto pos = f.getPositions();
  const auto tokens = f.getTokens();
  const auto want = f.getWantLogits();
  const auto outputs = f.getLogitsOutput();
  const auto checkpoints = f.getCheckpointKeep();
  const auto traced = f.getTrace();
  if (rows == 0 || seqs.size() != rows || pos.size() != rows || want.size() != rows ||
      (engine_.is_first() && tokens.size() != rows) || (outputs.size() != 0 && outputs.size() != rows) ||
      (checkpoints.size() != 0 && checkpoints.size() != rows) || (traced.size() != 0 && traced.size() != rows)) {
    report(peer, ErrorCode::BAD_REQUEST, "forward: list lengths do not match rows", step);
    return;
  }
  std::vector<model::BatchToken> batch(rows);
  for (size_t i = 0; i < rows; ++i) {
    batch[i] = {seqs[static_cast<unsigned>(i)], pos[static_cast<unsigned>(i)],
                tokens.size() == rows ? tokens[static_cast<unsigned>(i)] : 0, want[static_cast<unsigned>(i)],
                checkpoints.size() == rows ? checkpoints[static_cast<unsigned>(i)] : uint8_t{0}};
    if (outputs.size() == rows) set_output(batch[i], outputs[static_cast<unsigned>(i)]);
    batch[i].trace = traced.size() == rows && traced[static_cast<unsigned>(i)];
  }
  std::vector<float> scratch;
  const float* hidden = nullptr;
  if (!engine_.is_first()) {
    if (f.getWidth() != engine_.n_embd() || msg.payloads.size() != 1) {
      report(peer, ErrorCode::BAD_REQUEST,
             "forward: stage " + std::to_string(engine_.layers().first) + " needs one payload of rows x " +
                 std::to_string(engine_.n_embd()),
             step);
      return;
    }
    // F32 hidden states are read in place from the received frame.
    hidden = protocol::payload_floats(f.getDtype(), msg.payload_bytes(0), rows, f.getWidth(), scratch);
  }
  const uint64_t compute_start = protocol::steady_nanos();
  std::vector<float> out;
  model::ReducedRows argmax;  // the last stage: rows asked as arg max only, reduced by the backend
  try {
    out = engine_.forward(batch, hidden, &argmax);
  } catch (const LimitError& e) {
    report(peer, ErrorCode::LIMIT,
           "layers " + std::to_string(engine_.layers().first) + "-" + std::to_string(engine_.layers().last - 1) +
               ": " + e.what(),
           step);
    return;
  } catch (const std::exception& e) {
    report(peer, ErrorCode::FORWARD_FAILED,
           "layers " + std::to_string(engine_.layers().first) + "-" + std::to_string(engine_.layers().last - 1) +
               ": " + e.what(),
           step);
    return;
  }
  const uint64_t compute_end = protocol::steady_nanos();
  // This stage's timing goes after those of the stages before it.
  const auto earlier = f.getTimings();
  auto stamp = [&](auto list) {
    for (unsigned i = 0; i < earlier.size(); ++i) list.setWithCaveats(i, earlier[i]);
    auto t = list[earlier.size()];
    t.setStage(stage_index_);
    t.setReceivedNanos(received_nanos_);
    t.setIdleSinceNanos(idle_since_nanos_);
    t.setComputeStartNanos(compute_start);
    t.setComputeEndNanos(compute_end);
    return t;
  };
  // The earlier stages' layer traces, then this one's (traced rows only).
  const auto earlier_traces = f.getLayerTraces();
  auto add_traces = [&](auto list) {
    for (unsigned i = 0; i < earlier_traces.size(); ++i) list.setWithCaveats(i, earlier_traces[i]);
    if (argmax.trace_rows.empty()) return;
    auto t = list[earlier_traces.size()];
    t.setFirstLayer(static_cast<uint32_t>(engine_.layers().first));
    t.setLayers(static_cast<uint32_t>(engine_.layers().last - engine_.layers().first));
    auto trace_seqs = t.initSeqIds(static_cast<unsigned>(argmax.trace_rows.size()));
    auto trace_positions = t.initPositions(static_cast<unsigned>(argmax.trace_rows.size()));
    for (unsigned i = 0; i < argmax.trace_rows.size(); ++i) {
      trace_seqs.set(i, batch[static_cast<size_t>(argmax.trace_rows[i])].seq_id);
      trace_positions.set(i, batch[static_cast<size_t>(argmax.trace_rows[i])].pos);
    }
    t.setRms(kj::arrayPtr(argmax.trace.data(), argmax.trace.size()));
  };
  const unsigned n_traces = earlier_traces.size() + (argmax.trace_rows.empty() ? 0u : 1u);
  protocol::Builder b;
  b.envelope().setSession(message_session_);  // everything sent for a step carries its session
  std::vector<zmq::message_t> payload;
  if (engine_.is_last()) {
    auto l = b.envelope().getBody().initLogits();
    if (n_traces > 0) add_traces(l.initLayerTraces(n_traces));
    l.setStepId(step);
    l.setSentNanos(f.getSentNanos());
    size_t n = 0;
    for (const auto& t : batch) n += t.logits && !t.hidden_state ? 1 : 0;
    auto ls = l.initSeqIds(static_cast<unsigned>(n));
    auto lp = l.initPositions(static_cast<unsigned>(n));
    unsigned j = 0;
    for (const auto& t : batch) {
      if (!t.logits || t.hidden_state) continue;
      ls.set(j, t.seq_id);
      lp.set(j++, t.pos);
    }
    const size_t n_hidden = argmax.hidden_rows.size();
    if (argmax.hidden.size() != n_hidden * static_cast<size_t>(engine_.n_embd())) {
      report(peer, ErrorCode::INTERNAL, "hidden states of an unexpected size", step);
      return;
    }
    if (n_hidden > 0) {
      auto hs = l.initHiddenSeqIds(static_cast<unsigned>(n_hidden));
      auto hp = l.initHiddenPositions(static_cast<unsigned>(n_hidden));
      for (unsigned i = 0; i < n_hidden; ++i) {
        const model::BatchToken& t = batch[static_cast<size_t>(argmax.hidden_rows[i])];
        hs.set(i, t.seq_id);
        hp.set(i, t.pos);
      }
      l.setNEmbd(static_cast<uint32_t>(engine_.n_embd()));
      l.setHidden(kj::arrayPtr(argmax.hidden.data(), argmax.hidden.size()));
    }
    l.setRows(static_cast<uint32_t>(n));
    l.setNVocab(static_cast<uint32_t>(engine_.n_vocab()));
    const size_t reduced = static_cast<size_t>(std::count_if(argmax.ids.begin(), argmax.ids.end(), [](int32_t id) { return id >= 0; }));
    if (argmax.ids.size() != n || out.size() != (n - reduced) * static_cast<size_t>(engine_.n_vocab())) {
      report(peer, ErrorCode::INTERNAL, "logits of an unexpected size", step);
      return;
    }
    auto timing = stamp(l.initTimings(earlier.size() + 1));
    // The logits rows are F32 already: handed to ZeroMQ as they are (zero-copy); rows
    // asked as arg max only go in the header instead.
    if (reduced > 0) {
      auto ids = l.initArgmaxIds(static_cast<unsigned>(n));
      auto values = l.initArgmaxLogits(static_cast<unsigned>(n));
      for (unsigned i = 0; i < n; ++i) {
        ids.set(i, argmax.ids[i]);
        values.set(i, argmax.logits[i]);
      }
    }
    payload.push_back(net::owned_frame(std::move(out)));
    l.setSentByLast(f.getChained());
    // The next step of a greedy chain goes out first: it is what the pipeline waits for.
    l.setChained(start_chained_step(f, batch, l.asReader()));
    const std::string& to = coordinator_.empty() ? peer : coordinator_;
    finished_nanos_ = protocol::steady_nanos();
    timing.setSentNanos(finished_nanos_);
    if (!net::send(router_, &to, b.encode(), std::move(payload))) {
      spdlog::warn("could not send logits of step {}", step);
    }
    return;
  }
  if (!next_) {
    report(peer, ErrorCode::BAD_REQUEST, "no plan: this stage does not know the next one", step);
    return;
  }
  auto fw = b.envelope().getBody().initForward();
  fw.setStepId(step);
  fw.setSeqIds(seqs);
  fw.setPositions(pos);
  fw.setWantLogits(want);
  fw.setLogitsOutput(outputs);
  fw.setCheckpointKeep(f.getCheckpointKeep());
  fw.setRows(static_cast<uint32_t>(rows));
  fw.setWidth(static_cast<uint32_t>(engine_.n_embd()));
  fw.setDtype(f.getOutputDtype());
  fw.setOutputDtype(f.getOutputDtype());
  fw.setSentNanos(f.getSentNanos());
  fw.setChainSteps(f.getChainSteps());
  fw.setStopTokens(f.getStopTokens());
  fw.setChained(f.getChained());
  fw.setTrace(traced);
  if (n_traces > 0) add_traces(fw.initLayerTraces(n_traces));
  auto timing = stamp(fw.initTimings(earlier.size() + 1));
  if (f.getOutputDtype() == DType::F32) {
    payload.push_back(net::owned_frame(std::move(out)));  // zero-copy
  } else {
    payload.push_back(net::owned_frame(
        protocol::encode_payload(f.getOutputDtype(), out.data(), rows, static_cast<size_t>(engine_.n_embd()))));
  }
  finished_nanos_ = protocol::steady_nanos();
  timing.setSentNanos(finished_nanos_);
  if (!net::send(*next_, nullptr, b.encode(), std::move(payload))) {
    report(peer, ErrorCode::UNAVAILABLE, "the next stage (" + next_address_ + ") does not take batches", step);
  }
}

bool Server::start_chained_step(protocol::schema::Forward::Reader f, std::span<const model::BatchToken> batch,
                                protocol::schema::Logits::Reader answer) {
  const auto outputs = f.getLogitsOutput();
  const auto ids = answer.getArgmaxIds();
  if (!chain_to_ || f.getChainSteps() == 0 || ids.size() != batch.size() || outputs.size() != batch.size()) {
    return false;
  }
  // A step sent before the link is up could be lost on it (a refused handshake): the
  // coordinator then sends the step itself.
  if (!chain_monitor_->handshake_succeeded()) chain_monitor_->update(0);  // no poll once up
  if (!chain_monitor_->handshake_succeeded()) {
    if (!chain_monitor_->handshake_failure().empty() && !chain_failure_logged_) {
      spdlog::warn("no greedy chains: the link to the first stage ({}) failed: {}", chain_address_,
                   chain_monitor_->handshake_failure());
      chain_failure_logged_ = true;
    }
    return false;
  }
  const auto stop = f.getStopTokens();
  for (unsigned i = 0; i < batch.size(); ++i) {
    if (!batch[i].logits || outputs[i] != LogitsOutput::ARGMAX || ids[i] < 0) return false;
    for (const int32_t token : stop) {
      if (ids[i] == token) return false;
    }
  }
  const auto rows = static_cast<unsigned>(batch.size());
  protocol::Builder b;
  b.envelope().setSession(message_session_);
  auto fw = b.envelope().getBody().initForward();
  fw.setStepId(f.getStepId() + 1);
  fw.setSeqIds(f.getSeqIds());
  auto positions = fw.initPositions(rows);
  auto tokens = fw.initTokens(rows);
  auto want = fw.initWantLogits(rows);
  for (unsigned i = 0; i < rows; ++i) {
    positions.set(i, static_cast<int32_t>(batch[i].pos + 1));
    tokens.set(i, ids[i]);
    want.set(i, true);
  }
  fw.setLogitsOutput(outputs);
  fw.setRows(rows);
  fw.setWidth(0);
  fw.setDtype(DType::F32);
  fw.setOutputDtype(f.getOutputDtype());
  fw.setChainSteps(f.getChainSteps() - 1);
  fw.setStopTokens(stop);
  fw.setChained(true);
  fw.setTrace(f.getTrace());  // a traced stream stays traced along its chain
  fw.setSentNanos(protocol::steady_nanos());
  if (!net::send(*chain_to_, nullptr, b.encode())) {
    spdlog::warn("could not start chained step {}", f.getStepId() + 1);
    return false;
  }
  ++chained_steps_;
  return true;
}

void Server::answer_snapshot(const std::string& peer, int32_t seq_id) {
  auto state = engine_.snapshot(seq_id);
  if (!state) {
    reply(peer, protocol::make_error(ErrorCode::BAD_REQUEST,
                                     "snapshot: sequence " + std::to_string(seq_id) + " is not open on this stage"));
    return;
  }
  protocol::Builder b;
  auto s = b.envelope().getBody().initSnapshot();
  s.setSeqId(seq_id);
  s.setNPos(state->n_pos);
  s.setFirstLayer(static_cast<uint32_t>(engine_.layers().first));
  s.setLastLayer(static_cast<uint32_t>(engine_.layers().last));
  s.setBytes(state->bytes.size());
  std::vector<zmq::message_t> payload;
  payload.push_back(net::owned_frame(std::move(state->bytes)));
  if (!net::send(router_, &peer, b.encode(), std::move(payload))) spdlog::warn("could not send a snapshot");
}

void Server::handle_restore(const std::string& peer, Envelope::Reader env, net::Received& msg) {
  const auto r = env.getBody().getRestore();
  const int32_t seq_id = r.getSeqId();
  if (r.getFirstLayer() != static_cast<uint32_t>(engine_.layers().first) ||
      r.getLastLayer() != static_cast<uint32_t>(engine_.layers().last)) {
    reply(peer, protocol::make_error(ErrorCode::BAD_REQUEST,
                                     "restore: the state covers layers [" + std::to_string(r.getFirstLayer()) + ", " +
                                         std::to_string(r.getLastLayer()) + "), this stage holds [" +
                                         std::to_string(engine_.layers().first) + ", " +
                                         std::to_string(engine_.layers().last) + ")"));
    return;
  }
  if (msg.payloads.size() != 1) {
    reply(peer, protocol::make_error(ErrorCode::BAD_REQUEST, "restore: needs one payload (the state)"));
    return;
  }
  if (r.getBytes() != msg.payloads[0].size()) {
    reply(peer, protocol::make_error(r.getBytes() > msg.payloads[0].size() ? ErrorCode::LIMIT : ErrorCode::BAD_REQUEST,
                                     "restore: claims " + std::to_string(r.getBytes()) + " bytes, carries " +
                                         std::to_string(msg.payloads[0].size())));
    return;
  }
  if (message_bytes(msg) > engine_.limits().max_message_bytes) {
    reply(peer, protocol::make_error(ErrorCode::LIMIT, "restore of " + std::to_string(message_bytes(msg)) +
                                                           " bytes exceeds the largest message, " +
                                                           std::to_string(engine_.limits().max_message_bytes) +
                                                           " bytes"));
    return;
  }
  try {
    engine_.restore(seq_id, msg.payload_bytes(0));  // std::invalid_argument: a bad state, answered by handle()
  } catch (const LimitError& e) {
    reply(peer, protocol::make_error(ErrorCode::LIMIT, std::string("restore: ") + e.what()));
    return;
  }
  protocol::Builder b;
  b.envelope().getBody().initRestored().setSeqId(seq_id);
  reply(peer, b.encode());
}

void Server::handle_slot(const std::string& peer, Envelope::Reader env) {
  const bool save = env.getBody().which() == Envelope::Body::SLOT_SAVE;
  const auto request = save ? env.getBody().getSlotSave() : env.getBody().getSlotRestore();
  const std::string name = request.getName();
  const int32_t seq_id = request.getSeqId();
  const std::string where = "layers " + std::to_string(engine_.layers().first) + "-" +
                            std::to_string(engine_.layers().last - 1) + ": ";
  protocol::Builder b;
  auto done = b.envelope().getBody().initSlotDone();
  done.setSeqId(seq_id);
  done.setName(name);
  try {
    const std::filesystem::path path = slot_file_path(slot_dir_, name);
    if (save) {
      std::vector<int32_t> tokens;
      for (const int32_t t : request.getTokens()) tokens.push_back(t);
      done.setBytes(save_slot(engine_, seq_id, path, tokens));
    } else {
      const std::vector<int32_t> tokens = restore_slot(engine_, seq_id, path);
      done.setTokens(kj::arrayPtr(tokens.data(), tokens.size()));
      done.setBytes(std::filesystem::file_size(path));
    }
  } catch (const LimitError& e) {
    reply(peer, protocol::make_error(ErrorCode::LIMIT, where + e.what()));
    return;
  } catch (const std::exception& e) {
    reply(peer, protocol::make_error(ErrorCode::BAD_REQUEST, where + e.what()));
    return;
  }
  spdlog::info("slot {}: sequence {} {} {}", name, seq_id, save ? "saved to" : "restored from", slot_dir_);
  reply(peer, b.encode());
}

}  // namespace pico::worker
