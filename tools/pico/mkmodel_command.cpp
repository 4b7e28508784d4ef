// pico mkmodel: writes a seeded random GGUF of a small transformer with a real
// vocabulary (tools/synthetic/), for tests against llama.cpp.
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>

#include "commands.hpp"
#include "synthetic/synthetic_model.hpp"

namespace pico::cli {
namespace {

namespace fs = std::filesystem;

struct MkmodelOptions {
  std::string arch = "llama";
  std::string vocab = "llama2";
  std::string type = "f32";
  std::string node_modules;
  std::string output;
  std::string chat_template_file;  // non-empty: its text is tokenizer.chat_template (instead of the vocabulary's)
  size_t split_max_tensors = 0;  // > 0: write a split model, as llama.cpp's gguf-split does
  synthetic::SyntheticSpec spec;
};

// tests/conformance/node_modules in a folder above `start` (or in it), if any.
std::optional<fs::path> find_node_modules_above(fs::path start) {
  std::error_code ec;
  for (fs::path dir = start; !dir.empty(); dir = dir.parent_path()) {
    const fs::path candidate = dir / "tests" / "conformance" / "node_modules";
    if (fs::is_directory(candidate, ec)) return candidate;
    if (dir == dir.parent_path()) break;
  }
  return std::nullopt;
}

// --node-modules, else $PICO_NODE_MODULES, else the repository's
// tests/conformance/node_modules found above the executable or the working folder.
fs::path resolve_node_modules(const std::string& given) {
  if (!given.empty()) return given;
  if (const char* env = std::getenv("PICO_NODE_MODULES"); env && *env) return env;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    if (auto found = find_node_modules_above(exe.parent_path())) return *found;
  }
  if (auto found = find_node_modules_above(fs::current_path(ec))) return *found;
  throw std::runtime_error(
      "cannot find tests/conformance/node_modules (run scripts/setup.sh, or pass --node-modules / set "
      "PICO_NODE_MODULES)");
}

std::string human_bytes(uintmax_t bytes) {
  if (bytes < 1024 * 1024) return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / 1024.0);
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

// The architecture-specific part of the summary line.
std::string details(const synthetic::SyntheticSpec& spec) {
  std::string out;
  if (synthetic::is_hybrid(spec.architecture)) {
    uint32_t full = 0;
    for (uint32_t i = 0; i < spec.n_layers; ++i) full += synthetic::is_full_attention_layer(spec, i) ? 1 : 0;
    out += fmt::format(
        ", {} full-attention layers (interval {}) with rope dims {}, {} Gated DeltaNet layers (conv {}, state {}, "
        "{} key / {} value heads)",
        full, synthetic::full_attention_interval_of(spec), synthetic::rope_dims_of(spec), spec.n_layers - full,
        spec.ssm_conv_kernel, spec.ssm_state, spec.ssm_groups, spec.ssm_value_heads);
  }
  if (synthetic::has_experts(spec.architecture)) {
    const uint32_t n_ff_exp = spec.n_ff_exp > 0 ? spec.n_ff_exp : spec.n_ff;
    out += fmt::format(", {} experts ({} used) of ff {}", spec.n_expert, spec.n_expert_used, n_ff_exp);
    if (spec.architecture != synthetic::Architecture::qwen3moe) {
      out += fmt::format(" + a shared expert of ff {}", spec.n_ff_shexp > 0 ? spec.n_ff_shexp : n_ff_exp);
    }
  }
  return out;
}

void run_mkmodel(MkmodelOptions options) {
  synthetic::SyntheticSpec& spec = options.spec;
  const auto arch = synthetic::parse_architecture(options.arch);
  if (!arch) throw std::invalid_argument("unknown architecture '" + options.arch + "'");
  const auto vocab = synthetic::parse_vocab_kind(options.vocab);
  if (!vocab) throw std::invalid_argument("unknown vocabulary '" + options.vocab + "'");
  const std::map<std::string, GgmlType> types = {{"f32", GgmlType::F32}, {"f16", GgmlType::F16}, {"bf16", GgmlType::BF16}};
  const auto type = types.find(options.type);
  if (type == types.end()) throw std::invalid_argument("unknown weight type '" + options.type + "' (f32, f16, bf16)");

  spec.architecture = *arch;
  spec.vocab = *vocab;
  spec.weight_type = type->second;
  spec.node_modules = resolve_node_modules(options.node_modules);
  synthetic::validate(spec);

  synthetic::Vocabulary vocabulary = synthetic::load_vocabulary(spec.vocab, spec.node_modules);
  if (!options.chat_template_file.empty()) {
    std::ifstream in(options.chat_template_file, std::ios::binary);
    if (!in) throw std::runtime_error("cannot open the chat template " + options.chat_template_file);
    std::ostringstream text;
    text << in.rdbuf();
    vocabulary.chat_template = text.str();
  }
  const gguf::Writer writer = synthetic::build_synthetic_model(spec, vocabulary);
  std::error_code ec;
  uintmax_t size = 0;
  if (options.split_max_tensors > 0) {
    // "dir/model.gguf" becomes dir/model-00001-of-0000N.gguf, ...
    fs::path prefix = options.output;
    if (prefix.extension() == ".gguf") prefix.replace_extension();
    const auto parts = writer.write_split(prefix, options.split_max_tensors);
    for (const fs::path& part : parts) size += fs::file_size(part, ec);
    options.output = parts.front().string() + fmt::format(" (+{} more parts)", parts.size() - 1);
  } else {
    writer.write(options.output);
    size = fs::file_size(options.output, ec);
  }
  std::cerr << fmt::format(
      "pico mkmodel: wrote {}: {} with the {} vocabulary ({} tokens), {} layers, embd {}, ff {}, heads {}/{}, "
      "head dim {}, ctx {}, {}, seed {}, {} embeddings, {} tensors, {}{}\n",
      options.output, options.arch, options.vocab, vocabulary.size(), spec.n_layers, spec.n_embd, spec.n_ff,
      spec.n_head, spec.n_head_kv, synthetic::head_dim_of(spec), spec.n_ctx_train, options.type, spec.seed,
      spec.tied_embeddings ? "tied" : "untied", writer.tensors().size(), ec ? std::string("?") : human_bytes(size),
      details(spec));
}

}  // namespace

void add_mkmodel_command(CLI::App& app) {
  auto options = std::make_shared<MkmodelOptions>();
  synthetic::SyntheticSpec& spec = options->spec;
  CLI::App* command =
      app.add_subcommand("mkmodel", "Write a seeded random GGUF model with a real vocabulary (for tests)");
  command->add_option("--arch", options->arch,
                      "Architecture: llama, qwen2, qwen3, qwen3moe, gpt2, gemma3, qwen35, qwen35moe, qwen3next")
      ->default_val("llama");
  command->add_option("--vocab", options->vocab, "Vocabulary: llama2, gemma3, qwen3, llama3, gpt2")
      ->default_val("llama2");
  command->add_option("--layers", spec.n_layers, "Transformer blocks")->default_val(2);
  command->add_option("--embd", spec.n_embd, "Embedding length")->default_val(64);
  command->add_option("--ff", spec.n_ff, "Feed-forward length")->default_val(128);
  command->add_option("--heads", spec.n_head, "Attention heads")->default_val(4);
  CLI::Option* kv_heads =
      command->add_option("--kv-heads", spec.n_head_kv, "Key/value heads (gpt2: always = heads)")->default_val(2);
  command->add_option("--head-dim", spec.head_dim, "Head dimension (default embd / heads)")->default_val(0);
  command->add_option("--ctx", spec.n_ctx_train, "Training context length")->default_val(256);
  command->add_option("--rope-base", spec.rope_freq_base, "RoPE frequency base (default: the architecture's)")
      ->default_val(0);
  command->add_option("--eps", spec.norm_eps, "Norm epsilon (default: the architecture's)")->default_val(0);
  command->add_option("--sliding-window", spec.sliding_window, "gemma3 sliding window (0: none)")
      ->default_val(512);
  command->add_option("--experts", spec.n_expert, "qwen3moe, qwen35moe, qwen3next: experts per layer")
      ->default_val(8);
  command->add_option("--experts-used", spec.n_expert_used, "qwen3moe, qwen35moe, qwen3next: experts each token uses")
      ->default_val(2);
  command->add_option("--expert-ff", spec.n_ff_exp, "qwen3moe, qwen35moe, qwen3next: expert feed-forward length (0: --ff)")
      ->default_val(0);
  command->add_option("--shared-expert-ff", spec.n_ff_shexp,
                      "qwen35moe, qwen3next: shared expert feed-forward length (0: --expert-ff)")
      ->default_val(0);
  command->add_option("--full-attention-interval", spec.full_attention_interval,
                      "qwen35, qwen35moe, qwen3next: layer i is full attention iff (i + 1) % N == 0, the others "
                      "Gated DeltaNet (2 <= N <= layers; 0: 4, or the layers when fewer)")
      ->default_val(0);
  command->add_option("--rope-dims", spec.rope_dims,
                      "Rotated dims per head (0: head dim; qwen35, qwen35moe, qwen3next: head dim / 4, partial rope)")
      ->default_val(0);
  command->add_option("--ssm-conv", spec.ssm_conv_kernel, "Gated DeltaNet: conv kernel taps (ssm.conv_kernel)")
      ->default_val(4);
  command->add_option("--ssm-state", spec.ssm_state,
                      "Gated DeltaNet: key/value head dim (ssm.state_size; inner size = state x value heads)")
      ->default_val(32);
  command->add_option("--ssm-groups", spec.ssm_groups, "Gated DeltaNet: key heads (ssm.group_count)")
      ->default_val(2);
  command->add_option("--ssm-value-heads", spec.ssm_value_heads,
                      "Gated DeltaNet: value heads (ssm.time_step_rank), a multiple of --ssm-groups")
      ->default_val(4);
  command->add_option("--type", options->type, "Matrix type: f32, f16, bf16 (norms and biases stay f32)")
      ->default_val("f32");
  command->add_option("--seed", spec.seed, "Random seed")->default_val(1);
  command->add_flag("--tied", spec.tied_embeddings, "Tie the output head to token_embd (no output.weight)");
  command->add_option("--name", spec.name, "general.name (default synthetic-<arch>-<vocab>)");
  command->add_option("--node-modules", options->node_modules,
                      "Folder holding the vocabulary packages (default $PICO_NODE_MODULES, else "
                      "tests/conformance/node_modules of this checkout)");
  command->add_option("--chat-template", options->chat_template_file,
                      "Write this file's text as tokenizer.chat_template (default: the vocabulary's template, if any)")
      ->check(CLI::ExistingFile);
  command->add_option("-o,--output", options->output, "Output .gguf")->required();
  command->add_option("--split-max-tensors", options->split_max_tensors,
                      "Write a split model (OUT-00001-of-0000N.gguf ...) of at most N tensors per file");
  command->callback([options, kv_heads] {
    // GPT-2 has no grouped-query attention: unless asked otherwise, kv heads = heads.
    if (options->arch == "gpt2" && kv_heads->count() == 0) options->spec.n_head_kv = options->spec.n_head;
    run_mkmodel(*options);
  });
}

}  // namespace pico::cli
