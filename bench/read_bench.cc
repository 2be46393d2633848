// Copyright 2026 The ckptd Authors.
//
// read_bench: cold reads of a checkpoint, each figure beside its same-run
// reference, the page cache dropped before every timed read (sync +
// /proc/sys/vm/drop_caches when writable, i.e. as root; else fdatasync +
// POSIX_FADV_DONTNEED per file, said in the output):
//
//   reshard_cold   a checkpoint written by WriteCheckpoint for 4 ranks (16
//                  row-sharded fp32 tensors) read back resharded into 3
//                  ranks (one CheckpointReader per rank, --threads each,
//                  CRC-32 on) vs pread in 4 MiB blocks of the same .distcp
//                  files. Target >= 0.9.
//   full_cold      one reader loading every tensor whole vs the same pread.
//   .../crc        both again with verify_crc = false: what the CRC-32
//                  checks cost on a cold read (full_cold/crc target >= 0.95;
//                  a resharded read checks whole chunks, reading more).
//   stock_cold     with --stock-cmd: stock dcp.load of every tensor whole
//                  (bench/stock_load.py in a torch 2.x root, its own cold
//                  read) vs full_cold's reader. Target >= 1.0 (ckptd GB/s /
//                  stock GB/s).
//
//   build/bin/read_bench [--size-mb=1024] [--reps=3] [--threads=N]
//       [--dir=/tmp] [--stock-cmd='bash scripts/torch2_chroot.sh run
//        python3 bench/stock_load.py']
//
// Reads go into pre-faulted buffers; every read is checked against the data
// written. Figures are medians of interleaved repetitions with their range.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/absl_fmt.h"
#include "common/env.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "format/checkpoint/checkpoint_reader.h"
#include "format/checkpoint/checkpoint_writer.h"

namespace ckptd::format {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kRawBlock = 4 * kMiB;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string Range(const std::vector<double>& v) {
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return fmt::format("[{:.2f}–{:.2f}]", *lo, *hi);
}

// A pre-faulted anonymous mapping.
class Buffer {
 public:
  explicit Buffer(size_t n) : size_(n) {
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<char*>(p);
    if (data_ != nullptr) std::memset(data_, 0x5a, n);
  }
  ~Buffer() {
    if (data_ != nullptr) ::munmap(data_, size_);
  }
  char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  char* data_;
  size_t size_;
};

// Drops the page cache: every file of the system where we may (root),
// else the given files (fdatasync + FADV_DONTNEED). Returns which.
std::string DropCaches(const std::vector<std::string>& files) {
  ::sync();
  if (std::FILE* f = std::fopen("/proc/sys/vm/drop_caches", "w")) {
    const bool ok = std::fputs("3\n", f) >= 0;
    if (std::fclose(f) == 0 && ok) return "drop_caches";
  }
  for (const std::string& p : files) {
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  return "fadvise";
}

// pread in 4 MiB blocks of every file, front to back; with n_threads > 1
// the files are shared out among that many threads (each reads whole files,
// into its own part of dst).
absl::StatusOr<double> RawRead(const std::vector<std::string>& files, char* dst,
                               size_t cap, uint64_t* bytes, int n_threads = 1) {
  if (n_threads > 1) {
    std::vector<std::vector<std::string>> parts(n_threads);
    for (size_t i = 0; i < files.size(); ++i)
      parts[i % n_threads].push_back(files[i]);
    std::vector<absl::Status> status(n_threads);
    std::vector<uint64_t> got(n_threads, 0);
    const size_t share = cap / n_threads;
    const auto t0 = Clock::now();
    std::vector<std::thread> ts;
    for (int t = 0; t < n_threads; ++t) {
      ts.emplace_back([&, t] {
        auto r = RawRead(parts[t], dst + t * share, share, &got[t]);
        status[t] = r.status();
      });
    }
    for (auto& t : ts) t.join();
    const double s = Since(t0);
    *bytes = 0;
    for (int t = 0; t < n_threads; ++t) {
      RETURN_IF_ERROR(status[t]);
      *bytes += got[t];
    }
    return s;
  }
  const auto t0 = Clock::now();
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
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
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
  *bytes = total;
  return Since(t0);
}

struct Model {
  int tensors = 16;
  int64_t rows = 0, cols = 4096;
  size_t tensor_bytes = 0, total = 0;
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
};

std::vector<TensorRequest> Requests(const Model& m, char* dst, int q, int n) {
  std::vector<TensorRequest> out;
  for (int t = 0; t < m.tensors; ++t) {
    const auto [lo, hi] = m.Rows(q, n);
    TensorRequest req;
    req.fqn = m.Fqn(t);
    req.offsets = {lo, 0};
    req.dest.dtype = DType::kFloat32;
    req.dest.sizes = {hi - lo, m.cols};
    req.dest.data = dst + m.Offset(t, lo);
    out.push_back(std::move(req));
  }
  return out;
}

std::optional<double> JsonNumber(std::string_view j, std::string_view key) {
  const std::string k = fmt::format("\"{}\": ", key);
  const size_t at = j.find(k);
  if (at == std::string_view::npos) return std::nullopt;
  return std::strtod(std::string(j.substr(at + k.size(), 40)).c_str(), nullptr);
}

absl::StatusOr<double> Stock(const std::string& cmd, const std::string& dir,
                             uint64_t want_bytes) {
  const std::string full = fmt::format("{} '{}' 2>&1", cmd, dir);
  std::FILE* p = ::popen(full.c_str(), "r");
  if (p == nullptr) return absl::ErrnoToStatus(errno, "popen");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int rc = ::pclose(p);
  const size_t line = out.rfind("{\"seconds\"");
  if (rc != 0 || line == std::string::npos) {
    return absl::InternalError(
        fmt::format("`{}` failed ({}): {}", full, rc, out.substr(0, 3000)));
  }
  const std::string_view j = std::string_view(out).substr(line);
  if (JsonNumber(j, "tensor_bytes").value_or(0) !=
      static_cast<double>(want_bytes)) {
    return absl::InternalError("stock load read a different number of bytes: " +
                               std::string(j));
  }
  return JsonNumber(j, "seconds").value_or(0);
}

int Main(int argc, char** argv) {
  uint64_t size_mb = 1024;
  int reps = 3, threads = 0;
  std::string base = "/tmp", stock_cmd;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&](std::string_view flag) -> std::optional<std::string> {
      if (a.substr(0, flag.size()) == flag && a.size() > flag.size() &&
          a[flag.size()] == '=') {
        return std::string(a.substr(flag.size() + 1));
      }
      return std::nullopt;
    };
    if (auto v = value("--size-mb")) {
      size_mb = std::max<uint64_t>(16, std::strtoull(v->c_str(), nullptr, 10));
    } else if (auto v = value("--reps")) {
      reps = std::max(1, std::atoi(v->c_str()));
    } else if (auto v = value("--threads")) {
      threads = std::max(1, std::atoi(v->c_str()));
    } else if (auto v = value("--dir")) {
      base = *v;
    } else if (auto v = value("--stock-cmd")) {
      stock_cmd = *v;
    } else {
      fmt::print(stderr,
                 "usage: read_bench [--size-mb=N] [--reps=N] [--threads=N] "
                 "[--dir=PATH] [--stock-cmd=CMD]\n");
      return 2;
    }
  }
  if (threads == 0) {
    threads = static_cast<int>(
        std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 8));
  }
  Env* env = Env::Default();
  std::string dir = JoinPath(base, "ckptd_read_bench.XXXXXX");
  if (::mkdtemp(dir.data()) == nullptr) {
    fmt::print(stderr, "read_bench: mkdtemp {}: {}\n", dir,
               std::strerror(errno));
    return 2;
  }
  Model m;
  m.rows = std::max<int64_t>(12, size_mb * kMiB / m.tensors / (m.cols * 4));
  m.tensor_bytes = static_cast<size_t>(m.rows * m.cols) * 4;
  m.total = m.tensor_bytes * m.tensors;
  Buffer src(m.total), dst(m.total), raw(m.total + 64 * kMiB);
  if (src.data() == nullptr || dst.data() == nullptr || raw.data() == nullptr) {
    fmt::print(stderr, "read_bench: out of memory\n");
    return 2;
  }
  uint32_t x = 12345;
  for (size_t i = 0; i + 4 <= m.total; i += 4) {
    x = x * 1664525u + 1013904223u;
    std::memcpy(src.data() + i, &x, 4);
  }
  auto run = [&]() -> absl::Status {
    std::vector<std::vector<WriteItem>> save(4);
    for (int r = 0; r < 4; ++r) {
      for (int t = 0; t < m.tensors; ++t) {
        const auto [lo, hi] = m.Rows(r, 4);
        WriteItem w;
        w.desc.fqn = m.Fqn(t);
        w.desc.dtype = DType::kFloat32;
        w.desc.global_shape = {m.rows, m.cols};
        w.desc.chunk_offsets = {lo, 0};
        w.desc.chunk_sizes = {hi - lo, m.cols};
        w.tensor.dtype = DType::kFloat32;
        w.tensor.sizes = {hi - lo, m.cols};
        w.tensor.data = src.data() + m.Offset(t, lo);
        save[r].push_back(std::move(w));
      }
    }
    CheckpointWriterOptions wopts;
    wopts.sync = true;
    ASSIGN_OR_RETURN(WriteResult written, WriteCheckpoint(dir, save, wopts));
    std::vector<std::string> files;
    ASSIGN_OR_RETURN(std::vector<std::string> names, env->ListDir(dir));
    for (const std::string& n : names) {
      if (n.size() > 7 && n.compare(n.size() - 7, 7, ".distcp") == 0) {
        files.push_back(JoinPath(dir, n));
      }
    }
    std::sort(files.begin(), files.end());
    CheckpointReaderOptions ropts;
    ropts.threads = threads;
    auto load = [&](int n_readers, bool crc = true) -> absl::StatusOr<double> {
      std::memset(dst.data(), 0, dst.size());
      CheckpointReaderOptions o = ropts;
      o.verify_crc = crc;
      const auto t0 = Clock::now();
      for (int q = 0; q < n_readers; ++q) {
        ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(dir, o));
        RETURN_IF_ERROR(
            reader->ReadTensors(Requests(m, dst.data(), q, n_readers)));
      }
      const double s = Since(t0);
      if (std::memcmp(dst.data(), src.data(), m.total) != 0) {
        return absl::DataLossError(
            "data read back differs from the data saved");
      }
      return s;
    };
    std::string how;
    std::vector<double> t_raw, t_par, t_res, t_full, t_stock, t_res_nocrc,
        t_full_nocrc;
    uint64_t raw_bytes = 0;
    for (int i = 0; i < reps; ++i) {
      how = DropCaches(files);
      ASSIGN_OR_RETURN(double a,
                       RawRead(files, raw.data(), raw.size(), &raw_bytes));
      if (threads > 1) {
        DropCaches(files);
        uint64_t par_bytes = 0;
        ASSIGN_OR_RETURN(double p, RawRead(files, raw.data(), raw.size(),
                                           &par_bytes, threads));
        t_par.push_back(par_bytes / p / 1e9);
      }
      DropCaches(files);
      ASSIGN_OR_RETURN(double b, load(3));
      DropCaches(files);
      ASSIGN_OR_RETURN(double c, load(1));
      DropCaches(files);
      ASSIGN_OR_RETURN(double b0, load(3, /*crc=*/false));
      DropCaches(files);
      ASSIGN_OR_RETURN(double c0, load(1, /*crc=*/false));
      t_raw.push_back(raw_bytes / a / 1e9);
      t_res.push_back(m.total / b / 1e9);
      t_full.push_back(m.total / c / 1e9);
      t_res_nocrc.push_back(m.total / b0 / 1e9);
      t_full_nocrc.push_back(m.total / c0 / 1e9);
      if (!stock_cmd.empty()) {
        ASSIGN_OR_RETURN(double d, Stock(stock_cmd, dir, m.total));
        t_stock.push_back(m.total / d / 1e9);
      }
    }
    fmt::print(
        "read_bench: {} MiB of tensors in {} files ({} MiB), cold via {}, "
        "{} reader thread(s), CRC-32 on, median of {}\n",
        m.total / kMiB, files.size(), raw_bytes / kMiB, how, threads, reps);
    const double raw_gbs = Median(t_raw);
    auto line = [&](const char* name, const std::vector<double>& v,
                    const std::string& ref, double ref_gbs, const char* target,
                    double min_ratio) {
      std::vector<double> ratios;
      for (size_t i = 0; i < v.size(); ++i) {
        ratios.push_back(v[i] / (ref_gbs > 0 ? ref_gbs : 1));
      }
      const double r = Median(v) / ref_gbs;
      fmt::print(
          "{:<14} {:.2f} GB/s {} | ref {} {:.2f} GB/s | ratio {:.2f} | {}{}\n",
          name, Median(v), Range(v), ref, ref_gbs, r, target,
          min_ratio > 0 ? (r >= min_ratio ? " PASS" : " FAIL") : "");
    };
    line("reshard_cold", t_res, "pread 4MiB", raw_gbs, ">= 0.9", 0.9);
    line("full_cold", t_full, "pread 4MiB", raw_gbs, "info", 0);
    if (!t_par.empty()) {
      const std::string ref = fmt::format("pread x{} thr", threads);
      line("reshard_cold", t_res, ref, Median(t_par), "info (same threads)", 0);
      line("full_cold", t_full, ref, Median(t_par), "info (same threads)", 0);
    }
    // The cost of the CRC-32 checks on a cold read (the target: within 5 %):
    // the same loads with verify_crc = false.
    line("reshard_cold/crc", t_res, "verify_crc=false", Median(t_res_nocrc),
         "info", 0);
    line("full_cold/crc", t_full, "verify_crc=false", Median(t_full_nocrc),
         ">= 0.95", 0.95);
    if (!t_stock.empty()) {
      line("stock_cold", t_full, "stock dcp.load", Median(t_stock), ">= 1.0",
           1.0);
      fmt::print("  stock dcp.load {}: {:.2f} GB/s {}\n", stock_cmd,
                 Median(t_stock), Range(t_stock));
    }
    return absl::OkStatus();
  };
  absl::Status s = run();
  if (auto names = env->ListDir(dir); names.ok()) {
    for (const std::string& n : *names) (void)env->RemoveFile(JoinPath(dir, n));
  }
  ::rmdir(dir.c_str());
  if (!s.ok()) {
    fmt::print(stderr, "read_bench: {}\n", s);
    return 2;
  }
  return 0;
}

}  // namespace
}  // namespace ckptd::format

int main(int argc, char** argv) { return ckptd::format::Main(argc, argv); }
