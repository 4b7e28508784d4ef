// Converts a GGUF of float weights (F32/F16/BF16) into a quantized GGUF: the
// `pico quantize` command. Types are named as llama.cpp's quantize tool names them:
// a plain type ("q4_0", "q8_0", "q6_K", "iq4_nl", ...) quantizes every weight matrix
// to it; a mix ("Q4_K_M", "Q5_K_M", "Q4_K_S", "Q3_K_M") gives some tensors more bits,
// as llama.cpp's mixes do. 1-D tensors, norms, MoE routers and the Gated DeltaNet conv
// kernels (ssm_conv1d) stay as they are; rows that do not fill whole blocks fall back
// to a type whose blocks fit, as llama.cpp's quantizer does.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "quant/type_traits.hpp"

namespace pico::tools {

struct QuantizePlan {
  GgmlType base_type = GgmlType::Q8_0;
  std::string mix;        // "" for a plain type, else "Q4_K_M", ...
  uint32_t file_type = 7; // llama_ftype number written as general.file_type
};

// Parses "q4_0", "Q4_K_M", "f16", ...; nullopt for an unknown name.
std::optional<QuantizePlan> parse_quantize_type(std::string_view name);

// What the choice of a tensor's type needs to know of the model as a whole.
struct QuantizeModelInfo {
  int layer_count = 0;           // {arch}.block_count
  uint32_t expert_count = 0;     // {arch}.expert_count: mixes give 8-expert models' attention more bits
  bool tied_embeddings = false;  // no output.weight: token_embd is also the head
};

// The type one tensor gets under `plan`. `row_length` is shape[0]; `layer` is the
// block index of a blk.N.* tensor (or -1).
GgmlType choose_tensor_type(const QuantizePlan& plan, std::string_view name, size_t dimensions, uint64_t row_length,
                            int layer, const QuantizeModelInfo& model, GgmlType current_type);

struct QuantizeReport {
  size_t tensors_quantized = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  std::vector<std::pair<std::string, GgmlType>> tensor_types;
};

// Reads `input`, writes `output`. Throws std::runtime_error naming the tensor when a
// source type cannot be read as floats.
QuantizeReport quantize_model(const std::filesystem::path& input, const std::filesystem::path& output,
                              const QuantizePlan& plan, int threads = 2);

}  // namespace pico::tools
