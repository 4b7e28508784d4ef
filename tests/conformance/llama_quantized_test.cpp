// pico reads what llama.cpp's quantizer writes: a synthetic F32 model (llama
// architecture, llama2 vocabulary, n_embd 256 so that K-quant blocks fit) is
// quantized by llama.cpp itself (llama_model_quantize of node-llama-cpp's prebuilt
// libllama, loaded at run time from $PICO_LLAMA_LIB through llama_library.hpp) to every file type whose tensor
// types pico has; pico then opens each output with gguf::Model::open and dequantizes
// every tensor with its reference dequantize_row, checking that the values are
// finite and close to the original weights (normalized mean squared error below a
// bound per tensor type). Prints the tensor types of each file and the error table.
// A second test checks that `pico quantize` chooses the same type as llama.cpp for
// every tensor (mixes and pure types; hybrids, MoE, tied embeddings).
// Fails (never skips) when PICO_LLAMA_LIB is unset or cannot be loaded.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gguf/reader.hpp"
#include "llama_library.hpp"
#include "temp_dir.hpp"
#include "quant/quantize.hpp"
#include "quant/type_traits.hpp"
#include "quantize/model_quantizer.hpp"
#include "synthetic/synthetic_model.hpp"

namespace pico {
namespace {

namespace fs = std::filesystem;
using conformance::TempDir;

// llama_ftype values (include/llama.h).
struct FileType {
  const char* name;
  int32_t ftype;
  GgmlType main_type;  // the type of most matrices in the output
  bool pure = false;  // every tensor (but 1-d ones) in the file type's base type
};

std::vector<FileType> file_types() {
  using T = GgmlType;
  return {
      {"Q4_0", 2, T::Q4_0},
      {"Q4_1", 3, T::Q4_1},
      {"Q8_0", 7, T::Q8_0},
      {"Q5_0", 8, T::Q5_0},
      {"Q5_1", 9, T::Q5_1},
      {"Q2_K", 10, T::Q2_K},
      {"Q3_K_M", 12, T::Q3_K},
      {"Q4_K_M", 15, T::Q4_K},
      {"Q5_K_M", 17, T::Q5_K},
      {"Q6_K", 18, T::Q6_K},
      {"IQ4_NL", 25, T::IQ4_NL},
      {"IQ4_XS", 30, T::IQ4_XS},
      {"BF16", 32, T::BF16},
      {"F16", 1, T::F16},
      {"TQ1_0", 36, T::TQ1_0},
      {"TQ2_0", 37, T::TQ2_0},
      // On a dense model MXFP4_MOE writes Q8_0 everywhere (MXFP4 is for expert
      // tensors only): the pure variant puts MXFP4 in every matrix.
      {"MXFP4_MOE", 38, T::Q8_0},
      {"MXFP4_MOE_pure", 38, T::MXFP4, true},
      // No NVFP4 (39): this library refuses it as an output file type ("invalid
      // output file type 39"); its NVFP4 tensors come from converted checkpoints.
      {"Q1_0", 40, T::Q1_0},
      {"Q2_0", 41, T::Q2_0},
  };
}

// Normalized mean squared error bound per tensor type: the synthetic weights are
// near-Gaussian. Measured (worst tensor, llama.cpp v0.4.0 via node-llama-cpp):
// f16 4.4e-8, bf16 2.8e-6, q8_0 2.6e-5, q6_K 2.9e-4, q5_K 1.2e-3, q5_1 1.4e-3,
// q5_0 1.7e-3, q4_K 4.8e-3, iq4_nl 5.5e-3, iq4_xs 5.6e-3, q4_1 5.8e-3, q4_0 6.7e-3,
// mxfp4 1.3e-2, q3_K 2.1e-2, q2_K 8.3e-2, q1_0 0.35, q2_0 0.48, tq1_0/tq2_0 0.60.
double nmse_bound(GgmlType type) {
  using T = GgmlType;
  switch (type) {
    case T::F32: return 0.0;  // 1-d tensors are copied
    case T::F16: return 1e-6;
    case T::BF16: return 1e-5;
    case T::Q8_0: return 1e-4;
    case T::Q6_K: return 1e-3;
    case T::Q5_0: case T::Q5_1: case T::Q5_K: return 4e-3;
    case T::Q4_0: case T::Q4_1: case T::Q4_K: case T::IQ4_NL: case T::IQ4_XS: return 0.01;
    case T::MXFP4: return 0.025;
    case T::Q3_K: return 0.04;
    case T::Q2_K: return 0.15;
    // Ternary and 1-2 bit types on Gaussian weights: most of the signal is lost by
    // design (TQ*: round(x / max|x|) is mostly 0; Q1_0 keeps the signs).
    case T::TQ1_0: case T::TQ2_0: return 0.7;
    case T::Q2_0: return 0.6;
    case T::Q1_0: return 0.45;
    default: return -1.0;  // unexpected type: fails
  }
}

struct TensorValues {
  GgmlType type;
  std::vector<float> values;
};

// Every tensor of `path`, dequantized with pico's reference dequantizers.
std::map<std::string, TensorValues> read_all(const fs::path& path) {
  const auto model = gguf::Model::open(path);
  std::map<std::string, TensorValues> out;
  for (const gguf::TensorInfo& t : model->tensors()) {
    std::vector<float> values(t.elements);
    const auto bytes = model->tensor_data(t);
    EXPECT_EQ(bytes.size(), t.bytes) << path << " " << t.name;
    const uint64_t row = t.shape.empty() ? 1 : t.shape[0];
    const uint64_t rows = row == 0 ? 0 : t.elements / row;
    const TypeTraits& traits = type_traits(t.type);
    const size_t row_bytes = static_cast<size_t>(row / traits.block_size) * traits.block_bytes;
    for (uint64_t r = 0; r < rows; ++r) {
      dequantize_row(t.type, bytes.data() + r * row_bytes, values.data() + r * row, static_cast<int64_t>(row));
    }
    out.emplace(t.name, TensorValues{t.type, std::move(values)});
  }
  return out;
}

TEST(LlamaQuantized, PicoDequantizesEveryFileTypeLlamaCppWrites) {
  const conformance::LlamaLibrary& llama = conformance::LlamaLibrary::get();
  ASSERT_TRUE(llama.loaded()) << llama.error();
  TempDir dir("llama_quantized");
  synthetic::SyntheticSpec spec;
  spec.architecture = synthetic::Architecture::llama;
  spec.vocab = synthetic::VocabKind::llama2;
  spec.node_modules = PICO_NODE_MODULES_DIR;
  spec.n_layers = 2;
  spec.n_embd = 256;
  spec.n_ff = 512;
  spec.n_head = 4;
  spec.n_head_kv = 2;
  spec.weight_type = GgmlType::F32;
  const fs::path source = dir.path() / "f32.gguf";
  synthetic::write_synthetic_model(spec, source);
  const auto original = read_all(source);
  ASSERT_FALSE(original.empty());

  struct Row {
    std::string file, tensor_type;
    double worst = 0, mean = 0;
    int tensors = 0;
    double bound = 0;
  };
  std::vector<Row> table;
  for (const FileType& ft : file_types()) {
    SCOPED_TRACE(ft.name);
    const fs::path out = dir.path() / (std::string(ft.name) + ".gguf");
    ASSERT_EQ(llama.quantize(source, out, static_cast<conformance::LlamaFileType>(ft.ftype), ft.pure), 0u)
        << "llama_model_quantize failed for " << ft.name;
    const auto quantized = read_all(out);
    ASSERT_EQ(quantized.size(), original.size()) << ft.name;

    std::map<std::string, int> histogram;
    std::map<GgmlType, Row> per_type;
    for (const auto& [name, q] : quantized) {
      SCOPED_TRACE(name);
      const auto it = original.find(name);
      ASSERT_NE(it, original.end());
      const std::vector<float>& x = it->second.values;
      ASSERT_EQ(q.values.size(), x.size());
      ++histogram[std::string(type_traits(q.type).name)];
      double err = 0, norm = 0;
      size_t non_finite = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!std::isfinite(q.values[i])) ++non_finite;
        const double d = static_cast<double>(q.values[i]) - x[i];
        err += d * d;
        norm += static_cast<double>(x[i]) * x[i];
      }
      EXPECT_EQ(non_finite, 0u);
      const double nmse = norm > 0 ? err / norm : err;
      const double bound = nmse_bound(q.type);
      EXPECT_LE(nmse, bound) << "type " << type_traits(q.type).name;
      Row& row = per_type[q.type];
      row.file = ft.name;
      row.tensor_type = std::string(type_traits(q.type).name);
      row.worst = std::max(row.worst, nmse);
      row.mean += nmse;
      ++row.tensors;
      row.bound = bound;
    }
    const auto main_count = histogram.find(std::string(type_traits(ft.main_type).name));
    EXPECT_TRUE(main_count != histogram.end() && main_count->second >= 8) << "expected mostly " << type_traits(ft.main_type).name;
    std::string line;
    for (const auto& [type, count] : histogram) line += " " + type + ":" + std::to_string(count);
    std::printf("%-15s %8.2f MiB  tensors%s\n", ft.name, static_cast<double>(fs::file_size(out)) / (1 << 20),
                line.c_str());
    for (auto& [type, row] : per_type) {
      row.mean /= row.tensors;
      table.push_back(row);
    }
    fs::remove(out);
  }
  std::printf("\nnormalized MSE of pico's dequantization against the original F32 weights\n");
  std::printf("%-15s %-8s %8s %12s %12s %10s\n", "file type", "tensor", "tensors", "mean", "worst", "bound");
  for (const Row& row : table) {
    std::printf("%-15s %-8s %8d %12.3e %12.3e %10.1e\n", row.file.c_str(), row.tensor_type.c_str(), row.tensors,
                row.mean, row.worst, row.bound);
  }
}

// `pico quantize` chooses, tensor by tensor, the type llama.cpp's quantizer chooses:
// for its mixes (Q3_K_M, Q4_K_S, Q4_K_M, Q5_K_M) against llama.cpp's file types, for
// its plain types (pure: every matrix in the one type) against llama.cpp's --pure, on
// the hybrids (qwen35 tied with value rows of 96 that fall back; qwen35moe with 8
// experts; qwen3next); the mixes also on qwen3moe with 8 experts, llama and tied gpt2
// (attn_qkv).
TEST(LlamaQuantized, PicoQuantizeChoosesLlamaCppsTensorTypes) {
  const conformance::LlamaLibrary& llama = conformance::LlamaLibrary::get();
  ASSERT_TRUE(llama.loaded()) << llama.error();
  TempDir dir("llama_quantized_types");
  using A = synthetic::Architecture;
  using F = conformance::LlamaFileType;
  struct Model {
    const char* label;
    A arch;
    uint32_t layers, heads, kv_heads, experts, value_heads, groups, state;
    bool tied;
  };
  const Model models[] = {
      {"llama", A::llama, 8, 4, 2, 0, 0, 0, 0, false},
      {"gpt2_tied", A::gpt2, 4, 4, 4, 0, 0, 0, 0, true},
      {"qwen3moe_8x", A::qwen3moe, 4, 4, 2, 8, 0, 0, 0, false},
      {"qwen35_tied", A::qwen35, 8, 4, 2, 0, 3, 1, 32, true},
      {"qwen35moe_8x", A::qwen35moe, 4, 4, 2, 8, 4, 2, 64, false},
      {"qwen3next", A::qwen3next, 8, 4, 1, 4, 4, 2, 64, false},
  };
  struct Type {
    const char* pico;
    F llama;
    bool pure;
  };
  const Type types[] = {{"Q4_K_M", F::Q4_K_M, false}, {"Q5_K_M", F::Q5_K_M, false}, {"Q4_K_S", F::Q4_K_S, false},
                        {"Q3_K_M", F::Q3_K_M, false}, {"q8_0", F::Q8_0, true},        {"q4_0", F::Q4_0, true},
                        {"q6_K", F::Q6_K, true},       {"iq4_nl", F::IQ4_NL, true},   {"q2_K", F::Q2_K, true}};
  for (const Model& m : models) {
    synthetic::SyntheticSpec spec;
    spec.architecture = m.arch;
    spec.vocab = synthetic::VocabKind::llama2;
    spec.node_modules = PICO_NODE_MODULES_DIR;
    spec.n_layers = m.layers;
    spec.n_embd = 256;
    spec.n_ff = 512;
    spec.n_head = m.heads;
    spec.n_head_kv = m.kv_heads;
    spec.tied_embeddings = m.tied;
    if (m.experts) {
      spec.n_expert = m.experts;
      spec.n_expert_used = 2;
      spec.n_ff_exp = 256;
      spec.n_ff_shexp = 256;
    }
    if (synthetic::is_hybrid(m.arch)) {
      spec.head_dim = 64;
      spec.full_attention_interval = 4;
      spec.ssm_value_heads = m.value_heads;
      spec.ssm_groups = m.groups;
      spec.ssm_state = m.state;
    }
    const fs::path source = dir.path() / (std::string(m.label) + ".gguf");
    synthetic::write_synthetic_model(spec, source);
    for (const Type& t : types) {
      if (t.pure && !synthetic::is_hybrid(m.arch)) continue;  // a pure type is one type for every matrix
      SCOPED_TRACE(std::string(m.label) + " " + t.pico);
      const fs::path by_llama = dir.path() / "by_llama.gguf", by_pico = dir.path() / "by_pico.gguf";
      ASSERT_EQ(llama.quantize(source, by_llama, t.llama, t.pure), 0u);
      tools::quantize_model(source, by_pico, *tools::parse_quantize_type(t.pico));
      const auto expected = gguf::Model::open(by_llama);
      const auto got = gguf::Model::open(by_pico);
      ASSERT_EQ(got->tensors().size(), expected->tensors().size());
      int differ = 0;
      std::map<std::string, int> histogram;
      for (const gguf::TensorInfo& e : expected->tensors()) {
        const gguf::TensorInfo* g = got->find_tensor(e.name);
        ASSERT_NE(g, nullptr) << e.name;
        ++histogram[std::string(type_traits(e.type).name)];
        if (g->type != e.type && differ++ < 8) {
          ADD_FAILURE() << e.name << ": pico " << type_traits(g->type).name << ", llama.cpp " << type_traits(e.type).name;
        }
      }
      EXPECT_EQ(differ, 0);
      std::string line;
      for (const auto& [type, count] : histogram) line += " " + type + ":" + std::to_string(count);
      std::printf("%-13s %-7s %s%s\n", m.label, t.pico, differ ? "DIFFERS" : "same types:", line.c_str());
    }
  }
}

}  // namespace
}  // namespace pico
