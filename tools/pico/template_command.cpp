// pico template: renders OpenAI-style messages through the model's chat template
// (recognised from tokenizer.chat_template and the vocabulary, or named with
// --chat-template) and prints the prompt text the model would be given.
#include <nlohmann/json.hpp>

#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.hpp"
#include "gguf/reader.hpp"
#include "tokenizer/chat_template.hpp"

namespace pico::cli {
namespace {

struct TemplateOptions {
  std::string model_path;
  std::string messages_path;  // "-" reads standard input
  std::string chat_template;  // a format name; empty: the model's
  bool no_generation_prompt = false;
  bool no_thinking = false;
  bool show_name = false;
};

std::vector<tokenizer::ChatMessage> read_messages(const std::string& path) {
  std::stringstream text;
  if (path == "-") {
    text << std::cin.rdbuf();
  } else {
    std::ifstream file(path);
    if (!file) throw std::runtime_error("cannot open " + path);
    text << file.rdbuf();
  }
  const nlohmann::json json = nlohmann::json::parse(text.str());
  const nlohmann::json& list = json.is_object() && json.contains("messages") ? json["messages"] : json;
  if (!list.is_array()) throw std::invalid_argument("messages: expected a JSON array of {role, content}");
  std::vector<tokenizer::ChatMessage> messages;
  for (const nlohmann::json& message : list) {
    if (!message.is_object() || !message.value("role", nlohmann::json()).is_string() ||
        !message.value("content", nlohmann::json()).is_string()) {
      throw std::invalid_argument("messages: each message needs a string role and a string content");
    }
    std::optional<std::string> reasoning;
    if (const nlohmann::json r = message.value("reasoning_content", nlohmann::json()); !r.is_null()) {
      if (!r.is_string()) throw std::invalid_argument("messages: a reasoning_content must be a string");
      reasoning = r.get<std::string>();
    }
    messages.push_back({message["role"].get<std::string>(), message["content"].get<std::string>(), reasoning});
  }
  return messages;
}

void run_template(const TemplateOptions& options) {
  auto model = gguf::Model::open(options.model_path);
  const auto chat = tokenizer::ChatTemplate::from_metadata(model->metadata(), nullptr, options.chat_template);
  const auto messages = read_messages(options.messages_path);
  if (options.show_name) std::cerr << "chat template: " << chat.name() << "\n";
  std::cout << chat.apply(messages, tokenizer::ChatOptions{!options.no_generation_prompt, !options.no_thinking});
}

}  // namespace

void add_template_command(CLI::App& app) {
  auto options = std::make_shared<TemplateOptions>();
  CLI::App* command = app.add_subcommand("template", "Render chat messages through the model's chat template");
  command->add_option("-m,--model", options->model_path, "GGUF model")->required()->check(CLI::ExistingFile);
  command->add_option("--messages", options->messages_path,
                      "JSON file (or - for stdin): [{\"role\": ..., \"content\": ..., \"reasoning_content\": ...}, ...] or "
                      "{\"messages\": [...]}")
      ->required();
  command->add_option("--chat-template", options->chat_template,
                      "Use this format instead of the model's: chatml, llama2, llama3, mistral, gemma, alpaca, ...");
  command->add_flag("--no-generation-prompt", options->no_generation_prompt, "Do not open an assistant turn");
  command->add_flag("--no-thinking", options->no_thinking,
                    "Formats that think (qwen3, qwen3.5): the reply without reasoning (enable_thinking false)");
  command->add_flag("--show-name", options->show_name, "Print the chosen format's name on stderr");
  command->callback([options] { run_template(*options); });
}

}  // namespace pico::cli
