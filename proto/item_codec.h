// Copyright 2026 The ckptd Authors.
//
// The item fields trainers (daemon.proto Item, in a SaveRequest) and peer
// daemons (peer.proto ItemKind, in a node's index) describe alike — fqn,
// type, dtype, global shape, planner path — decoded and encoded by one set
// of rules: a dtype name with or without "torch.", at most 64 dimensions,
// a path of at most 256 elements each a key or an index, no shape on a
// bytes item, an fqn of at most 4096 bytes (an empty fqn is the
// validator's to refuse: staging/save_validator.h names the rank).
//
// Syntax only; the boxes (chunk offsets and sizes) and byte counts are the
// caller's. Header-only templates over the two generated message types.
#ifndef CKPTD_PROTO_ITEM_CODEC_H_
#define CKPTD_PROTO_ITEM_CODEC_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "ckptd/v1/daemon.pb.h"
#include "fmt/format.h"
#include "format/plan/save_plan.h"
#include "format/tensor/dtype.h"

namespace ckptd::daemon {

inline constexpr size_t kMaxFqnBytes = 4096;
inline constexpr int kMaxItemDims = 64;
inline constexpr int kMaxPathElements = 256;

// Item or ItemKind → ItemDesc (global_shape, not the box).
template <typename ItemProto>
absl::StatusOr<format::ItemDesc> DecodeItemFields(const ItemProto& in,
                                                  std::string_view where) {
  namespace pb = ::ckptd::v1;
  format::ItemDesc d;
  d.fqn = in.fqn();
  if (d.fqn.size() > kMaxFqnBytes) {
    return absl::InvalidArgumentError(
        fmt::format("{}: fqn is {} bytes; the limit is {}", where, d.fqn.size(),
                    kMaxFqnBytes));
  }
  switch (in.type()) {
    case pb::ITEM_TYPE_TENSOR: {
      d.type = format::ItemDesc::Type::kTensor;
      std::string_view name = in.dtype();
      if (name.substr(0, 6) == "torch.") name.remove_prefix(6);
      absl::StatusOr<format::DType> dt = format::DTypeFromName(name);
      if (!dt.ok()) {
        return absl::InvalidArgumentError(
            fmt::format("item '{}': unknown dtype '{}'", d.fqn, in.dtype()));
      }
      d.dtype = *dt;
      break;
    }
    case pb::ITEM_TYPE_BYTES:
      d.type = format::ItemDesc::Type::kBytes;
      if (in.global_shape_size() > 0) {
        return absl::InvalidArgumentError(
            fmt::format("item '{}': a BYTES item has no shape", d.fqn));
      }
      break;
    default:
      return absl::InvalidArgumentError(
          fmt::format("item '{}': type {} is not TENSOR or BYTES", d.fqn,
                      static_cast<int>(in.type())));
  }
  if (in.global_shape_size() > kMaxItemDims) {
    return absl::InvalidArgumentError(
        fmt::format("item '{}': more than {} dimensions", d.fqn, kMaxItemDims));
  }
  d.global_shape.assign(in.global_shape().begin(), in.global_shape().end());
  if (in.path_size() > kMaxPathElements) {
    return absl::InvalidArgumentError(
        fmt::format("item '{}': path deeper than {}", d.fqn, kMaxPathElements));
  }
  for (const pb::PathElement& e : in.path()) {
    if (e.has_key()) {
      d.path.emplace_back(e.key());
    } else if (e.has_index()) {
      d.path.emplace_back(e.index());
    } else {
      return absl::InvalidArgumentError(
          fmt::format("item '{}': empty path element", d.fqn));
    }
  }
  return d;
}

// ItemDesc → Item or ItemKind (global_shape, not the box).
template <typename ItemProto>
void EncodeItemFields(const format::ItemDesc& d, ItemProto* out) {
  namespace pb = ::ckptd::v1;
  out->set_fqn(d.fqn);
  if (d.type == format::ItemDesc::Type::kTensor) {
    out->set_type(pb::ITEM_TYPE_TENSOR);
    out->set_dtype(std::string(format::DTypeName(d.dtype)));
  } else {
    out->set_type(pb::ITEM_TYPE_BYTES);
  }
  for (int64_t v : d.global_shape) out->add_global_shape(v);
  for (const format::PathElement& e : d.path) {
    if (const auto* s = std::get_if<std::string>(&e)) {
      out->add_path()->set_key(*s);
    } else {
      out->add_path()->set_index(std::get<int64_t>(e));
    }
  }
}

}  // namespace ckptd::daemon

#endif  // CKPTD_PROTO_ITEM_CODEC_H_
