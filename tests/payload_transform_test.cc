// Copyright 2026 The ckptd Authors.
//
// Payloads stored with the "stream.zstd/1" transform (torch >= 2.7,
// FileSystemWriter(_extensions=[ZStandard()])): every read path decodes
// them (full, resharded and strided tensor reads, bytes items, objects,
// convert, verify), and corrupt, truncated, oversized and unknown
// transforms are precise errors. The zstd checkpoint is made here from one
// written by ckptd's writer, every payload recompressed with libzstd; stock
// torch 2.14's output is checked through tests/fixtures (zstd) and the
// interop suite.
#include "format/payload_transform.h"

#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/env.h"
#include "fmt/format.h"
#include "format/checkpoint_reader.h"
#include "format/checkpoint_writer.h"
#include "format/convert.h"
#include "format/metadata.h"
#include "format/py_value.h"
#include "format/tensor_payload.h"
#include "format/verify.h"
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
    int64_t span = 1;
    for (size_t d = 0; d < size.size(); ++d) {
      span += (size[d] - 1) *
              (strides.empty() ? (d == 0 ? size[1] : 1) : strides[d]);
    }
    out->assign(span, -1.0f);
    TensorRequest req{
        "w",
        off,
        {DType::kFloat32, size, strides, reinterpret_cast<char*>(out->data())}};
    return (*reader)->ReadTensors({&req, 1});
  }

  float At(int64_t r, int64_t c) const { return data_[r * kCols + c]; }

  TempDir tmp_;
  std::string plain_, zstd_;
  std::vector<float> data_;
  std::string groups_;
};

TEST_F(ZstdReadTest, EveryReadPathDecodes) {
  Recompress(plain_, zstd_);
  // Full read: both chunks.
  std::vector<float> out;
  ASSERT_OK(ReadBox(zstd_, {0, 0}, {kRows, kCols}, {}, &out));
  EXPECT_EQ(out, data_);
  // Resharded: a box across both chunks.
  ASSERT_OK(ReadBox(zstd_, {20, 3}, {30, 10}, {}, &out));
  for (int64_t r = 0; r < 30; ++r)
    for (int64_t c = 0; c < 10; ++c)
      ASSERT_EQ(out[r * 10 + c], At(20 + r, 3 + c)) << r << "," << c;
  // Strided (transposed) destination.
  ASSERT_OK(ReadBox(zstd_, {0, 0}, {kRows, kCols}, {1, kRows}, &out));
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t c = 0; c < kCols; ++c) ASSERT_EQ(out[c * kRows + r], At(r, c));
  // Bytes item and its object.
  ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(zstd_));
  ASSERT_OK_AND_ASSIGN(std::string raw,
                       reader->ReadBytesItem("optim.param_groups"));
  EXPECT_EQ(raw, groups_);
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
  // convert: the same torch.save file as from the uncompressed checkpoint.
  ASSERT_OK(ConvertToTorchSave(zstd_, tmp_.Join("z.pt")).status());
  ASSERT_OK(ConvertToTorchSave(plain_, tmp_.Join("p.pt")).status());
  EXPECT_EQ(ReadAll(tmp_.Join("z.pt")), ReadAll(tmp_.Join("p.pt")));
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

}  // namespace
}  // namespace ckptd::format
