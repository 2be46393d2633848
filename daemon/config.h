// Copyright 2026 The ckptd Authors.
//
// The daemon's configuration file and flags.
//
// File format (/etc/ckptd/ckptd.conf): one `key = value` per line, `#`
// starts a comment, blank lines ignored. Keys are DaemonOptions' field names
// (socket, checkpoint_roots, staging_budget, ...). Sizes take K/M/G/T
// suffixes (powers of 1024), durations s/m/h/ms suffixes, booleans
// true/false, lists comma-separated. Flags (--key=value or --key value) use
// the same keys and override the file.
#ifndef CKPTD_DAEMON_CONFIG_H_
#define CKPTD_DAEMON_CONFIG_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/options.h"

namespace ckptd::daemon {

// Sets one option by key. INVALID_ARGUMENT names the key and the value.
absl::Status SetOption(DaemonOptions* options, std::string_view key,
                       std::string_view value);

// Applies a config file's text; errors name `source` and the line number.
absl::Status ApplyConfigText(DaemonOptions* options, std::string_view text,
                             std::string_view source);

// Parses argv: --config FILE is read first, then every --key=value /
// --key value flag. `--help` sets *help. Unknown keys are INVALID_ARGUMENT.
absl::Status ParseCommandLine(int argc, char** argv, DaemonOptions* options,
                              bool* help);

// The keys, defaults and descriptions, for --help (docs/configuration.md: the reference).
std::string OptionsHelp();

// "4G" → 4 << 30. "1.5M" is accepted.
absl::StatusOr<uint64_t> ParseSize(std::string_view text);
// "90s", "5m", "250ms", "2h"; a bare number is seconds.
absl::StatusOr<absl::Duration> ParseDuration(std::string_view text);

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_CONFIG_H_
