// What the Vulkan backend's tests share: device 0's backend, or the reason there is none
// (REQUIRE_BACKEND skips the test, saying why).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "backend/backend.hpp"
#include "backend/vulkan/vulkan_backend.hpp"

namespace pico::backend {

inline std::unique_ptr<Backend> open_or_reason(std::string& reason) {
  try {
    return make_vulkan_backend(0, 1);
  } catch (const std::runtime_error& e) {
    reason = e.what();
    return nullptr;
  }
}

#define REQUIRE_BACKEND(be)                                  \
  std::string reason_;                                       \
  std::unique_ptr<Backend> be = open_or_reason(reason_);     \
  if (!be) GTEST_SKIP() << "no Vulkan device: " << reason_  // reason: built without Vulkan or no device

}  // namespace pico::backend
