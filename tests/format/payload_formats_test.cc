// Copyright 2026 The ckptd Authors.
//
// Payloads in the formats torch >= 2.7 writes besides plain torch.save
// archives.
//
// Payloads stored with the "stream.zstd/1" transform (torch >= 2.7,
// FileSystemWriter(_extensions=[ZStandard()])): every read path decodes
// them (full, resharded and strided tensor reads, bytes items, objects,
// convert, verify), and corrupt, truncated, oversized and unknown
// transforms are precise errors. The zstd checkpoint is made here from one
// written by ckptd's writer, every payload recompressed with libzstd; stock
// torch 2.14's output is checked through tests/fixtures (zstd) and the
// interop suite.
//
// SAFETENSORS-format data files (torch >= 2.8, FileSystemWriter(
// serialization_format=SAFETENSORS)): each file's tensor chunks in one
// safetensors blob, every chunk's entry pointing at the blob; the reader
// finds the chunk by fqn in the blob's header, checks dtype and shape, and
// verify checks the same. Stock torch 2.14's output: tests/fixtures.
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/env.h"
#include "fmt/format.h"
#include "format/checkpoint/checkpoint_reader.h"
#include "format/checkpoint/checkpoint_writer.h"
#include "format/checkpoint/verify.h"
#include "format/convert/convert.h"
#include "format/convert/safetensors.h"
#include "format/metadata/metadata.h"
#include "format/pickle/py_value.h"
#include "format/tensor/payload_transform.h"
#include "format/tensor/tensor_payload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"
#include "tests/testing/two_rank_checkpoint.h"

namespace ckptd::format {
namespace {

using ::ckptd::testing::TempDir;
using ::testing::HasSubstr;

constexpr int64_t kRows = 64, kCols = 32;

std::string ReadAll(const std::string& path) {
  auto f = Env::Default()->NewRandomAccessFile(path);
  EXPECT_TRUE(f.ok()) << f.status();
  std::string s((*f)->Size(), '\0');
  EXPECT_TRUE((*f)->ReadExact(0, s.size(), s.data()).ok());
  return s;
}

void WriteAll(const std::string& path, std::string_view data) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(std::fwrite(data.data(), 1, data.size(), f), data.size());
  std::fclose(f);
}

// What RecompressOne does to a payload before it is stored.
using Mutation =
    std::function<void(const StorageKey&, std::string*, StorageInfo*)>;

// Copies checkpoint `src` to `dst` with every payload zstd-compressed in
// place of the original and .metadata naming the transform; `mutate` may
// alter a stored payload or its entry (corruption, truncation, another
// descriptor).
void Recompress(const std::string& src, const std::string& dst,
                const Mutation& mutate = nullptr) {
  ASSERT_OK_AND_ASSIGN(Metadata md,
                       DecodeMetadata(ReadAll(JoinPath(src, ".metadata"))));
  std::map<std::string, std::string> files;  // relative path → new contents
  for (auto& [key, info] : md.storage_data) {
    const std::string file = ReadAll(JoinPath(src, info.relative_path));
    ASSERT_OK_AND_ASSIGN(
        std::string z,
        ZstdCompress(std::string_view(file).substr(info.offset, info.length),
                     3));
    StorageInfo out = info;
    out.transform_descriptors = {std::string(kZstdDescriptor)};
    if (mutate) mutate(key, &z, &out);
    std::string& contents = files[info.relative_path];
    out.offset = contents.size();
    if (out.length == info.length) out.length = z.size();
    contents += z;
    info = out;
  }
  ASSERT_OK(Env::Default()->CreateDirs(dst));
  for (const auto& [rel, contents] : files)
    WriteAll(JoinPath(dst, rel), contents);
  md.BuildIndex();
  ASSERT_OK_AND_ASSIGN(std::string pickled, EncodeMetadata(md));
  WriteAll(JoinPath(dst, ".metadata"), pickled);
}

// WriteTwoRankCheckpoint's "w" float32 [64, 32] in two row chunks and the
// bytes item "optim.param_groups", and its zstd copy.
class ZstdReadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    plain_ = tmp_.Join("plain");
    ASSERT_OK_AND_ASSIGN(::ckptd::testing::TwoRankCheckpoint c,
                         ::ckptd::testing::WriteTwoRankCheckpoint(plain_));
    data_ = std::move(c.data);
    groups_ = std::move(c.groups);
    zstd_ = tmp_.Join("zstd");
  }

  absl::Status ReadBox(const std::string& dir, std::vector<int64_t> off,
                       std::vector<int64_t> size, std::vector<int64_t> strides,
                       std::vector<float>* out) {
    auto reader = CheckpointReader::Open(dir);
    if (!reader.ok()) return reader.status();
    return ::ckptd::testing::ReadBoxOfW(
        **reader, std::move(off), std::move(size), std::move(strides), out);
  }

  // The whole of "w", a box across both chunks, a transposed destination,
  // and the bytes item, from `dir`.
  void ExpectEveryReadPathReads(const std::string& dir) {
    std::vector<float> out;
    ASSERT_OK(ReadBox(dir, {0, 0}, {kRows, kCols}, {}, &out));
    EXPECT_EQ(out, data_);
    ASSERT_OK(ReadBox(dir, {20, 3}, {30, 10}, {}, &out));
    for (int64_t r = 0; r < 30; ++r)
      for (int64_t c = 0; c < 10; ++c)
        ASSERT_EQ(out[r * 10 + c], At(20 + r, 3 + c)) << r << "," << c;
    ASSERT_OK(ReadBox(dir, {0, 0}, {kRows, kCols}, {1, kRows}, &out));
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t c = 0; c < kCols; ++c)
        ASSERT_EQ(out[c * kRows + r], At(r, c));
    ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(dir));
    ASSERT_OK_AND_ASSIGN(std::string raw,
                         reader->ReadBytesItem("optim.param_groups"));
    EXPECT_EQ(raw, groups_);
  }

  // `dir` converts to the same torch.save file as the plain checkpoint.
  void ExpectConvertsLikePlain(const std::string& dir) {
    ASSERT_OK(ConvertToTorchSave(dir, dir + ".pt").status());
    ASSERT_OK(ConvertToTorchSave(plain_, plain_ + ".pt").status());
    EXPECT_EQ(ReadAll(dir + ".pt"), ReadAll(plain_ + ".pt"));
  }

  float At(int64_t r, int64_t c) const { return data_[r * kCols + c]; }

  TempDir tmp_;
  std::string plain_, zstd_;
  std::vector<float> data_;
  std::string groups_;
};

TEST_F(ZstdReadTest, EveryReadPathDecodes) {
  Recompress(plain_, zstd_);
  ExpectEveryReadPathReads(zstd_);
  ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(zstd_));
  ASSERT_OK_AND_ASSIGN(PyValue v, reader->ReadObject("optim.param_groups"));
  ASSERT_OK_AND_ASSIGN(auto plain_reader, CheckpointReader::Open(plain_));
  ASSERT_OK_AND_ASSIGN(PyValue want,
                       plain_reader->ReadObject("optim.param_groups"));
  EXPECT_EQ(v, want) << v.Repr() << " vs " << want.Repr();
}

TEST_F(ZstdReadTest, VerifyAndConvertDecode) {
  Recompress(plain_, zstd_);
  ASSERT_OK_AND_ASSIGN(VerifyReport report, VerifyCheckpoint(zstd_));
  EXPECT_TRUE(report.ok()) << ::testing::PrintToString(report.problems);
  EXPECT_GT(report.decoded_bytes, uint64_t{kRows * kCols * 4});
  EXPECT_GT(report.crc_bytes, uint64_t{kRows * kCols * 4});
  ExpectConvertsLikePlain(zstd_);
}

TEST_F(ZstdReadTest, CorruptStreamIsDataLossNamingFileAndOffset) {
  Recompress(plain_, zstd_,
             [](const StorageKey& key, std::string* z, StorageInfo*) {
               // The second chunk's frame, past its header.
               if (key.has_offset && key.offset[0] == kRows / 2)
                 (*z)[z->size() / 2] ^= 0x5a;
             });
  std::vector<float> out;
  absl::Status s = ReadBox(zstd_, {0, 0}, {kRows, kCols}, {}, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("__1_0.distcp @ 0"));
  // The first chunk alone still reads.
  ASSERT_OK(ReadBox(zstd_, {0, 0}, {kRows / 2, kCols}, {}, &out));
  ASSERT_OK_AND_ASSIGN(VerifyReport report, VerifyCheckpoint(zstd_));
  ASSERT_EQ(report.problems.size(), 1u)
      << ::testing::PrintToString(report.problems);
  EXPECT_THAT(report.problems[0], HasSubstr("__1_0.distcp @ 0"));
}

TEST_F(ZstdReadTest, TruncatedStreamIsDataLoss) {
  Recompress(plain_, zstd_,
             [](const StorageKey& key, std::string* z, StorageInfo*) {
               if (!key.has_offset) z->resize(z->size() - 7);  // bytes item
             });
  ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(zstd_));
  auto raw = reader->ReadBytesItem("optim.param_groups");
  EXPECT_EQ(raw.status().code(), absl::StatusCode::kDataLoss) << raw.status();
  EXPECT_THAT(std::string(raw.status().message()),
              ::testing::AnyOf(HasSubstr("truncated"), HasSubstr("corrupt")));
  EXPECT_THAT(std::string(raw.status().message()),
              HasSubstr("optim.param_groups"));
}

TEST_F(ZstdReadTest, StreamDecodingPastTheChunkIsRefused) {
  // A frame of 40 MiB of zeros in place of the first chunk (8 KiB of
  // floats): the reader stops at its bound instead of allocating it all.
  Recompress(plain_, zstd_,
             [](const StorageKey& key, std::string* z, StorageInfo*) {
               if (key.has_offset && key.offset[0] == 0) {
                 auto bomb = ZstdCompress(std::string(40 << 20, '\0'), 1);
                 ASSERT_TRUE(bomb.ok());
                 *z = *bomb;
               }
             });
  std::vector<float> out;
  absl::Status s = ReadBox(zstd_, {0, 0}, {kRows / 2, kCols}, {}, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("decodes to more than"));
}

TEST_F(ZstdReadTest, UnknownTransformIsUnimplementedNamingIt) {
  Recompress(plain_, zstd_,
             [](const StorageKey& key, std::string*, StorageInfo* info) {
               if (key.has_offset && key.offset[0] == 0)
                 info->transform_descriptors = {"stream.lz4/1"};
             });
  std::vector<float> out;
  absl::Status s = ReadBox(zstd_, {0, 0}, {kRows, kCols}, {}, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("stream.lz4/1"));
  // A major version torch does not know either.
  EXPECT_EQ(ParseTransforms({"stream.zstd/2"}).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(*ParseTransforms({"stream.zstd/1.1"}), PayloadTransform::kZstd);
  EXPECT_EQ(*ParseTransforms({}), PayloadTransform::kNone);
}

TEST(ZstdStreamTest, WritableFileStreamsOneFrameTheReaderDecodes) {
  // What the daemon's writer does with compression "zstd": a payload
  // appended in pieces through ZstdWritableFile after other bytes.
  TempDir tmp;
  const std::string path = tmp.Join("f");
  ASSERT_OK_AND_ASSIGN(auto out, Env::Default()->NewWritableFile(path));
  ASSERT_OK(out->Append("head"));
  std::string payload;
  for (int i = 0; i < 5000; ++i) payload += "piece " + std::to_string(i % 97);
  ASSERT_OK_AND_ASSIGN(auto z, ZstdWritableFile::Create(out.get(), 3));
  for (size_t at = 0; at < payload.size(); at += 7001) {
    ASSERT_OK(z->Append(std::string_view(payload).substr(at, 7001)));
  }
  EXPECT_EQ(z->Size(), payload.size());  // uncompressed: archive offsets
  EXPECT_EQ(z->Sync().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_OK(z->Close());
  EXPECT_EQ(z->Append("x").code(), absl::StatusCode::kFailedPrecondition);
  const uint64_t stored = out->Size() - 4;
  EXPECT_LT(stored, payload.size() / 4);
  // An empty payload is a valid (empty) frame too.
  ASSERT_OK_AND_ASSIGN(auto e, ZstdWritableFile::Create(out.get(), 1));
  ASSERT_OK(e->Close());
  const uint64_t empty_at = 4 + stored, empty_len = out->Size() - empty_at;
  ASSERT_OK(out->Close());
  ASSERT_OK_AND_ASSIGN(auto file, Env::Default()->NewRandomAccessFile(path));
  ASSERT_OK_AND_ASSIGN(
      DecodedPayload p,
      DecodePayload(file.get(), 4, stored, {std::string(kZstdDescriptor)},
                    1 << 20, "test"));
  std::string got(p.length, '\0');
  ASSERT_OK(p.file->ReadExact(p.offset, got.size(), got.data()));
  EXPECT_EQ(got, payload);
  ASSERT_OK_AND_ASSIGN(
      DecodedPayload q,
      DecodePayload(file.get(), empty_at, empty_len,
                    {std::string(kZstdDescriptor)}, 1 << 20, "test"));
  EXPECT_EQ(q.length, 0u);
}

TEST(ZstdStreamTest, ConcatenatedFramesAndUnknownContentSize) {
  // Two frames back to back decode as one stream (as a streaming writer
  // that flushed may leave them).
  TempDir tmp;
  const std::string a(300000, 'a'), b = "tail of the payload";
  ASSERT_OK_AND_ASSIGN(std::string za, ZstdCompress(a, 3));
  ASSERT_OK_AND_ASSIGN(std::string zb, ZstdCompress(b, 19));
  const std::string path = tmp.Join("f");
  WriteAll(path, "xx" + za + zb);
  ASSERT_OK_AND_ASSIGN(auto file, Env::Default()->NewRandomAccessFile(path));
  ASSERT_OK_AND_ASSIGN(
      DecodedPayload p,
      DecodePayload(file.get(), 2, za.size() + zb.size(),
                    {std::string(kZstdDescriptor)}, 1 << 20, "test"));
  EXPECT_EQ(p.stored_bytes, za.size() + zb.size());
  std::string got(p.length, '\0');
  ASSERT_OK(p.file->ReadExact(p.offset, got.size(), got.data()));
  EXPECT_EQ(got, a + b);
  // Not transformed: the file's own range.
  ASSERT_OK_AND_ASSIGN(DecodedPayload q,
                       DecodePayload(file.get(), 2, 5, {}, 0, "test"));
  EXPECT_EQ(q.file, file.get());
  EXPECT_EQ(q.offset, 2u);
  EXPECT_EQ(q.owned, nullptr);
  // Empty stored range.
  EXPECT_EQ(DecodePayload(file.get(), 2, 0, {std::string(kZstdDescriptor)},
                          1 << 20, "test")
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
}

using Tensors = std::vector<std::pair<std::string, SafetensorsTensor>>;

// Rewrites WriteTwoRankCheckpoint's checkpoint `src` into `dst` in the
// SAFETENSORS format, as torch 2.8+ lays it out: per data file its bytes
// items first (raw, as stored), then one safetensors blob of its chunks of
// "w" keyed by fqn; each chunk's entry has the blob's offset and length
// numel * 4. `mutate` may alter a file's header entries before encoding.
void ToSafetensorsFormat(const std::string& src, const std::string& dst,
                         const std::vector<float>& data,
                         const std::function<void(Tensors*)>& mutate = {}) {
  constexpr int64_t kCols = ::ckptd::testing::TwoRankCheckpoint::kCols;
  ASSERT_OK_AND_ASSIGN(Metadata md,
                       DecodeMetadata(ReadAll(JoinPath(src, ".metadata"))));
  std::map<std::string, std::string> files;  // bytes items first
  std::map<std::string, std::vector<StorageInfo*>> chunk_entries;
  std::map<std::string, Tensors> tensors;
  std::map<std::string, std::string> blob_data;
  for (auto& [key, info] : md.storage_data) {
    const std::string& rel = info.relative_path;
    if (!key.has_offset) {
      const std::string file = ReadAll(JoinPath(src, rel));
      StorageInfo out = info;
      out.offset = files[rel].size();
      files[rel] += file.substr(info.offset, info.length);
      info = out;
      continue;
    }
    const int64_t row = key.offset[0];
    const int64_t rows = ::ckptd::testing::TwoRankCheckpoint::kRows / 2;
    std::string& d = blob_data[rel];
    const uint64_t begin = d.size();
    d.append(reinterpret_cast<const char*>(data.data() + row * kCols),
             rows * kCols * sizeof(float));
    tensors[rel].push_back(
        {key.fqn, {DType::kFloat32, {rows, kCols}, begin, d.size()}});
    info.length = rows * kCols * sizeof(float);
    chunk_entries[rel].push_back(&info);
  }
  for (auto& [rel, list] : tensors) {
    if (mutate) mutate(&list);
    ASSERT_OK_AND_ASSIGN(std::string header,
                         EncodeSafetensorsHeader(list, {{"format", "pt"}}));
    for (StorageInfo* info : chunk_entries[rel])
      info->offset = files[rel].size();
    files[rel] += header + blob_data[rel];
  }
  ASSERT_OK(Env::Default()->CreateDirs(dst));
  for (const auto& [rel, contents] : files)
    WriteAll(JoinPath(dst, rel), contents);
  md.BuildIndex();
  ASSERT_OK_AND_ASSIGN(std::string pickled, EncodeMetadata(md));
  WriteAll(JoinPath(dst, ".metadata"), pickled);
}

class SafetensorsReadTest : public ZstdReadTest {
 protected:
  void Make(const std::function<void(Tensors*)>& mutate = {},
            const std::string& name = "st") {
    st_ = tmp_.Join(name);
    ToSafetensorsFormat(plain_, st_, data_, mutate);
  }
  std::string st_;
};

TEST_F(SafetensorsReadTest, EveryReadPathReads) {
  Make();
  ExpectEveryReadPathReads(st_);
  ASSERT_OK_AND_ASSIGN(VerifyReport report, VerifyCheckpoint(st_));
  EXPECT_TRUE(report.ok()) << ::testing::PrintToString(report.problems);
  EXPECT_EQ(report.chunks, 2u);
  ExpectConvertsLikePlain(st_);
}

TEST_F(SafetensorsReadTest, MismatchedBlobsAreDataLoss) {
  struct Case {
    std::string name;
    std::function<void(Tensors*)> mutate;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"renamed", [](Tensors* t) { (*t)[0].first = "v"; }, "has no tensor 'w'"},
      {"dtype", [](Tensors* t) { (*t)[0].second.dtype = DType::kInt32; },
       "safetensors tensor 'w' is int32"},
      {"shape",
       [](Tensors* t) {
         (*t)[0].second.shape = {kRows, kCols / 2};  // same bytes
       },
       "but .metadata says the chunk is float32"},
      {"range", [](Tensors* t) { (*t)[0].second.end += 4; },
       "do not hold its 4096 bytes"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Make(c.mutate, "st_" + c.name);
    std::vector<float> out;
    absl::Status s = ReadBox(st_, {0, 0}, {kRows, kCols}, {}, &out);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message));
    EXPECT_THAT(std::string(s.message()), HasSubstr("__0_0.distcp @ "));
    ASSERT_OK_AND_ASSIGN(VerifyReport report, VerifyCheckpoint(st_));
    EXPECT_FALSE(report.ok()) << c.name;
  }
}

TEST(SafetensorsHeaderTest, RoundTripsAndRejectsBadHeaders) {
  Tensors tensors = {{"a", {DType::kBFloat16, {2, 3}, 0, 12}},
                     {"b.c", {DType::kUInt64, {}, 12, 20}},
                     {"e", {DType::kBool, {0}, 20, 20}}};
  ASSERT_OK_AND_ASSIGN(std::string header,
                       EncodeSafetensorsHeader(tensors, {{"k", "v"}}));
  EXPECT_EQ(header.size() % 8, 0u);
  InMemoryFile f(header + std::string(20, 'x'), "blob");
  ASSERT_OK_AND_ASSIGN(SafetensorsHeader h, ReadSafetensorsHeader(&f, 0));
  EXPECT_EQ(h.data_start, header.size());
  ASSERT_EQ(h.tensors.size(), 3u);
  EXPECT_EQ(h.tensors.at("a").dtype, DType::kBFloat16);
  EXPECT_EQ(h.tensors.at("a").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(h.tensors.at("b.c").begin, header.size() + 12);
  EXPECT_EQ(h.metadata.at("k"), "v");
  EXPECT_EQ(EncodeSafetensorsHeader({{"z", {DType::kComplex64, {1}, 0, 8}}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  for (int d = 0; d < kNumDTypes; ++d) {
    const DType dtype = static_cast<DType>(d);
    if (auto name = SafetensorsDTypeName(dtype)) {
      EXPECT_EQ(DTypeFromSafetensors(*name), dtype) << *name;
    }
  }
  auto blob = [](std::string json, size_t data) {
    std::string out(8, '\0');
    uint64_t n = json.size();
    for (int i = 0; i < 8; ++i, n >>= 8) out[i] = static_cast<char>(n & 0xff);
    return out + json + std::string(data, '\0');
  };
  const std::vector<std::pair<std::string, std::string>> bad = {
      {blob("{not json", 0), "not a JSON object"},
      {blob(R"({"a": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}})",
            8),
       "has no torch dtype"},
      {blob(R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})",
            4),
       "is not a list of sizes"},
      {blob(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})",
            8),
       "do not hold its 8 bytes"},
      {blob(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})",
            8),
       "do not hold its 16 bytes inside the file"},
      {blob(R"({"a": [1, 2]})", 0), "entry is not"},
      {blob(R"({"__metadata__": 3})", 0), "__metadata__ is not an object"},
  };
  for (const auto& [bytes, message] : bad) {
    InMemoryFile b(bytes, "bad");
    auto r = ReadSafetensorsHeader(&b, 0);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << message;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(message));
  }
  InMemoryFile big(blob("{}", 64), "big");
  EXPECT_EQ(ReadSafetensorsHeader(&big, 0, /*max_header=*/1).status().code(),
            absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace ckptd::format
