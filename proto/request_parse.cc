// Copyright 2026 The ckptd Authors.
#include "proto/request_parse.h"

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/names.h"
#include "fmt/format.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/slice.h"

namespace ckptd {
namespace {

namespace pb = ::google::protobuf;
using pb::internal::WireFormatLite;

// Nested messages deeper than this are not walked (protobuf's own parser
// refuses recursion past 100).
constexpr int kMaxDepth = 32;

std::string Walk(const pb::Descriptor& type, std::string_view bytes,
                 const std::string& prefix, int depth) {
  pb::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                              static_cast<int>(bytes.size()));
  absl::flat_hash_map<int, int> seen;  // field number → occurrences so far
  while (const uint32_t tag = in.ReadTag()) {
    const int number = static_cast<int>(WireFormatLite::GetTagFieldNumber(tag));
    if (WireFormatLite::GetTagWireType(tag) !=
        WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      if (!WireFormatLite::SkipField(&in, tag)) return "";
      continue;
    }
    uint32_t length = 0;
    std::string value;
    if (!in.ReadVarint32(&length) ||
        !in.ReadString(&value, static_cast<int>(length))) {
      return "";
    }
    const pb::FieldDescriptor* field = type.FindFieldByNumber(number);
    if (field == nullptr) continue;  // unknown: kept, not checked
    const int index = seen[number]++;
    const std::string name =
        field->is_repeated()
            ? fmt::format("{}{}[{}]", prefix, field->name(), index)
            : prefix + field->name();
    if (field->type() == pb::FieldDescriptor::TYPE_STRING) {
      if (const size_t bad = FirstInvalidUtf8(value);
          bad != std::string_view::npos) {
        return fmt::format("{} (at byte {})", name, bad);
      }
    } else if (field->type() == pb::FieldDescriptor::TYPE_MESSAGE &&
               depth < kMaxDepth) {
      std::string inner =
          Walk(*field->message_type(), value, name + ".", depth + 1);
      if (!inner.empty()) return inner;
    }
  }
  return "";
}

}  // namespace

std::string FirstNonUtf8Field(const pb::Descriptor& type,
                              std::string_view bytes) {
  return Walk(type, bytes, "", 0);
}

absl::Status ParseRequest(const grpc::ByteBuffer& in, pb::Message* msg) {
  msg->Clear();
  // Parsed from a copy (the slices are shared, not copied): Deserialize
  // consumes its buffer, and the original is walked if it fails.
  grpc::ByteBuffer copy(in);
  if (grpc::SerializationTraits<pb::Message>::Deserialize(&copy, msg).ok()) {
    return absl::OkStatus();
  }
  msg->Clear();
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (in.Valid() && in.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  const std::string field = FirstNonUtf8Field(*msg->GetDescriptor(), bytes);
  if (!field.empty()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: {} is not valid UTF-8 (string fields must be)",
                    msg->GetTypeName(), field));
  }
  return absl::InvalidArgumentError(
      fmt::format("the {}-byte request is not a valid {} (malformed protobuf)",
                  bytes.size(), msg->GetTypeName()));
}

absl::Status SerializeResponse(const pb::Message& msg, grpc::ByteBuffer* out) {
  bool own_buffer = false;
  const grpc::Status s =
      grpc::SerializationTraits<pb::Message>::Serialize(msg, out, &own_buffer);
  if (!s.ok()) {
    return absl::InternalError(fmt::format("could not serialize the {}: {}",
                                           msg.GetTypeName(),
                                           s.error_message()));
  }
  return absl::OkStatus();
}

}  // namespace ckptd
