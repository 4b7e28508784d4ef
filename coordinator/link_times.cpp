#include "link_times.hpp"

namespace pico::coordinator {

std::optional<double> LinkBook::chain_seconds(const std::vector<std::string>& chain, double tokens,
                                              double full_logits_rows) const {
  if (chain.empty()) return std::nullopt;
  std::vector<const LinkMeasure*> to_coordinator;
  for (const std::string& worker : chain) {
    const auto link = coordinator.find(worker);
    if (link == coordinator.end()) return std::nullopt;
    to_coordinator.push_back(&link->second);
  }
  const LinkMeasure& back = *to_coordinator.back();
  double seconds = link_seconds(*to_coordinator.front(), input_bytes_per_token, tokens) + back.latency_seconds +
                   (static_cast<double>(logits_bytes_per_token) * full_logits_rows +
                    static_cast<double>(argmax_bytes_per_token) * (tokens - full_logits_rows)) /
                       back.bytes_per_second;
  for (size_t i = 0; i + 1 < chain.size(); ++i) {
    const auto measured = between.find({chain[i], chain[i + 1]});
    const LinkMeasure link = measured != between.end() ? measured->second
                                                       : estimated_link(*to_coordinator[i], *to_coordinator[i + 1]);
    seconds += link_seconds(link, hidden_bytes_per_token, tokens);
  }
  return seconds;
}

}  // namespace pico::coordinator
