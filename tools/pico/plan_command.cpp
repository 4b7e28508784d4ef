// pico plan: which workers of a cluster take part, in which order, with which layers,
// from what they measured (coordinator/placement.hpp). Connects to every worker of the
// config (hello: its profile; heartbeats: its link), prints the placement with its
// predicted tok/s per stage and in total, and why each left-out worker is out.
//
//   pico plan -m M.gguf --config cluster.toml [--objective latency|throughput]
//             [--concurrency N] [--ctx N] [--parallel N] [--replicas spread|standby] [--json]
#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cluster_config.hpp"
#include "cluster_measures.hpp"
#include "commands.hpp"
#include "curve.hpp"
#include "net.hpp"
#include "model/layer_split.hpp"
#include "placement.hpp"

namespace pico::cli {
namespace {

struct PlanOptions {
  std::string model_path, config_path, objective = "latency", replicas = "spread";
  int concurrency = 0;  // 0: parallel
  int64_t ctx = 0;
  int parallel = 0;
  uint64_t probe_bytes = 4u << 20;
  bool json = false;
};

std::string mib(uint64_t bytes) { return fmt::format("{:.0f}", static_cast<double>(bytes) / (1 << 20)); }

void run_plan(const PlanOptions& o) {
  using namespace coordinator;
  const ClusterConfig config = load_cluster_config(o.config_path);
  std::optional<net::KeyPair> own_keys;
  if (config.secret_key) own_keys = net::read_secret_key_file(*config.secret_key);
  check_security(config.workers, own_keys.has_value());
  if (config.workers.empty()) throw std::invalid_argument(o.config_path + " lists no [[worker]]");

  const auto file = gguf::Model::open(o.model_path);
  const protocol::ModelIdentity identity = protocol::model_identity(*file);
  const auto ctx_train = file->metadata().get_int(identity.arch + ".context_length");
  const int64_t ctx = o.ctx > 0 ? o.ctx : config.ctx.value_or(ctx_train && *ctx_train > 0 ? *ctx_train : 4096);
  const int parallel = o.parallel > 0 ? o.parallel : config.parallel.value_or(1);
  const protocol::DType activations = protocol::parse_dtype(config.activations.value_or("f32"));
  PlacementProblem problem = model_placement_problem(*file, ctx, parallel, activations);
  problem.objective = parse_objective(o.objective);
  problem.concurrency = o.concurrency > 0 ? o.concurrency : parallel;
  problem.lanes = o.replicas == "spread";

  RemoteOptions remote;
  remote.activations = activations;
  remote.connect_timeout_ms = 3000;
  for (const auto& w : config.workers) {
    if (own_keys) remote.cluster_keys.push_back(w.public_key);
  }
  std::vector<std::unique_ptr<RemoteStage>> connected;
  const std::vector<MeasuredWorker> measured =
      measure_workers(config.workers, remote, own_keys, o.probe_bytes, &connected);
  // Only workers that answered with a profile of this model can be placed.
  const PlaceableWorkers workers = add_placeable_workers(problem, measured, config.workers, identity);
  const std::vector<size_t>& placeable = workers.placed;
  std::vector<std::string> left_out = workers.left_out;
  if (placeable.empty()) throw std::runtime_error("no worker answered with a profile of this model");
  std::vector<RemoteStage*> stages;
  for (auto& stage : connected) stages.push_back(stage.get());
  problem.worker_links = measure_worker_links(stages, config.workers, placeable, o.probe_bytes);
  const Placement placement = place(problem);
  for (size_t k = 0; k < placeable.size(); ++k) left_out[placeable[k]] = placement.excluded[k];
  // Where each worker out of the chain goes: a standby where it holds a stage's range.
  const std::vector<WorkerRole> roles = worker_roles(problem, placement);
  std::vector<bool> standing_by(measured.size(), false);
  for (size_t k = 0; k < placeable.size(); ++k) {
    if (!roles[k].standby) continue;
    standing_by[placeable[k]] = true;
    const size_t s = *roles[k].stage;
    left_out[placeable[k]] = fmt::format("stands by for stage {} (layers {}); out of the first chain: {}", s,
                                         model::to_string(placement.stages[s].layers), placement.excluded[k]);
  }

  std::vector<model::LayerRange> ranges;
  for (const PlacedStage& s : placement.stages) ranges.push_back(s.layers);
  // pico-coord's default (--replicas spread): workers left out that fit stand by, and
  // a standby at every stage forms one more lane, which takes streams of its own.
  const LanesPrediction lanes = predict_lanes(problem, placement, problem.concurrency);
  const auto address_of = [&](size_t worker) -> const std::string& { return measured[placeable[worker]].address; };
  if (o.json) {
    nlohmann::json j;
    j["objective"] = to_string(problem.objective);
    j["batch"] = placement.batch;
    j["ctx"] = ctx;
    j["parallel"] = parallel;
    j["step_seconds"] = placement.step_seconds;
    j["tokens_per_second"] = placement.tokens_per_second;
    j["every_order"] = placement.every_order;
    j["stages"] = nlohmann::json::array();
    for (const PlacedStage& s : placement.stages) {
      const MeasuredWorker& m = measured[placeable[s.worker]];
      j["stages"].push_back({{"worker", m.address},
                             {"first_layer", s.layers.first},
                             {"last_layer", s.layers.last - 1},
                             {"compute_seconds", s.compute_seconds},
                             {"send_seconds", s.send_seconds},
                             {"memory_bytes", s.memory_bytes},
                             {"offered_bytes", problem.workers[s.worker].memory_bytes},
                             {"tokens_per_second", placement.batch / (s.compute_seconds + s.send_seconds)}});
    }
    j["links"] = nlohmann::json::object();
    for (size_t k = 0; k < placeable.size(); ++k) {
      j["links"][measured[placeable[k]].address] = {{"latency_seconds", problem.coordinator_links[k].latency_seconds},
                                                    {"bytes_per_second", problem.coordinator_links[k].bytes_per_second},
                                                    {"from", "coordinator"}};
      for (size_t l = 0; l < placeable.size(); ++l) {
        const auto& link = problem.worker_links[k][l];
        if (k == l || !link) continue;
        j["links"][measured[placeable[k]].address + " -> " + measured[placeable[l]].address] = {
            {"latency_seconds", link->latency_seconds}, {"bytes_per_second", link->bytes_per_second}};
      }
    }
    j["concurrency"] = problem.concurrency;
    j["replicas"] = o.replicas;
    j["lanes"] = nlohmann::json::array();
    for (const LanePrediction& lane : lanes.lanes) {
      nlohmann::json chain = nlohmann::json::array();
      for (const auto& [worker, layers] : lane.chain) {
        chain.push_back({{"worker", address_of(worker)}, {"first_layer", layers.first}, {"last_layer", layers.last - 1}});
      }
      j["lanes"].push_back({{"stages", chain},
                            {"sequences", lane.sequences},
                            {"step_seconds", lane.step_seconds},
                            {"tokens_per_second", lane.tokens_per_second}});
    }
    j["lanes_tokens_per_second"] = lanes.tokens_per_second;
    j["left_out"] = nlohmann::json::object();
    for (size_t i = 0; i < measured.size(); ++i) {
      if (!left_out[i].empty()) j["left_out"][measured[i].address] = left_out[i];
    }
    std::cout << j.dump(1) << "\n";
    return;
  }
  std::cout << fmt::format("placement of {} for {}: {} token(s) per step, {} sequence(s) of {} positions\n",
                           protocol::to_string(identity), to_string(problem.objective), placement.batch, parallel, ctx);
  std::cout << fmt::format("{:<5} {:<28} {:<8} {:<24} {:>11} {:>9} {:>19} {:>10}\n", "stage", "worker", "layers",
                           "backend", "compute ms", "send ms", "memory / offered", "tok/s");
  for (size_t i = 0; i < placement.stages.size(); ++i) {
    const PlacedStage& s = placement.stages[i];
    const StageInfo& info = *measured[placeable[s.worker]].info;
    const std::string backend = info.backend + (info.device.empty() ? " " + info.isa : " " + info.device);
    std::cout << fmt::format("{:<5} {:<28} {:<8} {:<24} {:>11.3f} {:>9.3f} {:>19} {:>10.1f}\n", i,
                             measured[placeable[s.worker]].address,
                             fmt::format("{}-{}", s.layers.first, s.layers.last - 1), backend.substr(0, 24),
                             s.compute_seconds * 1e3, s.send_seconds * 1e3,
                             mib(s.memory_bytes) + " / " + mib(problem.workers[s.worker].memory_bytes) + " MiB",
                             placement.batch / (s.compute_seconds + s.send_seconds));
  }
  std::cout << fmt::format("predicted: {:.2f} tok/s ({:.3f} ms a step){}\n", placement.tokens_per_second,
                           placement.step_seconds * 1e3,
                           placement.every_order ? "" : "; the workers kept the config's order (more than 8)");
  std::cout << "pico-worker --layers, in order: " << model::format_layer_ranges(ranges) << "\n";
  if (lanes.lanes.size() > 1) {
    std::cout << fmt::format("with pico-coord --replicas spread (the default), workers left out stand by and form "
                             "{} more lane(s), each worker with its stage's layers:\n",
                             lanes.lanes.size() - 1);
    for (size_t l = 0; l < lanes.lanes.size(); ++l) {
      const LanePrediction& lane = lanes.lanes[l];
      std::string chain;
      for (const auto& [worker, layers] : lane.chain) {
        chain += fmt::format("{}{} ({})", chain.empty() ? "" : ", ", address_of(worker), model::to_string(layers));
      }
      std::cout << fmt::format("  lane {}: {}; {} of {} streams, {:.2f} tok/s\n", l + 1, chain, lane.sequences,
                               problem.concurrency, lane.tokens_per_second);
    }
    std::cout << fmt::format("predicted with the lanes: {:.2f} tok/s at {} streams\n", lanes.tokens_per_second,
                             problem.concurrency);
  }
  for (size_t i = 0; i < measured.size(); ++i) {
    if (left_out[i].empty()) continue;
    std::cout << (standing_by[i] ? "" : "left out ") << measured[i].address << (standing_by[i] ? " " : ": ")
              << left_out[i] << "\n";
  }
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* command = app.add_subcommand(
      "plan", "Which workers of a cluster run which layers, from their measured speed, memory and links");
  command->add_option("-m,--model", o->model_path, "GGUF model file (the one the workers serve)")->required();
  command->add_option("--config", o->config_path, "cluster.toml: the workers to choose from")->required();
  command->add_option("--objective", o->objective,
                      "latency: the time per token of one stream; throughput: tokens per second of --concurrency "
                      "streams at once")
      ->check(CLI::IsMember({"latency", "throughput"}));
  command->add_option("--concurrency", o->concurrency, "throughput: streams at once (default: --parallel)")
      ->check(CLI::PositiveNumber);
  command->add_option("-c,--ctx", o->ctx, "positions per sequence (default: the config's, else the model's)")
      ->check(CLI::PositiveNumber);
  command->add_option("--parallel", o->parallel, "sequences holding state at once (default: the config's, else 1)")
      ->check(CLI::PositiveNumber);
  command->add_option("--probe-bytes", o->probe_bytes, "bytes of the bandwidth probe of each link (default 4 MiB)")
      ->check(CLI::PositiveNumber);
  command->add_option("--replicas", o->replicas,
                      "as pico-coord's: spread (default: workers left out stand by and, one at every stage, form "
                      "more lanes; the throughput objective weighs what every lane serves) or standby (they only "
                      "stand by)")
      ->check(CLI::IsMember({"spread", "standby"}));
  command->add_flag("--json", o->json, "print the placement as JSON");
  command->callback([o] { run_plan(*o); });
}

}  // namespace pico::cli
