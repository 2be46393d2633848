// Copyright 2026 The ckptd Authors.
#include "format/tensor/dtype_convert.h"

#include <cmath>
#include <cstring>

namespace ckptd::format {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float LoadFloat(DType dtype, const char* p) {
  switch (dtype) {
    case DType::kFloat64: {
      double d;
      std::memcpy(&d, p, 8);
      return static_cast<float>(d);
    }
    case DType::kFloat32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return dtype == DType::kFloat16 ? HalfToFloat(h) : BFloat16ToFloat(h);
    }
    default:
      return 0.0f;
  }
}

void StoreFloat(DType dtype, float f, char* p) {
  switch (dtype) {
    case DType::kFloat64: {
      const double d = f;
      std::memcpy(p, &d, 8);
      return;
    }
    case DType::kFloat32:
      std::memcpy(p, &f, 4);
      return;
    case DType::kFloat16:
    case DType::kBFloat16: {
      const uint16_t h =
          dtype == DType::kFloat16 ? FloatToHalf(f) : FloatToBFloat16(f);
      std::memcpy(p, &h, 2);
      return;
    }
    default:
      return;
  }
}

}  // namespace

bool IsConvertibleFloat(DType dtype) {
  return dtype == DType::kFloat64 || dtype == DType::kFloat32 ||
         dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

uint16_t FloatToHalf(float f) {
  const uint32_t x = Bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t a = x & 0x7fffffff;
  if (a >= 0x7f800000) {  // inf, NaN (kept quiet)
    return sign | 0x7c00 | (a > 0x7f800000 ? 0x200 | ((a >> 13) & 0x3ff) : 0);
  }
  if (a >= 0x477ff000) return sign | 0x7c00;  // rounds past 65504
  if (a < 0x38800000) {                       // below 2^-14: subnormal
    // |f| * 2^24 is the subnormal's integer mantissa; lrintf rounds to
    // nearest even (1024 carries into the smallest normal, as it should).
    return sign |
           static_cast<uint16_t>(std::lrintf(std::fabs(f) * 16777216.0f));
  }
  uint32_t h = (a - 0x38000000) >> 13;  // rebias 127 → 15, drop 13 bits
  const uint32_t rest = a & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
  return sign | static_cast<uint16_t>(h);
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  if (exp == 0x1f) return FromBits(sign | 0x7f800000 | (mant << 13));
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  return FromBits(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t FloatToBFloat16(float f) {
  const uint32_t x = Bits(f);
  if ((x & 0x7fffffff) > 0x7f800000) {
    return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet NaN
  }
  return static_cast<uint16_t>((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

float BFloat16ToFloat(uint16_t b) {
  return FromBits(static_cast<uint32_t>(b) << 16);
}

void ConvertElements(DType from, DType to, const char* src, size_t n,
                     char* dst) {
  const size_t in = ElementSize(from), out = ElementSize(to);
  if (from == to) {
    std::memcpy(dst, src, n * in);
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    StoreFloat(to, LoadFloat(from, src + i * in), dst + i * out);
  }
}

}  // namespace ckptd::format
