// llama.cpp server endpoints: /completion, /tokenize, /detokenize, /health, /props,
// /slots, /metrics.
#include <charconv>
#include <boost/asio/this_coro.hpp>
#include <cmath>
#include <sstream>

#include "http/api.hpp"

namespace pico::coordinator::http_api {

namespace {

// A Prometheus label value: backslash, double quote and newline escaped.
std::string label_value(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    if (c == '\\' || c == '"') out += '\\';
    out += c;
  }
  return out;
}


json samplers_json(const sample::SamplingParams& sp) {
  json names = json::array();
  for (const sample::Stage stage : sp.stages) names.push_back(std::string(sample::stage_name(stage)));
  return names;
}

json settings_json(const ServerState& state, const OnlineRequest* r) {
  const sample::SamplingParams sp = r ? r->sampling : sample::SamplingParams{};
  return {{"n_ctx", state.engine.options().ctx},
          {"n_predict", r ? r->max_tokens : -1},
          {"model", state.options.model_name},
          {"temperature", sp.temperature},
          {"top_k", sp.top_k},
          {"top_p", sp.top_p},
          {"min_p", sp.min_p},
          {"typical_p", sp.typical_p},
          {"repeat_penalty", sp.repeat_penalty},
          {"repeat_last_n", sp.penalty_last_n},
          {"presence_penalty", sp.presence_penalty},
          {"frequency_penalty", sp.frequency_penalty},
          {"top_n_sigma", sp.top_n_sigma},
          {"xtc_probability", sp.xtc_probability},
          {"xtc_threshold", sp.xtc_threshold},
          {"dynatemp_range", sp.dynatemp_range},
          {"dynatemp_exponent", sp.dynatemp_exponent},
          {"mirostat", sp.mirostat},
          {"mirostat_tau", sp.mirostat_tau},
          {"mirostat_eta", sp.mirostat_eta},
          {"dry_multiplier", sp.dry_multiplier},
          {"dry_base", sp.dry_base},
          {"dry_allowed_length", sp.dry_allowed_length},
          {"dry_penalty_last_n", sp.dry_penalty_last_n},
          {"samplers", samplers_json(sp)},
          {"min_keep", sp.min_keep},
          {"seed", sp.seed},
          {"stop", r ? json(r->stop) : json::array()},
          {"ignore_eos", r ? r->ignore_eos : false},
          {"cache_prompt", r ? r->cache_prompt : true}};
}

// A request's sampling and generation parameters as llama-server's slots and /props
// show them ("params"): the settings above without the server's n_ctx and model, with
// max_tokens, n_probs and the reasoning format.
json params_json(const ServerState& state, const OnlineRequest* r) {
  json params = settings_json(state, r);
  params.erase("n_ctx");
  params.erase("model");
  params["max_tokens"] = params["n_predict"];
  params["n_probs"] = r ? std::max(r->logprobs, 0) : 0;
  params["reasoning_format"] = std::string(reasoning_format_name(state.parse.reasoning_format));
  return params;
}

// llama-server's completion_probabilities entry of one token: log-probabilities of the
// raw logits ("logprob", "top_logprobs"), or with post_sampling_probs the sampler
// chain's probabilities ("prob", "top_probs").
json token_probs(const tokenizer::Tokenizer& tok, const TokenEvent& ev) {
  auto bytes = [](const std::string& text) {
    json b = json::array();
    for (unsigned char c : text) b.push_back(static_cast<int>(c));
    return b;
  };
  const char* value = ev.post_sampling ? "prob" : "logprob";
  auto number = [&](float logprob) { return ev.post_sampling ? json(std::exp(logprob)) : json(logprob); };
  json top = json::array();
  for (const auto& t : ev.top) {
    const std::string piece = tok.piece(t.id);
    top.push_back({{"id", t.id}, {"token", piece}, {"bytes", bytes(piece)}, {value, number(t.logprob)}});
  }
  const std::string piece = tok.piece(ev.id);
  return {{"id", ev.id},
          {"token", piece},
          {"bytes", bytes(piece)},
          {value, number(ev.logprob)},
          {ev.post_sampling ? "top_probs" : "top_logprobs", top}};
}

}  // namespace

json progress_json(const PromptProgress& p) {
  return {{"total", p.total}, {"cache", p.cache}, {"processed", p.processed}, {"time_ms", p.time_ms}};
}

json timings_json(const Usage& u) {
  auto per_token = [](double ms, int n) { return n > 0 ? ms / n : 0.0; };
  auto per_second = [](double ms, int n) { return ms > 0 ? 1e3 * n / ms : 0.0; };
  // llama.cpp's names: cache_n prompt tokens reused, prompt_n computed.
  const int computed = u.prompt_tokens - u.cached_tokens;
  return {{"cache_n", u.cached_tokens},
          {"prompt_n", computed},
          {"prompt_ms", u.prompt_ms},
          {"prompt_per_token_ms", per_token(u.prompt_ms, computed)},
          {"prompt_per_second", per_second(u.prompt_ms, computed)},
          {"predicted_n", u.completion_tokens},
          {"predicted_ms", u.predicted_ms},
          {"predicted_per_token_ms", per_token(u.predicted_ms, u.completion_tokens)},
          {"predicted_per_second", per_second(u.predicted_ms, u.completion_tokens)}};
}

namespace {
awaitable<void> serve_llama_completion(Session& s, const json& body) {
  ParsedGeneration parsed = parse_generation_request(s.state.parse, Endpoint::LlamaCompletion, body);
  const bool stream = parsed.stream;
  const int n_probs = parsed.n_probs;
  const json settings = settings_json(s.state, &parsed.choices.front());

  Generation gen(s.state.engine, co_await asio::this_coro::executor, s.socket, std::move(parsed.choices));
  std::string text;
  json tokens = json::array(), probs = json::array();
  if (stream && !co_await s.stream_begin()) {
    gen.cancel();
    co_return;
  }
  while (true) {
    Generation::Event ev = co_await gen.next();
    if (ev.kind == Generation::Event::Error) {
      if (!stream) throw ApiError(500, ev.reason, "server_error", "generation_failed");
      const std::string err = error_body(500, ev.reason, "server_error", "generation_failed").dump();
      co_await s.stream_data(err);
      co_await s.stream_end();
      co_return;
    }
    if (gen.client_gone()) {  // cancelled: nobody to answer
      s.keep_alive = false;
      co_return;
    }
    if (ev.kind == Generation::Event::Done) {
      const std::string stop_type = ev.reason == "length" ? "limit" : ev.reason == "stop_string" ? "word" : "eos";
      json out = {{"content", stream ? "" : text},
                  {"tokens", stream ? json::array() : tokens},
                  {"id_slot", 0},
                  {"stop", true},
                  {"model", s.state.options.model_name},
                  {"tokens_predicted", ev.usage.completion_tokens},
                  {"tokens_evaluated", ev.usage.prompt_tokens},
                  {"tokens_cached", ev.usage.kv_tokens},
                  {"generation_settings", settings},
                  {"stop_type", stop_type},
                  {"stopping_word", ev.usage.stopping_word},
                  {"truncated", false},
                  {"timings", timings_json(ev.usage)}};
      if (n_probs > 0 && !stream) out["completion_probabilities"] = probs;
      if (!stream) {
        co_await s.reply(200, out);
      } else {
        const std::string out_text = out.dump();
        co_await s.stream_data(out_text);
        co_await s.stream_end();
      }
      co_return;
    }
    if (ev.kind == Generation::Event::Progress) {  // return_progress: a partial answer without text
      if (!stream) continue;
      json c = {{"content", ""}, {"tokens", json::array()}, {"stop", false}, {"id_slot", 0}};
      c["prompt_progress"] = progress_json(ev.progress);
      const std::string text_c = c.dump();
      if (!co_await s.stream_data(text_c)) {
        gen.cancel();
        s.keep_alive = false;
        co_return;
      }
      continue;
    }
    text += ev.token.text;
    if (ev.token.id >= 0) tokens.push_back(ev.token.id);
    const bool with_probs = n_probs > 0 && ev.token.id >= 0;
    if (with_probs && !stream) probs.push_back(token_probs(s.state.tok, ev.token));
    if (stream && (!ev.token.text.empty() || with_probs)) {
      json c = {{"content", ev.token.text}, {"tokens", ev.token.id >= 0 ? json::array({ev.token.id}) : json::array()},
                {"stop", false}, {"id_slot", 0}};
      if (with_probs) c["completion_probabilities"] = json::array({token_probs(s.state.tok, ev.token)});
      const std::string text_c = c.dump(-1, ' ', false, json::error_handler_t::replace);
      if (!co_await s.stream_data(text_c)) {
        gen.cancel();
        s.keep_alive = false;
        co_return;
      }
    }
  }
}
}  // namespace

awaitable<void> llama_completion(Session& s) {
  const json body = parse_body(s.request);
  co_await serve_llama_completion(s, body);
}

awaitable<void> infill(Session& s) {
  const json body = infill_completion_body(s.state.parse, parse_body(s.request));
  co_await serve_llama_completion(s, body);
}

awaitable<void> tokenize(Session& s) {
  const TokenizeRequest r = parse_tokenize_request(parse_body(s.request));
  const auto ids = s.state.tok.encode(r.content, r.add_special, r.parse_special);
  json tokens = json::array();
  for (int32_t id : ids) {
    if (r.with_pieces) {
      tokens.push_back({{"id", id}, {"piece", s.state.tok.piece(id, true)}});
    } else {
      tokens.push_back(id);
    }
  }
  const json out = {{"tokens", tokens}};
  co_await s.reply(200, out);
}

awaitable<void> apply_template(Session& s) {
  const json out = {{"prompt", parse_apply_template_request(s.state.parse, parse_body(s.request))}};
  co_await s.reply(200, out);
}

awaitable<void> detokenize(Session& s) {
  const auto ids = parse_detokenize_request(s.state.parse, parse_body(s.request));
  const json out = {{"content", s.state.tok.decode(ids)}};
  co_await s.reply(200, out);
}

awaitable<void> health(Session& s) {
  const std::string lost = s.state.engine.lost_stage();
  if (!lost.empty()) {
    throw ApiError(503, lost + " is lost; waiting for it to rejoin", "unavailable_error", "stage_lost");
  }
  const json out = {{"status", "ok"}};
  co_await s.reply(200, out);
}

awaitable<void> props(Session& s) {
  // As llama-server: the server's context and the parameters a request starts from.
  const json settings = {{"n_ctx", s.state.engine.options().ctx}, {"params", params_json(s.state, nullptr)}};
  const json out = {{"default_generation_settings", settings},
                         {"total_slots", s.state.engine.options().max_sequences},
                         {"prompt_cache_slots", s.state.engine.options().cache_sequences},
                         {"model_path", s.state.options.model_path},
                         {"model_alias", s.state.options.model_name},
                         {"chat_template", std::string(s.state.chat.name())},
                         {"build_info", "pico"}};
  co_await s.reply(200, out);
}

// llama-server takes POST /props only with --props, and then changes nothing: refused
// as it refuses it without the flag (nothing here could be changed at run time).
awaitable<void> set_props(Session& s) {
  (void)s;
  throw ApiError(501, "This server does not support changing global properties", "not_supported_error");
  co_return;
}

awaitable<void> slots(Session& s) {
  json out = json::array();
  // Every sequence holding KV: the requests' (is_processing) and the ones kept idle for
  // prefix reuse (n_past: the positions they still hold).
  for (const auto& slot : s.state.engine.slots()) {
    json j = {{"id", slot.id},
              {"n_ctx", s.state.engine.options().ctx},
              {"speculative", false},
              {"is_processing", slot.processing},
              {"state", !slot.processing ? "idle" : slot.prefill ? "prefill" : "decode"},
              {"n_past", slot.n_past}};
    if (s.state.engine.options().recurrent) {
      // A hybrid model's recurrent-state checkpoints (what a prefix reuse can go back to).
      j["checkpoints"] = {{"count", slot.checkpoints.size()},
                          {"positions", slot.checkpoints},
                          {"bytes", slot.checkpoint_bytes}};
    }
    if (slot.processing) {
      j["id_task"] = slot.task;
      j["n_prompt_tokens"] = slot.n_prompt;
      j["n_prompt_tokens_cache"] = slot.n_cached;
      j["n_prompt_tokens_processed"] = slot.n_prompt - slot.n_cached;
      j["n_decoded"] = slot.n_decoded;
      // The request's parameters and where its generation stands, as llama-server's slot.
      const OnlineRequest* settings = slot.settings.get();
      j["params"] = params_json(s.state, settings);
      const int max_tokens = settings ? settings->max_tokens : -1;
      j["next_token"] = json::array({{{"has_next_token", true},
                                      {"has_new_line", slot.has_new_line},
                                      {"n_remain", max_tokens < 0 ? -1 : std::max(0, max_tokens - slot.n_decoded)},
                                      {"n_decoded", slot.n_decoded}}});
    }
    out.push_back(j);
  }
  co_await s.reply(200, out);
}

// llama-server's slot files: POST /slots/{id}?action=save|restore|erase, with
// {"filename": NAME} for save and restore. Each stage writes its own layers' state to
// its own disk (pico-worker --slot-save-path; pico-coord's for its in-process stage). A
// restore makes a new idle slot, whose id is answered (pico's slots are its sequences,
// not a fixed set); a later request with a common prompt prefix continues it.
awaitable<void> slot_action(Session& s) {
  const std::string_view target(s.request.target().data(), s.request.target().size());
  const size_t query = target.find('?');
  const std::string_view path = target.substr(0, query);
  const std::string id_text(path.substr(path.find("/slots/") + 7));
  int32_t id = -1;
  const auto [end, ec] = std::from_chars(id_text.data(), id_text.data() + id_text.size(), id);
  if (ec != std::errc() || end != id_text.data() + id_text.size() || id < 0) {
    throw ApiError(400, "'" + id_text + "' is not a slot id", "invalid_request_error", "invalid_value", "id_slot");
  }
  std::string action;
  if (query != std::string_view::npos) {
    for (std::string_view rest = target.substr(query + 1); !rest.empty();) {
      const std::string_view pair = rest.substr(0, rest.find('&'));
      rest = pair.size() < rest.size() ? rest.substr(pair.size() + 1) : std::string_view();
      if (pair.starts_with("action=")) action = std::string(pair.substr(7));
    }
  }
  Engine::SlotAction what;
  if (action == "save") {
    what = Engine::SlotAction::save;
  } else if (action == "restore") {
    what = Engine::SlotAction::restore;
  } else if (action == "erase") {
    what = Engine::SlotAction::erase;
  } else {
    throw ApiError(400, "Invalid action: '" + action + "' (save, restore or erase)", "invalid_request_error",
                   "invalid_value", "action");
  }
  std::string filename;
  if (what != Engine::SlotAction::erase) {
    const json body = parse_body(s.request);
    auto it = body.find("filename");
    if (it == body.end() || !it->is_string() || it->get<std::string>().empty()) {
      throw ApiError(400, "'filename' (a file name in the slot save path) is required", "invalid_request_error",
                     "invalid_value", "filename");
    }
    filename = it->get<std::string>();
  }
  Engine& engine = s.state.engine;
  std::function<json()> work = [&engine, what, id, filename] {
    const Engine::SlotFileResult r = engine.slot_file(what, id, filename).get();
    if (what == Engine::SlotAction::erase) return json{{"id_slot", r.slot}, {"n_erased", r.tokens}};
    const bool save = what == Engine::SlotAction::save;
    return json{{"id_slot", r.slot},
                {"filename", filename},
                {save ? "n_saved" : "n_restored", r.tokens},
                {save ? "n_written" : "n_read", r.bytes},
                {"timings", {{save ? "save_ms" : "restore_ms", r.ms}}}};
  };
  const json out = co_await off_thread(work, "slot_refused");
  co_await s.reply(200, out);
}

awaitable<void> metrics(Session& s) {
  const EngineMetrics m = s.state.engine.metrics();
  std::ostringstream o;
  auto metric = [&](const char* name, const char* type, const char* help, double value) {
    o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n' << name << ' ' << value << '\n';
  };
  metric("pico:requests_total", "counter", "Requests admitted by the engine.", static_cast<double>(m.requests));
  metric("pico:requests_failed_total", "counter", "Requests failed by a pipeline error.",
         static_cast<double>(m.requests_failed));
  metric("pico:http_requests_total", "counter", "HTTP requests received.",
         static_cast<double>(s.state.http_requests.load()));
  metric("pico:requests_cancelled_total", "counter", "Requests cancelled (client gone), queued or running.",
         static_cast<double>(m.requests_cancelled));
  metric("llamacpp:prompt_tokens_total", "counter", "Number of prompt tokens processed, excluding cached tokens.",
         static_cast<double>(m.prompt_tokens));
  metric("llamacpp:prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache.",
         static_cast<double>(m.prompt_tokens_cached));
  metric("llamacpp:prompt_seconds_total", "counter", "Prompt process time.", m.prefill_seconds);
  metric("llamacpp:tokens_predicted_total", "counter", "Number of generation tokens processed.",
         static_cast<double>(m.generated_tokens));
  metric("llamacpp:tokens_predicted_seconds_total", "counter", "Predict process time.", m.decode_seconds);
  metric("llamacpp:prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.",
         m.prefill_seconds > 0 ? static_cast<double>(m.prompt_tokens) / m.prefill_seconds : 0.0);
  metric("llamacpp:predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.",
         m.decode_seconds > 0 ? static_cast<double>(m.generated_tokens) / m.decode_seconds : 0.0);
  metric("llamacpp:requests_processing", "gauge", "Number of requests processing.", m.active);
  metric("llamacpp:requests_deferred", "gauge", "Number of requests waiting to join the batch.", m.queued);
  metric("pico:tokens_in_flight", "gauge", "KV positions held by active sequences.",
         static_cast<double>(m.tokens_in_flight));
  metric("pico:kept_sequences", "gauge", "Idle sequences whose KV is kept for prompt-prefix reuse.",
         m.kept_sequences);
  metric("pico:kept_tokens", "gauge", "KV positions held by the kept sequences.", static_cast<double>(m.kept_tokens));
  metric("pico:steps_total", "counter", "Pipeline steps completed.", static_cast<double>(m.steps));
  metric("pico:failovers_total", "counter", "Lost workers replaced by a replica.",
         static_cast<double>(m.timings.failovers));
  metric("pico:handed_over_sequences_total", "counter",
         "Sequences whose state moved to another worker of their stage by snapshot and restore (no replay).",
         static_cast<double>(m.timings.handed_over_sequences));
  metric("pico:replayed_tokens_total", "counter", "Positions computed again on replicas after a failover.",
         static_cast<double>(m.replayed_tokens));
  metric("pico:standby_copies_total", "counter",
         "Sequence states copied to standing-by replicas (--standby-copies), for a shorter replay after a loss.",
         static_cast<double>(m.timings.standby_copies));
  metric("pico:standby_copy_bytes_total", "counter", "Bytes of the sequence states copied to standbys.",
         static_cast<double>(m.timings.standby_copy_bytes));
  metric("pico:standby_copy_seconds_total", "counter",
         "Seconds generation waited while states were copied to standbys.",
         m.timings.standby_copy_seconds);
  metric("pico:resumed_sequences_total", "counter",
         "Sequences that resumed after a failover from a standby's copy, or on the workers of their lane that "
         "kept them, replaying only what came after.",
         static_cast<double>(m.resumed_sequences));
  metric("pico:resumed_tokens_total", "counter",
         "Positions not computed again after a failover (standby copies, lanes that kept their workers).",
         static_cast<double>(m.resumed_tokens));
  metric("pico:checkpoints", "gauge", "Recurrent-state checkpoints the sequences hold (hybrid models).",
         static_cast<double>(m.checkpoints));
  metric("pico:checkpoint_bytes", "gauge", "Bytes of those checkpoints over every stage.",
         static_cast<double>(m.checkpoint_bytes));
  // Per stage, as reported by the stages when the engine was last idle.
  auto stage_metric = [&](const char* name, const char* help, auto field) {
    o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " gauge\n";
    for (size_t i = 0; i < m.stages.size(); ++i) {
      o << name << "{stage=\"" << i << "\"} " << static_cast<double>(field(m.stages[i])) << '\n';
    }
  };
  stage_metric("pico:stage_memory_bytes", "Resident bytes of the stage.", [](const StageStats& x) { return x.memory_bytes; });
  stage_metric("pico:stage_free_memory_bytes",
               "Memory the stage's process may still fill: its cgroup's room or MemAvailable, the less.",
               [](const StageStats& x) { return x.free_bytes; });
  stage_metric("pico:stage_kv_bytes", "Bytes of the sequence state on the stage: KV cache, recurrent state, checkpoints.",
               [](const StageStats& x) { return x.kv_bytes; });
  stage_metric("pico:stage_recurrent_bytes", "Of those, the recurrent states of a hybrid's linear layers and their checkpoints.",
               [](const StageStats& x) { return x.recurrent_bytes; });
  stage_metric("pico:stage_checkpoint_bytes", "Of those, the checkpoints.",
               [](const StageStats& x) { return x.checkpoint_bytes; });
  stage_metric("pico:stage_batches", "Batches the stage has run.", [](const StageStats& x) { return x.batches; });
  stage_metric("pico:stage_tokens", "Tokens the stage has run.", [](const StageStats& x) { return x.tokens; });
  stage_metric("pico:stage_sequences", "Sequences open on the stage.", [](const StageStats& x) { return x.sequences; });
  // Where the time of finished steps went, per stage (Pipeline::timings): counters that
  // grow with every step, in the coordinator's clock.
  {
    const auto precision = o.precision(12);
    auto timing_metric = [&](const char* name, const char* help, auto field) {
      o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " counter\n";
      for (size_t i = 0; i < m.timings.stages.size(); ++i) {
        const auto& t = m.timings.stages[i];
        o << name << "{stage=\"" << i << "\",layers=\"" << t.layers.first << '-' << t.layers.last - 1 << "\"} "
          << static_cast<double>(field(t)) << '\n';
      }
    };
    using Totals = StageTimingTotals;
    timing_metric("pico_stage_compute_seconds_total", "Seconds the stage spent running its layers.",
                  [](const Totals& t) { return t.compute_seconds; });
    timing_metric("pico_stage_queue_seconds_total",
                  "Seconds inputs waited while the stage was busy with earlier batches.",
                  [](const Totals& t) { return t.queue_seconds; });
    timing_metric("pico_stage_transfer_seconds_total",
                  "Seconds the stage's inputs spent in transit (from the coordinator for stage 0, "
                  "else from the stage before).",
                  [](const Totals& t) { return t.transfer_seconds; });
    timing_metric("pico_stage_batches_total", "Batches the stage has run.", [](const Totals& t) { return t.batches; });
    timing_metric("pico_stage_tokens_total", "Tokens the stage has run.", [](const Totals& t) { return t.tokens; });
    // Where each stage runs: an info gauge (always 1) whose labels say it, as Prometheus
    // exporters publish versions; and the device's memory.
    o << "# HELP pico:stage_info Backend, CPU level and device of each stage.\n# TYPE pico:stage_info gauge\n";
    for (size_t i = 0; i < m.timings.stages.size(); ++i) {
      const auto& t = m.timings.stages[i];
      o << "pico:stage_info{stage=\"" << i << "\",layers=\"" << t.layers.first << '-' << t.layers.last - 1
        << "\",backend=\"" << label_value(t.backend.empty() ? "cpu" : t.backend) << "\",isa=\"" << label_value(t.isa)
        << "\",device=\"" << label_value(t.device) << "\"} 1\n";
    }
    o << "# HELP pico:stage_device_memory_bytes Memory of the stage's compute device (0 on the CPU).\n"
         "# TYPE pico:stage_device_memory_bytes gauge\n";
    for (size_t i = 0; i < m.timings.stages.size(); ++i) {
      o << "pico:stage_device_memory_bytes{stage=\"" << i << "\"} "
        << static_cast<double>(m.timings.stages[i].device_memory_bytes) << '\n';
    }
    metric("pico_logits_transfer_seconds_total", "counter", "Seconds logits spent in transit from the last stage.",
           m.timings.logits_transfer_seconds);
    o.precision(precision);
  }
  const std::string type = "text/plain; version=0.0.4";
  co_await s.reply_text(200, type, o.str());
}

}  // namespace pico::coordinator::http_api
