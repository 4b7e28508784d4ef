// libFuzzer target: a worker's message handling on real stages of a tiny model.
//
// Once per process: the fuzz model (fuzz_model.hpp) is written to a temporary
// directory, and two worker::Servers serve its two stages (layers [0, 1) and [1, 2))
// on ipc:// ROUTERs in this process, each with a DEALER as its client; a ROUTER sink
// takes what the stages send on (the next stage, chained steps). Each input is
//   [stage byte][one multipart message (fuzz_frames.hpp)]
// sent by the stage's client; Server::serve_one handles it, then the replies are
// drained. A plan naming any address is pointed at the sink instead, so that no input
// makes the worker connect elsewhere. The sequences an input names are closed after
// it, so each input starts from (nearly) empty caches.
//
// The worker must take every message and go on serving: an input it does not take
// (libFuzzer's -timeout), a crash, a sanitizer report, or an exception escaping is a finding.
//   scripts/fuzz worker_message [SECONDS]
#include <capnp/message.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "fuzz_frames.hpp"
#include "fuzz_model.hpp"
#include "net.hpp"
#include "protocol.hpp"
#include "server.hpp"
#include "stage_engine.hpp"

namespace {

using namespace pico;
using protocol::Envelope;

struct Stage {
  std::unique_ptr<worker::StageEngine> engine;
  std::unique_ptr<worker::Server> server;
  std::optional<zmq::socket_t> client;
};

struct World {
  std::filesystem::path dir;
  std::string sink_address;
  std::optional<zmq::socket_t> sink;
  Stage stages[2];

  World() {
    spdlog::set_level(spdlog::level::off);  // a refusal per input would be most of the time spent
    dir = std::filesystem::temp_directory_path() / ("pico-fuzz-worker-" + std::to_string(::getpid()));
    const std::string model = fuzz::write_fuzz_model(dir).string();
    sink_address = "ipc://" + (dir / "sink").string();
    sink.emplace(net::make_router(sink_address));
    for (int s = 0; s < 2; ++s) {
      const std::string address = "ipc://" + (dir / ("stage" + std::to_string(s))).string();
      stages[s].engine = std::make_unique<worker::StageEngine>(model, model::LayerRange{s, s + 1}, 1);
      stages[s].server = std::make_unique<worker::Server>(*stages[s].engine, address);
      stages[s].client.emplace(net::make_dealer(address, "fuzz-client-" + std::to_string(s)));
    }
  }
  ~World() { std::filesystem::remove_all(dir); }
};

World& world() {
  static World w;
  return w;
}

void drain(zmq::socket_t& socket, bool router) {
  while (net::receive(socket, router, 0)) {
  }
}

// The input's header with every address of a plan replaced by the sink's; the
// sequence ids it names go into `seqs`.
std::vector<uint8_t> confine(std::span<const uint8_t> header, const std::string& sink, std::set<int32_t>& seqs) {
  std::vector<uint8_t> out(header.begin(), header.end());
  try {
    const protocol::Decoded decoded(header);
    const auto body = decoded.envelope().getBody();
    switch (decoded.which()) {
      case Envelope::Body::PLAN: {
        const auto plan = body.getPlan();
        if (plan.getNext().size() == 0 && plan.getChainTo().size() == 0) break;
        capnp::MallocMessageBuilder message;
        message.setRoot(decoded.envelope());
        auto copy = message.getRoot<Envelope>().getBody().getPlan();
        if (plan.getNext().size()) copy.setNext(sink);
        if (plan.getChainTo().size()) copy.setChainTo(sink);
        const auto words = capnp::messageToFlatArray(message);
        const auto bytes = words.asBytes();
        out.assign(bytes.begin(), bytes.end());
        break;
      }
      case Envelope::Body::FORWARD:
        for (const int32_t s : body.getForward().getSeqIds()) seqs.insert(s);
        break;
      case Envelope::Body::RESTORE: seqs.insert(body.getRestore().getSeqId()); break;
      case Envelope::Body::TRUNCATE: seqs.insert(body.getTruncate().getSeqId()); break;
      default: break;
    }
  } catch (const protocol::ProtocolError&) {
    // Sent as it is: the worker must refuse it.
  } catch (const kj::Exception&) {
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return -1;
  const auto frames = fuzz::split_frames(data + 1, size - 1);
  if (frames.empty()) return -1;
  World& w = world();
  Stage& stage = w.stages[data[0] % 2];
  std::set<int32_t> seqs;
  const std::vector<uint8_t> header = confine(frames[0], w.sink_address, seqs);
  std::vector<std::vector<uint8_t>> payloads;
  for (size_t i = 1; i < frames.size(); ++i) payloads.emplace_back(frames[i].begin(), frames[i].end());
  // A send fails only while the client has no connection: ZeroMQ dropped it (a
  // heartbeat missed while the machine was loaded; seen once in 10 M inputs) and
  // reconnects within its reconnect interval. Retried until then; a worker that never
  // takes the connection back shows as a libFuzzer timeout.
  while (!net::send(*stage.client, nullptr, header, payloads)) {
    zmq::pollitem_t writable{stage.client->handle(), 0, ZMQ_POLLOUT, 0};
    zmq::poll(&writable, 1, std::chrono::milliseconds(100));
  }
  // Until the message is handled: a worker that stopped taking messages shows as a
  // libFuzzer timeout (-timeout, in ARGS), not a wall-clock guess here.
  while (!stage.server->serve_one(1000)) {
  }
  for (Stage& s : w.stages) drain(*s.client, false);
  drain(*w.sink, true);
  for (const int32_t s : seqs) stage.engine->close(s);
  return 0;
}
