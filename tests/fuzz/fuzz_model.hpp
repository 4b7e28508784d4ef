// The tiny model the worker fuzz target serves and its seed program writes messages
// for: a synthetic llama (2 layers, embd 32, a 64-token vocabulary made up here, so
// that no tokenizer package is needed) written once into a directory.
#pragma once

#include <filesystem>
#include <string>

#include "synthetic/synthetic_model.hpp"

namespace pico::fuzz {

constexpr int kModelLayers = 2;
constexpr int kModelEmbd = 32;
constexpr int kModelVocab = 64;

inline std::filesystem::path write_fuzz_model(const std::filesystem::path& dir) {
  synthetic::Vocabulary vocab;
  vocab.model = "llama";
  vocab.pre = "default";
  // The last four: fill-in-the-middle tokens (/infill).
  const char* const fim[] = {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|file_sep|>"};
  for (int i = 0; i < kModelVocab; ++i) {
    const bool control = i < 3 || i >= kModelVocab - 4;
    vocab.tokens.push_back(i < 3                  ? std::string(i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>")
                           : i >= kModelVocab - 4 ? std::string(fim[i - (kModelVocab - 4)])
                                                  : "t" + std::to_string(i));
    vocab.scores.push_back(-static_cast<float>(i));
    vocab.token_types.push_back(control ? synthetic::TokenType::control : synthetic::TokenType::normal);
  }
  vocab.unknown_id = 0;
  vocab.bos_id = 1;
  vocab.eos_id = 2;
  synthetic::SyntheticSpec spec;
  spec.n_layers = kModelLayers;
  spec.n_embd = kModelEmbd;
  spec.n_ff = 64;
  spec.n_head = 2;
  spec.n_head_kv = 1;
  spec.n_ctx_train = 64;
  spec.seed = 15;
  std::filesystem::create_directories(dir);
  const std::filesystem::path path = dir / "fuzz-model.gguf";
  synthetic::build_synthetic_model(spec, vocab).write(path);
  return path;
}

}  // namespace pico::fuzz
