// Copyright 2026 The ckptd Authors.
//
// The reader half of the C ABI (client/ckptd_c.h): ckptd_reader_* over
// ckptd::format::CheckpointReader. No daemon is involved.
//
// Error codes follow the header rather than the format library's own
// numbering: everything about the caller's request is checked here first
// (NOT_FOUND for an unknown fqn, INVALID_ARGUMENT for the rest), so that what
// the library reports afterwards can only come from the files, and its
// INVALID_ARGUMENT (unparsable payload), OUT_OF_RANGE (truncated file) and
// NOT_FOUND (missing data file) become DATA_LOSS.
#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "client/c_abi_util.h"
#include "client/ckptd_c.h"
#include "client/info_json.h"
#include "common/absl_fmt.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "format/checkpoint/checkpoint_reader.h"
#include "format/metadata/compact_metadata.h"
#include "format/tensor/dtype.h"
#include "format/metadata/metadata.h"
#include "format/metadata/metadata_json.h"
#include "format/plan/save_plan.h"
#include "nlohmann/json.hpp"

struct ckptd_reader {
  std::unique_ptr<ckptd::format::CheckpointReader> reader;
  std::string dir;  // absolute, symlinks resolved
};

namespace ckptd::client {
namespace {

using json = nlohmann::ordered_json;

// Most dimensions a request may have (as ckptd_item).
constexpr int32_t kMaxDims = 64;

// A status of the same message whose code is DATA_LOSS when `s` (from the
// format library, after the request was validated here) blames the files:
// an unparsable payload or .metadata, a short read, a missing data file.
absl::Status AsDataLoss(const absl::Status& s) {
  if (absl::IsInvalidArgument(s) || absl::IsOutOfRange(s) ||
      absl::IsNotFound(s)) {
    return absl::DataLossError(s.message());
  }
  return s;
}

// `dir` made absolute with symlinks resolved; NOT_FOUND when it does not
// exist or is not a directory.
absl::StatusOr<std::string> ResolveDir(const char* dir) {
  struct stat st;
  if (::stat(dir, &st) != 0) {
    const int err = errno;
    const std::string what =
        fmt::format("checkpoint directory {}: {}", dir, std::strerror(err));
    if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(what);
    if (err == EACCES || err == EPERM) {
      return absl::PermissionDeniedError(what);
    }
    return absl::UnknownError(what);
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::NotFoundError(fmt::format(
        "checkpoint directory {}: not a directory (a checkpoint is a "
        "directory holding .metadata)",
        dir));
  }
  char* resolved = ::realpath(dir, nullptr);
  if (resolved == nullptr) {
    return absl::UnknownError(
        fmt::format("realpath {}: {}", dir, std::strerror(errno)));
  }
  std::string out(resolved);
  ::free(resolved);
  return out;
}

// Converts and validates request `i` against the checkpoint's metadata:
// everything the caller can get wrong except coverage by saved chunks.
absl::Status ToTensorRequest(const format::CheckpointReader& reader, size_t i,
                             const ckptd_read_request& c,
                             format::TensorRequest* out) {
  if (c.fqn == nullptr) {
    return absl::InvalidArgumentError(
        fmt::format("request {}: fqn is NULL", i));
  }
  const std::string fqn = c.fqn;
  auto bad = [&](std::string_view what) {
    return absl::InvalidArgumentError(
        fmt::format("request {} ('{}'): {}", i, fqn, what));
  };
  const format::CompactMetadata& md = reader.compact();
  const std::optional<size_t> index = md.FindItem(fqn);
  if (!index.has_value()) {
    return absl::NotFoundError(fmt::format(
        "request {}: no item '{}' in checkpoint {}", i, fqn, reader.dir()));
  }
  if (!md.item(*index).tensor) {
    return bad(
        "the checkpoint holds a bytes item, not a tensor (read it with "
        "ckptd_reader_read_bytes)");
  }
  const format::DType saved_dtype = md.item(*index).properties.dtype;
  const absl::Span<const int64_t> saved_shape = md.shape(*index);
  const char* dtype_name = c.dtype != nullptr ? c.dtype : "float32";
  auto dtype = format::DTypeFromName(dtype_name);
  if (!dtype.ok()) {
    return bad(fmt::format("unknown dtype '{}'", dtype_name));
  }
  if (*dtype != saved_dtype) {
    return bad(fmt::format(
        "the checkpoint holds {} but the destination is {} (convert on the "
        "caller's side)",
        format::DTypeName(saved_dtype), format::DTypeName(*dtype)));
  }
  if (c.ndim < 0 || c.ndim > kMaxDims) {
    return bad(fmt::format("ndim {} is not in [0, 64]", c.ndim));
  }
  const size_t nd = static_cast<size_t>(c.ndim);
  if (nd != saved_shape.size()) {
    return bad(fmt::format("ndim {} but the saved tensor has {} dimensions", nd,
                           saved_shape.size()));
  }
  if (nd > 0 && c.sizes == nullptr) return bad("sizes is NULL");
  out->fqn = fqn;
  out->dest.dtype = *dtype;
  out->dest.sizes.assign(c.sizes, c.sizes + nd);
  if (c.offsets != nullptr) {
    out->offsets.assign(c.offsets, c.offsets + nd);
  } else {
    out->offsets.assign(nd, 0);
  }
  out->dest.strides.clear();
  if (c.strides != nullptr) {
    out->dest.strides.assign(c.strides, c.strides + nd);
    for (size_t d = 0; d < nd; ++d) {
      if (out->dest.strides[d] < 0) {
        return bad(fmt::format("stride {} of dimension {} is negative",
                               out->dest.strides[d], d));
      }
    }
  }
  bool empty = false;
  for (size_t d = 0; d < nd; ++d) {
    const int64_t off = out->offsets[d], size = out->dest.sizes[d];
    if (off < 0 || size < 0 || off > saved_shape[d] ||
        size > saved_shape[d] - off) {
      return bad(fmt::format(
          "box {} is outside the saved shape {}",
          format::DescribeBox(out->offsets, out->dest.sizes),
          format::DescribeBox(std::vector<int64_t>(nd, 0), saved_shape)));
    }
    if (size == 0) empty = true;
  }
  if (c.data == nullptr && !empty) return bad("data is NULL");
  out->dest.data = static_cast<char*>(c.data);
  return absl::OkStatus();
}

// Plans and fills `requests`; *bytes_read receives what was read from files.
absl::Status Read(format::CheckpointReader& reader,
                  const ckptd_read_request* requests, size_t n,
                  uint64_t* bytes_read) {
  std::vector<format::TensorRequest> reqs(n);
  for (size_t i = 0; i < n; ++i) {
    RETURN_IF_ERROR(ToTensorRequest(reader, i, requests[i], &reqs[i]));
  }
  // What is left to the plan: boxes the saved chunks do not cover (a
  // checkpoint saved from part of a tensor) — a problem of the request.
  absl::StatusOr<std::vector<format::ReadItem>> plan = reader.PlanReads(reqs);
  if (!plan.ok()) {
    if (absl::IsDataLoss(plan.status()) || absl::IsOutOfRange(plan.status())) {
      return absl::InvalidArgumentError(plan.status().message());
    }
    return plan.status();
  }
  format::ReadStats stats;
  const absl::Status s = reader.ReadPlanned(reqs, *plan, &stats);
  *bytes_read = stats.bytes_read;
  return AsDataLoss(s);
}

}  // namespace
}  // namespace ckptd::client

using ckptd::client::internal::Fail;
using ckptd::client::internal::Guard;
using ckptd::client::internal::LastError;
using ckptd::client::internal::Ok;
using ckptd::client::internal::ReturnString;
namespace format = ::ckptd::format;

extern "C" {

int ckptd_reader_open(const char* dir, int threads, ckptd_reader** out) {
  return ckptd_reader_open_ex(dir, threads, 0, out);
}

int ckptd_reader_open_ex(const char* dir, int threads, uint32_t flags,
                         ckptd_reader** out) {
  return Guard([&] {
    CKPTD_REQUIRE(out != nullptr, "out is NULL");
    *out = nullptr;
    CKPTD_REQUIRE(dir != nullptr, "dir is NULL");
    CKPTD_REQUIRE(*dir != '\0', "dir is empty");
    CKPTD_REQUIRE((flags & ~CKPTD_READER_NO_VERIFY_CRC) == 0,
                  "unknown bits in flags");
    auto abs_dir = ckptd::client::ResolveDir(dir);
    if (!abs_dir.ok()) return Fail(abs_dir.status());
    format::CheckpointReaderOptions options;
    options.threads = threads < 1 ? 1 : threads;
    options.verify_crc = (flags & CKPTD_READER_NO_VERIFY_CRC) == 0;
    auto reader = format::CheckpointReader::Open(*abs_dir, options);
    if (!reader.ok()) {
      // No .metadata is NOT_FOUND, also for a rank-local checkpoint (only
      // __{rank}.metadata files: the reader's UNIMPLEMENTED says so); a
      // .metadata that does not decode or validate is DATA_LOSS.
      const absl::Status& s = reader.status();
      if (absl::IsInvalidArgument(s) || absl::IsOutOfRange(s)) {
        return Fail(absl::DataLossError(s.message()));
      }
      if (absl::IsUnimplemented(s)) {
        struct stat st;
        const std::string marker = *abs_dir + "/" + format::kMetadataName;
        if (::stat(marker.c_str(), &st) != 0 && errno == ENOENT) {
          return Fail(absl::NotFoundError(s.message()));
        }
      }
      return Fail(s);
    }
    *out = new ckptd_reader{*std::move(reader), *std::move(abs_dir)};
    return Ok();
  });
}

void ckptd_reader_close(ckptd_reader* reader) {
  LastError().clear();
  delete reader;
}

int ckptd_reader_metadata_json(ckptd_reader* reader, char** json_out) {
  return ckptd_reader_metadata_json_ex(reader, 0, json_out);
}

int ckptd_reader_metadata_json_ex(ckptd_reader* reader, uint32_t flags,
                                  char** json_out) {
  return Guard([&] {
    CKPTD_REQUIRE(json_out != nullptr, "json_out is NULL");
    *json_out = nullptr;
    CKPTD_REQUIRE(reader != nullptr, "reader is NULL");
    CKPTD_REQUIRE((flags & ~CKPTD_METADATA_JSON_NO_CHUNKS) == 0,
                  "unknown bits in flags");
    return ReturnString(format::MetadataJson(
                            reader->dir, reader->reader->compact(),
                            (flags & CKPTD_METADATA_JSON_NO_CHUNKS) == 0),
                        json_out);
  });
}

int ckptd_reader_chunks_json(ckptd_reader* reader, const char* fqn,
                             int32_t ndim, const int64_t* offsets,
                             const int64_t* sizes, char** json_out) {
  return Guard([&] {
    CKPTD_REQUIRE(json_out != nullptr, "json_out is NULL");
    *json_out = nullptr;
    CKPTD_REQUIRE(reader != nullptr, "reader is NULL");
    CKPTD_REQUIRE(fqn != nullptr, "fqn is NULL");
    const format::CompactMetadata& md = reader->reader->compact();
    const std::optional<size_t> i = md.FindItem(fqn);
    if (!i.has_value()) {
      return Fail(absl::NotFoundError(
          fmt::format("no item '{}' in checkpoint {}", fqn, reader->dir)));
    }
    if (!md.item(*i).tensor) {
      return Fail(absl::InvalidArgumentError(
          fmt::format("'{}' is a bytes item, not a tensor", fqn)));
    }
    std::vector<uint32_t> chunks;
    if (offsets == nullptr && sizes == nullptr) {
      chunks.resize(md.item(*i).num_chunks);
      for (uint32_t j = 0; j < chunks.size(); ++j) chunks[j] = j;
    } else {
      CKPTD_REQUIRE(offsets != nullptr && sizes != nullptr,
                    "offsets and sizes must both be given or both be NULL");
      if (ndim < 0 || static_cast<size_t>(ndim) != md.item(*i).ndim) {
        return Fail(absl::InvalidArgumentError(
            fmt::format("'{}': ndim {} but the saved tensor has {} dimensions",
                        fqn, ndim, md.item(*i).ndim)));
      }
      md.OverlappingChunks(*i, absl::MakeConstSpan(offsets, ndim),
                           absl::MakeConstSpan(sizes, ndim), &chunks);
    }
    std::string out = "[";
    for (size_t k = 0; k < chunks.size(); ++k) {
      if (k > 0) out += ',';
      out += format::DumpJson(
          format::ChunkJson(md, *i, chunks[k], /*with_storage=*/true));
    }
    out += ']';
    return ReturnString(out, json_out);
  });
}

int ckptd_reader_read(ckptd_reader* reader, const ckptd_read_request* requests,
                      size_t n, uint64_t* bytes_read_out) {
  return Guard([&] {
    if (bytes_read_out != nullptr) *bytes_read_out = 0;
    CKPTD_REQUIRE(reader != nullptr, "reader is NULL");
    CKPTD_REQUIRE(requests != nullptr || n == 0, "requests is NULL");
    uint64_t bytes_read = 0;
    const absl::Status s =
        ckptd::client::Read(*reader->reader, requests, n, &bytes_read);
    if (bytes_read_out != nullptr) *bytes_read_out = bytes_read;
    return s.ok() ? Ok() : Fail(s);
  });
}

int ckptd_reader_read_bytes(ckptd_reader* reader, const char* fqn,
                            char** data_out, uint64_t* len_out) {
  return Guard([&] {
    CKPTD_REQUIRE(data_out != nullptr, "data_out is NULL");
    *data_out = nullptr;
    CKPTD_REQUIRE(len_out != nullptr, "len_out is NULL");
    *len_out = 0;
    CKPTD_REQUIRE(reader != nullptr, "reader is NULL");
    CKPTD_REQUIRE(fqn != nullptr, "fqn is NULL");
    const format::CheckpointReader& r = *reader->reader;
    const std::optional<size_t> index = r.compact().FindItem(fqn);
    if (!index.has_value()) {
      return Fail(absl::NotFoundError(
          fmt::format("no item '{}' in checkpoint {}", fqn, r.dir())));
    }
    if (r.compact().item(*index).tensor) {
      return Fail(absl::InvalidArgumentError(
          fmt::format("'{}' is a tensor, not a bytes item (read it with "
                      "ckptd_reader_read)",
                      fqn)));
    }
    auto bytes = reader->reader->ReadBytesItem(fqn);
    if (!bytes.ok()) return Fail(ckptd::client::AsDataLoss(bytes.status()));
    const int rc = ReturnString(*bytes, data_out);
    if (rc == CKPTD_OK) *len_out = bytes->size();
    return rc;
  });
}

}  // extern "C"
