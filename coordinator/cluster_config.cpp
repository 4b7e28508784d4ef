#include "cluster_config.hpp"

#include <toml++/toml.h>

#include <climits>
#include <sstream>
#include <stdexcept>

#include "stage_engine.hpp"

namespace pico::coordinator {

ClusterConfig load_cluster_config(const std::string& path) {
  toml::table t;
  try {
    t = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << path << ":" << e.source().begin.line << ": " << e.description();
    throw std::runtime_error(os.str());
  }
  ClusterConfig c;
  if (auto* workers = t["worker"].as_array()) {
    for (auto& node : *workers) {
      auto* w = node.as_table();
      if (!w) throw std::runtime_error(path + ": [[worker]] entries must be tables");
      WorkerEntry e;
      auto address = (*w)["address"].value<std::string>();
      if (!address) throw std::runtime_error(path + ": a [[worker]] has no address");
      e.address = *address;
      if (auto layers = (*w)["layers"].value<std::string>()) e.layers = worker::parse_layers(*layers);
      c.workers.push_back(std::move(e));
    }
  }
  if (auto* s = t["scheduler"].as_table()) {
    if (auto v = (*s)["micro_batch"].value<int>()) c.micro_batch = *v;
    if (auto v = (*s)["max_batch_tokens"].value<int>()) c.max_batch_tokens = *v;
    if (auto v = (*s)["activations"].value<std::string>()) c.activations = *v;
    if (auto v = (*s)["chain_steps"].value<int>()) {
      if (*v < 0) throw std::runtime_error(path + ": [scheduler] chain_steps must not be negative");
      c.chain_steps = *v;
    }
    // Integers only (toml++'s value<int64_t>() would also take true as 1).
    if (auto node = (*s)["ctx"]; node) {
      const auto v = node.is_integer() ? node.value<int64_t>() : std::nullopt;
      if (!v || *v <= 0 || *v > INT32_MAX)
        throw std::runtime_error(path + ": [scheduler] ctx must be a positive integer");
      c.ctx = *v;
    }
    if (auto node = (*s)["parallel"]; node) {
      const auto v = node.is_integer() ? node.value<int64_t>() : std::nullopt;
      if (!v || *v <= 0 || *v > 65536) {
        throw std::runtime_error(path + ": [scheduler] parallel must be an integer from 1 to 65536");
      }
      c.parallel = static_cast<int>(*v);
    }
  }
  return c;
}

}  // namespace pico::coordinator
