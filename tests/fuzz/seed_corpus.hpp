// What every seed program shares: `PROGRAM CORPUS_DIR` creates the directory and
// writes the target's seeds into it; an error is printed and fails the program (the
// fuzz run then stops before fuzzing without its seeds).
#pragma once

#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <span>

namespace pico::fuzz {

inline void write_seed(const std::filesystem::path& file, std::span<const uint8_t> bytes) {
  std::ofstream(file, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// write_seeds(const std::filesystem::path& dir) writes the corpus.
template <class WriteSeeds>
int seed_corpus_main(int argc, char** argv, WriteSeeds&& write_seeds) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  try {
    const std::filesystem::path dir = argv[1];
    std::filesystem::create_directories(dir);
    write_seeds(dir);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s: %s\n", argv[0], error.what());
    return 1;
  }
  return 0;
}

}  // namespace pico::fuzz
