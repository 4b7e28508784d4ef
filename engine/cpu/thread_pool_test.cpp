#include "cpu/thread_pool.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace pico::cpu {
namespace {

TEST(ThreadPool, DefaultThreadCountIsPositive) { EXPECT_GE(default_thread_count(), 1); }

TEST(ThreadPool, RunsEveryTaskExactlyOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t n : {0, 1, 2, 3, 7, 64, 1000}) {
      for (int repeat = 0; repeat < 20; ++repeat) {
        std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
        std::atomic<bool> bad_thread{false};
        pool.parallel_for(n, [&](int64_t task, int thread) {
          runs[static_cast<size_t>(task)].fetch_add(1);
          if (thread < 0 || thread >= threads) bad_thread = true;
        });
        for (int64_t t = 0; t < n; ++t) ASSERT_EQ(runs[static_cast<size_t>(t)].load(), 1) << "task " << t;
        EXPECT_FALSE(bad_thread.load());
      }
    }
  }
}

TEST(ThreadPool, UsesMoreThanOneThread) {
  ThreadPool pool(2);
  std::atomic<int> seen_mask{0};
  for (int repeat = 0; repeat < 200 && seen_mask.load() != 3; ++repeat) {
    pool.parallel_for(64, [&](int64_t, int thread) {
      seen_mask.fetch_or(1 << thread);
      volatile double x = 0;
      for (int i = 0; i < 20000; ++i) x = x + 1;
    });
  }
  EXPECT_EQ(seen_mask.load(), 3);
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(2);
  std::atomic<int> inner{0};
  pool.parallel_for(4, [&](int64_t, int) { pool.parallel_for(3, [&](int64_t, int) { inner.fetch_add(1); }); });
  EXPECT_EQ(inner.load(), 12);
}

TEST(ThreadPool, SurvivesIdlePeriodsAndManySmallJobs) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  for (int i = 0; i < 5000; ++i) pool.parallel_for(2, [&](int64_t t, int) { sum.fetch_add(t + 1); });
  EXPECT_EQ(sum.load(), 5000 * 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // workers fall asleep
  pool.parallel_for(2, [&](int64_t t, int) { sum.fetch_add(t + 1); });
  EXPECT_EQ(sum.load(), 5001 * 3);
}

}  // namespace
}  // namespace pico::cpu
