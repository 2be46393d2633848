// Copyright 2026 The ckptd Authors.
//
// A whole tensor of a checkpoint, read in C order as consecutive slabs of
// bounded size: what the converters (torch.save, safetensors) stream out,
// so their memory is bounded by the block, not by the tensor.
#ifndef CKPTD_FORMAT_TENSOR_TENSOR_SLABS_H_
#define CKPTD_FORMAT_TENSOR_TENSOR_SLABS_H_

#include <cstdint>
#include <functional>
#include <string_view>

#include "absl/status/status.h"
#include "format/checkpoint/checkpoint_reader.h"

namespace ckptd::format {

// Calls `sink` with consecutive pieces of tensor `fqn`'s bytes in C order
// (its saved dtype), each at most `block_bytes` unless one innermost row is
// larger. Nothing for a tensor with a zero-sized dimension. Errors: the
// reader's (NOT_FOUND for an unknown fqn) or the sink's.
absl::Status StreamTensorSlabs(
    CheckpointReader& reader, std::string_view fqn, uint64_t block_bytes,
    const std::function<absl::Status(std::string_view)>& sink);

}  // namespace ckptd::format

#endif  // CKPTD_FORMAT_TENSOR_TENSOR_SLABS_H_
