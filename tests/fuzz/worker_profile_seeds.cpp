// Writes worker_profile_fuzz's seed corpus: profiles as pico-worker caches them (CPU
// and device, a few layers and none).
//   worker_profile_fuzz_seeds DIR
#include <string>

#include "profile.hpp"
#include "seed_corpus.hpp"

int main(int argc, char** argv) {
  return pico::fuzz::seed_corpus_main(argc, argv, [](const std::filesystem::path& dir) {
    pico::worker::WorkerProfile p;
    p.model_hash = 0xabcdef0123456789ULL;
    p.backend = "cpu";
    p.isa = "avx2";
    p.threads = 4;
    p.batch = 64;
    p.batches = pico::worker::profile_batches(64);
    p.head = {2e-3, {1e-3, 9e-4, 8e-4, 7e-4, 6e-4, 5e-4}};
    for (int layers : {0, 1, 4}) {
      p.layers.assign(static_cast<size_t>(layers), {1e-3, {5e-4, 3e-4, 2e-4, 1.5e-4, 1.2e-4, 1e-4}});
      const std::string json = pico::worker::profile_to_json(p);
      pico::fuzz::write_seed(dir / ("cpu-" + std::to_string(layers)),
                             {reinterpret_cast<const uint8_t*>(json.data()), json.size()});
    }
    p.backend = "vulkan";
    p.device = "llvmpipe, Mesa";
    p.device_index = 1;
    const std::string json = pico::worker::profile_to_json(p);
    pico::fuzz::write_seed(dir / "vulkan", {reinterpret_cast<const uint8_t*>(json.data()), json.size()});
  });
}
