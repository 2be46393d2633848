// Copyright 2026 The ckptd Authors.
//
// Internal to libckptd_client (not installed): the error and string
// conventions of the C ABI (client/ckptd_c.h) shared by its translation units
// (ckptd_c.cc: the daemon client, ckptd_c_reader.cc: the checkpoint reader).
// A failing call stores its message in a thread-local string and returns the
// status code; no C++ exception crosses the C boundary.
#ifndef CKPTD_CLIENT_C_ABI_UTIL_H_
#define CKPTD_CLIENT_C_ABI_UTIL_H_

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/ckptd_c.h"

namespace ckptd::client::internal {

// The calling thread's ckptd_last_error() text.
inline std::string& LastError() {
  thread_local std::string last_error;
  return last_error;
}

// Records `s` (not OK) as the thread's last error; returns its code.
inline int Fail(const absl::Status& s) {
  LastError().assign(s.message().data(), s.message().size());
  return static_cast<int>(s.code());
}

// Clears the thread's last error; returns CKPTD_OK.
inline int Ok() {
  LastError().clear();
  return CKPTD_OK;
}

inline int InvalidArgument(const char* message) {
  return Fail(absl::InvalidArgumentError(message));
}

// Runs `f` (returning an int code) so that no C++ exception (bad_alloc)
// crosses the C boundary.
template <typename F>
int Guard(F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return Fail(absl::InternalError(absl::StrCat("ckptd client: ", e.what())));
  } catch (...) {
    return Fail(absl::InternalError("ckptd client: unknown exception"));
  }
}

// A malloc'ed NUL-terminated copy of `s` (embedded NULs are kept; the
// length is s.size()), or nullptr when out of memory. Freed with
// ckptd_free_string().
inline char* CopyString(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p != nullptr) std::memcpy(p, s.c_str(), s.size() + 1);
  return p;
}

// *out = CopyString(s); RESOURCE_EXHAUSTED when out of memory.
inline int ReturnString(const std::string& s, char** out) {
  *out = CopyString(s);
  if (*out == nullptr) {
    return Fail(absl::ResourceExhaustedError("out of memory"));
  }
  return Ok();
}

}  // namespace ckptd::client::internal

// Returns CKPTD_INVALID_ARGUMENT with message `what` unless `cond`.
#define CKPTD_REQUIRE(cond, what) \
  if (!(cond)) return ::ckptd::client::internal::InvalidArgument(what)

#endif  // CKPTD_CLIENT_C_ABI_UTIL_H_
