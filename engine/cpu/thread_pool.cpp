#include "cpu/thread_pool.hpp"

#include <fstream>
#include <set>
#include <string>

#include "cpu/cpu_features.hpp"

namespace pico::cpu {
namespace {

// Spin iterations before sleeping: a few tens of microseconds.
constexpr int kSpinIterations = 20000;

thread_local const ThreadPool* tls_running_pool = nullptr;

}  // namespace

int default_thread_count() {
  std::set<std::string> cores;
  for (int cpu = 0; cpu < 4096; ++cpu) {
    std::ifstream f("/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/thread_siblings_list");
    if (!f) break;
    std::string siblings;
    std::getline(f, siblings);
    cores.insert(siblings);
  }
  if (!cores.empty()) return static_cast<int>(cores.size());
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

ThreadPool::ThreadPool(int threads) {
  if (threads < 1) threads = 1;
  workers_.reserve(static_cast<size_t>(threads - 1));
  for (int t = 1; t < threads; ++t) workers_.emplace_back([this, t] { worker_loop(t); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::work(int thread) const {
  const ThreadPool* outer = tls_running_pool;
  tls_running_pool = this;
  for (;;) {
    const int64_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= n_tasks_) break;
    fn_(context_, task, thread);
  }
  tls_running_pool = outer;
}

void ThreadPool::worker_loop(int thread) {
  // Not generation_.load(): a job posted before this thread got here must still be seen.
  uint64_t seen = 0;
  for (;;) {
    int spins = 0;
    uint64_t now = generation_.load(std::memory_order_acquire);
    while (now == seen && spins < kSpinIterations) {
      cpu_relax();
      ++spins;
      now = generation_.load(std::memory_order_acquire);
    }
    if (now == seen) {
      // Announce the sleep before re-checking (inside wait), so that a job posted in
      // between is either seen here or followed by a notify (both sides seq_cst).
      sleepers_.fetch_add(1);
      generation_.wait(seen);
      sleepers_.fetch_sub(1);
      now = generation_.load();
    }
    seen = now;
    if (stop_.load()) return;
    work(thread);
    busy_workers_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run(int64_t n_tasks, TaskFn fn, void* context) const {
  if (n_tasks <= 0) return;
  if (workers_.empty() || n_tasks == 1 || tls_running_pool == this) {
    for (int64_t t = 0; t < n_tasks; ++t) fn(context, t, 0);
    return;
  }
  std::lock_guard<std::mutex> lock(run_mutex_);
  fn_ = fn;
  context_ = context;
  n_tasks_ = n_tasks;
  next_task_.store(0, std::memory_order_relaxed);
  busy_workers_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1);  // seq_cst: publishes the job
  if (sleepers_.load() > 0) generation_.notify_all();
  work(0);
  // Workers finish their last task; the wait is short, so spin (then yield).
  int spins = 0;
  while (busy_workers_.load(std::memory_order_acquire) != 0) {
    if (++spins < kSpinIterations) {
      cpu_relax();
    } else {
      std::this_thread::yield();
    }
  }
}

}  // namespace pico::cpu
