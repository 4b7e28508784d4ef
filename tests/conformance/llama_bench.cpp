// llama.cpp's speed on a GGUF, measured the way `pico bench` measures pico's, without
// node: the library in $PICO_LLAMA_LIB (node-llama-cpp's CPU or Vulkan build) loaded
// in-process. Prints one JSON line, as llama_bench.mjs does:
//   {"prefill_tps": ..., "decode_tps": ..., "prompt": P, "generated": N, "threads": T, "backend": ...}
//
//   PICO_LLAMA_LIB=.../libllama.vulkan.v0.4.0.so llama_bench MODEL [-p 256] [-n 64] [-t 2]
//                                                 [--repeat 2] [--gpu-layers N]
// --gpu-layers: layers on the Vulkan build's device (-1: all); 0, the CPU.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "llama_library.hpp"

int main(int argc, char** argv) {
  using pico::conformance::LlamaLibrary;
  std::string model;
  int prompt = 256, generate = 64, repeat = 2;
  pico::conformance::LlamaEvalOptions options;
  options.threads = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "-p" && has_value) {
      prompt = std::atoi(argv[++i]);
    } else if (arg == "-n" && has_value) {
      generate = std::atoi(argv[++i]);
    } else if (arg == "-t" && has_value) {
      options.threads = std::atoi(argv[++i]);
    } else if (arg == "--repeat" && has_value) {
      repeat = std::atoi(argv[++i]);
    } else if (arg == "--gpu-layers" && has_value) {
      options.gpu_layers = std::atoi(argv[++i]);
    } else if (model.empty() && arg[0] != '-') {
      model = arg;
    } else {
      std::fprintf(stderr, "llama_bench: unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  if (model.empty() || prompt < 1 || generate < 1 || repeat < 1 || options.threads < 1) {
    std::fprintf(stderr, "usage: llama_bench MODEL [-p 256] [-n 64] [-t 2] [--repeat 2] [--gpu-layers N]\n");
    return 2;
  }
  const LlamaLibrary& llama = LlamaLibrary::get();
  if (!llama.loaded()) {
    std::fprintf(stderr, "llama_bench: %s\n", llama.error().c_str());
    return 1;
  }
  try {
    const auto speed = llama.speed(model, prompt, generate, repeat, options);
    std::printf(
        "{\"prefill_tps\": %.3f, \"decode_tps\": %.3f, \"prompt\": %d, \"generated\": %d, \"threads\": %d, "
        "\"backend\": \"%s\"}\n",
        speed.prefill_tps, speed.decode_tps, prompt, generate, options.threads,
        options.gpu_layers != 0 ? "gpu" : "cpu");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "llama_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
