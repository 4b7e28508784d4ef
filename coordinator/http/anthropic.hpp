// Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) as a chat request:
// the body becomes the OpenAI chat body pico parses (request_parsing.hpp), so both APIs
// share one parser, one set of limits and one chat template path.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace pico::coordinator::http_api {

// Translates a Messages request: system (text or text blocks), messages (user /
// assistant, text or text blocks; an assistant's tool_use blocks become its tool_calls,
// a user's tool_result blocks tool messages), tools (client tools: name, description,
// input_schema) and tool_choice (auto, any = required, tool = a named function, none;
// disable_parallel_tool_use), max_tokens (required unless `for_counting`),
// stop_sequences, temperature, top_p, top_k, stream, thinking (enabled / disabled).
// Other blocks (images, documents) and server tools are refused with an ApiError naming
// the field; other fields are ignored, as the OpenAI endpoints ignore unknown ones.
nlohmann::json chat_request_from_messages(const nlohmann::json& body, bool for_counting = false);

// Anthropic's stop_reason for pico's finish reason ("stop", "stop_string", "length";
// a reply with tool calls stops for "tool_use").
std::string anthropic_stop_reason(const std::string& finish_reason);

}  // namespace pico::coordinator::http_api
