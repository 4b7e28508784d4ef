// Each `pico` subcommand registers itself on the CLI11 app and runs when chosen.
// One file per subcommand; main.cpp only lists them.
#pragma once

#include <CLI/CLI.hpp>

namespace pico::cli {

// Adds the subcommand; the callback it sets runs the command and may throw
// std::exception, which main() reports as "pico <command>: <message>" (exit 1).
void add_inspect_command(CLI::App& app);
void add_mkmodel_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);  // tokenize and detokenize
void add_eval_command(CLI::App& app);      // eval (logits of token ids) and run (generate)
void add_quantize_command(CLI::App& app);
void add_template_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_chat_command(CLI::App& app);
void add_keygen_command(CLI::App& app);
void add_plan_command(CLI::App& app);    // placement of a cluster's workers (coordinator/placement.hpp)  // CURVE key pairs for the cluster's links

}  // namespace pico::cli
