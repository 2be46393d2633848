// Copyright 2026 The ckptd Authors.

#include "daemon/config.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>

#include "absl/strings/ascii.h"
#include "common/absl_fmt.h"
#include "common/status_macros.h"
#include "fmt/format.h"

namespace ckptd::daemon {
namespace {

// std::string_view helpers (Debian's Abseil has its own string_view type).
std::string_view Strip(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())))
    s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())))
    s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  while (true) {
    const size_t pos = s.find(sep);
    out.push_back(s.substr(0, pos));
    if (pos == std::string_view::npos) return out;
    s.remove_prefix(pos + 1);
  }
}

bool ConsumeSuffix(std::string_view* s, std::string_view suffix) {
  if (!s->ends_with(suffix)) return false;
  s->remove_suffix(suffix.size());
  return true;
}

std::string_view Msg(const absl::Status& s) {
  return std::string_view(s.message().data(), s.message().size());
}

absl::Status Bad(std::string_view key, std::string_view value,
                 std::string_view why) {
  return absl::InvalidArgumentError(
      fmt::format("option {}: invalid value '{}': {}", key, value, why));
}

absl::StatusOr<double> ParseNumber(std::string_view text) {
  std::string s(text);
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || errno != 0 ||
      !std::isfinite(v) || v < 0) {
    return absl::InvalidArgumentError(
        fmt::format("'{}' is not a non-negative number", text));
  }
  return v;
}

absl::StatusOr<bool> ParseBool(std::string_view text) {
  std::string s = absl::AsciiStrToLower(std::string(text));
  if (s == "true" || s == "1" || s == "yes" || s == "on") return true;
  if (s == "false" || s == "0" || s == "no" || s == "off") return false;
  return absl::InvalidArgumentError("expected true or false");
}

absl::StatusOr<int64_t> ParseInt(std::string_view text, int base = 10) {
  int64_t v = 0;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(first, last, v, base);
  if (text.empty() || ec != std::errc() || ptr != last) {
    return absl::InvalidArgumentError("expected an integer");
  }
  return v;
}

struct OptionSpec {
  const char* key;
  const char* help;
  std::function<absl::Status(DaemonOptions*, std::string_view)> set;
  std::function<std::string(const DaemonOptions&)> get;
};

std::string SizeString(uint64_t v) {
  static constexpr const char* kUnits[] = {"", "K", "M", "G", "T"};
  int u = 0;
  while (u < 4 && v != 0 && v % 1024 == 0) {
    v /= 1024;
    ++u;
  }
  return fmt::format("{}{}", v, kUnits[u]);
}

std::string DurationString(absl::Duration d) { return absl::FormatDuration(d); }

template <typename T>
OptionSpec IntOption(const char* key, const char* help, T DaemonOptions::*field,
                     int64_t min, int64_t max) {
  return {key, help,
          [=](DaemonOptions* o, std::string_view v) -> absl::Status {
            auto n = ParseInt(v);
            if (!n.ok()) return Bad(key, v, Msg(n.status()));
            if (*n < min || *n > max) {
              return Bad(key, v, fmt::format("must be in [{}, {}]", min, max));
            }
            o->*field = static_cast<T>(*n);
            return absl::OkStatus();
          },
          [=](const DaemonOptions& o) { return fmt::format("{}", o.*field); }};
}

OptionSpec SizeOption(const char* key, const char* help,
                      uint64_t DaemonOptions::*field) {
  return {key, help,
          [=](DaemonOptions* o, std::string_view v) -> absl::Status {
            auto n = ParseSize(v);
            if (!n.ok()) return Bad(key, v, Msg(n.status()));
            o->*field = *n;
            return absl::OkStatus();
          },
          [=](const DaemonOptions& o) { return SizeString(o.*field); }};
}

OptionSpec DurationOption(const char* key, const char* help,
                          absl::Duration DaemonOptions::*field) {
  return {key, help,
          [=](DaemonOptions* o, std::string_view v) -> absl::Status {
            auto d = ParseDuration(v);
            if (!d.ok()) return Bad(key, v, Msg(d.status()));
            o->*field = *d;
            return absl::OkStatus();
          },
          [=](const DaemonOptions& o) { return DurationString(o.*field); }};
}

OptionSpec BoolOption(const char* key, const char* help,
                      bool DaemonOptions::*field) {
  return {key, help,
          [=](DaemonOptions* o, std::string_view v) -> absl::Status {
            auto b = ParseBool(v);
            if (!b.ok()) return Bad(key, v, Msg(b.status()));
            o->*field = *b;
            return absl::OkStatus();
          },
          [=](const DaemonOptions& o) {
            return std::string(o.*field ? "true" : "false");
          }};
}

OptionSpec StringOption(const char* key, const char* help,
                        std::string DaemonOptions::*field) {
  return {key, help,
          [=](DaemonOptions* o, std::string_view v) -> absl::Status {
            o->*field = std::string(v);
            return absl::OkStatus();
          },
          [=](const DaemonOptions& o) { return o.*field; }};
}

const std::vector<OptionSpec>& Specs() {
  static const auto* specs = new std::vector<OptionSpec>{
      StringOption("socket", "Unix socket of the trainer/CLI gRPC service",
                   &DaemonOptions::socket),
      {"socket_mode", "permission bits of the socket (octal)",
       [](DaemonOptions* o, std::string_view v) -> absl::Status {
         auto n = ParseInt(v, 8);
         if (!n.ok() || *n < 0 || *n > 0777)
           return Bad("socket_mode", v, "expected octal bits like 0660");
         o->socket_mode = static_cast<uint32_t>(*n);
         return absl::OkStatus();
       },
       [](const DaemonOptions& o) {
         return fmt::format("0{:o}", o.socket_mode);
       }},
      StringOption("arena_socket",
                   "Unix socket where clients register arenas by passing a "
                   "sealed memfd; empty: <socket>.arena",
                   &DaemonOptions::arena_socket),
      BoolOption("allow_named_arenas",
                 "UNSAFE (legacy single-user nodes): also accept gRPC "
                 "RegisterArena by file name in shm_dir",
                 &DaemonOptions::allow_named_arenas),
      StringOption("http_listen",
                   "TCP host:port of the HTTP /metrics and /healthz endpoint "
                   "(port 0 picks one); empty: off",
                   &DaemonOptions::http_listen),
      StringOption("peer_listen",
                   "TCP host:port of the peer service for multi-node "
                   "checkpoints; empty: off",
                   &DaemonOptions::peer_listen),
      StringOption(
          "peer_advertise",
          "address other daemons reach this one at; a port of 0 means the "
          "bound port; empty: hostname:bound port",
          &DaemonOptions::peer_advertise),
      StringOption("peer_token_file",
                   "file with the shared peer token (mode 0600; required "
                   "with peer_listen)",
                   &DaemonOptions::peer_token_file),
      StringOption("peer_tls_cert",
                   "PEM certificate chain of the peer service; empty: no TLS",
                   &DaemonOptions::peer_tls_cert),
      StringOption("peer_tls_key", "PEM private key for peer_tls_cert",
                   &DaemonOptions::peer_tls_key),
      StringOption(
          "peer_tls_ca",
          "PEM CA bundle that verifies the other daemons' certificates",
          &DaemonOptions::peer_tls_ca),
      DurationOption(
          "peer_timeout",
          "abort a multi-node checkpoint when a peer is silent this long",
          &DaemonOptions::peer_timeout),
      IntOption("peer_replicas",
                "other nodes' memory tiers that hold a copy of this node's "
                "share of a job's newest multi-node checkpoint (0, 1, 2)",
                &DaemonOptions::peer_replicas, 0, 2),
      StringOption("failure_domain",
                   "this node's failure domain (\"rack-12\"): replicas of "
                   "its share go to nodes of other domains; empty: its own",
                   &DaemonOptions::failure_domain),
      SizeOption("replica_rate_limit",
                 "bytes/s this daemon pushes replicas at (0: unlimited)",
                 &DaemonOptions::replica_rate_limit),
      {"restore_peers",
       "comma-separated host:port of other daemons to ask for checkpoints "
       "they hold in memory (a host name may resolve to several); the "
       "nodes of checkpoints committed here are asked too",
       [](DaemonOptions* o, std::string_view v) -> absl::Status {
         o->restore_peers.clear();
         for (std::string_view p : Split(v, ',')) {
           p = Strip(p);
           if (p.empty()) continue;
           if (p.find(':') == std::string_view::npos || p.size() > 1024)
             return Bad("restore_peers", v, "entries are host:port");
           o->restore_peers.emplace_back(p);
         }
         return absl::OkStatus();
       },
       [](const DaemonOptions& o) {
         std::string s;
         for (const auto& r : o.restore_peers) s += (s.empty() ? "" : ",") + r;
         return s;
       }},
      StringOption("peer_restore",
                   "prefer | missing | off: restores read data files other "
                   "daemons hold in memory instead of storage (prefer), only "
                   "those gone from storage (missing), or never",
                   &DaemonOptions::peer_restore),
      DurationOption("peer_heartbeat",
                     "how often a node reports progress to the coordinator",
                     &DaemonOptions::peer_heartbeat),
      DurationOption(
          "commit_timeout",
          "all nodes must be durable within this long of a node's prepare",
          &DaemonOptions::commit_timeout),
      {"checkpoint_roots",
       "comma-separated directories checkpoints must resolve under; relative "
       "ids use the first",
       [](DaemonOptions* o, std::string_view v) -> absl::Status {
         o->checkpoint_roots.clear();
         for (std::string_view p : Split(v, ',')) {
           p = Strip(p);
           if (p.empty()) continue;
           if (p[0] != '/')
             return Bad("checkpoint_roots", v, "roots must be absolute paths");
           o->checkpoint_roots.emplace_back(p);
         }
         if (o->checkpoint_roots.empty())
           return Bad("checkpoint_roots", v, "at least one root");
         return absl::OkStatus();
       },
       [](const DaemonOptions& o) {
         std::string s;
         for (const auto& r : o.checkpoint_roots)
           s += (s.empty() ? "" : ",") + r;
         return s;
       }},
      StringOption(
          "shm_dir",
          "directory (tmpfs) of legacy named arenas (allow_named_arenas)",
          &DaemonOptions::shm_dir),
      StringOption("state_dir",
                   "journal of unfinished checkpoints and per-job history",
                   &DaemonOptions::state_dir),
      SizeOption(
          "staging_budget",
          "bytes of client arenas held at once (staged, not yet written)",
          &DaemonOptions::staging_budget),
      SizeOption("max_batch",
                 "largest batch of one Save call; 0 = staging_budget/2",
                 &DaemonOptions::max_batch),
      StringOption("cuda", "auto | on | off: stage CUDA IPC handles (GPU path)",
                   &DaemonOptions::cuda),
      StringOption("cuda_library", "the CUDA driver library to dlopen",
                   &DaemonOptions::cuda_library),
      SizeOption("pinned_staging_bytes",
                 "page-locked staging pool for device bytes (allocated at "
                 "start-up when CUDA is used)",
                 &DaemonOptions::pinned_staging_bytes),
      IntOption("cuda_streams", "device-to-host copy streams per GPU",
                &DaemonOptions::cuda_streams, 1, 64),
      StringOption("io_backend", "auto | io_uring | pwrite",
                   &DaemonOptions::io_backend),
      IntOption("io_threads", "data files written concurrently",
                &DaemonOptions::io_threads, 1, 256),
      DurationOption("restore_gather_timeout",
                     "how long a Restore batch waits for the other local "
                     "ranks of its group",
                     &DaemonOptions::restore_gather_timeout),
      IntOption("restore_threads", "restore group batches served at once",
                &DaemonOptions::restore_threads, 1, 64),
      IntOption("restore_read_threads",
                "reading threads of one restore group batch",
                &DaemonOptions::restore_read_threads, 1, 64),
      BoolOption("restore_direct_io",
                 "restores read large records with O_DIRECT straight into "
                 "group buffers (no page cache)",
                 &DaemonOptions::restore_direct_io),
      IntOption("restore_cached_checkpoints",
                "decoded checkpoint indexes kept for restores (LRU)",
                &DaemonOptions::restore_cached_checkpoints, 1, 1024),
      SizeOption("restore_buffer_bytes",
                 "memory of restore group buffers alive at once, at most "
                 "staging_budget (0: none, values copied into every rank's "
                 "arena)",
                 &DaemonOptions::restore_buffer_bytes),
      SizeOption("memory_tier_bytes",
                 "committed checkpoints kept in memory for restores, newest "
                 "per job first (0: off)",
                 &DaemonOptions::memory_tier_bytes),
      StringOption("memory_tier_dir",
                   "tmpfs directory of this daemon's own where the memory "
                   "tier's checkpoints outlive a daemon restart (empty: in "
                   "the daemon's memory only)",
                   &DaemonOptions::memory_tier_dir),
      IntOption("queue_depth", "io_uring writes in flight per file",
                &DaemonOptions::queue_depth, 1, 256),
      SizeOption("write_block", "bytes per io_uring write (multiple of 4K)",
                 &DaemonOptions::write_block),
      SizeOption("write_pool", "io_uring write buffers in all",
                 &DaemonOptions::write_pool),
      BoolOption("direct_io", "O_DIRECT data files (io_uring backend)",
                 &DaemonOptions::direct_io),
      BoolOption(
          "fsync",
          "fsync data, metadata and directories (never turn off in production)",
          &DaemonOptions::fsync),
      SizeOption("write_rate_limit",
                 "cap on data-file write bytes per second; 0 = unlimited",
                 &DaemonOptions::write_rate_limit),
      DurationOption("write_timeout",
                     "fail a checkpoint whose write or fsync makes no "
                     "progress this long (hung storage); 0 = off",
                     &DaemonOptions::write_timeout),
      IntOption("keep_last_n",
                "committed checkpoints kept per job; 0 keeps all",
                &DaemonOptions::keep_last_n, 0, 1 << 20),
      DurationOption(
          "stage_timeout",
          "abort a checkpoint whose ranks make no progress this long",
          &DaemonOptions::stage_timeout),
      DurationOption(
          "batch_gap_timeout",
          "abort when a streaming rank sends no next batch this long",
          &DaemonOptions::batch_gap_timeout),
      DurationOption("arena_idle_timeout", "unmap arenas unused this long",
                     &DaemonOptions::arena_idle_timeout),
      DurationOption("forget_after",
                     "finished checkpoints stay listed this long",
                     &DaemonOptions::forget_after),
      DurationOption("shutdown_grace",
                     "on SIGTERM, staged checkpoints get this long to finish "
                     "(then the teardown is bounded by write_timeout + 30s)",
                     &DaemonOptions::shutdown_grace),
      IntOption("max_items", "items of one rank", &DaemonOptions::max_items, 1,
                1 << 26),
      IntOption("max_world_size", "ranks of one checkpoint",
                &DaemonOptions::max_world_size, 1, 1 << 20),
      IntOption("max_active_checkpoints", "unfinished checkpoints at once",
                &DaemonOptions::max_active_checkpoints, 1, 1 << 16),
      IntOption("max_arenas", "registered arenas at once",
                &DaemonOptions::max_arenas, 1, 1 << 20),
      IntOption("max_arenas_per_client",
                "registered arenas at once per client uid",
                &DaemonOptions::max_arenas_per_client, 1, 1 << 20),
      SizeOption("max_arena_bytes_per_client",
                 "bytes of registered arenas at once per client uid",
                 &DaemonOptions::max_arena_bytes_per_client),
      IntOption("max_pending_saves", "Save calls waiting for staging budget",
                &DaemonOptions::max_pending_saves, 1, 1 << 20),
      StringOption("log_level", "trace | debug | info | warn | error",
                   &DaemonOptions::log_level),
      StringOption("log_file", "log file; empty logs to stderr",
                   &DaemonOptions::log_file),
  };
  return *specs;
}

}  // namespace

absl::StatusOr<uint64_t> ParseSize(std::string_view text) {
  text = Strip(text);
  uint64_t mult = 1;
  std::string_view num = text;
  if (!text.empty()) {
    char c = static_cast<char>(
        std::toupper(static_cast<unsigned char>(text.back())));
    if (c == 'B' && text.size() > 1) {
      num = text.substr(0, text.size() - 1);
      c = static_cast<char>(
          std::toupper(static_cast<unsigned char>(num.back())));
      if (c == 'I' && num.size() > 1) {  // "GiB"
        num = num.substr(0, num.size() - 1);
        c = static_cast<char>(
            std::toupper(static_cast<unsigned char>(num.back())));
      }
      text = num;
    }
    switch (c) {
      case 'K':
        mult = uint64_t{1} << 10;
        break;
      case 'M':
        mult = uint64_t{1} << 20;
        break;
      case 'G':
        mult = uint64_t{1} << 30;
        break;
      case 'T':
        mult = uint64_t{1} << 40;
        break;
      default:
        break;
    }
    if (mult != 1) num = text.substr(0, text.size() - 1);
  }
  ASSIGN_OR_RETURN(double v, ParseNumber(num));
  const double bytes = v * static_cast<double>(mult);
  if (bytes >= 1.8e19) return absl::InvalidArgumentError("size too large");
  return static_cast<uint64_t>(bytes);
}

absl::StatusOr<absl::Duration> ParseDuration(std::string_view text) {
  text = Strip(text);
  double unit = 1.0;  // seconds
  std::string_view num = text;
  if (ConsumeSuffix(&num, "ms")) {
    unit = 1e-3;
  } else if (ConsumeSuffix(&num, "s")) {
    unit = 1;
  } else if (ConsumeSuffix(&num, "m")) {
    unit = 60;
  } else if (ConsumeSuffix(&num, "h")) {
    unit = 3600;
  }
  ASSIGN_OR_RETURN(double v, ParseNumber(num));
  return absl::Seconds(v * unit);
}

absl::Status SetOption(DaemonOptions* options, std::string_view key,
                       std::string_view value) {
  std::string k(key);
  for (char& c : k) {
    if (c == '-') c = '_';
  }
  for (const OptionSpec& spec : Specs()) {
    if (k == spec.key) return spec.set(options, Strip(value));
  }
  return absl::InvalidArgumentError(
      fmt::format("unknown option '{}' (see ckptd --help)", key));
}

absl::Status ApplyConfigText(DaemonOptions* options, std::string_view text,
                             std::string_view source) {
  int line_no = 0;
  for (std::string_view line : Split(text, '\n')) {
    ++line_no;
    if (size_t hash = line.find('#'); hash != std::string_view::npos) {
      line = line.substr(0, hash);
    }
    line = Strip(line);
    if (line.empty()) continue;
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos) {
      return absl::InvalidArgumentError(fmt::format(
          "{}:{}: expected 'key = value', got '{}'", source, line_no, line));
    }
    absl::Status s = SetOption(options, Strip(line.substr(0, eq)),
                               Strip(line.substr(eq + 1)));
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("{}:{}: {}", source, line_no, Msg(s)));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseCommandLine(int argc, char** argv, DaemonOptions* options,
                              bool* help) {
  *help = false;
  std::vector<std::pair<std::string, std::string>> flags;
  std::string config;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--help" || a == "-h") {
      *help = true;
      return absl::OkStatus();
    }
    if (!a.starts_with("--")) {
      return absl::InvalidArgumentError(
          fmt::format("unexpected argument '{}'", a));
    }
    a.remove_prefix(2);
    std::string key, value;
    if (size_t eq = a.find('='); eq != std::string_view::npos) {
      key = std::string(a.substr(0, eq));
      value = std::string(a.substr(eq + 1));
    } else {
      key = std::string(a);
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(
            fmt::format("flag --{} needs a value", key));
      }
      value = argv[++i];
    }
    if (key == "config") {
      config = value;
    } else {
      flags.emplace_back(std::move(key), std::move(value));
    }
  }
  if (!config.empty()) {
    ASSIGN_OR_RETURN(std::string text,
                     ReadFileToString(Env::Default(), config, 1 << 20));
    RETURN_IF_ERROR(ApplyConfigText(options, text, config));
  }
  for (const auto& [k, v] : flags) {
    RETURN_IF_ERROR(Annotate(SetOption(options, k, v), "command line"));
  }
  return absl::OkStatus();
}

std::string OptionsHelp() {
  DaemonOptions defaults;
  std::string out =
      "Usage: ckptd [--config FILE] [--KEY=VALUE ...]\n\n"
      "The config file holds `key = value` lines (# comments); flags override "
      "it.\n"
      "Sizes take K/M/G/T suffixes, durations ms/s/m/h.\n\nOptions "
      "(default):\n";
  for (const OptionSpec& spec : Specs()) {
    out += fmt::format("  --{:<24} {} (default: {})\n", spec.key, spec.help,
                       spec.get(defaults));
  }
  return out;
}

namespace {

// Staging, the writer and the paths.
absl::Status FinalizeStorage(DaemonOptions* o) {
  if (o->staging_budget < (uint64_t{1} << 20)) {
    return absl::InvalidArgumentError(
        "option staging_budget: must be at least 1M");
  }
  if (o->max_batch == 0) o->max_batch = o->staging_budget / 2;
  // Restore group buffers are the daemon's own memory: they count within
  // the staging budget (docs/restore.md, "Memory").
  o->restore_buffer_bytes =
      std::min(o->restore_buffer_bytes, o->staging_budget);
  if (o->max_batch > o->staging_budget) {
    return absl::InvalidArgumentError(
        fmt::format("option max_batch: {} exceeds staging_budget {}",
                    o->max_batch, o->staging_budget));
  }
  if (o->write_block == 0 || o->write_block % 4096 != 0) {
    return absl::InvalidArgumentError(
        "option write_block: must be a positive multiple of 4K");
  }
  if (o->peer_restore != "prefer" && o->peer_restore != "missing" &&
      o->peer_restore != "off") {
    return absl::InvalidArgumentError(fmt::format(
        "option peer_restore: '{}' is not one of prefer, missing, off",
        o->peer_restore));
  }
  if (o->failure_domain.size() > 256) {
    return absl::InvalidArgumentError(
        "option failure_domain: longer than 256 bytes");
  }
  if (o->peer_replicas > 0 &&
      (o->memory_tier_bytes == 0 || o->peer_listen.empty())) {
    return absl::InvalidArgumentError(fmt::format(
        "option peer_replicas={}: needs memory_tier_bytes (replicas are "
        "copies of what the memory tier holds, and are held in the other "
        "nodes' tiers) and peer_listen",
        o->peer_replicas));
  }
  if (o->io_backend != "auto" && o->io_backend != "io_uring" &&
      o->io_backend != "pwrite") {
    return absl::InvalidArgumentError(fmt::format(
        "option io_backend: '{}' is not one of auto, io_uring, pwrite",
        o->io_backend));
  }
  if (o->checkpoint_roots.empty()) {
    return absl::InvalidArgumentError(
        "option checkpoint_roots: at least one root");
  }
  for (const std::string& r : o->checkpoint_roots) {
    if (r.empty() || r[0] != '/') {
      return absl::InvalidArgumentError(
          fmt::format("option checkpoint_roots: '{}' is not absolute", r));
    }
  }
  if (o->write_timeout != absl::ZeroDuration() &&
      o->write_timeout < absl::Seconds(1)) {
    return absl::InvalidArgumentError(
        fmt::format("option write_timeout: {} is below 1s (a healthy disk can "
                    "take that long for one "
                    "write); 0 turns it off",
                    absl::FormatDuration(o->write_timeout)));
  }
  if (o->max_arena_bytes_per_client == 0) {
    return absl::InvalidArgumentError(
        "option max_arena_bytes_per_client: must be positive");
  }
  if (o->cuda != "auto" && o->cuda != "on" && o->cuda != "off") {
    return absl::InvalidArgumentError(
        fmt::format("option cuda: '{}' is not one of auto, on, off", o->cuda));
  }
  if (o->cuda != "off" && o->pinned_staging_bytes < (uint64_t{8} << 20)) {
    return absl::InvalidArgumentError(
        "option pinned_staging_bytes: must be at least 8M");
  }
  return absl::OkStatus();
}

// The sockets, the HTTP endpoint and the peers.
absl::Status FinalizeEndpoints(DaemonOptions* o) {
  if (o->arena_socket.empty()) o->arena_socket = o->socket + ".arena";
  if (o->arena_socket == o->socket) {
    return absl::InvalidArgumentError(
        "option arena_socket: must differ from socket");
  }
  if (o->arena_socket.size() > 107) {
    return absl::InvalidArgumentError(
        fmt::format("option arena_socket: '{}' is longer than 107 bytes (a "
                    "Unix socket path; set "
                    "arena_socket to a shorter path)",
                    o->arena_socket));
  }
  if (!o->peer_listen.empty() && o->peer_token_file.empty()) {
    return absl::InvalidArgumentError(
        "option peer_token_file: required with peer_listen (peer calls are "
        "never "
        "unauthenticated)");
  }
  if (!o->http_listen.empty()) {
    // host:port, [v6]:port or :port; the port a number in [0, 65535].
    const size_t colon = o->http_listen.rfind(':');
    const std::string_view port =
        colon == std::string::npos
            ? std::string_view()
            : std::string_view(o->http_listen).substr(colon + 1);
    auto n = ParseInt(port);
    if (colon == std::string::npos || !n.ok() || *n < 0 || *n > 65535) {
      return absl::InvalidArgumentError(fmt::format(
          "option http_listen: '{}' is not host:port (port 0-65535)",
          o->http_listen));
    }
  }
  if (o->peer_tls_cert.empty() != o->peer_tls_key.empty()) {
    return absl::InvalidArgumentError(
        "options peer_tls_cert and peer_tls_key go together");
  }
  if (o->peer_heartbeat <= absl::ZeroDuration() ||
      o->peer_timeout < 2 * o->peer_heartbeat) {
    return absl::InvalidArgumentError(
        "option peer_timeout: must be at least twice peer_heartbeat (> 0)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FinalizeOptions(DaemonOptions* o) {
  RETURN_IF_ERROR(FinalizeStorage(o));
  return FinalizeEndpoints(o);
}

}  // namespace ckptd::daemon
