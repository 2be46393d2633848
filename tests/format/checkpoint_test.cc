// Copyright 2026 The ckptd Authors.
//
// Round trips through the checkpoint writer and the resharding reader:
// random shapes, every dtype, 0-d tensors, zero-length dimensions and
// non-contiguous sources, saved by 1–8 ranks and read back in a different
// layout, byte-exact.
#include <cstring>
#include <numeric>
#include <random>

#include "format/checkpoint/checkpoint_reader.h"
#include "format/checkpoint/checkpoint_writer.h"
#include "format/pickle/py_value.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace ckptd::format {
namespace {

using ::ckptd::testing::TempDir;

int64_t Numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t v : s) n *= v;
  return n;
}

// A tensor's full contents in C order.
struct Global {
  std::string fqn;
  DType dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

// Copies box [off, off+size) of g into a new buffer laid out with `strides`
// (elements); returns the buffer (large enough for the strided layout).
std::string ExtractBox(const Global& g, const std::vector<int64_t>& off,
                       const std::vector<int64_t>& size, const std::vector<int64_t>& strides) {
  const size_t es = ElementSize(g.dtype);
  const size_t nd = g.shape.size();
  int64_t span = 1;
  for (size_t d = 0; d < nd; ++d) {
    if (size[d] == 0) return std::string();
    span += (size[d] - 1) * strides[d];
  }
  std::string out(span * es, '\xAB');
  const auto gstr = ContiguousStrides(g.shape);
  std::vector<int64_t> idx(nd, 0);
  for (int64_t n = 0; n < Numel(size); ++n) {
    int64_t src = 0, dst = 0;
    for (size_t d = 0; d < nd; ++d) {
      src += (off[d] + idx[d]) * gstr[d];
      dst += idx[d] * strides[d];
    }
    std::memcpy(out.data() + dst * es, g.bytes.data() + src * es, es);
    for (size_t d = nd; d-- > 0;) {
      if (++idx[d] < size[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

// Random strides for `size`: C order, a permuted order, or padded rows.
std::vector<int64_t> RandomStrides(const std::vector<int64_t>& size, std::mt19937_64& rng) {
  const size_t nd = size.size();
  std::vector<size_t> order(nd);
  std::iota(order.begin(), order.end(), 0);
  const int mode = rng() % 3;
  if (mode == 1) std::shuffle(order.begin(), order.end(), rng);
  std::vector<int64_t> strides(nd);
  int64_t s = 1;
  for (size_t k = nd; k-- > 0;) {
    strides[order[k]] = s;
    s *= std::max<int64_t>(size[order[k]], 1) + (mode == 2 ? rng() % 3 : 0);
  }
  return strides;
}

// Splits `shape` along `dim` into n pieces (some may be empty).
std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> Split(
    const std::vector<int64_t>& shape, int dim, int n) {
  std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> out;
  if (shape.empty()) {
    out.push_back({{}, {}});
    return out;
  }
  const int64_t len = shape[dim];
  const int64_t per = (len + n - 1) / std::max(n, 1);
  for (int r = 0; r < n; ++r) {
    std::vector<int64_t> off(shape.size(), 0), size = shape;
    off[dim] = std::min<int64_t>(len, r * per);
    size[dim] = std::min<int64_t>(len, off[dim] + per) - off[dim];
    out.push_back({off, size});
  }
  return out;
}

class CheckpointRoundTripTest : public ::testing::TestWithParam<int> {};

TEST_P(CheckpointRoundTripTest, RandomShardingsReshardByteExact) {
  const uint64_t seed = ::ckptd::testing::TestSeed() + GetParam();
  std::mt19937_64 rng(seed);
  TempDir tmp;
  const int save_ranks = 1 + rng() % 8;
  // Tensors: every dtype at least once across the parameterized runs.
  std::vector<Global> tensors;
  const int n_tensors = 3 + rng() % 5;
  for (int t = 0; t < n_tensors; ++t) {
    Global g;
    g.fqn = "model.layers." + std::to_string(t) + ".w";
    g.dtype = static_cast<DType>((GetParam() * 7 + t) % kNumDTypes);
    const int nd = rng() % 4;
    for (int d = 0; d < nd; ++d) g.shape.push_back(rng() % 7 == 0 ? 0 : 1 + rng() % 9);
    g.bytes.resize(Numel(g.shape) * ElementSize(g.dtype));
    for (char& c : g.bytes) c = static_cast<char>(rng());
    tensors.push_back(std::move(g));
  }
  // Save: each tensor sharded along a random dim, or replicated on every rank.
  std::vector<std::vector<WriteItem>> ranks(save_ranks);
  std::vector<std::string> buffers;  // keeps source data alive
  buffers.reserve(1000);
  for (const Global& g : tensors) {
    const bool replicate = rng() % 3 == 0;
    const int dim = g.shape.empty() ? 0 : rng() % g.shape.size();
    auto pieces = Split(g.shape, dim, replicate || g.shape.empty() ? 1 : save_ranks);
    for (int r = 0; r < save_ranks; ++r) {
      if (!replicate && r >= static_cast<int>(pieces.size())) break;
      const auto& [off, size] = pieces[replicate ? 0 : r];
      WriteItem it;
      it.desc.fqn = g.fqn;
      it.desc.dtype = g.dtype;
      it.desc.global_shape = g.shape;
      it.desc.chunk_offsets = off;
      it.desc.chunk_sizes = size;
      auto strides = RandomStrides(size, rng);
      buffers.push_back(ExtractBox(g, off, size, strides));
      it.tensor = {g.dtype, size, strides, buffers.back().data()};
      ranks[r].push_back(std::move(it));
    }
  }
  // A replicated bytes item and a rank-specific one.
  const PyValue hp = PyValue::Dict({{PyValue::Str("lr"), PyValue::Float(0.001)},
                                    {PyValue::Str("betas"),
                                     PyValue::Tuple({PyValue::Float(0.9), PyValue::Float(0.999)})},
                                    {PyValue::Str("step"), PyValue::Int(int64_t{1} << 40)}});
  const std::string hp_bytes = EncodeTorchSaveObject(hp);
  for (int r = 0; r < save_ranks; ++r) {
    WriteItem it;
    it.desc.fqn = "optim.param_groups";
    it.desc.type = ItemDesc::Type::kBytes;
    it.desc.path = {std::string("optim"), std::string("param_groups")};
    it.bytes = hp_bytes;
    ranks[r].push_back(it);
  }
  CheckpointWriterOptions wopts;
  wopts.io_threads = 1 + rng() % 3;
  const std::string dir = tmp.Join("ckpt");
  ASSERT_OK_AND_ASSIGN(WriteResult wr, WriteCheckpoint(dir, ranks, wopts));
  EXPECT_EQ(wr.files, static_cast<size_t>(save_ranks));

  // Read back resharded over a different number of ranks, into strided
  // destinations, with 1-4 reader threads.
  CheckpointReaderOptions ropts;
  ropts.threads = 1 + GetParam() % 4;
  ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(dir, ropts));
  EXPECT_EQ(reader->metadata().state_dict_metadata.size(), tensors.size() + 1);
  const int load_ranks = 1 + rng() % 8;
  for (const Global& g : tensors) {
    const int dim = g.shape.empty() ? 0 : rng() % g.shape.size();
    for (const auto& [off, size] : Split(g.shape, dim, g.shape.empty() ? 1 : load_ranks)) {
      auto strides = RandomStrides(size, rng);
      int64_t span = 1;
      bool empty = false;
      for (size_t d = 0; d < size.size(); ++d) {
        if (size[d] == 0) empty = true;
        span += std::max<int64_t>(size[d] - 1, 0) * strides[d];
      }
      std::string dest(empty ? 0 : span * ElementSize(g.dtype), '\0');
      TensorRequest req{g.fqn, off, {g.dtype, size, strides, dest.data()}};
      ReadStats stats;
      ASSERT_OK(reader->ReadTensors({&req, 1}, &stats));
      const std::string expect = ExtractBox(g, off, size, strides);
      // Compare element by element (padding bytes are not written).
      std::vector<int64_t> idx(size.size(), 0);
      const size_t es = ElementSize(g.dtype);
      for (int64_t n = 0; n < Numel(size); ++n) {
        int64_t p = 0;
        for (size_t d = 0; d < size.size(); ++d) p += idx[d] * strides[d];
        ASSERT_EQ(0, std::memcmp(dest.data() + p * es, expect.data() + p * es, es))
            << g.fqn << " box " << DescribeBox(off, size) << " element " << n << " seed " << seed;
        for (size_t d = size.size(); d-- > 0;) {
          if (++idx[d] < size[d]) break;
          idx[d] = 0;
        }
      }
    }
  }
  ASSERT_OK_AND_ASSIGN(PyValue got, reader->ReadObject("optim.param_groups"));
  EXPECT_EQ(got, hp) << got.Repr();
  ASSERT_TRUE(reader->metadata().planner_data.has_value());
}

INSTANTIATE_TEST_SUITE_P(Seeds, CheckpointRoundTripTest, ::testing::Range(0, 24));

TEST(CheckpointReaderTest, SmallPieceOfLargeChunkReadsOnlyWhatItNeeds) {
  TempDir tmp;
  // One 16 MiB float32 chunk [4096, 1024]; read rows 100..103.
  Global g{"big", DType::kFloat32, {4096, 1024}, {}};
  g.bytes.resize(4096 * 1024 * 4);
  for (size_t i = 0; i < g.bytes.size(); ++i) g.bytes[i] = static_cast<char>(i * 7);
  std::vector<std::vector<WriteItem>> ranks(1);
  WriteItem it;
  it.desc = {"big", ItemDesc::Type::kTensor, DType::kFloat32, g.shape, {0, 0}, g.shape, {}};
  it.tensor = {DType::kFloat32, g.shape, {}, g.bytes.data()};
  ranks[0].push_back(it);
  ASSERT_OK(WriteCheckpoint(tmp.Join("c"), ranks).status());
  // Without the CRC check (which reads the whole record once: see
  // read_crc_test.cc), a piece costs only its bytes.
  CheckpointReaderOptions nocrc;
  nocrc.verify_crc = false;
  ASSERT_OK_AND_ASSIGN(auto reader,
                       CheckpointReader::Open(tmp.Join("c"), nocrc));
  std::string dest(4 * 1024 * 4, '\0');
  TensorRequest req{"big", {100, 0}, {DType::kFloat32, {4, 1024}, {}, dest.data()}};
  ReadStats stats;
  ASSERT_OK(reader->ReadTensors({&req, 1}, &stats));
  EXPECT_EQ(dest, g.bytes.substr(100 * 4096, 4 * 4096));
  EXPECT_EQ(stats.bytes_read, 4u * 4096);
  // A column slice reads the rows it touches, not the whole chunk.
  std::string col(4096 * 2 * 4, '\0');
  TensorRequest creq{"big", {0, 10}, {DType::kFloat32, {4096, 2}, {}, col.data()}};
  ReadStats cstats;
  ASSERT_OK(reader->ReadTensors({&creq, 1}, &cstats));
  EXPECT_EQ(col, ExtractBox(g, {0, 10}, {4096, 2}, {2, 1}));
  EXPECT_LE(cstats.bytes_read, 4u * 1024 * 4096);  // never more than the chunk
}

TEST(CheckpointReaderTest, ErrorsAreClear) {
  TempDir tmp;
  std::string data(24 * 4, '\x01');
  std::vector<std::vector<WriteItem>> ranks(1);
  WriteItem it;
  it.desc = {"w", ItemDesc::Type::kTensor, DType::kFloat32, {4, 6}, {0, 0}, {4, 6}, {}};
  it.tensor = {DType::kFloat32, {4, 6}, {}, data.data()};
  ranks[0].push_back(it);
  ASSERT_OK(WriteCheckpoint(tmp.Join("c"), ranks).status());
  // A second write into a committed directory is refused.
  auto again = WriteCheckpoint(tmp.Join("c"), ranks);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition) << again.status();
  CheckpointWriterOptions ow;
  ow.overwrite = true;
  EXPECT_OK(WriteCheckpoint(tmp.Join("c"), ranks, ow).status());

  ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(tmp.Join("c")));
  std::string dest(24 * 4, '\0');
  TensorRequest missing{"nope", {0, 0}, {DType::kFloat32, {4, 6}, {}, dest.data()}};
  EXPECT_EQ(reader->ReadTensors({&missing, 1}).code(), absl::StatusCode::kNotFound);
  TensorRequest outside{"w", {2, 0}, {DType::kFloat32, {4, 6}, {}, dest.data()}};
  EXPECT_EQ(reader->ReadTensors({&outside, 1}).code(), absl::StatusCode::kOutOfRange);
  TensorRequest wrong_dtype{"w", {0, 0}, {DType::kInt32, {4, 6}, {}, dest.data()}};
  EXPECT_EQ(reader->ReadTensors({&wrong_dtype, 1}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckpointReader::Open(tmp.Join("nothing")).status().code(),
            absl::StatusCode::kNotFound);
  // Mismatched data size is rejected before anything is written.
  WriteItem bad = it;
  bad.tensor.sizes = {4, 5};
  std::vector<std::vector<WriteItem>> bad_ranks(1, std::vector<WriteItem>{bad});
  auto s = WriteCheckpoint(tmp.Join("bad"), bad_ranks);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(Env::Default()->FileExists(tmp.Join("bad/.metadata")).ok());
}

TEST(CheckpointReaderTest, RejectsPathEscapes) {
  EXPECT_TRUE(IsSafeRelativePath("__0_0.distcp"));
  EXPECT_FALSE(IsSafeRelativePath("../x"));
  EXPECT_FALSE(IsSafeRelativePath("/etc/passwd"));
  EXPECT_FALSE(IsSafeRelativePath("a/../../b"));
  EXPECT_FALSE(IsSafeRelativePath(""));
}

}  // namespace
}  // namespace ckptd::format
