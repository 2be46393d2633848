// Copyright 2026 The ckptd Authors.
//
// ThreadSanitizer builds only (CKPTD_TSAN): teaches TSan about abseil's
// synchronization (Mutex, CondVar, Notification, Status's shared count).
//
// Debian's libabsl is not built with -fsanitize=thread, so the acquire and
// release inside absl::Mutex, CondVar and Notification happen in code TSan
// does not see: every access guarded by an absl::Mutex would be reported as
// a race. This file defines the out-of-line members those classes export
// (the executable's definitions win over the shared library's), calls the
// library's own through dlsym(RTLD_NEXT) and adds the happens-before edges
// around them: release before unlocking (or waiting), acquire after locking
// (or waking). Conditions passed to Await / LockWhen are wrapped so that
// their evaluation, which abseil may run on the thread that unlocks,
// acquires the mutex first. Linked into every executable of the TSan build
// (an object library; see CMakeLists.txt); nothing else uses it.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/base/options.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

#define CKPTD_TSAN_STR2(x) #x
#define CKPTD_TSAN_STR(x) CKPTD_TSAN_STR2(x)

namespace {

// The library's definition of a member of absl::<inline namespace>::...,
// by its mangled name without the "_ZN4absl<len><namespace>" prefix.
template <typename F>
F Next(bool is_const, const char* rest) {
#if ABSL_OPTION_USE_INLINE_NAMESPACE
  const std::string ns = CKPTD_TSAN_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  const std::string name = std::string(is_const ? "_ZNK4absl" : "_ZN4absl") +
                           std::to_string(ns.size()) + ns + rest;
#else
  const std::string name =
      std::string(is_const ? "_ZNK4absl" : "_ZN4absl") + rest;
#endif
  void* p = ::dlsym(RTLD_NEXT, name.c_str());
  if (p == nullptr) {
    std::fprintf(stderr, "tsan_absl: %s not found in libabsl: %s\n",
                 name.c_str(), ::dlerror());
    std::abort();
  }
  return reinterpret_cast<F>(p);
}

// A condition that acquires `mu` before the caller's is evaluated and
// releases it after (it is always evaluated with `mu` held, on whichever
// thread abseil evaluates it).
struct Acquiring {
  const absl::Condition* cond;
  absl::Mutex* mu;
  static bool Eval(Acquiring* a) {
    __tsan_acquire(a->mu);
    const bool r = a->cond->Eval();
    __tsan_release(a->mu);  // what it read happens before the next holder
    return r;
  }
};

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

using Cond = const Condition&;

void Mutex::Lock() {
  static auto real = Next<void (*)(Mutex*)>(false, "5Mutex4LockEv");
  real(this);
  __tsan_acquire(this);
}

void Mutex::ReaderLock() {
  static auto real = Next<void (*)(Mutex*)>(false, "5Mutex10ReaderLockEv");
  real(this);
  __tsan_acquire(this);
}

bool Mutex::TryLock() {
  static auto real = Next<bool (*)(Mutex*)>(false, "5Mutex7TryLockEv");
  const bool ok = real(this);
  if (ok) __tsan_acquire(this);
  return ok;
}

bool Mutex::ReaderTryLock() {
  static auto real = Next<bool (*)(Mutex*)>(false, "5Mutex13ReaderTryLockEv");
  const bool ok = real(this);
  if (ok) __tsan_acquire(this);
  return ok;
}

void Mutex::Unlock() {
  static auto real = Next<void (*)(Mutex*)>(false, "5Mutex6UnlockEv");
  __tsan_release(this);
  real(this);
}

void Mutex::ReaderUnlock() {
  static auto real = Next<void (*)(Mutex*)>(false, "5Mutex12ReaderUnlockEv");
  __tsan_release(this);
  real(this);
}

void Mutex::Await(Cond cond) {
  static auto real =
      Next<void (*)(Mutex*, Cond)>(false, "5Mutex5AwaitERKNS0_9ConditionE");
  Acquiring a{&cond, this};
  __tsan_release(this);
  real(this, Condition(&Acquiring::Eval, &a));
  __tsan_acquire(this);
}

bool Mutex::AwaitWithTimeout(Cond cond, Duration timeout) {
  static auto real = Next<bool (*)(Mutex*, Cond, Duration)>(
      false, "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Acquiring a{&cond, this};
  __tsan_release(this);
  const bool ok = real(this, Condition(&Acquiring::Eval, &a), timeout);
  __tsan_acquire(this);
  return ok;
}

bool Mutex::AwaitWithDeadline(Cond cond, Time deadline) {
  static auto real = Next<bool (*)(Mutex*, Cond, Time)>(
      false, "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Acquiring a{&cond, this};
  __tsan_release(this);
  const bool ok = real(this, Condition(&Acquiring::Eval, &a), deadline);
  __tsan_acquire(this);
  return ok;
}

void Mutex::LockWhen(Cond cond) {
  static auto real =
      Next<void (*)(Mutex*, Cond)>(false, "5Mutex8LockWhenERKNS0_9ConditionE");
  Acquiring a{&cond, this};
  real(this, Condition(&Acquiring::Eval, &a));
  __tsan_acquire(this);
}

void Mutex::ReaderLockWhen(Cond cond) {
  static auto real = Next<void (*)(Mutex*, Cond)>(
      false, "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Acquiring a{&cond, this};
  real(this, Condition(&Acquiring::Eval, &a));
  __tsan_acquire(this);
}

bool Mutex::LockWhenWithTimeout(Cond cond, Duration timeout) {
  static auto real = Next<bool (*)(Mutex*, Cond, Duration)>(
      false, "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Acquiring a{&cond, this};
  const bool ok = real(this, Condition(&Acquiring::Eval, &a), timeout);
  __tsan_acquire(this);
  return ok;
}

bool Mutex::LockWhenWithDeadline(Cond cond, Time deadline) {
  static auto real = Next<bool (*)(Mutex*, Cond, Time)>(
      false, "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Acquiring a{&cond, this};
  const bool ok = real(this, Condition(&Acquiring::Eval, &a), deadline);
  __tsan_acquire(this);
  return ok;
}

bool Mutex::ReaderLockWhenWithTimeout(Cond cond, Duration timeout) {
  static auto real = Next<bool (*)(Mutex*, Cond, Duration)>(
      false,
      "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Acquiring a{&cond, this};
  const bool ok = real(this, Condition(&Acquiring::Eval, &a), timeout);
  __tsan_acquire(this);
  return ok;
}

bool Mutex::ReaderLockWhenWithDeadline(Cond cond, Time deadline) {
  static auto real = Next<bool (*)(Mutex*, Cond, Time)>(
      false, "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Acquiring a{&cond, this};
  const bool ok = real(this, Condition(&Acquiring::Eval, &a), deadline);
  __tsan_acquire(this);
  return ok;
}

void CondVar::Wait(Mutex* mu) {
  static auto real =
      Next<void (*)(CondVar*, Mutex*)>(false, "7CondVar4WaitEPNS0_5MutexE");
  __tsan_release(mu);
  real(this, mu);
  __tsan_acquire(mu);
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  static auto real = Next<bool (*)(CondVar*, Mutex*, Duration)>(
      false, "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  __tsan_release(mu);
  const bool r = real(this, mu, timeout);
  __tsan_acquire(mu);
  return r;
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  static auto real = Next<bool (*)(CondVar*, Mutex*, Time)>(
      false, "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  __tsan_release(mu);
  const bool r = real(this, mu, deadline);
  __tsan_acquire(mu);
  return r;
}

void Notification::Notify() {
  static auto real =
      Next<void (*)(Notification*)>(false, "12Notification6NotifyEv");
  __tsan_release(this);
  real(this);
}

void Notification::WaitForNotification() const {
  static auto real = Next<void (*)(const Notification*)>(
      true, "12Notification19WaitForNotificationEv");
  real(this);
  __tsan_acquire(const_cast<Notification*>(this));
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  static auto real = Next<bool (*)(const Notification*, Duration)>(
      true, "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool r = real(this, timeout);
  if (r) __tsan_acquire(const_cast<Notification*>(this));
  return r;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  static auto real = Next<bool (*)(const Notification*, Time)>(
      true, "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool r = real(this, deadline);
  if (r) __tsan_acquire(const_cast<Notification*>(this));
  return r;
}

// absl::Status shares a non-OK status's representation (code, message)
// between its copies by an atomic count. The increment is header code (seen
// by TSan), but the decrement, and the delete by the last copy, are in the
// library: a copy dropped on one thread and the last one on another looked
// like a race between the first's increment and the delete. The decrement is
// an acquire-release operation, which the release and acquire below stand
// for.
void Status::UnrefNonInlined(uintptr_t rep) {
  static auto real =
      Next<void (*)(uintptr_t)>(false, "6Status15UnrefNonInlinedEm");
  void* const r = reinterpret_cast<void*>(rep - 1);  // Status::RepToPointer
  __tsan_release(r);
  __tsan_acquire(r);
  real(rep);
}

ABSL_NAMESPACE_END
}  // namespace absl
