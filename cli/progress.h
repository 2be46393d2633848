// Copyright 2026 The ckptd Authors.
//
// Progress formatting for `ckptctl status` (one-shot and --follow): human
// units, the phase a checkpoint is in and its bytes done of that phase, a
// sliding-window rate, the ETA, a text progress bar, the one-line renderings
// (terminal and plain) and the JSON object. Plain functions over plain
// values, no I/O and no clock of their own: callers pass the time, so that
// tests (tests/cli/ckptctl_progress_test.cc) drive them with a fake clock.
//
// Thread-safety: the free functions are thread-safe; a RateWindow is not
// (one per follower).
#ifndef CKPTD_CLI_PROGRESS_H_
#define CKPTD_CLI_PROGRESS_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "client/ckptd_client.h"
#include "nlohmann/json.hpp"

namespace ckptd::cli {

// "512 B", "1.5 KiB", "12.0 MiB", "1.25 GiB", "2.00 TiB" (binary units).
std::string HumanBytes(uint64_t n);
// HumanBytes of a rate: "312.0 MiB/s"; "-" for nullopt.
std::string HumanRate(std::optional<double> bytes_per_second);
// A coarse age: "45s", "12m", "3h", "2d"; "-" when negative.
std::string HumanDuration(absl::Duration d);
// An ETA: "7s", "3m05s", "2h07m", "3d04h"; "-" for nullopt or a negative
// value. Rounds up to whole seconds.
std::string FormatEta(std::optional<double> seconds);
// "45.2%"; "-" when total is 0.
std::string Percent(uint64_t done, uint64_t total);

// Which bytes are moving: staging (bytes staged of the ranks' total) until
// every rank staged, then writing (bytes written of the data files' size,
// or of the data bytes while that is unknown), committing (the .metadata
// round), done (COMMITTED, FAILED or CANCELLED).
enum class Phase { kStaging = 0, kWriting = 1, kCommitting = 2, kDone = 3 };
// "staging", "writing", "committing", "done".
const char* PhaseName(Phase phase);

struct PhaseProgress {
  Phase phase = Phase::kStaging;
  uint64_t done = 0;   // bytes done of the phase
  uint64_t total = 0;  // bytes of the phase; 0: not known yet
};
// COMMITTED reports done == total (the data files' size); FAILED and
// CANCELLED report the bytes written when they stopped.
PhaseProgress ProgressOf(const client::CheckpointInfo& c);

// The average rate of the current phase since it began, from the daemon's
// timestamps (staging: since created; writing: since staged). nullopt in
// the committing and done phases, or when the timestamps do not allow it.
std::optional<double> PhaseAverageRate(const client::CheckpointInfo& c,
                                       absl::Time now);

// Bytes per second over the samples of the last `window`. Samples of
// another phase, or whose byte count went down, start a new window.
class RateWindow {
 public:
  explicit RateWindow(absl::Duration window = absl::Seconds(5))
      : window_(window) {}

  // REQUIRES: `now` does not go back between calls.
  void Add(absl::Time now, Phase phase, uint64_t done);
  // (newest.done - oldest.done) / (newest.t - oldest.t) over the window;
  // nullopt with fewer than two samples or no time between them.
  std::optional<double> Rate() const;
  size_t size() const { return samples_.size(); }

 private:
  struct Sample {
    absl::Time t;
    uint64_t done;
  };
  absl::Duration window_;
  Phase phase_ = Phase::kStaging;
  std::deque<Sample> samples_;
};

// Seconds until `total` at `rate`; nullopt when total is unknown (0) or the
// rate is unknown or not positive; 0 once done >= total.
std::optional<double> EtaSeconds(uint64_t done, uint64_t total,
                                 std::optional<double> rate);

// One observation of a checkpoint as `status` shows it.
struct ProgressView {
  client::CheckpointInfo info;
  PhaseProgress progress;
  std::optional<double> rate;         // bytes/s of the phase; nullopt: unknown
  std::optional<double> eta_seconds;  // nullopt: unknown
  absl::Time time = absl::UnixEpoch();  // when it was observed
};
// `window_rate`: the RateWindow's rate (a follower) or nullopt (one-shot);
// without it the phase average stands in. Final states have no rate/ETA.
ProgressView MakeProgressView(const client::CheckpointInfo& c,
                              std::optional<double> window_rate,
                              absl::Time now);

// "[#####.....]": exactly `width` characters (at least 3), the fraction
// (clamped to [0, 1]) of the inner width filled with '#'.
std::string RenderBar(double fraction, int width);

// Plain one-line form (no control characters), e.g.
//   "WRITING 45.2% 1.1 GiB/2.5 GiB written, 312.0 MiB/s, ETA 4s, ranks 4/4
//   staged, nodes 3 (planned 3, prepared 1)"
std::string FormatProgressLine(const ProgressView& v);
// The same with a bar, fitted into `columns - 1` characters (so that the
// terminal never wraps): the bar shrinks first (to 10), then the trailing
// fields go (nodes, ranks, ETA, rate), then the line is cut.
std::string FormatTerminalLine(const ProgressView& v, int columns);

// The width of the terminal on `fd` (TIOCGWINSZ), else $COLUMNS, else 80.
int TerminalColumns(int fd);

// client::ToJson(info) plus the progress fields:
//   "phase"       "staging" | "writing" | "committing" | "done"
//   "bytes"       bytes done of the phase
//   "bytes_total" bytes of the phase (0: not known yet)
//   "progress"    bytes / bytes_total in [0, 1], or null
//   "rate"        bytes per second, or null (unknown)
//   "eta_seconds" seconds, or null (unknown)
//   "final"       COMMITTED, FAILED or CANCELLED
//   "time_unix_ms" when it was observed
nlohmann::ordered_json ProgressJson(const ProgressView& v);

}  // namespace ckptd::cli

#endif  // CKPTD_CLI_PROGRESS_H_
