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

namespace {

// Polynomials over GF(2) modulo the CRC-32 polynomial, in the CRC's
// reflected order: bit 31 is the coefficient of x^0, bit 0 that of x^31.
constexpr uint32_t kPoly = 0xEDB88320;  // x^32 mod P, reflected

// a * b mod P.
uint32_t MulModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t bit = 0x80000000u; bit != 0; bit >>= 1) {
    if (a & bit) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;  // b *= x
  }
  return product;
}

}  // namespace

uint32_t Crc32ShiftFor(uint64_t len) {
  // x^(8 len) mod P by squaring: `power` runs through x^(2^k).
  uint32_t result = 0x80000000u;  // 1
  uint32_t power = 0x40000000u;   // x
  for (uint64_t bits = len * 8; bits != 0; bits >>= 1) {
    if (bits & 1) result = MulModP(result, power);
    power = MulModP(power, power);
  }
  return result;
}

uint32_t Crc32Shift(uint32_t crc, uint32_t shift) {
  return MulModP(crc, shift);
}

uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  // The pre- and post-inversion of the CRC cancel: appending b multiplies
  // a's remainder by x^(8 len_b) and adds b's.
  return Crc32Shift(crc_a, Crc32ShiftFor(len_b)) ^ crc_b;
}

}  // namespace ckptd
