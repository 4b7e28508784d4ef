// libFuzzer target: the GGUF reader on arbitrary bytes.
//
// Each input is opened with Model::open_memory (no temporary files), then every
// metadata value is rendered and every tensor's bytes are read (swapped first for a
// file of the other byte order), so ASan sees any read outside the input. A
// FormatError is the expected outcome for bad input; any other exception, crash,
// sanitizer report, leak, or a run past -rss_limit_mb is a finding.
//
// Short run (as ctest's fuzz_gguf_reader test does):
//   scripts/fuzz-gguf            # 60 s
// Long run (by hand; the corpus keeps growing between runs):
//   scripts/fuzz-gguf 3600
// or, step by step, in a clang build:
//   CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DPICO_ENGINE_ONLY=ON \
//       -DPICO_FUZZ=ON -DPICO_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
//   ninja -C build-fuzz gguf_reader_fuzz gguf_fuzz_seeds
//   build-fuzz/tests/fuzz/gguf_fuzz_seeds build-fuzz/corpus
//   build-fuzz/tests/fuzz/gguf_reader_fuzz -max_total_time=3600 -max_len=65536 \
//       -jobs=2 -workers=2 -artifact_prefix=build-fuzz/ build-fuzz/corpus
// A crash leaves its input as build-fuzz/crash-<sha1>; replay it with
//   build-fuzz/tests/fuzz/gguf_reader_fuzz build-fuzz/crash-<sha1>
#include <cstddef>
#include <cstdint>
#include <span>

#include "gguf/reader.hpp"

namespace {

volatile uint64_t g_sink;  // keeps the reads of tensor bytes from being optimized out

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto model = pico::gguf::Model::open_memory(std::span<const uint8_t>(data, size), "fuzz-input.gguf");
    uint64_t sum = model->version() + model->alignment();
    for (const auto& [key, value] : model->metadata().entries()) {
      sum += key.size() + pico::gguf::to_display_string(value, 4).size();
    }
    for (const pico::gguf::TensorInfo& tensor : model->tensors()) {
      const std::span<const uint8_t> bytes = model->tensor_data(tensor);
      if (bytes.size() != tensor.bytes) __builtin_trap();
      for (uint8_t byte : bytes) sum += byte;
      if (model->find_tensor(tensor.name) != &tensor) __builtin_trap();
    }
    g_sink = sum;
  } catch (const pico::gguf::FormatError&) {
    // The reader refused the input: the outcome wanted for malformed bytes.
  }
  return 0;
}
