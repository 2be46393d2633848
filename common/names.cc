// Copyright 2026 The ckptd Authors.

#include "common/names.h"

#include <cstdint>
#include <string>

#include "fmt/format.h"

namespace ckptd {

size_t FirstInvalidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80           ? 1
                     : (c >> 5) == 0x6  ? 2
                     : (c >> 4) == 0xe  ? 3
                     : (c >> 3) == 0x1e ? 4
                                        : 0;
    bool ok = n != 0 && i + n <= s.size();
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1f : n == 3 ? c & 0x0f : c & 0x07;
    for (size_t k = 1; ok && k < n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      ok = (cc & 0xc0) == 0x80;
      cp = (cp << 6) | (cc & 0x3f);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are invalid.
    if (ok && ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) ||
               (n == 4 && cp < 0x10000) || (cp >= 0xd800 && cp <= 0xdfff) ||
               cp > 0x10ffff)) {
      ok = false;
    }
    if (!ok) return i;
    i += n;
  }
  return std::string_view::npos;
}

absl::Status ValidateName(std::string_view what, std::string_view name,
                          size_t max_bytes) {
  if (name.size() > max_bytes) {
    return absl::InvalidArgumentError(fmt::format(
        "{} is {} bytes; the limit is {}", what, name.size(), max_bytes));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(
          fmt::format("{} contains the control character 0x{:02x} at byte {}; "
                      "names may not",
                      what, c, i));
    }
  }
  if (const size_t bad = FirstInvalidUtf8(name);
      bad != std::string_view::npos) {
    return absl::InvalidArgumentError(
        fmt::format("{} is not valid UTF-8 (at byte {})", what, bad));
  }
  return absl::OkStatus();
}

std::string EscapeForLog(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += ch;
    }
  }
  return out;
}

bool IsSafeRelativePath(std::string_view path) {
  if (path.empty() || path.front() == '/') return false;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    std::string_view part = path.substr(start, end - start);
    if (part == ".." || part.empty()) return false;
    start = end + 1;
  }
  return path.find('\0') == std::string_view::npos;
}

}  // namespace ckptd
