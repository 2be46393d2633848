// Copyright 2026 The ckptd Authors.
//
// libFuzzer target for the streaming `.metadata` decoder
// (format/metadata/metadata_decode.h), differential against the generic-VM decoder
// it replaced (DecodeMetadataGeneric): on every input both must succeed
// with the same Metadata, or both fail with the same status code (pickle-
// level errors at the same byte offset and opcode); only an allocation
// limit hit by one of them (they account memory differently) ends the
// comparison. On success the CompactMetadata is exercised too: the model
// and back (FromMetadata/ToMetadata), chunk lookups by box, storage
// lookups by key. Seed corpus: tests/fuzz/corpus/metadata/ (ckptd's own
// encodings and stock torch 2.6 / 2.14 `.metadata` files).
//
//   build-fuzz/fuzz/metadata_fuzz -max_total_time=60 tests/fuzz/corpus/metadata
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "format/metadata/compact_metadata.h"
#include "format/metadata/metadata.h"
#include "format/metadata/metadata_decode.h"

namespace {

using ckptd::format::CompactMetadata;
using ckptd::format::Metadata;

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

bool Same(const Metadata& a, const Metadata& b) {
  if (a.state_dict_metadata != b.state_dict_metadata) return false;
  if (a.planner_data != b.planner_data) return false;
  if (a.storage_data != b.storage_data) return false;
  if (a.storage_meta != b.storage_meta) return false;
  return a.version == b.version;
}

// "<src>: offset N: opcode 0x.. 'c' (NAME): " of a pickle-level error, or
// empty.
std::string OpPrefix(const absl::Status& s) {
  const std::string m(s.message());
  const size_t at = m.find(": offset ");
  if (at == std::string::npos) return {};
  const size_t op = m.find("): ", at);
  return op == std::string::npos ? std::string() : m.substr(0, op + 3);
}

void Exercise(const CompactMetadata& md) {
  Check(Same(CompactMetadata::FromMetadata(md.ToMetadata()).ToMetadata(),
             md.ToMetadata()));
  std::vector<uint32_t> hits;
  for (size_t i = 0; i < md.num_items() && i < 64; ++i) {
    if (!md.item(i).tensor) {
      (void)md.bytes_storage(i);
      continue;
    }
    const auto shape = md.shape(i);
    std::vector<int64_t> off(shape.size()), size(shape.begin(), shape.end());
    hits.clear();
    md.OverlappingChunks(i, off, size, &hits);
    for (size_t j = 0; j < md.item(i).num_chunks && j < 64; ++j) {
      const auto* s = md.chunk_storage(i, j);
      if (s != nullptr) Check(md.FindStorage(md.Key(*s)) == s);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  ckptd::format::DecodeOptions options;
  options.max_alloc_bytes = 64 << 20;
  options.source_name = "fuzz";
  auto compact = ckptd::format::DecodeCompactMetadata(input, options);
  auto ref = ckptd::format::DecodeMetadataGeneric(input, options);
  for (const absl::Status* s : {&compact.status(), &ref.status()}) {
    if (!s->ok() && !absl::IsInvalidArgument(*s) &&
        !absl::IsResourceExhausted(*s)) {
      __builtin_trap();  // only these two codes exist for bad input
    }
  }
  if (absl::IsResourceExhausted(compact.status()) ||
      absl::IsResourceExhausted(ref.status())) {
    return 0;
  }
  Check(compact.ok() == ref.ok());
  if (!ref.ok()) {
    Check(OpPrefix(compact.status()) == OpPrefix(ref.status()));
    return 0;
  }
  Check(Same(compact->ToMetadata(), *ref));
  Exercise(*compact);
  return 0;
}
