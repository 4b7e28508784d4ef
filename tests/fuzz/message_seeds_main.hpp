// The seed programs of the message targets: every seed_messages() message, one file
// each, in the target's input format (fuzz_frames.hpp; the worker target's inputs
// start with the stage byte). Valid restore states come from a real stage of the fuzz
// model after a short forward.
#pragma once

#include <filesystem>
#include <string>

#include "fuzz_frames.hpp"
#include "message_seeds.hpp"
#include "seed_corpus.hpp"
#include "stage_engine.hpp"

namespace pico::fuzz {

inline int write_message_seeds(int argc, char** argv, bool stage_byte) {
  return seed_corpus_main(argc, argv, [stage_byte](const std::filesystem::path& dir) {
    const auto model_dir = std::filesystem::temp_directory_path() / ("pico-fuzz-seeds-" + std::to_string(::getpid()));
    const std::string model = write_fuzz_model(model_dir).string();
    std::vector<uint8_t> snapshots[2];
    for (int stage = 0; stage < 2; ++stage) {
      worker::StageEngine engine(model, model::LayerRange{stage, stage + 1}, 1);
      const std::vector<float> hidden = fuzz_hidden(2);
      const model::BatchToken batch[2] = {{3, 0, 4, true}, {3, 1, 5, true}};
      engine.forward(batch, stage == 0 ? nullptr : hidden.data());
      snapshots[stage] = engine.snapshot(3).value().bytes;
    }
    std::filesystem::remove_all(model_dir);
    for (const SeedMessage& m : seed_messages(snapshots)) {
      std::vector<uint8_t> input = encode_frames(m.frames);
      if (stage_byte) input.insert(input.begin(), static_cast<uint8_t>(m.stage));
      write_seed(dir / ("seed-" + m.name), input);
    }
  });
}

}  // namespace pico::fuzz
