// OpenAI's Responses API (/v1/responses) as a chat request: the input items become
// chat messages (instructions a system message; input_text / output_text parts;
// function_call items an assistant's tool_calls, function_call_output items tool
// messages), function tools (flat: name, description, parameters, strict) OpenAI chat
// tools, max_output_tokens max_tokens, text.format a response_format. pico keeps no
// responses: previous_response_id, background and include are refused, and the reply
// says store false. Other tool kinds, images and files are refused naming the field.
#pragma once

#include <nlohmann/json.hpp>

namespace pico::coordinator::http_api {

// Throws ApiError (400) naming the field at fault.
nlohmann::json chat_request_from_responses(const nlohmann::json& body);

}  // namespace pico::coordinator::http_api
