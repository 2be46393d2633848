// Copyright 2026 The ckptd Authors.
//
// format_bench: throughput of the format library (format/), each workload
// compared in the same run against the reference it must approach or beat
// (house-style practice 16). One line per workload, sub-lines "name/variant":
//
//   serialize_64mib          a 64 MiB float32 tensor → torch.save archive in
//                            memory (AddTensorRecords + FinishInto) vs memcpy
//                            of the same 64 MiB, one thread. Target ratio
//                            >= 0.5. /segments: the zero-copy path (Finish():
//                            CRC only).
//   plan_metadata_RxT        PlanSave of R ranks × T FSDP-sharded tensors +
//                            EncodeMetadata of the result with storage_data.
//                            Target: total < 2 s at 1000×2000. /cold_heap:
//                            the first round; /decode: DecodeMetadata of that
//                            output (informational).
//   reshard_read             a 4-rank checkpoint read back resharded into 3
//                            ranks (CheckpointReader::ReadTensors) vs pread
//                            of the same .distcp files in 4 MiB blocks, warm
//                            page cache; /cold: both after fdatasync +
//                            POSIX_FADV_DONTNEED.
//   durable_write            WriteCheckpoint (fsync on) of 4 ranks vs pwrite
//                            in 4 MiB blocks + fsync of the same byte count,
//                            one file, into the same directory;
//                            /vs_parallel_raw: vs raw writes with the
//                            writer's file count and io_threads.
//
// Every memory buffer the workloads read or write is pre-faulted
// (mmap(MAP_POPULATE) + memset) before any clock starts: first touch of fresh
// memory on the build VMs runs at 0.2–1 GB/s (docs/environment.md) and would
// otherwise be what is measured. The planner's heap is warmed by a first
// round that is reported separately (/cold_heap).
//
// GB/s = 1e9 bytes per second. Figures are medians of interleaved
// repetitions (reference and subject alternate, so drift hits both).
// docs/benchmarks.md has the figures measured on the build VM.
#include <fcntl.h>
#include <malloc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/env.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "format/checkpoint/checkpoint_reader.h"
#include "format/checkpoint/checkpoint_writer.h"
#include "format/tensor/dtype.h"
#include "format/metadata/metadata.h"
#include "format/plan/save_plan.h"
#include "format/tensor/tensor_payload.h"
#include "format/zip/zip.h"

namespace ckptd::format {
namespace {

constexpr double kGB = 1e9;
constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kRawBlock = 4 * kMiB;  // block size of the raw I/O references

// ---------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------

struct BenchOptions {
  std::vector<std::string> workloads;  // empty: all
  uint64_t size_mb = 1024;  // checkpoint size of reshard_read / durable_write
  bool json = false;
  bool quick = false;
  bool cold = true;    // also run the cold-cache variant of reshard_read
  bool decode = true;  // also time DecodeMetadata in plan_metadata
  std::string dir_base = "/tmp";  // temp dirs are created under it
  int reps = 0;                   // 0: per-workload default
  int plan_ranks = 0;             // 0: 1000 (--quick: 100)
  int plan_tensors = 0;           // 0: 2000 (--quick: 200)
  int read_threads = 0;  // reader threads of the /crc figures; 0: min(8, CPUs)
};

constexpr std::string_view kUsage =
    "usage: format_bench [--workloads=a,b,c] [--size-mb=N] [--quick] [--json]\n"
    "                    [--dir=PATH] [--reps=N] [--no-cold] [--no-decode]\n"
    "                    [--read-threads=N]\n"
    "                    [--plan-ranks=N] [--plan-tensors=N]\n"
    "  workloads: serialize_64mib, plan_metadata, reshard_read, durable_write\n"
    "             (default: all, in that order)\n"
    "  --size-mb  bytes of tensor data in reshard_read / durable_write "
    "(default\n"
    "             1024; --quick: 64)\n"
    "  --quick    CI-sized run: fewer repetitions, 100x200 plan, 64 MiB I/O\n"
    "  --json     machine-readable results on stdout (progress goes to "
    "stderr)\n"
    "  --dir      where the temporary checkpoint directory is made (default "
    "/tmp,\n"
    "             the same ext4 as /work on the build VMs)\n"
    "  --reps     repetitions per timed figure (default: per workload)\n"
    "  --no-cold  skip the cold-page-cache variant of reshard_read\n"
    "  --read-threads  reader threads of the full_read/crc and "
    "reshard_read/crc\n"
    "             figures (default: min(8, CPUs), as ckptd.load)\n"
    "  --no-decode  skip DecodeMetadata in plan_metadata (it takes 4-5 KB of\n"
    "             memory per chunk: at 1000x2000, ~10 s and ~8 GiB)\n"
    "  --plan-ranks, --plan-tensors  size of plan_metadata (default 1000 x "
    "2000;\n"
    "             --quick: 100 x 200); the 2 s target applies to 1000 x 2000 "
    "only\n"
    "Exit status: 0 all targets met, 1 a target missed, 2 usage or I/O "
    "error.\n";

std::optional<BenchOptions> ParseArgs(int argc, char** argv,
                                      std::string* error) {
  BenchOptions o;
  bool size_given = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    auto value_of =
        [&](std::string_view flag) -> std::optional<std::string_view> {
      if (a.substr(0, flag.size()) == flag && a.size() > flag.size() &&
          a[flag.size()] == '=') {
        return a.substr(flag.size() + 1);
      }
      return std::nullopt;
    };
    auto parse_uint = [&](std::string_view v, uint64_t* out) {
      if (v.empty()) return false;
      uint64_t x = 0;
      for (char c : v) {
        if (c < '0' || c > '9') return false;
        x = x * 10 + static_cast<uint64_t>(c - '0');
        if (x > (uint64_t{1} << 40)) return false;
      }
      *out = x;
      return true;
    };
    if (a == "--help" || a == "-h") {
      *error = "";
      return std::nullopt;
    } else if (a == "--json") {
      o.json = true;
    } else if (a == "--quick") {
      o.quick = true;
    } else if (a == "--no-cold") {
      o.cold = false;
    } else if (a == "--no-decode") {
      o.decode = false;
    } else if (auto v = value_of("--workloads")) {
      std::string_view rest = *v;
      while (!rest.empty()) {
        const size_t comma = rest.find(',');
        std::string_view w = rest.substr(0, comma);
        if (!w.empty()) o.workloads.emplace_back(w);
        if (comma == std::string_view::npos) break;
        rest.remove_prefix(comma + 1);
      }
    } else if (auto v = value_of("--size-mb")) {
      if (!parse_uint(*v, &o.size_mb) || o.size_mb == 0) {
        *error = fmt::format("bad --size-mb value '{}'", *v);
        return std::nullopt;
      }
      size_given = true;
    } else if (auto v = value_of("--reps")) {
      uint64_t r = 0;
      if (!parse_uint(*v, &r) || r == 0 || r > 1000) {
        *error = fmt::format("bad --reps value '{}'", *v);
        return std::nullopt;
      }
      o.reps = static_cast<int>(r);
    } else if (auto v = value_of("--read-threads")) {
      uint64_t n = 0;
      if (!parse_uint(*v, &n) || n == 0 || n > 256) {
        *error = fmt::format("bad --read-threads value '{}'", *v);
        return std::nullopt;
      }
      o.read_threads = static_cast<int>(n);
    } else if (auto v = value_of("--plan-ranks")) {
      uint64_t n = 0;
      if (!parse_uint(*v, &n) || n == 0 || n > 100000) {
        *error = fmt::format("bad --plan-ranks value '{}'", *v);
        return std::nullopt;
      }
      o.plan_ranks = static_cast<int>(n);
    } else if (auto v = value_of("--plan-tensors")) {
      uint64_t n = 0;
      if (!parse_uint(*v, &n) || n == 0 || n > 1000000) {
        *error = fmt::format("bad --plan-tensors value '{}'", *v);
        return std::nullopt;
      }
      o.plan_tensors = static_cast<int>(n);
    } else if (auto v = value_of("--dir")) {
      o.dir_base = std::string(*v);
    } else {
      *error = fmt::format("unknown argument '{}'", a);
      return std::nullopt;
    }
  }
  if (o.quick && !size_given) o.size_mb = 64;
  return o;
}

// ---------------------------------------------------------------------------
// Small utilities
// ---------------------------------------------------------------------------

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// CPU time of the calling thread: shows how much of a wall-clock figure was
// spent waiting (another job on the 2 cores, host-side page faults).
double ThreadCpuSeconds() {
  timespec ts;
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) +
         1e-9 * static_cast<double>(ts.tv_nsec);
}

double Median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Keeps the compiler from proving a buffer's contents unused.
inline void ClobberMemory(const void* p) {
  asm volatile("" : : "r"(p) : "memory");
}

// A page-aligned anonymous mapping, pre-faulted: MAP_POPULATE, then every
// byte written (memset) so that no page is first touched while timed.
class PrefaultedBuffer {
 public:
  PrefaultedBuffer() = default;
  ~PrefaultedBuffer() { Release(); }
  PrefaultedBuffer(PrefaultedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)) {}
  PrefaultedBuffer& operator=(PrefaultedBuffer&& o) noexcept {
    if (this != &o) {
      Release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }

  static absl::StatusOr<PrefaultedBuffer> Create(size_t size) {
    PrefaultedBuffer b;
    if (size == 0) return b;
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) {
      return absl::ErrnoToStatus(errno, fmt::format("mmap {} bytes", size));
    }
    b.data_ = static_cast<char*>(p);
    b.size_ = size;
    std::memset(b.data_, 0x5a, size);
    return b;
  }

  char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void Release() {
    if (data_ != nullptr) ::munmap(data_, size_);
    data_ = nullptr;
    size_ = 0;
  }
  char* data_ = nullptr;
  size_t size_ = 0;
};

// Deterministic, non-constant contents (a CRC or a compare must do real work).
void FillPattern(char* p, size_t n, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 12345u;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    x = x * 1664525u + 1013904223u;
    std::memcpy(p + i, &x, 4);
  }
  for (; i < n; ++i) p[i] = static_cast<char>(i);
}

// A temporary directory, removed (recursively) on destruction.
class TempDir {
 public:
  static absl::StatusOr<TempDir> Create(const std::string& base) {
    std::string tmpl = JoinPath(base, "ckptd_format_bench.XXXXXX");
    if (::mkdtemp(tmpl.data()) == nullptr) {
      return absl::ErrnoToStatus(errno, fmt::format("mkdtemp {}", tmpl));
    }
    TempDir d;
    d.path_ = tmpl;
    return d;
  }
  TempDir() = default;
  TempDir(TempDir&& o) noexcept : path_(std::exchange(o.path_, "")) {}
  TempDir& operator=(TempDir&& o) noexcept {
    if (this != &o) {
      Remove();
      path_ = std::exchange(o.path_, "");
    }
    return *this;
  }
  ~TempDir() { Remove(); }
  const std::string& path() const { return path_; }

 private:
  void Remove() {
    if (path_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
    if (ec)
      fmt::print(stderr, "warning: could not remove {}: {}\n", path_,
                 ec.message());
    path_.clear();
  }
  std::string path_;
};

// Removes every entry of a flat directory (the checkpoint dirs we make).
absl::Status EmptyDir(Env* env, const std::string& dir) {
  ASSIGN_OR_RETURN(std::vector<std::string> names, env->ListDir(dir));
  for (const std::string& n : names)
    RETURN_IF_ERROR(env->RemoveFile(JoinPath(dir, n)));
  return env->SyncDir(dir);
}

absl::StatusOr<std::vector<std::string>> DataFiles(Env* env,
                                                   const std::string& dir) {
  ASSIGN_OR_RETURN(std::vector<std::string> names, env->ListDir(dir));
  std::vector<std::string> out;
  for (const std::string& n : names) {
    if (n.size() > 7 && n.compare(n.size() - 7, 7, ".distcp") == 0)
      out.push_back(JoinPath(dir, n));
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string ReadCpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        size_t b = colon + 1;
        while (b < line.size() && line[b] == ' ') ++b;
        return line.substr(b);
      }
    }
  }
  return "unknown";
}

double LoadAverage1() {
  double l = -1;
  std::ifstream in("/proc/loadavg");
  in >> l;
  return l;
}

// ---------------------------------------------------------------------------
// Results
// ---------------------------------------------------------------------------

struct Result {
  std::string name;
  std::string figure;     // human-readable figure ("9.81 GB/s")
  double value = 0;       // the figure as a number
  std::string unit;       // "GB/s", "s"
  std::string reference;  // human-readable reference ("memcpy 12.4 GB/s")
  double ref_value = std::nan("");
  double ratio = std::nan("");
  std::string ratio_note;  // what the ratio is ("GB/s / memcpy GB/s")
  std::string target;      // "ratio >= 0.50"; empty: informational
  std::optional<bool> pass;
  std::vector<std::pair<std::string, double>> extra;  // JSON-only details
};

std::string Verdict(const Result& r) {
  if (r.target.empty()) return "info";
  if (!r.pass.has_value())
    return fmt::format("{} (info in this run)", r.target);
  return fmt::format("{} {}", r.target, *r.pass ? "PASS" : "FAIL");
}

void PrintLine(const Result& r, bool json) {
  std::FILE* out = json ? stderr : stdout;
  std::string ratio =
      std::isnan(r.ratio) ? "-" : fmt::format("{:.2f}", r.ratio);
  fmt::print(out, "{:<34} {:<56} | ref {:<30} | ratio {:>5} | {}\n", r.name,
             r.figure, r.reference.empty() ? "-" : r.reference, ratio,
             Verdict(r));
  std::fflush(out);
}

std::string JsonString(std::string_view s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      o += fmt::format("\\u{:04x}", static_cast<int>(c));
    } else {
      o += c;
    }
  }
  return o + "\"";
}

std::string JsonNumber(double v) {
  if (std::isnan(v) || std::isinf(v)) return "null";
  if (v == std::floor(v) && std::fabs(v) < 9e15)
    return fmt::format("{}", static_cast<int64_t>(v));
  return fmt::format("{:.6g}", v);
}

void PrintJson(const std::vector<Result>& results, const std::string& cpu,
               int cores, double load, const BenchOptions& o) {
  std::string s = "{\n";
  s += fmt::format(
      "  \"machine\": {{\"cpu\": {}, \"cores\": {}, \"load_avg_1m_at_start\": "
      "{}}},\n",
      JsonString(cpu), cores, JsonNumber(load));
  s += fmt::format("  \"options\": {{\"quick\": {}, \"size_mb\": {}}},\n",
                   o.quick ? "true" : "false", o.size_mb);
  s += "  \"results\": [\n";
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    s += fmt::format(
        "    {{\"name\": {}, \"value\": {}, \"unit\": {}, \"reference\": {}, "
        "\"ref_value\": {}, "
        "\"ratio\": {}, \"ratio_is\": {}, \"target\": {}, \"pass\": {}",
        JsonString(r.name), JsonNumber(r.value), JsonString(r.unit),
        JsonString(r.reference), JsonNumber(r.ref_value), JsonNumber(r.ratio),
        JsonString(r.ratio_note), JsonString(r.target),
        r.pass.has_value() ? (*r.pass ? "true" : "false") : "null");
    for (const auto& [k, v] : r.extra)
      s += fmt::format(", {}: {}", JsonString(k), JsonNumber(v));
    s += i + 1 < results.size() ? "},\n" : "}\n";
  }
  s += "  ]\n}\n";
  fmt::print(stdout, "{}", s);
}

// ---------------------------------------------------------------------------
// 1. serialize_64mib
// ---------------------------------------------------------------------------

absl::Status RunSerialize(const BenchOptions& o, std::vector<Result>* results) {
  constexpr size_t kBytes = 64 * kMiB;
  const int reps = o.reps ? o.reps : (o.quick ? 5 : 21);
  ASSIGN_OR_RETURN(PrefaultedBuffer src, PrefaultedBuffer::Create(kBytes));
  ASSIGN_OR_RETURN(PrefaultedBuffer dst,
                   PrefaultedBuffer::Create(kBytes + kMiB));
  FillPattern(src.data(), kBytes, 1);

  TensorView view;
  view.dtype = DType::kFloat32;
  view.sizes = {4096, 4096};  // 64 MiB of float32
  view.data = src.data();
  std::string scratch;

  // Check once (untimed) that FinishInto produces the archive segments()
  // describes, and that the payload is there, byte for byte.
  {
    ZipArchiveBuilder a, b;
    AddTensorRecords(view, &a, &scratch);
    AddTensorRecords(view, &b, &scratch);
    if (a.size() > dst.size())
      return absl::InternalError("archive larger than expected");
    a.FinishInto(dst.data());
    b.Finish();
    uint64_t pos = 0;
    bool payload_seen = false;
    for (std::string_view seg : b.segments()) {
      if (pos + seg.size() > a.size() ||
          std::memcmp(dst.data() + pos, seg.data(), seg.size())) {
        return absl::InternalError(fmt::format(
            "serialize: FinishInto output differs from segments() at offset {}",
            pos));
      }
      payload_seen = payload_seen || seg.data() == src.data();
      pos += seg.size();
    }
    if (pos != a.size() || !payload_seen) {
      return absl::InternalError(
          "serialize: segments() do not cover the archive / payload");
    }
  }

  auto time_memcpy = [&] {
    const auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), kBytes);
    ClobberMemory(dst.data());
    return SecondsSince(t0);
  };
  uint64_t archive_size = 0;
  auto time_serialize = [&] {
    const auto t0 = Clock::now();
    {
      ZipArchiveBuilder builder;
      AddTensorRecords(view, &builder, &scratch);
      builder.FinishInto(dst.data());
      archive_size = builder.size();
    }
    ClobberMemory(dst.data());
    return SecondsSince(t0);
  };
  auto time_segments = [&] {
    const auto t0 = Clock::now();
    size_t n = 0;
    {
      ZipArchiveBuilder builder;
      AddTensorRecords(view, &builder, &scratch);
      builder.Finish();
      for (std::string_view s : builder.segments()) n += s.size();
    }
    ClobberMemory(&n);
    return SecondsSince(t0);
  };
  // Warm-up (caches, branch predictors, the CRC tables).
  for (int i = 0; i < 2; ++i) {
    time_memcpy();
    time_serialize();
    time_segments();
  }
  std::vector<double> t_memcpy, t_ser, t_seg;
  for (int i = 0; i < reps; ++i) {
    t_memcpy.push_back(time_memcpy());
    t_ser.push_back(time_serialize());
    t_seg.push_back(time_segments());
  }
  const double memcpy_gbs = kBytes / Median(t_memcpy) / kGB;
  const double ser_gbs = kBytes / Median(t_ser) / kGB;
  const double seg_gbs = kBytes / Median(t_seg) / kGB;

  Result r;
  r.name = "serialize_64mib";
  r.value = ser_gbs;
  r.unit = "GB/s";
  r.figure =
      fmt::format("{:.2f} GB/s (FinishInto, median of {})", ser_gbs, reps);
  r.ref_value = memcpy_gbs;
  r.reference = fmt::format("memcpy {:.2f} GB/s", memcpy_gbs);
  r.ratio = ser_gbs / memcpy_gbs;
  r.ratio_note = "serialize GB/s / memcpy GB/s";
  r.target = "ratio >= 0.50";
  r.pass = r.ratio >= 0.5;
  r.extra = {{"payload_bytes", double{kBytes}},
             {"archive_bytes", static_cast<double>(archive_size)},
             {"serialize_s_median", Median(t_ser)},
             {"memcpy_s_median", Median(t_memcpy)},
             {"serialize_gbs_min",
              kBytes / *std::max_element(t_ser.begin(), t_ser.end()) / kGB},
             {"serialize_gbs_max",
              kBytes / *std::min_element(t_ser.begin(), t_ser.end()) / kGB},
             {"reps", double(reps)}};
  results->push_back(r);
  PrintLine(r, o.json);

  Result s;
  s.name = "serialize_64mib/segments";
  s.value = seg_gbs;
  s.unit = "GB/s";
  s.figure = fmt::format("{:.2f} GB/s (Finish: CRC only, zero-copy)", seg_gbs);
  s.ref_value = memcpy_gbs;
  s.reference = fmt::format("memcpy {:.2f} GB/s", memcpy_gbs);
  s.ratio = seg_gbs / memcpy_gbs;
  s.ratio_note = "Finish (CRC-only) GB/s / memcpy GB/s";
  s.extra = {{"segments_s_median", Median(t_seg)}, {"reps", double(reps)}};
  results->push_back(s);
  PrintLine(s, o.json);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// 2. plan_metadata_RxT
// ---------------------------------------------------------------------------

struct ModelTensor {
  std::string fqn;
  int64_t k;  // rows per rank: the global shape is [ranks * k, d]
  int64_t d;
  DType dtype;
};

// A transformer-like mix: embedding and head, then per layer attention
// projections, MLP (11008-wide) and two norms (kept in float32, like mixed-
// precision FSDP keeps them); everything else bf16. Every tensor has shape
// [ranks * k, d] so that it shards evenly on dim 0 across all ranks.
std::vector<ModelTensor> MakeModel(int n_tensors) {
  struct Kind {
    const char* name;
    int64_t k, d;
    DType dtype;
  };
  static const Kind kLayer[] = {
      {"self_attn.q_proj.weight", 4, 4096, DType::kBFloat16},
      {"self_attn.k_proj.weight", 1, 4096, DType::kBFloat16},
      {"self_attn.v_proj.weight", 1, 4096, DType::kBFloat16},
      {"self_attn.o_proj.weight", 4, 4096, DType::kBFloat16},
      {"mlp.gate_proj.weight", 11, 4096, DType::kBFloat16},
      {"mlp.up_proj.weight", 11, 4096, DType::kBFloat16},
      {"mlp.down_proj.weight", 4, 11008, DType::kBFloat16},
      {"input_layernorm.weight", 1, 4, DType::kFloat32},
      {"post_attention_layernorm.weight", 1, 4, DType::kFloat32},
  };
  std::vector<ModelTensor> out;
  out.reserve(n_tensors);
  if (n_tensors > 0)
    out.push_back({"model.embed_tokens.weight", 32, 4096, DType::kBFloat16});
  for (int layer = 0; static_cast<int>(out.size()) + 1 < n_tensors; ++layer) {
    for (const Kind& k : kLayer) {
      if (static_cast<int>(out.size()) + 1 >= n_tensors) break;
      out.push_back({fmt::format("model.layers.{}.{}", layer, k.name), k.k, k.d,
                     k.dtype});
    }
  }
  if (n_tensors > 1)
    out.push_back({"lm_head.weight", 32, 4096, DType::kBFloat16});
  return out;
}

// Outside the clock: the per-rank ItemDescs, as FSDP ranks would hand them in.
std::vector<std::vector<ItemDesc>> MakePlanInput(
    int n_ranks, const std::vector<ModelTensor>& model) {
  std::vector<std::vector<ItemDesc>> ranks(n_ranks);
  for (int r = 0; r < n_ranks; ++r) {
    ranks[r].reserve(model.size());
    for (const ModelTensor& t : model) {
      ItemDesc it;
      it.fqn = t.fqn;
      it.type = ItemDesc::Type::kTensor;
      it.dtype = t.dtype;
      it.global_shape = {static_cast<int64_t>(n_ranks) * t.k, t.d};
      it.chunk_offsets = {static_cast<int64_t>(r) * t.k, 0};
      it.chunk_sizes = {t.k, t.d};
      ranks[r].push_back(std::move(it));
    }
  }
  return ranks;
}

// Outside the clock: storage_data as the writer would fill it — each rank's
// items in file order in __{r}_0.distcp, at increasing offsets, each as long
// as its payload plus a torch.save archive's ~1 KiB of headers.
void FillStorageData(const SavePlan& plan,
                     absl::Span<const std::vector<ItemDesc>> ranks,
                     Metadata* md) {
  auto& sd = md->storage_data;
  sd.clear();
  sd.reserve(plan.items.size());
  for (const PlannedFile& pf : plan.files) {
    uint64_t offset = 0;
    for (size_t p : pf.items) {
      const PlannedItem& pi = plan.items[p];
      const ItemDesc& it = ranks[pi.rank][pi.item_index];
      StorageInfo info;
      info.relative_path = pf.relative_path;
      info.offset = offset;
      info.length = it.DedupWeight() + 1088;
      offset += info.length;
      sd.emplace_back(it.Key(), std::move(info));
    }
  }
}

// Resident set size of the process now, in bytes. While RunPlanMetadata
// keeps freed memory in the heap (no trimming, no mmap), the growth across a
// call is a lower bound on the extra memory that call needed at its peak.
uint64_t CurrentRssBytes() {
  std::ifstream in("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

absl::Status RunPlanMetadata(const BenchOptions& o,
                             std::vector<Result>* results) {
  const int n_ranks = o.plan_ranks ? o.plan_ranks : (o.quick ? 100 : 1000);
  const int n_tensors =
      o.plan_tensors ? o.plan_tensors : (o.quick ? 200 : 2000);
  const int reps = o.reps ? o.reps : (o.quick ? 2 : 3);
  const std::string name =
      fmt::format("plan_metadata_{}x{}", n_ranks, n_tensors);
  const bool target_applies = n_ranks == 1000 && n_tensors == 2000;

  // Keep freed heap memory in the process (no trimming, no per-allocation
  // mmap) while this workload runs: the daemon is long-lived and its heap is
  // warm; with the defaults every round would re-fault hundreds of MiB at the
  // VM's first-touch speed. Restored (and the heap trimmed) at the end.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
  struct RestoreMalloc {
    ~RestoreMalloc() {
      mallopt(M_MMAP_MAX, 65536);             // glibc's default
      mallopt(M_TRIM_THRESHOLD, 128 * 1024);  // glibc's default
      malloc_trim(0);
    }
  } restore_malloc;

  const auto t_in = Clock::now();
  std::vector<ModelTensor> model = MakeModel(n_tensors);
  std::vector<std::vector<ItemDesc>> ranks = MakePlanInput(n_ranks, model);
  const double build_input_s = SecondsSince(t_in);
  const uint64_t n_chunks = static_cast<uint64_t>(n_ranks) * model.size();
  fmt::print(stderr, "  [{}] built {} ItemDescs in {:.2f} s (untimed)\n", name,
             n_chunks, build_input_s);

  struct Round {
    double plan_s = 0, encode_s = 0;
    double plan_cpu_s = 0, encode_cpu_s = 0;  // thread CPU time
    bool decoded = false;
    absl::Status decode_status;
    double decode_s = 0, decode_cpu_s = 0;
    uint64_t decode_rss_growth = 0;
    uint64_t bytes = 0;
  };
  auto round = [&](bool decode) -> absl::StatusOr<Round> {
    Round rd;
    double cpu0 = ThreadCpuSeconds();
    auto t0 = Clock::now();
    absl::StatusOr<SavePlan> plan = PlanSave(ranks);
    rd.plan_s = SecondsSince(t0);
    rd.plan_cpu_s = ThreadCpuSeconds() - cpu0;
    if (!plan.ok()) return Annotate(plan.status(), "PlanSave");
    if (plan->items.size() != n_chunks) {
      return absl::InternalError(fmt::format("PlanSave kept {} of {} items",
                                             plan->items.size(), n_chunks));
    }
    FillStorageData(*plan, ranks, &plan->metadata);  // untimed
    cpu0 = ThreadCpuSeconds();
    t0 = Clock::now();
    absl::StatusOr<std::string> bytes = EncodeMetadata(plan->metadata);
    rd.encode_s = SecondsSince(t0);
    rd.encode_cpu_s = ThreadCpuSeconds() - cpu0;
    if (!bytes.ok()) return Annotate(bytes.status(), "EncodeMetadata");
    rd.bytes = bytes->size();
    if (!decode) return rd;
    // Informational: what a reader pays for this .metadata. Uses the
    // default DecodeOptions, as CheckpointReader::Open does.
    plan = absl::UnknownError("released");  // free the plan first
    rd.decoded = true;
    const uint64_t rss0 = CurrentRssBytes();
    cpu0 = ThreadCpuSeconds();
    t0 = Clock::now();
    absl::StatusOr<Metadata> md = DecodeMetadata(*bytes);
    rd.decode_s = SecondsSince(t0);
    rd.decode_cpu_s = ThreadCpuSeconds() - cpu0;
    const uint64_t rss1 = CurrentRssBytes();
    rd.decode_rss_growth = rss1 > rss0 ? rss1 - rss0 : 0;
    if (!md.ok()) {
      rd.decode_status = md.status();
    } else if (md->storage_data.size() != n_chunks ||
               md->state_dict_metadata.size() != model.size()) {
      rd.decode_status = absl::InternalError(fmt::format(
          "DecodeMetadata: {} storage entries / {} tensors, expected {} / {}",
          md->storage_data.size(), md->state_dict_metadata.size(), n_chunks,
          model.size()));
    }
    return rd;
  };

  // Round 0 (cold heap: its allocations first-touch fresh pages) is reported
  // on its own line and not in the median. DecodeMetadata runs in round 0
  // and again in round 1 (warm heap) if it succeeded.
  ASSIGN_OR_RETURN(Round cold, round(/*decode=*/o.decode));
  std::vector<double> plan_s, encode_s, total_s, plan_cpu_s, encode_cpu_s;
  std::optional<Round> warm_decode;
  uint64_t bytes = cold.bytes;
  for (int i = 0; i < reps; ++i) {
    ASSIGN_OR_RETURN(Round rd, round(/*decode=*/o.decode && i == 0 &&
                                     cold.decode_status.ok()));
    plan_s.push_back(rd.plan_s);
    encode_s.push_back(rd.encode_s);
    total_s.push_back(rd.plan_s + rd.encode_s);
    plan_cpu_s.push_back(rd.plan_cpu_s);
    encode_cpu_s.push_back(rd.encode_cpu_s);
    if (rd.decoded) warm_decode = rd;
    bytes = rd.bytes;
  }
  const double total = Median(total_s);
  const double mib = static_cast<double>(bytes) / kMiB;
  const double per_chunk =
      static_cast<double>(bytes) / static_cast<double>(n_chunks);

  Result r;
  r.name = name;
  r.value = total;
  r.unit = "s";
  r.figure = fmt::format(
      "{:.2f} s = plan {:.2f} + encode {:.2f}; {:.1f} MiB, {:.0f} B/chunk",
      total, Median(plan_s), Median(encode_s), mib, per_chunk);
  r.reference = "budget 2.00 s";
  r.ref_value = 2.0;
  r.ratio = total / 2.0;
  r.ratio_note = "total / 2 s budget";
  r.target = "total < 2 s";
  if (target_applies) r.pass = total < 2.0;
  r.extra = {{"plan_s", Median(plan_s)},
             {"encode_s", Median(encode_s)},
             {"plan_thread_cpu_s", Median(plan_cpu_s)},
             {"encode_thread_cpu_s", Median(encode_cpu_s)},
             {"metadata_bytes", static_cast<double>(bytes)},
             {"bytes_per_chunk", per_chunk},
             {"chunks", static_cast<double>(n_chunks)},
             {"cold_heap_total_s", cold.plan_s + cold.encode_s},
             {"input_build_s", build_input_s},
             {"reps", double(reps)}};
  results->push_back(r);
  PrintLine(r, o.json);

  Result c;
  c.name = name + "/cold_heap";
  c.value = cold.plan_s + cold.encode_s;
  c.unit = "s";
  c.figure = fmt::format("{:.2f} s = plan {:.2f} + encode {:.2f} (first round)",
                         c.value, cold.plan_s, cold.encode_s);
  c.extra = {{"plan_s", cold.plan_s}, {"encode_s", cold.encode_s}};
  results->push_back(c);
  PrintLine(c, o.json);

  if (!o.decode) return absl::OkStatus();
  const Round& dr = warm_decode ? *warm_decode : cold;
  Result d;
  d.name = name + "/decode";
  d.unit = "s";
  const double rss_gib =
      static_cast<double>(cold.decode_rss_growth) / (1 << 30);
  if (dr.decode_status.ok()) {
    d.value = dr.decode_s;
    d.figure = fmt::format(
        "{:.2f} s DecodeMetadata ({:.0f} MB/s), RSS +{:.2f} GiB", d.value,
        static_cast<double>(bytes) / d.value / 1e6, rss_gib);
  } else {
    // Reported, not fatal: the other workloads still run. The exit status
    // does not change (decode has no target).
    d.value = std::nan("");
    d.figure = fmt::format("FAILED after {:.1f} s, RSS +{:.2f} GiB",
                           dr.decode_s, rss_gib);
    d.reference = std::string(dr.decode_status.ToString());
    fmt::print(stderr, "  [{}] DecodeMetadata failed: {}\n", name,
               std::string(dr.decode_status.ToString()));
  }
  d.extra = {
      {"decode_s", dr.decode_s},
      {"decode_thread_cpu_s", dr.decode_cpu_s},
      {"decode_ok", dr.decode_status.ok() ? 1.0 : 0.0},
      {"cold_heap_decode_s", cold.decode_s},
      {"decode_rss_growth_bytes", static_cast<double>(cold.decode_rss_growth)}};
  results->push_back(d);
  PrintLine(d, o.json);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Sharded checkpoint shared by reshard_read and durable_write
// ---------------------------------------------------------------------------

// n_tensors float32 tensors of [rows, cols], stored back to back in one
// pre-faulted buffer in C order; row-sharded on dim 0.
struct ShardedModel {
  int n_tensors = 16;
  int64_t rows = 0;
  int64_t cols = 4096;
  size_t tensor_bytes = 0;
  size_t total_bytes = 0;
  PrefaultedBuffer src;

  // Rows [lo, hi) of rank r out of n (torch.chunk-like, as even as possible).
  std::pair<int64_t, int64_t> Rows(int r, int n) const {
    return {rows * r / n, rows * (r + 1) / n};
  }
  size_t Offset(int t, int64_t row) const {
    return static_cast<size_t>(t) * tensor_bytes +
           static_cast<size_t>(row * cols) * 4;
  }
  std::string Fqn(int t) const {
    return fmt::format("layers.{}.mlp.weight", t);
  }

  std::vector<std::vector<WriteItem>> WriteItems(int n_ranks) const {
    std::vector<std::vector<WriteItem>> ranks(n_ranks);
    for (int r = 0; r < n_ranks; ++r) {
      for (int t = 0; t < n_tensors; ++t) {
        const auto [lo, hi] = Rows(r, n_ranks);
        WriteItem w;
        w.desc.fqn = Fqn(t);
        w.desc.dtype = DType::kFloat32;
        w.desc.global_shape = {rows, cols};
        w.desc.chunk_offsets = {lo, 0};
        w.desc.chunk_sizes = {hi - lo, cols};
        w.tensor.dtype = DType::kFloat32;
        w.tensor.sizes = {hi - lo, cols};
        w.tensor.data = src.data() + Offset(t, lo);
        ranks[r].push_back(std::move(w));
      }
    }
    return ranks;
  }
};

absl::StatusOr<std::unique_ptr<ShardedModel>> MakeShardedModel(
    uint64_t size_mb) {
  auto m = std::make_unique<ShardedModel>();
  const uint64_t row_bytes = static_cast<uint64_t>(m->cols) * 4;
  m->rows = std::max<int64_t>(
      12, static_cast<int64_t>(size_mb * kMiB / m->n_tensors / row_bytes));
  m->tensor_bytes = static_cast<size_t>(m->rows) * row_bytes;
  m->total_bytes = m->tensor_bytes * m->n_tensors;
  ASSIGN_OR_RETURN(m->src, PrefaultedBuffer::Create(m->total_bytes));
  FillPattern(m->src.data(), m->total_bytes, 7);
  return m;
}

// Pages of `path` resident in the page cache, as a fraction (mincore).
absl::StatusOr<double> ResidentFraction(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, "open " + path);
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_size == 0) {
    ::close(fd);
    return 0.0;
  }
  void* p = ::mmap(nullptr, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return absl::ErrnoToStatus(errno, "mmap " + path);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t n = (static_cast<size_t>(st.st_size) + page - 1) / page;
  std::vector<unsigned char> vec(n);
  const int rc = ::mincore(p, st.st_size, vec.data());
  const int err = errno;
  ::munmap(p, st.st_size);
  if (rc != 0) return absl::ErrnoToStatus(err, "mincore " + path);
  size_t resident = 0;
  for (unsigned char v : vec) resident += v & 1;
  return static_cast<double>(resident) / static_cast<double>(n);
}

// fdatasync (no-op for clean files) then POSIX_FADV_DONTNEED; returns the
// largest fraction of any file still resident afterwards.
absl::StatusOr<double> DropFromPageCache(
    const std::vector<std::string>& files) {
  double worst = 0;
  for (const std::string& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return absl::ErrnoToStatus(errno, "open " + f);
    ::fdatasync(fd);
    const int rc = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
    if (rc != 0) return absl::ErrnoToStatus(rc, "posix_fadvise " + f);
    ASSIGN_OR_RETURN(double res, ResidentFraction(f));
    worst = std::max(worst, res);
  }
  return worst;
}

// The raw reference: each file read front to back with pread in 4 MiB
// blocks into `dst` (pre-faulted, at least the files' total size).
absl::StatusOr<uint64_t> RawRead(const std::vector<std::string>& files,
                                 char* dst, size_t cap) {
  uint64_t total = 0;
  for (const std::string& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return absl::ErrnoToStatus(errno, "open " + f);
    for (off_t off = 0;;) {
      const size_t want = std::min(kRawBlock, cap - total);
      if (want == 0) {
        ::close(fd);
        return absl::InternalError("raw read buffer too small");
      }
      const ssize_t n = ::pread(fd, dst + total, want, off);
      if (n < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
        ::close(fd);
        return absl::ErrnoToStatus(err, "pread " + f);
      }
      if (n == 0) break;
      off += n;
      total += static_cast<uint64_t>(n);
    }
    ::close(fd);
  }
  ClobberMemory(dst);
  return total;
}

// ---------------------------------------------------------------------------
// 3. reshard_read
// ---------------------------------------------------------------------------

absl::Status RunReshardRead(const BenchOptions& o, ShardedModel& m,
                            const std::string& base,
                            std::vector<Result>* results) {
  constexpr int kSaveRanks = 4, kLoadRanks = 3;
  const int reps = o.reps ? o.reps : (o.quick ? 2 : 3);
  const int cold_reps = o.reps ? o.reps : (o.quick ? 1 : 2);
  Env* env = Env::Default();
  const std::string dir = JoinPath(base, "reshard_read");

  // Setup (untimed): a durable 4-rank checkpoint.
  const std::vector<std::vector<WriteItem>> save = m.WriteItems(kSaveRanks);
  CheckpointWriterOptions wopts;
  wopts.sync = true;
  ASSIGN_OR_RETURN(WriteResult written, WriteCheckpoint(dir, save, wopts));
  ASSIGN_OR_RETURN(std::vector<std::string> files, DataFiles(env, dir));
  if (files.size() != written.files) {
    return absl::InternalError(fmt::format(
        "{} .distcp files, writer reported {}", files.size(), written.files));
  }

  ASSIGN_OR_RETURN(PrefaultedBuffer dst,
                   PrefaultedBuffer::Create(m.total_bytes));
  ASSIGN_OR_RETURN(PrefaultedBuffer raw,
                   PrefaultedBuffer::Create(written.data_bytes + kRawBlock));

  // The load: each of 3 ranks opens the checkpoint and reads its rows of
  // every tensor into its part of `dst` (laid out like `src`, so the whole
  // result can be compared with one memcmp).
  std::vector<std::vector<TensorRequest>> loads(kLoadRanks);
  for (int q = 0; q < kLoadRanks; ++q) {
    for (int t = 0; t < m.n_tensors; ++t) {
      const auto [lo, hi] = m.Rows(q, kLoadRanks);
      TensorRequest req;
      req.fqn = m.Fqn(t);
      req.offsets = {lo, 0};
      req.dest.dtype = DType::kFloat32;
      req.dest.sizes = {hi - lo, m.cols};
      req.dest.data = dst.data() + m.Offset(t, lo);
      loads[q].push_back(std::move(req));
    }
  }
  ReadStats stats;
  auto time_reshard = [&]() -> absl::StatusOr<double> {
    std::memset(dst.data(), 0,
                dst.size());  // untimed poison: the check below is real
    stats = ReadStats{};
    const auto t0 = Clock::now();
    for (int q = 0; q < kLoadRanks; ++q) {
      ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(dir));
      RETURN_IF_ERROR(reader->ReadTensors(loads[q], &stats));
    }
    const double s = SecondsSince(t0);
    if (std::memcmp(dst.data(), m.src.data(), m.total_bytes) != 0) {
      return absl::DataLossError(
          "reshard_read: data read back differs from the data saved");
    }
    return s;
  };
  uint64_t raw_bytes = 0;
  auto time_raw = [&]() -> absl::StatusOr<double> {
    const auto t0 = Clock::now();
    ASSIGN_OR_RETURN(raw_bytes, RawRead(files, raw.data(), raw.size()));
    return SecondsSince(t0);
  };

  // Warm: one untimed pass over every file first, so both sides read from
  // the page cache.
  RETURN_IF_ERROR(time_raw().status());
  RETURN_IF_ERROR(time_reshard().status());
  std::vector<double> t_raw, t_res;
  for (int i = 0; i < reps; ++i) {
    ASSIGN_OR_RETURN(double a, time_raw());
    ASSIGN_OR_RETURN(double b, time_reshard());
    t_raw.push_back(a);
    t_res.push_back(b);
  }
  const double raw_gbs = raw_bytes / Median(t_raw) / kGB;
  const double res_gbs = m.total_bytes / Median(t_res) / kGB;
  Result r;
  r.name = "reshard_read";
  r.value = res_gbs;
  r.unit = "GB/s";
  r.figure = fmt::format("{:.2f} GB/s {}->{} ranks, {} MiB, warm cache",
                         res_gbs, kSaveRanks, kLoadRanks, m.total_bytes / kMiB);
  r.reference = fmt::format("pread 4MiB {:.2f} GB/s", raw_gbs);
  r.ref_value = raw_gbs;
  r.ratio = res_gbs / raw_gbs;
  r.ratio_note = "ReadTensors GB/s / raw pread GB/s";
  r.extra = {{"tensor_bytes", double(m.total_bytes)},
             {"file_bytes", double(raw_bytes)},
             {"read_calls", double(stats.read_calls)},
             {"bytes_read", double(stats.bytes_read)},
             {"reshard_s_median", Median(t_res)},
             {"raw_s_median", Median(t_raw)},
             {"reps", double(reps)}};
  results->push_back(r);
  PrintLine(r, o.json);

  // CRC-32 cost: the same reads with payload CRC checks (the default) and
  // without (verify_crc = false), interleaved, warm.
  // full_read: one reader loads every tensor whole (the sharding that saved
  // reads each chunk whole: CRC fused with the read). reshard_read: the 4->3
  // load above, whose partly read chunks are each streamed through CRC-32
  // once per reader.
  {
    std::vector<std::vector<TensorRequest>> full(1);
    for (int t = 0; t < m.n_tensors; ++t) {
      TensorRequest req;
      req.fqn = m.Fqn(t);
      req.offsets = {0, 0};
      req.dest.dtype = DType::kFloat32;
      req.dest.sizes = {m.rows, m.cols};
      req.dest.data = dst.data() + m.Offset(t, 0);
      full[0].push_back(std::move(req));
    }
    ReadStats crc_stats;
    // The threads ckptd.load reads with: min(8, CPUs).
    const int crc_threads =
        o.read_threads > 0 ? o.read_threads
                           : static_cast<int>(std::clamp<unsigned>(
                                 std::thread::hardware_concurrency(), 1, 8));
    auto time_reads =
        [&](const std::vector<std::vector<TensorRequest>>& per_reader,
            bool crc) -> absl::StatusOr<double> {
      std::memset(dst.data(), 0, dst.size());
      crc_stats = ReadStats{};
      CheckpointReaderOptions ropts;
      ropts.verify_crc = crc;
      ropts.threads = crc_threads;
      const auto t0 = Clock::now();
      for (const auto& reqs : per_reader) {
        ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(dir, ropts));
        RETURN_IF_ERROR(reader->ReadTensors(reqs, &crc_stats));
      }
      const double s = SecondsSince(t0);
      if (std::memcmp(dst.data(), m.src.data(), m.total_bytes) != 0) {
        return absl::DataLossError(
            "crc read: data read back differs from the data saved");
      }
      return s;
    };
    const int crc_reps = std::max(reps, o.quick ? 3 : 7);
    for (const auto& [name, per_reader] :
         {std::pair<std::string,
                    const std::vector<std::vector<TensorRequest>>*>{"full_read",
                                                                    &full},
          {"reshard_read", &loads}}) {
      RETURN_IF_ERROR(time_reads(*per_reader, true).status());
      RETURN_IF_ERROR(time_reads(*per_reader, false).status());
      std::vector<double> t_on, t_off;
      uint64_t crc_bytes = 0, crc_read = 0;
      for (int i = 0; i < crc_reps; ++i) {
        ASSIGN_OR_RETURN(double off, time_reads(*per_reader, false));
        ASSIGN_OR_RETURN(double on, time_reads(*per_reader, true));
        crc_bytes = crc_stats.crc_bytes;
        crc_read = crc_stats.bytes_read;
        t_off.push_back(off);
        t_on.push_back(on);
      }
      const double on_gbs = m.total_bytes / Median(t_on) / kGB;
      const double off_gbs = m.total_bytes / Median(t_off) / kGB;
      Result c;
      c.name = name + "/crc";
      c.value = on_gbs;
      c.unit = "GB/s";
      c.figure = fmt::format(
          "{:.2f} GB/s with CRC-32 ({} reader{} x {} threads, {} MiB, warm)",
          on_gbs, per_reader->size(), per_reader->size() == 1 ? "" : "s",
          crc_threads, m.total_bytes / kMiB);
      c.reference = fmt::format("verify_crc=false {:.2f} GB/s", off_gbs);
      c.ref_value = off_gbs;
      c.ratio = on_gbs / off_gbs;
      c.ratio_note =
          "read GB/s with CRC / without, same run (target >= 0.95 for "
          "full_read)";
      c.extra = {{"crc_bytes", double(crc_bytes)},
                 {"bytes_read_with_crc", double(crc_read)},
                 {"crc_s_median", Median(t_on)},
                 {"nocrc_s_median", Median(t_off)},
                 {"reps", double(crc_reps)}};
      results->push_back(c);
      PrintLine(c, o.json);
    }
  }

  if (o.cold) {
    std::vector<double> c_raw, c_res;
    double worst_resident = 0;
    for (int i = 0; i < cold_reps; ++i) {
      ASSIGN_OR_RETURN(double res0, DropFromPageCache(files));
      ASSIGN_OR_RETURN(double a, time_raw());
      ASSIGN_OR_RETURN(double res1, DropFromPageCache(files));
      ASSIGN_OR_RETURN(double b, time_reshard());
      worst_resident = std::max({worst_resident, res0, res1});
      c_raw.push_back(a);
      c_res.push_back(b);
    }
    const double craw = raw_bytes / Median(c_raw) / kGB;
    const double cres = m.total_bytes / Median(c_res) / kGB;
    Result c;
    c.name = "reshard_read/cold";
    c.value = cres;
    c.unit = "GB/s";
    c.figure =
        fmt::format("{:.2f} GB/s, cold (fdatasync+FADV_DONTNEED, {:.0f}% left)",
                    cres, 100 * worst_resident);
    c.reference = fmt::format("pread 4MiB {:.2f} GB/s", craw);
    c.ref_value = craw;
    c.ratio = cres / craw;
    c.ratio_note = "ReadTensors GB/s / raw pread GB/s, both cold";
    c.extra = {{"resident_fraction_after_drop", worst_resident},
               {"reps", double(cold_reps)}};
    results->push_back(c);
    PrintLine(c, o.json);
  }
  return EmptyDir(env, dir);
}

// ---------------------------------------------------------------------------
// 4. durable_write
// ---------------------------------------------------------------------------

// The raw reference: `n_files` files of bytes / n_files each (the last takes
// the remainder), written by `n_threads` threads (each takes the next file):
// pwrite in 4 MiB blocks from `src` (wrapping around it), fsync the file;
// then fsync the directory (the new entries), as a durable checkpoint must.
// Returns the seconds from the first open to the directory fsync.
absl::StatusOr<double> RawDurableWrite(const std::string& dir, const char* src,
                                       size_t src_size, uint64_t bytes,
                                       int n_files, int n_threads) {
  std::vector<std::string> paths;
  for (int f = 0; f < n_files; ++f)
    paths.push_back(JoinPath(dir, fmt::format("raw_{}.bin", f)));
  std::atomic<int> next{0};
  absl::Mutex mu;
  absl::Status first_error;
  auto write_file = [&](int f) -> absl::Status {
    const uint64_t share = bytes / n_files;
    const uint64_t len =
        f + 1 == n_files ? bytes - share * (n_files - 1) : share;
    const std::string& path = paths[f];
    const int fd =
        ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return absl::ErrnoToStatus(errno, "open " + path);
    uint64_t done = 0;
    while (done < len) {
      const size_t at = static_cast<size_t>((share * f + done) % src_size);
      const size_t n =
          std::min<uint64_t>({kRawBlock, len - done, src_size - at});
      const ssize_t w = ::pwrite(fd, src + at, n, static_cast<off_t>(done));
      if (w < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
        ::close(fd);
        return absl::ErrnoToStatus(err, "pwrite " + path);
      }
      done += static_cast<uint64_t>(w);
    }
    if (::fsync(fd) != 0) {
      const int err = errno;
      ::close(fd);
      return absl::ErrnoToStatus(err, "fsync " + path);
    }
    if (::close(fd) != 0) return absl::ErrnoToStatus(errno, "close " + path);
    return absl::OkStatus();
  };
  auto worker = [&] {
    for (int f; (f = next.fetch_add(1)) < n_files;) {
      absl::Status s = write_file(f);
      if (!s.ok()) {
        absl::MutexLock l(&mu);
        if (first_error.ok()) first_error = s;
        return;
      }
    }
  };
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int t = 1; t < n_threads; ++t) threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads) t.join();
  RETURN_IF_ERROR(first_error);
  RETURN_IF_ERROR(Env::Default()->SyncDir(dir));
  const double s = SecondsSince(t0);
  for (const std::string& p : paths)
    RETURN_IF_ERROR(Env::Default()->RemoveFile(p));
  return s;
}

absl::Status RunDurableWrite(const BenchOptions& o, ShardedModel& m,
                             const std::string& base,
                             std::vector<Result>* results) {
  constexpr int kRanks = 4;
  const int reps = o.reps ? o.reps : (o.quick ? 2 : 3);
  Env* env = Env::Default();
  const std::string dir = JoinPath(base, "durable_write");
  RETURN_IF_ERROR(env->CreateDirs(dir));
  const std::vector<std::vector<WriteItem>> items = m.WriteItems(kRanks);
  CheckpointWriterOptions wopts;
  wopts.sync = true;

  uint64_t bytes = 0;
  WriteResult last;
  auto time_write = [&]() -> absl::StatusOr<double> {
    const auto t0 = Clock::now();
    ASSIGN_OR_RETURN(last, WriteCheckpoint(dir, items, wopts));
    const double s = SecondsSince(t0);
    bytes = last.data_bytes + last.metadata_bytes;
    RETURN_IF_ERROR(EmptyDir(env, dir));  // untimed
    return s;
  };
  // Interleaved: checkpoint, raw single stream (the reference), raw with the
  // writer's parallelism (as many files, io_threads threads).
  std::vector<double> t_ckpt, t_raw, t_par;
  for (int i = 0; i < reps; ++i) {
    ASSIGN_OR_RETURN(double a, time_write());
    ASSIGN_OR_RETURN(double b, RawDurableWrite(dir, m.src.data(), m.src.size(),
                                               bytes, 1, 1));
    ASSIGN_OR_RETURN(
        double c,
        RawDurableWrite(dir, m.src.data(), m.src.size(), bytes,
                        static_cast<int>(last.files), wopts.io_threads));
    t_ckpt.push_back(a);
    t_raw.push_back(b);
    t_par.push_back(c);
  }
  const double ckpt_gbs = bytes / Median(t_ckpt) / kGB;
  const double raw_gbs = bytes / Median(t_raw) / kGB;
  const double par_gbs = bytes / Median(t_par) / kGB;
  Result r;
  r.name = "durable_write";
  r.value = ckpt_gbs;
  r.unit = "GB/s";
  r.figure = fmt::format("{:.2f} GB/s WriteCheckpoint, {} ranks, {} MiB, fsync",
                         ckpt_gbs, kRanks, bytes / kMiB);
  r.reference = fmt::format("pwrite 4MiB+fsync {:.2f} GB/s", raw_gbs);
  r.ref_value = raw_gbs;
  r.ratio = ckpt_gbs / raw_gbs;
  r.ratio_note =
      "WriteCheckpoint GB/s / raw pwrite+fsync GB/s (one file, one thread)";
  r.extra = {
      {"bytes", double(bytes)},
      {"files", double(last.files)},
      {"io_threads", double(wopts.io_threads)},
      {"checkpoint_s_median", Median(t_ckpt)},
      {"raw_s_median", Median(t_raw)},
      {"checkpoint_s_min", *std::min_element(t_ckpt.begin(), t_ckpt.end())},
      {"checkpoint_s_max", *std::max_element(t_ckpt.begin(), t_ckpt.end())},
      {"raw_s_min", *std::min_element(t_raw.begin(), t_raw.end())},
      {"raw_s_max", *std::max_element(t_raw.begin(), t_raw.end())},
      {"reps", double(reps)}};
  results->push_back(r);
  PrintLine(r, o.json);

  Result p;
  p.name = "durable_write/vs_parallel_raw";
  p.value = ckpt_gbs;
  p.unit = "GB/s";
  p.figure = fmt::format("{:.2f} GB/s WriteCheckpoint (same run)", ckpt_gbs);
  p.reference = fmt::format("{} files/{} thr raw {:.2f} GB/s", last.files,
                            wopts.io_threads, par_gbs);
  p.ref_value = par_gbs;
  p.ratio = ckpt_gbs / par_gbs;
  p.ratio_note =
      "WriteCheckpoint GB/s / raw GB/s with the writer's files and threads";
  p.extra = {{"raw_parallel_s_median", Median(t_par)}, {"reps", double(reps)}};
  results->push_back(p);
  PrintLine(p, o.json);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// main
// ---------------------------------------------------------------------------

int Main(int argc, char** argv) {
  std::string error;
  std::optional<BenchOptions> parsed = ParseArgs(argc, argv, &error);
  if (!parsed) {
    if (!error.empty()) fmt::print(stderr, "format_bench: {}\n", error);
    fmt::print(stderr, "{}", kUsage);
    return error.empty() ? 0 : 2;
  }
  const BenchOptions& o = *parsed;

  static const char* const kAll[] = {"serialize_64mib", "plan_metadata",
                                     "reshard_read", "durable_write"};
  std::vector<std::string> selected;
  if (o.workloads.empty()) {
    selected.assign(std::begin(kAll), std::end(kAll));
  } else {
    for (const std::string& w : o.workloads) {
      const char* match = nullptr;
      for (const char* k : kAll) {
        const std::string_view ks = k;
        // Accept a name, its prefix before the size ("serialize"), or the
        // sized form ("plan_metadata_1000x2000").
        if (w == ks || ks.rfind(w + "_", 0) == 0 ||
            w.rfind(std::string(ks) + "_", 0) == 0) {
          match = k;
        }
      }
      if (match == nullptr) {
        fmt::print(stderr, "format_bench: unknown workload '{}'\n{}", w,
                   kUsage);
        return 2;
      }
      if (std::find(selected.begin(), selected.end(), match) ==
          selected.end()) {
        selected.emplace_back(match);
      }
    }
  }

  const std::string cpu = ReadCpuModel();
  const int cores = static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  const double load = LoadAverage1();
  struct utsname un;
  const std::string kernel = ::uname(&un) == 0 ? un.release : "?";
  std::FILE* info = o.json ? stderr : stdout;
  fmt::print(info,
             "format_bench: {} ({} cores), kernel {}, load avg {:.2f}{}\n", cpu,
             cores, kernel, load, o.quick ? ", --quick" : "");
  fmt::print(
      info,
      "  all buffers pre-faulted (mmap MAP_POPULATE + memset) before timing; "
      "GB/s = 1e9 B/s; medians of interleaved repetitions\n");
  std::fflush(info);
  if (load > 1.5) {
    fmt::print(stderr,
               "  warning: load average {:.2f} > 1.5: figures will be noisy\n",
               load);
  }

  std::vector<Result> results;
  std::unique_ptr<ShardedModel> model;  // shared by the two I/O workloads
  TempDir tmp;
  absl::Status status;
  for (const std::string& w : selected) {
    if (w == "serialize_64mib") {
      status = RunSerialize(o, &results);
    } else if (w == "plan_metadata") {
      status = RunPlanMetadata(o, &results);
    } else {
      if (tmp.path().empty()) {
        absl::StatusOr<TempDir> t = TempDir::Create(o.dir_base);
        if (!t.ok()) {
          status = t.status();
          break;
        }
        tmp = std::move(*t);
      }
      if (model == nullptr) {
        absl::StatusOr<std::unique_ptr<ShardedModel>> m =
            MakeShardedModel(o.size_mb);
        if (!m.ok()) {
          status = m.status();
          break;
        }
        model = std::move(*m);
      }
      status = w == "reshard_read"
                   ? RunReshardRead(o, *model, tmp.path(), &results)
                   : RunDurableWrite(o, *model, tmp.path(), &results);
    }
    if (!status.ok()) break;
  }
  if (!status.ok()) {
    fmt::print(stderr, "format_bench: {}\n", std::string(status.ToString()));
    return 2;
  }
  if (o.json) PrintJson(results, cpu, cores, load, o);
  bool all_pass = true;
  for (const Result& r : results) all_pass = all_pass && r.pass.value_or(true);
  return all_pass ? 0 : 1;
}

}  // namespace
}  // namespace ckptd::format

int main(int argc, char** argv) { return ckptd::format::Main(argc, argv); }
