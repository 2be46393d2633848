// Copyright 2026 The ckptd Authors.
#include "daemon/types/checkpoint_state.h"

#include "fmt/format.h"

namespace ckptd::daemon {

std::string_view StateName(State state) {
  switch (state) {
    case State::kPending:
      return "PENDING";
    case State::kStaging:
      return "STAGING";
    case State::kStaged:
      return "STAGED";
    case State::kWriting:
      return "WRITING";
    case State::kCommitting:
      return "COMMITTING";
    case State::kCommitted:
      return "COMMITTED";
    case State::kFailed:
      return "FAILED";
    case State::kCancelled:
      return "CANCELLED";
  }
  return "UNKNOWN";
}

bool IsFinal(State state) {
  return state == State::kCommitted || state == State::kFailed ||
         state == State::kCancelled;
}

std::string FormatRanks(const std::vector<int>& ranks, size_t max_shown) {
  std::string out;
  for (size_t i = 0; i < ranks.size() && i < max_shown; ++i) {
    out += fmt::format("{}{}", i ? ", " : "", ranks[i]);
  }
  if (ranks.size() > max_shown)
    out += fmt::format(", ... ({} more)", ranks.size() - max_shown);
  return out;
}

}  // namespace ckptd::daemon
