// Copyright 2026 The ckptd Authors.
//
// UringEnv implementation: the block pool (rules 1-3 of uring_env.h) and the
// io_uring WritableFile.
//
// Lock order: a file's mu_ before the pool's mu_. The one exception, a
// waiter taking an idle file's mu_ while holding the pool's, uses TryLock
// and so cannot wait in a cycle. A thread holds at most two file mutexes:
// the one of the file it is writing and the one of an idle file whose
// blocks it reclaims.
//
// Hung storage (write_timeout): a file whose writes or fsync make no
// progress for write_timeout gives up with DEADLINE_EXCEEDED and hands its
// ring, with the blocks the kernel still owns, to the pool as an orphan
// (AbandonLocked). The pool keeps those blocks out of circulation until
// their completions arrive (ReapOrphansLocked), so a late completion can
// never land in a reused buffer; if they never arrive, the pool's memory is
// never unmapped.
#include "common/uring_env.h"

#include <fcntl.h>
#include <liburing.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/absl_fmt.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CKPTD_URING_TSAN 1
#include <sanitizer/tsan_interface.h>
#endif
#endif

namespace ckptd {
namespace uring_internal {

// O_DIRECT alignment of buffers, offsets and lengths.
constexpr size_t kDirectAlign = 4096;
constexpr int kMaxQueueDepth = 1024;
constexpr size_t kMaxBlockBytes = size_t{1} << 30;

// liburing maps and unmaps a ring with raw syscalls that ThreadSanitizer
// does not see, so a ring mapped where an earlier one was inherits that
// ring's access history and TSan reports its own reuse as a race. In TSan
// builds every ring's teardown is ordered before every later ring's setup;
// elsewhere these are plain liburing calls.
#ifdef CKPTD_URING_TSAN
int g_ring_lifecycle;
#endif

int QueueInit(unsigned entries, io_uring* ring) {
  const int ret = ::io_uring_queue_init(entries, ring, 0);
#ifdef CKPTD_URING_TSAN
  __tsan_acquire(&g_ring_lifecycle);
#endif
  return ret;
}

void QueueExit(io_uring* ring) {
#ifdef CKPTD_URING_TSAN
  __tsan_release(&g_ring_lifecycle);
#endif
  ::io_uring_queue_exit(ring);
}

size_t RoundUp(size_t n, size_t align) {
  return (n + align - 1) / align * align;
}

__kernel_timespec KernelTimespec(absl::Duration d) {
  if (d < absl::ZeroDuration()) d = absl::ZeroDuration();
  const int64_t ns = absl::ToInt64Nanoseconds(d);
  return __kernel_timespec{ns / 1000000000, ns % 1000000000};
}

class UringWritableFile;

// ---------------------------------------------------------------------------
// BlockPool
// ---------------------------------------------------------------------------

// The pre-faulted block buffers of one UringEnv and the bookkeeping of rules
// 2 and 3 (uring_env.h). Thread-safe.
class BlockPool {
 public:
  // Takes ownership of the mmap'd region [mem, mem + num_blocks*block_bytes).
  BlockPool(char* mem, size_t block_bytes, size_t num_blocks)
      : mem_(mem), block_bytes_(block_bytes), num_blocks_(num_blocks) {
    free_.reserve(num_blocks);
    for (size_t i = num_blocks; i > 0; --i) {
      free_.push_back(mem + (i - 1) * block_bytes);
    }
  }

  // The ring of a file that gave up on hung storage, with the blocks its
  // unfinished requests still own (UringWritableFile::AbandonLocked).
  struct Orphan {
    Orphan() = default;
    Orphan(const Orphan&) = delete;
    Orphan& operator=(const Orphan&) = delete;
    ~Orphan() { QueueExit(&ring); }

    io_uring ring;
    std::string path;
    absl::Time since;
    // CQE user_data → the block its request owns (nullptr: the fsync).
    absl::flat_hash_map<uint64_t, char*> pending;
    size_t blocks = 0;  // non-null values of `pending`
  };

  // Crashes loudly if a file still holds blocks (it outlived its Env). Blocks
  // the kernel may still write from (orphans whose requests never completed)
  // are never unmapped: the mapping is left in place, and logged.
  ~BlockPool() {
    std::vector<std::unique_ptr<Orphan>> done;
    size_t orphaned = 0;
    {
      absl::MutexLock lock(&mu_);
      ReapOrphansLocked(&done);
      if (free_.size() + orphaned_blocks_ != num_blocks_ || !idle_.empty()) {
        std::fprintf(stderr,
                     "ckptd: UringEnv destroyed while its files hold %zu of "
                     "%zu blocks; destroy every WritableFile first\n",
                     num_blocks_ - free_.size() - orphaned_blocks_,
                     num_blocks_);
        std::abort();
      }
      orphaned = orphaned_blocks_;
      for (auto& o : orphans_) done.push_back(std::move(o));
      orphans_.clear();
    }
    if (orphaned > 0) {
      spdlog::error(
          "io_uring: {} of {} write buffers are still owned by the kernel "
          "(writes abandoned on hung storage); the buffer pool stays mapped",
          orphaned, num_blocks_);
      return;  // `done` exits the rings; the memory stays mapped
    }
    done.clear();
    ::munmap(mem_, num_blocks_ * block_bytes_);
  }

  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  size_t block_bytes() const { return block_bytes_; }

  // Rule 2: a free block if taking it leaves one for every waiter, else
  // nullptr.
  char* TryTake() ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<std::unique_ptr<Orphan>> done;  // rings exited after unlock
    absl::MutexLock lock(&mu_);
    ReapOrphansLocked(&done);
    if (free_.size() <= waiters_) return nullptr;
    char* block = free_.back();
    free_.pop_back();
    return block;
  }

  // Rule 3: waits for a block, reclaiming blocks of idle files meanwhile.
  // Never fails without a timeout; with one (> 0), nullptr when no block was
  // returned to the pool for that long (only hung storage does that).
  // REQUIRES: the caller holds self's mutex, and self holds no block and has
  // no write in flight.
  char* TakeOrReclaim(UringWritableFile* self, absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Gives a block back (a write completed, or a file let go of it).
  void Return(char* block) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ReturnLocked(block);
  }

  // Takes the ring and kernel-owned blocks of a file that gave up (hung
  // storage); they come back as their completions arrive.
  void Adopt(std::unique_ptr<Orphan> orphan) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ++timeouts_;
    orphaned_blocks_ += orphan->blocks;
    orphans_.push_back(std::move(orphan));
  }

  // A file entering a call. REQUIRES: the caller holds file's mutex.
  void SetBusy(UringWritableFile* file) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (auto it = idle_.find(file); it != idle_.end()) {
      idle_held_ -= it->second;
      idle_.erase(it);
    }
  }

  // A file that left a call while still holding `held` blocks (in flight or
  // partially filled). Called by its owner right after releasing the file's
  // mutex, before the owner's next call on the file.
  void SetIdle(UringWritableFile* file, size_t held) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    size_t& entry = idle_[file];
    idle_held_ = idle_held_ - entry + held;
    entry = held;
    if (waiters_ > 0) cv_.SignalAll();
  }

  // Also collects completions of orphans that arrived meanwhile.
  UringEnvStats Stats() ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<std::unique_ptr<Orphan>> done;
    absl::MutexLock lock(&mu_);
    ReapOrphansLocked(&done);
    UringEnvStats s;
    s.pool_blocks = num_blocks_;
    s.free_blocks = free_.size();
    s.waits = waits_;
    s.reclaims = reclaims_;
    s.timeouts = timeouts_;
    s.abandoned_blocks = orphaned_blocks_;
    return s;
  }

 private:
  void ReturnLocked(char* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    free_.push_back(block);
    ++returns_;
    if (waiters_ > 0) cv_.SignalAll();
  }

  // Handles the completions the orphans' rings have posted (never blocks):
  // each gives its block back; an orphan with nothing pending moves to
  // *done, whose destruction (after mu_ is released) exits its ring.
  void ReapOrphansLocked(std::vector<std::unique_ptr<Orphan>>* done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (size_t i = 0; i < orphans_.size();) {
      Orphan& o = *orphans_[i];
      io_uring_cqe* cqe = nullptr;
      while (!o.pending.empty() && ::io_uring_peek_cqe(&o.ring, &cqe) == 0) {
        const uint64_t tag = ::io_uring_cqe_get_data64(cqe);
        ::io_uring_cqe_seen(&o.ring, cqe);
        auto it = o.pending.find(tag);
        if (it == o.pending.end()) continue;
        if (it->second != nullptr) {
          --orphaned_blocks_;
          ReturnLocked(it->second);
        }
        o.pending.erase(it);
      }
      if (!o.pending.empty()) {
        ++i;
        continue;
      }
      spdlog::warn(
          "io_uring: the abandoned writes of {} completed {} after they were "
          "given up; their {} buffers are back in the pool",
          o.path, absl::FormatDuration(absl::Now() - o.since), o.blocks);
      done->push_back(std::move(orphans_[i]));
      orphans_.erase(orphans_.begin() + static_cast<ptrdiff_t>(i));
    }
  }

  // Constant after construction.
  char* const mem_;
  const size_t block_bytes_;
  const size_t num_blocks_;

  mutable absl::Mutex mu_;
  // Signalled when a block is returned or a file becomes idle with blocks,
  // while there are waiters.
  absl::CondVar cv_;
  std::vector<char*> free_ ABSL_GUARDED_BY(mu_);
  // Files inside TakeOrReclaim.
  size_t waiters_ ABSL_GUARDED_BY(mu_) = 0;
  // Files between calls that hold blocks (in flight or partially filled),
  // with the number they hold (constant while idle: only a reclaiming
  // thread, which first removes the file from here, can change it).
  absl::flat_hash_map<UringWritableFile*, size_t> idle_ ABSL_GUARDED_BY(mu_);
  size_t idle_held_ ABSL_GUARDED_BY(mu_) = 0;  // sum of idle_'s values
  uint64_t waits_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reclaims_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t returns_ ABSL_GUARDED_BY(mu_) = 0;  // blocks given back, ever
  // Files that gave up on hung storage, and the blocks the kernel still
  // owns in their rings (out of circulation: in neither free_ nor idle_).
  std::vector<std::unique_ptr<Orphan>> orphans_ ABSL_GUARDED_BY(mu_);
  size_t orphaned_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t timeouts_ ABSL_GUARDED_BY(mu_) = 0;
};

// ---------------------------------------------------------------------------
// UringWritableFile
// ---------------------------------------------------------------------------

// One data file: its descriptor, its own ring (queue_depth + 1 entries: the
// writes and one fsync) and the blocks it holds. Used by one thread at a
// time; mu_ also admits a reclaiming thread while the file is idle.
class UringWritableFile final : public WritableFile {
 public:
  static absl::StatusOr<std::unique_ptr<UringWritableFile>> Open(
      BlockPool* pool, const UringEnvOptions& env_options,
      const std::string& path, const WritableFileOptions& options) {
    int flags = O_WRONLY | O_CREAT | O_CLOEXEC;
    flags |= options.exclusive ? O_EXCL : O_TRUNC;
    bool direct = env_options.direct;
    int fd = ::open(path.c_str(), flags | (direct ? O_DIRECT : 0), 0644);
    if (fd < 0 && direct && errno == EINVAL) {
      // A file system without O_DIRECT (tmpfs, some FUSE): buffered writes.
      direct = false;
      fd = ::open(path.c_str(), flags, 0644);
    }
    if (fd < 0) {
      return ErrnoToEnvStatus(errno, fmt::format("open for write {}", path));
    }
    auto file = std::unique_ptr<UringWritableFile>(
        new UringWritableFile(pool, env_options, path, fd, direct));
    RETURN_IF_ERROR(file->InitRing());
    return file;
  }

  ~UringWritableFile() override { (void)Close(); }

  absl::Status Append(std::string_view data) override {
    std::string_view one[1] = {data};
    return AppendV(one);
  }

  absl::Status AppendV(absl::Span<const std::string_view> parts) override {
    CallLock lock(this);
    if (closed_) return ClosedErrorLocked("append to");
    ReapReadyLocked();
    RETURN_IF_ERROR(error_);
    for (std::string_view data : parts) {
      while (!data.empty()) {
        if (cur_ == nullptr) RETURN_IF_ERROR(TakeBlockLocked());
        const size_t n = std::min(block_bytes_ - cur_fill_, data.size());
        std::memcpy(cur_ + cur_fill_, data.data(), n);
        cur_fill_ += n;
        size_ += n;
        data.remove_prefix(n);
        if (cur_fill_ == block_bytes_) {
          char* block = std::exchange(cur_, nullptr);
          RETURN_IF_ERROR(StartWriteLocked(block, block_bytes_, cur_offset_));
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    CallLock lock(this);
    if (closed_) return ClosedErrorLocked("sync of");
    ReapReadyLocked();
    RETURN_IF_ERROR(error_);
    if (cur_ != nullptr) FlushPartialLocked();
    WaitAllLocked();
    RETURN_IF_ERROR(error_);
    RETURN_IF_ERROR(TruncateIfPaddedLocked());
    return FsyncLocked();
  }

  absl::Status Close() override {
    CallLock lock(this);
    if (closed_) return error_;
    ReapReadyLocked();
    if (cur_ != nullptr) {
      if (error_.ok()) {
        FlushPartialLocked();
      } else {
        pool_->Return(std::exchange(cur_, nullptr));
      }
    }
    WaitAllLocked();
    if (error_.ok()) RecordErrorLocked(TruncateIfPaddedLocked());
    if (ring_live_) QueueExit(&ring_);  // else the pool owns it
    ring_live_ = false;
    if (::close(fd_) != 0) {
      RecordErrorLocked(
          ErrnoToEnvStatus(errno, fmt::format("close {}", path_)));
    }
    fd_ = -1;
    closed_ = true;
    return error_;
  }

  uint64_t Size() const override { return size_; }
  const std::string& path() const override { return path_; }

  absl::Mutex* mu() ABSL_LOCK_RETURNED(mu_) { return &mu_; }

  // Rule 3: makes an idle file give back every block it holds — waits for
  // its in-flight writes and writes its partial block early. Called by
  // another file's thread. REQUIRES: mu_ held, the file is idle.
  void ReclaimLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    WaitAllLocked();
    if (cur_ == nullptr) return;
    if (error_.ok()) {
      FlushPartialLocked();
      WaitAllLocked();
    } else {
      pool_->Return(std::exchange(cur_, nullptr));
    }
  }

 private:
  // One write request: a block (owned until the write completes) and the
  // part of it still to be written. Its address is the SQE's user_data.
  struct Request {
    bool busy = false;
    char* block = nullptr;
    const char* data = nullptr;
    size_t left = 0;
    uint64_t offset = 0;
  };

  // Holds the file's mu_ for one public call and keeps the pool's idle set
  // in step: the file leaves it on entry and rejoins it, with the number of
  // blocks it still holds, after mu_ is released on exit. (Rejoining after
  // the release means a waiter whose TryLock failed on a file in the idle
  // set knows the owner is inside a new call, which ends by returning
  // blocks or rejoining the set — both wake the waiter.)
  class ABSL_SCOPED_LOCKABLE CallLock {
   public:
    explicit CallLock(UringWritableFile* file)
        ABSL_EXCLUSIVE_LOCK_FUNCTION(file->mu_)
        : file_(file) {
      file_->mu_.Lock();
      file_->pool_->SetBusy(file_);
    }
    ~CallLock() ABSL_UNLOCK_FUNCTION() {
      const size_t held = file_->HeldBlocksUnchecked();
      file_->mu_.Unlock();
      if (held > 0) file_->pool_->SetIdle(file_, held);
    }
    CallLock(const CallLock&) = delete;
    CallLock& operator=(const CallLock&) = delete;

   private:
    UringWritableFile* const file_;
  };

  UringWritableFile(BlockPool* pool, const UringEnvOptions& options,
                    std::string path, int fd, bool direct)
      : pool_(pool),
        path_(std::move(path)),
        direct_(direct),
        block_bytes_(pool->block_bytes()),
        queue_depth_(options.queue_depth),
        write_timeout_(options.write_timeout),
        fd_(fd),
        requests_(static_cast<size_t>(options.queue_depth)) {}

  absl::Status InitRing() {
    absl::MutexLock lock(&mu_);
    const int ret =
        QueueInit(static_cast<unsigned>(queue_depth_ + 1), &ring_);
    if (ret < 0) {
      ::close(fd_);
      fd_ = -1;
      closed_ = true;
      error_ = ErrnoToEnvStatus(
          -ret, fmt::format("io_uring_queue_init for {}", path_));
      return error_;
    }
    ring_live_ = true;
    return absl::OkStatus();
  }

  // REQUIRES: mu_ held (CallLock cannot say so to the analysis).
  size_t HeldBlocksUnchecked() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return (cur_ != nullptr ? 1 : 0) + static_cast<size_t>(in_flight_);
  }

  absl::Status ClosedErrorLocked(std::string_view what) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!error_.ok()) return error_;
    return absl::FailedPreconditionError(
        fmt::format("{} closed file {}", what, path_));
  }

  void RecordErrorLocked(const absl::Status& s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (error_.ok() && !s.ok()) error_ = s;
  }

  // Makes cur_ a block positioned at the end of the file (rules 2 and 3).
  // In direct mode the block starts at the 4 KiB page holding size_, with
  // the saved tail of that page copied in.
  absl::Status TakeBlockLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (true) {
      ReapReadyLocked();
      RETURN_IF_ERROR(error_);
      if (in_flight_ < queue_depth_) {
        cur_ = pool_->TryTake();
        if (cur_ != nullptr) break;
      }
      if (in_flight_ > 0) {
        RETURN_IF_ERROR(WaitOneLocked());
        continue;
      }
      cur_ = pool_->TakeOrReclaim(this, write_timeout_);
      if (cur_ == nullptr) {
        const UringEnvStats st = pool_->Stats();
        error_ = absl::DeadlineExceededError(fmt::format(
            "write of {} at offset {} made no progress for {} (write_timeout): "
            "no write buffer came free; {} of {} buffers are held by writes "
            "abandoned on hung storage",
            path_, size_, absl::FormatDuration(write_timeout_),
            st.abandoned_blocks, st.pool_blocks));
        return error_;
      }
      break;
    }
    cur_fill_ = tail_.size();
    cur_offset_ = size_ - tail_.size();
    if (!tail_.empty()) {
      std::memcpy(cur_, tail_.data(), tail_.size());
      tail_.clear();
    }
    return absl::OkStatus();
  }

  // Writes the filled part of cur_ (direct: padded with zeros to 4 KiB) and
  // lets go of cur_; the block returns to the pool when the write completes.
  // Direct mode keeps the last partial page in tail_ so that later appends
  // rewrite it. Errors are recorded. REQUIRES: cur_ != nullptr; every caller
  // waits for all writes before the next block is taken (a rewrite of the
  // tail page must not race the padded write).
  void FlushPartialLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    char* block = std::exchange(cur_, nullptr);
    size_t len = cur_fill_;
    if (len == 0) {
      pool_->Return(block);
      return;
    }
    if (direct_) {
      const size_t tail = len % kDirectAlign;
      tail_.assign(block + len - tail, tail);
      if (tail != 0) {
        const size_t padded = RoundUp(len, kDirectAlign);
        std::memset(block + len, 0, padded - len);
        len = padded;
        needs_truncate_ = true;
      }
    }
    (void)StartWriteLocked(block, len, cur_offset_);
  }

  // Submits a write of block[0, len) at `offset`; the block is returned to
  // the pool when it completes (or at once if submission fails). Errors
  // are recorded and returned. REQUIRES: in_flight_ < queue_depth_.
  absl::Status StartWriteLocked(char* block, size_t len, uint64_t offset)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Request* r = nullptr;
    for (Request& candidate : requests_) {
      if (!candidate.busy) {
        r = &candidate;
        break;
      }
    }
    if (r == nullptr) {
      std::fprintf(stderr, "ckptd: %s: more than %d writes in flight\n",
                   path_.c_str(), queue_depth_);
      std::abort();
    }
    *r = Request{true, block, block, len, offset};
    ++in_flight_;
    absl::Status s = SubmitLocked(r);
    if (!s.ok()) FinishLocked(r);
    return s;
  }

  // Queues r's remaining bytes. Errors are recorded and returned.
  absl::Status SubmitLocked(Request* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    io_uring_sqe* sqe = ::io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {
      std::fprintf(stderr, "ckptd: %s: io_uring submission queue full\n",
                   path_.c_str());
      std::abort();
    }
    ::io_uring_prep_write(sqe, fd_, r->data, static_cast<unsigned>(r->left),
                          r->offset);
    ::io_uring_sqe_set_data(sqe, r);
    return SubmitSqesLocked();
  }

  absl::Status SubmitSqesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (true) {
      const int ret = ::io_uring_submit(&ring_);
      if (ret >= 0) return absl::OkStatus();
      if (ret == -EINTR || ret == -EAGAIN) continue;
      absl::Status s =
          ErrnoToEnvStatus(-ret, fmt::format("io_uring_submit for {}", path_));
      RecordErrorLocked(s);
      return s;
    }
  }

  // The request is done (or failed): it lets go of its block.
  void FinishLocked(Request* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    r->busy = false;
    --in_flight_;
    if (r->block != nullptr) pool_->Return(std::exchange(r->block, nullptr));
  }

  void HandleCompletionLocked(io_uring_cqe* cqe)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    void* tag = ::io_uring_cqe_get_data(cqe);
    const int res = cqe->res;
    ::io_uring_cqe_seen(&ring_, cqe);
    if (tag == &fsync_tag_) {
      fsync_pending_ = false;
      fsync_result_ = res;
      return;
    }
    Request* r = static_cast<Request*>(tag);
    if (res == -EAGAIN || res == -EINTR) {
      if (!SubmitLocked(r).ok()) FinishLocked(r);
      return;
    }
    if (res < 0) {
      RecordErrorLocked(ErrnoToEnvStatus(
          -res, fmt::format("write {} at offset {}", path_, r->offset)));
      FinishLocked(r);
      return;
    }
    if (res == 0) {
      RecordErrorLocked(absl::DataLossError(
          fmt::format("write {} at offset {}: wrote 0 of {} bytes", path_,
                      r->offset, r->left)));
      FinishLocked(r);
      return;
    }
    const size_t done = static_cast<size_t>(res);
    r->data += done;
    r->left -= done;
    r->offset += done;
    if (r->left == 0) {
      FinishLocked(r);
    } else if (!SubmitLocked(r).ok()) {  // short write: the rest
      FinishLocked(r);
    }
  }

  // Handles every completion already posted; does not block.
  void ReapReadyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!ring_live_) return;
    io_uring_cqe* cqe = nullptr;
    while (::io_uring_peek_cqe(&ring_, &cqe) == 0) HandleCompletionLocked(cqe);
  }

  // Blocks for at least one completion, then handles every posted one. With
  // write_timeout, a wait that sees no completion for that long gives up
  // (AbandonLocked) and returns the DEADLINE_EXCEEDED it recorded.
  // REQUIRES: a write or the fsync in flight.
  absl::Status WaitOneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    io_uring_cqe* cqe = nullptr;
    const bool bounded = write_timeout_ > absl::ZeroDuration();
    const absl::Time deadline = absl::Now() + write_timeout_;
    int ret;
    do {
      if (bounded) {
        __kernel_timespec ts = KernelTimespec(deadline - absl::Now());
        ret = ::io_uring_wait_cqe_timeout(&ring_, &cqe, &ts);
      } else {
        ret = ::io_uring_wait_cqe(&ring_, &cqe);
      }
    } while (ret == -EINTR || ret == -EAGAIN);
    if (ret == -ETIME) {
      AbandonLocked();
      return error_;
    }
    if (ret < 0) {
      // The kernel still owns the blocks in flight: nothing safe to do.
      std::fprintf(stderr, "ckptd: io_uring_wait_cqe for %s: %s\n",
                   path_.c_str(), std::strerror(-ret));
      std::abort();
    }
    HandleCompletionLocked(cqe);
    ReapReadyLocked();
    return absl::OkStatus();
  }

  void WaitAllLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (in_flight_ > 0 || fsync_pending_) {
      if (!WaitOneLocked().ok()) return;  // gave up: nothing is in flight
    }
  }

  // write_timeout passed without a completion: the storage is hung. Records
  // DEADLINE_EXCEEDED naming the oldest unfinished write (or the fsync) and
  // hands the ring and the blocks the kernel still owns to the pool (an
  // orphan): they are not reused until their completions arrive, so a late
  // completion cannot write from a buffer that holds other data. The file
  // has nothing in flight afterwards; every later call returns the error.
  void AbandonLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto orphan = std::make_unique<BlockPool::Orphan>();
    orphan->ring = ring_;
    orphan->path = DisplayPath(path_);  // for the log line when it completes
    orphan->since = absl::Now();
    uint64_t first = UINT64_MAX;
    for (Request& r : requests_) {
      if (!r.busy) continue;
      first = std::min(first, r.offset);
      orphan->pending[reinterpret_cast<uint64_t>(&r)] = r.block;
      ++orphan->blocks;
      r = Request{};
    }
    if (fsync_pending_) {
      orphan->pending[reinterpret_cast<uint64_t>(&fsync_tag_)] = nullptr;
    }
    auto describe = [&](const std::string& path) {
      return fmt::format(
          "{} made no progress for {} (write_timeout)",
          first == UINT64_MAX
              ? fmt::format("fsync of {}", path)
              : fmt::format("write of {} at offset {}", path, first),
          absl::FormatDuration(write_timeout_));
    };
    if (error_.ok()) error_ = absl::DeadlineExceededError(describe(path_));
    spdlog::error(
        "{}; giving up on it: {} write buffers stay with the kernel until "
        "the storage answers (not reused meanwhile)",
        describe(orphan->path), orphan->blocks);
    in_flight_ = 0;
    fsync_pending_ = false;
    ring_live_ = false;
    pool_->Adopt(std::move(orphan));
  }

  // Direct mode: cuts the zero padding of the last page off.
  absl::Status TruncateIfPaddedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!needs_truncate_) return absl::OkStatus();
    if (::ftruncate(fd_, static_cast<off_t>(size_)) != 0) {
      absl::Status s = ErrnoToEnvStatus(
          errno, fmt::format("ftruncate {} to {} bytes", path_, size_));
      RecordErrorLocked(s);
      return s;
    }
    needs_truncate_ = false;
    return absl::OkStatus();
  }

  // IORING_OP_FSYNC. REQUIRES: nothing in flight.
  absl::Status FsyncLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (true) {
      io_uring_sqe* sqe = ::io_uring_get_sqe(&ring_);
      if (sqe == nullptr) {
        std::fprintf(stderr, "ckptd: %s: io_uring submission queue full\n",
                     path_.c_str());
        std::abort();
      }
      ::io_uring_prep_fsync(sqe, fd_, 0);
      ::io_uring_sqe_set_data(sqe, &fsync_tag_);
      fsync_pending_ = true;
      if (absl::Status s = SubmitSqesLocked(); !s.ok()) {
        fsync_pending_ = false;
        return s;
      }
      WaitAllLocked();
      if (!ring_live_) return error_;  // gave up (write_timeout)
      if (fsync_result_ == -EINTR || fsync_result_ == -EAGAIN) continue;
      if (fsync_result_ < 0) {
        absl::Status s =
            ErrnoToEnvStatus(-fsync_result_, fmt::format("fsync {}", path_));
        RecordErrorLocked(s);
        return s;
      }
      return absl::OkStatus();
    }
  }

  // Constant after construction.
  BlockPool* const pool_;
  const std::string path_;
  const bool direct_;
  const size_t block_bytes_;
  const int queue_depth_;
  const absl::Duration write_timeout_;  // <= 0: waits have no deadline

  // Touched only by the owning thread (never by a reclaiming one).
  uint64_t size_ = 0;  // bytes appended

  // Guarded by mu_: the owning thread inside a call, or a reclaiming thread
  // while the file is idle.
  absl::Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_);
  io_uring ring_ ABSL_GUARDED_BY(mu_);
  // ring_ is set up and this file's: false before InitRing succeeds, after
  // Close, and after AbandonLocked gave it to the pool.
  bool ring_live_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Request> requests_ ABSL_GUARDED_BY(mu_);  // queue_depth_ slots
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  char fsync_tag_ = 0;  // its address marks the fsync's CQE
  bool fsync_pending_ ABSL_GUARDED_BY(mu_) = false;
  int fsync_result_ ABSL_GUARDED_BY(mu_) = 0;
  // The block being filled: cur_fill_ bytes at file offset cur_offset_.
  char* cur_ ABSL_GUARDED_BY(mu_) = nullptr;
  size_t cur_fill_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t cur_offset_ ABSL_GUARDED_BY(mu_) = 0;
  // Direct mode, no block held: the bytes of the last partial 4 KiB page
  // (written padded), to be rewritten with the next block.
  std::string tail_ ABSL_GUARDED_BY(mu_);
  // Direct mode: zero padding was written past size_.
  bool needs_truncate_ ABSL_GUARDED_BY(mu_) = false;
  // The first error; returned by every later call.
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

char* BlockPool::TakeOrReclaim(UringWritableFile* self, absl::Duration timeout)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {          // victim mutexes are try-locked
  std::vector<std::unique_ptr<Orphan>> done;  // rings exited after unlock
  mu_.Lock();
  ++waiters_;
  ++waits_;
  const bool bounded = timeout > absl::ZeroDuration();
  absl::Time deadline = absl::Now() + timeout;
  uint64_t returns_seen = returns_;
  while (true) {
    ReapOrphansLocked(&done);
    if (!free_.empty()) break;
    // Blocks held by files inside a call come back (or get parked in an
    // idle file) without help: reclaim only when every block is parked (or
    // owned by the kernel for an abandoned write).
    UringWritableFile* victim = nullptr;
    if (idle_held_ + orphaned_blocks_ == num_blocks_) {
      for (const auto& [f, held] : idle_) {
        if (f != self && f->mu()->TryLock()) {
          victim = f;
          break;
        }
      }
    }
    if (victim == nullptr) {
      if (!bounded && orphans_.empty()) {
        cv_.Wait(&mu_);
        continue;
      }
      // Completions of orphans signal nothing: poll them.
      const absl::Time now = absl::Now();
      if (returns_ != returns_seen) {  // the pool moves: not hung
        returns_seen = returns_;
        deadline = now + timeout;
      }
      if (bounded && now >= deadline) {
        --waiters_;
        mu_.Unlock();
        return nullptr;
      }
      absl::Duration wait = absl::Milliseconds(50);
      if (bounded) wait = std::min(wait, deadline - now);
      cv_.WaitWithTimeout(&mu_, wait);
      continue;
    }
    // The victim cannot be destroyed meanwhile: its Close needs its mutex.
    auto it = idle_.find(victim);
    idle_held_ -= it->second;
    idle_.erase(it);
    ++reclaims_;
    mu_.Unlock();
    victim->ReclaimLocked();
    victim->mu()->Unlock();
    mu_.Lock();
  }
  --waiters_;
  char* block = free_.back();
  free_.pop_back();
  mu_.Unlock();
  return block;
}

namespace {

// Probes io_uring with a real 4 KiB write + fsync to an unlinked temp file.
absl::Status ProbeUring(const std::string& probe_dir, bool direct) {
  io_uring ring;
  int ret = uring_internal::QueueInit(2, &ring);
  if (ret < 0) {
    return absl::UnavailableError(
        fmt::format("io_uring_queue_init: {}", std::strerror(-ret)));
  }
  std::string name = JoinPath(probe_dir, ".ckptd_uring_probe_XXXXXX");
  const int fd = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    uring_internal::QueueExit(&ring);
    return ErrnoToEnvStatus(
        err, fmt::format("create io_uring probe file in {}", probe_dir));
  }
  ::unlink(name.c_str());
  absl::Status result;
  void* buf = nullptr;
  if (direct && ::fcntl(fd, F_SETFL, O_DIRECT) != 0) {
    result = absl::UnavailableError(
        fmt::format("O_DIRECT is not supported in {}: {}", probe_dir,
                    std::strerror(errno)));
  } else if (::posix_memalign(&buf, kDirectAlign, kDirectAlign) != 0) {
    result = absl::ResourceExhaustedError("io_uring probe buffer");
  } else {
    std::memset(buf, 0, kDirectAlign);
    // Write, then fsync; each waited for on its own.
    for (int step = 0; step < 2 && result.ok(); ++step) {
      io_uring_sqe* sqe = ::io_uring_get_sqe(&ring);
      if (step == 0) {
        ::io_uring_prep_write(sqe, fd, buf, kDirectAlign, 0);
      } else {
        ::io_uring_prep_fsync(sqe, fd, 0);
      }
      ret = ::io_uring_submit(&ring);
      io_uring_cqe* cqe = nullptr;
      if (ret == 1) {
        do {
          ret = ::io_uring_wait_cqe(&ring, &cqe);
        } while (ret == -EINTR);
      } else if (ret >= 0) {
        ret = -EIO;
      }
      if (ret == 0) {
        ret = cqe->res;
        ::io_uring_cqe_seen(&ring, cqe);
      }
      const char* op = step == 0 ? "write" : "fsync";
      if (ret < 0) {
        result = absl::UnavailableError(fmt::format(
            "io_uring {} probe in {}: {}", op, probe_dir, std::strerror(-ret)));
      } else if (step == 0 && ret != static_cast<int>(kDirectAlign)) {
        result = absl::UnavailableError(
            fmt::format("io_uring write probe in {}: wrote {} of {} bytes",
                        probe_dir, ret, kDirectAlign));
      }
    }
  }
  ::free(buf);
  ::close(fd);
  uring_internal::QueueExit(&ring);
  return result;
}

absl::Status ValidateOptions(const UringEnvOptions& o) {
  if (o.queue_depth < 1 || o.queue_depth > kMaxQueueDepth) {
    return absl::InvalidArgumentError(
        fmt::format("UringEnvOptions.queue_depth {} is not in [1, {}]",
                    o.queue_depth, kMaxQueueDepth));
  }
  if (o.block_bytes == 0 || o.block_bytes % kDirectAlign != 0 ||
      o.block_bytes > kMaxBlockBytes) {
    return absl::InvalidArgumentError(fmt::format(
        "UringEnvOptions.block_bytes {} is not a positive multiple of {} of "
        "at most {}",
        o.block_bytes, kDirectAlign, kMaxBlockBytes));
  }
  if (o.write_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        fmt::format("UringEnvOptions.write_timeout {} is negative",
                    absl::FormatDuration(o.write_timeout)));
  }
  if (o.pool_bytes < o.block_bytes) {
    return absl::InvalidArgumentError(
        fmt::format("UringEnvOptions.pool_bytes {} is less than one block ({})",
                    o.pool_bytes, o.block_bytes));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace uring_internal

using uring_internal::BlockPool;
using uring_internal::UringWritableFile;

absl::StatusOr<std::unique_ptr<UringEnv>> UringEnv::Create(
    Env* base, const std::string& probe_dir, const UringEnvOptions& options) {
  RETURN_IF_ERROR(uring_internal::ValidateOptions(options));
  RETURN_IF_ERROR(uring_internal::ProbeUring(probe_dir, options.direct));
  const size_t num_blocks = options.pool_bytes / options.block_bytes;
  const size_t bytes = num_blocks * options.block_bytes;
  // Pre-faulted once: first touch of fresh memory is slow on the VMs.
  void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (mem == MAP_FAILED) {
    return ErrnoToEnvStatus(
        errno, fmt::format("mmap {} bytes for the UringEnv pool", bytes));
  }
  std::memset(mem, 0, bytes);
  auto pool = std::make_unique<BlockPool>(static_cast<char*>(mem),
                                          options.block_bytes, num_blocks);
  return std::unique_ptr<UringEnv>(
      new UringEnv(base, options, std::move(pool)));
}

UringEnv::UringEnv(Env* base, const UringEnvOptions& options,
                   std::unique_ptr<BlockPool> pool)
    : EnvWrapper(base), options_(options), pool_(std::move(pool)) {}

UringEnv::~UringEnv() = default;

UringEnvStats UringEnv::stats() const { return pool_->Stats(); }

absl::StatusOr<std::unique_ptr<WritableFile>> UringEnv::NewWritableFile(
    const std::string& path, const WritableFileOptions& options) {
  ASSIGN_OR_RETURN(
      std::unique_ptr<UringWritableFile> file,
      UringWritableFile::Open(pool_.get(), options_, path, options));
  return std::unique_ptr<WritableFile>(std::move(file));
}

}  // namespace ckptd
