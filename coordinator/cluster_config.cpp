#include "cluster_config.hpp"

#include <toml++/toml.h>

#include <climits>
#include <filesystem>
#include <sstream>
#include <stdexcept>

#include "curve.hpp"
#include "stage_engine.hpp"

namespace pico::coordinator {

namespace {

// A path in the file, relative to the file's folder unless absolute.
std::string relative_to(const std::string& config_path, const std::string& path) {
  const std::filesystem::path p(path);
  if (p.is_absolute()) return path;
  return (std::filesystem::path(config_path).parent_path() / p).string();
}

}  // namespace

void check_security(const std::vector<WorkerEntry>& workers, bool have_secret_key) {
  const WorkerEntry* keyed = nullptr;
  const WorkerEntry* open = nullptr;
  for (const auto& w : workers) (w.public_key.empty() ? open : keyed) = &w;
  if (keyed && open) {
    throw std::invalid_argument("worker " + keyed->address + " has a public key and worker " + open->address +
                                " has none: a cluster's links are all CURVE or all open");
  }
  if (keyed && !have_secret_key) {
    throw std::invalid_argument("workers with public keys need this coordinator's --secret-key ([security] secret_key)");
  }
  if (have_secret_key && workers.empty()) {
    throw std::invalid_argument("--secret-key is for the links to workers, and there are none (in-process run)");
  }
  if (!keyed && have_secret_key) {
    throw std::invalid_argument("--secret-key needs each worker's public key (--worker-key per --worker, or "
                                "public_key in [[worker]])");
  }
}

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
      if (auto memory = (*w)["memory"].value<std::string>()) {
        try {
          e.memory = worker::parse_byte_size(*memory);
        } catch (const std::exception& ex) {
          throw std::runtime_error(path + ": worker " + e.address + ": memory: " + ex.what());
        }
      } else if ((*w).contains("memory")) {
        throw std::runtime_error(path + ": worker " + e.address + ": memory must be a string such as \"6G\"");
      }
      if (auto key = (*w)["public_key"].value<std::string>()) {
        try {
          e.public_key = net::is_z85_key(*key) ? *key : net::read_public_key_file(relative_to(path, *key));
        } catch (const std::exception& ex) {
          throw std::runtime_error(path + ": worker " + e.address + ": public_key: " + ex.what());
        }
      } else if ((*w).contains("public_key")) {
        throw std::runtime_error(path + ": worker " + e.address + ": public_key must be a string");
      }
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
  if (auto* sec = t["security"].as_table()) {
    for (const auto& [key, value] : *sec) {
      if (key.str() != "secret_key") throw std::runtime_error(path + ": [security] has no key '" + std::string(key.str()) + "'");
    }
    auto secret = (*sec)["secret_key"].value<std::string>();
    if (!secret) throw std::runtime_error(path + ": [security] secret_key must be the path of a secret key file");
    c.secret_key = relative_to(path, *secret);
  }
  return c;
}

}  // namespace pico::coordinator
