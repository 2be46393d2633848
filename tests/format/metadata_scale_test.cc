// Copyright 2026 The ckptd Authors.
//
// The read side at scale, sized for CI: a checkpoint of 200,000 chunks (100
// ranks x 2,000 row-sharded tensors) written by WriteCheckpoint, its
// .metadata decoded by the streaming decoder (from memory and streamed from
// the file) and compared with what was written, chunk by chunk; every tensor
// (every 16th under ASan/TSan) read back
// resharded into 7 ranks and compared with the formula the data was made
// from; and a .metadata of the same shape in stock torch's protocol-4 form
// (NEWOBJ + BUILD, MEMOIZE, STACK_GLOBAL, FRAME, shared strings through the
// memo) decoded and compared. The 2-million-chunk figures are
// bench/metadata_bench.cc's.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/env.h"
#include "fmt/format.h"
#include "format/checkpoint/checkpoint_reader.h"
#include "format/checkpoint/checkpoint_writer.h"
#include "format/metadata/compact_metadata.h"
#include "format/metadata/metadata.h"
#include "format/metadata/metadata_decode.h"
#include "gtest/gtest.h"
#include "tests/testing/sanitizers.h"
#include "tests/testing/stock_style.h"
#include "tests/testing/test_util.h"

namespace ckptd::format {
namespace {

using ::ckptd::testing::StockStyle;
using ::ckptd::testing::TempDir;

// Under a sanitizer (10-20x slower) a quarter of the ranks: the same code
// paths at 50,000 chunks; the release pass runs the full 200,000.
constexpr int kRanks = ::ckptd::testing::kSlowSanitizer ? 25 : 100;
constexpr int kTensors = 2000;
constexpr int64_t kRowsPerRank = 2;
constexpr int64_t kCols = 3;
constexpr int64_t kRows = kRanks * kRowsPerRank;

float Value(int t, int64_t row, int64_t col) {
  return static_cast<float>(t * 1000003 + row * 31 + col);
}

std::string Fqn(int t) {
  return fmt::format("model.layers.{}.mlp.w{}.weight", t / 8, t % 8);
}

class Seconds {
 public:
  double operator()() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_)
        .count();
  }

 private:
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

class ScaleTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir();
    dir_ = new std::string(tmp_->Join("ckpt"));
    data_ =
        new std::vector<float>(static_cast<size_t>(kTensors) * kRows * kCols);
    for (int t = 0; t < kTensors; ++t) {
      for (int64_t r = 0; r < kRows; ++r) {
        for (int64_t c = 0; c < kCols; ++c) {
          (*data_)[(static_cast<size_t>(t) * kRows + r) * kCols + c] =
              Value(t, r, c);
        }
      }
    }
    std::vector<std::vector<WriteItem>> ranks(kRanks);
    for (int r = 0; r < kRanks; ++r) {
      ranks[r].reserve(kTensors);
      for (int t = 0; t < kTensors; ++t) {
        WriteItem w;
        w.desc.fqn = Fqn(t);
        w.desc.dtype = DType::kFloat32;
        w.desc.global_shape = {kRows, kCols};
        w.desc.chunk_offsets = {r * kRowsPerRank, 0};
        w.desc.chunk_sizes = {kRowsPerRank, kCols};
        w.tensor.dtype = DType::kFloat32;
        w.tensor.sizes = {kRowsPerRank, kCols};
        w.tensor.data = reinterpret_cast<const char*>(
            data_->data() +
            (static_cast<size_t>(t) * kRows + r * kRowsPerRank) * kCols);
        ranks[r].push_back(std::move(w));
      }
    }
    CheckpointWriterOptions options;
    options.sync = false;
    Seconds s;
    auto written = WriteCheckpoint(*dir_, ranks, options);
    ASSERT_TRUE(written.ok()) << written.status();
    std::printf(
        "[ scale ] WriteCheckpoint of %d chunks: %.2f s, .metadata %llu "
        "bytes\n",
        kRanks * kTensors, s(),
        static_cast<unsigned long long>(written->metadata_bytes));
  }
  static void TearDownTestSuite() {
    delete data_;
    delete dir_;
    delete tmp_;
  }

  static TempDir* tmp_;
  static std::string* dir_;
  static std::vector<float>* data_;
};

TempDir* ScaleTest::tmp_ = nullptr;
std::string* ScaleTest::dir_ = nullptr;
std::vector<float>* ScaleTest::data_ = nullptr;

// Every chunk of tensor t is rank r's rows, stored in __r_0.distcp.
void ExpectTheSavedLayout(const CompactMetadata& md) {
  ASSERT_EQ(md.num_items(), static_cast<size_t>(kTensors));
  ASSERT_EQ(md.num_chunks(), static_cast<uint64_t>(kRanks) * kTensors);
  ASSERT_EQ(md.num_storage(), static_cast<size_t>(kRanks) * kTensors);
  for (int t = 0; t < kTensors; ++t) {
    const std::optional<size_t> i = md.FindItem(Fqn(t));
    ASSERT_TRUE(i.has_value()) << Fqn(t);
    ASSERT_EQ(md.item(*i).num_chunks, static_cast<uint32_t>(kRanks));
    ASSERT_EQ(md.shape(*i)[0], kRows);
    for (int r = 0; r < kRanks; ++r) {
      const auto off = md.chunk_offsets(*i, r);
      const auto size = md.chunk_sizes(*i, r);
      ASSERT_EQ(off[0], r * kRowsPerRank);
      ASSERT_EQ(size[0], kRowsPerRank);
      const auto* s = md.chunk_storage(*i, r);
      ASSERT_NE(s, nullptr) << Fqn(t) << " chunk " << r;
      ASSERT_EQ(md.relative_path(*s), fmt::format("__{}_0.distcp", r));
      ASSERT_EQ(s->item, *i);
      ASSERT_EQ(s->chunk, static_cast<uint32_t>(r));
    }
  }
}

TEST_F(ScaleTest, DecodesTheMetadataFromMemoryAndStreamed) {
  ASSERT_OK_AND_ASSIGN(
      std::string bytes,
      ReadFileToString(Env::Default(), JoinPath(*dir_, kMetadataName),
                       uint64_t{1} << 30));
  Seconds s;
  DecodeStats stats;
  ASSERT_OK_AND_ASSIGN(CompactMetadata md,
                       DecodeCompactMetadata(bytes, {}, &stats));
  std::printf(
      "[ scale ] DecodeCompactMetadata of %zu bytes: %.3f s, %.1f MB "
      "accounted\n",
      bytes.size(), s(), stats.allocated_bytes / 1e6);
  ExpectTheSavedLayout(md);
  ReadMetadataOptions ropts;
  ropts.block_bytes = 64 << 10;  // many refills
  ASSERT_OK_AND_ASSIGN(
      CompactMetadata streamed,
      ReadCompactMetadata(Env::Default(), JoinPath(*dir_, kMetadataName),
                          ropts));
  ExpectTheSavedLayout(streamed);
}

// Under ASan/TSan (10-50x slower) every 16th tensor is read: the same
// requests, chunk overlaps and thread pool, 1/16 of the repetitions (266 s
// under TSan otherwise, the longest test of the run).
TEST_F(ScaleTest, ReshardsEveryTensorIntoSevenRanks) {
  constexpr int kLoad = 7;
  constexpr int kStride = ::ckptd::testing::kSlowSanitizer ? 16 : 1;
  std::vector<float> out(data_->size(), -1.0f);
  Seconds s;
  uint64_t bytes = 0;
  for (int q = 0; q < kLoad; ++q) {
    CheckpointReaderOptions options;
    options.threads = 2;
    ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(*dir_, options));
    std::vector<TensorRequest> requests;
    const int64_t lo = kRows * q / kLoad, hi = kRows * (q + 1) / kLoad;
    for (int t = 0; t < kTensors; t += kStride) {
      TensorRequest req;
      req.fqn = Fqn(t);
      req.offsets = {lo, 0};
      req.dest.dtype = DType::kFloat32;
      req.dest.sizes = {hi - lo, kCols};
      req.dest.data = reinterpret_cast<char*>(
          out.data() + (static_cast<size_t>(t) * kRows + lo) * kCols);
      requests.push_back(std::move(req));
    }
    ReadStats stats;
    ASSERT_OK(reader->ReadTensors(requests, &stats));
    bytes += stats.bytes_copied;
  }
  constexpr int kRead = (kTensors + kStride - 1) / kStride;
  std::printf("[ scale ] resharded read of %d chunks into %d ranks: %.2f s\n",
              kRanks * kRead, kLoad, s());
  EXPECT_EQ(bytes,
            static_cast<uint64_t>(kRead) * kRows * kCols * sizeof(float));
  for (int t = 0; t < kTensors; ++t) {
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t c = 0; c < kCols; ++c) {
        const size_t k = (static_cast<size_t>(t) * kRows + r) * kCols + c;
        // Tensors not read keep the -1 the buffer was filled with.
        ASSERT_EQ(out[k], t % kStride == 0 ? Value(t, r, c) : -1.0f)
            << Fqn(t) << " [" << r << ", " << c << "]";
      }
    }
  }
}

std::string StockStyleMetadata() {
  const std::string md = "torch.distributed.checkpoint.metadata";
  StockStyle p;
  p.Begin();
  p.NewObj(md, "Metadata");
  p.Op('}');
  p.Memo();
  p.Op('(');
  p.Str("state_dict_metadata");
  p.Op('}');
  p.Memo();
  for (int t = 0; t < kTensors; ++t) {
    if (t % 1000 == 0) p.Op('(');
    p.Str(Fqn(t));
    p.NewObj(md, "TensorStorageMetadata");
    p.Op('}');
    p.Memo();
    p.Op('(');
    p.Str("properties");
    p.NewObj(md, "TensorProperties");
    p.Op('(');
    p.Global("torch", "float32");
    p.Global("torch", "strided");
    p.Op('\x89');
    p.Global(md, "_MEM_FORMAT_ENCODING");
    p.Int(0);
    p.Op('\x85');
    p.Op('R');
    p.Op('\x89');
    p.Op('t');
    p.Memo();
    p.Op('b');
    p.Str("size");
    p.Size({kRows, kCols});
    p.Str("chunks");
    p.Op(']');
    p.Memo();
    p.Op('(');
    for (int r = 0; r < kRanks; ++r) {
      p.NewObj(md, "ChunkStorageMetadata");
      p.Op('}');
      p.Memo();
      p.Op('(');
      p.Str("offsets");
      p.Size({r * kRowsPerRank, 0});
      p.Str("sizes");
      p.Size({kRowsPerRank, kCols});
      p.Op('u');
      p.Op('b');
    }
    p.Op('e');
    p.Op('u');
    p.Op('b');
    if (t % 1000 == 999 || t + 1 == kTensors) p.Op('u');
  }
  p.Str("planner_data");
  p.Op('}');
  p.Memo();
  p.Str("storage_data");
  p.Op('}');
  p.Memo();
  int64_t n = 0;
  for (int r = 0; r < kRanks; ++r) {
    const std::string file = fmt::format("__{}_0.distcp", r);
    for (int t = 0; t < kTensors; ++t, ++n) {
      if (n % 1000 == 0) p.Op('(');
      p.NewObj(md, "MetadataIndex");
      p.Op('}');
      p.Memo();
      p.Op('(');
      p.Str("fqn");
      p.Str(Fqn(t));
      p.Str("index");
      p.Int(r);
      p.Str("offset");
      p.Size({r * kRowsPerRank, 0});
      p.Op('u');
      p.Op('b');
      p.NewObj("torch.distributed.checkpoint.filesystem", "_StorageInfo");
      p.Op('}');
      p.Memo();
      p.Op('(');
      p.Str("relative_path");
      p.Str(file);
      p.Str("offset");
      p.Int(t * 700);
      p.Str("length");
      p.Int(700);
      p.Op('u');
      p.Op('b');
      if (n % 1000 == 999 || n + 1 == int64_t{kRanks} * kTensors) p.Op('u');
    }
  }
  p.Str("version");
  p.Str("1.0.0");
  p.Op('u');
  p.Op('b');
  return p.Take();
}

TEST(MetadataScaleTest, DecodesAStockStyleProgram) {
  const std::string bytes = StockStyleMetadata();
  Seconds s;
  DecodeStats stats;
  ASSERT_OK_AND_ASSIGN(CompactMetadata md,
                       DecodeCompactMetadata(bytes, {}, &stats));
  std::printf(
      "[ scale ] stock-style .metadata, %zu bytes: %.3f s, %llu memo slots "
      "(%llu kept), %.1f MB accounted\n",
      bytes.size(), s(), static_cast<unsigned long long>(stats.memo_slots),
      static_cast<unsigned long long>(stats.memo_stored),
      stats.allocated_bytes / 1e6);
  ExpectTheSavedLayout(md);
  EXPECT_EQ(md.version(), std::optional<std::string>("1.0.0"));
  EXPECT_LT(stats.memo_stored, 10000u);
  // Stock pickles memoize nearly everything: over 10 memo slots per chunk
  // (2 M at the release pass's 200,000 chunks), of which few are kept.
  EXPECT_GT(stats.memo_slots, uint64_t{10} * kRanks * kTensors);
  const auto first = md.storage(12345);
  EXPECT_EQ(md.relative_path(first),
            fmt::format("__{}_0.distcp", 12345 / kTensors));
  EXPECT_EQ(first.offset, (12345 % kTensors) * 700u);
}

}  // namespace
}  // namespace ckptd::format
