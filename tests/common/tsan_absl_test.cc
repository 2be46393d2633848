// Copyright 2026 The ckptd Authors.
//
// common/tsan_absl.cc, which tells ThreadSanitizer about the synchronization
// inside Debian's uninstrumented abseil. These tests pass in every build;
// under TSan (scripts/test.sh --tsan, halt_on_error) an edge that file fails
// to add is a report, which fails the test. The threads below hand over
// through relaxed atomics only, which order nothing for TSan, so the only
// happens-before edges are the ones abseil's own code makes.
#include <atomic>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace ckptd {
namespace {

// Waits for `flag` without synchronizing with its writer.
void SpinUntil(const std::atomic<bool>& flag) {
  while (!flag.load(std::memory_order_relaxed)) std::this_thread::yield();
}

// A non-OK Status's copies share one representation by an atomic count; the
// copy dropped last deletes it. Dropped on two threads, the first thread's
// copy (an increment, in header code) and the delete by the last (in the
// library) were reported as a race (CI's TSan run of d5b43dc, in the
// coordinator: a deferred callback's copy of a tombstone's error and the
// tombstone's later overwrite).
TEST(TsanAbslTest, StatusCopiesDroppedOnTwoThreads) {
  for (int i = 0; i < 50; ++i) {
    auto* shared = new absl::Status(absl::InternalError("shared"));
    std::atomic<bool> dropped{false};
    std::thread other([&] {
      {
        const absl::Status copy = *shared;
        EXPECT_EQ(copy.message(), "shared");
      }
      dropped.store(true, std::memory_order_relaxed);
    });
    SpinUntil(dropped);
    delete shared;  // the last copy: deletes the representation
    other.join();
  }
}

// What one thread wrote under an absl::Mutex, the next holder reads.
TEST(TsanAbslTest, MutexOrdersItsHolders) {
  for (int i = 0; i < 50; ++i) {
    absl::Mutex mu;
    int guarded = 0;
    std::atomic<bool> written{false};
    std::thread other([&] {
      {
        absl::MutexLock l(&mu);
        guarded = i + 1;
      }
      written.store(true, std::memory_order_relaxed);
    });
    SpinUntil(written);
    {
      absl::MutexLock l(&mu);
      EXPECT_EQ(guarded, i + 1);
    }
    other.join();
  }
}

}  // namespace
}  // namespace ckptd
