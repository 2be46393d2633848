// Copyright 2026 The ckptd Authors.
//
// Failpoints: named points in the daemon's code where a test can stop a
// thread (etcd's gofail, TiKV's fail-rs, reduced to what the fault tests
// need). Test-only: a daemon started without CKPTD_FAILPOINTS arms none,
// and an unarmed point costs one relaxed atomic load.
//
//   CKPTD_FAILPOINTS="coordinator.before_rename=pause,node.staging=pause"
//   CKPTD_FAILPOINT_DIR=/path            (required with `pause`)
//   CKPTD_FAILPOINT_TIMEOUT_MS=30000     (the longest pause; default 60 s)
//
// Actions:
//   pause     the hit writes <dir>/<name>.hit ("pid=P id=ID\n", replaced
//             atomically) and blocks the thread until <dir>/<name>.release
//             exists (polled every 5 ms) or the timeout passes (logged,
//             then it goes on). While the .release file exists, hits pass
//             at once (still writing .hit): a test arms a point for one
//             save by removing its .release, and disarms it by creating it.
//   sleep(MS) the hit sleeps MS milliseconds.
//   off       nothing (as if not named).
// A name may be prefixed by N* (e.g. `1*pause`): the action fires for the
// first N hits only.
//
// A point is one line, `CKPTD_FAILPOINT("node.after_prepare", dir);`, and
// must never run with a lock held that the fault under test needs (it
// blocks): put it just after the unlock. The points of the daemon and
// what each one means: DEVELOPERS.md ("Failpoints").
#ifndef CKPTD_COMMON_FAILPOINT_H_
#define CKPTD_COMMON_FAILPOINT_H_

#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ckptd::failpoint {

namespace internal {
// True once any point is armed.
extern std::atomic<bool> armed;
void Hit(absl::string_view name, absl::string_view detail);
}  // namespace internal

inline bool Armed() { return internal::armed.load(std::memory_order_relaxed); }

struct Options {
  // "name=action,..." as in CKPTD_FAILPOINTS.
  std::string spec;
  // Where `pause` writes .hit and looks for .release.
  std::string dir;
  absl::Duration max_pause = absl::Seconds(60);
};

// Arms the points of `options.spec` (replacing any armed before). An
// empty spec disarms every point. INVALID_ARGUMENT names a malformed entry
// (then nothing is armed).
absl::Status Arm(const Options& options);
// From CKPTD_FAILPOINTS, CKPTD_FAILPOINT_DIR, CKPTD_FAILPOINT_TIMEOUT_MS;
// unset: nothing armed, OK. Logs the points armed.
absl::Status ArmFromEnvironment();
// Disarms every point.
void DisarmAll();
// How often `name` was hit since it was armed (0 if not armed).
int HitCount(absl::string_view name);

}  // namespace ckptd::failpoint

// Evaluates the failpoint `name` (a string literal); `detail` (a string
// view: the checkpoint id) goes into the .hit file.
#define CKPTD_FAILPOINT(name, detail)                  \
  do {                                                 \
    if (::ckptd::failpoint::Armed()) {                 \
      ::ckptd::failpoint::internal::Hit(name, detail); \
    }                                                  \
  } while (0)

#endif  // CKPTD_COMMON_FAILPOINT_H_
