// Copyright 2026 The ckptd Authors.
//
// CRC-32 (IEEE 802.3, reflected; the zip / gzip / zlib CRC) backed by ISA-L's
// hardware-accelerated folding implementation.
#ifndef CKPTD_COMMON_CRC32_H_
#define CKPTD_COMMON_CRC32_H_

#include <cstddef>
#include <cstdint>

namespace ckptd {

// Extends `crc` (the value returned for the preceding bytes, 0 to start) over
// [data, data + n). Crc32(Crc32(0, a), b) == Crc32(0, a ++ b). Thread-safe.
uint32_t Crc32(uint32_t crc, const void* data, size_t n);

// Copies n bytes from src to dst and returns Crc32(crc, src, n), working in
// cache-sized blocks so the bytes are read from memory once.
uint32_t CopyWithCrc32(uint32_t crc, void* dst, const void* src, size_t n);

// Crc32(0, a ++ b) from crc_a = Crc32(0, a), crc_b = Crc32(0, b) and the
// length of b, without the bytes: for a CRC pieced together from CRCs of
// the parts of a range taken earlier. O(log len_b).
uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

// What Crc32Combine multiplies crc_a by for pieces b of `len` bytes, made
// once for many pieces of one length: Crc32Combine(a, b, len) ==
// Crc32Shift(a, Crc32ShiftFor(len)) ^ b.
uint32_t Crc32ShiftFor(uint64_t len);
uint32_t Crc32Shift(uint32_t crc, uint32_t shift);

}  // namespace ckptd

#endif  // CKPTD_COMMON_CRC32_H_
