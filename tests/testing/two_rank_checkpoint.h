// Copyright 2026 The ckptd Authors.
//
// A small checkpoint written by ckptd's format writer for read-path tests:
// "w" float32 [64, 32] (value 0.5 * i at flat index i) saved as two row
// chunks by two ranks, plus the bytes item "optim.param_groups" (a
// torch.save archive of plain values) on rank 0.
#ifndef CKPTD_TESTS_TESTING_TWO_RANK_CHECKPOINT_H_
#define CKPTD_TESTS_TESTING_TWO_RANK_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "format/checkpoint/checkpoint_reader.h"
#include "format/metadata/metadata.h"

namespace ckptd::testing {

struct TwoRankCheckpoint {
  static constexpr int64_t kRows = 64, kCols = 32;
  std::vector<float> data;  // the whole of "w", row-major
  std::string groups;       // the payload of "optim.param_groups"
  format::Metadata metadata;
};

absl::StatusOr<TwoRankCheckpoint> WriteTwoRankCheckpoint(
    const std::string& dir);

// Reads the box [off, off + size) of "w" into `out` (filled with -1 first),
// C-order or with element `strides` (a transposed destination).
absl::Status ReadBoxOfW(format::CheckpointReader& reader,
                        std::vector<int64_t> off, std::vector<int64_t> size,
                        std::vector<int64_t> strides, std::vector<float>* out);

}  // namespace ckptd::testing

#endif  // CKPTD_TESTS_TESTING_TWO_RANK_CHECKPOINT_H_
