// Copyright 2026 The ckptd Authors.
//
// The streaming `.metadata` decoder: a pickle VM built for the DCP object
// graph (format/metadata/metadata_vm.h) that turns a `.metadata` into a
// CompactMetadata without ever holding the generic pickle graph.
//
// Accepts what DecodeMetadata always accepted, with the same results: every
// encoding stock PyTorch writes (protocols 2–5, NEWOBJ+BUILD and REDUCE
// forms, both TensorProperties modules, the memory-format enum by value or
// via getattr, pathlib in `pathlib` or `pathlib._local`, unknown globals in
// planner_data / storage_meta, duplicate dict keys with Python's dict
// semantics) and ckptd's own. The schema walk is the old decoder's, so its
// errors name the same paths ("/c/.metadata: state_dict_metadata['w']
// .chunks[3].offsets: expected torch.Size, got ..."), here with the byte
// offset of the offending object in the pickle; pickle-level errors name the
// byte offset and opcode as pickle::Parse does.
//
// Cost: two passes over the input (the first lists the memo slots the
// program reads back, so the second stores only those), linear time, and
// memory proportional to the result (~100 bytes per 2-d chunk with its
// storage entry) plus the largest single container that cannot be folded.
// Bounds as pickle::Parse's defaults (1 GiB strings, 2^20 stack values, 4096
// MARKs, 2^26 memo slots) and DecodeOptions::max_alloc_bytes for everything
// the decoder allocates.
#ifndef CKPTD_FORMAT_METADATA_METADATA_DECODE_H_
#define CKPTD_FORMAT_METADATA_METADATA_DECODE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/env.h"
#include "format/metadata/compact_metadata.h"
#include "format/metadata/metadata.h"

namespace ckptd::format {

struct DecodeStats {
  uint64_t input_bytes = 0;
  uint64_t allocated_bytes = 0;  // accounted against max_alloc_bytes
  uint64_t memo_slots = 0;       // distinct slots the program used
  uint64_t memo_stored = 0;      // of which referenced (kept)
  uint64_t buffer_bytes = 0;     // input buffer (streaming from a file)
  // Taken by the VM's fast paths (metadata_vm_fast.cc): DCP objects in
  // runs, torch.Size sequences on their own.
  uint64_t fast_objects = 0;
  uint64_t fast_sizes = 0;
};

// Decodes a `.metadata` held in memory.
absl::StatusOr<CompactMetadata> DecodeCompactMetadata(
    std::string_view data, const DecodeOptions& options = {},
    DecodeStats* stats = nullptr);

// Decodes a `.metadata` file streaming it in blocks of `block_bytes` (the
// file is read twice; never held whole). options.source_name defaults to
// `path` when left at ".metadata". I/O errors are the Env's; a file larger
// than max_file_bytes is RESOURCE_EXHAUSTED.
struct ReadMetadataOptions {
  DecodeOptions decode;
  uint64_t max_file_bytes = uint64_t{16} << 30;
  size_t block_bytes = size_t{4} << 20;
};
absl::StatusOr<CompactMetadata> ReadCompactMetadata(
    Env* env, const std::string& path, const ReadMetadataOptions& options = {},
    DecodeStats* stats = nullptr);

}  // namespace ckptd::format

#endif  // CKPTD_FORMAT_METADATA_METADATA_DECODE_H_
