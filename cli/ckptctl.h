// Copyright 2026 The ckptd Authors.
//
// ckptctl subcommands. Exit codes (documented in the README):
//   0 success; 1 the checkpoint is invalid or the operation failed;
//   2 usage error; 3 the checkpoint could not be read at all (no such
//   directory, I/O error).
#ifndef CKPTD_CLI_CKPTCTL_H_
#define CKPTD_CLI_CKPTCTL_H_

#include <string>

namespace ckptd::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitInvalid = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitUnreadable = 3;

struct InspectArgs {
  std::string dir;
  bool json = false;
  bool chunks = false;  // list every chunk (human output)
};
int Inspect(const InspectArgs& args);

struct VerifyArgs {
  std::string dir;
  bool json = false;
  bool no_crc = false;
};
int Verify(const VerifyArgs& args);

struct ConvertArgs {
  std::string dir;
  std::string out;
  bool overwrite = false;
};
int Convert(const ConvertArgs& args);

}  // namespace ckptd::cli

#endif  // CKPTD_CLI_CKPTCTL_H_
