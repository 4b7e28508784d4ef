#include "profile.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "backend/devices.hpp"
#include "cpu/cpu_features.hpp"

namespace pico::worker {

namespace {

// A layer's kind: the names (after "blk.N."), types and shapes of its tensors.
std::vector<std::string> layer_kinds(const gguf::Model& file, int32_t n_layer) {
  std::vector<std::vector<std::string>> parts(static_cast<size_t>(n_layer));
  for (const auto& t : file.tensors()) {
    if (t.name.rfind("blk.", 0) != 0) continue;
    const size_t dot = t.name.find('.', 4);
    const int layer = std::atoi(t.name.c_str() + 4);
    if (dot == std::string::npos || layer < 0 || layer >= n_layer) continue;
    std::string part = t.name.substr(dot + 1) + ":" + std::to_string(static_cast<int>(t.type));
    for (uint64_t d : t.shape) part += "x" + std::to_string(d);
    parts[static_cast<size_t>(layer)].push_back(part);
  }
  std::vector<std::string> kinds;
  for (auto& p : parts) {
    std::sort(p.begin(), p.end());
    std::string kind;
    for (const auto& s : p) kind += s + ";";
    kinds.push_back(kind);
  }
  return kinds;
}

// 2: each timed run after the CPU's cache was evicted (CacheEvictor). 3: batches of 2,
// 4, 8 ... tokens besides the largest. A profile of an older version is measured anew.
constexpr int kProfileVersion = 3;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// Runs `run` and returns its time: its wall time, and under a CPU quota (CPUs, > 0)
// at least the CPU time it took over the quota, what it takes once the quota binds
// (every thread's: a CPU backend's pool, a CPU driver's).
template <class Run>
double timed(double cpu_quota, Run&& run) {
  const double cpu_before = process_cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  run();
  const double wall = seconds_since(t0);
  return cpu_quota > 0 ? std::max(wall, (process_cpu_seconds() - cpu_before) / cpu_quota) : wall;
}

// Copies a buffer larger than the CPU's last-level cache, so that the next timed run
// finds none of the layer's weights there: a forward over a model larger than the
// cache reads each layer from memory, and a layer timed again and again would come
// from the cache. Twice the L3 the C library reports, 64 MiB at least.
class CacheEvictor {
 public:
  CacheEvictor() {
    long l3 = 0;
#ifdef _SC_LEVEL3_CACHE_SIZE
    l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
    const size_t bytes = std::max<size_t>(size_t{64} << 20, 2 * static_cast<size_t>(std::max(l3, 0L)));
    from_.assign(bytes / 2, 1);
    to_.assign(bytes / 2, 0);
  }
  // A copy: one call the sanitizers check as a range (a loop of loads under ASan took
  // seconds a profile, past the coordinator's wait for a worker's hello).
  void evict() { std::memcpy(to_.data(), from_.data(), from_.size()); }

 private:
  std::vector<uint8_t> from_, to_;
};

// Times a stage of `range` alone: prefills of each of `batches` tokens (fresh
// sequences), then decode steps of one token after a prefill of options.batch tokens.
// logits: every token asks for its logits (the head runs: the last stage's rows at a
// concurrency of that many sequences), else none does. An untimed prefill first (a
// device compiles its pipelines on first use); then at least one of each measure, more
// up to options.repeats / decode_tokens while they take less than
// options.budget_seconds; each timed run after the cache was evicted.
LayerTime time_range(const model::Model& m, backend::Backend& be, model::LayerRange range, bool logits,
                     const ProfileOptions& o, const std::vector<int>& batches, CacheEvictor& evictor) {
  const int64_t n_embd = m.hparams().n_embd, n_vocab = m.hparams().n_vocab;
  auto cache = m.make_cache(range, GgmlType::F16, GgmlType::F16, backend::state_stores_of(be));
  std::vector<float> hidden(static_cast<size_t>(o.batch) * static_cast<size_t>(n_embd));
  for (size_t i = 0; i < hidden.size(); ++i) hidden[i] = static_cast<float>(static_cast<int>(i * 7919 % 201) - 100) / 100;
  const float* input = range.first == 0 ? nullptr : hidden.data();
  const auto token = [&](int64_t i) { return static_cast<int32_t>(1 + (i * 7919) % std::max<int64_t>(1, n_vocab - 1)); };
  const auto prefill = [&](int32_t seq, int tokens) {
    std::vector<model::BatchToken> batch;
    for (int i = 0; i < tokens; ++i) batch.push_back({seq, i, token(i), logits});
    evictor.evict();
    return timed(o.cpu_quota, [&] { m.forward(be, batch, input, range, *cache); });
  };
  prefill(0, o.batch);  // warm-up; seq 0 then decodes
  LayerTime out;
  int32_t seq = 1;
  for (const int tokens : batches) {
    std::vector<double> per_token;
    double spent = 0;
    for (int r = 1; r <= o.repeats && (r == 1 || spent < o.budget_seconds); ++r, ++seq) {
      const double t = prefill(seq, tokens);
      spent += t;
      per_token.push_back(t / tokens);
      cache->remove(seq);
    }
    out.seconds_per_token.push_back(median(per_token));
  }
  std::vector<double> decodes;
  double spent = 0;
  for (int i = 0; i < o.decode_tokens && (i == 0 || spent < o.budget_seconds); ++i) {
    const model::BatchToken one{0, o.batch + i, token(o.batch + i), logits};
    evictor.evict();
    decodes.push_back(timed(o.cpu_quota, [&] { m.forward(be, std::span(&one, 1), input, range, *cache); }));
    spent += decodes.back();
  }
  out.decode_seconds = median(decodes);
  return out;
}

// Throws std::invalid_argument unless the time has one finite, non-negative time per
// batch besides its decode's.
void check_time(const LayerTime& t, size_t batches, const std::string& what) {
  const auto good = [](double v) { return v >= 0 && std::isfinite(v); };
  if (t.seconds_per_token.size() != batches) {
    throw std::invalid_argument(what + " has " + std::to_string(t.seconds_per_token.size()) + " batch times, not " +
                                std::to_string(batches));
  }
  if (!good(t.decode_seconds) || !std::all_of(t.seconds_per_token.begin(), t.seconds_per_token.end(), good)) {
    throw std::invalid_argument(what + " has a negative or non-finite time");
  }
}

std::string cache_dir() {
  if (const char* dir = std::getenv("PICO_CACHE_DIR"); dir && *dir) return dir;
  if (const char* dir = std::getenv("XDG_CACHE_HOME"); dir && *dir) return std::string(dir) + "/pico";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.cache/pico";
  return "/tmp/pico-cache";
}

}  // namespace

std::vector<int> profile_batches(int batch) {
  std::vector<int> out;
  for (int b = 2; b < batch; b *= 2) out.push_back(b);
  out.push_back(batch);
  return out;
}

WorkerProfile measure_profile(const gguf::Model& file, const model::Model& m, const StageBackendOptions& backend,
                              int threads, const ProfileOptions& options) {
  if (options.batch <= 0 || options.decode_tokens <= 0 || options.repeats <= 0) {
    throw std::invalid_argument("profile: batch, decode tokens and repeats must be positive");
  }
  const int32_t n_layer = static_cast<int32_t>(m.hparams().n_layer);
  WorkerProfile p;
  p.model_hash = protocol::model_identity(file).hash;
  p.backend = backend.name;
  p.device_index = backend.device;
  p.isa = std::string(cpu::level_name(cpu::best_level()));
  p.threads = threads;
  p.batch = options.batch;
  p.batches = profile_batches(options.batch);
  std::unique_ptr<backend::Backend> be = backend::open_backend(backend.name, backend.device, threads);
  if (backend.name != "cpu") {
    for (const backend::ComputeDevice& d : backend::list_compute_devices().devices) {
      if (d.backend == backend.name && d.index == static_cast<uint32_t>(backend.device)) p.device = d.name + ", " + d.driver;
    }
  }
  const std::vector<std::string> kinds = layer_kinds(file, n_layer);
  std::map<std::string, LayerTime> measured;
  CacheEvictor evictor;
  p.layers.resize(static_cast<size_t>(n_layer));
  const auto start = std::chrono::steady_clock::now();
  for (int32_t l = 0; l < n_layer; ++l) {
    const std::string& kind = kinds[static_cast<size_t>(l)];
    auto it = measured.find(kind);
    if (it == measured.end()) {
      m.load_weights(*be, {l, l + 1});
      it = measured.emplace(kind, time_range(m, *be, {l, l + 1}, false, options, p.batches, evictor)).first;
    }
    p.layers[static_cast<size_t>(l)] = it->second;
  }
  // The head: the last layer with the logits of every token, less the layer alone.
  const model::LayerRange last{n_layer - 1, n_layer};
  const LayerTime without = p.layers.back();
  const LayerTime with = time_range(m, *be, last, true, options, p.batches, evictor);
  p.head.decode_seconds = std::max(0.0, with.decode_seconds - without.decode_seconds);
  for (size_t b = 0; b < p.batches.size(); ++b) {
    p.head.seconds_per_token.push_back(std::max(0.0, with.seconds_per_token[b] - without.seconds_per_token[b]));
  }
  spdlog::info("profile: {} kinds of layer measured in {:.2f} s", measured.size(), seconds_since(start));
  return p;
}

uint64_t offered_memory_bytes(const StageBackendOptions& backend, uint64_t device_memory_bytes) {
  if (backend.name != "cpu") return backend.memory ? std::min(*backend.memory, device_memory_bytes) : device_memory_bytes;
  const uint64_t available = available_memory_bytes();
  return available - available / 10;
}

std::string profile_cache_path(uint64_t model_hash, const StageBackendOptions& backend, int threads, int batch,
                               double cpu_quota) {
  const std::string isa(cpu::level_name(cpu::best_level()));
  return fmt::format("{}/profiles/{:016x}-{}{}-{}-t{}-b{}{}.json", cache_dir(), model_hash, backend.name,
                     backend.name == "cpu" ? std::string() : std::to_string(backend.device), isa, threads, batch,
                     cpu_quota > 0 ? fmt::format("-q{:.3f}", cpu_quota) : std::string());
}

std::string profile_to_json(const WorkerProfile& p) {
  nlohmann::json j;
  j["version"] = kProfileVersion;
  j["model_hash"] = fmt::format("{:016x}", p.model_hash);
  j["backend"] = p.backend;
  j["device_index"] = p.device_index;
  j["device"] = p.device;
  j["isa"] = p.isa;
  j["threads"] = p.threads;
  j["batch"] = p.batch;
  j["batches"] = p.batches;
  j["head"] = {p.head.decode_seconds, p.head.seconds_per_token};
  nlohmann::json layers = nlohmann::json::array();
  for (const LayerTime& t : p.layers) layers.push_back({t.decode_seconds, t.seconds_per_token});
  j["layers"] = layers;
  return j.dump(1);
}

WorkerProfile profile_from_json(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw std::invalid_argument("not a JSON object");
  const auto need = [&](const char* key) -> const nlohmann::json& {
    if (!j.contains(key)) throw std::invalid_argument(std::string("no '") + key + "'");
    return j.at(key);
  };
  const auto time = [](const nlohmann::json& pair, size_t batches, const std::string& what) {
    if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number() || !pair[1].is_array() ||
        pair[1].size() != batches ||
        !std::all_of(pair[1].begin(), pair[1].end(), [](const nlohmann::json& v) { return v.is_number(); })) {
      throw std::invalid_argument(what + " is not [decode seconds, [seconds per token of each batch]]");
    }
    LayerTime t{pair[0].get<double>(), pair[1].get<std::vector<double>>()};
    check_time(t, batches, what);
    return t;
  };
  // A whole number within [0, 2^20] (nlohmann would convert a float or a huge value).
  const auto small_integer = [&](const char* key) {
    const nlohmann::json& v = need(key);
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (1 << 20)) {
      throw std::invalid_argument(std::string("'") + key + "' is not an integer in [0, 2^20]");
    }
    return static_cast<int>(v.get<int64_t>());
  };
  try {
    if (need("version") != kProfileVersion)
      throw std::invalid_argument("version is not " + std::to_string(kProfileVersion) + " (measured another way)");
    WorkerProfile p;
    const std::string hash = need("model_hash").get<std::string>();
    if (hash.size() != 16 || hash.find_first_not_of("0123456789abcdef") != std::string::npos) {
      throw std::invalid_argument("model_hash is not 16 hexadecimal digits");
    }
    p.model_hash = std::stoull(hash, nullptr, 16);
    p.backend = need("backend").get<std::string>();
    p.device_index = small_integer("device_index");
    p.device = need("device").get<std::string>();
    p.isa = need("isa").get<std::string>();
    p.threads = small_integer("threads");
    p.batch = small_integer("batch");
    if (p.batch <= 0) throw std::invalid_argument("batch is not positive");
    const nlohmann::json& batches = need("batches");
    if (!batches.is_array() || batches != nlohmann::json(profile_batches(p.batch))) {
      throw std::invalid_argument("batches are not 2, 4, 8 ... up to the batch");
    }
    p.batches = profile_batches(p.batch);
    p.head = time(need("head"), p.batches.size(), "head");
    const nlohmann::json& layers = need("layers");
    if (!layers.is_array()) throw std::invalid_argument("layers is not an array");
    for (size_t i = 0; i < layers.size(); ++i) p.layers.push_back(time(layers[i], p.batches.size(), "layer " + std::to_string(i)));
    return p;
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(e.what());
  } catch (const std::logic_error& e) {  // stoull; invalid_argument passes through as itself
    throw std::invalid_argument(e.what());
  }
}

std::optional<WorkerProfile> load_profile(const std::string& path, uint64_t model_hash, int32_t n_layer,
                                          const std::string& device) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  try {
    WorkerProfile p = profile_from_json(text.str());
    if (p.model_hash != model_hash || p.layers.size() != static_cast<size_t>(n_layer) || p.device != device) {
      throw std::invalid_argument("it is another model's or device's");
    }
    return p;
  } catch (const std::invalid_argument& e) {
    spdlog::warn("profile cache {}: {}; measuring anew", path, e.what());
    return std::nullopt;
  }
}

void save_profile(const std::string& path, const WorkerProfile& profile) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  const std::string temporary = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(temporary);
    out << profile_to_json(profile);
    if (!out) {
      spdlog::warn("profile cache {}: cannot write it", path);
      std::filesystem::remove(temporary, ec);
      return;
    }
  }
  std::filesystem::rename(temporary, path, ec);
  if (ec) spdlog::warn("profile cache {}: {}", path, ec.message());
}

std::string format_profile(const WorkerProfile& p) {
  std::string out = fmt::format("profile of model {:016x} on {} ({}{}), {} threads; ms per token\n", p.model_hash,
                                p.backend, p.isa, p.device.empty() ? "" : ", " + p.device, p.threads);
  out += fmt::format("{:<12} {:>10}", "layers", "decode");
  for (const int b : p.batches) out += fmt::format(" {:>10}", fmt::format("batch {}", b));
  out += "\n";
  const auto row = [&](const std::string& name, const LayerTime& t) {
    out += fmt::format("{:<12} {:>10.4f}", name, t.decode_seconds * 1e3);
    for (const double s : t.seconds_per_token) out += fmt::format(" {:>10.4f}", s * 1e3);
    out += "\n";
  };
  // Runs of layers with the same times (one kind of layer measured once).
  size_t i = 0;
  while (i < p.layers.size()) {
    size_t j = i + 1;
    while (j < p.layers.size() && p.layers[j].decode_seconds == p.layers[i].decode_seconds &&
           p.layers[j].seconds_per_token == p.layers[i].seconds_per_token) {
      ++j;
    }
    row(j - i == 1 ? std::to_string(i) : fmt::format("{}-{}", i, j - 1), p.layers[i]);
    i = j;
  }
  row("head", p.head);
  out += fmt::format("memory offered for weights + KV + state: {} bytes ({:.0f} MiB)\n", p.memory_bytes,
                     static_cast<double>(p.memory_bytes) / (1 << 20));
  return out;
}

namespace {

void write_time(const LayerTime& t, protocol::schema::LayerTime::Builder out) {
  out.setDecodeSeconds(t.decode_seconds);
  out.setBatchSecondsPerToken(t.seconds_per_token.empty() ? 0.0 : t.seconds_per_token.back());
  auto per_token = out.initSecondsPerToken(static_cast<unsigned>(t.seconds_per_token.size()));
  for (size_t b = 0; b < t.seconds_per_token.size(); ++b) per_token.set(static_cast<unsigned>(b), t.seconds_per_token[b]);
}

LayerTime read_time(protocol::schema::LayerTime::Reader in, size_t batches, const std::string& what) {
  LayerTime t;
  t.decode_seconds = in.getDecodeSeconds();
  for (const double s : in.getSecondsPerToken()) t.seconds_per_token.push_back(s);
  check_time(t, batches, "profile: " + what);
  return t;
}

}  // namespace

void write_profile(const WorkerProfile& p, protocol::schema::Profile::Builder out) {
  out.setBatch(static_cast<uint32_t>(p.batch));
  out.setMemoryBytes(p.memory_bytes);
  auto batches = out.initBatches(static_cast<unsigned>(p.batches.size()));
  for (size_t b = 0; b < p.batches.size(); ++b) batches.set(static_cast<unsigned>(b), static_cast<uint32_t>(p.batches[b]));
  write_time(p.head, out.initHead());
  auto layers = out.initLayers(static_cast<unsigned>(p.layers.size()));
  for (size_t i = 0; i < p.layers.size(); ++i) write_time(p.layers[i], layers[static_cast<unsigned>(i)]);
}

std::optional<WorkerProfile> read_profile(protocol::schema::Profile::Reader in, int32_t n_layer) {
  if (in.getBatch() == 0) return std::nullopt;
  if (in.getBatch() > (1u << 20)) throw std::invalid_argument("profile: a batch of " + std::to_string(in.getBatch()) + " tokens");
  if (in.getLayers().size() != static_cast<unsigned>(n_layer)) {
    throw std::invalid_argument("profile: " + std::to_string(in.getLayers().size()) + " layers, the model has " +
                                std::to_string(n_layer));
  }
  WorkerProfile p;
  p.batch = static_cast<int>(in.getBatch());
  p.batches = profile_batches(p.batch);
  std::vector<int> batches;
  for (const uint32_t b : in.getBatches()) batches.push_back(static_cast<int>(b));
  if (batches != p.batches) throw std::invalid_argument("profile: its batches are not 2, 4, 8 ... up to its batch");
  p.memory_bytes = in.getMemoryBytes();
  p.head = read_time(in.getHead(), p.batches.size(), "the head");
  for (unsigned i = 0; i < in.getLayers().size(); ++i) {
    p.layers.push_back(read_time(in.getLayers()[i], p.batches.size(), "layer " + std::to_string(i)));
  }
  return p;
}

}  // namespace pico::worker
