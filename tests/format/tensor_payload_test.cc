// Copyright 2026 The ckptd Authors.
#include "format/tensor/tensor_payload.h"

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "fmt/format.h"
#include "format/tensor/strided_copy.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace ckptd::format {
namespace {

// torch 1.13: torch.save(torch.arange(6, dtype=torch.float32).reshape(2, 3))
// (memoized data.pkl, data descriptors, zip64 end records).
const char kTorch113Float32[] =
    "\x50\x4b\x03\x04\x00\x00\x08\x08\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x10\x00\x12\x00\x61\x72\x63\x68\x69\x76\x65\x2f\x64\x61\x74\x61"
    "\x2e\x70\x6b\x6c\x46\x42"
    "\x0e\x00\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x80\x02"
    "\x63\x74\x6f\x72\x63\x68"
    "\x2e\x5f\x75\x74\x69\x6c\x73\x0a\x5f\x72\x65\x62\x75\x69\x6c\x64\x5f\x74"
    "\x65\x6e\x73\x6f\x72\x5f"
    "\x76\x32\x0a\x71\x00\x28\x28\x58\x07\x00\x00\x00\x73\x74\x6f\x72\x61\x67"
    "\x65\x71\x01\x63\x74\x6f"
    "\x72\x63\x68\x0a\x46\x6c\x6f\x61\x74\x53\x74\x6f\x72\x61\x67\x65\x0a\x71"
    "\x02\x58\x01\x00\x00\x00"
    "\x30\x71\x03\x58\x03\x00\x00\x00\x63\x70\x75\x71\x04\x4b\x06\x74\x71\x05"
    "\x51\x4b\x00\x4b\x02\x4b"
    "\x03\x86\x71\x06\x4b\x03\x4b\x01\x86\x71\x07\x89\x63\x63\x6f\x6c\x6c\x65"
    "\x63\x74\x69\x6f\x6e\x73"
    "\x0a\x4f\x72\x64\x65\x72\x65\x64\x44\x69\x63\x74\x0a\x71\x08\x29\x52\x71"
    "\x09\x74\x71\x0a\x52\x71"
    "\x0b\x2e\x50\x4b\x07\x08\xc7\x73\x53\x27\x9a\x00\x00\x00\x9a\x00\x00\x00"
    "\x50\x4b\x03\x04\x00\x00"
    "\x08\x08\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x0e\x00\x2a\x00"
    "\x61\x72\x63\x68\x69\x76\x65\x2f\x64\x61\x74\x61\x2f\x30\x46\x42\x26\x00"
    "\x5a\x5a\x5a\x5a\x5a\x5a"
    "\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a"
    "\x5a\x5a\x5a\x5a\x5a\x5a"
    "\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x00\x00\x00\x00\x00\x00\x80\x3f\x00\x00"
    "\x00\x40\x00\x00\x40\x40"
    "\x00\x00\x80\x40\x00\x00\xa0\x40\x50\x4b\x07\x08\x17\x90\xe7\x91\x18\x00"
    "\x00\x00\x18\x00\x00\x00"
    "\x50\x4b\x03\x04\x00\x00\x08\x08\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x0f\x00\x2b\x00\x61\x72\x63\x68\x69\x76\x65\x2f\x76\x65\x72\x73"
    "\x69\x6f\x6e\x46\x42\x27"
    "\x00\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a"
    "\x5a\x5a\x5a\x5a\x5a\x5a"
    "\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x5a\x33\x0a"
    "\x50\x4b\x07\x08\xd1\x9e"
    "\x67\x55\x02\x00\x00\x00\x02\x00\x00\x00\x50\x4b\x01\x02\x00\x00\x00\x00"
    "\x08\x08\x00\x00\x00\x00"
    "\x00\x00\xc7\x73\x53\x27\x9a\x00\x00\x00\x9a\x00\x00\x00\x10\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x61\x72\x63\x68\x69\x76\x65\x2f\x64\x61"
    "\x74\x61\x2e\x70\x6b\x6c"
    "\x50\x4b\x01\x02\x00\x00\x00\x00\x08\x08\x00\x00\x00\x00\x00\x00\x17\x90"
    "\xe7\x91\x18\x00\x00\x00"
    "\x18\x00\x00\x00\x0e\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\xea\x00\x00\x00\x61\x72"
    "\x63\x68\x69\x76\x65\x2f\x64\x61\x74\x61\x2f\x30\x50\x4b\x01\x02\x00\x00"
    "\x00\x00\x08\x08\x00\x00"
    "\x00\x00\x00\x00\xd1\x9e\x67\x55\x02\x00\x00\x00\x02\x00\x00\x00\x0f\x00"
    "\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x68\x01\x00\x00\x61\x72\x63\x68\x69\x76\x65\x2f"
    "\x76\x65\x72\x73\x69\x6f"
    "\x6e\x50\x4b\x06\x06\x2c\x00\x00\x00\x00\x00\x00\x00\x1e\x03\x2d\x00\x00"
    "\x00\x00\x00\x00\x00\x00"
    "\x00\x03\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00\xb7"
    "\x00\x00\x00\x00\x00\x00"
    "\x00\xd2\x01\x00\x00\x00\x00\x00\x00\x50\x4b\x06\x07\x00\x00\x00\x00\x89"
    "\x02\x00\x00\x00\x00\x00"
    "\x00\x01\x00\x00\x00\x50\x4b\x05\x06\x00\x00\x00\x00\x03\x00\x03\x00\xb7"
    "\x00\x00\x00\xd2\x01\x00"
    "\x00\x00\x00";

// An in-memory file named "mem.pt" in messages.
class StringFile : public InMemoryFile {
 public:
  explicit StringFile(std::string data, std::string path = "mem.pt")
      : InMemoryFile(std::move(data), std::move(path)) {}
};

// An archive in memory, its reader, and the parse result.
struct Parsed {
  std::unique_ptr<StringFile> file;
  std::unique_ptr<ZipArchiveReader> reader;
  absl::StatusOr<TensorRecord> record;
  // The view's elements in C order (empty if the parse failed).
  std::string Gather() const {
    const TensorRecord& r = *record;
    const size_t e = ElementSize(r.dtype);
    std::string storage(r.entry->size, '\0');
    EXPECT_OK(reader->ReadRange(*r.entry, 0, storage.size(), storage.data()));
    int64_t n = 1;
    for (int64_t s : r.sizes) n *= s;
    std::string out(static_cast<size_t>(n) * e, '\0');
    if (n == 0) return out;
    StridedCopy(e, r.sizes, storage.data() + r.storage_offset * e, r.strides,
                out.data(), ContiguousStrides(r.sizes));
    return out;
  }
};

Parsed ParseBytes(std::string bytes, uint64_t offset = 0,
                  const TensorPayloadOptions& options = {}) {
  Parsed p;
  const uint64_t length = bytes.size() - offset;
  p.file = std::make_unique<StringFile>(std::move(bytes));
  auto reader = ZipArchiveReader::Open(p.file.get(), offset, length);
  if (!reader.ok()) {
    p.record = reader.status();
    return p;
  }
  p.reader = std::move(*reader);
  p.record = ParseTensorPayload(*p.reader, options);
  return p;
}

std::string Serialize(const TensorView& view) {
  ZipArchiveBuilder b;
  std::string scratch;
  AddTensorRecords(view, &b, &scratch);
  std::string out(b.size(), '\0');
  b.FinishInto(out.data());
  return out;
}

template <size_t N>
std::string Lit(const char (&s)[N]) {
  return std::string(s, N - 1);
}

std::string Pattern(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// Naive reference gather: element by element, in C order.
std::string NaiveGather(const TensorView& v) {
  const size_t e = ElementSize(v.dtype);
  const int64_t n = v.numel();
  std::string out;
  if (n == 0) return out;
  const auto strides =
      v.strides.empty() ? ContiguousStrides(v.sizes) : v.strides;
  std::vector<int64_t> idx(v.sizes.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = 0;
    for (size_t k = 0; k < idx.size(); ++k) off += idx[k] * strides[k];
    out.append(v.data + off * static_cast<int64_t>(e), e);
    for (size_t k = idx.size(); k-- > 0;) {
      if (++idx[k] < v.sizes[k]) break;
      idx[k] = 0;
    }
  }
  return out;
}

std::vector<DType> AllDTypes() {
  std::vector<DType> out;
  for (int i = 0; i < kNumDTypes; ++i) out.push_back(static_cast<DType>(i));
  return out;
}

TEST(TensorPayloadTest, GoldenPickle) {
  const std::string data = Pattern(24, 1);
  TensorView v{DType::kFloat32, {2, 3}, {}, data.data()};
  Parsed p = ParseBytes(Serialize(v));
  ASSERT_OK(p.record);
  ASSERT_OK_AND_ASSIGN(std::string pkl,
                       p.reader->ReadRecord(*p.reader->Find("data.pkl"), 1000));
  // torch 1.13's program without the BINPUT memo stores.
  const std::string expected =
      Lit("\x80\x02"
          "ctorch._utils\n_rebuild_tensor_v2\n"
          "((X\x07\x00\x00\x00storage"
          "ctorch\nFloatStorage\n"
          "X\x01\x00\x00\x00"
          "0"
          "X\x03\x00\x00\x00"
          "cpu"
          "K\x06"
          "tQ"
          "K\x00"
          "K\x02K\x03\x86"
          "K\x03K\x01\x86"
          "\x89"
          "ccollections\nOrderedDict\n)R"
          "tR.");
  EXPECT_EQ(pkl, expected);
  // Record order and small records.
  const auto& entries = p.reader->entries();
  ASSERT_EQ(entries.size(), 4u);
  EXPECT_EQ(entries[0].name, "archive/data.pkl");
  EXPECT_EQ(entries[1].name, "archive/byteorder");
  EXPECT_EQ(entries[2].name, "archive/data/0");
  EXPECT_EQ(entries[3].name, "archive/version");
  EXPECT_EQ(*p.reader->ReadRecord(entries[1], 100), "little");
  EXPECT_EQ(*p.reader->ReadRecord(entries[3], 100), "3\n");
  EXPECT_EQ(*p.reader->ReadRecord(entries[2], 100), data);
}

TEST(TensorPayloadTest, GoldenPickleV3) {
  const std::string data = Pattern(6, 1);
  TensorView v{DType::kFloat8E4M3FN, {6}, {}, data.data()};
  Parsed p = ParseBytes(Serialize(v));
  ASSERT_OK(p.record);
  ASSERT_OK_AND_ASSIGN(std::string pkl,
                       p.reader->ReadRecord(*p.reader->Find("data.pkl"), 1000));
  const std::string expected =
      Lit("\x80\x02"
          "ctorch._utils\n_rebuild_tensor_v3\n"
          "((X\x07\x00\x00\x00storage"
          "ctorch.storage\nUntypedStorage\n"
          "X\x01\x00\x00\x00"
          "0"
          "X\x03\x00\x00\x00"
          "cpu"
          "K\x06"
          "tQ"
          "K\x00"
          "K\x06\x85"
          "K\x01\x85"
          "\x89"
          "ccollections\nOrderedDict\n)R"
          "ctorch\nfloat8_e4m3fn\n"
          "tR.");
  EXPECT_EQ(pkl, expected);
}

TEST(TensorPayloadTest, AllDTypesRoundTrip) {
  const uint64_t seed = testing::TestSeed();
  const std::vector<std::vector<int64_t>> shapes = {
      {3, 5}, {}, {0}, {2, 0, 3}, {7}, {1, 1, 1}, {2, 3, 4, 5}, {300}};
  for (DType dt : AllDTypes()) {
    for (const auto& shape : shapes) {
      SCOPED_TRACE(
          fmt::format("{} ({})", DTypeName(dt), fmt::join(shape, ",")));
      TensorView v{dt, shape, {}, nullptr};
      const std::string data = Pattern(v.nbytes(), seed);
      v.data = data.data();
      Parsed p = ParseBytes(Serialize(v));
      ASSERT_OK(p.record);
      const TensorRecord& r = *p.record;
      EXPECT_EQ(r.dtype, dt);
      EXPECT_EQ(r.sizes, shape);
      EXPECT_EQ(r.strides, ContiguousStrides(shape));
      EXPECT_EQ(r.storage_offset, 0);
      EXPECT_EQ(r.storage_key, "0");
      EXPECT_EQ(r.storage_nbytes, v.nbytes());
      EXPECT_FALSE(r.big_endian);
      ASSERT_NE(r.entry, nullptr);
      EXPECT_EQ(r.entry->name, "archive/data/0");
      EXPECT_EQ(r.entry->data_offset % 64, 0u);
      EXPECT_EQ(*p.reader->ReadRecord(*r.entry, 1 << 20), data);
      EXPECT_EQ(p.Gather(), data);
      const std::string pkl =
          *p.reader->ReadRecord(*p.reader->Find("data.pkl"), 1000);
      EXPECT_EQ(absl::StrContains(pkl, "_rebuild_tensor_v3"),
                !LegacyStorageClass(dt).has_value());
    }
  }
}

TEST(TensorPayloadTest, ContiguousViewIsReferencedNotCopied) {
  const std::string data = Pattern(4 * 64, 2);
  TensorView v{DType::kFloat32, {8, 8}, {8, 1}, data.data()};
  ZipArchiveBuilder b;
  std::string scratch;
  AddTensorRecords(v, &b, &scratch);
  b.Finish();
  EXPECT_TRUE(scratch.empty());
  bool found = false;
  for (std::string_view s : b.segments())
    found = found || s.data() == data.data();
  EXPECT_TRUE(found);
}

TEST(TensorPayloadTest, NonContiguousViews) {
  const uint64_t seed = testing::TestSeed();
  struct Case {
    const char* name;
    DType dtype;
    std::vector<int64_t> sizes, strides;
    int64_t offset;      // elements into the base buffer
    int64_t base_numel;  // base buffer size
  };
  const std::vector<Case> cases = {
      {"transposed", DType::kFloat32, {6, 4}, {1, 6}, 0, 24},
      {"transposed_big", DType::kFloat64, {300, 200}, {1, 300}, 0, 60000},
      {"sliced_steps", DType::kFloat64, {4, 3}, {24, 3}, 5, 120},
      {"column", DType::kInt16, {10}, {7}, 3, 70},
      {"permuted3d", DType::kComplex128, {3, 4, 5}, {1, 15, 3}, 0, 60},
      {"size1_dims", DType::kUInt8, {1, 5, 1, 2}, {99, 1, 7, 5}, 0, 10},
      {"broadcast", DType::kInt32, {3, 4}, {0, 1}, 0, 4},
      {"zero_size", DType::kBFloat16, {3, 0, 2}, {5, 9, 1}, 0, 1},
      {"zero_d_strided", DType::kBool, {}, {}, 3, 4},
      {"odd_elem_v3", DType::kUInt16, {5, 5}, {1, 5}, 0, 25},
      {"padded_rows", DType::kInt8, {16, 33}, {40, 1}, 2, 16 * 40},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const size_t e = ElementSize(c.dtype);
    std::string base = Pattern(c.base_numel * e, seed);
    if (c.dtype == DType::kBool) {
      for (char& ch : base) ch &= 1;
    }
    TensorView v{c.dtype, c.sizes, c.strides, base.data() + c.offset * e};
    const std::string expected = NaiveGather(v);
    ZipArchiveBuilder b;
    std::string scratch;
    AddTensorRecords(v, &b, &scratch);
    std::string bytes(b.size(), '\0');
    b.FinishInto(bytes.data());
    Parsed p = ParseBytes(bytes);
    ASSERT_OK(p.record);
    EXPECT_EQ(p.record->sizes, c.sizes);
    EXPECT_EQ(p.record->strides, ContiguousStrides(c.sizes));
    EXPECT_EQ(*p.reader->ReadRecord(*p.record->entry, 1 << 30), expected);
  }
}

TEST(TensorPayloadTest, TensorViewHelpers) {
  EXPECT_EQ(ContiguousStrides({2, 3, 4}), (std::vector<int64_t>{12, 4, 1}));
  EXPECT_EQ(ContiguousStrides({}), (std::vector<int64_t>{}));
  EXPECT_EQ(ContiguousStrides({2, 0, 3}), (std::vector<int64_t>{3, 3, 1}));
  TensorView v{DType::kFloat32, {2, 3}, {}, nullptr};
  EXPECT_EQ(v.numel(), 6);
  EXPECT_EQ(v.nbytes(), 24u);
  EXPECT_TRUE(v.is_contiguous());
  v.strides = {3, 1};
  EXPECT_TRUE(v.is_contiguous());
  v.strides = {1, 2};
  EXPECT_FALSE(v.is_contiguous());
  v.sizes = {1, 3};
  v.strides = {77, 1};
  EXPECT_TRUE(v.is_contiguous());
  v.sizes = {};
  v.strides = {};
  EXPECT_EQ(v.numel(), 1);
}

TEST(TensorPayloadTest, Large64MiB) {
  constexpr int64_t kRows = 4096, kCols = 4096;  // float32: 64 MiB
  std::string data(kRows * kCols * 4, '\0');
  for (size_t i = 0; i < data.size(); i += 4) {
    const float f = static_cast<float>(i / 4);
    std::memcpy(&data[i], &f, 4);
  }
  TensorView v{DType::kFloat32, {kRows, kCols}, {}, data.data()};
  const auto t0 = std::chrono::steady_clock::now();
  std::string bytes = Serialize(v);
  const std::chrono::duration<double> d1 =
      std::chrono::steady_clock::now() - t0;
  Parsed p = ParseBytes(std::move(bytes));
  ASSERT_OK(p.record);
  EXPECT_EQ(p.record->storage_nbytes, data.size());
  ASSERT_OK_AND_ASSIGN(std::string back,
                       p.reader->ReadRecord(*p.record->entry, 1 << 30));
  EXPECT_TRUE(back == data);

  // The transpose goes through the tiled gather.
  TensorView t{DType::kFloat32, {kCols, kRows}, {1, kCols}, data.data()};
  ZipArchiveBuilder b;
  std::string scratch;
  const auto t1 = std::chrono::steady_clock::now();
  AddTensorRecords(t, &b, &scratch);
  const std::chrono::duration<double> d2 =
      std::chrono::steady_clock::now() - t1;
  ASSERT_EQ(scratch.size(), data.size());
  for (int64_t i = 0; i < kCols; i += 97) {
    for (int64_t j = 0; j < kRows; j += 89) {
      float got;
      std::memcpy(&got, &scratch[(i * kRows + j) * 4], 4);
      ASSERT_EQ(got, static_cast<float>(j * kCols + i));
    }
  }
  std::printf(
      "[ perf ] 64 MiB: serialize (incl. allocation) %.1f ms, "
      "transpose gather %.1f ms\n",
      d1.count() * 1e3, d2.count() * 1e3);
}

TEST(TensorPayloadTest, ParsesTorch113File) {
  const std::string bytes(kTorch113Float32, sizeof(kTorch113Float32) - 1);
  ASSERT_EQ(bytes.size(), 747u);
  // Also inside a bigger file.
  for (uint64_t offset : {uint64_t{0}, uint64_t{4096}}) {
    Parsed p = ParseBytes(std::string(offset, 'x') + bytes, offset);
    ASSERT_OK(p.record);
    const TensorRecord& r = *p.record;
    EXPECT_EQ(r.dtype, DType::kFloat32);
    EXPECT_EQ(r.sizes, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(r.strides, (std::vector<int64_t>{3, 1}));
    EXPECT_EQ(r.storage_offset, 0);
    EXPECT_EQ(r.storage_nbytes, 24u);
    EXPECT_FALSE(r.big_endian);
    const std::string got = p.Gather();
    ASSERT_EQ(got.size(), 24u);
    for (int i = 0; i < 6; ++i) {
      float f;
      std::memcpy(&f, got.data() + 4 * i, 4);
      EXPECT_EQ(f, static_cast<float>(i));
    }
    for (const ZipEntry& e : p.reader->entries())
      EXPECT_OK(p.reader->VerifyCrc(e));
  }
}

// ---------------------------------------------------------------------------
// Hand-made pickles for the error paths.
// ---------------------------------------------------------------------------

struct Spec {
  std::string fn = "_rebuild_tensor_v2";
  std::string tag = "storage";
  std::string cls = "FloatStorage";
  std::string cls_module = "torch";
  std::string key = "0";
  int64_t numel = 6;
  int64_t offset = 0;
  std::vector<int64_t> sizes = {2, 3};
  std::vector<int64_t> strides = {3, 1};
  int nargs = 6;
  std::string dtype;          // v3 dtype global name
  bool size_objects = false;  // torch.Size(...) instead of tuples
  bool pid_list = false;      // pid as a list (invalid)
};

std::string MakePickle(const Spec& s) {
  std::string out;
  pickle::Writer w(&out);
  w.Proto(2);
  w.Global("torch._utils", s.fn);
  w.Mark();
  w.Mark();
  w.String(s.tag);
  w.Global(s.cls_module, s.cls);
  w.String(s.key);
  w.String("cpu");
  w.Int(s.numel);
  w.Tuple();
  if (s.pid_list) {
    out.back() = ']';  // replace TUPLE by EMPTY_LIST... (becomes a bad pickle)
  }
  w.BinPersId();
  if (s.nargs >= 2) w.Int(s.offset);
  auto tuple = [&](const std::vector<int64_t>& v) {
    if (s.size_objects) {
      w.Global("torch", "Size");
      w.IntTuple(v);
      w.Tuple1();
      w.Reduce();
    } else {
      w.IntTuple(v);
    }
  };
  if (s.nargs >= 3) tuple(s.sizes);
  if (s.nargs >= 4) tuple(s.strides);
  if (s.nargs >= 5) w.NewFalse();
  if (s.nargs >= 6) {
    w.Global("collections", "OrderedDict");
    w.EmptyTuple();
    w.Reduce();
  }
  if (s.nargs >= 7) {
    if (!s.dtype.empty()) {
      w.Global("torch", s.dtype);
    } else {
      w.EmptyDict();  // v2 metadata
    }
  }
  for (int i = 7; i < s.nargs; ++i) w.None();
  w.Tuple();
  w.Reduce();
  w.Stop();
  return out;
}

struct Rec {
  std::string name;
  std::string data;
};

std::string MakeArchive(const std::vector<Rec>& recs) {
  ZipArchiveBuilder b;
  for (const Rec& r : recs) b.AddOwnedRecord(r.name, r.data);
  std::string out(b.size(), '\0');
  b.FinishInto(out.data());
  return out;
}

std::string StdArchive(const Spec& s, size_t data_bytes = 24) {
  return MakeArchive({{"data.pkl", MakePickle(s)},
                      {"data/" + s.key, std::string(data_bytes, 'd')},
                      {"version", "3\n"}});
}

void ExpectError(const std::string& bytes, std::string_view needle,
                 absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
  Parsed p = ParseBytes(bytes);
  ASSERT_FALSE(p.record.ok())
      << "expected an error containing '" << needle << "'";
  EXPECT_EQ(p.record.status().code(), code) << p.record.status();
  EXPECT_TRUE(
      absl::StrContains(p.record.status().message(),
                        absl::string_view(needle.data(), needle.size())))
      << p.record.status();
  EXPECT_TRUE(absl::StrContains(p.record.status().message(), "mem.pt @ 0"))
      << p.record.status();
}

TEST(TensorPayloadErrorTest, Variants) {
  // Baseline and accepted variants.
  EXPECT_OK(ParseBytes(StdArchive({})).record);
  {
    Spec s;
    s.size_objects = true;
    Parsed p = ParseBytes(StdArchive(s));
    ASSERT_OK(p.record);
    EXPECT_EQ(p.record->sizes, (std::vector<int64_t>{2, 3}));
  }
  {
    Spec s;
    s.nargs = 7;  // v2 with a metadata dict
    EXPECT_OK(ParseBytes(StdArchive(s)).record);
  }
  {
    Spec s;  // v3 + UntypedStorage: numel is bytes
    s.fn = "_rebuild_tensor_v3";
    s.cls = "UntypedStorage";
    s.nargs = 7;
    s.dtype = "float16";
    s.numel = 12;
    Parsed p = ParseBytes(StdArchive(s, 12));
    ASSERT_OK(p.record);
    EXPECT_EQ(p.record->dtype, DType::kFloat16);
    EXPECT_EQ(p.record->storage_nbytes, 12u);
  }
  {
    Spec s;  // v3 as torch.save writes it: torch.storage.UntypedStorage
    s.fn = "_rebuild_tensor_v3";
    s.cls_module = "torch.storage";
    s.cls = "UntypedStorage";
    s.nargs = 7;
    s.dtype = "uint16";
    s.numel = 12;
    Parsed p = ParseBytes(StdArchive(s, 12));
    ASSERT_OK(p.record);
    EXPECT_EQ(p.record->dtype, DType::kUInt16);
    EXPECT_EQ(p.record->storage_nbytes, 12u);
  }
  {
    Spec s;  // a legacy class is only ever in module torch
    s.cls_module = "torch.storage";
    EXPECT_FALSE(ParseBytes(StdArchive(s)).record.ok());
  }
  {
    Spec s;  // v3 with a legacy class and an alias dtype name
    s.fn = "_rebuild_tensor_v3";
    s.nargs = 7;
    s.dtype = "float";
    EXPECT_OK(ParseBytes(StdArchive(s)).record);
  }
  {
    Spec s;  // a view with an offset and a key other than "0"
    s.key = "7";
    s.numel = 10;
    s.offset = 4;
    Parsed p = ParseBytes(StdArchive(s, 40));
    ASSERT_OK(p.record);
    EXPECT_EQ(p.record->storage_offset, 4);
    EXPECT_EQ(p.record->entry->name, "archive/data/7");
  }
  {
    Spec s;  // empty view: any offset is fine
    s.sizes = {0, 3};
    s.offset = 1000;
    EXPECT_OK(ParseBytes(StdArchive(s)).record);
  }
  // .data/version and byteorder.
  {
    auto bytes = MakeArchive({{"data.pkl", MakePickle({})},
                              {"byteorder", "big"},
                              {"data/0", std::string(24, 'd')},
                              {".data/version", "6"}});
    Parsed p = ParseBytes(bytes);
    ASSERT_OK(p.record);
    EXPECT_TRUE(p.record->big_endian);
  }
}

TEST(TensorPayloadErrorTest, ViewOutsideStorage) {
  Spec s;
  s.offset = 1;
  ExpectError(StdArchive(s), "extends past its storage of 24 bytes");
  s = {};
  s.strides = {4, 1};
  ExpectError(StdArchive(s), "extends past its storage");
  s = {};
  s.sizes = {5, 3};
  s.strides = {int64_t{1} << 62, 1};  // (5 - 1) * 2^62 = 2^64
  ExpectError(StdArchive(s), "overflows");
  s = {};
  s.sizes = {int64_t{1} << 40, int64_t{1} << 40};
  s.strides = {0, 0};
  ExpectError(StdArchive(s), "overflows");
  s = {};
  s.numel = int64_t{1} << 62;  // x 4 bytes
  ExpectError(StdArchive(s), "overflows");
  s = {};
  s.offset = -1;
  ExpectError(StdArchive(s), "storage_offset");
  s = {};
  s.sizes = {2, -3};
  ExpectError(StdArchive(s), "size[1]: negative");
  s = {};
  s.strides = {3};
  ExpectError(StdArchive(s), "size has 2 dimensions but stride has 1");
  s = {};
  s.sizes = std::vector<int64_t>(100, 1);
  s.strides = std::vector<int64_t>(100, 1);
  ExpectError(StdArchive(s), "dimensions");
}

TEST(TensorPayloadErrorTest, Records) {
  ExpectError(StdArchive({}, 20), "has 20 bytes, its persistent id needs 24");
  ExpectError(MakeArchive({{"data.pkl", MakePickle({})}, {"version", "3\n"}}),
              "storage record 'archive/data/0' is missing");
  ExpectError(MakeArchive({{"data.pkl", MakePickle({})},
                           {"data/0", std::string(24, 'd')}}),
              "missing record 'archive/version'");
  ExpectError(
      MakeArchive({{"version", "3\n"}, {"data/0", std::string(24, 'd')}}),
      "missing record 'archive/data.pkl'");
  for (const char* v : {"99", "0", "abc", "", "3x", "99999999999999999999"}) {
    ExpectError(MakeArchive({{"data.pkl", MakePickle({})},
                             {"data/0", std::string(24, 'd')},
                             {"version", v}}),
                "unsupported version");
  }
  ExpectError(MakeArchive({{"data.pkl", MakePickle({})},
                           {"byteorder", "middle"},
                           {"data/0", std::string(24, 'd')},
                           {"version", "3"}}),
              "byteorder must be");
  // data.pkl over the limit.
  Parsed p = ParseBytes(StdArchive({}), 0, TensorPayloadOptions{10});
  EXPECT_EQ(p.record.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(TensorPayloadErrorTest, BadPickleShapes) {
  Spec s;
  s.fn = "_rebuild_parameter";
  ExpectError(StdArchive(s),
              "expected a call to torch._utils._rebuild_tensor_v2/v3");
  s = {};
  s.nargs = 5;
  ExpectError(StdArchive(s), "5 arguments (expected 6 or 7)");
  s = {};
  s.nargs = 8;
  ExpectError(StdArchive(s), "8 arguments");
  s = {};
  s.fn = "_rebuild_tensor_v3";
  ExpectError(StdArchive(s), "6 arguments (expected 7)");
  s = {};
  s.fn = "_rebuild_tensor_v3";
  s.nargs = 7;
  s.dtype = "float99";
  ExpectError(StdArchive(s), "unknown dtype");
  s = {};
  s.tag = "storag";
  ExpectError(StdArchive(s), "tag must be 'storage'");
  s = {};
  s.cls = "FooStorage";
  ExpectError(StdArchive(s), "unknown storage class");
  s = {};
  s.numel = -1;
  ExpectError(StdArchive(s), "numel must be a non-negative int");
  // A plain int pickle (a BYTE_IO item, not a tensor).
  ExpectError(MakeArchive({{"data.pkl", std::string("\x80\x02K\x05.", 5)},
                           {"version", "3\n"}}),
              "expected a call to");
  // A truncated pickle: the pickle reader's error, with the source name.
  std::string trunc = MakePickle({});
  trunc.resize(trunc.size() - 3);
  ExpectError(MakeArchive({{"data.pkl", trunc},
                           {"data/0", std::string(24, 'd')},
                           {"version", "3\n"}}),
              "archive/data.pkl");
  // Size as a string.
  {
    std::string pkl;
    pickle::Writer w(&pkl);
    w.Proto(2);
    w.Global("torch._utils", "_rebuild_tensor_v2");
    w.Mark();
    w.Mark();
    w.String("storage");
    w.Global("torch", "FloatStorage");
    w.String("0");
    w.String("cpu");
    w.Int(6);
    w.Tuple();
    w.BinPersId();
    w.Int(0);
    w.String("2x3");
    w.IntTuple({3, 1});
    w.NewFalse();
    w.None();
    w.Tuple();
    w.Reduce();
    w.Stop();
    ExpectError(MakeArchive({{"data.pkl", pkl},
                             {"data/0", std::string(24, 'd')},
                             {"version", "3\n"}}),
                "size: expected a tuple of ints");
  }
  // Storage that is not a persistent id.
  {
    std::string pkl;
    pickle::Writer w(&pkl);
    w.Proto(2);
    w.Global("torch._utils", "_rebuild_tensor_v2");
    w.Mark();
    w.None();
    w.Int(0);
    w.IntTuple({2, 3});
    w.IntTuple({3, 1});
    w.NewFalse();
    w.None();
    w.Tuple();
    w.Reduce();
    w.Stop();
    ExpectError(MakeArchive({{"data.pkl", pkl}, {"version", "3\n"}}),
                "expected a persistent id");
  }
}

// ---------------------------------------------------------------------------
// StridedCopy against a naive reference on random layouts.
// ---------------------------------------------------------------------------

TEST(StridedCopyTest, RandomLayouts) {
  std::mt19937_64 rng(testing::TestSeed());
  for (int iter = 0; iter < 3000; ++iter) {
    const size_t e = std::vector<size_t>{1, 2, 3, 4, 8, 16}[rng() % 6];
    const int nd = static_cast<int>(rng() % 6);
    std::vector<int64_t> sizes(nd);
    const int64_t max_size = nd <= 2 && iter % 10 == 0 ? 300 : 7;
    for (auto& s : sizes) s = static_cast<int64_t>(rng() % max_size);
    // Source and destination: permuted, padded layouts (distinct elements).
    auto layout = [&](std::vector<int64_t>* strides) -> int64_t {
      std::vector<int> perm(nd);
      for (int i = 0; i < nd; ++i) perm[i] = i;
      std::shuffle(perm.begin(), perm.end(), rng);
      strides->assign(nd, 0);
      int64_t stride = 1 + static_cast<int64_t>(rng() % 2);
      for (int i = nd; i-- > 0;) {
        const int k = perm[i];
        (*strides)[k] = stride;
        stride *= std::max<int64_t>(sizes[k], 1) +
                  static_cast<int64_t>(rng() % 3 == 0 ? rng() % 3 : 0);
      }
      return stride + 1;  // elements spanned
    };
    std::vector<int64_t> ss, ds;
    const int64_t sn = layout(&ss);
    const int64_t dn = layout(&ds);
    const std::string src = Pattern(sn * e, rng());
    std::string dst(dn * e, '\x55');
    std::string ref = dst;
    StridedCopy(e, sizes, src.data(), ss, dst.data(), ds);
    // Reference.
    int64_t n = 1;
    for (int64_t s : sizes) n *= s;
    std::vector<int64_t> idx(nd, 0);
    for (int64_t i = 0; i < n; ++i) {
      int64_t so = 0, dof = 0;
      for (int k = 0; k < nd; ++k) {
        so += idx[k] * ss[k];
        dof += idx[k] * ds[k];
      }
      std::memcpy(&ref[dof * e], &src[so * e], e);
      for (int k = nd; k-- > 0;) {
        if (++idx[k] < sizes[k]) break;
        idx[k] = 0;
      }
    }
    ASSERT_EQ(dst, ref) << "iter " << iter << " e=" << e
                        << " sizes=" << fmt::format("{}", fmt::join(sizes, ","))
                        << " ss=" << fmt::format("{}", fmt::join(ss, ","))
                        << " ds=" << fmt::format("{}", fmt::join(ds, ","));
  }
}

}  // namespace
}  // namespace ckptd::format
