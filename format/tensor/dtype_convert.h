// Copyright 2026 The ckptd Authors.
//
// Element conversion between the floating dtypes an export may ask for
// (float64, float32, float16, bfloat16), rounding to nearest, ties to even,
// as torch's Tensor.to does: NaN stays NaN (quiet), overflow becomes
// infinity, float16 subnormals are kept. float64 goes through float32 first
// (a second rounding, which can differ from a direct conversion in the last
// bit for values exactly between two float32 halves).
#ifndef CKPTD_FORMAT_TENSOR_DTYPE_CONVERT_H_
#define CKPTD_FORMAT_TENSOR_DTYPE_CONVERT_H_

#include <cstddef>
#include <cstdint>

#include "format/tensor/dtype.h"

namespace ckptd::format {

// float64, float32, float16, bfloat16.
bool IsConvertibleFloat(DType dtype);

// One float32 to float16 / bfloat16 bits and back.
uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);
uint16_t FloatToBFloat16(float f);
float BFloat16ToFloat(uint16_t b);

// Converts `n` elements of `from` at `src` into `to` at `dst` (n *
// ElementSize(to) bytes). Both must be IsConvertibleFloat, or equal.
void ConvertElements(DType from, DType to, const char* src, size_t n,
                     char* dst);

}  // namespace ckptd::format

#endif  // CKPTD_FORMAT_TENSOR_DTYPE_CONVERT_H_
