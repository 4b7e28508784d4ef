#include "cluster_config.hpp"

#include <toml++/toml.h>

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
  }
  return c;
}

}  // namespace pico::coordinator
