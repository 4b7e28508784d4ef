// pico-worker's loop: a ROUTER bound at the listen address serves the coordinator
// (hello, plan, open/truncate/close, stats, heartbeat) and receives forward batches
// (from the coordinator on stage 0, from the previous worker otherwise). Hidden
// states go on through a DEALER to the next stage named in the plan; the last stage
// sends logits, and every stage its errors, to the coordinator (the peer that sent
// the plan) through the ROUTER. One thread; ZeroMQ's I/O thread answers the ZMTP
// heartbeats while a batch runs.
//
// Sessions: a plan makes its Envelope.session the worker's owner; sequence messages
// of any other session are refused with `busy` (forwards passed on by a previous
// stage, and open/close/truncate, which have no answer, are dropped), and a plan of another session is refused while the owner is
// still connected, unless it asks to take over. A new owner's plan drops every
// sequence of the old one. With keys, the ROUTER is a CURVE server that accepts the
// authorized keys plus those the owner's plan names (Plan.acceptKeys).
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <string>
#include <vector>

#include "net.hpp"
#include "profile.hpp"
#include "stage_engine.hpp"

namespace pico::worker {

// CURVE on this worker's links (none: open links).
struct Security {
  std::optional<net::KeyPair> keys;          // --secret-key: the ROUTER's and the DEALERs' key pair
  std::vector<std::string> authorized_keys;  // --authorized-keys: clients accepted in any session
};

// What a worker's Capabilities say of its host and backend (any worker, with layers or
// not yet).
void write_host_capabilities(protocol::schema::Capabilities::Builder caps, int threads, const std::string& backend,
                             const std::string& device, uint64_t device_memory_bytes);
// The answer to a heartbeat (the clock echo, a bandwidth probe's size) or the error
// for a probe whose frame is not the size it announced.
std::vector<uint8_t> heartbeat_answer(protocol::schema::Heartbeat::Reader heartbeat, const net::Received& msg);
// CURVE: the ZAP handler admitting the authorized keys (null without keys).
std::unique_ptr<net::ZapAuthenticator> make_authenticator(const Security& security);
// Loopback and local sockets are reachable from this host only.
bool local_only(const std::string& address);

class Server {
 public:
  Server(StageEngine& engine, const std::string& listen_address, const net::Timing& timing = {},
         const Security& security = {});
  // On a ROUTER already bound at listen_address (with its ZAP handler, when keyed):
  // what a worker assigned its layers (--layers auto) received meanwhile is served.
  Server(StageEngine& engine, zmq::socket_t bound_router, std::unique_ptr<net::ZapAuthenticator> zap,
         const std::string& listen_address, const net::Timing& timing = {}, const Security& security = {});
  // What Capabilities reports as the worker's profile (worker/profile.hpp); none until set.
  void set_profile(const WorkerProfile& profile) { profile_ = profile; }
  // Where slot files are written and read (--slot-save-path; empty: slots on disk off).
  void set_slot_dir(std::string dir) { slot_dir_ = std::move(dir); }
  // A worker started with --layers auto takes another range while serving (protocol
  // Assign): run() then returns, and moved_to() says which.
  void set_movable(bool movable) { movable_ = movable; }
  const std::optional<model::LayerRange>& moved_to() const { return moved_to_; }
  // Serves until `stop` is set (checked every 100 ms) or the worker is given another range.
  void run(const std::atomic<bool>& stop);
  // The bound ROUTER and its ZAP handler, for the server of the next range (the
  // connections stay; what arrives meanwhile waits in the socket).
  std::pair<zmq::socket_t, std::unique_ptr<net::ZapAuthenticator>> release_socket();
  // One turn of run(): waits up to timeout_ms for a message and handles it; false when
  // none came (tests and fuzzing drive the server this way, in their own thread).
  bool serve_one(int timeout_ms);

 private:
  void log_security(const std::string& listen_address, const Security& security) const;
  void handle(net::Received& msg);
  void handle_plan(const std::string& peer, protocol::schema::Plan::Reader plan);
  void handle_assign(const std::string& peer, protocol::schema::Assign::Reader assign);
  // Whether a sequence message of `message_session_` may be served; answers busy (or
  // drops a forward passed on by a worker) when not.
  bool admit(const std::string& peer, protocol::Envelope::Body::Which which, uint64_t step);
  // The owner's connection is still up (a probe through the ROUTER, see net::routable).
  bool owner_connected();
  // Another session than the message's owns this worker and its coordinator is still
  // connected: a plan (unless it takes over) or an assign is refused. An owner that is
  // gone holds nothing (a coordinator that exited).
  bool owned_by_another_connected();
  void connect_chain();
  void handle_forward(const std::string& peer, protocol::Envelope::Reader env, net::Received& msg);
  void handle_restore(const std::string& peer, protocol::Envelope::Reader env, net::Received& msg);
  // slotSave / slotRestore (worker/slot_file.hpp), answered by slotDone.
  void handle_slot(const std::string& peer, protocol::Envelope::Reader env);
  void answer_snapshot(const std::string& peer, int32_t seq_id);
  // The last stage of a greedy chain (protocol Forward.chainSteps): sends the next step
  // to the first stage when the grant and the rows allow it; true when it did.
  bool start_chained_step(protocol::schema::Forward::Reader f, std::span<const model::BatchToken> batch,
                          protocol::schema::Logits::Reader answer);
  void reply(const std::string& peer, const std::vector<uint8_t>& header);
  // Errors go to the coordinator when known (a forward's sender may be a worker).
  void report(const std::string& peer, protocol::ErrorCode code, const std::string& text, uint64_t step = 0);

  StageEngine& engine_;
  net::Timing timing_;
  std::optional<net::KeyPair> keys_;
  std::unique_ptr<net::ZapAuthenticator> zap_;  // before router_: it must exist when the ROUTER binds
  zmq::socket_t router_;
  std::optional<zmq::socket_t> next_;
  std::string next_address_;
  std::optional<zmq::socket_t> chain_to_;  // the last stage: toward the first (Plan.chainTo)
  // Connected at the first forward after the plan, once the coordinator has planned the
  // first stage too (a CURVE server refuses a key it does not know yet for good).
  std::string chain_address_;
  std::string chain_key_;
  // Their handshakes: a forward is refused once the next link's failed (rather than
  // lost on it), and steps are chained only once the chain's succeeded.
  std::unique_ptr<net::ConnectionMonitor> next_monitor_;
  std::unique_ptr<net::ConnectionMonitor> chain_monitor_;
  bool chain_failure_logged_ = false;
  uint64_t session_ = 0;          // the owner's session (0: no plan yet)
  uint64_t message_session_ = 0;  // Envelope.session of the message being handled
  uint64_t chained_steps_ = 0;
  std::string coordinator_;
  uint32_t stage_index_ = 0;
  // Timestamps of the message being handled (protocol::steady_nanos): when it was
  // taken from the socket, and when this worker finished its previous work.
  uint64_t received_nanos_ = 0;
  uint64_t idle_since_nanos_ = 0;
  uint64_t finished_nanos_ = 0;  // a forward's output was handed to the socket
  std::optional<WorkerProfile> profile_;
  std::string slot_dir_;
  bool movable_ = false;
  std::optional<model::LayerRange> moved_to_;
};

// Resident memory of this process in bytes (/proc/self/statm), 0 when unknown.
uint64_t resident_bytes();
// Physical memory of the host in bytes.
uint64_t physical_memory_bytes();

}  // namespace pico::worker
