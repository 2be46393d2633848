// Copyright 2026 The ckptd Authors.
//
// FetchShare's answer on the wire (peer.proto FetchShareResponse: field 1
// `data`, field 2 `crc32`), written and read without protobuf's copies: the
// holder hands gRPC the held file's own bytes as a slice (no copy, the
// slice keeps the file), the asker decodes the slices it received straight
// into the restore's buffer, taking the CRC-32 in the same pass. The bytes
// are those a FetchShareResponse with the same fields serializes to, so a
// stock protobuf reader reads them too.
//
// Internal to daemon/cluster/ (peer_server.cc, share_link.cc). Pure
// functions; thread-safe.
#ifndef CKPTD_DAEMON_CLUSTER_SHARE_WIRE_H_
#define CKPTD_DAEMON_CLUSTER_SHARE_WIRE_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "daemon/tier/memory_tier.h"
#include "grpcpp/support/byte_buffer.h"

namespace ckptd::daemon {

// The answer for [data, data + size) with its CRC-32: `data` lies in
// `file`'s mapping (kept until gRPC is done with it), or, with `file`
// null, anywhere (copied).
grpc::ByteBuffer EncodeFetchAnswer(std::shared_ptr<const TierFileBytes> file,
                                   const char* data, uint64_t size,
                                   uint32_t crc32);

// Decodes an answer of `length` data bytes into `dst`: OK once the data
// and its CRC-32 are there and match; DATA_LOSS ("size or CRC-32
// mismatch", "malformed") otherwise (`dst` may then hold part of it).
absl::Status DecodeFetchAnswer(grpc::ByteBuffer& answer, uint64_t length,
                               char* dst);

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_CLUSTER_SHARE_WIRE_H_
