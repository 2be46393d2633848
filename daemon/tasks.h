// Copyright 2026 The ckptd Authors.
//
// Small task helpers shared by the daemon's components: Deferred (callbacks
// collected under a lock, run after it is released) and ThreadPool (a FIFO
// pool of worker threads).
#ifndef CKPTD_DAEMON_TASKS_H_
#define CKPTD_DAEMON_TASKS_H_

#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace ckptd::daemon {

using Task = absl::AnyInvocable<void() &&>;

// Callbacks collected under the lock and run after it is released.
class Deferred {
 public:
  Deferred() = default;
  Deferred(const Deferred&) = delete;
  ~Deferred() { Run(); }
  void Add(Task t) { tasks_.push_back(std::move(t)); }
  void Run() {
    while (!tasks_.empty()) {
      std::vector<Task> tasks;
      tasks.swap(tasks_);
      for (Task& t : tasks) std::move(t)();
    }
  }

 private:
  std::vector<Task> tasks_;
};

// A FIFO pool of worker threads.
class ThreadPool {
 public:
  explicit ThreadPool(int n) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { Loop(); });
  }
  ~ThreadPool() {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
    }
    for (auto& t : threads_) t.join();
  }
  void Submit(Task t) {
    absl::MutexLock l(&mu_);
    queue_.push_back(std::move(t));
  }

 private:
  void Loop() {
    while (true) {
      Task t;
      {
        absl::MutexLock l(&mu_);
        mu_.Await(absl::Condition(
            +[](ThreadPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
              return p->stop_ || !p->queue_.empty();
            },
            this));
        if (queue_.empty()) return;  // stop_ and drained
        t = std::move(queue_.front());
        queue_.pop_front();
      }
      std::move(t)();
    }
  }
  absl::Mutex mu_;
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_TASKS_H_
