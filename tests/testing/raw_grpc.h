// Copyright 2026 The ckptd Authors.
//
// Sending a gRPC request as raw bytes, past protobuf's serializer: how a
// test plays a client whose request the server cannot parse (a string
// field that is not UTF-8, bytes that are no protobuf at all). Header-only:
// only the tests that link gRPC include it.
#ifndef CKPTD_TESTS_TESTING_RAW_GRPC_H_
#define CKPTD_TESTS_TESTING_RAW_GRPC_H_

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_replace.h"
#include "google/protobuf/message.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace ckptd::testing {

// The status of unary method `path` ("/ckptd.v1.CheckpointDaemon/Save")
// called over `channel` with request bytes `bytes` and the given metadata;
// the deadline is 30 s.
inline grpc::Status RawUnaryCall(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& path,
    const std::string& bytes,
    const std::vector<std::pair<std::string, std::string>>& metadata = {}) {
  grpc::GenericStub generic(channel);
  grpc::Slice slice(bytes);
  grpc::ByteBuffer req(&slice, 1);
  grpc::ByteBuffer resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  for (const auto& [key, value] : metadata) ctx.AddMetadata(key, value);
  std::promise<grpc::Status> done;
  generic.UnaryCall(&ctx, path, grpc::StubOptions(), &req, &resp,
                    [&](grpc::Status s) { done.set_value(std::move(s)); });
  return done.get_future().get();
}

// The placeholder PoisonUtf8 replaces, and what it puts there: "ok", two
// bytes that are not UTF-8, "ok!" (the first bad byte is at offset 2 of
// the placeholder's place).
inline constexpr char kBadUtf8Placeholder[] = "@@BAD@@";

// `m` serialized, with every kBadUtf8Placeholder in its strings made
// invalid UTF-8.
inline std::string PoisonUtf8(const google::protobuf::Message& m) {
  return absl::StrReplaceAll(m.SerializeAsString(),
                             {{kBadUtf8Placeholder, "ok\xff\xfeok!"}});
}

}  // namespace ckptd::testing

#endif  // CKPTD_TESTS_TESTING_RAW_GRPC_H_
