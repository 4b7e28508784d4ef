// Contiguous layer ranges for the stages of a pipeline, balanced by the weight bytes
// each stage reads per token: decoding streams every weight once per token, so bytes
// are what a layer costs (the output head, a whole vocabulary of rows, weighs as much
// as a few layers and sits on the last stage). Speed-aware assignment (stages of
// different machines) will weigh these bytes by each worker's measured speed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gguf/reader.hpp"
#include "model/model.hpp"

namespace pico::model {

// Splits layers 0..layer_bytes.size()-1 into `stages` non-empty contiguous ranges
// that minimise the largest stage's bytes, `head_bytes` counted on the last stage.
// Of equally good splits, the one whose earlier stages are largest. Throws
// std::invalid_argument unless 1 <= stages <= number of layers.
std::vector<LayerRange> balanced_layer_split(const std::vector<uint64_t>& layer_bytes, uint64_t head_bytes,
                                             int stages);

// The same for a model file: each layer's tensors (blk.N.*) and the head (output.weight,
// or token_embd.weight when the embedding is tied).
std::vector<LayerRange> balanced_layer_split(const gguf::Model& file, int stages);

// "0-6,7-11": inclusive ranges as pico-worker --layers and scripts/local-cluster take them.
std::string format_layer_ranges(const std::vector<LayerRange>& ranges);

// Whether the stage of `range` (of n_layer layers) reads the tensor `name`: a layer's
// by its stage, the embeddings by the first (and the last when the head is tied to
// them), the output norm and head by the last, anything else by every stage.
bool stage_reads(const gguf::Model& file, const std::string& name, LayerRange range, int32_t n_layer);

}  // namespace pico::model
