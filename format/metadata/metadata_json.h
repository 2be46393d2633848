// Copyright 2026 The ckptd Authors.
//
// The JSON form of a checkpoint's metadata, one implementation for every
// face that prints it: the client library's ckptd_reader_metadata_json(_ex)
// and the daemon's GetRestoreIndex (restore/). Written entry by entry, so a
// 2-million-chunk checkpoint never becomes one JSON tree.
#ifndef CKPTD_FORMAT_METADATA_METADATA_JSON_H_
#define CKPTD_FORMAT_METADATA_METADATA_JSON_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "format/metadata/compact_metadata.h"
#include "format/metadata/metadata.h"
#include "nlohmann/json.hpp"

namespace ckptd::format {

// dump() that cannot throw: invalid UTF-8 is replaced. indent < 0: one line.
std::string DumpJson(const nlohmann::ordered_json& j, int indent = -1);

// A planner_data path (DCP's OBJ_PATH: string keys and int indices) as a
// JSON array.
nlohmann::ordered_json PathToJson(const std::vector<PathElement>& path);

// Chunk j of tensor item i: {"offsets", "sizes"} (+ "file", "offset",
// "length" of its payload with `with_storage`).
nlohmann::ordered_json ChunkJson(const CompactMetadata& md, size_t i, size_t j,
                                 bool with_storage);

// {"dir", "version", "entries": [...], "planner_data"}: tensor entries
// {"fqn", "type": "tensor", "dtype", "size", "chunks": [ChunkJson...]} —
// or "num_chunks" instead of "chunks" without `chunks` —, bytes entries
// {"fqn", "type": "bytes"} plus "nbytes" (the payload length; -1 for an
// item without a storage entry) with `bytes_sizes`; `decoded_sizes`
// (item index → bytes) replaces the stored length of items whose payload is
// stored with a transform (zstd), whose size only decoding tells.
std::string MetadataJson(
    const std::string& dir, const CompactMetadata& md, bool chunks,
    bool bytes_sizes = false,
    const absl::flat_hash_map<size_t, int64_t>* decoded_sizes = nullptr);

}  // namespace ckptd::format

#endif  // CKPTD_FORMAT_METADATA_METADATA_JSON_H_
