// Copyright 2026 The ckptd Authors.
//
// WriteTimeoutEnv (write_timeout_env.h): each file's base calls run on a
// writer thread; callers wait for it with a deadline and abandon it if the
// storage does not answer.
#include "common/write_timeout_env.h"

#include <algorithm>
#include <cstring>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/absl_fmt.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace ckptd {
namespace {

constexpr size_t kMinBufferBytes = 4096;
constexpr size_t kMaxBufferBytes = size_t{1} << 30;

using Counters = WriteTimeoutEnv::Counters;

// A call handed to the writer thread.
struct Job {
  enum class Op { kNone, kWrite, kSync, kClose };
  Op op = Op::kNone;
  // kWrite: the caller's bytes, readable until the writer thread has copied
  // them (then nullptr: the caller may return), and their file offset.
  const char* source = nullptr;
  size_t length = 0;
  uint64_t offset = 0;
  absl::Time started;  // handed over at

  std::string Describe(const std::string& path) const {
    switch (op) {
      case Op::kWrite:
        return fmt::format("write of {} at offset {}", path, offset);
      case Op::kSync:
        return fmt::format("fsync of {}", path);
      case Op::kClose:
        return fmt::format("close of {}", path);
      case Op::kNone:
        break;
    }
    return path;
  }
};

// What a file and its writer thread share; the thread keeps it alive after
// the file is gone if it was abandoned.
struct Core {
  Core(std::unique_ptr<WritableFile> file, size_t buffer_bytes,
       std::shared_ptr<Counters> counters)
      : path(file->path()),
        counters(std::move(counters)),
        base(std::move(file)),
        buffer(new char[buffer_bytes]) {}

  // Constant after construction.
  const std::string path;
  const std::shared_ptr<Counters> counters;
  // Used by the writer thread only (and by nobody after it ends).
  const std::unique_ptr<WritableFile> base;
  // The writer thread's copy of a kWrite job's bytes: it copies them (on
  // its own core, so the write reads them from its cache) and writes from
  // here, never from the caller's memory.
  const std::unique_ptr<char[]> buffer;

  absl::Mutex mu;
  Job job ABSL_GUARDED_BY(mu);  // op != kNone: handed over, not finished
  absl::Status error ABSL_GUARDED_BY(mu);  // first error of a base call
  bool abandoned ABSL_GUARDED_BY(mu) = false;
  // The file's path as an operator knows it, taken when it was abandoned
  // (its directory may be removed before the late call returns, and a
  // descriptor-anchored path would then read "DIR (deleted)/NAME").
  std::string abandoned_display_path ABSL_GUARDED_BY(mu);
};

bool HasJob(Job* j) { return j->op != Job::Op::kNone; }
bool NoJob(Job* j) { return j->op == Job::Op::kNone; }
bool Copied(Job* j) { return j->source == nullptr; }

void WriterLoop(std::shared_ptr<Core> core) {
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&core->mu);
      core->mu.Await(absl::Condition(&HasJob, &core->job));
      job = core->job;
    }
    absl::Status s;
    switch (job.op) {
      case Job::Op::kWrite: {
        // The caller waits (for the copy only) while its bytes are read.
        std::memcpy(core->buffer.get(), job.source, job.length);
        {
          absl::MutexLock lock(&core->mu);
          core->job.source = nullptr;
        }
        s = core->base->Append(
            std::string_view(core->buffer.get(), job.length));
        break;
      }
      case Job::Op::kSync:
        s = core->base->Sync();
        break;
      case Job::Op::kClose:
      case Job::Op::kNone:
        s = core->base->Close();
        break;
    }
    bool abandoned;
    std::string display_path;
    {
      absl::MutexLock lock(&core->mu);
      if (core->error.ok() && !s.ok()) core->error = s;
      core->job = Job{};
      abandoned = core->abandoned;
      display_path = core->abandoned_display_path;
    }
    if (abandoned) {
      (void)core->base->Close();
      core->counters->stuck_threads.fetch_sub(1);
      spdlog::warn(
          "the {} that was given up on (write_timeout) returned {} after it "
          "started: {}; its writer thread ends",
          job.Describe(display_path),
          absl::FormatDuration(absl::Now() - job.started),
          s.ok() ? std::string("OK") : s.ToString());
      return;
    }
    if (job.op == Job::Op::kClose) return;
  }
}

class TimeoutWritableFile final : public WritableFile {
 public:
  TimeoutWritableFile(std::unique_ptr<WritableFile> base,
                      const WriteTimeoutEnvOptions& options,
                      std::shared_ptr<Counters> counters)
      : core_(std::make_shared<Core>(std::move(base), options.buffer_bytes,
                                     std::move(counters))),
        timeout_(options.write_timeout),
        buffer_bytes_(options.buffer_bytes),
        thread_(WriterLoop, core_) {}

  ~TimeoutWritableFile() override { (void)Close(); }

  absl::Status Append(std::string_view data) override {
    if (closed_) return ClosedError("append to");
    RETURN_IF_ERROR(status_);
    while (!data.empty()) {
      const size_t n = std::min(buffer_bytes_, data.size());
      RETURN_IF_ERROR(WaitForWriter());  // the previous job, bounded
      const Job job{Job::Op::kWrite, data.data(), n, size_, absl::Now()};
      absl::MutexLock lock(&core_->mu);
      core_->job = job;
      // Not bounded by write_timeout: the writer thread is idle (the wait
      // above) and only copies memory now; no storage call is involved.
      core_->mu.Await(absl::Condition(&Copied, &core_->job));
      size_ += n;
      data.remove_prefix(n);
    }
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    if (closed_) return ClosedError("sync of");
    RETURN_IF_ERROR(Call(Job::Op::kSync));
    return absl::OkStatus();
  }

  absl::Status Close() override {
    if (closed_) return status_;
    closed_ = true;
    // Closed even after an error of the base file (it releases the fd).
    (void)Call(Job::Op::kClose);
    if (abandoned_) {
      thread_.detach();
    } else {
      thread_.join();
    }
    return status_;
  }

  uint64_t Size() const override { return size_; }
  const std::string& path() const override { return core_->path; }

 private:
  absl::Status ClosedError(std::string_view what) const {
    if (!status_.ok()) return status_;
    return absl::FailedPreconditionError(
        fmt::format("{} closed file {}", what, core_->path));
  }

  // Runs kSync or kClose on the writer thread after its previous job.
  absl::Status Call(Job::Op op) {
    if (abandoned_) return status_;
    if (op != Job::Op::kClose) RETURN_IF_ERROR(status_);
    const absl::Status before = WaitForWriter();  // the last write
    if (abandoned_ || (op != Job::Op::kClose && !before.ok())) return status_;
    const Job job{op, nullptr, 0, 0, absl::Now()};
    {
      absl::MutexLock lock(&core_->mu);
      core_->job = job;
    }
    return WaitForWriter();
  }

  // Waits until the writer thread has no job, at most until write_timeout
  // after its job started; then gives up on it (abandoned_, status_).
  // Returns status_, which also takes the first error of a base call.
  absl::Status WaitForWriter() {
    if (abandoned_) return status_;
    absl::MutexLock lock(&core_->mu);
    if (core_->job.op != Job::Op::kNone) {
      const Job job = core_->job;
      const bool done = core_->mu.AwaitWithDeadline(
          absl::Condition(&NoJob, &core_->job), job.started + timeout_);
      if (!done) {
        // The job's bytes are the writer thread's own copy by now (a kWrite
        // is only handed over once copied), so nothing of the caller's is
        // left in use.
        core_->abandoned = true;
        core_->abandoned_display_path = DisplayPath(core_->path);
        abandoned_ = true;
        core_->counters->timeouts.fetch_add(1);
        core_->counters->stuck_threads.fetch_add(1);
        auto describe = [&](const std::string& path) {
          return fmt::format("{} made no progress for {} (write_timeout)",
                             job.Describe(path),
                             absl::FormatDuration(timeout_));
        };
        status_ = absl::DeadlineExceededError(describe(core_->path));
        spdlog::error(
            "{}; giving up on it: its writer thread is left blocked in the "
            "kernel with its own copy of the bytes and its file descriptor",
            describe(core_->abandoned_display_path));
        return status_;
      }
    }
    if (status_.ok() && !core_->error.ok()) status_ = core_->error;
    return status_;
  }

  const std::shared_ptr<Core> core_;
  const absl::Duration timeout_;
  const size_t buffer_bytes_;
  std::thread thread_;

  // The caller's side (one thread at a time).
  uint64_t size_ = 0;       // bytes appended (handed to the writer thread)
  absl::Status status_;     // first error seen by the caller: for ever
  bool abandoned_ = false;  // the writer thread was given up on
  bool closed_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<WriteTimeoutEnv>> WriteTimeoutEnv::Create(
    Env* base, const WriteTimeoutEnvOptions& options) {
  if (options.write_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        fmt::format("WriteTimeoutEnvOptions.write_timeout {} is not positive",
                    absl::FormatDuration(options.write_timeout)));
  }
  if (options.buffer_bytes < kMinBufferBytes ||
      options.buffer_bytes > kMaxBufferBytes) {
    return absl::InvalidArgumentError(
        fmt::format("WriteTimeoutEnvOptions.buffer_bytes {} is not in [{}, {}]",
                    options.buffer_bytes, kMinBufferBytes, kMaxBufferBytes));
  }
  return std::unique_ptr<WriteTimeoutEnv>(new WriteTimeoutEnv(base, options));
}

WriteTimeoutEnv::WriteTimeoutEnv(Env* base,
                                 const WriteTimeoutEnvOptions& options)
    : EnvWrapper(base),
      options_(options),
      counters_(std::make_shared<Counters>()) {}

absl::StatusOr<std::unique_ptr<WritableFile>> WriteTimeoutEnv::NewWritableFile(
    const std::string& path, const WritableFileOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file,
                   base()->NewWritableFile(path, options));
  return std::unique_ptr<WritableFile>(std::make_unique<TimeoutWritableFile>(
      std::move(file), options_, counters_));
}

WriteTimeoutEnvStats WriteTimeoutEnv::stats() const {
  WriteTimeoutEnvStats s;
  s.timeouts = counters_->timeouts.load();
  s.stuck_threads = counters_->stuck_threads.load();
  return s;
}

}  // namespace ckptd
