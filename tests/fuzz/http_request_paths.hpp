// The endpoints http_request_fuzz picks from (its first input byte) and its seeds use.
#pragma once

#include <array>
#include <string_view>

namespace pico::fuzz {

inline constexpr std::array<std::string_view, 13> kHttpRequestPaths = {
    "/completion",     "/v1/completions", "/v1/chat/completions",      "/tokenize",      "/detokenize", "/no-such-route",
    "/apply-template", "/v1/messages",    "/v1/messages/count_tokens", "/v1/embeddings", "/embedding",  "/infill",
    "/v1/responses"};

}  // namespace pico::fuzz
