// pico's elementwise ops against llama.cpp's, node for node, on llama.cpp's own
// traffic: llama.cpp evaluates the conformance matrix's text on each architecture's
// synthetic model with an eval callback (cb_eval) that copies every computed node of
// the ops below together with its inputs; then pico's CPU backend runs the same op
// on those inputs, and the outputs must be bit-identical.
//
// The matmuls have their own oracle (engine/cpu/ggml_matmul_crosscheck_test.cpp);
// this one covers the rest of the graph (norms, bias adds, residuals, RoPE, softmax,
// SiLU/GELU gates, scales; the hybrids' sigmoid and softplus gates, L2 norms and
// causal conv), where a last-bit difference is enough to move an activation onto
// another 8-bit code in the next quantized matmul. Prints, per architecture and op,
// how many nodes and values differ.
//
// pico runs at its best CPU level, the counterpart of the build llama.cpp picks for
// the same host (AVX-512 or AVX2): the row functions with vector code (SiLU, softmax,
// LayerNorm) follow that build's vector width. Fails (never skips) when
// $PICO_LLAMA_LIB cannot be loaded.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "llama_library.hpp"
#include "matrix_models.hpp"
#include "quant/float_convert.hpp"
#include "synthetic/synthetic_model.hpp"
#include "temp_dir.hpp"

namespace pico::conformance {
namespace {

namespace fs = std::filesystem;
using synthetic::Architecture;

// struct ggml_tensor of the shipped build, field for field (ggml/include/ggml.h).
struct GgmlTensor {
  int32_t type;
  void* buffer;
  int64_t ne[4];
  size_t nb[4];
  int32_t op;
  int32_t op_params[16];
  int32_t flags;
  GgmlTensor* src[10];
  GgmlTensor* view_src;
  size_t view_offs;
  void* data;
  char name[64];
  void* extra;
  char padding[8];
};
static_assert(sizeof(GgmlTensor) == 336);
static_assert(offsetof(GgmlTensor, op) == 80);
static_assert(offsetof(GgmlTensor, src) == 152);
static_assert(offsetof(GgmlTensor, data) == 248);
static_assert(offsetof(GgmlTensor, name) == 256);

// ggml enum values of that build.
constexpr int32_t kTypeF32 = 0, kTypeF16 = 1, kTypeI32 = 26;
constexpr int32_t kOpAdd = 2, kOpMul = 7, kOpNorm = 24, kOpRmsNorm = 25, kOpL2Norm = 28, kOpScale = 32,
                  kOpSoftMax = 46, kOpRope = 48, kOpSsmConv = 76, kOpUnary = 91, kOpGlu = 100;
constexpr int32_t kUnarySigmoid = 7, kUnaryGelu = 8, kUnarySilu = 10, kUnarySoftplus = 15;
constexpr int32_t kGluGeglu = 1, kGluSwiglu = 2;
constexpr int32_t kRopeNeox = 2;

const char* op_name(int32_t op) {
  switch (op) {
    case kOpAdd: return "ADD";
    case kOpMul: return "MUL";
    case kOpNorm: return "NORM";
    case kOpRmsNorm: return "RMS_NORM";
    case kOpScale: return "SCALE";
    case kOpSoftMax: return "SOFT_MAX";
    case kOpRope: return "ROPE";
    case kOpUnary: return "UNARY";
    case kOpGlu: return "GLU";
    case kOpL2Norm: return "L2_NORM";
    case kOpSsmConv: return "SSM_CONV";
    default: return "?";
  }
}

// A tensor's values in ggml order (dimension 0 fastest), floats or ints.
struct Operand {
  int64_t ne[4] = {1, 1, 1, 1};
  std::vector<float> values;
  std::vector<int32_t> ints;
  int64_t rows() const { return ne[1] * ne[2] * ne[3]; }
};

bool gather(const GgmlTensor* t, Operand& out) {
  if (t->type != kTypeF32 && t->type != kTypeF16 && t->type != kTypeI32) return false;
  std::memcpy(out.ne, t->ne, sizeof(out.ne));
  const auto* base = static_cast<const uint8_t*>(t->data);
  for (int64_t i3 = 0; i3 < t->ne[3]; ++i3) {
    for (int64_t i2 = 0; i2 < t->ne[2]; ++i2) {
      for (int64_t i1 = 0; i1 < t->ne[1]; ++i1) {
        for (int64_t i0 = 0; i0 < t->ne[0]; ++i0) {
          const uint8_t* p = base + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
          if (t->type == kTypeF32) {
            float v;
            std::memcpy(&v, p, 4);
            out.values.push_back(v);
          } else if (t->type == kTypeF16) {
            uint16_t h;
            std::memcpy(&h, p, 2);
            out.values.push_back(fp16_to_fp32(h));
          } else {
            int32_t v;
            std::memcpy(&v, p, 4);
            out.ints.push_back(v);
          }
        }
      }
    }
  }
  return true;
}

// One computed node of llama.cpp's graph with copies of its inputs and output.
struct Node {
  std::string name;
  int32_t op = 0;
  int32_t params[16] = {};
  std::vector<Operand> src;
  Operand out;
  float param_float(int i) const {
    float f;
    std::memcpy(&f, &params[i], 4);
    return f;
  }
};

bool traced(int32_t op) {
  switch (op) {
    case kOpAdd: case kOpMul: case kOpNorm: case kOpRmsNorm: case kOpScale: case kOpSoftMax: case kOpRope:
    case kOpUnary: case kOpGlu: case kOpL2Norm: case kOpSsmConv:
      return true;
    default:
      return false;
  }
}

// What the callback keeps. ggml computes some ops in place over an input, so a node's
// inputs are taken from the copies made when they were computed (every node is shown:
// ggml then computes one node at a time) and read directly only for graph leaves
// (weights, positions, masks), which nothing overwrites.
struct Trace {
  std::map<const GgmlTensor*, Operand> outputs;
  std::vector<Node> nodes;
};

bool record_node(void* tensor, bool ask, void* user) {
  if (ask) return true;
  const auto* t = static_cast<const GgmlTensor*>(tensor);
  Trace& trace = *static_cast<Trace*>(user);
  Operand out;
  if (!gather(t, out)) return true;
  if (traced(t->op) && t->type == kTypeF32) {
    Node node;
    node.name = t->name;
    node.op = t->op;
    std::memcpy(node.params, t->op_params, sizeof(node.params));
    bool complete = true;
    for (const GgmlTensor* s : t->src) {
      if (!s) break;
      const auto computed = trace.outputs.find(s);
      node.src.emplace_back();
      if (computed != trace.outputs.end()) {
        node.src.back() = computed->second;
      } else {
        complete = complete && gather(s, node.src.back());
      }
    }
    node.out = out;
    if (complete) trace.nodes.push_back(std::move(node));
  }
  trace.outputs[t] = std::move(out);
  return true;
}

// b's rows broadcast over a's: 1 or as many as a has (what pico's add/mul take).
bool broadcastable(const Operand& a, const Operand& b) {
  return b.ne[0] == a.ne[0] && (b.rows() == 1 || b.rows() == a.rows());
}

// pico's output for the node, or false when pico has no op of that form (counted as
// not compared).
bool run_pico(backend::Backend& be, const Node& node, std::vector<float>& y) {
  const Operand& a = node.src.at(0);
  const int64_t n = a.ne[0], rows = a.rows();
  y.assign(a.values.size(), 0.0f);
  switch (node.op) {
    case kOpAdd:
    case kOpMul: {
      if (node.src.size() < 2 || !broadcastable(a, node.src[1])) return false;
      const Operand& b = node.src[1];
      const auto op = node.op == kOpAdd ? &backend::Backend::add : &backend::Backend::mul;
      (be.*op)(a.values.data(), b.values.data(), n, rows, b.rows(), y.data());
      return true;
    }
    case kOpRmsNorm:
      be.rms_norm(a.values.data(), nullptr, n, rows, node.param_float(0), y.data());
      return true;
    case kOpL2Norm:
      be.l2_norm(a.values.data(), n, rows, node.param_float(0), y.data());
      return true;
    case kOpSsmConv: {
      // src0 {taps - 1 + tokens, channels, sequences}: per channel the held inputs, then
      // the batch's; src1 {taps, channels}. pico takes rows by token (the held ones as
      // the sequence's conv state) and tap-major weights; ggml's output is by token too.
      if (node.src.size() != 2 || a.ne[3] != 1) return false;
      const Operand& kernel = node.src[1];
      const int64_t taps = kernel.ne[0], channels = kernel.ne[1], sequences = a.ne[2];
      const int64_t tokens = a.ne[0] - (taps - 1);
      if (a.ne[1] != channels || tokens < 1) return false;
      std::vector<float> weights(static_cast<size_t>(taps * channels));
      for (int64_t c = 0; c < channels; ++c) {
        for (int64_t i = 0; i < taps; ++i) weights[static_cast<size_t>(i * channels + c)] = kernel.values[static_cast<size_t>(c * taps + i)];
      }
      std::vector<float> x(static_cast<size_t>(sequences * tokens * channels));
      std::vector<float> states(static_cast<size_t>(sequences * (taps - 1) * channels));
      std::vector<backend::RecurrentSequence> seqs;
      for (int64_t s = 0; s < sequences; ++s) {
        const float* in = a.values.data() + s * channels * a.ne[0];
        for (int64_t c = 0; c < channels; ++c) {
          for (int64_t i = 0; i < a.ne[0]; ++i) {
            const float value = in[c * a.ne[0] + i];
            if (i < taps - 1) {
              states[static_cast<size_t>((s * (taps - 1) + i) * channels + c)] = value;
            } else {
              x[static_cast<size_t>((s * tokens + i - (taps - 1)) * channels + c)] = value;
            }
          }
        }
        seqs.push_back({s * tokens, tokens, states.data() + s * (taps - 1) * channels, nullptr});
      }
      y.assign(x.size(), 0.0f);
      be.ssm_conv(x.data(), channels, weights.data(), taps, seqs, y.data());
      return true;
    }
    case kOpNorm:
      be.layer_norm(a.values.data(), nullptr, nullptr, n, rows, node.param_float(0), y.data());
      return true;
    case kOpScale:
      if (node.param_float(1) != 0.0f) return false;
      y = a.values;
      be.scale(y.data(), static_cast<int64_t>(y.size()), node.param_float(0));
      return true;
    case kOpUnary:
      if (node.params[0] == kUnaryGelu) {
        be.gelu(a.values.data(), static_cast<int64_t>(a.values.size()), y.data());
      } else if (node.params[0] == kUnarySilu) {
        be.silu(a.values.data(), n, rows, y.data());
      } else if (node.params[0] == kUnarySigmoid) {
        be.sigmoid(a.values.data(), static_cast<int64_t>(a.values.size()), y.data());
      } else if (node.params[0] == kUnarySoftplus) {
        be.softplus(a.values.data(), static_cast<int64_t>(a.values.size()), y.data());
      } else {
        return false;
      }
      return true;
    case kOpGlu: {
      // Split form only: gate (src0) and up (src1), not swapped.
      if (node.src.size() < 2 || node.params[1] != 0 || node.src[1].values.size() != a.values.size()) return false;
      if (node.params[0] == kGluSwiglu) {
        be.silu(a.values.data(), n, rows, y.data());
      } else if (node.params[0] == kGluGeglu) {
        be.gelu(a.values.data(), static_cast<int64_t>(a.values.size()), y.data());
      } else {
        return false;
      }
      be.mul(y.data(), node.src[1].values.data(), n, rows, rows, y.data());
      return true;
    }
    case kOpSoftMax: {
      // x * scale + mask (mask row i01, broadcast over heads), then softmax: ggml's steps.
      if (node.param_float(1) != 0.0f || node.src.size() > 2) return false;
      y = a.values;
      for (float& v : y) v *= node.param_float(0);
      if (node.src.size() == 2) {
        const Operand& mask = node.src[1];
        if (mask.ne[0] != n || mask.ne[2] != 1 || mask.ne[3] != 1) return false;
        for (int64_t r = 0; r < rows; ++r) {
          const float* m = mask.values.data() + (r % a.ne[1]) * n;
          for (int64_t i = 0; i < n; ++i) y[static_cast<size_t>(r * n + i)] += m[i];
        }
      }
      be.softmax(y.data(), n, rows);
      return true;
    }
    case kOpRope: {
      if (node.src.size() > 2 || node.src.size() < 2 || a.ne[3] != 1) return false;
      backend::RopeParams p;
      p.n_dims = node.params[1];
      p.neox = (node.params[2] & kRopeNeox) != 0;
      if ((node.params[2] & ~kRopeNeox) != 0) return false;  // other rope kinds
      p.n_ctx_orig = node.params[4];
      p.freq_base = node.param_float(5);
      p.freq_scale = node.param_float(6);
      p.ext_factor = node.param_float(7);
      p.attn_factor = node.param_float(8);
      p.beta_fast = node.param_float(9);
      p.beta_slow = node.param_float(10);
      y = a.values;
      const int64_t heads = a.ne[1], tokens = a.ne[2];
      be.rope(y.data(), tokens, heads * n, heads, n, node.src[1].ints.data(), p);
      return true;
    }
    default:
      return false;
  }
}

struct OpTally {
  int nodes = 0, compared = 0, exact = 0;
  int64_t values = 0, differing = 0;
  double max_abs = 0.0;
  std::string first_bad;
};

struct TraceCase {
  Architecture arch;
  bool yarn;  // YaRN context scaling, as quantized_matrix_test's YarnRope cases
};

std::string case_name(const TraceCase& c) {
  return std::string(synthetic::architecture_name(c.arch)) + (c.yarn ? "_yarn" : "");
}

// For gtest's messages (it would print the struct's bytes, padding included).
void PrintTo(const TraceCase& c, std::ostream* os) { *os << case_name(c); }

class GgmlOpTrace : public ::testing::TestWithParam<TraceCase> {};

TEST_P(GgmlOpTrace, ElementwiseOpsAreBitIdenticalToLlamaCpp) {
  const LlamaLibrary& llama = LlamaLibrary::get();
  ASSERT_TRUE(llama.loaded()) << llama.error();
  const std::string arch = case_name(GetParam());
  TempDir dir("op_trace_" + arch);
  const fs::path f32 = dir.path() / "F32.gguf", q8 = dir.path() / "Q8_0.gguf";
  synthetic::SyntheticSpec spec = matrix_model_spec(GetParam().arch);
  if (GetParam().yarn) {
    spec.rope_scaling = "yarn";
    spec.rope_scaling_factor = 4.0f;
    spec.rope_original_context = 32;
  }
  synthetic::write_synthetic_model(spec, f32);
  // Q8_0 weights, so that the ops see the activations of a quantized model.
  ASSERT_EQ(llama.quantize(f32, q8, LlamaFileType::Q8_0), 0u);
  const std::vector<int32_t> ids = llama.tokenize(f32, kText);

  Trace trace;
  LlamaEvalOptions options;
  options.eval_callback = record_node;
  options.eval_user_data = &trace;
  llama.logits(q8, ids, options);
  const std::vector<Node>& nodes = trace.nodes;
  ASSERT_FALSE(nodes.empty()) << "llama.cpp's eval callback saw no node";

  auto be = backend::make_cpu_backend(2);
  std::map<std::string, OpTally> tallies;
  for (const Node& node : nodes) {
    std::string key = op_name(node.op);
    if (node.op == kOpGlu || node.op == kOpUnary) key += "/" + std::to_string(node.params[0]);
    OpTally& tally = tallies[key];
    ++tally.nodes;
    std::vector<float> y;
    if (!run_pico(*be, node, y)) continue;
    ++tally.compared;
    int64_t differing = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      if (std::memcmp(&y[i], &node.out.values[i], 4) != 0) {
        ++differing;
        tally.max_abs = std::max(tally.max_abs, std::fabs(static_cast<double>(y[i]) - node.out.values[i]));
      }
    }
    tally.values += static_cast<int64_t>(y.size());
    tally.differing += differing;
    if (differing == 0) {
      ++tally.exact;
    } else if (tally.first_bad.empty()) {
      tally.first_bad = node.name;
    }
  }
  std::printf("%-8s %-12s %6s %8s %6s %10s %10s %10s  %s\n", arch.c_str(), "op", "nodes", "compared", "exact",
              "values", "differing", "max |d|", "first differing node");
  for (const auto& [key, t] : tallies) {
    std::printf("%-8s %-12s %6d %8d %6d %10lld %10lld %10.3g  %s\n", arch.c_str(), key.c_str(), t.nodes, t.compared,
                t.exact, static_cast<long long>(t.values), static_cast<long long>(t.differing), t.max_abs,
                t.first_bad.c_str());
    EXPECT_EQ(t.exact, t.compared) << arch << " " << key << ": " << t.compared - t.exact
                                   << " nodes differ from llama.cpp's, first " << t.first_bad;
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, GgmlOpTrace,
                         ::testing::Values(TraceCase{Architecture::llama, false}, TraceCase{Architecture::qwen2, false},
                                           TraceCase{Architecture::qwen3, false}, TraceCase{Architecture::gpt2, false},
                                           TraceCase{Architecture::gemma3, false}, TraceCase{Architecture::llama, true},
                                           TraceCase{Architecture::qwen2, true}, TraceCase{Architecture::qwen35, false},
                                           TraceCase{Architecture::qwen35moe, false}, TraceCase{Architecture::qwen3next, false}),
                         [](const ::testing::TestParamInfo<TraceCase>& param_info) { return case_name(param_info.param); });

}  // namespace
}  // namespace pico::conformance
