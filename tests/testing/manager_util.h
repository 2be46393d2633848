// Copyright 2026 The ckptd Authors.
//
// Synchronous wrappers over CheckpointManager's callback API for in-process
// tests.
#ifndef CKPTD_TESTS_TESTING_MANAGER_UTIL_H_
#define CKPTD_TESTS_TESTING_MANAGER_UTIL_H_

#include <string>
#include <utility>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "daemon/save/checkpoint_manager.h"

namespace ckptd::testing {

// Save() and wait for its reply.
inline absl::StatusOr<daemon::SaveReply> SaveSync(daemon::CheckpointManager& m,
                                                  daemon::SaveBatch batch) {
  absl::Notification n;
  absl::StatusOr<daemon::SaveReply> out;
  m.Save(std::move(batch), [&](absl::StatusOr<daemon::SaveReply> r) {
    out = std::move(r);
    n.Notify();
  });
  n.WaitForNotification();
  return out;
}

// Wait() for checkpoint `id` to be final (or, with until_data_durable, an
// external_metadata checkpoint to await its .metadata), at most `timeout`.
inline absl::StatusOr<daemon::CheckpointInfo> WaitFinal(
    daemon::CheckpointManager& m, const std::string& id,
    absl::Duration timeout = absl::Seconds(60),
    bool until_data_durable = false) {
  absl::Notification n;
  absl::StatusOr<daemon::CheckpointInfo> out;
  m.Wait(
      id, absl::Now() + timeout,
      [&](absl::StatusOr<daemon::CheckpointInfo> r) {
        out = std::move(r);
        n.Notify();
      },
      until_data_durable);
  n.WaitForNotification();
  return out;
}

}  // namespace ckptd::testing

#endif  // CKPTD_TESTS_TESTING_MANAGER_UTIL_H_
