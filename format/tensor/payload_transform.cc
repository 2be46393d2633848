// Copyright 2026 The ckptd Authors.
#include "format/tensor/payload_transform.h"

#include <zstd.h>

#include <algorithm>
#include <charconv>
#include <utility>

#include "common/absl_fmt.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "format/tensor/dtype.h"

namespace ckptd::format {
namespace {

constexpr uint64_t kInputBlock = uint64_t{1} << 20;
constexpr uint64_t kFirstOutput = uint64_t{64} << 10;

struct DCtxFree {
  void operator()(ZSTD_DCtx* c) const { ZSTD_freeDCtx(c); }
};
struct CCtxFree {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};

// Makes room for more output: doubles the buffer, up to max + 1 bytes (one
// past the limit, so that exceeding it is seen).
absl::Status Grow(std::string& out, uint64_t max, std::string_view where) {
  if (out.size() > max) {
    return absl::ResourceExhaustedError(fmt::format(
        "{}: zstd payload decodes to more than {} bytes", where, max));
  }
  const uint64_t want =
      std::max<uint64_t>(kFirstOutput, uint64_t{out.size()} * 2);
  out.resize(std::min<uint64_t>(want, max + 1));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ZstdDecode(const RandomAccessFile* file,
                                       uint64_t offset, uint64_t length,
                                       uint64_t max, std::string_view where) {
  if (length == 0) {
    return absl::DataLossError(
        fmt::format("{}: empty zstd payload (no frame)", where));
  }
  std::unique_ptr<ZSTD_DCtx, DCtxFree> ctx(ZSTD_createDCtx());
  if (ctx == nullptr) {
    return absl::ResourceExhaustedError("ZSTD_createDCtx failed");
  }
  std::string in(std::min(length, kInputBlock), '\0');
  std::string out;
  size_t produced = 0;
  size_t pending = 1;  // ZSTD_decompressStream's hint: 0 once a frame ended
  for (uint64_t consumed = 0; consumed < length;) {
    const size_t n = std::min<uint64_t>(in.size(), length - consumed);
    RETURN_IF_ERROR(file->ReadExact(offset + consumed, n, in.data()));
    if (consumed == 0) {
      // The first frame's header may carry the decoded size.
      const unsigned long long size = ZSTD_getFrameContentSize(in.data(), n);
      if (size != ZSTD_CONTENTSIZE_UNKNOWN && size != ZSTD_CONTENTSIZE_ERROR &&
          size <= max) {
        out.resize(static_cast<size_t>(size) + 1);
      }
    }
    consumed += n;
    ZSTD_inBuffer ib{in.data(), n, 0};
    while (ib.pos < ib.size) {
      if (produced == out.size()) RETURN_IF_ERROR(Grow(out, max, where));
      ZSTD_outBuffer ob{out.data(), out.size(), produced};
      pending = ZSTD_decompressStream(ctx.get(), &ob, &ib);
      if (ZSTD_isError(pending)) {
        return absl::DataLossError(fmt::format(
            "{}: corrupt zstd payload near stored byte {}: {}", where,
            consumed - n + ib.pos, ZSTD_getErrorName(pending)));
      }
      produced = ob.pos;
    }
  }
  // Output the decoder still holds (its buffer was full when the input
  // ran out).
  while (pending != 0) {
    if (produced == out.size()) RETURN_IF_ERROR(Grow(out, max, where));
    ZSTD_inBuffer ib{nullptr, 0, 0};
    ZSTD_outBuffer ob{out.data(), out.size(), produced};
    pending = ZSTD_decompressStream(ctx.get(), &ob, &ib);
    if (ZSTD_isError(pending)) {
      return absl::DataLossError(fmt::format(
          "{}: corrupt zstd payload: {}", where, ZSTD_getErrorName(pending)));
    }
    if (ob.pos == produced && pending != 0) {
      return absl::DataLossError(fmt::format(
          "{}: zstd payload is truncated (its last frame does not end within "
          "the {} stored bytes)",
          where, length));
    }
    produced = ob.pos;
  }
  if (produced > max) {
    return absl::ResourceExhaustedError(fmt::format(
        "{}: zstd payload decodes to more than {} bytes", where, max));
  }
  out.resize(produced);
  return out;
}

}  // namespace

absl::StatusOr<PayloadTransform> ParseTransforms(
    const std::vector<std::string>& descriptors) {
  if (descriptors.empty()) return PayloadTransform::kNone;
  if (descriptors.size() == 1) {
    constexpr std::string_view kName = "stream.zstd/";
    const std::string_view d = descriptors[0];
    if (d.starts_with(kName)) {
      const std::string_view version = d.substr(kName.size());
      if (version.substr(0, version.find('.')) == "1") {
        return PayloadTransform::kZstd;
      }
    }
  }
  return absl::UnimplementedError(
      fmt::format("payload uses storage transforms [{}]; ckptd reads only {}",
                  fmt::join(descriptors, ", "), kZstdDescriptor));
}

absl::StatusOr<DecodedPayload> DecodePayload(
    const RandomAccessFile* file, uint64_t offset, uint64_t length,
    const std::vector<std::string>& descriptors, uint64_t max_decoded,
    std::string_view what) {
  DecodedPayload p;
  absl::StatusOr<PayloadTransform> t = ParseTransforms(descriptors);
  if (!t.ok()) {
    return absl::Status(t.status().code(),
                        fmt::format("{}: {}", what, t.status().message()));
  }
  if (*t == PayloadTransform::kNone) {
    p.file = file;
    p.offset = offset;
    p.length = length;
    return p;
  }
  const std::string where =
      fmt::format("{} @ {} ({})", file->path(), offset, what);
  ASSIGN_OR_RETURN(std::string bytes,
                   ZstdDecode(file, offset, length, max_decoded, where));
  p.length = bytes.size();
  p.stored_bytes = length;
  p.owned = std::make_unique<InMemoryFile>(
      std::move(bytes),
      fmt::format("{} (zstd payload @ {})", file->path(), offset));
  p.file = p.owned.get();
  return p;
}

uint64_t MaxDecodedPayload(const CompactMetadata& md,
                           const CompactMetadata::Storage& s) {
  if (s.chunk == CompactMetadata::kNone || s.item >= md.num_items() ||
      !md.item(s.item).tensor) {
    return uint64_t{1} << 30;
  }
  uint64_t bytes = ElementSize(md.item(s.item).properties.dtype);
  for (int64_t n : md.chunk_sizes(s.item, s.chunk)) {
    bytes *= static_cast<uint64_t>(std::max<int64_t>(n, 0));
  }
  return 2 * bytes + (uint64_t{16} << 20);
}

namespace {

absl::Status SetLevel(ZSTD_CCtx* ctx, int level) {
  for (auto [param, value] : {std::pair{ZSTD_c_compressionLevel, level},
                              std::pair{ZSTD_c_checksumFlag, 1},
                              std::pair{ZSTD_c_contentSizeFlag, 1}}) {
    const size_t r = ZSTD_CCtx_setParameter(ctx, param, value);
    if (ZSTD_isError(r)) {
      return absl::InvalidArgumentError(
          fmt::format("zstd parameter {}={}: {}", static_cast<int>(param),
                      value, ZSTD_getErrorName(r)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ZstdCompress(std::string_view in, int level) {
  std::unique_ptr<ZSTD_CCtx, CCtxFree> ctx(ZSTD_createCCtx());
  if (ctx == nullptr) {
    return absl::ResourceExhaustedError("ZSTD_createCCtx failed");
  }
  RETURN_IF_ERROR(SetLevel(ctx.get(), level));
  std::string out(ZSTD_compressBound(in.size()), '\0');
  const size_t n =
      ZSTD_compress2(ctx.get(), out.data(), out.size(), in.data(), in.size());
  if (ZSTD_isError(n)) {
    return absl::InternalError(
        fmt::format("zstd compression failed: {}", ZSTD_getErrorName(n)));
  }
  out.resize(n);
  return out;
}

absl::StatusOr<std::unique_ptr<ZstdWritableFile>> ZstdWritableFile::Create(
    WritableFile* out, int level) {
  std::unique_ptr<ZSTD_CCtx, CCtxFree> ctx(ZSTD_createCCtx());
  if (ctx == nullptr) {
    return absl::ResourceExhaustedError("ZSTD_createCCtx failed");
  }
  RETURN_IF_ERROR(SetLevel(ctx.get(), level));
  // The frame's content size is unknown up front (streamed).
  ZSTD_CCtx_setParameter(ctx.get(), ZSTD_c_contentSizeFlag, 0);
  return std::unique_ptr<ZstdWritableFile>(
      new ZstdWritableFile(out, ctx.release()));
}

ZstdWritableFile::ZstdWritableFile(WritableFile* out, void* ctx)
    : out_(out), ctx_(ctx), buf_(ZSTD_CStreamOutSize(), '\0') {}

ZstdWritableFile::~ZstdWritableFile() {
  ZSTD_freeCCtx(static_cast<ZSTD_CCtx*>(ctx_));
}

absl::Status ZstdWritableFile::Pump(std::string_view data, int end_op) {
  ZSTD_inBuffer in{data.data(), data.size(), 0};
  while (true) {
    ZSTD_outBuffer out{buf_.data(), buf_.size(), 0};
    const size_t left =
        ZSTD_compressStream2(static_cast<ZSTD_CCtx*>(ctx_), &out, &in,
                             static_cast<ZSTD_EndDirective>(end_op));
    if (ZSTD_isError(left)) {
      return absl::InternalError(fmt::format(
          "zstd compression of {}: {}", out_->path(), ZSTD_getErrorName(left)));
    }
    if (out.pos > 0) {
      RETURN_IF_ERROR(out_->Append(std::string_view(buf_.data(), out.pos)));
    }
    const bool done = end_op == ZSTD_e_end ? left == 0 : in.pos == in.size;
    if (done) return absl::OkStatus();
  }
}

absl::Status ZstdWritableFile::Append(std::string_view data) {
  if (closed_) {
    return absl::FailedPreconditionError("append to a closed zstd stream");
  }
  in_bytes_ += data.size();
  return Pump(data, ZSTD_e_continue);
}

absl::Status ZstdWritableFile::Sync() {
  return absl::FailedPreconditionError(
      "a zstd stream is synced through the file it writes into");
}

absl::Status ZstdWritableFile::Close() {
  if (closed_) return absl::OkStatus();
  closed_ = true;
  return Pump({}, ZSTD_e_end);
}

std::optional<int> ZstdLevelOfName(std::string_view compression) {
  if (compression.empty()) return 0;
  constexpr std::string_view kPrefix = "zstd:";
  if (!compression.starts_with(kPrefix)) return std::nullopt;
  const std::string_view digits = compression.substr(kPrefix.size());
  int level = 0;
  const auto [end, ec] =
      std::from_chars(digits.data(), digits.data() + digits.size(), level);
  if (ec != std::errc() || end != digits.data() + digits.size() || level < 1 ||
      level > 19) {
    return std::nullopt;
  }
  return level;
}

}  // namespace ckptd::format
