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

namespace ckptd {

#ifdef CKPTD_HAVE_TSAN
inline void TsanRelease(const void* p) { __tsan_release(const_cast<void*>(p)); }
inline void TsanAcquire(const void* p) { __tsan_acquire(const_cast<void*>(p)); }
#else
inline void TsanRelease(const void*) {}
inline void TsanAcquire(const void*) {}
#endif

}  // namespace ckptd

#endif  // CKPTD_COMMON_TSAN_ANNOTATIONS_H_
