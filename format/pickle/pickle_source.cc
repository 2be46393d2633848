// Copyright 2026 The ckptd Authors.
#include "format/pickle/pickle_source.h"

#include <algorithm>
#include <cstring>

namespace ckptd::pickle::internal {

Source::Source(std::string_view data)
    : size_(data.size()), data_(data.data()), len_(data.size()) {}

Source::Source(const RandomAccessFile* file, size_t block_bytes)
    : file_(file),
      size_(file->Size()),
      block_(std::max<size_t>(block_bytes, 4096)) {
  data_ = buf_.data();
}

void Source::Rewind() {
  if (file_ == nullptr) {
    cur_ = 0;
    return;
  }
  base_ = 0;
  len_ = 0;
  cur_ = 0;
  io_status_ = absl::OkStatus();
}

const char* Source::Fill(size_t n) {
  if (file_ == nullptr || !io_status_.ok() || remaining() < n) return nullptr;
  // Keep the unread bytes, then read at least up to n (a block at a time).
  const size_t keep = len_ - cur_;
  const size_t want = std::max(n, block_);
  if (buf_.size() < want) {
    std::string grown(want, '\0');
    std::memcpy(grown.data(), data_ + cur_, keep);
    buf_.swap(grown);
  } else if (keep > 0) {
    std::memmove(buf_.data(), data_ + cur_, keep);
  }
  data_ = buf_.data();
  base_ += cur_;
  cur_ = 0;
  len_ = keep;
  const uint64_t file_pos = base_ + len_;
  const size_t room = std::min<uint64_t>(buf_.size() - len_, size_ - file_pos);
  if (room > 0) {
    io_status_ = file_->ReadExact(file_pos, room, buf_.data() + len_);
    if (!io_status_.ok()) return nullptr;
    len_ += room;
  }
  return len_ >= n ? data_ : nullptr;
}

int64_t Source::LineLength(uint64_t max, bool* too_long) {
  *too_long = false;
  size_t scanned = 0;
  while (true) {
    const size_t avail = len_ - cur_;
    const size_t limit = std::min<uint64_t>(avail, max + 1);
    const void* nl = scanned < limit ? std::memchr(data_ + cur_ + scanned, '\n',
                                                   limit - scanned)
                                     : nullptr;
    if (nl != nullptr) {
      return static_cast<const char*>(nl) - (data_ + cur_);
    }
    if (avail >= max + 1) {
      *too_long = true;
      return -1;
    }
    if (remaining() <= avail) return -1;  // no newline before the end
    scanned = limit;
    if (Fill(std::min<uint64_t>(remaining(),
                                std::max<uint64_t>(2 * avail, avail + 1))) ==
        nullptr) {
      if (!io_status_.ok()) return -1;
    }
  }
}

}  // namespace ckptd::pickle::internal
