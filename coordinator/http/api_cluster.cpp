// /cluster: the pipeline's stages with their workers (active, replicas), health and
// measures; POST /cluster/workers adds a worker at run time; POST /cluster/replan
// moves stages to other workers, gives --layers auto workers other ranges, or places
// the cluster anew (ClusterControl). The work waits for the engine thread
// (and a joining worker may load its layers first), so it runs on a thread of its own
// while the connection's coroutine waits on a timer.
#include <functional>
#include <future>
#include <map>
#include <thread>

#include "api.hpp"
#include "cluster_control.hpp"
#include "stage_engine.hpp"

namespace pico::coordinator::http_api {

namespace {

json to_json(const ClusterView& view) {
  json stages = json::array();
  for (size_t i = 0; i < view.stages.size(); ++i) {
    const StageView& st = view.stages[i];
    json workers = json::array();
    std::string active;
    for (const WorkerView& w : st.workers) {
      if (w.active) active = w.name;
      json j = {{"address", w.name},          {"up", w.up},
                {"active", w.active},         {"backend", w.backend.empty() ? "cpu" : w.backend},
                {"isa", w.isa},               {"device", w.device},
                {"threads", w.threads},       {"memory_bytes", w.memory_bytes},
                {"round_trip_ms", w.round_trip_seconds * 1e3}};
      j["lane"] = w.lane ? json(*w.lane) : json(nullptr);
      j["link"] = w.link ? json{{"latency_ms", w.link->latency_seconds * 1e3},
                                {"megabytes_per_second", w.link->bytes_per_second / 1e6}}
                         : json(nullptr);
      j["decode_ms"] = w.decode_seconds ? json(*w.decode_seconds * 1e3) : json(nullptr);
      j["batch_ms_per_token"] = w.batch_seconds_per_token ? json(*w.batch_seconds_per_token * 1e3) : json(nullptr);
      workers.push_back(std::move(j));
    }
    json stage = {{"stage", i},
                  {"layers", model::to_string(st.layers)},
                  {"active", active},
                  {"replicas", st.workers.size() - 1},
                  {"workers", std::move(workers)}};
    // Totals since start: a client takes differences between two reads for rates.
    stage["compute_seconds"] = st.timings.compute_seconds;
    stage["queue_seconds"] = st.timings.queue_seconds;
    stage["transfer_seconds"] = st.timings.transfer_seconds;
    stage["batches"] = st.timings.batches;
    stage["tokens"] = st.timings.tokens;
    if (st.stats) {
      stage["memory"] = {{"used_bytes", st.stats->memory_bytes},
                         {"free_bytes", st.stats->free_bytes},
                         {"kv_bytes", st.stats->kv_bytes}};
    } else {
      stage["memory"] = nullptr;
    }
    stages.push_back(std::move(stage));
  }
  json lanes = json::array();
  for (const auto& lane : view.lanes) lanes.push_back({{"id", lane.id}, {"steps", lane.steps}});
  return {{"stages", std::move(stages)},
          {"replicas", view.spread ? "spread" : "standby"},
          {"lanes", std::move(lanes)},
          {"failovers", view.failovers},
          {"slow_moves", view.slow_moves},
          {"handed_over_sequences", view.handed_over_sequences},
          {"standby_copies", {{"sequences", view.standby_copies},
                              {"bytes", view.standby_copy_bytes},
                              {"seconds", view.standby_copy_seconds}}}};
}

ClusterControl& control(Session& s) {
  if (!s.state.options.cluster) {
    throw ApiError(404, "this pico-coord runs its layers in-process: no cluster", "not_found_error");
  }
  return *s.state.options.cluster;
}

json to_json(const PlacementOutcome& o) {
  json stages = json::array(), others = json::array();
  for (const auto& st : o.stages) {
    stages.push_back({{"address", st.address},
                      {"layers", model::to_string(st.layers)},
                      {"compute_ms", st.compute_seconds * 1e3},
                      {"send_ms", st.send_seconds * 1e3}});
  }
  for (const auto& other : o.others) others.push_back({{"address", other.address}, {"what", other.what}});
  return {{"moved", o.moved},
          {"why", o.why},
          {"predicted_tokens_per_second_before",
           o.before_tokens_per_second ? json(*o.before_tokens_per_second) : json(nullptr)},
          {"predicted_tokens_per_second", o.after_tokens_per_second},
          {"stages", std::move(stages)},
          {"others", std::move(others)}};
}

// A byte count as a number or a size such as "6G".
uint64_t bytes_of(const json& value, const std::string& what, const std::string& param) {
  try {
    if (value.is_number_unsigned()) return value.get<uint64_t>();
    if (value.is_string()) return worker::parse_byte_size(value.get<std::string>());
  } catch (const std::exception& e) {
    throw ApiError(400, what + ": " + value.dump() + " is not a byte count (" + e.what() + ")", "invalid_request_error",
                   {}, param);
  }
  throw ApiError(400, what + ": " + value.dump() + " is not a byte count such as 6442450944 or \"6G\"",
                 "invalid_request_error", {}, param);
}

json body_of(Session& s) {
  if (s.request.body().empty()) return json::object();
  json body = json::parse(s.request.body(), nullptr, false);
  if (!body.is_object()) throw ApiError(400, "the body is not a JSON object");
  return body;
}

}  // namespace

awaitable<void> cluster(Session& s) {
  ClusterControl& c = control(s);
  std::function<json()> work = [&c] { return to_json(c.view()); };
  const json out = co_await off_thread(work, "cluster_refused");
  co_await s.reply(200, out);
}

awaitable<void> cluster_join(Session& s) {
  ClusterControl& c = control(s);
  const json body = body_of(s);
  if (!body.contains("address") || !body["address"].is_string() || body["address"].get<std::string>().empty()) {
    throw ApiError(400, "'address' (the worker's, e.g. tcp://10.0.0.5:7701) is required", "invalid_request_error", {},
                   "address");
  }
  const std::string address = body["address"].get<std::string>();
  std::optional<uint64_t> memory;
  if (body.contains("memory")) memory = bytes_of(body["memory"], "'memory'", "memory");
  std::function<json()> work = [&c, address, memory] { return to_json(c.join(address, memory)); };
  const json out = co_await off_thread(work, "cluster_refused");
  co_await s.reply(200, out);
}

awaitable<void> cluster_replan(Session& s) {
  ClusterControl& c = control(s);
  const json body = body_of(s);
  if (body.contains("place")) {
    // {"place": true, "memory": {"tcp://host:port": "6G", ...}, "dry_run": false}: the
    // live --layers auto workers measured and placed anew (memory: what placement may
    // plan on each, kept for later placements).
    if (!body["place"].is_boolean() || !body["place"].get<bool>() || body.contains("layers") || body.contains("drain")) {
      throw ApiError(400, "'place' must be true (and comes without 'layers' or 'drain')", "invalid_request_error", {},
                     "place");
    }
    std::map<std::string, uint64_t> caps;
    if (body.contains("memory")) {
      if (!body["memory"].is_object()) {
        throw ApiError(400, "'memory' must map worker addresses to byte counts such as \"6G\"", "invalid_request_error",
                       {}, "memory");
      }
      for (const auto& [address, value] : body["memory"].items()) {
        caps[address] = bytes_of(value, "'memory' of " + address, "memory");
      }
    }
    // "dry_run": true says what it would do and moves nothing.
    bool dry_run = false;
    if (body.contains("dry_run")) {
      if (!body["dry_run"].is_boolean()) {
        throw ApiError(400, "'dry_run' must be true or false", "invalid_request_error", {}, "dry_run");
      }
      dry_run = body["dry_run"].get<bool>();
    }
    std::function<json()> work = [&c, caps, dry_run] {
      PlacementOutcome outcome;
      json j = to_json(c.place(caps, &outcome, dry_run));
      j["moved"] = outcome.moved;
      j["placement"] = to_json(outcome);
      return j;
    };
    const json out = co_await off_thread(work, "cluster_refused");
    co_await s.reply(200, out);
    co_return;
  }
  if (body.contains("layers")) {
    // {"layers": {"tcp://host:port": "A-B", ...}}: workers started with --layers auto
    // take these ranges (inclusive, as --layers writes them).
    const json& layers = body["layers"];
    if (!layers.is_object() || layers.empty() || body.contains("drain")) {
      throw ApiError(400, "'layers' must map worker addresses to ranges such as \"0-11\" (and comes without 'drain')",
                     "invalid_request_error", {}, "layers");
    }
    std::map<std::string, model::LayerRange> ranges;
    for (const auto& [address, range] : layers.items()) {
      try {
        if (!range.is_string()) throw std::invalid_argument("not a string");
        ranges[address] = worker::parse_layers(range.get<std::string>());
      } catch (const std::exception& e) {
        throw ApiError(400, "'layers' of " + address + ": " + range.dump() + " is not a range A-B (" + e.what() + ")",
                       "invalid_request_error", {}, "layers");
      }
    }
    std::function<json()> work = [&c, ranges] {
      json j = to_json(c.move_layers(ranges));
      j["moved"] = true;
      return j;
    };
    const json out = co_await off_thread(work, "cluster_refused");
    co_await s.reply(200, out);
    co_return;
  }
  std::optional<std::string> drain;
  if (body.contains("drain")) {
    if (!body["drain"].is_string()) throw ApiError(400, "'drain' must be a worker's address", "invalid_request_error", {}, "drain");
    drain = body["drain"].get<std::string>();
  }
  std::function<json()> work = [&c, drain] {
    bool moved = false;
    json j = to_json(c.replan(drain, &moved));
    j["moved"] = moved;
    return j;
  };
  const json out = co_await off_thread(work, "cluster_refused");
  co_await s.reply(200, out);
}

}  // namespace pico::coordinator::http_api
