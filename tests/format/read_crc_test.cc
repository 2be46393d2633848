// Copyright 2026 The ckptd Authors.
//
// Every read path checks payload CRC-32s (the reader's full, resharded and
// strided reads, bytes items, convert, the C ABI), with an explicit opt-out;
// verify flags bytes items whose pickle references globals outside the
// allowlist.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/ckptd_c.h"
#include "common/cancel.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "format/checkpoint/checkpoint_reader.h"
#include "format/checkpoint/checkpoint_writer.h"
#include "format/checkpoint/verify.h"
#include "format/convert/convert.h"
#include "format/pickle/pickle.h"
#include "format/pickle/py_value.h"
#include "format/tensor/tensor_payload.h"
#include "format/zip/zip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/read_hook_env.h"
#include "tests/testing/test_util.h"
#include "tests/testing/two_rank_checkpoint.h"

namespace ckptd::format {
namespace {

using ::ckptd::testing::TempDir;
using ::testing::HasSubstr;

constexpr int64_t kRows = 64, kCols = 32;

// WriteTwoRankCheckpoint's "w" float32 [64, 32] in two row chunks and the
// bytes item "optim.param_groups".
class ReadCrcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_.Join("ckpt");
    ASSERT_OK_AND_ASSIGN(::ckptd::testing::TwoRankCheckpoint c,
                         ::ckptd::testing::WriteTwoRankCheckpoint(dir_));
    data_ = std::move(c.data);
    groups_ = std::move(c.groups);
    md_ = std::move(c.metadata);
  }

  // File and absolute offset of record `name` in the payload of `key`.
  std::pair<std::string, uint64_t> RecordAt(const StorageKey& key,
                                            std::string_view name) {
    const StorageInfo* info = md_.FindStorage(key);
    EXPECT_NE(info, nullptr);
    const std::string path = JoinPath(dir_, info->relative_path);
    auto file = Env::Default()->NewRandomAccessFile(path);
    EXPECT_TRUE(file.ok());
    auto archive =
        ZipArchiveReader::Open(file->get(), info->offset, info->length);
    EXPECT_TRUE(archive.ok());
    const ZipEntry* e = (*archive)->Find(name);
    EXPECT_NE(e, nullptr);
    return {path, info->offset + e->data_offset};
  }

  static void FlipBit(const std::string& path, uint64_t offset, int bit) {
    FILE* f = std::fopen(path.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fseek(f, static_cast<long>(offset), SEEK_SET), 0);
    const int c = std::fgetc(f);
    ASSERT_NE(c, EOF);
    ASSERT_EQ(std::fseek(f, static_cast<long>(offset), SEEK_SET), 0);
    std::fputc(c ^ (1 << bit), f);
    std::fclose(f);
  }

  absl::Status ReadBox(CheckpointReader& reader, std::vector<int64_t> off,
                       std::vector<int64_t> size, std::vector<int64_t> strides,
                       std::vector<float>* out) {
    return ::ckptd::testing::ReadBoxOfW(reader, std::move(off), std::move(size),
                                        std::move(strides), out);
  }

  TempDir tmp_;
  std::string dir_;
  std::vector<float> data_;
  std::string groups_;
  Metadata md_;
};

void ExpectDataLoss(const absl::Status& s, const std::string& file,
                    uint64_t record_offset, const std::string& item) {
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(file)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(item)) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr(fmt::format("file offset {}", record_offset)))
      << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("CRC-32 mismatch")) << s;
}

TEST_F(ReadCrcTest, CleanCheckpointReadsOnEveryPath) {
  for (int threads : {1, 2}) {
    CheckpointReaderOptions o;
    o.threads = threads;
    ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(dir_, o));
    std::vector<float> out;
    ReadStats stats;
    TensorRequest req{
        "w", {0, 0}, {DType::kFloat32, {kRows, kCols}, {}, nullptr}};
    out.assign(kRows * kCols, 0);
    req.dest.data = reinterpret_cast<char*>(out.data());
    ASSERT_OK(reader->ReadTensors({&req, 1}, &stats));
    EXPECT_EQ(out, data_);
    // The fused path: the CRC costs no extra read.
    EXPECT_EQ(stats.bytes_read, data_.size() * 4);
    EXPECT_EQ(stats.crc_bytes, data_.size() * 4);
    ASSERT_OK(ReadBox(*reader, {16, 0}, {32, kCols}, {}, &out));
    EXPECT_EQ(out, std::vector<float>(data_.begin() + 16 * kCols,
                                      data_.begin() + 48 * kCols));
    ASSERT_OK(ReadBox(*reader, {0, 3}, {kRows, 2}, {1, kRows}, &out));
    EXPECT_EQ(out[0], data_[3]);
    EXPECT_EQ(out[kRows], data_[4]);
    ASSERT_OK_AND_ASSIGN(std::string raw,
                         reader->ReadBytesItem("optim.param_groups"));
    EXPECT_EQ(raw, groups_);
    ASSERT_OK(reader->ReadObject("optim.param_groups").status());
  }
  // A partial read checks the whole record once per reader.
  ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(dir_));
  std::vector<float> out(4 * kCols);
  TensorRequest req{
      "w",
      {2, 0},
      {DType::kFloat32, {4, kCols}, {}, reinterpret_cast<char*>(out.data())}};
  ReadStats first, second;
  ASSERT_OK(reader->ReadTensors({&req, 1}, &first));
  EXPECT_EQ(first.crc_bytes, uint64_t{kRows / 2 * kCols * 4});
  ASSERT_OK(reader->ReadTensors({&req, 1}, &second));
  EXPECT_EQ(second.crc_bytes, 0u);
  EXPECT_EQ(second.bytes_read, uint64_t{4 * kCols * 4});
  ASSERT_OK(ConvertToTorchSave(dir_, tmp_.Join("clean.pt")).status());
}

TEST_F(ReadCrcTest, FlippedTensorBitsAreDataLossOnEveryReadPath) {
  const int64_t chunk_bytes = kRows / 2 * kCols * 4;
  for (int rank = 0; rank < 2; ++rank) {
    const StorageKey key{"w", true, {rank * kRows / 2, 0}};
    const auto [path, rec] = RecordAt(key, "data/0");
    const std::string file = fmt::format("__{}_0.distcp", rank);
    const std::string item =
        fmt::format("item 'w' chunk at offsets ({}, 0)", rank * kRows / 2);
    for (int64_t pos :
         {int64_t{0}, int64_t{777}, chunk_bytes / 2 + 3, chunk_bytes - 1}) {
      SCOPED_TRACE(fmt::format("rank {} byte {}", rank, pos));
      FlipBit(path, rec + pos, static_cast<int>(pos % 8));
      for (int threads : {1, 2}) {
        CheckpointReaderOptions o;
        o.threads = threads;
        ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(dir_, o));
        std::vector<float> out;
        // Full read (fused CRC), resharded rows across both chunks (whole
        // record checked first), a strided column slice.
        ExpectDataLoss(ReadBox(*reader, {0, 0}, {kRows, kCols}, {}, &out), file,
                       rec, item);
        ASSERT_OK_AND_ASSIGN(reader, CheckpointReader::Open(dir_, o));
        ExpectDataLoss(ReadBox(*reader, {16, 0}, {32, kCols}, {}, &out), file,
                       rec, item);
        ASSERT_OK_AND_ASSIGN(reader, CheckpointReader::Open(dir_, o));
        ExpectDataLoss(ReadBox(*reader, {0, 5}, {kRows, 3}, {1, kRows}, &out),
                       file, rec, item);
        // A read of one row of the damaged chunk only: still refused.
        ASSERT_OK_AND_ASSIGN(reader, CheckpointReader::Open(dir_, o));
        ExpectDataLoss(
            ReadBox(*reader, {rank * kRows / 2 + 1, 0}, {1, kCols}, {}, &out),
            file, rec, item);
      }
      // convert: DATA_LOSS, and nothing written.
      const std::string out_pt = tmp_.Join("out.pt");
      auto conv = ConvertToTorchSave(dir_, out_pt);
      ExpectDataLoss(conv.status(), file, rec, item);
      EXPECT_FALSE(Env::Default()->FileExists(out_pt).ok());
      EXPECT_FALSE(Env::Default()->FileExists(out_pt + ".tmp").ok());
      // The opt-out: the damaged value comes back.
      CheckpointReaderOptions off;
      off.verify_crc = false;
      ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(dir_, off));
      std::vector<float> out;
      ASSERT_OK(ReadBox(*reader, {0, 0}, {kRows, kCols}, {}, &out));
      EXPECT_NE(out, data_);
      ConvertOptions coff;
      coff.verify_crc = false;
      coff.overwrite = true;
      EXPECT_OK(ConvertToTorchSave(dir_, out_pt, coff).status());
      EXPECT_OK(Env::Default()->RemoveFile(out_pt));
      FlipBit(path, rec + pos, static_cast<int>(pos % 8));  // repaired
    }
  }
  ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(dir_));
  std::vector<float> out;
  ASSERT_OK(ReadBox(*reader, {0, 0}, {kRows, kCols}, {}, &out));
  EXPECT_EQ(out, data_);
}

TEST_F(ReadCrcTest, FlippedBytesItemBitsAreDataLoss) {
  const StorageKey key{"optim.param_groups", false, {}};
  const auto [path, rec] = RecordAt(key, "data.pkl");
  FlipBit(path, rec + 5, 2);
  ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(dir_));
  auto raw = reader->ReadBytesItem("optim.param_groups");
  ExpectDataLoss(raw.status(), "__0_0.distcp", rec,
                 "bytes item 'optim.param_groups'");
  ExpectDataLoss(reader->ReadObject("optim.param_groups").status(),
                 "__0_0.distcp", rec, "bytes item 'optim.param_groups'");
  ExpectDataLoss(ConvertToTorchSave(dir_, tmp_.Join("o.pt")).status(),
                 "__0_0.distcp", rec, "bytes item 'optim.param_groups'");
  CheckpointReaderOptions off;
  off.verify_crc = false;
  ASSERT_OK_AND_ASSIGN(auto lax, CheckpointReader::Open(dir_, off));
  EXPECT_OK(lax->ReadBytesItem("optim.param_groups").status());
}

// Records of 4 MiB and more are CRC'd on a helper thread during the read.
// One float32 tensor "big" [rows, 1024] saved as one chunk by one rank;
// its data file and the file offset of its data record.
struct BigCheckpoint {
  std::string dir, path;
  uint64_t record = 0;
};
absl::StatusOr<BigCheckpoint> WriteBig(const std::string& dir,
                                       const std::vector<float>& data) {
  const int64_t rows = static_cast<int64_t>(data.size() / 1024);
  std::vector<std::vector<WriteItem>> ranks(1);
  WriteItem it;
  it.desc = {"big",
             ItemDesc::Type::kTensor,
             DType::kFloat32,
             {rows, 1024},
             {0, 0},
             {rows, 1024},
             {}};
  it.tensor = {DType::kFloat32,
               {rows, 1024},
               {},
               reinterpret_cast<const char*>(data.data())};
  ranks[0].push_back(it);
  ASSIGN_OR_RETURN(WriteResult wr, WriteCheckpoint(dir, ranks));
  const StorageInfo* info =
      wr.metadata.FindStorage(StorageKey{"big", true, {0, 0}});
  if (info == nullptr) return absl::InternalError("no storage for 'big'");
  BigCheckpoint c{dir, JoinPath(dir, info->relative_path)};
  ASSIGN_OR_RETURN(auto file, Env::Default()->NewRandomAccessFile(c.path));
  ASSIGN_OR_RETURN(auto archive, ZipArchiveReader::Open(
                                     file.get(), info->offset, info->length));
  c.record = info->offset + archive->Find("data/0")->data_offset;
  return c;
}

TEST(ReadCrcLargeTest, PipelinedCrcCatchesFlips) {
  TempDir tmp;
  const int64_t n = 1536;  // 1536 x 1024 float32 = 6 MiB, one chunk
  std::vector<float> data(n * 1024);
  for (size_t i = 0; i < data.size(); ++i)
    data[i] = static_cast<float>(i % 9973);
  ASSERT_OK_AND_ASSIGN(BigCheckpoint big, WriteBig(tmp.Join("c"), data));
  const std::string dir = big.dir, path = big.path;
  const uint64_t rec = big.record;
  std::vector<float> out(data.size());
  TensorRequest req{
      "big",
      {0, 0},
      {DType::kFloat32, {n, 1024}, {}, reinterpret_cast<char*>(out.data())}};
  {
    ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(dir));
    ReadStats stats;
    ASSERT_OK(reader->ReadTensors({&req, 1}, &stats));
    EXPECT_EQ(out, data);
    EXPECT_EQ(stats.bytes_read, data.size() * 4);
  }
  for (uint64_t pos : {uint64_t{0}, uint64_t{5} << 20, data.size() * 4 - 1}) {
    FILE* f = std::fopen(path.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, static_cast<long>(rec + pos), SEEK_SET);
    const int c = std::fgetc(f);
    std::fseek(f, static_cast<long>(rec + pos), SEEK_SET);
    std::fputc(c ^ 0x10, f);
    std::fclose(f);
    ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(dir));
    const absl::Status s = reader->ReadTensors({&req, 1});
    ExpectDataLoss(s, "__0_0.distcp", rec,
                   "item 'big' chunk at offsets (0, 0)");
    f = std::fopen(path.c_str(), "r+b");
    std::fseek(f, static_cast<long>(rec + pos), SEEK_SET);
    std::fputc(c, f);
    std::fclose(f);
  }
}

// A read cancelled while it runs stops before its next block of the record
// it is reading, with the reason; one cancelled before it starts reads no
// chunk. (The daemon's restore cancels a batch being read this way.)
TEST(ReadCancelTest, AReadStopsAtItsNextBlockOnceCancelled) {
  TempDir tmp;
  const int64_t n = 1536;  // 6 MiB, one chunk: 24 reads of 256 KiB
  std::vector<float> data(n * 1024, 2.5f);
  ASSERT_OK_AND_ASSIGN(BigCheckpoint big, WriteBig(tmp.Join("c"), data));
  Cancellation cancel;
  int cancel_at = 0;  // the read before which the test cancels (0: none)
  ::ckptd::testing::ReadHookEnv env(Env::Default(), ".distcp",
                                    [&](const std::string&, int reads) {
                                      if (reads == cancel_at)
                                        cancel.Cancel("operator said stop");
                                    });
  CheckpointReaderOptions o;
  o.env = &env;
  std::vector<float> out(data.size());
  TensorRequest req{
      "big",
      {0, 0},
      {DType::kFloat32, {n, 1024}, {}, reinterpret_cast<char*>(out.data())}};
  // Not cancelled: the whole record, in more than 24 reads.
  {
    ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(big.dir, o));
    ASSERT_OK(reader->ReadTensors({&req, 1}, nullptr, true, &cancel));
    EXPECT_EQ(out, data);
  }
  const int whole = env.reads(big.path);
  ASSERT_GT(whole, 24);
  // Cancelled before the 4th read (inside the record): that read is the last.
  cancel_at = whole + 4;
  {
    ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(big.dir, o));
    const absl::Status s =
        reader->ReadTensors({&req, 1}, nullptr, true, &cancel);
    EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("operator said stop"));
    EXPECT_EQ(env.reads(big.path), whole + 4);
  }
  // Cancelled already: no chunk is opened, on any of the reader's threads.
  o.threads = 4;
  {
    ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(big.dir, o));
    const absl::Status s =
        reader->ReadTensors({&req, 1}, nullptr, true, &cancel);
    EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
    EXPECT_EQ(env.reads(big.path), whole + 4);
  }
}

// RecordRange (the daemon lending memory-held files): a whole record, or a
// part of it cut along its first dimension, is one range of the file; a
// box cut along another dimension is not, nor one of another dtype. The
// whole record's CRC-32 is checked first.
TEST(RecordRangeTest, WholeRecordsAndRowRangesAreOneRangeOfTheFile) {
  TempDir tmp;
  const int64_t n = 64;  // 64 rows of 1024 floats, one chunk
  std::vector<float> data(n * 1024);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i);
  ASSERT_OK_AND_ASSIGN(BigCheckpoint big, WriteBig(tmp.Join("c"), data));
  ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(big.dir));
  auto box = [](std::vector<int64_t> offsets, std::vector<int64_t> sizes,
                DType dtype = DType::kFloat32) {
    return TensorRequest{
        "big", std::move(offsets), {dtype, std::move(sizes), {}, nullptr}};
  };
  using Span = CheckpointReader::RecordSpan;
  ASSERT_OK_AND_ASSIGN(std::optional<Span> whole,
                       reader->RecordRange(box({0, 0}, {n, 1024}), true));
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(whole->offset, big.record);
  EXPECT_EQ(whole->size, data.size() * 4);
  ASSERT_OK_AND_ASSIGN(std::optional<Span> rows,
                       reader->RecordRange(box({5, 0}, {7, 1024}), true));
  ASSERT_TRUE(rows.has_value());
  EXPECT_EQ(rows->offset, big.record + 5 * 4096);
  EXPECT_EQ(rows->size, 7u * 4096);
  ASSERT_OK_AND_ASSIGN(std::optional<Span> one,
                       reader->RecordRange(box({63, 0}, {1, 1024}), true));
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(one->offset, big.record + 63 * 4096);
  ASSERT_OK_AND_ASSIGN(std::optional<Span> cols,
                       reader->RecordRange(box({0, 0}, {n, 512}), true));
  EXPECT_FALSE(cols.has_value()) << "columns are strided in the file";
  ASSERT_OK_AND_ASSIGN(std::optional<Span> part_row,
                       reader->RecordRange(box({2, 8}, {1, 16}), true));
  ASSERT_TRUE(part_row.has_value()) << "within one row: contiguous";
  EXPECT_EQ(part_row->offset, big.record + 2 * 4096 + 8 * 4);
  ASSERT_OK_AND_ASSIGN(
      std::optional<Span> other,
      reader->RecordRange(box({0, 0}, {2, 1024}, DType::kInt32), true));
  EXPECT_FALSE(other.has_value()) << "another dtype is converted, not lent";
  // A flipped bit anywhere in the record fails the range of any part of it.
  FILE* f = std::fopen(big.path.c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  std::fseek(f, static_cast<long>(big.record + 60 * 4096), SEEK_SET);
  const int c = std::fgetc(f);
  std::fseek(f, static_cast<long>(big.record + 60 * 4096), SEEK_SET);
  std::fputc(c ^ 1, f);
  std::fclose(f);
  ASSERT_OK_AND_ASSIGN(auto fresh, CheckpointReader::Open(big.dir));
  EXPECT_EQ(fresh->RecordRange(box({0, 0}, {2, 1024}), true).status().code(),
            absl::StatusCode::kDataLoss);
  ASSERT_OK_AND_ASSIGN(auto unchecked, CheckpointReader::Open(big.dir));
  EXPECT_OK(unchecked->RecordRange(box({0, 0}, {2, 1024}), false).status());
}

// direct_io (the daemon's restore): a whole record read into a destination
// whose address shares its file offset modulo a page is read with direct
// reads (all but its unaligned head and tail), checked as every read is;
// any other destination or box is read through the page cache, unchanged.
TEST(ReadDirectTest, WholeRecordsIntoAlignedDestinationsReadDirectly) {
  TempDir tmp;
  const int64_t n = 1536;  // 6 MiB, one chunk
  std::vector<float> data(n * 1024);
  for (size_t i = 0; i < data.size(); ++i)
    data[i] = static_cast<float>(i % 7919);
  ASSERT_OK_AND_ASSIGN(BigCheckpoint big, WriteBig(tmp.Join("c"), data));
  ASSERT_OK_AND_ASSIGN(auto probe,
                       Env::Default()->NewRandomAccessFile(big.path));
  if (probe->DirectAlignment() == 0) {
    GTEST_SKIP() << "no O_DIRECT reads on the file system of " << big.path;
  }
  const uint64_t bytes = data.size() * 4;
  std::unique_ptr<char, decltype(&std::free)> mem(
      static_cast<char*>(std::aligned_alloc(4096, bytes + 8192)), &std::free);
  auto request = [&](char* dst) {
    return TensorRequest{"big", {0, 0}, {DType::kFloat32, {n, 1024}, {}, dst}};
  };
  CheckpointReaderOptions o;
  o.direct_io = true;
  ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(big.dir, o));
  // Where the record starts, for the layout.
  ASSERT_OK_AND_ASSIGN(std::optional<uint64_t> at,
                       reader->WholeRecordOffset(request(nullptr)));
  ASSERT_TRUE(at.has_value());
  EXPECT_EQ(*at, big.record);
  TensorRequest rows{"big", {0, 0}, {DType::kFloat32, {8, 1024}, {}, nullptr}};
  ASSERT_OK_AND_ASSIGN(at, reader->WholeRecordOffset(rows));
  EXPECT_FALSE(at.has_value()) << "a part of a chunk is not a whole record";

  char* aligned = mem.get() + big.record % 4096;
  char* misaligned = mem.get() + (big.record + 64) % 4096;
  for (bool verify : {true, false}) {
    for (char* dst : {aligned, misaligned}) {
      SCOPED_TRACE(::testing::Message()
                   << "verify " << verify << " aligned " << (dst == aligned));
      ASSERT_OK_AND_ASSIGN(auto r, CheckpointReader::Open(big.dir, o));
      std::memset(dst, 0, bytes);
      TensorRequest req = request(dst);
      ReadStats stats;
      ASSERT_OK(r->ReadTensors({&req, 1}, &stats, verify));
      EXPECT_EQ(std::memcmp(dst, data.data(), bytes), 0);
      EXPECT_EQ(stats.bytes_read, bytes);
      EXPECT_EQ(stats.crc_bytes, verify ? bytes : 0);
      if (dst == aligned) {
        EXPECT_GE(stats.direct_bytes, bytes - 8192);
      } else {
        EXPECT_EQ(stats.direct_bytes, 0u);
      }
    }
  }
  // Off: never direct.
  {
    ASSERT_OK_AND_ASSIGN(auto r, CheckpointReader::Open(big.dir));
    TensorRequest req = request(aligned);
    ReadStats stats;
    ASSERT_OK(r->ReadTensors({&req, 1}, &stats));
    EXPECT_EQ(stats.direct_bytes, 0u);
  }
  // A flipped bit in the directly read middle is DATA_LOSS.
  const uint64_t pos = big.record + (3 << 20);
  FILE* f = std::fopen(big.path.c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  std::fseek(f, static_cast<long>(pos), SEEK_SET);
  const int c = std::fgetc(f);
  std::fseek(f, static_cast<long>(pos), SEEK_SET);
  std::fputc(c ^ 0x10, f);
  std::fclose(f);
  ASSERT_OK_AND_ASSIGN(auto r, CheckpointReader::Open(big.dir, o));
  TensorRequest req = request(aligned);
  ReadStats stats;
  ExpectDataLoss(r->ReadTensors({&req, 1}, &stats), "__0_0.distcp", big.record,
                 "item 'big' chunk at offsets (0, 0)");
  EXPECT_GT(stats.direct_bytes, 0u);
}

// The C ABI (ckptd.load's path): ckptd_reader_open checks, the
// CKPTD_READER_NO_VERIFY_CRC flag opts out.
TEST_F(ReadCrcTest, CAbiReaderChecksAndOptsOut) {
  const auto [path, rec] =
      RecordAt(StorageKey{"w", true, {kRows / 2, 0}}, "data/0");
  FlipBit(path, rec + 100, 0);
  std::vector<float> out(kRows * kCols);
  int64_t sizes[2] = {kRows, kCols};
  ckptd_read_request req{};
  req.fqn = "w";
  req.dtype = "float32";
  req.ndim = 2;
  req.sizes = sizes;
  req.data = out.data();
  ckptd_reader* r = nullptr;
  ASSERT_EQ(ckptd_reader_open(dir_.c_str(), 2, &r), CKPTD_OK)
      << ckptd_last_error();
  EXPECT_EQ(ckptd_reader_read(r, &req, 1, nullptr), CKPTD_DATA_LOSS);
  EXPECT_THAT(std::string(ckptd_last_error()), HasSubstr("__1_0.distcp"));
  EXPECT_THAT(std::string(ckptd_last_error()),
              HasSubstr(fmt::format("file offset {}", rec)));
  ckptd_reader_close(r);
  ASSERT_EQ(ckptd_reader_open_ex(dir_.c_str(), 1, 0, &r), CKPTD_OK);
  EXPECT_EQ(ckptd_reader_read(r, &req, 1, nullptr), CKPTD_DATA_LOSS);
  ckptd_reader_close(r);
  ASSERT_EQ(
      ckptd_reader_open_ex(dir_.c_str(), 1, CKPTD_READER_NO_VERIFY_CRC, &r),
      CKPTD_OK);
  EXPECT_EQ(ckptd_reader_read(r, &req, 1, nullptr), CKPTD_OK)
      << ckptd_last_error();
  ckptd_reader_close(r);
  EXPECT_EQ(ckptd_reader_open_ex(dir_.c_str(), 1, 0x80, &r),
            CKPTD_INVALID_ARGUMENT);
}

// ---------------------------------------------------------------------------
// verify: bytes items whose pickle references globals outside the allowlist.

std::string ArchiveOf(std::string pkl) {
  ZipArchiveBuilder b;
  b.AddOwnedRecord("data.pkl", std::move(pkl));
  b.AddOwnedRecord("byteorder", "little");
  b.AddOwnedRecord("version", "3\n");
  std::string out(b.size(), '\0');
  b.FinishInto(out.data());
  return out;
}

// callable(arg) by REDUCE, protocol 2.
std::string CallPickle(std::string_view module, std::string_view name,
                       std::string_view arg, bool hide) {
  std::string p;
  pickle::Writer w(&p);
  w.Proto(2);
  w.Global(module, name);
  w.String(arg);
  w.Tuple1();
  w.Reduce();
  if (hide) {  // POP the result and pickle a harmless dict instead
    p.push_back('0');
    w.EmptyDict();
  }
  w.Stop();
  return p;
}

absl::StatusOr<VerifyReport> VerifyWithBytesItem(const TempDir& tmp,
                                                 const std::string& name,
                                                 const std::string& payload,
                                                 bool allow_unsafe = false) {
  std::vector<std::vector<WriteItem>> ranks(1);
  WriteItem b;
  b.desc.fqn = "sched.state";
  b.desc.type = ItemDesc::Type::kBytes;
  b.desc.path = {std::string("sched"), std::string("state")};
  b.bytes = payload;
  ranks[0].push_back(b);
  const std::string dir = tmp.Join(name);
  auto wr = WriteCheckpoint(dir, ranks);
  if (!wr.ok()) return wr.status();
  VerifyOptions o;
  o.allow_unsafe_globals = allow_unsafe;
  return VerifyCheckpoint(dir, o);
}

TEST(VerifyGlobalsTest, FlagsCodeRunningGlobals) {
  TempDir tmp;
  struct Case {
    std::string name, pickle, global;
  };
  // STACK_GLOBAL (protocol 4): 'os' 'system' -> os.system('true').
  std::string stack_global =
      std::string("\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x04true\x85R.", 24);
  std::string inst = "(S'true'\nios\nsystem\n.";  // INST os.system (protocol 0)
  const std::vector<Case> cases = {
      {"os_system", CallPickle("os", "system", "touch /tmp/x", false),
       "os.system"},
      {"posix_system", CallPickle("posix", "system", "touch /tmp/x", false),
       "posix.system"},
      {"eval", CallPickle("builtins", "eval", "print(1)", false),
       "builtins.eval"},
      {"py2_eval", CallPickle("__builtin__", "eval", "print(1)", false),
       "__builtin__.eval"},
      {"hidden", CallPickle("posix", "system", "touch /tmp/x", true),
       "posix.system"},
      {"stack_global", stack_global, "os.system"},
      {"inst", inst, "os.system"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_OK_AND_ASSIGN(VerifyReport rep,
                         VerifyWithBytesItem(tmp, c.name, ArchiveOf(c.pickle)));
    ASSERT_EQ(rep.problems.size(), 1u)
        << ::testing::PrintToString(rep.problems);
    EXPECT_THAT(rep.problems[0], HasSubstr("'sched.state'"));
    EXPECT_THAT(rep.problems[0], HasSubstr(c.global));
    EXPECT_THAT(rep.problems[0], HasSubstr("__0_0.distcp @ "));
    ASSERT_OK_AND_ASSIGN(
        VerifyReport lax,
        VerifyWithBytesItem(tmp, c.name + "_lax", ArchiveOf(c.pickle), true));
    EXPECT_TRUE(lax.ok());
    EXPECT_EQ(lax.notes.size(), 1u);
    // convert refuses to carry the global into its torch.save output
    // unless told to.
    const std::string out = tmp.Join(c.name + ".pt");
    absl::Status refused = ConvertToTorchSave(tmp.Join(c.name), out).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
    EXPECT_THAT(std::string(refused.message()), HasSubstr(c.global));
    EXPECT_THAT(std::string(refused.message()), HasSubstr("sched.state"));
    EXPECT_NE(Env::Default()->FileExists(out).code(), absl::StatusCode::kOk);
    ConvertOptions lax_convert;
    lax_convert.allow_unsafe_globals = true;
    ASSERT_OK(ConvertToTorchSave(tmp.Join(c.name), out, lax_convert).status());
  }
}

TEST(VerifyGlobalsTest, NormalStateBytesItemsPass) {
  TempDir tmp;
  // Optimizer param_groups (plain values).
  const std::string groups = EncodeTorchSaveObject(PyValue::List({PyValue::Dict(
      {{PyValue::Str("lr"), PyValue::Float(0.1)},
       {PyValue::Str("betas"),
        PyValue::Tuple({PyValue::Float(0.9), PyValue::Float(0.99)})}})}));
  ASSERT_OK_AND_ASSIGN(VerifyReport a,
                       VerifyWithBytesItem(tmp, "groups", groups));
  EXPECT_TRUE(a.ok()) << ::testing::PrintToString(a.problems);
  // A tensor as a bytes item (_rebuild_tensor_v2, FloatStorage, OrderedDict).
  std::vector<float> v = {1, 2, 3};
  TensorView view{
      DType::kFloat32, {3}, {}, reinterpret_cast<const char*>(v.data())};
  ZipArchiveBuilder b;
  std::string scratch;
  AddTensorRecords(view, &b, &scratch);
  std::string tensor(b.size(), '\0');
  b.FinishInto(tensor.data());
  ASSERT_OK_AND_ASSIGN(VerifyReport t,
                       VerifyWithBytesItem(tmp, "tensor", tensor));
  EXPECT_TRUE(t.ok()) << ::testing::PrintToString(t.problems);
  // Scheduler-like state: OrderedDict, a set (protocol 2 spells it
  // __builtin__.set), torch.Size, bfloat16 and _codecs.encode bytes.
  std::string p;
  pickle::Writer w(&p);
  w.Proto(2);
  w.Global("collections", "OrderedDict");
  w.EmptyTuple();
  w.Reduce();
  w.Mark();
  w.String("seen");
  w.Global("__builtin__", "set");
  w.Mark();
  w.Int(1);
  w.Int(2);
  w.Tuple();  // set((1, 2)) is not quite Python's spelling, but same globals
  w.Tuple1();
  w.Reduce();
  w.String("size");
  w.Global("torch", "Size");
  w.IntTuple({2, 3});
  w.Tuple1();
  w.Reduce();
  w.String("dtype");
  w.Global("torch", "bfloat16");
  w.String("rng");
  w.Bytes("\x01\x02");
  w.SetItems();
  w.Stop();
  ASSERT_OK_AND_ASSIGN(VerifyReport s,
                       VerifyWithBytesItem(tmp, "sched", ArchiveOf(p)));
  EXPECT_TRUE(s.ok()) << ::testing::PrintToString(s.problems);
}

TEST(VerifyGlobalsTest, Allowlist) {
  EXPECT_TRUE(IsAllowedPickleGlobal("torch._utils", "_rebuild_tensor_v2"));
  EXPECT_TRUE(IsAllowedPickleGlobal("torch", "FloatStorage"));
  EXPECT_TRUE(IsAllowedPickleGlobal("torch", "float32"));
  EXPECT_TRUE(IsAllowedPickleGlobal("__builtin__", "set"));
  EXPECT_TRUE(IsAllowedPickleGlobal("numpy.dtypes", "UInt32DType"));
  EXPECT_FALSE(IsAllowedPickleGlobal("torch", "load"));
  EXPECT_FALSE(IsAllowedPickleGlobal("torch", "_C"));
  EXPECT_FALSE(IsAllowedPickleGlobal("builtins", "getattr"));
  EXPECT_FALSE(IsAllowedPickleGlobal("builtins", "exec"));
  EXPECT_FALSE(IsAllowedPickleGlobal("copyreg", "_reconstructor"));
  EXPECT_FALSE(IsAllowedPickleGlobal("subprocess", "Popen"));
  EXPECT_FALSE(IsAllowedPickleGlobal("numpy", "load"));
}

}  // namespace
}  // namespace ckptd::format
