#include "quantize/model_quantizer.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <stdexcept>
#include <thread>

#include "gguf/reader.hpp"
#include "gguf/writer.hpp"
#include "quant/quantize.hpp"

namespace pico::tools {
namespace {

struct NamedType {
  std::string_view name;
  GgmlType type;
  std::string_view mix;
  uint32_t file_type;  // llama.cpp's llama_ftype
};

constexpr NamedType kNamedTypes[] = {
    {"f32", GgmlType::F32, "", 0},          {"f16", GgmlType::F16, "", 1},
    {"bf16", GgmlType::BF16, "", 32},       {"q4_0", GgmlType::Q4_0, "", 2},
    {"q4_1", GgmlType::Q4_1, "", 3},        {"q8_0", GgmlType::Q8_0, "", 7},
    {"q5_0", GgmlType::Q5_0, "", 8},        {"q5_1", GgmlType::Q5_1, "", 9},
    {"q2_k", GgmlType::Q2_K, "", 10},       {"q3_k", GgmlType::Q3_K, "", 12},
    {"q3_k_m", GgmlType::Q3_K, "Q3_K_M", 12}, {"q4_k", GgmlType::Q4_K, "", 15},
    {"q4_k_s", GgmlType::Q4_K, "Q4_K_S", 14}, {"q4_k_m", GgmlType::Q4_K, "Q4_K_M", 15},
    {"q5_k", GgmlType::Q5_K, "", 17},       {"q5_k_m", GgmlType::Q5_K, "Q5_K_M", 17},
    {"q6_k", GgmlType::Q6_K, "", 18},       {"iq4_nl", GgmlType::IQ4_NL, "", 25},
    {"iq4_xs", GgmlType::IQ4_XS, "", 30},   {"tq1_0", GgmlType::TQ1_0, "", 36},
    {"tq2_0", GgmlType::TQ2_0, "", 37},     {"mxfp4", GgmlType::MXFP4, "", 38},
    {"nvfp4", GgmlType::NVFP4, "", 39},     {"q1_0", GgmlType::Q1_0, "", 40},
    {"q2_0", GgmlType::Q2_0, "", 41},       {"q6_0", GgmlType::Q6_0, "", 7},
};

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}
bool contains(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

// llama.cpp's rule for which layers of a mix get more bits: the first and last
// eighth, and every third layer between.
bool use_more_bits(int layer, int layer_count) {
  return layer < layer_count / 8 || layer >= 7 * layer_count / 8 || (layer - layer_count / 8) % 3 == 2;
}

// A type whose block fits a row length that the chosen type's block does not
// (llama-quant.cpp tensor_type_fallback; where llama.cpp has none, F16).
GgmlType fallback_type(GgmlType type) {
  switch (type) {
    case GgmlType::IQ4_XS: return GgmlType::IQ4_NL;
    case GgmlType::Q2_0:
    case GgmlType::Q2_K:
    case GgmlType::Q3_K:
    case GgmlType::TQ1_0:
    case GgmlType::TQ2_0: return GgmlType::Q4_0;
    case GgmlType::Q4_K: return GgmlType::Q5_0;
    case GgmlType::Q5_K: return GgmlType::Q5_1;
    case GgmlType::Q6_K: return GgmlType::Q8_0;
    default: return GgmlType::F16;
  }
}

int layer_of(std::string_view name) {
  int layer = -1;
  if (name.starts_with("blk.") && std::sscanf(std::string(name).c_str(), "blk.%d.", &layer) == 1) return layer;
  return -1;
}

}  // namespace

std::optional<QuantizePlan> parse_quantize_type(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const NamedType& named : kNamedTypes) {
    if (named.name == lower) return QuantizePlan{named.type, std::string(named.mix), named.file_type};
  }
  return std::nullopt;
}

GgmlType choose_tensor_type(const QuantizePlan& plan, std::string_view name, size_t dimensions, uint64_t row_length,
                            int layer, const QuantizeModelInfo& model, GgmlType current_type) {
  // Vectors (norms, biases, ssm_a, ssm_dt.bias, the shared-expert gate), norm weights,
  // learned position embeddings, token-type embeddings, MoE routers (ffn_gate_inp) and
  // the Gated DeltaNet conv kernels (ssm_conv1d) keep their type, as in llama.cpp
  // (llama-quant.cpp tensor_allows_quantization).
  if (dimensions < 2 || !ends_with(name, ".weight") || contains(name, "_norm") || name == "position_embd.weight" ||
      name == "token_types.weight" || contains(name, "ffn_gate_inp.weight") || contains(name, "ssm_conv1d")) {
    return current_type;
  }
  GgmlType type = plan.base_type;
  if (!plan.mix.empty()) {
    // Tied embeddings: token_embd is also the head and gets the head's type.
    const bool is_output = name == "output.weight" || (model.tied_embeddings && name == "token_embd.weight");
    const bool more_bits = layer >= 0 && use_more_bits(layer, model.layer_count);
    // llama.cpp counts attn_v and attn_qkv tensors (its "attention-v-like" category)
    // in layer order: with one of them per layer (attn_qkv in gpt2 and in the Gated
    // DeltaNet layers of the hybrids, attn_v elsewhere) that count is the layer index.
    const bool attn_v_like = contains(name, "attn_v.weight") || contains(name, "attn_qkv.weight");
    const bool eight_experts = model.expert_count == 8;
    if (is_output) {
      type = GgmlType::Q6_K;
    } else if (attn_v_like) {
      if ((plan.mix == "Q4_K_M" || plan.mix == "Q5_K_M") && more_bits) type = GgmlType::Q6_K;
      if (plan.mix == "Q4_K_S" && layer >= 0 && layer < 4) type = GgmlType::Q5_K;
      if (plan.mix == "Q3_K_M") type = layer < 2 ? GgmlType::Q5_K : GgmlType::Q4_K;
      if (eight_experts) type = GgmlType::Q8_0;  // "for the 8-expert model, bumping this to Q8_0 trades just ~128MB"
    } else if (contains(name, "attn_k.weight")) {
      if (eight_experts) type = GgmlType::Q8_0;
    } else if (contains(name, "attn_output.weight")) {
      if (eight_experts && plan.mix != "Q5_K_M") type = GgmlType::Q5_K;
      if (!eight_experts && plan.mix == "Q3_K_M") type = GgmlType::Q4_K;
    } else if (contains(name, "ffn_down")) {  // ffn_down, ffn_down_exps, ffn_down_shexp
      if ((plan.mix == "Q4_K_M" || plan.mix == "Q5_K_M") && more_bits) type = GgmlType::Q6_K;
      if (plan.mix == "Q4_K_S" && layer >= 0 && layer < model.layer_count / 8) type = GgmlType::Q5_K;
      if (plan.mix == "Q3_K_M") type = layer < model.layer_count / 16 ? GgmlType::Q5_K : GgmlType::Q4_K;
    }
  }
  while (row_length % type_traits(type).block_size != 0) type = fallback_type(type);
  return type;
}

QuantizeReport quantize_model(const std::filesystem::path& input, const std::filesystem::path& output,
                              const QuantizePlan& plan, int threads) {
  auto model = gguf::Model::open(input);
  gguf::Writer writer;
  for (const auto& [key, value] : model->metadata().entries()) {
    if (key.starts_with("split.")) continue;  // the output is one file
    writer.set(key, value);
  }
  writer.set("general.file_type", static_cast<uint32_t>(plan.file_type));
  writer.set("general.quantization_version", static_cast<uint32_t>(2));

  const std::string arch(model->metadata().get_string("general.architecture").value_or(""));
  QuantizeModelInfo info;
  info.layer_count = static_cast<int>(model->metadata().get_int(arch + ".block_count").value_or(0));
  info.expert_count = static_cast<uint32_t>(model->metadata().get_int(arch + ".expert_count").value_or(0));
  info.tied_embeddings = model->find_tensor("output.weight") == nullptr;

  QuantizeReport report;
  for (const gguf::TensorInfo& tensor : model->tensors()) {
    const auto source = model->tensor_data(tensor);
    report.bytes_in += tensor.bytes;
    const GgmlType type = choose_tensor_type(plan, tensor.name, tensor.shape.size(), tensor.shape[0],
                                             layer_of(tensor.name), info, tensor.type);
    if (type == tensor.type) {
      writer.add_tensor(tensor.name, tensor.type, tensor.shape, source);
      report.bytes_out += tensor.bytes;
      report.tensor_types.emplace_back(tensor.name, type);
      continue;
    }
    if (!has_dequantizer(tensor.type)) {
      throw std::runtime_error("tensor " + tensor.name + ": cannot read type " + std::string(type_traits(tensor.type).name) +
                               " as floats");
    }
    const auto row_length = static_cast<int64_t>(tensor.shape[0]);
    const auto rows = static_cast<int64_t>(tensor.elements / tensor.shape[0]);
    const size_t source_row_bytes = *bytes_of(type_traits(tensor.type), tensor.shape[0]);
    const size_t row_bytes = *bytes_of(type_traits(type), tensor.shape[0]);
    std::vector<uint8_t> quantized(static_cast<size_t>(rows) * row_bytes);
    // Rows are independent: split them over threads.
    const int workers = std::max(1, std::min<int>(threads, static_cast<int>(rows)));
    std::vector<std::thread> pool;
    for (int w = 0; w < workers; ++w) {
      pool.emplace_back([&, w] {
        std::vector<float> row(static_cast<size_t>(row_length));
        for (int64_t r = w; r < rows; r += workers) {
          dequantize_row(tensor.type, source.data() + r * source_row_bytes, row.data(), row_length);
          quantize_row(type, row.data(), quantized.data() + r * row_bytes, row_length);
        }
      });
    }
    for (std::thread& t : pool) t.join();
    report.bytes_out += quantized.size();
    report.tensor_types.emplace_back(tensor.name, type);
    ++report.tensors_quantized;
    writer.add_tensor(tensor.name, type, tensor.shape, std::move(quantized));
  }
  writer.write(output);
  return report;
}

}  // namespace pico::tools
