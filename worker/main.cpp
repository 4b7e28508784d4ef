// pico-worker -m MODEL --layers A-B --listen tcp://*:PORT [-t N]
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <optional>

#include "server.hpp"
#include "stage_engine.hpp"

namespace {
std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }
}  // namespace

int main(int argc, char** argv) {
  spdlog::set_default_logger(spdlog::stderr_color_mt("worker"));
  CLI::App app{"pico-worker: serves a range of a model's layers to pico-coord"};
  std::string model_path, layers, listen;
  int threads = 0;
  app.add_option("-m,--model", model_path, "GGUF model file")->required();
  app.add_option("--layers", layers, "layer range A-B, inclusive (default: all)");
  app.add_option("--listen", listen, "address to bind: tcp://*:PORT or ipc://PATH")->required();
  app.add_option("-t,--threads", threads, "threads (default: physical cores)");
  CLI11_PARSE(app, argc, argv);
  try {
    std::optional<pico::model::LayerRange> range;
    if (!layers.empty()) range = pico::worker::parse_layers(layers);
    pico::worker::StageEngine engine(model_path, range, threads);
    pico::worker::Server server(engine, listen);
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    spdlog::info("layers {}-{} of {} ({}), listening on {}", engine.layers().first, engine.layers().last - 1,
                 engine.n_layer(), pico::protocol::to_string(engine.identity()), listen);
    server.run(g_stop);
    return 0;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}
