// Copyright 2026 The ckptd Authors.
//
// uring_bench: durable write throughput of UringEnv (common/uring_env.h)
// against the POSIX Env it must beat, in the same run (house-style practice
// 16). Each workload writes --gib GiB to --files files in one directory with
// --threads threads (thread t writes files t, t + threads, ... one after
// another: open, --append-mib appends, Sync, Close):
//
//   uring_buffered   UringEnv, default options (4 MiB blocks, queue depth 4,
//                    32 MiB pool), page-cache writes + IORING_OP_FSYNC
//   uring_direct     the same with O_DIRECT
//   pwrite_timeout   WriteTimeoutEnv over Env::Default() (the daemon's
//                    pwrite path with write_timeout: the file's writer
//                    thread copies each 1 MiB chunk into its buffer and
//                    writes it)
//   pwrite           Env::Default(): writev per append + fdatasync (the
//                    reference; ratios are to it)
//
// --workloads picks some; --queue-depth, --block-mib and --pool-mib set the
// UringEnvOptions of both uring workloads. On the build VM's ext4 buffered
// io_uring writes are executed by io-wq worker threads (perf shows the page
// cache copy in iou-wrk-*), so uring_buffered pays for two copies on two
// threads where pwrite does one; uring_direct is the mode the daemon is
// meant to use for data files.
//
// The workloads are interleaved --reps times (drift hits all) and the median
// is printed. GB/s = 1e9 bytes per second, timed from the first open to the
// last Close. The source buffer the appends copy from is pre-faulted
// (mmap MAP_POPULATE + memset) before any clock starts, and UringEnv's pool
// is pre-faulted by Create: first touch of fresh memory on the build VMs runs
// at 0.2-1 GB/s (docs/environment.md).
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/env.h"
#include "common/status_macros.h"
#include "common/uring_env.h"
#include "common/write_timeout_env.h"
#include "fmt/format.h"

namespace ckptd {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kSourceBytes = 64 * kMiB;

struct BenchOptions {
  double gib = 1.0;
  std::string dir;  // "": <build dir>/bench-tmp
  int threads = 2;
  int files = 4;
  size_t append_mib = 1;
  int reps = 3;
  std::vector<std::string> workloads;  // empty: all
  // direct is set per workload; write_timeout as in the daemon (5 min).
  UringEnvOptions uring{.write_timeout = absl::Minutes(5)};
  size_t timeout_buffer_mib = 1;       // pwrite_timeout: buffer_bytes
};

constexpr std::string_view kUsage =
    "usage: uring_bench [--gib=N] [--dir=PATH] [--threads=N] [--files=N]\n"
    "                   [--append-mib=N] [--reps=N] [--workloads=a,b]\n"
    "                   [--queue-depth=N] [--block-mib=N] [--pool-mib=N]\n"
    "  workloads: uring_buffered, uring_direct, pwrite_timeout, pwrite\n"
    "             (default: all; the ratio column needs pwrite)\n"
    "  --gib         GiB written per workload (default 1)\n"
    "  --dir         where a temporary directory is made (default\n"
    "                <build dir>/bench-tmp); removed afterwards\n"
    "  --threads     writer threads (default 2)\n"
    "  --files       files per workload (default 4)\n"
    "  --append-mib  bytes per Append in MiB (default 1)\n"
    "  --reps        interleaved repetitions; the median is printed "
    "(default 3)\n"
    "  --queue-depth, --block-mib, --pool-mib  UringEnvOptions (default 4, 4,\n"
    "                32)\n"
    "  --timeout-buffer-mib  WriteTimeoutEnvOptions.buffer_bytes of\n"
    "                pwrite_timeout (default 1, as in the daemon)\n";

std::optional<BenchOptions> ParseArgs(int argc, char** argv,
                                      std::string* error) {
  BenchOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value_of = [&](std::string_view flag) -> std::optional<std::string> {
      if (a.size() > flag.size() + 1 && a.substr(0, flag.size()) == flag &&
          a[flag.size()] == '=') {
        return std::string(a.substr(flag.size() + 1));
      }
      return std::nullopt;
    };
    auto positive_int = [&](const std::string& v, long max, long* out) {
      char* end = nullptr;
      const long x = std::strtol(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || x < 1 || x > max) return false;
      *out = x;
      return true;
    };
    long n = 0;
    if (a == "--help" || a == "-h") {
      *error = "";
      return std::nullopt;
    } else if (auto v = value_of("--gib")) {
      char* end = nullptr;
      o.gib = std::strtod(v->c_str(), &end);
      if (end == v->c_str() || *end != '\0' || !(o.gib > 0) || o.gib > 1024) {
        *error = fmt::format("bad --gib value '{}'", *v);
        return std::nullopt;
      }
    } else if (auto v = value_of("--dir")) {
      o.dir = *v;
    } else if (auto v = value_of("--threads")) {
      if (!positive_int(*v, 256, &n)) {
        *error = fmt::format("bad --threads value '{}'", *v);
        return std::nullopt;
      }
      o.threads = static_cast<int>(n);
    } else if (auto v = value_of("--files")) {
      if (!positive_int(*v, 4096, &n)) {
        *error = fmt::format("bad --files value '{}'", *v);
        return std::nullopt;
      }
      o.files = static_cast<int>(n);
    } else if (auto v = value_of("--append-mib")) {
      if (!positive_int(*v, 64, &n)) {
        *error = fmt::format("bad --append-mib value '{}'", *v);
        return std::nullopt;
      }
      o.append_mib = static_cast<size_t>(n);
    } else if (auto v = value_of("--workloads")) {
      std::string_view rest = *v;
      while (!rest.empty()) {
        const size_t comma = rest.find(',');
        if (comma != 0) o.workloads.emplace_back(rest.substr(0, comma));
        if (comma == std::string_view::npos) break;
        rest.remove_prefix(comma + 1);
      }
    } else if (auto v = value_of("--queue-depth")) {
      if (!positive_int(*v, 1024, &n)) {
        *error = fmt::format("bad --queue-depth value '{}'", *v);
        return std::nullopt;
      }
      o.uring.queue_depth = static_cast<int>(n);
    } else if (auto v = value_of("--block-mib")) {
      if (!positive_int(*v, 1024, &n)) {
        *error = fmt::format("bad --block-mib value '{}'", *v);
        return std::nullopt;
      }
      o.uring.block_bytes = static_cast<size_t>(n) * kMiB;
    } else if (auto v = value_of("--pool-mib")) {
      if (!positive_int(*v, 1 << 16, &n)) {
        *error = fmt::format("bad --pool-mib value '{}'", *v);
        return std::nullopt;
      }
      o.uring.pool_bytes = static_cast<size_t>(n) * kMiB;
    } else if (auto v = value_of("--timeout-buffer-mib")) {
      if (!positive_int(*v, 1024, &n)) {
        *error = fmt::format("bad --timeout-buffer-mib value '{}'", *v);
        return std::nullopt;
      }
      o.timeout_buffer_mib = static_cast<size_t>(n);
    } else if (auto v = value_of("--reps")) {
      if (!positive_int(*v, 100, &n)) {
        *error = fmt::format("bad --reps value '{}'", *v);
        return std::nullopt;
      }
      o.reps = static_cast<int>(n);
    } else {
      *error = fmt::format("unknown argument '{}'", a);
      return std::nullopt;
    }
  }
  return o;
}

// <build dir>/bench-tmp, from /proc/self/exe = <build dir>/bin/uring_bench.
std::string DefaultDir() {
  std::error_code ec;
  const std::filesystem::path exe =
      std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "/tmp";
  return (exe.parent_path().parent_path() / "bench-tmp").string();
}

// Writes `per_file` bytes to each of `files` files in `dir` with `threads`
// threads; returns the seconds from the first open to the last Close.
absl::StatusOr<double> RunWorkload(Env* env, const std::string& dir,
                                   const BenchOptions& o, uint64_t per_file,
                                   const char* source) {
  const size_t append = o.append_mib * kMiB;
  std::vector<absl::Status> results(o.threads);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < o.threads; ++t) {
    threads.emplace_back([&, t] {
      auto write_files = [&]() -> absl::Status {
        size_t src = static_cast<size_t>(t) * 7 * kMiB % kSourceBytes;
        for (int f = t; f < o.files; f += o.threads) {
          ASSIGN_OR_RETURN(
              auto file,
              env->NewWritableFile(
                  JoinPath(dir, fmt::format("__{}_0.distcp", f)), {}));
          for (uint64_t left = per_file; left > 0;) {
            const size_t n = static_cast<size_t>(
                std::min<uint64_t>({left, append, kSourceBytes - src}));
            RETURN_IF_ERROR(file->Append(std::string_view(source + src, n)));
            left -= n;
            src = (src + n) % kSourceBytes;
          }
          RETURN_IF_ERROR(file->Sync());
          RETURN_IF_ERROR(file->Close());
        }
        return absl::OkStatus();
      };
      results[t] = write_files();
    });
  }
  for (std::thread& thread : threads) thread.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  for (const absl::Status& s : results) RETURN_IF_ERROR(s);
  // Check the sizes, then delete (not timed).
  for (int f = 0; f < o.files; ++f) {
    const std::string path = JoinPath(dir, fmt::format("__{}_0.distcp", f));
    ASSIGN_OR_RETURN(uint64_t size, env->GetFileSize(path));
    if (size != per_file) {
      return absl::InternalError(
          fmt::format("{} has {} bytes, expected {}", path, size, per_file));
    }
    RETURN_IF_ERROR(env->RemoveFile(path));
  }
  return seconds;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Main(int argc, char** argv) {
  std::string error;
  std::optional<BenchOptions> parsed = ParseArgs(argc, argv, &error);
  if (!parsed.has_value()) {
    if (!error.empty())
      std::fprintf(stderr, "uring_bench: %s\n", error.c_str());
    std::fprintf(stderr, "%.*s", static_cast<int>(kUsage.size()),
                 kUsage.data());
    return 2;
  }
  const BenchOptions o = *parsed;
  const std::string base = o.dir.empty() ? DefaultDir() : o.dir;
  Env* posix = Env::Default();
  if (absl::Status s = posix->CreateDirs(base); !s.ok()) {
    std::fprintf(stderr, "uring_bench: %s\n", s.ToString().c_str());
    return 2;
  }
  std::string dir = JoinPath(base, "uring_bench_XXXXXX");
  if (::mkdtemp(dir.data()) == nullptr) {
    std::fprintf(stderr, "uring_bench: mkdtemp %s: %s\n", dir.c_str(),
                 std::strerror(errno));
    return 2;
  }

  // The source of every append, pre-faulted before any clock starts.
  void* mem = ::mmap(nullptr, kSourceBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (mem == MAP_FAILED) {
    std::fprintf(stderr, "uring_bench: mmap: %s\n", std::strerror(errno));
    return 2;
  }
  char* source = static_cast<char*>(mem);
  for (size_t i = 0; i < kSourceBytes; ++i) {
    source[i] = static_cast<char>(i * 2654435761u >> 13);
  }

  struct Workload {
    const char* name;
    std::unique_ptr<Env> env;  // null: the POSIX reference
    std::vector<double> seconds;
  };
  auto wanted = [&](std::string_view name) {
    return o.workloads.empty() ||
           std::find(o.workloads.begin(), o.workloads.end(), name) !=
               o.workloads.end();
  };
  std::vector<Workload> workloads;
  for (bool direct : {false, true}) {
    const char* name = direct ? "uring_direct" : "uring_buffered";
    if (!wanted(name)) continue;
    UringEnvOptions uo = o.uring;
    uo.direct = direct;
    auto env = UringEnv::Create(posix, dir, uo);
    if (!env.ok()) {
      std::fprintf(stderr, "uring_bench: %s\n",
                   env.status().ToString().c_str());
      std::filesystem::remove_all(dir);
      return 2;
    }
    workloads.push_back({name, std::move(env).value(), {}});
  }
  if (wanted("pwrite_timeout")) {
    // The daemon's pwrite path (daemon_main.cc): write_timeout 5 min, a
    // 1 MiB buffer per file (--timeout-buffer-mib), allocated per file (not
    // pre-faulted): part of what it measures.
    auto env = WriteTimeoutEnv::Create(
        posix, {.write_timeout = absl::Minutes(5),
                .buffer_bytes = o.timeout_buffer_mib * kMiB});
    if (!env.ok()) {
      std::fprintf(stderr, "uring_bench: %s\n",
                   env.status().ToString().c_str());
      std::filesystem::remove_all(dir);
      return 2;
    }
    workloads.push_back({"pwrite_timeout", std::move(env).value(), {}});
  }
  if (wanted("pwrite")) workloads.push_back({"pwrite", nullptr, {}});
  if (workloads.empty()) {
    std::fprintf(stderr, "uring_bench: no known workload selected\n");
    std::filesystem::remove_all(dir);
    return 2;
  }

  const uint64_t total = static_cast<uint64_t>(o.gib * double(1 << 30));
  const uint64_t per_file = total / static_cast<uint64_t>(o.files);
  const uint64_t written = per_file * static_cast<uint64_t>(o.files);
  std::printf(
      "uring_bench: %.2f GiB to %d files in %s, %d threads, %zu MiB appends, "
      "fsync per file, median of %d; UringEnv queue depth %d, %zu MiB "
      "blocks, %zu MiB pool; source buffer %zu MiB pre-faulted "
      "(MAP_POPULATE + memset), UringEnv pools pre-faulted in Create\n",
      double(written) / double(1 << 30), o.files, dir.c_str(), o.threads,
      o.append_mib, o.reps, o.uring.queue_depth, o.uring.block_bytes / kMiB,
      o.uring.pool_bytes / kMiB, kSourceBytes / kMiB);
  std::fflush(stdout);

  int rc = 0;
  for (int rep = 0; rep < o.reps && rc == 0; ++rep) {
    for (Workload& w : workloads) {
      Env* env = w.env ? w.env.get() : posix;
      absl::StatusOr<double> s = RunWorkload(env, dir, o, per_file, source);
      if (!s.ok()) {
        std::fprintf(stderr, "uring_bench: %s: %s\n", w.name,
                     s.status().ToString().c_str());
        rc = 2;
        break;
      }
      w.seconds.push_back(*s);
    }
  }
  if (rc == 0) {
    const bool have_reference = workloads.back().env == nullptr;
    const double reference =
        have_reference ? double(written) / Median(workloads.back().seconds) : 0;
    for (const Workload& w : workloads) {
      const double rate = double(written) / Median(w.seconds);
      if (have_reference) {
        std::printf("%-15s %6.2f GB/s  %.2fx pwrite\n", w.name, rate / 1e9,
                    rate / reference);
      } else {
        std::printf("%-15s %6.2f GB/s\n", w.name, rate / 1e9);
      }
    }
  }
  workloads.clear();
  ::munmap(mem, kSourceBytes);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return rc;
}

}  // namespace
}  // namespace ckptd

int main(int argc, char** argv) { return ckptd::Main(argc, argv); }
