// pico quantize IN OUT TYPE: a float GGUF (F32/F16/BF16) to any quantized type or
// llama.cpp-named mix (Q4_K_M, ...). See tools/quantize/model_quantizer.hpp.
#include <spdlog/spdlog.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "commands.hpp"
#include "quantize/model_quantizer.hpp"

namespace pico::cli {
namespace {

struct QuantizeOptions {
  std::string input, output, type;
  int threads = 2;
};

void run_quantize(const QuantizeOptions& options) {
  const auto plan = tools::parse_quantize_type(options.type);
  if (!plan) throw std::invalid_argument("unknown quantization type '" + options.type + "'");
  const tools::QuantizeReport report = tools::quantize_model(options.input, options.output, *plan, options.threads);
  spdlog::info("{} tensors quantized, {:.1f} MiB -> {:.1f} MiB, wrote {}", report.tensors_quantized,
               static_cast<double>(report.bytes_in) / (1 << 20), static_cast<double>(report.bytes_out) / (1 << 20),
               options.output);
}

}  // namespace

void add_quantize_command(CLI::App& app) {
  auto options = std::make_shared<QuantizeOptions>();
  CLI::App* command = app.add_subcommand("quantize", "Quantize a float GGUF (F32/F16/BF16) to TYPE");
  command->add_option("input", options->input, "Input GGUF")->required()->check(CLI::ExistingFile);
  command->add_option("output", options->output, "Output GGUF")->required();
  command->add_option("type", options->type,
                      "q4_0 q4_1 q5_0 q5_1 q8_0 q2_K q3_K q4_K q5_K q6_K iq4_nl iq4_xs tq1_0 tq2_0 mxfp4 nvfp4 "
                      "q1_0 q2_0 q6_0 f16 bf16 f32, or a mix: Q3_K_M Q4_K_S Q4_K_M Q5_K_M")
      ->required();
  command->add_option("-t,--threads", options->threads, "Threads")->default_val(2);
  command->callback([options] { run_quantize(*options); });
}

}  // namespace pico::cli
