// Copyright 2026 The ckptd Authors.
#include "daemon/cluster/share_wire.h"

#include <algorithm>
#include <string>
#include <vector>

#include "common/crc32.h"
#include "fmt/format.h"
#include "grpcpp/support/slice.h"

namespace ckptd::daemon {
namespace {

constexpr uint8_t kDataTag = 0x0a;  // field 1, length-delimited
constexpr uint8_t kCrcTag = 0x15;   // field 2, fixed32

// Reads protobuf wire bytes spread over slices.
class SliceReader {
 public:
  explicit SliceReader(const std::vector<grpc::Slice>& s) : s_(s) { Skip(); }
  bool done() const { return i_ == s_.size(); }
  bool Byte(uint8_t* b) {
    if (done()) return false;
    *b = s_[i_].begin()[at_++];
    Skip();
    return true;
  }
  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b;
      if (!Byte(&b)) return false;
      *v |= uint64_t{b & 0x7fu} << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }
  bool Fixed32(uint32_t* v) {
    *v = 0;
    for (int k = 0; k < 4; ++k) {
      uint8_t b;
      if (!Byte(&b)) return false;
      *v |= uint32_t{b} << (8 * k);
    }
    return true;
  }
  // Copies `n` bytes to `dst`, extending `crc` over them.
  bool CopyWithCrc(char* dst, uint64_t n, uint32_t* crc) {
    while (n > 0) {
      if (done()) return false;
      const size_t part = std::min<uint64_t>(n, s_[i_].size() - at_);
      *crc = CopyWithCrc32(*crc, dst, s_[i_].begin() + at_, part);
      dst += part;
      n -= part;
      at_ += part;
      Skip();
    }
    return true;
  }

 private:
  void Skip() {
    while (i_ < s_.size() && at_ == s_[i_].size()) {
      ++i_;
      at_ = 0;
    }
  }
  const std::vector<grpc::Slice>& s_;
  size_t i_ = 0;
  size_t at_ = 0;
};

}  // namespace

grpc::ByteBuffer EncodeFetchAnswer(std::shared_ptr<const TierFileBytes> file,
                                   const char* data, uint64_t size,
                                   uint32_t crc32) {
  std::string head(1, static_cast<char>(kDataTag));
  for (uint64_t v = size;; v >>= 7) {
    head.push_back(static_cast<char>((v & 0x7f) | (v >= 0x80 ? 0x80 : 0)));
    if (v < 0x80) break;
  }
  char tail[5] = {static_cast<char>(kCrcTag)};  // little-endian
  for (int i = 0; i < 4; ++i)
    tail[1 + i] = static_cast<char>((crc32 >> (8 * i)) & 0xff);
  std::vector<grpc::Slice> slices;
  slices.emplace_back(head.data(), head.size());
  if (size > 0 && file != nullptr) {
    auto* keep = new std::shared_ptr<const TierFileBytes>(std::move(file));
    slices.emplace_back(
        const_cast<char*>(data), size,
        +[](void* p) {
          delete static_cast<std::shared_ptr<const TierFileBytes>*>(p);
        },
        keep);
  } else if (size > 0) {
    slices.emplace_back(data, size);
  }
  slices.emplace_back(tail, sizeof tail);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

absl::Status DecodeFetchAnswer(grpc::ByteBuffer& answer, uint64_t length,
                               char* dst) {
  std::vector<grpc::Slice> slices;
  if (!answer.Dump(&slices).ok()) {
    return absl::DataLossError("an unreadable answer");
  }
  SliceReader in(slices);
  uint32_t data_crc = 0, sent_crc = 0;
  bool have_data = false, have_crc = false;
  while (!in.done()) {
    uint64_t tag = 0, len = 0;
    if (!in.Varint(&tag)) break;
    if (tag == kDataTag && !have_data) {
      if (!in.Varint(&len) || len != length ||
          !in.CopyWithCrc(dst, len, &data_crc)) {
        return absl::DataLossError(fmt::format(
            "size or CRC-32 mismatch ({} bytes asked for)", length));
      }
      have_data = true;
    } else if (tag == kCrcTag && !have_crc && in.Fixed32(&sent_crc)) {
      have_crc = true;
    } else {
      return absl::DataLossError("malformed answer");
    }
  }
  // An empty data field is left out by a protobuf writer.
  if (!have_data && length == 0) have_data = true;
  if (!in.done() || !have_data || !have_crc || data_crc != sent_crc) {
    return absl::DataLossError(
        fmt::format("size or CRC-32 mismatch ({} bytes asked for)", length));
  }
  return absl::OkStatus();
}

}  // namespace ckptd::daemon
