// A fixed set of worker threads that run parallel_for jobs. Threads are created once;
// between jobs they spin briefly (a job usually follows within microseconds during
// inference) and then sleep on a futex (std::atomic::wait).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace pico::cpu {

// Physical cores: distinct thread_siblings_list entries under /sys, else
// std::thread::hardware_concurrency(), at least 1.
int default_thread_count();

class ThreadPool {
 public:
  // `threads` counts the calling thread: ThreadPool(1) starts no worker.
  explicit ThreadPool(int threads = default_thread_count());
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(task, thread) once for every task in [0, n_tasks), spread over the
  // threads (thread 0 is the caller, which takes part), and returns when all are done.
  // Tasks are claimed dynamically, so which thread runs a task varies. Calls from
  // several threads take turns; a call from inside a task runs inline.
  template <class Fn>
  void parallel_for(int64_t n_tasks, Fn&& fn) const {
    run(n_tasks, [](void* f, int64_t task, int thread) { (*static_cast<Fn*>(f))(task, thread); }, &fn);
  }

 private:
  using TaskFn = void (*)(void* context, int64_t task, int thread);
  void run(int64_t n_tasks, TaskFn fn, void* context) const;
  void worker_loop(int thread);
  void work(int thread) const;

  std::vector<std::thread> workers_;
  mutable std::mutex run_mutex_;
  // The current job.
  mutable TaskFn fn_ = nullptr;
  mutable void* context_ = nullptr;
  mutable int64_t n_tasks_ = 0;
  mutable std::atomic<int64_t> next_task_{0};
  mutable std::atomic<int> busy_workers_{0};
  // Bumped once per job; workers wait for it to change. Odd values are not special.
  mutable std::atomic<uint64_t> generation_{0};
  mutable std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace pico::cpu
