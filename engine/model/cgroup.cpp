#include "model/cgroup.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <sstream>

namespace pico::model {

namespace {

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The quota a cgroup directory sets, in CPUs; 0 for none ("max", -1, a missing or
// malformed file).
double quota_of(const std::string& dir, bool v2) {
  double quota = 0, period = 0;
  if (v2) {
    std::ifstream in(dir + "/cpu.max");
    std::string first;
    if (!(in >> first >> period) || first == "max") return 0;
    std::istringstream(first) >> quota;
  } else {
    std::ifstream q(dir + "/cpu.cfs_quota_us"), p(dir + "/cpu.cfs_period_us");
    if (!(q >> quota) || !(p >> period)) return 0;
  }
  return quota > 0 && period > 0 ? quota / period : 0;
}

}  // namespace

std::vector<CgroupLine> cgroup_lines(const std::string& root) {
  std::vector<CgroupLine> out;
  std::ifstream in(root + "/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    out.push_back({line.substr(a + 1, b - a - 1), line.substr(b + 1)});
  }
  return out;
}

bool lists_controller(const CgroupLine& line, const std::string& controller) {
  return ("," + line.controllers + ",").find("," + controller + ",") != std::string::npos;
}

std::vector<std::string> cgroup_dirs(const std::string& mount, const CgroupLine& line) {
  std::vector<std::string> out;
  std::string path = line.path;
  while (!path.empty() && path != "/") {
    if (is_directory(mount + path)) out.push_back(mount + path);
    path.resize(path.rfind('/'));
  }
  if (is_directory(mount)) out.push_back(mount);
  return out;
}

double cpu_quota(const std::string& root) {
  double tightest = 0;
  for (const CgroupLine& line : cgroup_lines(root)) {
    const bool v2 = line.controllers.empty();
    if (!v2 && !lists_controller(line, "cpu")) continue;
    // v1 mounts the cpu controller at cpu (often a link to cpu,cpuacct).
    std::string mount = root + "/sys/fs/cgroup";
    if (!v2) mount += is_directory(mount + "/cpu") ? "/cpu" : "/" + line.controllers;
    for (const std::string& dir : cgroup_dirs(mount, line)) {
      const double quota = quota_of(dir, v2);
      if (quota > 0) tightest = tightest == 0 ? quota : std::min(tightest, quota);
    }
  }
  return tightest;
}

}  // namespace pico::model
