// This process's cgroups as <root>/proc/self/cgroup lists them, and the limits the
// worker asks them for: the memory left under a limit (memory_room.hpp) and the CPU
// time a quota allows.
#pragma once

#include <string>
#include <vector>

namespace pico::model {

// One line of /proc/self/cgroup: "0::/path" (v2: no controllers) or
// "N:cpu,cpuacct:/path" (v1).
struct CgroupLine {
  std::string controllers;  // "" for v2's unified hierarchy
  std::string path;         // from its hierarchy's root, "/" for the root
};
std::vector<CgroupLine> cgroup_lines(const std::string& root = "");

// Whether a v1 line lists `controller` (a v2 line lists none).
bool lists_controller(const CgroupLine& line, const std::string& controller);

// The directory a line's path names under its hierarchy's mount (`mount`: e.g.
// <root>/sys/fs/cgroup for v2), and each directory above it up to the mount, own
// first. Inside a container the path names the host's cgroup and the mount's root is
// the container's own: the directories that do not exist are left out.
std::vector<std::string> cgroup_dirs(const std::string& mount, const CgroupLine& line);

// CPUs this process may use over time under a CPU quota: v2 cpu.max ("quota period"),
// v1 cpu.cfs_quota_us / cpu.cfs_period_us; the tightest of its cgroup's and those
// above it; 0 when none sets one. A run shorter than the quota's period can take a
// whole CPU and only a later one waits, so a short measure does not see the quota.
double cpu_quota(const std::string& root = "");

}  // namespace pico::model
