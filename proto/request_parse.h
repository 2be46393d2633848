// Copyright 2026 The ckptd Authors.
//
// Decoding a request's bytes at a gRPC boundary: the daemon's service
// (daemon/service/) and its peer port (daemon/cluster/peer_server.cc) take
// their requests as raw bytes and parse them here, because gRPC answers a
// request it cannot parse — a string field that is not UTF-8, or bytes
// that are no protobuf at all — with a bare UNIMPLEMENTED and an empty
// message, which tells the caller nothing. Here such a request is the
// caller's bad input: INVALID_ARGUMENT naming the message and, for a
// string that is not UTF-8, the field and the byte
// ("ckptd.v1.SaveRequest: items[2].fqn (at byte 5) is not valid UTF-8").
#ifndef CKPTD_PROTO_REQUEST_PARSE_H_
#define CKPTD_PROTO_REQUEST_PARSE_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/byte_buffer.h"

namespace ckptd {

// Parses `in` into `msg` (cleared first). INVALID_ARGUMENT as above when it
// is not a valid message of msg's type.
absl::Status ParseRequest(const grpc::ByteBuffer& in,
                          google::protobuf::Message* msg);

// The path of the first string field of `bytes` (an encoded message of
// type `type`, nested messages included) that is not valid UTF-8, with the
// offset of its first bad byte ("options.compression (at byte 3)"), or ""
// when every string is valid (or the bytes are too broken to walk).
std::string FirstNonUtf8Field(const google::protobuf::Descriptor& type,
                              std::string_view bytes);

// Serializes `msg` into `out` (the raw response). INTERNAL if it cannot.
absl::Status SerializeResponse(const google::protobuf::Message& msg,
                               grpc::ByteBuffer* out);

}  // namespace ckptd

#endif  // CKPTD_PROTO_REQUEST_PARSE_H_
