// libFuzzer target: worker::profile_from_json on arbitrary bytes (a profile cache file,
// which pico-worker reads at start). A refused file must throw std::invalid_argument
// (nothing else); an accepted one has only finite, non-negative times and a positive
// batch, and writing it out and reading it back gives the same profile. Seeds:
// worker_profile_fuzz_seeds (profiles as pico-worker writes them).
//   scripts/fuzz worker_profile [SECONDS]
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "profile.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  pico::worker::WorkerProfile p;
  try {
    p = pico::worker::profile_from_json(text);
  } catch (const std::invalid_argument&) {
    return 0;
  }
  const auto good = [&](const pico::worker::LayerTime& t) {
    const auto time = [](double s) { return std::isfinite(s) && s >= 0; };
    return time(t.decode_seconds) && t.seconds_per_token.size() == p.batches.size() &&
           std::all_of(t.seconds_per_token.begin(), t.seconds_per_token.end(), time);
  };
  if (p.batch <= 0 || p.batches != pico::worker::profile_batches(p.batch) || !good(p.head)) std::abort();
  for (const auto& t : p.layers) {
    if (!good(t)) std::abort();
  }
  const pico::worker::WorkerProfile q = pico::worker::profile_from_json(pico::worker::profile_to_json(p));
  if (q.layers.size() != p.layers.size() || q.model_hash != p.model_hash || q.device != p.device ||
      q.batch != p.batch || q.threads != p.threads) {
    std::abort();
  }
  for (size_t i = 0; i < p.layers.size(); ++i) {
    if (q.layers[i].decode_seconds != p.layers[i].decode_seconds ||
        q.layers[i].seconds_per_token != p.layers[i].seconds_per_token) {
      std::abort();
    }
  }
  return 0;
}
