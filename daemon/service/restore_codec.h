// Copyright 2026 The ckptd Authors.
//
// Decodes a RestoreRequest into the restorer's plain struct, checking its
// syntax and limits (everything that needs the checkpoint or the arena is
// checked by restore/): INVALID_ARGUMENT naming the field, box and rank.
// Encodes a Restore call's answer, and a restore's progress for
// ListRestores.
#ifndef CKPTD_DAEMON_SERVICE_RESTORE_CODEC_H_
#define CKPTD_DAEMON_SERVICE_RESTORE_CODEC_H_

#include "absl/status/statusor.h"
#include "ckptd/v1/daemon.pb.h"
#include "daemon/restore/restore_progress.h"
#include "daemon/restore/restore_types.h"

namespace ckptd::daemon {

inline constexpr int kMaxRestoreBoxes = 1 << 20;
inline constexpr int kMaxRestoreBytesItems = 1 << 16;
inline constexpr int kMaxLocalWorldSize = 1 << 16;

absl::StatusOr<RestoreBatch> DecodeRestore(
    const ::ckptd::v1::RestoreRequest& req);

void RestoreReplyToProto(const RestoreReply& in,
                         ::ckptd::v1::RestoreResponse* out);

void RestoreProgressToProto(const RestoreProgressInfo& in,
                            ::ckptd::v1::RestoreProgress* out);

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_SERVICE_RESTORE_CODEC_H_
