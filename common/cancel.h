// Copyright 2026 The ckptd Authors.
//
// Cancellation: a flag one thread raises, with the reason, and others poll
// between units of their work (a restore cancelled by an operator while the
// daemon reads its batch: the reader stops at its next saved chunk, or its
// next block of a large record, and returns the reason).
//
// Thread-safe. Polling is one atomic load; the reason is read only after
// the flag was seen raised.
#ifndef CKPTD_COMMON_CANCEL_H_
#define CKPTD_COMMON_CANCEL_H_

#include <atomic>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace ckptd {

class Cancellation {
 public:
  // Raises the flag with CANCELLED `reason`; later calls change nothing.
  void Cancel(const std::string& reason) {
    absl::MutexLock l(&mu_);
    if (raised_.load(std::memory_order_relaxed)) return;
    reason_ = reason;
    raised_.store(true, std::memory_order_release);
  }
  bool cancelled() const { return raised_.load(std::memory_order_acquire); }
  // OK until cancelled, then CANCELLED with the reason (a status of its
  // own for each caller: one reason goes to many threads).
  absl::Status status() const {
    if (!cancelled()) return absl::OkStatus();
    absl::MutexLock l(&mu_);
    return absl::CancelledError(reason_);
  }

 private:
  mutable absl::Mutex mu_;
  std::string reason_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> raised_{false};
};

}  // namespace ckptd

#endif  // CKPTD_COMMON_CANCEL_H_
