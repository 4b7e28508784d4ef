// pico: the single-node command line (inspect, mkmodel; run/chat/bench/quantize come
// with their issues). A thin front end over the library code.
#include <spdlog/spdlog.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>

#include "commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"pico: run large language models from GGUF files, on one machine or across several"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "pico 0.1.0");
  spdlog::set_default_logger(spdlog::stderr_color_mt("pico"));  // stdout carries results only

  pico::cli::add_inspect_command(app);
  pico::cli::add_mkmodel_command(app);
  pico::cli::add_tokenize_command(app);
  pico::cli::add_eval_command(app);
  pico::cli::add_quantize_command(app);
  pico::cli::add_template_command(app);
  pico::cli::add_bench_command(app);
  pico::cli::add_chat_command(app);
  pico::cli::add_keygen_command(app);
  pico::cli::add_plan_command(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    const std::string command = app.get_subcommands().empty() ? "" : app.get_subcommands().front()->get_name();
    std::cerr << "pico " << command << ": " << e.what() << "\n";
    return 1;
  }
  return 0;
}
