// The streaming residency's decisions (what to give back, in which order) and where the
// memory left is read from; model_test runs a forward through it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "model/cgroup.hpp"
#include "model/memory_room.hpp"
#include "model/residency.hpp"

namespace pico::model {
namespace {

namespace fs = std::filesystem;

TEST(Residency, GivesBackOnlyWhatTheReadAheadLacks) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  EXPECT_EQ(bytes_to_release(0, 0, 8 * kMiB), 0u);                   // nothing to read
  EXPECT_EQ(bytes_to_release(20 * kMiB, 100 * kMiB, 8 * kMiB), 0u);   // it fits
  EXPECT_EQ(bytes_to_release(20 * kMiB, 28 * kMiB, 8 * kMiB), 0u);    // exactly, with the margin
  EXPECT_EQ(bytes_to_release(20 * kMiB, 10 * kMiB, 8 * kMiB), 18 * kMiB);
  EXPECT_EQ(bytes_to_release(20 * kMiB, 0, 8 * kMiB), 28 * kMiB);
}

TEST(Residency, GivesBackTheLayersNeededLastFirst) {
  // Layer 5 computes, 6 is read ahead: 4, 3, 2, then around the range to 7.
  EXPECT_EQ(release_order({2, 8}, 5), (std::vector<int32_t>{4, 3, 2, 7}));
  // The last layer computes, the first is next.
  EXPECT_EQ(release_order({0, 4}, 3), (std::vector<int32_t>{2, 1}));
  EXPECT_EQ(release_order({0, 4}, 0), (std::vector<int32_t>{3, 2}));
  // Two layers: one computes, the other comes next; nothing can go.
  EXPECT_TRUE(release_order({0, 2}, 0).empty());
  EXPECT_TRUE(release_order({0, 4}, 9).empty());
}

// A directory shaped as / (proc and sys files) for MemoryRoom.
class FakeRoot {
 public:
  FakeRoot() : dir_(fs::temp_directory_path() / ("pico-memroom-" + std::to_string(::getpid()))) {
    fs::remove_all(dir_);
    write("proc/meminfo", "MemTotal:       24000000 kB\nMemAvailable:    2000000 kB\nBuffers: 1 kB\n");
  }
  ~FakeRoot() { fs::remove_all(dir_); }
  void write(const std::string& path, const std::string& text) {
    fs::create_directories((dir_ / path).parent_path());
    std::ofstream(dir_ / path) << text;
  }
  std::string root() const { return dir_.string(); }

 private:
  fs::path dir_;
};

TEST(MemoryRoom, WithoutACgroupLimitMemAvailable) {
  FakeRoot root;
  root.write("proc/self/cgroup", "0::/user.slice\n");
  root.write("sys/fs/cgroup/user.slice/memory.max", "max\n");
  root.write("sys/fs/cgroup/user.slice/memory.current", "123\n");
  const MemoryUse use = MemoryRoom(root.root()).now();
  EXPECT_EQ(use.limit, 0u);
  EXPECT_EQ(use.available, uint64_t{2000000} * 1024);
}

TEST(MemoryRoom, CgroupV2RoomBelowMemAvailable) {
  FakeRoot root;
  root.write("proc/self/cgroup", "0::/pico\n");
  root.write("sys/fs/cgroup/pico/memory.max", "1000000\n");
  root.write("sys/fs/cgroup/pico/memory.current", "400000\n");
  const MemoryRoom room(root.root());
  EXPECT_EQ(room.limit_file(), root.root() + "/sys/fs/cgroup/pico/memory.max");
  const MemoryUse use = room.now();
  EXPECT_EQ(use.limit, 1000000u);
  EXPECT_EQ(use.used, 400000u);
  EXPECT_EQ(use.available, 600000u);
  // Usage at or over the limit: no room.
  root.write("sys/fs/cgroup/pico/memory.current", "1000500\n");
  EXPECT_EQ(room.available(), 0u);
}

TEST(MemoryRoom, CgroupV1MemoryControllerAndUnlimited) {
  FakeRoot root;
  root.write("proc/self/cgroup", "12:pids:/x\n4:cpu,memory:/bench/a\n0::/\n");
  root.write("sys/fs/cgroup/memory/bench/a/memory.limit_in_bytes", "3145728000\n");
  root.write("sys/fs/cgroup/memory/bench/a/memory.usage_in_bytes", "3000000000\n");
  EXPECT_EQ(MemoryRoom(root.root()).now().available, 145728000u);
  // v1's "no limit" is a huge number: MemAvailable alone.
  root.write("sys/fs/cgroup/memory/bench/a/memory.limit_in_bytes", "9223372036854771712\n");
  const MemoryUse use = MemoryRoom(root.root()).now();
  EXPECT_EQ(use.limit, 0u);
  EXPECT_EQ(use.available, uint64_t{2000000} * 1024);
}

TEST(MemoryRoom, InsideAContainerTheMountIsTheCgroup) {
  FakeRoot root;  // the path names the host's cgroup, the mount holds the container's own
  root.write("proc/self/cgroup", "0::/docker/abc\n");
  root.write("sys/fs/cgroup/memory.max", "5000\n");
  root.write("sys/fs/cgroup/memory.current", "1000\n");
  EXPECT_EQ(MemoryRoom(root.root()).now().available, 4000u);
}

TEST(CpuQuota, CgroupV2TheTightestOfItsOwnAndThoseAbove) {
  FakeRoot root;
  root.write("proc/self/cgroup", "0::/bench/node-b\n");
  EXPECT_EQ(cpu_quota(root.root()), 0.0);  // no file: no quota
  root.write("sys/fs/cgroup/bench/node-b/cpu.max", "max 100000\n");
  root.write("sys/fs/cgroup/bench/cpu.max", "max 100000\n");
  EXPECT_EQ(cpu_quota(root.root()), 0.0);
  root.write("sys/fs/cgroup/bench/node-b/cpu.max", "5000 10000\n");
  EXPECT_DOUBLE_EQ(cpu_quota(root.root()), 0.5);
  root.write("sys/fs/cgroup/bench/cpu.max", "25000 100000\n");  // the parent's binds
  EXPECT_DOUBLE_EQ(cpu_quota(root.root()), 0.25);
  root.write("sys/fs/cgroup/bench/cpu.max", "400000 100000\n");  // 4 CPUs: its own binds
  EXPECT_DOUBLE_EQ(cpu_quota(root.root()), 0.5);
  root.write("sys/fs/cgroup/bench/node-b/cpu.max", "garbage\n");
  EXPECT_DOUBLE_EQ(cpu_quota(root.root()), 4.0);
}

TEST(CpuQuota, CgroupV1CpuController) {
  FakeRoot root;
  root.write("proc/self/cgroup", "5:cpu,cpuacct:/bench/a\n4:memory:/bench/a\n");
  root.write("sys/fs/cgroup/cpu,cpuacct/bench/a/cpu.cfs_quota_us", "-1\n");
  root.write("sys/fs/cgroup/cpu,cpuacct/bench/a/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(cpu_quota(root.root()), 0.0);
  root.write("sys/fs/cgroup/cpu,cpuacct/bench/a/cpu.cfs_quota_us", "150000\n");
  EXPECT_DOUBLE_EQ(cpu_quota(root.root()), 1.5);
}

TEST(CpuQuota, InsideAContainerTheMountIsTheCgroup) {
  FakeRoot root;  // the path names the host's cgroup, the mount holds the container's own
  root.write("proc/self/cgroup", "0::/kubepods/pod1/abc\n");
  root.write("sys/fs/cgroup/cpu.max", "50000 100000\n");
  EXPECT_DOUBLE_EQ(cpu_quota(root.root()), 0.5);
}

TEST(MemoryRoom, ThisMachineAnswers) {
  const MemoryUse use = MemoryRoom().now();
  EXPECT_GT(use.available, 0u);
  if (use.limit > 0) {
    EXPECT_LE(use.available, use.limit);
  }
}

}  // namespace
}  // namespace pico::model
