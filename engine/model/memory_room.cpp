#include "model/memory_room.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>

#include "model/cgroup.hpp"

namespace pico::model {

namespace {

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// The number a file starts with; false for "max", a missing file or anything else.
bool read_number(const std::string& path, uint64_t& value) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word.empty() || word[0] < '0' || word[0] > '9') return false;
  try {
    value = std::stoull(word);
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

}  // namespace

uint64_t mem_available_bytes(const std::string& root) {
  std::ifstream in(root + "/proc/meminfo");
  std::string key, rest;
  uint64_t value = 0;
  while (in >> key >> value) {
    std::getline(in, rest);
    if (key == "MemAvailable:") return value * 1024;
  }
  return 0;
}

MemoryRoom::MemoryRoom(std::string root) : root_(std::move(root)) {
  for (const CgroupLine& line : cgroup_lines(root_)) {
    std::string mount, limit, usage;
    if (line.controllers.empty()) {
      mount = root_ + "/sys/fs/cgroup";
      limit = "memory.max", usage = "memory.current";
    } else if (lists_controller(line, "memory")) {
      mount = root_ + "/sys/fs/cgroup/memory";
      limit = "memory.limit_in_bytes", usage = "memory.usage_in_bytes";
    } else {
      continue;
    }
    // Inside a container the cgroup's own directory is the mount's root.
    const std::string own = mount + (line.path == "/" ? "" : line.path);
    const std::string chosen = exists(own + "/" + limit) ? own : mount;
    if (!exists(chosen + "/" + limit)) continue;
    limit_file_ = chosen + "/" + limit;
    usage_file_ = chosen + "/" + usage;
    if (!line.controllers.empty()) break;  // v1's memory controller wins over a v2 line beside it
  }
}

MemoryUse MemoryRoom::now() const {
  MemoryUse use;
  use.available = mem_available_bytes(root_);
  uint64_t limit = 0, used = 0;
  // v1 writes "no limit" as a huge number (a page-rounded INT64_MAX).
  if (!limit_file_.empty() && read_number(limit_file_, limit) && limit < (uint64_t{1} << 60) &&
      read_number(usage_file_, used)) {
    use.limit = limit;
    use.used = used;
    const uint64_t room = used < limit ? limit - used : 0;
    use.available = use.available == 0 ? room : std::min(use.available, room);
  }
  return use;
}

}  // namespace pico::model
