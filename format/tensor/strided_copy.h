// Copyright 2026 The ckptd Authors.
//
// Copies an N-d box of fixed-size elements between two strided layouts: the
// gather of a non-contiguous tensor view into C order (tensor_payload.cc), and
// the scatter of a saved chunk into a differently sharded destination
// (resharding reader).
#ifndef CKPTD_FORMAT_TENSOR_STRIDED_COPY_H_
#define CKPTD_FORMAT_TENSOR_STRIDED_COPY_H_

#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"

namespace ckptd::format {

// Copies the box of `sizes` elements of `elem_size` bytes each: element
// (i_0, ..., i_{n-1}) is read at src + elem_size * sum_k(i_k * src_strides[k])
// and written at dst + elem_size * sum_k(i_k * dst_strides[k]). Strides are
// in elements and may be any values (0 broadcasts on the source side). A box
// with a 0 size copies nothing; an empty `sizes` (0-d) copies one element.
//
// Dimensions are reordered and merged internally so that runs contiguous in
// both layouts are copied with memcpy; transposes are copied in cache tiles.
//
// REQUIRES: the three spans have equal length; sizes >= 0; the destination
// elements are distinct and do not overlap the source.
void StridedCopy(size_t elem_size, absl::Span<const int64_t> sizes,
                 const char* src, absl::Span<const int64_t> src_strides,
                 char* dst, absl::Span<const int64_t> dst_strides);

// Whether `strides` (in elements) lay `sizes` out in C order: empty strides
// are; dimensions of size 1 may have any stride. The one definition for the
// writer (TensorView) and the client library (batching).
bool IsCContiguous(absl::Span<const int64_t> sizes,
                   absl::Span<const int64_t> strides);

}  // namespace ckptd::format

#endif  // CKPTD_FORMAT_TENSOR_STRIDED_COPY_H_
