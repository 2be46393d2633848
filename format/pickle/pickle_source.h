// Copyright 2026 The ckptd Authors.
//
// Internal to the pickle machine (pickle_machine.h): the bytes of a pickle
// program, all of them in memory or a file read in blocks.
#ifndef CKPTD_FORMAT_PICKLE_PICKLE_SOURCE_H_
#define CKPTD_FORMAT_PICKLE_PICKLE_SOURCE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "common/env.h"

namespace ckptd::pickle::internal {

// The input: all of it in memory, or a file read in blocks (the buffer
// grows only to hold the largest single operand). A Peek may move the
// buffered bytes of a file (earlier pointers are then stale); Advance
// never does.
class Source {
 public:
  explicit Source(std::string_view data);
  Source(const RandomAccessFile* file, size_t block_bytes);

  uint64_t size() const { return size_; }
  uint64_t pos() const { return base_ + cur_; }
  uint64_t remaining() const { return size_ - pos(); }
  // Pointer to at least n buffered bytes at pos(), or nullptr if fewer
  // remain (or a read failed: io_status()).
  const char* Peek(size_t n) {
    if (len_ - cur_ >= n) return data_ + cur_;
    return Fill(n);
  }
  void Advance(size_t n) { cur_ += n; }
  // Bytes buffered at pos() (fast paths read them directly).
  size_t buffered() const { return len_ - cur_; }
  const char* cursor() const { return data_ + cur_; }
  // Length of the line at pos() (excluding '\n') if a '\n' occurs within
  // max + 1 bytes; -1 otherwise (truncated, or longer than max: *too_long).
  int64_t LineLength(uint64_t max, bool* too_long);
  // Back to offset 0 (the metadata decoder's pass 2).
  void Rewind();
  const absl::Status& io_status() const { return io_status_; }
  uint64_t buffer_bytes() const { return buf_.size(); }

 private:
  const char* Fill(size_t n);

  const RandomAccessFile* file_ = nullptr;
  uint64_t size_ = 0;
  size_t block_ = 0;
  std::string buf_;             // file mode
  const char* data_ = nullptr;  // buffer start
  uint64_t base_ = 0;           // file offset of data_[0]
  size_t len_ = 0;              // bytes valid at data_
  size_t cur_ = 0;
  absl::Status io_status_;
};

}  // namespace ckptd::pickle::internal

#endif  // CKPTD_FORMAT_PICKLE_PICKLE_SOURCE_H_
