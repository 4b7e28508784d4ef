// The time of one activation hop on loopback: a hidden-state row of embd 2048 as F32
// (8 KiB), with a small header frame, from a DEALER to a ROUTER and back, over tcp://
// and ipc://. Half the round trip is one hop. The argument is the number of rows
// (16 rows = 128 KiB, the size of one row of logits of a 32000-token vocabulary).
// *Owned: the payload is handed over to ZeroMQ (net::owned_frame) instead of copied;
// as in a stage, each send has a freshly computed buffer. Google Benchmark:
//   build/net/hop_benchmark [--benchmark_filter=Tcp]
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "net.hpp"

namespace {

void hop_round_trip(benchmark::State& state, const std::string& address, size_t rows, bool owned = false) {
  zmq::socket_t router = pico::net::make_router(address);
  // tcp://127.0.0.1:* binds a port the system picks: a fixed one may be taken by a
  // test running beside the benchmark.
  zmq::socket_t dealer = pico::net::make_dealer(router.get(zmq::sockopt::last_endpoint), "bench");
  const std::vector<uint8_t> header(64, 1);
  const std::vector<std::vector<uint8_t>> payload{std::vector<uint8_t>(rows * 2048 * sizeof(float), 2)};
  // A stage's output: a new buffer per send, then copied into a frame or handed over.
  auto send = [&](zmq::socket_t& socket, const std::string* peer) {
    std::vector<float> out(rows * 2048, 1.0f);
    if (!owned) {
      const std::vector<std::vector<uint8_t>> copy{std::vector<uint8_t>(
          reinterpret_cast<const uint8_t*>(out.data()), reinterpret_cast<const uint8_t*>(out.data() + out.size()))};
      return pico::net::send(socket, peer, header, copy);
    }
    std::vector<zmq::message_t> frames;
    frames.push_back(pico::net::owned_frame(std::move(out)));
    return pico::net::send(socket, peer, header, std::move(frames));
  };
  // Warm the connection up.
  pico::net::send(dealer, nullptr, header, payload);
  auto first = pico::net::receive(router, true, 5000);
  if (!first) {
    state.SkipWithError("no connection");
    return;
  }
  const std::string peer = first->peer;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    send(dealer, nullptr);
    auto there = pico::net::receive(router, true, 5000);
    send(router, &peer);
    auto back = pico::net::receive(dealer, false, 5000);
    benchmark::DoNotOptimize(back);
    if (!there || !back) state.SkipWithError("message lost");
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  state.counters["hop_us"] = seconds * 1e6 / (2.0 * static_cast<double>(state.iterations()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * static_cast<int64_t>(payload[0].size()));
}

// A fresh ipc path per run.
std::string next_suffix() {
  static int run = 0;
  return std::to_string(getpid() % 1000 * 16 + run++);
}
void BM_HopTcp(benchmark::State& state) {
  hop_round_trip(state, "tcp://127.0.0.1:*", static_cast<size_t>(state.range(0)));
}
void BM_HopIpc(benchmark::State& state) {
  hop_round_trip(state, "ipc:///tmp/pico-hop-" + next_suffix() + ".sock", static_cast<size_t>(state.range(0)));
}
void BM_HopTcpOwned(benchmark::State& state) {
  hop_round_trip(state, "tcp://127.0.0.1:*", static_cast<size_t>(state.range(0)), true);
}
void BM_HopIpcOwned(benchmark::State& state) {
  hop_round_trip(state, "ipc:///tmp/pico-hop-" + next_suffix() + ".sock", static_cast<size_t>(state.range(0)), true);
}
BENCHMARK(BM_HopTcp)->Arg(1)->Arg(16)->Arg(64)->UseRealTime();
BENCHMARK(BM_HopIpc)->Arg(1)->Arg(16)->Arg(64)->UseRealTime();
BENCHMARK(BM_HopTcpOwned)->Arg(1)->Arg(16)->Arg(64)->UseRealTime();
BENCHMARK(BM_HopIpcOwned)->Arg(1)->Arg(16)->Arg(64)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
