// pico chat: an interactive conversation on standard input through the model's chat
// template. Each turn renders the whole conversation, keeps the KV of the prefix it
// shares with the previous turn, evaluates the rest and streams the reply.
//
//   pico chat -m M.gguf [--system TEXT] [--chat-template NAME] [-n 512] [sampling flags]
// Lines typed are user turns; an empty line or end of input ends the chat.
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "session.hpp"
#include "tokenizer/chat_template.hpp"

namespace pico::cli {
namespace {

struct ChatOptions {
  EngineOptions engine;
  std::string system;
  std::string chat_template;
  int n_predict = 512;
  int ctx = 0;
  sample::SamplingParams sampling;
};

void run_chat(const ChatOptions& o) {
  Session s(o.engine);
  s.progress = worker::progress_bar("prompt", worker::ProgressUnit::Tokens);
  const auto tok = tokenizer::Tokenizer::from_metadata(s.file->metadata());
  const auto chat = tokenizer::ChatTemplate::from_metadata(s.file->metadata(), nullptr, o.chat_template);
  const int64_t ctx = context_length(s, o.ctx);
  sample::Sampler sampler(o.sampling);
  std::vector<tokenizer::ChatMessage> messages;
  if (!o.system.empty()) messages.push_back({"system", o.system});
  std::vector<int32_t> cached;
  std::vector<float> last;
  std::string line;
  while (true) {
    std::cerr << "> " << std::flush;
    if (!std::getline(std::cin, line) || line.empty()) break;
    messages.push_back({"user", line});
    const std::vector<int32_t> ids = tok->encode(chat.apply(messages, true), true, true);
    if (static_cast<int64_t>(ids.size()) >= ctx) throw std::runtime_error("the conversation is longer than the context");
    evaluate_reusing_prefix(s, cached, ids, last);
    const std::vector<int32_t> reply = generate(s, *tok, sampler, last, o.n_predict, ctx, std::cout);
    std::cout << "\n" << std::flush;
    cached.insert(cached.end(), reply.begin(), reply.end());
    messages.push_back({"assistant", tok->decode(reply)});
  }
}

}  // namespace

void add_chat_command(CLI::App& app) {
  auto options = std::make_shared<ChatOptions>();
  CLI::App* command = app.add_subcommand("chat", "Chat with a model through its chat template (stdin/stdout)");
  add_engine_options(command, options->engine);
  command->add_option("--system", options->system, "system message");
  command->add_option("--chat-template", options->chat_template, "chat format name instead of the model's");
  command->add_option("-n,--n-predict", options->n_predict, "most tokens per reply");
  command->add_option("-c,--ctx", options->ctx, "context length (default: the model's)");
  add_sampling_options(command, options->sampling);
  command->callback([options] { run_chat(*options); });
}

}  // namespace pico::cli
