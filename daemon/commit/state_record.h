// Copyright 2026 The ckptd Authors.
//
// The daemon's state files (state_dir/journal/*.journal, the record of an
// unfinished checkpoint; state_dir/history/*.history, a job's committed
// checkpoints) as checksummed JSON records that no name can inject into:
//
//   ckptd-state v1 <crc32 of the body, 8 hex digits> <body length>\n
//   <body: one JSON object>
//
// Every string is JSON-escaped, so a newline in a job name or checkpoint id
// stays inside its field; a torn or edited file fails its checksum or length
// and is reported, never half-read. Files of earlier daemon versions
// (newline-separated lines) are read by ParseLegacy* with every path checked
// by the caller.
//
// Pure functions; thread-safe.
#ifndef CKPTD_DAEMON_COMMIT_STATE_RECORD_H_
#define CKPTD_DAEMON_COMMIT_STATE_RECORD_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/names.h"
#include "daemon/types/save_types.h"

namespace ckptd::daemon {

// Who saved a checkpoint: the Unix user of its arenas (kUnknownUid when no
// arena told, e.g. state written by an earlier daemon version).
inline constexpr int64_t kUnknownUid = -1;

// state_dir/journal/<name>.journal: an unfinished attempt (save_types.h).
using JournalRecord = CommitRecord;

// state_dir/history/<hash>.history: the committed checkpoints of one job
// by one user, oldest first.
struct HistoryRecord {
  std::string job;
  int64_t uid = kUnknownUid;
  std::vector<std::string> dirs;  // in the order their saves started
  // Parallel to dirs: when each save started (ms since the epoch); empty
  // in records of earlier versions (their dirs are then the oldest).
  std::vector<int64_t> started_ms;
};

std::string EncodeJournal(const JournalRecord& r);
std::string EncodeHistory(const HistoryRecord& r);

// DATA_LOSS naming `what` for a bad header, checksum, length or field;
// files without the v1 header are parsed in the legacy line format.
absl::StatusOr<JournalRecord> DecodeJournal(std::string_view text,
                                            std::string_view what);
absl::StatusOr<HistoryRecord> DecodeHistory(std::string_view text,
                                            std::string_view what);

// (ValidateName, for the names a record holds: common/names.h.)

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_COMMIT_STATE_RECORD_H_
