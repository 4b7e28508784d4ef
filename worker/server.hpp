// pico-worker's loop: a ROUTER bound at the listen address serves the coordinator
// (hello, plan, open/truncate/close, stats, heartbeat) and receives forward batches
// (from the coordinator on stage 0, from the previous worker otherwise). Hidden
// states go on through a DEALER to the next stage named in the plan; the last stage
// sends logits, and every stage its errors, to the coordinator (the peer that sent
// the plan) through the ROUTER. One thread; ZeroMQ's I/O thread answers the ZMTP
// heartbeats while a batch runs.
#pragma once

#include <atomic>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "net.hpp"
#include "stage_engine.hpp"

namespace pico::worker {

class Server {
 public:
  Server(StageEngine& engine, const std::string& listen_address, const net::Timing& timing = {});
  // Serves until `stop` is set (checked every 100 ms).
  void run(const std::atomic<bool>& stop);
  // One turn of run(): waits up to timeout_ms for a message and handles it; false when
  // none came (tests and fuzzing drive the server this way, in their own thread).
  bool serve_one(int timeout_ms);

 private:
  void handle(net::Received& msg);
  void handle_forward(const std::string& peer, protocol::Envelope::Reader env, net::Received& msg);
  void handle_restore(const std::string& peer, protocol::Envelope::Reader env, net::Received& msg);
  void answer_snapshot(const std::string& peer, int32_t seq_id);
  // The last stage's logits rows (one per batch token with `logits` set): rows asked as
  // arg max only get their arg max written into the header's argmax lists and leave the
  // payload, which keeps the full rows in order (the rows untouched when none is).
  std::vector<float> reduce_to_argmax(std::span<const model::BatchToken> batch,
                                      capnp::List<protocol::LogitsOutput>::Reader outputs, std::vector<float> logits,
                                      protocol::schema::Logits::Builder header) const;
  // The last stage of a greedy chain (protocol Forward.chainSteps): sends the next step
  // to the first stage when the grant and the rows allow it; true when it did.
  bool start_chained_step(protocol::schema::Forward::Reader f, std::span<const model::BatchToken> batch,
                          protocol::schema::Logits::Reader answer);
  void reply(const std::string& peer, const std::vector<uint8_t>& header);
  // Errors go to the coordinator when known (a forward's sender may be a worker).
  void report(const std::string& peer, protocol::ErrorCode code, const std::string& text, uint64_t step = 0);

  StageEngine& engine_;
  net::Timing timing_;
  zmq::socket_t router_;
  std::optional<zmq::socket_t> next_;
  std::string next_address_;
  std::optional<zmq::socket_t> chain_to_;  // the last stage: toward the first (Plan.chainTo)
  uint64_t chained_steps_ = 0;
  std::string coordinator_;
  uint32_t stage_index_ = 0;
  // Timestamps of the message being handled (protocol::steady_nanos): when it was
  // taken from the socket, and when this worker finished its previous work.
  uint64_t received_nanos_ = 0;
  uint64_t idle_since_nanos_ = 0;
  uint64_t finished_nanos_ = 0;  // a forward's output was handed to the socket
};

// Resident memory of this process in bytes (/proc/self/statm), 0 when unknown.
uint64_t resident_bytes();
// Physical memory of the host in bytes.
uint64_t physical_memory_bytes();

}  // namespace pico::worker
