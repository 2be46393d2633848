// Copyright 2026 The ckptd Authors.
//
// Lets fmt::format print absl::string_view (status.message()) and
// absl::Status. Debian's Abseil 20220623 has its own absl::string_view, not
// an alias of std::string_view, and fmt 9 does not know it.
#ifndef CKPTD_COMMON_ABSL_FMT_H_
#define CKPTD_COMMON_ABSL_FMT_H_

#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "fmt/format.h"

template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<std::string_view> {
  template <typename FormatContext>
  auto format(absl::string_view s, FormatContext& ctx) const {
    return fmt::formatter<std::string_view>::format(std::string_view(s.data(), s.size()), ctx);
  }
};

template <>
struct fmt::formatter<absl::Status> : fmt::formatter<std::string_view> {
  template <typename FormatContext>
  auto format(const absl::Status& s, FormatContext& ctx) const {
    const std::string text = s.ToString();
    return fmt::formatter<std::string_view>::format(std::string_view(text), ctx);
  }
};

#endif  // CKPTD_COMMON_ABSL_FMT_H_
