// Copyright 2026 The ckptd Authors.
//
// Internal to format/zip/: the zip records (PKWARE APPNOTE 6.3) the writers
// (zip.cc) lay out and the reader (zip_reader.cc) checks. Local file header
// 30 bytes + name + extra; data descriptor PK\x07\x08 crc csize usize (4- or
// 8-byte sizes); central directory header 46 bytes + name + extra +
// comment; zip64 end of central directory record (56 bytes) + locator (20
// bytes); end of central directory record (22 bytes + comment). All
// integers little-endian.
#ifndef CKPTD_FORMAT_ZIP_ZIP_RECORDS_H_
#define CKPTD_FORMAT_ZIP_ZIP_RECORDS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "fmt/format.h"

namespace ckptd::format {

inline constexpr uint32_t kLocalSig = 0x04034b50;
inline constexpr uint32_t kCentralSig = 0x02014b50;
inline constexpr uint32_t kDescriptorSig = 0x08074b50;
inline constexpr uint32_t kEocdSig = 0x06054b50;
inline constexpr uint32_t kEocd64Sig = 0x06064b50;
inline constexpr uint32_t kLocatorSig = 0x07064b50;

inline constexpr uint64_t kLocalHeaderSize = 30;
inline constexpr uint64_t kCentralHeaderSize = 46;
inline constexpr uint64_t kEocdSize = 22;
inline constexpr uint64_t kEocd64Size = 56;
inline constexpr uint64_t kLocatorSize = 20;
inline constexpr uint64_t kMaxComment = 0xffff;

inline constexpr uint16_t kZip64ExtraId = 0x0001;

// A 32-bit (16-bit) field holding this defers to the zip64 records.
inline constexpr uint32_t kMax32 = 0xffffffff;
inline constexpr uint16_t kMax16 = 0xffff;

inline uint16_t Get16(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return static_cast<uint16_t>(u[0] | (u[1] << 8));
}
inline uint32_t Get32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return static_cast<uint32_t>(u[0]) | (static_cast<uint32_t>(u[1]) << 8) |
         (static_cast<uint32_t>(u[2]) << 16) |
         (static_cast<uint32_t>(u[3]) << 24);
}
inline uint64_t Get64(const char* p) {
  return static_cast<uint64_t>(Get32(p)) |
         (static_cast<uint64_t>(Get32(p + 4)) << 32);
}

// A record name as a quoted, escaped, bounded string for messages.
inline std::string Quote(std::string_view name) {
  std::string out = "'";
  size_t n = 0;
  for (unsigned char c : name) {
    if (++n > 200) {
      out += "...";
      break;
    }
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  out += "'";
  return out;
}

}  // namespace ckptd::format

#endif  // CKPTD_FORMAT_ZIP_ZIP_RECORDS_H_
