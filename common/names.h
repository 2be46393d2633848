// Copyright 2026 The ckptd Authors.
//
// Names a client gives the daemon (job names, checkpoint ids): checked the
// same way by the client library, before anything is sent, and by the
// daemon, where a hostile client may have skipped the client library.
#ifndef CKPTD_COMMON_NAMES_H_
#define CKPTD_COMMON_NAMES_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace ckptd {

// Name limits (daemon.proto): a job name, a checkpoint id (a path).
inline constexpr size_t kMaxJobBytes = 256;
inline constexpr size_t kMaxCheckpointIdBytes = 4096;

// The offset of the first byte of `s` that does not start a valid UTF-8
// sequence (truncated, overlong, a surrogate, past U+10FFFF), or
// std::string_view::npos when `s` is valid UTF-8.
size_t FirstInvalidUtf8(std::string_view s);

// A job name or checkpoint id a client may use: at most max_bytes of valid
// UTF-8 without control characters (U+0000-U+001F, U+007F). INVALID_ARGUMENT
// naming `what` otherwise. (The daemon's service refuses a request with a
// string field that is not UTF-8 before it is decoded:
// proto/request_parse.h.)
absl::Status ValidateName(std::string_view what, std::string_view name,
                          size_t max_bytes);

// Whether `path` stays inside the directory it is relative to: false for
// an absolute or empty path, one with an empty or ".." part, or a NUL.
bool IsSafeRelativePath(std::string_view path);

// `s` with control characters and backslashes escaped (\n, \xNN, \\), so
// that a client-given string cannot add or fake a line in the daemon's log.
std::string EscapeForLog(std::string_view s);

}  // namespace ckptd

#endif  // CKPTD_COMMON_NAMES_H_
