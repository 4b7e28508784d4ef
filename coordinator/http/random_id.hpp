// Random ids of the API's objects (chatcmpl-..., msg_..., call ids): a prefix and
// `length` letters and digits.
#pragma once

#include <string>

namespace pico::coordinator::http_api {

std::string random_id(const std::string& prefix, int length = 24);

}  // namespace pico::coordinator::http_api
