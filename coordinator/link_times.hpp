// What a step's links cost: the measure of a link (latency, bandwidth), the time it
// takes to carry a step's tokens, and the book of links a running coordinator keeps by
// worker address. The placement's cost model and the running coordinator's choice of
// a lane (Pipeline::predicted_step_seconds) both count links this one way, so that the
// lanes serve the share of the streams the placement predicted for them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace pico::coordinator {

struct LinkMeasure {
  double latency_seconds = 0;   // one way
  double bytes_per_second = 0;  // > 0
};

// The time a link takes to carry a step of `tokens` tokens of `bytes_per_token` each.
inline double link_seconds(const LinkMeasure& link, uint64_t bytes_per_token, double tokens) {
  return link.latency_seconds + static_cast<double>(bytes_per_token) * tokens / link.bytes_per_second;
}

// A link between two workers that was not measured, estimated from their links to the
// coordinator: the larger latency, the smaller bandwidth.
inline LinkMeasure estimated_link(const LinkMeasure& a, const LinkMeasure& b) {
  return {std::max(a.latency_seconds, b.latency_seconds), std::min(a.bytes_per_second, b.bytes_per_second)};
}

// The links the coordinator measured, by worker address (cluster_measures), and what a
// step carries per token over each kind of link.
struct LinkBook {
  std::map<std::string, LinkMeasure> coordinator;                      // coordinator <-> worker
  std::map<std::pair<std::string, std::string>, LinkMeasure> between;  // worker -> worker; missing: estimated
  uint64_t input_bytes_per_token = 4;   // coordinator -> first worker
  uint64_t hidden_bytes_per_token = 0;  // worker -> worker
  uint64_t logits_bytes_per_token = 0;  // last worker -> coordinator: a row of logits
  uint64_t argmax_bytes_per_token = 8;  // ... or its arg max alone (protocol LogitsOutput.argmax: id, logit)

  bool knows(const std::string& worker) const { return coordinator.contains(worker); }
  // Takes newer's measures and bytes per token; keeps the links it does not measure (a
  // worker lost now may come back).
  void update(const LinkBook& newer) {
    for (const auto& [worker, link] : newer.coordinator) coordinator[worker] = link;
    for (const auto& [pair, link] : newer.between) between[pair] = link;
    input_bytes_per_token = newer.input_bytes_per_token;
    hidden_bytes_per_token = newer.hidden_bytes_per_token;
    logits_bytes_per_token = newer.logits_bytes_per_token;
    argmax_bytes_per_token = newer.argmax_bytes_per_token;
  }
  // The links' time for a step of `tokens` tokens through `chain` (worker addresses in
  // pipeline order) and back to the coordinator, `full_logits_rows` of them returning
  // a row of logits and the others their arg max (the placement counts every row a
  // row of logits): nullopt when a worker's link to the coordinator was not measured.
  std::optional<double> chain_seconds(const std::vector<std::string>& chain, double tokens,
                                      double full_logits_rows) const;
  std::optional<double> chain_seconds(const std::vector<std::string>& chain, double tokens) const {
    return chain_seconds(chain, tokens, tokens);
  }
};

}  // namespace pico::coordinator
