// pico's forward pass against llama.cpp's, on synthetic models.
//
// Per case (architecture x vocabulary x weight type): `pico mkmodel` writes a small
// synthetic model; llama.cpp (node-llama-cpp's libllama, in-process: llama_library.hpp)
// tokenizes a text and computes its logits after every token (batches of 64, KV cache
// F16, as pico's default); the `pico eval` command computes pico's for the same ids.
// Required: mean KL(llama.cpp || pico) <= 1e-3 and top-1 agreement >= 99% over >= 64
// positions, and for F32/F16 weights the same 64-token greedy continuation (`pico
// eval --greedy`, batch-invariant numerics). The measured numbers are printed per case.
// (In-process instead of a node process per step: node-llama-cpp turned every row
// of 152k probabilities into a JavaScript Map, most of the test's time.)
//
// Quantized weights (and 256-wide models) are the matrix of quantized_matrix_test.cpp.
//
// Fails, never skips, when $PICO_LLAMA_LIB or node_modules is missing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <ostream>
#include <string>

#include "llama_library.hpp"
#include <vector>

namespace {
namespace fs = std::filesystem;

struct Case {
  std::string name;
  std::string mkmodel_args;
  std::string weight_type;  // f32, f16, bf16 (the greedy check runs for f32 and f16)
  std::string eval_args;    // extra pico eval options
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::string run(const std::string& command, int* status_out = nullptr) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) {
    ADD_FAILURE() << "cannot run: " << command;
    return out;
  }
  char buffer[1 << 16];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  const int status = pclose(pipe);
  if (status_out) {
    *status_out = status;
  } else {
    EXPECT_EQ(status, 0) << "command failed: " << command;
  }
  return out;
}

std::string quote(const fs::path& p) { return "'" + p.string() + "'"; }

std::vector<float> read_floats(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> out(bytes.size() / sizeof(float));
  std::copy_n(bytes.data(), out.size() * sizeof(float), reinterpret_cast<char*>(out.data()));
  return out;
}

// The first integer array in `text`.
std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  const size_t open = text.find('['), close = text.find(']', open);
  if (open == std::string::npos || close == std::string::npos) return ids;
  const std::string body = text.substr(open + 1, close - open - 1);
  size_t i = 0;
  while (i < body.size()) {
    if (std::isdigit(static_cast<unsigned char>(body[i]))) {
      size_t end = i;
      while (end < body.size() && std::isdigit(static_cast<unsigned char>(body[end]))) ++end;
      ids.push_back(std::stoi(body.substr(i, end - i)));
      i = end;
    } else {
      ++i;
    }
  }
  return ids;
}

constexpr const char* kText =
    "The quick brown fox jumps over the lazy dog. 1234 + 5678 = 6912; naïve café, 日本語のテキスト! "
    "Once upon a time there was a little girl who lived in a village near the forest. Whenever she "
    "went out, the little girl wore a red riding cloak, so everyone in the village called her Little "
    "Red Riding Hood. One morning, she asked her mother if she could go to visit her grandmother.";

class ModelConformance : public ::testing::TestWithParam<Case> {};

TEST_P(ModelConformance, MatchesLlamaCpp) {
  const Case& c = GetParam();
  const pico::conformance::LlamaLibrary& llama = pico::conformance::LlamaLibrary::get();
  ASSERT_TRUE(llama.loaded()) << llama.error();
  const fs::path modules = PICO_NODE_MODULES_DIR;
  ASSERT_TRUE(fs::exists(modules / "node-llama-cpp")) << modules << " lacks node-llama-cpp: run npm ci in tests/conformance";
  const std::string pico = PICO_EXECUTABLE;

  const fs::path dir = fs::temp_directory_path() / ("pico_model_conf_" + c.name + "_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const fs::path model = dir / "model.gguf", tokens = dir / "tokens.json", pico_bin = dir / "pico.bin";

  run(pico + " mkmodel " + c.mkmodel_args + " --type " + c.weight_type + " --node-modules " + quote(modules) +
      " --seed 7 -o " + quote(model) + " 2>&1");
  ASSERT_TRUE(fs::exists(model));
  const std::vector<int32_t> ids = llama.tokenize(model, kText);
  ASSERT_GE(ids.size(), 64u) << "the text gives too few tokens";
  {
    std::ofstream out(tokens);
    out << "[";
    for (size_t i = 0; i < ids.size(); ++i) out << (i ? "," : "") << ids[i];
    out << "]";
  }

  const pico::conformance::LlamaLogits reference = llama.logits(model, ids);
  const int64_t n_vocab = reference.n_vocab;
  ASSERT_GT(n_vocab, 0);
  run(pico + " eval -m " + quote(model) + " --tokens " + quote(tokens) + " --logits " + quote(pico_bin) + " -t 2 " +
      c.eval_args);

  const std::vector<float>& ref = reference.rows;
  const std::vector<float> got = read_floats(pico_bin);
  ASSERT_EQ(ref.size(), ids.size() * static_cast<size_t>(n_vocab));
  ASSERT_EQ(got.size(), ref.size());
  // KL(p || q) per position, p = softmax(llama.cpp's logits), q = softmax(pico's), in double.
  const auto log_softmax_base = [](const float* row, size_t n) {
    const double max = *std::max_element(row, row + n);
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(row[i]) - max);
    return max + std::log(sum);
  };
  double kl_sum = 0.0, kl_max = 0.0;
  size_t agree = 0;
  const size_t v = static_cast<size_t>(n_vocab);
  for (size_t t = 0; t < ids.size(); ++t) {
    const float* r = ref.data() + t * v;
    const float* l = got.data() + t * v;
    const double r_lse = log_softmax_base(r, v), l_lse = log_softmax_base(l, v);
    double kl = 0.0;
    for (size_t i = 0; i < v; ++i) {
      const double log_p = r[i] - r_lse;
      kl += std::exp(log_p) * (log_p - (l[i] - l_lse));
    }
    kl_sum += kl;
    kl_max = std::max(kl_max, kl);
    agree += pico::conformance::argmax_row(r, n_vocab) == pico::conformance::argmax_row(l, n_vocab);
  }
  const double kl_mean = kl_sum / static_cast<double>(ids.size());
  const double top1 = static_cast<double>(agree) / static_cast<double>(ids.size());
  std::printf("[conformance] %-28s positions %3zu  mean KL %.3e  max KL %.3e  top-1 %.4f\n", c.name.c_str(),
              ids.size(), kl_mean, kl_max, top1);
  EXPECT_LE(kl_mean, 1e-3);
  EXPECT_GE(top1, 0.99);

  if (c.weight_type == "f32" || c.weight_type == "f16") {
    const std::vector<int32_t> want = llama.greedy(model, ids, 64);
    const std::string got_ids = run(pico + " eval -m " + quote(model) + " --tokens " + quote(tokens) +
                                    " --greedy 64 -t 2 " + c.eval_args);
    EXPECT_EQ(parse_ids(got_ids), want) << "greedy continuations differ";
    EXPECT_EQ(want.size(), 64u);
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

std::vector<Case> cases() {
  struct Family {
    std::string name, args;
  };
  const std::vector<Family> families = {
      {"llama_llama2", "--arch llama --vocab llama2 --layers 2 --embd 64 --ff 128 --heads 4 --kv-heads 2"},
      {"qwen2_qwen3", "--arch qwen2 --vocab qwen3 --layers 2 --embd 64 --ff 128 --heads 4 --kv-heads 2"},
      {"qwen3_qwen3", "--arch qwen3 --vocab qwen3 --layers 2 --embd 64 --ff 128 --heads 4 --kv-heads 2 --head-dim 32"},
      // 8 experts, 2 per token, each 64 wide.
      {"qwen3moe_qwen3", "--arch qwen3moe --vocab qwen3 --layers 2 --embd 64 --ff 128 --heads 4 --kv-heads 2 "
                         "--head-dim 32 --experts 8 --experts-used 2 --expert-ff 64"},
      {"gpt2_gpt2", "--arch gpt2 --vocab gpt2 --layers 2 --embd 64 --ff 256 --heads 4 --kv-heads 4 --tied"},
      // A window of 16 over ~100 positions: layer 0 slides, layer 1 (of a pattern of 6: the 6th is global) too.
      {"gemma3_gemma3", "--arch gemma3 --vocab gemma3 --layers 2 --embd 64 --ff 128 --heads 4 --kv-heads 2 "
                        "--head-dim 32 --tied --sliding-window 16"},
      // Hybrids: 4 layers, every 2nd gated attention, the others Gated DeltaNet (key and
      // value heads of 64, ggml's 64-float dot steps); MoE ones with a shared expert.
      {"qwen35_qwen3", "--arch qwen35 --vocab qwen3 --layers 4 --embd 64 --ff 128 --heads 4 --kv-heads 2 "
                       "--head-dim 32 --full-attention-interval 2 --ssm-state 64 --ssm-groups 2 --ssm-value-heads 4"},
      {"qwen35moe_qwen3", "--arch qwen35moe --vocab qwen3 --layers 4 --embd 64 --ff 128 --heads 4 --kv-heads 2 "
                          "--head-dim 32 --full-attention-interval 2 --ssm-state 64 --ssm-groups 2 --ssm-value-heads 4 "
                          "--experts 8 --experts-used 2 --expert-ff 64 --shared-expert-ff 96"},
      {"qwen3next_qwen3", "--arch qwen3next --vocab qwen3 --layers 4 --embd 64 --ff 128 --heads 4 --kv-heads 2 "
                          "--head-dim 32 --full-attention-interval 2 --ssm-state 64 --ssm-groups 2 --ssm-value-heads 4 "
                          "--experts 8 --experts-used 2 --expert-ff 64 --tied"},
  };
  std::vector<Case> out;
  for (const Family& f : families) {
    for (const char* type : {"f32", "f16", "bf16"}) out.push_back({f.name + "_" + type, f.args, type, ""});
  }
  // Tied embeddings, GQA with one KV head (llama3 vocabulary).
  out.push_back({"llama_llama3_tied_f16",
                 "--arch llama --vocab llama3 --layers 2 --embd 64 --ff 128 --heads 4 --kv-heads 1 --tied", "f16", ""});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Cases, ModelConformance, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& param_info) { return param_info.param.name; });

}  // namespace
