// Copyright 2026 The ckptd Authors.
//
// RETURN_IF_ERROR / ASSIGN_OR_RETURN for absl::Status / absl::StatusOr.
// Abseil 20220623 (Debian 12) ships no status_macros.h, so we keep our own.
#ifndef CKPTD_COMMON_STATUS_MACROS_H_
#define CKPTD_COMMON_STATUS_MACROS_H_

#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define CKPTD_STATUS_CONCAT_INNER_(a, b) a##b
#define CKPTD_STATUS_CONCAT_(a, b) CKPTD_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status) and returns it from the enclosing
// function if it is not OK.
#define RETURN_IF_ERROR(expr)                                      \
  do {                                                             \
    if (::absl::Status ckptd_status_ = (expr); !ckptd_status_.ok()) \
      return ckptd_status_;                                        \
  } while (0)

// ASSIGN_OR_RETURN(lhs, rexpr): evaluates `rexpr` (an absl::StatusOr<T>);
// on error returns its status, otherwise move-assigns the value to `lhs`
// (which may be a declaration such as `auto x`).
#define ASSIGN_OR_RETURN(lhs, rexpr)                                        \
  CKPTD_ASSIGN_OR_RETURN_IMPL_(CKPTD_STATUS_CONCAT_(ckptd_statusor_, __LINE__), \
                               lhs, rexpr)

#define CKPTD_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                 \
  if (!tmp.ok()) return std::move(tmp).status();      \
  lhs = std::move(tmp).value()

namespace ckptd {

// Prepends context to a status message, keeping the code:
//   "write __0_0.distcp: No space left on device".
inline absl::Status Annotate(const absl::Status& s, std::string_view context) {
  if (s.ok()) return s;
  std::string msg(context);
  msg += ": ";
  msg.append(s.message().data(), s.message().size());
  return absl::Status(s.code(), msg);
}

}  // namespace ckptd

#endif  // CKPTD_COMMON_STATUS_MACROS_H_
