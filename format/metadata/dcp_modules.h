// Copyright 2026 The ckptd Authors.
//
// The Python modules of the classes a DCP `.metadata` pickle names
// (docs: ../shared/docs/dcp-format.md): what the encoder writes and the
// decoders accept.
#ifndef CKPTD_FORMAT_METADATA_DCP_MODULES_H_
#define CKPTD_FORMAT_METADATA_DCP_MODULES_H_

#include <string_view>

namespace ckptd::format {

// Metadata, TensorStorageMetadata, ChunkStorageMetadata, TensorProperties,
// BytesStorageMetadata, MetadataIndex.
inline constexpr std::string_view kMetadataModule =
    "torch.distributed.checkpoint.metadata";
// Where torch before 2.0 pickled TensorProperties from.
inline constexpr std::string_view kShardModule =
    "torch.distributed._shard.sharded_tensor.metadata";
// _StorageInfo, the value type of Metadata.storage_data.
inline constexpr std::string_view kFilesystemModule =
    "torch.distributed.checkpoint.filesystem";

}  // namespace ckptd::format

#endif  // CKPTD_FORMAT_METADATA_DCP_MODULES_H_
