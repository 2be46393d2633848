// Copyright 2026 The ckptd Authors.
//
// ReadHookEnv: an Env whose files with names ending in a suffix (".distcp")
// count their reads per file and call a hook before each, so that a test
// can act at an exact point of a read (cancel it after its first block)
// without timing.
#ifndef CKPTD_TESTS_TESTING_READ_HOOK_ENV_H_
#define CKPTD_TESTS_TESTING_READ_HOOK_ENV_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "common/env.h"

namespace ckptd::testing {

class ReadHookEnv : public EnvWrapper {
 public:
  // Called (on the reading thread, no lock held) before each read of a
  // matching file, with its path and the number of reads of matching files
  // so far, this one included.
  using Hook = std::function<void(const std::string& path, int reads)>;

  ReadHookEnv(Env* base, std::string suffix, Hook hook)
      : EnvWrapper(base), suffix_(std::move(suffix)), hook_(std::move(hook)) {}

  absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path) override {
    absl::StatusOr<std::unique_ptr<RandomAccessFile>> f =
        base()->NewRandomAccessFile(path);
    if (!f.ok() || !absl::EndsWith(path, suffix_)) return f;
    return std::make_unique<File>(this, *std::move(f));
  }

  // Reads of `path` so far.
  int reads(const std::string& path) const {
    absl::MutexLock l(&mu_);
    auto it = reads_.find(path);
    return it == reads_.end() ? 0 : it->second;
  }

 private:
  // Forwards every call; direct reads are off (DirectAlignment 0), so each
  // read is one ReadExact.
  class File : public RandomAccessFile {
   public:
    File(ReadHookEnv* env, std::unique_ptr<RandomAccessFile> base)
        : env_(env), base_(std::move(base)) {}
    absl::Status ReadExact(uint64_t offset, size_t n,
                           char* scratch) const override {
      env_->Before(base_->path());
      return base_->ReadExact(offset, n, scratch);
    }
    uint64_t Size() const override { return base_->Size(); }
    const std::string& path() const override { return base_->path(); }

   private:
    ReadHookEnv* const env_;
    const std::unique_ptr<RandomAccessFile> base_;
  };

  void Before(const std::string& path) {
    int total = 0;
    {
      absl::MutexLock l(&mu_);
      ++reads_[path];
      total = ++total_;
    }
    if (hook_) hook_(path, total);
  }

  const std::string suffix_;
  const Hook hook_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, int> reads_ ABSL_GUARDED_BY(mu_);
  int total_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckptd::testing

#endif  // CKPTD_TESTS_TESTING_READ_HOOK_ENV_H_
