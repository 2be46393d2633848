// Copyright 2026 The ckptd Authors.
//
// Small task helpers shared by the daemon's components: Deferred (callbacks
// collected under a lock, run after it is released) and ThreadPool (a FIFO
// pool of worker threads).
#ifndef CKPTD_COMMON_TASKS_H_
#define CKPTD_COMMON_TASKS_H_

#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace ckptd {

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
//
// Join() (or the destructor) lets the queued tasks run, including those
// they submit, and joins the threads; the pool object stays valid, so a late
// caller never sees it gone. After Join, Submit drops the task (returns
// false) and SubmitOrRun runs it on the caller's thread.
class ThreadPool {
 public:
  explicit ThreadPool(int n) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { Loop(); });
  }
  ~ThreadPool() { Join(); }
  void Join() {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
    }
    absl::MutexLock j(&join_mu_);
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
    absl::MutexLock l(&mu_);
    joined_ = true;
  }
  // False (the task dropped) once the pool is joined.
  bool Submit(Task t) {
    absl::MutexLock l(&mu_);
    if (joined_) return false;
    queue_.push_back(std::move(t));
    return true;
  }
  // Must not be called with a lock the task takes held.
  void SubmitOrRun(Task t) {
    {
      absl::MutexLock l(&mu_);
      if (!joined_) {
        queue_.push_back(std::move(t));
        return;
      }
    }
    std::move(t)();
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
  bool joined_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex join_mu_;  // one joiner at a time
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(join_mu_);
};

}  // namespace ckptd

#endif  // CKPTD_COMMON_TASKS_H_
