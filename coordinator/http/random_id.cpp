#include "http/random_id.hpp"

#include <random>

namespace pico::coordinator::http_api {

std::string random_id(const std::string& prefix, int length) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string id = prefix;
  for (int i = 0; i < length; ++i) id += kAlphabet[rng() % (sizeof(kAlphabet) - 1)];
  return id;
}

}  // namespace pico::coordinator::http_api
