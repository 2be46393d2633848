// Copyright 2026 The ckptd Authors.
#include "common/rate_limiter.h"

#include <algorithm>

namespace ckptd {

void RateLimiter::Acquire(uint64_t bytes, const std::atomic<bool>& aborted) {
  if (rate_ == 0) return;
  absl::Time start;
  {
    absl::MutexLock l(&mu_);
    start = std::max(clock_->Now(), next_);
    next_ = start + absl::Seconds(static_cast<double>(bytes) /
                                  static_cast<double>(rate_));
  }
  // In short pauses, so that an abort is noticed promptly.
  for (absl::Time now = clock_->Now(); now < start && !aborted.load();
       now = clock_->Now()) {
    clock_->SleepFor(std::min(start - now, absl::Milliseconds(20)));
  }
}

}  // namespace ckptd
