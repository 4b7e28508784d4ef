// pico-coord -m MODEL [--worker tcp://h:p ...] [--config cluster.toml] -p PROMPT [-p ...]
//            [--prompts FILE] [-n N] [--temp T] [--seed S] [--ignore-eos]
// pico-coord -m MODEL [--worker ...] --port N [--host ADDR] [--api-key KEY]
// Security: [--secret-key C.secret --worker-key W.public (one per --worker)] [--take-over]
//
// With --port it serves the HTTP API (coordinator/http/server.hpp) until SIGINT/SIGTERM.
// Prints the completion (only generated text on stdout; logs on stderr). With no
// workers it runs every layer in-process (LocalStage). Several prompts run
// concurrently; their completions are printed one per line in prompt order. Exits
// non-zero when the request failed (a refused worker, a lost worker, ...).
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include "cluster_config.hpp"
#include "cluster_control.hpp"
#include "cluster_measures.hpp"
#include "engine.hpp"
#include "gguf/reader.hpp"
#include "http/server.hpp"
#include "pipeline.hpp"
#include "scheduler.hpp"
#include "sizing.hpp"

using namespace pico;
using namespace pico::coordinator;

int main(int argc, char** argv) {
  spdlog::set_default_logger(spdlog::stderr_color_mt("coord"));
  CLI::App app{"pico-coord: runs prompts through a pipeline of stages (in-process or pico-worker)"};
  std::string model_path, config_path, prompts_path, dump_logits, activations = "f32";
  std::vector<std::string> worker_addresses, prompts;
  int n_predict = 128, threads = 0, ctx = 0, timeout_ms = 30000;
  SchedulerOptions sched;
  sample::SamplingParams sp;
  bool print_tokens = false, ignore_eos = false;
  app.add_option("-m,--model", model_path, "GGUF model file (tokenizer, identity check, local stage)")->required();
  app.add_option("--worker", worker_addresses, "a pico-worker address, in pipeline order (repeatable)");
  app.add_option("--config", config_path, "cluster.toml (workers and scheduler settings)");
  app.add_option("-p,--prompt", prompts, "prompt (repeatable: the prompts run concurrently)");
  app.add_option("--prompts", prompts_path, "file with one prompt per line");
  app.add_option("-n,--n-predict", n_predict, "tokens to generate per prompt");
  app.add_option("--temp", sp.temperature, "temperature (0: greedy)");
  app.add_option("--top-k", sp.top_k, "top-k (0: off)");
  app.add_option("--top-p", sp.top_p, "top-p (1: off)");
  app.add_option("--min-p", sp.min_p, "min-p (0: off)");
  app.add_option("--seed", sp.seed, "sampling seed (prompt i uses seed + i)");
  app.add_option("-c,--ctx", ctx, "context length per sequence (default: the model's)");
  app.add_option("-t,--threads", threads, "threads of the local stage");
  worker::StageBackendOptions local_backend;
  app.add_option("--backend", local_backend.name,
                 "backend of the local stage (no --worker): cpu (default) or vulkan, one op at a time")
      ->check(CLI::IsMember({"cpu", "vulkan"}));
  app.add_option("--device", local_backend.device, "device index of --backend (default 0)")
      ->check(CLI::NonNegativeNumber);
  std::string device_memory;
  app.add_option("--device-memory", device_memory,
                 "the most of the local stage's device memory to use, e.g. 6G (default: all)");
  app.add_option("--micro-batch", sched.micro_batch, "prompt tokens per sequence per step")->check(CLI::PositiveNumber);
  app.add_option("--max-batch-tokens", sched.max_batch_tokens, "tokens per step")->check(CLI::PositiveNumber);
  app.add_option("--chain-steps", sched.chain_steps,
                 "greedy chains: steps the last worker may run without the coordinator (0: never)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--activations", activations, "hidden states between workers: f32, f16, q8_0");
  app.add_option("--timeout", timeout_ms, "ms to wait for a step's logits");
  // A worker answers hello once it has loaded its range and measured (or read) its
  // profile: seconds on a small board, more under a sanitizer.
  double connect_seconds = 60;
  app.add_option("--connect-timeout", connect_seconds, "seconds to wait at start for each worker's hello")
      ->check(CLI::Range(0.1, 3600.0));
  app.add_flag("--print-tokens", print_tokens, "print the generated token ids (JSON, one line per prompt)");
  app.add_flag("--ignore-eos", ignore_eos, "go on past end-of-generation tokens: exactly -n tokens per prompt");
  app.add_option("--dump-logits", dump_logits, "write the F32 logits rows each token was sampled from");
  ServerOptions http;
  std::string chat_template;
  app.add_option("--host", http.host, "HTTP API: address to listen on");
  auto* port_opt = app.add_option("--port", http.port, "HTTP API: serve on this port (0: any free port)");
  app.add_option("--api-key", http.api_key, "HTTP API: require Authorization: Bearer KEY");
  app.add_option("--alias", http.model_name, "HTTP API: the model's name (default: the file name without .gguf)");
  app.add_option("--http-threads", http.threads, "HTTP API: I/O threads")->check(CLI::PositiveNumber);
  int parallel = 0;
  std::string objective = "latency";
  app.add_option("--objective", objective,
                 "workers started with --layers auto: placement minimises the time per token of one stream "
                 "(latency) or maximises tokens per second of --parallel streams (throughput)")
      ->check(CLI::IsMember({"latency", "throughput"}));
  app.add_option("--parallel", parallel,
                 "sequences in the batch at once (default 32; fewer when a stage's KV budget says so); more requests "
                 "queue")
      ->check(CLI::PositiveNumber);
  bool replan_on_join = false;
  app.add_flag("--replan-on-join", replan_on_join,
               "HTTP API: after a worker joins (POST /cluster/workers), place every worker anew when all were "
               "started with --layers auto, else move each stage to its fastest live worker by their profiles");
  double replan_on_loss = 0;
  app.add_option("--replan-on-loss", replan_on_loss,
                 "HTTP API: when an active worker has been lost with no live replica for SECONDS, place the live "
                 "workers anew (those started with fixed --layers keep them) so that requests are served again "
                 "(default: never)")
      ->check(CLI::Range(0.1, 3600.0));
  std::string replicas = "spread";
  app.add_option("--replicas", replicas,
                 "What workers given the same layers do: spread (default: while every stage has one standing by, "
                 "those form one more chain through the layers, and requests are spread over the chains) or standby "
                 "(one chain runs; the others wait to take a lost worker's place)")
      ->check(CLI::IsMember({"spread", "standby"}));
  double standby_copies = 0;
  app.add_option("--standby-copies", standby_copies,
                 "HTTP API: every SECONDS, copy the state of each sequence that changed to the live standbys of its "
                 "stage (generation waits for it), so that a replica taking a lost worker's place replays only what "
                 "came after the copy (default: never; then it replays every sequence from its start)")
      ->check(CLI::Range(0.05, 3600.0));
  double slow_factor = 0, slow_seconds = 3;
  app.add_option("--replan-when-slow", slow_factor,
                 "HTTP API: move a stage to its live replica with the shortest profiled time when its worker's steps "
                 "take at least FACTOR times what its profile predicts (and the other stages show) for --slow-seconds")
      ->check(CLI::Range(1.0, 1000.0));
  app.add_option("--slow-seconds", slow_seconds, "HTTP API: the window --replan-when-slow judges a worker over")
      ->check(CLI::Range(0.1, 3600.0));
  int cache_slots = -1;
  app.add_option("--cache-slots", cache_slots,
                 "HTTP API: finished sequences whose KV is kept for prompt-prefix reuse (default: --parallel; 0: off)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--cache-tokens", sched.cache_tokens, "HTTP API: KV positions the kept sequences may hold (0: no limit)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--chat-template", chat_template, "HTTP API: chat format name (default: from the model)");
  // Hybrid models: recurrent-state checkpoints (prompt-prefix reuse).
  app.add_option("--checkpoint-every", sched.checkpoint_every,
                 "hybrid models: checkpoint the recurrent state every N prompt positions (0: only at the prompt's end)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--checkpoint-every-gen", sched.checkpoint_every_gen,
                 "hybrid models: checkpoint every N generated tokens (0: never)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--checkpoint-max", sched.checkpoint_max,
                 "hybrid models: checkpoints kept per sequence (0: none, no prefix reuse), at most 255")
      ->check(CLI::Range(0, 255));
  std::string reasoning_format = "deepseek";
  app.add_option("--reasoning-format", reasoning_format,
                 "HTTP API: chat replies' <think> blocks: deepseek (in message.reasoning_content, streamed too), auto "
                 "(the same), deepseek-legacy (inline when streamed), none (left in the content)")
      ->check([](const std::string& v) {
        return http_api::reasoning_format_from_name(v) ? std::string()
                                                        : "must be " + std::string(http_api::kReasoningFormatNames);
      });
  std::string slot_dir;
  app.add_option("--slot-save-path", slot_dir,
                 "HTTP API: slots on disk (POST /slots/ID?action=save|restore) for the in-process stage, in this "
                 "directory; with --worker each pico-worker writes its own layers under its own --slot-save-path")
      ->check(CLI::ExistingDirectory);
  std::string pooling;
  app.add_option("--pooling", pooling,
                 "HTTP API: how the embedding endpoints pool a prompt's hidden states: mean, cls, last, none (one per "
                 "token; /v1/embeddings refuses it); default: the model's metadata, else none")
      ->check(CLI::IsMember({"none", "mean", "cls", "last"}));
  // HTTP API limits and access.
  std::string api_key_file;
  size_t max_queue = 256;
  app.add_option("--api-key-file", api_key_file, "HTTP API: read the API key from this file (its first line)");
  app.add_option("--cors", http.cors_origin, "HTTP API: allow browser requests from ORIGIN (\"*\": any); default: none");
  bool no_webui = false;
  app.add_flag("--no-webui", no_webui, "do not serve the web UI (chat and cluster pages) at /");
  app.add_option("--max-connections", http.max_connections, "HTTP API: open connections; one more gets 503")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-queue", max_queue, "HTTP API: requests waiting for a place in the batch; more get 503 (0: no limit)");
  app.add_option("--body-limit", http.body_limit, "HTTP API: bytes of a request body (413 beyond)")->check(CLI::PositiveNumber);
  app.add_option("--header-limit", http.header_limit, "HTTP API: bytes of a request header (431 beyond)")
      ->check(CLI::PositiveNumber);
  app.add_option("--write-timeout", http.write_timeout_s,
                 "HTTP API: seconds a client may take no reply data before it is dropped (its request cancelled)")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-stop-strings", http.max_stop_strings, "HTTP API: stop strings per request");
  app.add_option("--max-stop-length", http.max_stop_length, "HTTP API: bytes of each stop string");
  // Security and sessions.
  std::string secret_key_path;
  std::vector<std::string> worker_keys;
  bool take_over = false;
  app.add_option("--secret-key", secret_key_path, "CURVE: this coordinator's secret key file (pico keygen)");
  app.add_option("--worker-key", worker_keys,
                 "CURVE: a worker's public key (file or Z85), one per --worker, in the same order");
  app.add_flag("--take-over", take_over,
               "use the workers even when another live coordinator owns them (it then fails its next step)");
  CLI11_PARSE(app, argc, argv);
  const bool serving = port_opt->count() > 0;
  http.reasoning_format = *http_api::reasoning_format_from_name(reasoning_format);
  http.webui = !no_webui;
  // The API key, kept off the command line: --api-key-file, else PICO_API_KEY.
  if (!api_key_file.empty()) {
    if (!http.api_key.empty()) {
      spdlog::error("give --api-key or --api-key-file, not both");
      return 1;
    }
    std::ifstream in(api_key_file);
    if (!in || !std::getline(in, http.api_key)) {
      spdlog::error("cannot read the API key from {}", api_key_file);
      return 1;
    }
    while (!http.api_key.empty() && (http.api_key.back() == '\r' || http.api_key.back() == ' ')) http.api_key.pop_back();
    if (http.api_key.empty()) {
      spdlog::error("{} holds no API key on its first line", api_key_file);
      return 1;
    }
  } else if (http.api_key.empty()) {
    if (const char* env = std::getenv("PICO_API_KEY"); env && *env) http.api_key = env;
  }

  try {
    std::vector<WorkerEntry> workers;
    if (!config_path.empty()) {
      const ClusterConfig config = load_cluster_config(config_path);
      workers = config.workers;
      if (config.micro_batch) sched.micro_batch = *config.micro_batch;
      if (config.max_batch_tokens) sched.max_batch_tokens = *config.max_batch_tokens;
      if (config.chain_steps && app.count("--chain-steps") == 0) sched.chain_steps = *config.chain_steps;
      if (config.activations && app.count("--activations") == 0) activations = *config.activations;
      if (config.ctx && app.count("--ctx") == 0) ctx = static_cast<int>(*config.ctx);
      if (config.parallel && app.count("--parallel") == 0) parallel = *config.parallel;
      if (config.secret_key && secret_key_path.empty()) secret_key_path = *config.secret_key;
    }
    if (!worker_keys.empty() && worker_keys.size() != worker_addresses.size()) {
      throw std::invalid_argument(std::to_string(worker_keys.size()) + " --worker-key for " +
                                  std::to_string(worker_addresses.size()) + " --worker: give one per --worker, in order");
    }
    for (size_t i = 0; i < worker_addresses.size(); ++i) {
      workers.push_back({worker_addresses[i], std::nullopt,
                         worker_keys.empty() ? std::string() : net::public_key_from(worker_keys[i]), std::nullopt});
    }
    std::optional<net::KeyPair> own_keys;
    if (!secret_key_path.empty()) own_keys = net::read_secret_key_file(secret_key_path);
    check_security(workers, own_keys.has_value());
    if (!prompts_path.empty()) {
      std::ifstream in(prompts_path);
      if (!in) throw std::runtime_error("cannot read " + prompts_path);
      for (std::string line; std::getline(in, line);) {
        if (!line.empty()) prompts.push_back(line);
      }
    }
    if (prompts.empty() && !serving) throw std::invalid_argument("no prompt: give -p or --prompts");

    const auto file = gguf::Model::open(model_path);
    const auto tok = tokenizer::Tokenizer::from_metadata(file->metadata());
    const protocol::ModelIdentity identity = protocol::model_identity(*file);

    const auto ctx_train = file->metadata().get_int(identity.arch + ".context_length");
    const int64_t model_ctx = ctx_train && *ctx_train > 0 ? *ctx_train : 0;
    {
      // The largest answer a worker may send (before any socket is made: ZeroMQ copies
      // the option at connect): bounded by what this coordinator asks at most.
      const auto model = model::Model::load(*file);
      const int64_t most_ctx = ctx > 0 ? ctx : (model_ctx > 0 ? model_ctx : 4096);
      net::set_max_message_bytes(static_cast<int64_t>(coordinator_max_message_bytes(
          sched.max_batch_tokens, identity.n_vocab, most_ctx,
          state::kv_bytes_per_position(model->kv_config(model->all_layers(), GgmlType::F32, GgmlType::F32)))));
    }
    std::vector<std::unique_ptr<Stage>> stages;
    std::optional<RemoteOptions> remote_options;  // how a worker joining at run time is reached
    std::optional<PlacementProblem> placement_problem;  // the model's side, to place the workers anew
    std::map<std::string, uint64_t> memory_caps;       // the config's, per worker
    LinkBook links;  // the workers' links, for the lanes' predicted steps
    if (workers.empty()) {
      worker::StageLimitOptions local;
      local.ctx = ctx;
      if (!device_memory.empty()) local_backend.memory = worker::parse_byte_size(device_memory);
      auto stage = std::make_unique<LocalStage>(model_path, std::nullopt, threads, local, local_backend);
      stage->set_slot_dir(slot_dir);
      stages.push_back(std::move(stage));
    } else {
      if (local_backend.name != "cpu" || local_backend.device != 0 || !device_memory.empty())
        throw std::invalid_argument("--backend, --device and --device-memory choose the local stage's; with "
                                    "--worker, give them to each pico-worker");
      RemoteOptions ro;
      ro.connect_timeout_ms = static_cast<int>(connect_seconds * 1000);
      ro.activations = protocol::parse_dtype(activations);
      ro.take_over = take_over;
      for (const auto& w : workers) {
        if (own_keys) ro.cluster_keys.push_back(w.public_key);
      }
      std::vector<std::unique_ptr<RemoteStage>> connected;
      const auto connect_all = [&] {
        connected.clear();
        for (const auto& w : workers) {
          if (own_keys) ro.curve = net::Curve{*own_keys, w.public_key};
          connected.push_back(std::make_unique<RemoteStage>(w.address, ro));
        }
      };
      connect_all();
      {
        // Workers started with --layers auto get their ranges from placement here, and
        // the pipeline takes them in its order; those left out stand by where they hold
        // a stage's range, else are not used.
        AutoPlacement settings;
        settings.objective = parse_objective(objective);
        settings.ctx = ctx > 0 ? ctx : (model_ctx > 0 ? model_ctx : 4096);
        settings.parallel = parallel > 0 ? parallel : 32;
        settings.activations = ro.activations;
        settings.lanes = replicas == "spread";
        for (const auto& w : workers) {
          if (w.memory) memory_caps[w.address] = *w.memory;
        }
        placement_problem = model_placement_problem(*file, settings.ctx, settings.parallel, settings.activations);
        placement_problem->objective = settings.objective;
        placement_problem->concurrency = settings.parallel;
        placement_problem->lanes = settings.lanes;
        links = link_book(*placement_problem);  // the bytes a step carries; the links as measured below
        const std::vector<WorkerEntry> assigned = assign_auto_layers(connected, workers, *file, settings, &links);
        if (!std::equal(assigned.begin(), assigned.end(), workers.begin(), workers.end(),
                        [](const auto& a, const auto& b) {
                          return a.address == b.address && a.layers.has_value() == b.layers.has_value() &&
                                 (!a.layers || (a.layers->first == b.layers->first && a.layers->last == b.layers->last));
                        })) {
          workers = assigned;
          ro.cluster_keys.clear();
          for (const auto& w : workers) {
            if (own_keys) ro.cluster_keys.push_back(w.public_key);
          }
          // Each loads its range before it answers hello again.
          ro.connect_timeout_ms = std::max(ro.connect_timeout_ms, 120000);
          connect_all();
        }
      }
      for (size_t i = 0; i < workers.size(); ++i) {
        const auto& w = workers[i];
        auto& stage = connected[i];
        const auto& l = stage->info().layers;
        if (w.layers && (w.layers->first != l.first || w.layers->last != l.last)) {
          throw StageError("worker " + w.address + " serves layers " + model::to_string(l) + ", the config says " +
                           model::to_string(*w.layers));
        }
        // Workers that were not placed: their links to the coordinator are measured here
        // (those between workers are then estimated from them).
        if (!links.knows(w.address)) {
          if (const auto link = measure_link(*stage, 1u << 20)) links.coordinator[w.address] = *link;
        }
        stages.push_back(std::move(stage));
      }
      remote_options = ro;
      remote_options->connect_timeout_ms = RemoteOptions{}.connect_timeout_ms;
      remote_options->take_over = false;
      if (own_keys) remote_options->curve = net::Curve{*own_keys, {}};
    }
    Pipeline pipeline(std::move(stages), identity);
    pipeline.set_spread(replicas == "spread");
    pipeline.set_links(std::move(links));

    // ctx x parallel sequences sized so that no stage can run out of KV.
    std::vector<StageInfo> infos;  // replicas too: each must hold what a failover gives it
    for (Stage* s : pipeline.all_stages()) infos.push_back(s->info());
    // A hybrid model's stages hold a fixed recurrent state per sequence, and as many
    // copies of it again as it keeps checkpoints.
    for (size_t i = 0; i < pipeline.size(); ++i) {
      sched.checkpoint_bytes += pipeline.stage(i).info().limits.state_bytes_per_sequence;
    }
    for (StageInfo& info : infos) info.limits.state_bytes_per_sequence *= 1 + static_cast<uint64_t>(sched.checkpoint_max);
    sched.recurrent = sched.checkpoint_bytes > 0;
    SizingRequest want;
    want.ctx = ctx;
    want.model_ctx = model_ctx;
    want.parallel = parallel > 0 ? parallel : 32;
    want.max_batch_tokens = sched.max_batch_tokens;
    const Sizing sized = size_for_stages(infos, want);
    for (const auto& note : sized.notes) spdlog::warn("{}", note);
    for (Stage* s : pipeline.all_stages()) {
      s->set_rejoin_check([sized](const StageInfo& now) { return rejoin_shortfall(now, sized); });
    }
    spdlog::info("ctx {}, {} parallel sequences, {} tokens per step", sized.ctx, sized.parallel,
                 sized.max_batch_tokens);
    sched.ctx = sized.ctx;
    sched.max_sequences = sized.parallel;
    sched.max_batch_tokens = sized.max_batch_tokens;
    sched.step_timeout_ms = timeout_ms;
    sched.keep_logits = !dump_logits.empty();
    if (serving) {
      http.model_path = model_path;
      http.n_embd = identity.n_embd;
      if (!pooling.empty()) {
        http.pooling = parse_pooling(pooling);
      } else if (const auto type = file->metadata().get_int(identity.arch + ".pooling_type")) {
        // llama.cpp's numbers: 0 none, 1 mean, 2 cls, 3 last, 4 rank (a reranker's, not served).
        constexpr Pooling kByNumber[] = {Pooling::none, Pooling::mean, Pooling::cls, Pooling::last};
        if (*type >= 0 && *type < 4) {
          http.pooling = kByNumber[*type];
        } else {
          spdlog::warn("the model's pooling type {} is not served; embeddings pool as 'none' (see --pooling)", *type);
        }
      }
      if (http.model_name.empty()) {
        http.model_name = model_path.substr(model_path.find_last_of('/') + 1);
        if (http.model_name.size() > 5 && http.model_name.ends_with(".gguf")) {
          http.model_name.resize(http.model_name.size() - 5);
        }
      }
      const auto chat = tokenizer::ChatTemplate::from_metadata(file->metadata(), &tok->vocab(), chat_template);
      sched.cache_sequences = cache_slots >= 0 ? cache_slots : sched.max_sequences;
      sched.stage_stats = true;
      Engine engine(pipeline, *tok, sched, max_queue);
      std::unique_ptr<ClusterControl> cluster;
      if (remote_options) {
        ClusterControl::Options control;
        control.remote = *remote_options;
        control.limits_check = [sized](const StageInfo& now) { return rejoin_shortfall(now, sized); };
        control.replan_on_join = replan_on_join;
        control.slow_factor = slow_factor;
        control.slow_seconds = slow_seconds;
        control.batch_objective = objective == "throughput";
        control.placement = placement_problem;
        control.memory_caps = memory_caps;
        control.replan_on_loss_seconds = replan_on_loss;
        control.standby_copy_seconds = standby_copies;
        cluster = std::make_unique<ClusterControl>(engine, identity, std::move(control));
        http.cluster = cluster.get();
      }
      serve_http(engine, *tok, chat, http);
      return 0;
    }
    std::vector<Request> requests;
    for (size_t i = 0; i < prompts.size(); ++i) {
      Request r;
      r.prompt = tok->encode(prompts[i], true, true);
      r.n_predict = n_predict;
      r.sampling = sp;
      r.ignore_eos = ignore_eos;
      if (sp.seed != sample::SamplingParams::kRandomSeed) r.sampling.seed = sp.seed + static_cast<uint32_t>(i);
      requests.push_back(std::move(r));
    }
    Scheduler scheduler(pipeline, *tok, sched);
    const bool stream = prompts.size() == 1 && !print_tokens;
    const auto results = scheduler.run(requests, [&](size_t, const std::string& piece) {
      if (stream) std::cout << piece << std::flush;
    });
    for (size_t i = 0; i < results.size(); ++i) {
      spdlog::info("prompt {}: {} tokens, median interval {:.1f} us", i, results[i].tokens.size(),
                   median_token_interval(results[i]) * 1e6);
    }
    for (const auto& r : results) {
      if (print_tokens) {
        std::string json = "[";
        for (size_t i = 0; i < r.tokens.size(); ++i) json += (i ? ", " : "") + std::to_string(r.tokens[i]);
        std::cout << json << "]\n";
      } else if (!stream) {
        std::cout << r.text << "\n";
      }
    }
    if (stream) std::cout << std::endl;
    if (!dump_logits.empty()) {
      std::FILE* out = std::fopen(dump_logits.c_str(), "wb");
      if (!out) throw std::runtime_error("cannot write " + dump_logits);
      for (const auto& r : results) std::fwrite(r.logits.data(), sizeof(float), r.logits.size(), out);
      if (std::fclose(out) != 0) throw std::runtime_error("write failed: " + dump_logits);
    }
    for (size_t i = 0; i < pipeline.size(); ++i) {
      const StageStats s = pipeline.stage(i).stats();
      spdlog::info("stage {}: resident {:.1f} MiB, kv {} bytes, {} batches, {} tokens", i,
                   static_cast<double>(s.memory_bytes) / (1 << 20), s.kv_bytes, s.batches, s.tokens);
    }
    const PipelineTimings timings = pipeline.timings();
    for (size_t i = 0; i < timings.stages.size(); ++i) {
      const auto& t = timings.stages[i];
      spdlog::info("stage {}: compute {:.1f} ms, queue {:.1f} ms, transfer in {:.1f} ms ({} batches)", i,
                   t.compute_seconds * 1e3, t.queue_seconds * 1e3, t.transfer_seconds * 1e3, t.batches);
    }
    spdlog::info("logits transfer {:.1f} ms", timings.logits_transfer_seconds * 1e3);
    spdlog::info("chained steps {} (started by the last stage)", timings.chained_steps);
    return 0;
  } catch (const std::exception& e) {
    std::cout << std::flush;
    spdlog::error("{}", e.what());
    return 1;
  }
}
