// Writes kv_restore_fuzz's seed corpus: for each configuration of kv_fuzz_configs.hpp,
// the snapshot of an empty state and of one with a few positions (layers of unequal
// lengths too), behind the byte that selects the configuration.
//   kv_restore_fuzz_seeds DIR
#include <filesystem>
#include <string>
#include <vector>

#include "kv_fuzz_configs.hpp"
#include "seed_corpus.hpp"

int main(int argc, char** argv) {
  return pico::fuzz::seed_corpus_main(argc, argv, [](const std::filesystem::path& dir) {
    const auto& configs = pico::fuzz::kv_configs();
    for (size_t c = 0; c < configs.size(); ++c) {
      const auto& config = configs[c];
      for (int positions : {0, 1, 3}) {
        pico::state::KvState state(config);
        std::vector<float> k(static_cast<size_t>(config.n_kv_heads * config.head_dim_k));
        std::vector<float> v(static_cast<size_t>(config.n_kv_heads * config.head_dim_v));
        for (int p = 0; p < positions; ++p) {
          for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<float>(i) * 0.1f - static_cast<float>(p);
          for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(p) - static_cast<float>(i) * 0.2f;
          // The first layer one position ahead of the others at the end: unequal lengths.
          for (int32_t layer = config.first_layer; layer < config.last_layer; ++layer) {
            if (p == positions - 1 && positions > 1 && layer != config.first_layer) continue;
            state.write(layer, p, k.data(), v.data());
          }
        }
        std::vector<uint8_t> input = state.snapshot();
        input.insert(input.begin(), static_cast<uint8_t>(c));
        pico::fuzz::write_seed(dir / ("seed-config" + std::to_string(c) + "-" + std::to_string(positions)), input);
      }
    }
  });
}
