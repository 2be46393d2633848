// Copyright 2026 The ckptd Authors.
#include "common/crc32.h"

#include <isa-l/crc.h>

#include <algorithm>
#include <cstring>

namespace ckptd {

uint32_t Crc32(uint32_t crc, const void* data, size_t n) {
  // crc32_gzip_refl takes a 64-bit length; no chunking needed.
  return crc32_gzip_refl(crc, static_cast<const unsigned char*>(data), n);
}

uint32_t CopyWithCrc32(uint32_t crc, void* dst, const void* src, size_t n) {
  // 256 KiB blocks: the block just copied is still in L2 when it is CRC'd.
  constexpr size_t kBlock = 256 << 10;
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  while (n > 0) {
    const size_t len = std::min(n, kBlock);
    std::memcpy(d, s, len);
    crc = crc32_gzip_refl(crc, d, len);
    d += len;
    s += len;
    n -= len;
  }
  return crc;
}

}  // namespace ckptd
