// pico-worker -m MODEL --layers A-B --listen tcp://*:PORT [-t N] [--profile] [--backend vulkan [--device N] [--device-memory B]]
//             [--ctx N] [--max-rows N] [--max-sequences N] [--kv-memory BYTES]
//             [--secret-key W.secret --authorized-keys FILE]
#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <iostream>
#include <optional>
#include <tuple>

#include "assignment.hpp"
#include "link_probe.hpp"
#include "backend/devices.hpp"
#include "cpu/thread_pool.hpp"
#include "model/cgroup.hpp"
#include "profile.hpp"
#include "server.hpp"
#include "load_progress.hpp"
#include "stage_engine.hpp"

namespace {
std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

// The profile of this worker with this model: from the cache unless `fresh`, else
// measured (and cached); the memory it offers is measured now either way.
pico::worker::WorkerProfile worker_profile(const pico::gguf::Model& file, const pico::model::Model& model,
                                           const pico::worker::StageBackendOptions& backend, int threads,
                                           const std::string& device, uint64_t device_memory_bytes, bool fresh) {
  using namespace pico::worker;
  ProfileOptions options;
  options.cpu_quota = pico::model::cpu_quota();
  const uint64_t hash = pico::protocol::model_identity(file).hash;
  const std::string path = profile_cache_path(hash, backend, threads, options.batch, options.cpu_quota);
  std::optional<WorkerProfile> profile;
  if (!fresh) profile = load_profile(path, hash, static_cast<int32_t>(model.hparams().n_layer), device);
  if (profile) {
    spdlog::info("profile from {}", path);
  } else {
    spdlog::info("measuring this worker's profile of the model (pico-worker --profile prints it){}",
                 options.cpu_quota > 0 ? fmt::format("; its cgroup's CPU quota, {:.3f} CPUs, bounds each measure",
                                                     options.cpu_quota)
                                       : std::string());
    profile = measure_profile(file, model, backend, threads, options);
    save_profile(path, *profile);
  }
  profile->memory_bytes = offered_memory_bytes(backend, device_memory_bytes);
  return *profile;
}

// --layers auto: the model's identity and this worker's profile to the coordinator,
// until its placement assigns a range (nullopt: stopped before).
std::optional<pico::worker::Assignment> await_layers(const std::string& model_path, const std::string& listen,
                                                    const pico::worker::StageBackendOptions& backend, int threads,
                                                    const pico::worker::Security& security) {
  using namespace pico::worker;
  const auto file = pico::gguf::Model::open(model_path);
  const auto model = pico::model::Model::load(*file);
  UnassignedWorker self;
  self.identity = pico::protocol::model_identity(*file);
  self.threads = threads > 0 ? threads : pico::cpu::default_thread_count();
  self.backend = backend.name;
  for (const pico::backend::ComputeDevice& d : pico::backend::list_compute_devices().devices) {
    if (backend.name != "cpu" && d.backend == backend.name && d.index == static_cast<uint32_t>(backend.device)) {
      self.device = d.name + ", " + d.driver;
      self.device_memory_bytes = d.memory_bytes;
    }
  }
  if (backend.name != "cpu" && self.device.empty()) {
    throw std::invalid_argument(backend.name + ": no device " + std::to_string(backend.device));
  }
  self.profile = worker_profile(*file, *model, backend, self.threads, self.device, self.device_memory_bytes, false);
  spdlog::info("layers auto: {} waits for its range at {}", pico::protocol::to_string(self.identity), listen);
  // Until then the largest message is a link probe (its payload and a header).
  pico::net::set_max_message_bytes(static_cast<int64_t>(kMaxLinkProbeBytes + (1u << 20)));
  return wait_for_assignment(listen, self, security, g_stop);
}
}  // namespace

int main(int argc, char** argv) {
  spdlog::set_default_logger(spdlog::stderr_color_mt("worker"));
  CLI::App app{"pico-worker: serves a range of a model's layers to pico-coord"};
  std::string model_path, layers, listen;
  int threads = 0;
  app.add_option("-m,--model", model_path, "GGUF model file")->required();
  app.add_option("--layers", layers,
                 "layer range A-B, inclusive (default: all); auto: the coordinator's placement assigns the range, "
                 "which the worker then maps and loads");
  auto* listen_opt = app.add_option("--listen", listen, "address to bind: tcp://*:PORT or ipc://PATH");
  bool profile_only = false;
  app.add_flag("--profile", profile_only,
               "measure this worker's time per layer (each kind of layer once) at batch 1 and at a prefill batch, "
               "print it with the memory offered, keep it in the profile cache ($PICO_CACHE_DIR, else "
               "~/.cache/pico) and exit; without it the worker measures at start unless the cache has it")
      ->excludes(listen_opt);
  app.add_option("-t,--threads", threads, "threads (default: physical cores)");
  pico::worker::StageBackendOptions backend;
  app.add_option("--backend", backend.name,
                 "cpu (default) or vulkan: the layers' ops through Vulkan compute shaders, one op at a time "
                 "(attention and recurrent layers stay on the CPU; `pico inspect --devices` lists devices)")
      ->check(CLI::IsMember({"cpu", "vulkan"}));
  app.add_option("--device", backend.device, "device index of --backend (default 0)")->check(CLI::NonNegativeNumber);
  std::string device_memory;
  app.add_option("--device-memory", device_memory,
                 "the most of the device's memory to use, e.g. 6G (default: all); a range whose weights exceed it "
                 "is refused");
  pico::worker::StageLimitOptions limits;
  std::string kv_memory;
  app.add_option("-c,--ctx", limits.ctx, "positions per sequence (default: the model's context length)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-rows", limits.max_rows, "tokens per forward (default 4096)")->check(CLI::PositiveNumber);
  app.add_option("--max-sequences", limits.max_sequences, "sequences holding KV at once (default 256)")
      ->check(CLI::PositiveNumber);
  app.add_option("--kv-memory", kv_memory,
                 "KV bytes over all sequences, e.g. 512M, 4G (default: available memory less the stage's weights, "
                 "less a tenth)");
  std::string mem;
  bool prefault = false;
  app.add_option("--mem", mem,
                 "lock up to BYTES of the stage's weights in memory, the most valuable first (output head and norms, "
                 "attention, router, FFN, experts, embeddings), and stream the rest from the file layer by layer "
                 "(e.g. 300M, 2G; the cpu backend)");
  app.add_flag("--prefault", prefault, "read every weight of the stage at load (a fast first reply), showing progress");
  std::string slot_dir;
  app.add_option("--slot-save-path", slot_dir,
                 "slots on disk: the directory this worker writes its layers' state of a saved slot to and restores "
                 "it from (pico-coord's POST /slots/ID?action=save|restore); default: off")
      ->check(CLI::ExistingDirectory);
  std::string secret_key_path, authorized_keys_path;
  auto* secret_opt = app.add_option("--secret-key", secret_key_path,
                                    "CURVE: this worker's secret key file (pico keygen); links are then encrypted");
  app.add_option("--authorized-keys", authorized_keys_path,
                 "CURVE: file of the public keys that may connect, one per line (the coordinator's, the previous "
                 "stage's)")
      ->needs(secret_opt);
  secret_opt->needs(app.get_option("--authorized-keys"));
  CLI11_PARSE(app, argc, argv);
  if (listen.empty() && !profile_only) {
    std::cerr << "--listen is required (or --profile)\n";
    return 2;
  }
  try {
    pico::worker::Security security;
    if (!secret_key_path.empty()) {
      security.keys = pico::net::read_secret_key_file(secret_key_path);
      security.authorized_keys = pico::net::read_authorized_keys(authorized_keys_path);
    }
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    std::optional<pico::model::LayerRange> range;
    std::optional<pico::worker::Assignment> assignment;
    if (layers == "auto") {
      if (profile_only) throw std::invalid_argument("--profile measures every layer: give it no --layers auto");
      assignment = await_layers(model_path, listen, backend, threads, security);
      if (!assignment) return 0;
      range = assignment->layers;
    } else if (!layers.empty()) {
      range = pico::worker::parse_layers(layers);
    }
    if (!kv_memory.empty()) limits.kv_memory = pico::worker::parse_byte_size(kv_memory);
    if (!device_memory.empty()) backend.memory = pico::worker::parse_byte_size(device_memory);
    pico::model::ResidencyOptions residency;
    if (!mem.empty()) residency.lock_bytes = pico::worker::parse_byte_size(mem);
    residency.prefault = prefault;
    // A --layers auto worker may be moved to another range while it serves: its server
    // returns, the range's engine goes (its sequences with it) and the new one loads,
    // served on the same socket.
    while (true) {
      pico::worker::StageEngine engine(model_path, range, threads, limits, backend, residency,
                                       pico::worker::progress_bar("prefault"));
      if (const auto* r = engine.residency()) pico::worker::log_residency(r->report());
      const pico::worker::WorkerProfile profile =
          worker_profile(engine.file(), engine.model(), backend, engine.threads(), engine.device(),
                         engine.device_memory_bytes(), profile_only);
      if (profile_only) {
        std::cout << pico::worker::format_profile(profile);
        return 0;
      }
      // The largest legal frame (StageLimits::max_message_bytes), before the socket is made.
      pico::net::set_max_message_bytes(static_cast<int64_t>(engine.limits().max_message_bytes));
      std::optional<pico::worker::Server> server_storage;
      if (assignment) {
        // Connections made from now on (the coordinator's, the previous stage's) get the
        // assigned range's largest message; those of the wait had the wait's.
        assignment->router.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(engine.limits().max_message_bytes));
        server_storage.emplace(engine, std::move(assignment->router), std::move(assignment->zap), listen,
                               pico::net::Timing{}, security);
      } else {
        server_storage.emplace(engine, listen, pico::net::Timing{}, security);
      }
      pico::worker::Server& server = *server_storage;
      server.set_profile(profile);
      server.set_slot_dir(slot_dir);
      server.set_movable(assignment.has_value());
      spdlog::info("layers {}-{} of {} ({}), listening on {}", engine.layers().first, engine.layers().last - 1,
                   engine.n_layer(), pico::protocol::to_string(engine.identity()), listen);
      if (!engine.device().empty()) spdlog::info("backend {} on {}", engine.backend_name(), engine.device());
      const auto& l = engine.limits();
      spdlog::info("limits: {} rows per forward, {} positions per sequence, {} sequences, {} bytes of KV, "
                   "messages up to {} bytes",
                   l.max_rows, l.max_positions, l.max_sequences, l.state_budget_bytes, l.max_message_bytes);
      server.run(g_stop);
      if (!server.moved_to()) return 0;
      range = *server.moved_to();
      assignment->layers = *range;
      std::tie(assignment->router, assignment->zap) = server.release_socket();
    }
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}
