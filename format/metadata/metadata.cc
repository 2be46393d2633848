// Copyright 2026 The ckptd Authors.
//
// The plain `.metadata` model's lookups, and DecodeMetadata over the
// streaming decoder (metadata_decode.h). The encoder is metadata_encode.cc,
// the generic-VM decoder metadata_generic_decode.cc.
#include "format/metadata/metadata.h"

#include <string_view>

#include "common/status_macros.h"
#include "fmt/format.h"
#include "format/metadata/compact_metadata.h"
#include "format/metadata/metadata_decode.h"

namespace ckptd::format {

absl::StatusOr<Metadata> DecodeMetadata(std::string_view data,
                                        const DecodeOptions& options) {
  ASSIGN_OR_RETURN(CompactMetadata md, DecodeCompactMetadata(data, options));
  return md.ToMetadata();
}

void Metadata::BuildIndex() {
  sdm_index_.clear();
  sdm_index_.reserve(state_dict_metadata.size());
  for (size_t i = 0; i < state_dict_metadata.size(); ++i) {
    sdm_index_[state_dict_metadata[i].first] = i;  // last duplicate wins
  }
  storage_index_.clear();
  storage_index_.reserve(storage_data.size());
  for (size_t i = 0; i < storage_data.size(); ++i) {
    storage_index_[storage_data[i].first] = i;
  }
}

const StorageMetadata* Metadata::Find(std::string_view fqn) const {
  if (!sdm_index_.empty()) {
    auto it = sdm_index_.find(absl::string_view(fqn.data(), fqn.size()));
    if (it == sdm_index_.end()) return nullptr;
    if (it->second < state_dict_metadata.size() &&
        state_dict_metadata[it->second].first == fqn) {
      return &state_dict_metadata[it->second].second;
    }
    // Stale index (modified after BuildIndex): fall through to the scan.
  }
  for (auto it = state_dict_metadata.rbegin(); it != state_dict_metadata.rend();
       ++it) {
    if (it->first == fqn) return &it->second;
  }
  return nullptr;
}

const StorageInfo* Metadata::FindStorage(const StorageKey& key) const {
  if (!storage_index_.empty()) {
    auto it = storage_index_.find(key);
    if (it == storage_index_.end()) return nullptr;
    if (it->second < storage_data.size() &&
        storage_data[it->second].first == key) {
      return &storage_data[it->second].second;
    }
  }
  for (auto it = storage_data.rbegin(); it != storage_data.rend(); ++it) {
    if (it->first == key) return &it->second;
  }
  return nullptr;
}

std::string DescribeKey(const StorageKey& key) {
  if (!key.has_offset) return key.fqn;
  return fmt::format("{}@({})", key.fqn, fmt::join(key.offset, ", "));
}

}  // namespace ckptd::format
