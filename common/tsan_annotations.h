// Copyright 2026 The ckptd Authors.
//
// Happens-before edges for ThreadSanitizer where the synchronization lives
// in a library built without it (gRPC core hands a reactor from thread to
// thread with its own atomics). TsanRelease(p) on one thread followed by
// TsanAcquire(p) on another orders everything before the first before
// everything after the second. No-ops outside TSan builds (CKPTD_TSAN).
#ifndef CKPTD_COMMON_TSAN_ANNOTATIONS_H_
#define CKPTD_COMMON_TSAN_ANNOTATIONS_H_

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CKPTD_HAVE_TSAN 1
#include <sanitizer/tsan_interface.h>
#endif
#endif

#include <utility>

#include "absl/base/call_once.h"

namespace ckptd {

#ifdef CKPTD_HAVE_TSAN
inline void TsanRelease(const void* p) { __tsan_release(const_cast<void*>(p)); }
inline void TsanAcquire(const void* p) { __tsan_acquire(const_cast<void*>(p)); }
#else
inline void TsanRelease(const void*) {}
inline void TsanAcquire(const void*) {}
#endif

// absl::call_once that TSan sees through: a thread that finds the
// initializer running waits in abseil's SpinLockWait, uninstrumented in
// Debian's libabsl, so TSan would not order the initializer's writes before
// that thread's reads (CI saw it on CompactMetadata's box index). Use this
// instead of absl::call_once wherever more than one thread may call it.
template <typename F>
void CallOnce(absl::once_flag& flag, F&& fn) {
  absl::call_once(flag, [&] {
    std::forward<F>(fn)();
    TsanRelease(&flag);
  });
  TsanAcquire(&flag);
}

}  // namespace ckptd

#endif  // CKPTD_COMMON_TSAN_ANNOTATIONS_H_
