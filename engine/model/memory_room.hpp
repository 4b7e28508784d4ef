// How much memory this process may still fill before something must be given back: the
// room left under its cgroup's limit (v2 memory.max - memory.current, v1
// memory.limit_in_bytes - memory.usage_in_bytes; page cache counts there, so a range
// read from its mapping fills it) and MemAvailable, whichever is less. The weight
// residency asks it before each layer's read-ahead, so that it releases only what must
// make room, and the worker reports it as its free memory.
#pragma once

#include <cstdint>
#include <string>

namespace pico::model {

struct MemoryUse {
  uint64_t limit = 0;      // the cgroup's limit in bytes, 0 when it has none
  uint64_t used = 0;       // the cgroup's usage (with page cache), 0 without a limit
  uint64_t available = 0;  // room left: min(limit - used, MemAvailable); 0 when unknown
};

// MemAvailable of <root>/proc/meminfo in bytes, 0 when unknown.
uint64_t mem_available_bytes(const std::string& root = "");

class MemoryRoom {
 public:
  // `root` prefixes /proc and /sys (tests hand a directory of such files).
  explicit MemoryRoom(std::string root = "");
  MemoryUse now() const;
  uint64_t available() const { return now().available; }
  // Where the limit was found ("" without one): for the log.
  const std::string& limit_file() const { return limit_file_; }

 private:
  std::string root_;
  std::string limit_file_, usage_file_;
};

}  // namespace pico::model
