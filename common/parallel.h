// Copyright 2026 The ckptd Authors.
//
// Running one worker function on several threads at once, the caller's
// thread included (used by the client's copy into the arena and by the
// checkpoint reader).
#ifndef CKPTD_COMMON_PARALLEL_H_
#define CKPTD_COMMON_PARALLEL_H_

#include <functional>

namespace ckptd {

// Runs `work` on `threads` threads at once — the calling thread and
// threads - 1 new ones — and returns when every one has returned. `work` is
// normally a loop taking jobs from a shared atomic counter. If the system
// cannot start a thread, the ones started so far (at least the caller's)
// do the work. threads < 1 means 1.
void RunOnThreads(int threads, const std::function<void()>& work);

}  // namespace ckptd

#endif  // CKPTD_COMMON_PARALLEL_H_
