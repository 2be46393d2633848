#include "daemon/restore/counting_env.h"

#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "common/status_macros.h"

namespace ckptd::daemon {
namespace {

class CountingFile : public RandomAccessFile {
 public:
  CountingFile(std::unique_ptr<RandomAccessFile> base,
               RestoreObserver* observer)
      : base_(std::move(base)), observer_(observer) {}

  absl::Status ReadExact(uint64_t offset, size_t n,
                         char* scratch) const override {
    RETURN_IF_ERROR(base_->ReadExact(offset, n, scratch));
    observer_->RestoreFileBytesRead(n);
    return absl::OkStatus();
  }
  uint64_t Size() const override { return base_->Size(); }
  const std::string& path() const override { return base_->path(); }
  uint64_t DirectAlignment() const override { return base_->DirectAlignment(); }
  absl::Status ReadDirect(uint64_t offset, size_t n, char* dst) const override {
    RETURN_IF_ERROR(base_->ReadDirect(offset, n, dst));
    observer_->RestoreFileBytesRead(n);
    return absl::OkStatus();
  }
  absl::StatusOr<uint32_t> Crc32(uint64_t offset, uint64_t n) const override {
    ASSIGN_OR_RETURN(const uint32_t crc, base_->Crc32(offset, n));
    observer_->RestoreFileBytesRead(n);
    return crc;
  }

 private:
  const std::unique_ptr<RandomAccessFile> base_;
  RestoreObserver* const observer_;
};

class CountingEnv : public EnvWrapper {
 public:
  CountingEnv(Env* base, RestoreObserver* observer)
      : EnvWrapper(base), observer_(observer) {}

  absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path) override {
    ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> f,
                     base()->NewRandomAccessFile(path));
    if (path == ".metadata" || absl::EndsWith(path, "/.metadata")) return f;
    return std::make_unique<CountingFile>(std::move(f), observer_);
  }

 private:
  RestoreObserver* const observer_;
};

}  // namespace

std::unique_ptr<Env> NewFileReadCountingEnv(Env* base,
                                            RestoreObserver* observer) {
  return std::make_unique<CountingEnv>(base, observer);
}

}  // namespace ckptd::daemon
