// Copyright 2026 The ckptd Authors.
//
// The reader half of the C ABI (ckptd_reader_*): checkpoints written by the
// format library's writer (4 ranks, sharded, replicated and bytes items) and
// read back only through client/ckptd_c.h — metadata JSON, resharding into
// other boxes and strided destinations byte-exact, threads, concurrent
// readers, and the error codes and messages the header promises.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "client/ckptd_c.h"
#include "format/checkpoint/checkpoint_writer.h"
#include "format/pickle/py_value.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/test_util.h"

namespace ckptd {
namespace {

using ::ckptd::testing::TempDir;
using format::DType;
using format::ItemDesc;
using format::PathElement;
using format::PyValue;
using format::WriteItem;
using json = nlohmann::json;

constexpr int kRanks = 4;
constexpr int64_t kRows = 8, kCols = 6;

// The saved values, as formulas of the global index.
float W(int64_t i, int64_t j) { return static_cast<float>(i * 10 + j) + 0.25f; }
float B(int64_t j) { return -1.5f * static_cast<float>(j); }
uint16_t BF(int64_t i, int64_t j) {
  return static_cast<uint16_t>(0x3f00 + i * 16 + j);
}
constexpr int64_t kScalar = -1234567890123;

std::string Error() { return ckptd_last_error(); }

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// A request whose arrays live in the struct (copyable: c() points into it).
struct Request {
  std::string fqn, dtype;
  std::vector<int64_t> offsets, sizes, strides;
  void* data = nullptr;

  ckptd_read_request c() const {
    ckptd_read_request r = {};
    r.fqn = fqn.c_str();
    r.dtype = dtype.c_str();
    r.ndim = static_cast<int32_t>(sizes.size());
    r.offsets = offsets.empty() ? nullptr : offsets.data();
    r.sizes = sizes.empty() ? nullptr : sizes.data();
    r.strides = strides.empty() ? nullptr : strides.data();
    r.data = data;
    return r;
  }
};

int ReadAll(ckptd_reader* reader, const std::vector<Request>& requests,
            uint64_t* bytes_read = nullptr) {
  std::vector<ckptd_read_request> c;
  for (const Request& r : requests) c.push_back(r.c());
  return ckptd_reader_read(reader, c.data(), c.size(), bytes_read);
}

int ReadOne(ckptd_reader* reader, const Request& r) {
  return ReadAll(reader, {r});
}

// Checks a float destination holding box [off, off + size) of W with
// element strides `strides`.
void ExpectBoxOfW(const std::vector<float>& dst, std::vector<int64_t> off,
                  std::vector<int64_t> size, std::vector<int64_t> strides) {
  for (int64_t i = 0; i < size[0]; ++i) {
    for (int64_t j = 0; j < size[1]; ++j) {
      const float got =
          dst[static_cast<size_t>(i * strides[0] + j * strides[1])];
      const float want = W(off[0] + i, off[1] + j);
      ASSERT_EQ(std::memcmp(&got, &want, sizeof got), 0)
          << "element (" << off[0] + i << ", " << off[1] + j << "): " << got
          << " != " << want;
    }
  }
}

class CReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_.Join("ckpt");
    // model.w: float32 [8, 6] in 4 row shards, one per rank.
    w_.resize(kRows * kCols);
    for (int64_t i = 0; i < kRows; ++i) {
      for (int64_t j = 0; j < kCols; ++j) w_[i * kCols + j] = W(i, j);
    }
    for (int64_t j = 0; j < kCols; ++j) b_.push_back(B(j));
    for (int64_t i = 0; i < 5; ++i) {
      for (int64_t j = 0; j < 3; ++j) bf_.push_back(BF(i, j));
    }
    step_bytes_ = format::EncodeTorchSaveObject(PyValue::Int(100));
    extra_bytes_ = std::string("raw\0payload\xff\x00 with NULs", 23);

    std::vector<std::vector<WriteItem>> ranks(kRanks);
    for (int r = 0; r < kRanks; ++r) {
      const int64_t rows = kRows / kRanks;
      WriteItem w;
      w.desc = {"model.w",
                ItemDesc::Type::kTensor,
                DType::kFloat32,
                {kRows, kCols},
                {r * rows, 0},
                {rows, kCols},
                {std::string("model"), std::string("w")}};
      w.tensor = {DType::kFloat32,
                  {rows, kCols},
                  {},
                  reinterpret_cast<const char*>(w_.data() + r * rows * kCols)};
      ranks[r].push_back(w);
      // Replicated on every rank.
      WriteItem b;
      b.desc = {"model.b",
                ItemDesc::Type::kTensor,
                DType::kFloat32,
                {kCols},
                {0},
                {kCols},
                {std::string("model"), std::string("b")}};
      b.tensor = {DType::kFloat32,
                  {kCols},
                  {},
                  reinterpret_cast<const char*>(b_.data())};
      ranks[r].push_back(b);
      WriteItem step;
      step.desc.fqn = "step";
      step.desc.type = ItemDesc::Type::kBytes;
      step.bytes = step_bytes_;
      ranks[r].push_back(step);
    }
    WriteItem scalar;
    scalar.desc = {"scalar", ItemDesc::Type::kTensor, DType::kInt64, {}, {}, {},
                   {}};
    scalar.tensor = {
        DType::kInt64, {}, {}, reinterpret_cast<const char*>(&kScalar)};
    ranks[0].push_back(scalar);
    WriteItem bf;
    bf.desc = {"optim.bf",
               ItemDesc::Type::kTensor,
               DType::kBFloat16,
               {5, 3},
               {0, 0},
               {5, 3},
               {std::string("optim"), std::string("state"), int64_t{3},
                std::string("exp_avg")}};
    bf.tensor = {DType::kBFloat16,
                 {5, 3},
                 {},
                 reinterpret_cast<const char*>(bf_.data())};
    ranks[1].push_back(bf);
    WriteItem flags;
    flags.desc = {"flags", ItemDesc::Type::kTensor, DType::kBool, {3}, {0}, {3},
                  {}};
    flags.tensor = {DType::kBool, {3}, {}, flags_};
    ranks[2].push_back(flags);
    WriteItem z;
    z.desc = {"z", ItemDesc::Type::kTensor, DType::kComplex64, {2}, {0}, {2},
              {}};
    z.tensor = {DType::kComplex64, {2}, {}, reinterpret_cast<const char*>(z_)};
    ranks[3].push_back(z);
    WriteItem extra;
    extra.desc.fqn = "extra";
    extra.desc.type = ItemDesc::Type::kBytes;
    extra.bytes = extra_bytes_;
    ranks[3].push_back(extra);

    format::CheckpointWriterOptions options;
    options.sync = false;
    auto wr = format::WriteCheckpoint(dir_, ranks, options);
    ASSERT_TRUE(wr.ok()) << wr.status();
    written_ = std::move(wr->metadata);
  }

  // Opens dir_ with `threads`; fails the test on error.
  ckptd_reader* Open(int threads = 1) {
    ckptd_reader* r = nullptr;
    EXPECT_EQ(ckptd_reader_open(dir_.c_str(), threads, &r), CKPTD_OK)
        << Error();
    EXPECT_STREQ(ckptd_last_error(), "");
    return r;
  }

  TempDir tmp_;
  std::string dir_;
  std::vector<float> w_, b_;
  std::vector<uint16_t> bf_;
  const char flags_[3] = {1, 0, 1};
  const float z_[4] = {1.0f, -2.0f, 3.5f, 0.125f};
  std::string step_bytes_, extra_bytes_;
  format::Metadata written_;
};

TEST_F(CReaderTest, MetadataJson) {
  ckptd_reader* reader = Open();
  ASSERT_NE(reader, nullptr);
  char* text = nullptr;
  ASSERT_EQ(ckptd_reader_metadata_json(reader, &text), CKPTD_OK) << Error();
  const std::string dumped = text;
  ckptd_free_string(text);
  const json j = json::parse(dumped, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(j.is_object()) << dumped;
  EXPECT_EQ(j.size(), 4u) << dumped;
  EXPECT_EQ(j["dir"], std::filesystem::canonical(dir_).string());
  if (written_.version.has_value()) {
    EXPECT_EQ(j["version"], *written_.version);
  } else {
    EXPECT_TRUE(j["version"].is_null());
  }

  // Entries: the writer's state_dict_metadata, in its order.
  const json& entries = j["entries"];
  ASSERT_TRUE(entries.is_array());
  ASSERT_EQ(entries.size(), written_.state_dict_metadata.size());
  ASSERT_EQ(entries.size(), 8u);
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& [fqn, entry] = written_.state_dict_metadata[i];
    const json& e = entries[i];
    EXPECT_EQ(e["fqn"], fqn) << i;
    if (const auto* t = std::get_if<format::TensorStorageMetadata>(&entry)) {
      EXPECT_EQ(e.size(), 5u) << e.dump();
      EXPECT_EQ(e["type"], "tensor");
      EXPECT_EQ(e["dtype"],
                std::string(format::DTypeName(t->properties.dtype)));
      EXPECT_EQ(e["size"].get<std::vector<int64_t>>(), t->size);
      ASSERT_EQ(e["chunks"].size(), t->chunks.size());
      for (size_t c = 0; c < t->chunks.size(); ++c) {
        EXPECT_EQ(e["chunks"][c].size(), 2u);
        EXPECT_EQ(e["chunks"][c]["offsets"].get<std::vector<int64_t>>(),
                  t->chunks[c].offsets);
        EXPECT_EQ(e["chunks"][c]["sizes"].get<std::vector<int64_t>>(),
                  t->chunks[c].sizes);
      }
    } else {
      EXPECT_EQ(e.size(), 2u) << e.dump();
      EXPECT_EQ(e["type"], "bytes");
    }
  }
  // Spot checks against what was saved, independent of the writer's result.
  std::map<std::string, json> by_fqn;
  for (const json& e : entries) by_fqn[e["fqn"].get<std::string>()] = e;
  EXPECT_EQ(by_fqn["model.w"]["dtype"], "float32");
  EXPECT_EQ(by_fqn["model.w"]["size"], json::parse("[8, 6]"));
  ASSERT_EQ(by_fqn["model.w"]["chunks"].size(), 4u);
  std::set<std::pair<std::vector<int64_t>, std::vector<int64_t>>> chunks;
  for (const json& c : by_fqn["model.w"]["chunks"]) {
    chunks.insert({c["offsets"].get<std::vector<int64_t>>(),
                   c["sizes"].get<std::vector<int64_t>>()});
  }
  EXPECT_EQ(chunks,
            (std::set<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
                {{0, 0}, {2, 6}},
                {{2, 0}, {2, 6}},
                {{4, 0}, {2, 6}},
                {{6, 0}, {2, 6}}}));
  EXPECT_EQ(by_fqn["model.b"]["chunks"].size(), 1u) << "deduplicated";
  EXPECT_EQ(by_fqn["scalar"]["dtype"], "int64");
  EXPECT_EQ(by_fqn["scalar"]["size"], json::array());
  EXPECT_EQ(by_fqn["scalar"]["chunks"],
            json::parse(R"([{"offsets": [], "sizes": []}])"));
  EXPECT_EQ(by_fqn["optim.bf"]["dtype"], "bfloat16");
  EXPECT_EQ(by_fqn["flags"]["dtype"], "bool");
  EXPECT_EQ(by_fqn["z"]["dtype"], "complex64");
  EXPECT_EQ(by_fqn["step"]["type"], "bytes");
  EXPECT_EQ(by_fqn["extra"]["type"], "bytes");

  // planner_data: paths with strings and integers.
  const json& pd = j["planner_data"];
  ASSERT_TRUE(pd.is_object()) << pd.dump();
  EXPECT_EQ(pd["model.w"], json::parse(R"(["model", "w"])"));
  EXPECT_EQ(pd["model.b"], json::parse(R"(["model", "b"])"));
  EXPECT_EQ(pd["scalar"], json::parse(R"(["scalar"])"));
  EXPECT_EQ(pd["step"], json::parse(R"(["step"])"));
  const json& path = pd["optim.bf"];
  ASSERT_EQ(path, json::parse(R"(["optim", "state", 3, "exp_avg"])"));
  EXPECT_TRUE(path[2].is_number_integer());
  EXPECT_EQ(pd.size(), 8u);

  EXPECT_EQ(ckptd_reader_metadata_json(reader, nullptr),
            CKPTD_INVALID_ARGUMENT);
  EXPECT_EQ(ckptd_reader_metadata_json(nullptr, &text), CKPTD_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(Error(), "reader is NULL")) << Error();
  ckptd_reader_close(reader);
  ckptd_reader_close(nullptr);
}

// The loader's view of a checkpoint of millions of chunks: entries without
// chunk lists, and the chunks overlapping a box found by the box index.
TEST_F(CReaderTest, MetadataJsonWithoutChunksAndChunksByBox) {
  ckptd_reader* reader = Open();
  ASSERT_NE(reader, nullptr);
  char* text = nullptr;
  ASSERT_EQ(ckptd_reader_metadata_json_ex(reader, CKPTD_METADATA_JSON_NO_CHUNKS,
                                          &text),
            CKPTD_OK)
      << Error();
  const json slim = json::parse(std::string(text), nullptr, false);
  ckptd_free_string(text);
  ASSERT_EQ(ckptd_reader_metadata_json_ex(reader, 0, &text), CKPTD_OK);
  const json full = json::parse(std::string(text), nullptr, false);
  ckptd_free_string(text);
  ASSERT_EQ(slim["entries"].size(), full["entries"].size());
  for (size_t i = 0; i < full["entries"].size(); ++i) {
    json e = full["entries"][i];
    if (e["type"] == "tensor") {
      const size_t n = e["chunks"].size();
      e.erase("chunks");
      e["num_chunks"] = n;
    }
    EXPECT_EQ(slim["entries"][i], e) << i;
  }
  EXPECT_EQ(slim["planner_data"], full["planner_data"]);
  EXPECT_EQ(ckptd_reader_metadata_json_ex(reader, 2, &text),
            CKPTD_INVALID_ARGUMENT);

  // Rows [1, 5) of model.w overlap the chunks of rows [0, 2) and [2, 4)
  // and [4, 6).
  const int64_t off[2] = {1, 2}, size[2] = {4, 1};
  ASSERT_EQ(ckptd_reader_chunks_json(reader, "model.w", 2, off, size, &text),
            CKPTD_OK)
      << Error();
  const json chunks = json::parse(std::string(text), nullptr, false);
  ckptd_free_string(text);
  ASSERT_EQ(chunks.size(), 3u) << chunks.dump();
  std::set<int64_t> rows;
  for (const json& c : chunks) {
    rows.insert(c["offsets"][0].get<int64_t>());
    EXPECT_EQ(c["sizes"], json::parse("[2, 6]"));
    EXPECT_TRUE(c["file"].get<std::string>().find(".distcp") !=
                std::string::npos);
    EXPECT_GT(c["length"].get<uint64_t>(), 2u * 6 * 4);
  }
  EXPECT_EQ(rows, (std::set<int64_t>{0, 2, 4}));
  ASSERT_EQ(
      ckptd_reader_chunks_json(reader, "model.w", 0, nullptr, nullptr, &text),
      CKPTD_OK);
  EXPECT_EQ(json::parse(std::string(text), nullptr, false).size(), 4u);
  ckptd_free_string(text);
  EXPECT_EQ(
      ckptd_reader_chunks_json(reader, "nope", 0, nullptr, nullptr, &text),
      CKPTD_NOT_FOUND);
  EXPECT_EQ(
      ckptd_reader_chunks_json(reader, "step", 0, nullptr, nullptr, &text),
      CKPTD_INVALID_ARGUMENT);
  EXPECT_EQ(ckptd_reader_chunks_json(reader, "model.w", 1, off, size, &text),
            CKPTD_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(Error(), "ndim 1")) << Error();
  ckptd_reader_close(reader);
}

TEST_F(CReaderTest, RelativeDirIsReportedAbsolute) {
  std::error_code ec;
  const std::string rel =
      std::filesystem::relative(dir_, std::filesystem::current_path(), ec)
          .string();
  ASSERT_FALSE(ec) << ec.message();
  ASSERT_FALSE(rel.empty());
  ASSERT_NE(rel[0], '/');
  ckptd_reader* reader = nullptr;
  ASSERT_EQ(ckptd_reader_open((rel + "/").c_str(), 1, &reader), CKPTD_OK)
      << Error();
  char* text = nullptr;
  ASSERT_EQ(ckptd_reader_metadata_json(reader, &text), CKPTD_OK);
  const json j = json::parse(text, nullptr, false);
  ckptd_free_string(text);
  const std::string got = j["dir"];
  EXPECT_EQ(got[0], '/');
  EXPECT_EQ(got, std::filesystem::canonical(dir_).string());
  ckptd_reader_close(reader);
}

TEST_F(CReaderTest, ReshardsRowsColumnsAndStridedDestinations) {
  // Without payload CRC checks (which read a partly read saved chunk whole,
  // once: read_crc_test.cc), a box costs only its bytes.
  ckptd_reader* reader = nullptr;
  ASSERT_EQ(ckptd_reader_open_ex(dir_.c_str(), 1, CKPTD_READER_NO_VERIFY_CRC,
                                 &reader),
            CKPTD_OK)
      << Error();
  // Three row boxes across the four saved row shards.
  const std::vector<std::pair<int64_t, int64_t>> rows = {
      {0, 3}, {3, 3}, {6, 2}};
  for (const auto& [r0, n] : rows) {
    std::vector<float> dst(static_cast<size_t>(n * kCols), -7.0f);
    Request req{"model.w", "float32", {r0, 0}, {n, kCols}, {}, dst.data()};
    uint64_t bytes_read = 0;
    ASSERT_EQ(ReadAll(reader, {req}, &bytes_read), CKPTD_OK) << Error();
    EXPECT_STREQ(ckptd_last_error(), "");
    EXPECT_EQ(bytes_read, static_cast<uint64_t>(n * kCols * 4));
    ExpectBoxOfW(dst, {r0, 0}, {n, kCols}, {kCols, 1});
  }
  // Column boxes: each touches every saved shard. One call, three requests.
  std::vector<std::vector<float>> cols(3, std::vector<float>(kRows * 2, -7));
  std::vector<Request> creqs;
  for (int k = 0; k < 3; ++k) {
    creqs.push_back(
        {"model.w", "float32", {0, 2 * k}, {kRows, 2}, {}, cols[k].data()});
  }
  ASSERT_EQ(ReadAll(reader, creqs), CKPTD_OK) << Error();
  for (int k = 0; k < 3; ++k) {
    ExpectBoxOfW(cols[k], {0, 2 * k}, {kRows, 2}, {2, 1});
  }
  // The whole tensor into a transposed (column-major) destination.
  std::vector<float> t(kRows * kCols, -7);
  Request treq{"model.w", "float32", {}, {kRows, kCols}, {1, kRows}, t.data()};
  ASSERT_EQ(ReadOne(reader, treq), CKPTD_OK) << Error();
  ExpectBoxOfW(t, {0, 0}, {kRows, kCols}, {1, kRows});
  // An inner box into a padded transposed destination: untouched padding.
  std::vector<float> p(4 * 8, -7);
  Request preq{"model.w", "float", {1, 2}, {5, 3}, {1, 8}, p.data()};
  ASSERT_EQ(ReadOne(reader, preq), CKPTD_OK) << Error();
  ExpectBoxOfW(p, {1, 2}, {5, 3}, {1, 8});
  for (int64_t j = 0; j < 3; ++j) {
    for (int64_t pad = 5; pad < 8; ++pad) EXPECT_EQ(p[j * 8 + pad], -7);
  }
  // The replicated vector, a slice of it.
  std::vector<float> b(3, -7);
  ASSERT_EQ(ReadOne(reader, {"model.b", "float32", {2}, {3}, {}, b.data()}),
            CKPTD_OK)
      << Error();
  EXPECT_EQ(b, (std::vector<float>{B(2), B(3), B(4)}));
  // An empty box needs no buffer.
  ASSERT_EQ(
      ReadOne(reader, {"model.w", "float32", {8, 0}, {0, 6}, {}, nullptr}),
      CKPTD_OK)
      << Error();
  // No requests at all.
  uint64_t bytes_read = 99;
  EXPECT_EQ(ckptd_reader_read(reader, nullptr, 0, &bytes_read), CKPTD_OK);
  EXPECT_EQ(bytes_read, 0u);
  ckptd_reader_close(reader);
}

TEST_F(CReaderTest, ScalarBFloat16BoolComplexAndBytes) {
  ckptd_reader* reader = Open();
  ASSERT_NE(reader, nullptr);
  int64_t scalar = 0;
  ckptd_read_request sreq = {};
  sreq.fqn = "scalar";
  sreq.dtype = "int64";
  sreq.ndim = 0;  // offsets, sizes, strides NULL
  sreq.data = &scalar;
  ASSERT_EQ(ckptd_reader_read(reader, &sreq, 1, nullptr), CKPTD_OK) << Error();
  EXPECT_EQ(scalar, kScalar);
  scalar = 0;
  sreq.dtype = "long";  // torch's alias
  ASSERT_EQ(ckptd_reader_read(reader, &sreq, 1, nullptr), CKPTD_OK) << Error();
  EXPECT_EQ(scalar, kScalar);

  // bfloat16: rows 1..3, columns 1..2.
  std::vector<uint16_t> bf(3 * 2, 0);
  ASSERT_EQ(
      ReadOne(reader, {"optim.bf", "bfloat16", {1, 1}, {3, 2}, {}, bf.data()}),
      CKPTD_OK)
      << Error();
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 2; ++j) EXPECT_EQ(bf[i * 2 + j], BF(1 + i, 1 + j));
  }
  char flags[3] = {9, 9, 9};
  ASSERT_EQ(ReadOne(reader, {"flags", "bool", {}, {3}, {}, flags}), CKPTD_OK)
      << Error();
  EXPECT_EQ(std::string(flags, 3), std::string(flags_, 3));
  float z[2] = {0, 0};
  ASSERT_EQ(ReadOne(reader, {"z", "complex64", {1}, {1}, {}, z}), CKPTD_OK)
      << Error();
  EXPECT_EQ(z[0], 3.5f);
  EXPECT_EQ(z[1], 0.125f);

  char* data = nullptr;
  uint64_t len = 0;
  ASSERT_EQ(ckptd_reader_read_bytes(reader, "step", &data, &len), CKPTD_OK)
      << Error();
  EXPECT_EQ(std::string(data, len), step_bytes_);
  ckptd_free_string(data);
  ASSERT_EQ(ckptd_reader_read_bytes(reader, "extra", &data, &len), CKPTD_OK)
      << Error();
  EXPECT_EQ(len, extra_bytes_.size());
  EXPECT_EQ(std::string(data, len), extra_bytes_);
  ckptd_free_string(data);
  ckptd_reader_close(reader);
}

TEST_F(CReaderTest, ThreadsGiveIdenticalResults) {
  // Many requests at once: every (tensor, chunk) group is a unit of work.
  auto run = [&](int threads, std::vector<std::vector<char>>* out,
                 uint64_t* bytes_read) {
    ckptd_reader* reader = Open(threads);
    ASSERT_NE(reader, nullptr);
    std::vector<Request> reqs;
    out->clear();
    out->reserve(32);
    auto add = [&](Request r, size_t bytes) {
      out->emplace_back(bytes, '\x5a');
      r.data = out->back().data();
      reqs.push_back(std::move(r));
    };
    for (int64_t r0 = 0; r0 < kRows; r0 += 3) {
      const int64_t n = std::min<int64_t>(3, kRows - r0);
      add({"model.w", "float32", {r0, 0}, {n, kCols}, {}, nullptr},
          n * kCols * 4);
    }
    for (int64_t c0 = 0; c0 < kCols; c0 += 4) {
      const int64_t n = std::min<int64_t>(4, kCols - c0);
      add({"model.w", "float32", {0, c0}, {kRows, n}, {1, kRows}, nullptr},
          kRows * n * 4);
    }
    add({"model.b", "float32", {}, {kCols}, {}, nullptr}, kCols * 4);
    add({"optim.bf", "bfloat16", {}, {5, 3}, {1, 5}, nullptr}, 15 * 2);
    add({"scalar", "int64", {}, {}, {}, nullptr}, 8);
    add({"flags", "bool", {}, {3}, {}, nullptr}, 3);
    add({"z", "complex64", {}, {2}, {}, nullptr}, 16);
    ASSERT_EQ(ReadAll(reader, reqs, bytes_read), CKPTD_OK) << Error();
    ckptd_reader_close(reader);
  };
  std::vector<std::vector<char>> one, four;
  uint64_t read_one = 0, read_four = 0;
  ASSERT_NO_FATAL_FAILURE(run(1, &one, &read_one));
  ASSERT_NO_FATAL_FAILURE(run(4, &four, &read_four));
  EXPECT_EQ(one, four);
  EXPECT_EQ(read_one, read_four);
  EXPECT_GT(read_one, 0u);
  // And both are right (the first three buffers are the row boxes).
  std::vector<float> rows(kRows * kCols);
  std::memcpy(rows.data(), four[0].data(), 3 * kCols * 4);
  std::memcpy(rows.data() + 3 * kCols, four[1].data(), 3 * kCols * 4);
  std::memcpy(rows.data() + 6 * kCols, four[2].data(), 2 * kCols * 4);
  ExpectBoxOfW(rows, {0, 0}, {kRows, kCols}, {kCols, 1});
}

TEST_F(CReaderTest, ConcurrentReadsOnOneReader) {
  ckptd_reader* reader = Open(/*threads=*/3);
  ASSERT_NE(reader, nullptr);
  constexpr int kThreads = 8, kIters = 25;
  std::atomic<int> failures{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t) {
    pool.emplace_back([&, t] {
      for (int it = 0; it < kIters; ++it) {
        const int64_t r0 = (t + it) % kRows;
        const int64_t n = kRows - r0;
        std::vector<float> dst(static_cast<size_t>(n * kCols), -1);
        std::vector<float> col(kRows, -1);
        std::vector<Request> reqs = {
            {"model.w", "float32", {r0, 0}, {n, kCols}, {}, dst.data()},
            {"model.w", "float32", {0, t % kCols}, {kRows, 1}, {}, col.data()}};
        if (ReadAll(reader, reqs) != CKPTD_OK ||
            std::string(ckptd_last_error()) != "") {
          ++failures;
          continue;
        }
        for (int64_t i = 0; i < n; ++i) {
          for (int64_t j = 0; j < kCols; ++j) {
            if (dst[i * kCols + j] != W(r0 + i, j)) ++failures;
          }
        }
        for (int64_t i = 0; i < kRows; ++i) {
          if (col[i] != W(i, t % kCols)) ++failures;
        }
        // Errors stay on their thread.
        if (ReadOne(reader, {"nope", "float32", {}, {1}, {}, dst.data()}) !=
                CKPTD_NOT_FOUND ||
            !Contains(ckptd_last_error(), "nope")) {
          ++failures;
        }
      }
    });
  }
  for (std::thread& t : pool) t.join();
  EXPECT_EQ(failures.load(), 0);
  ckptd_reader_close(reader);
}

TEST_F(CReaderTest, OpenErrors) {
  ckptd_reader* reader = reinterpret_cast<ckptd_reader*>(0x1);
  const std::string missing = tmp_.Join("does-not-exist");
  EXPECT_EQ(ckptd_reader_open(missing.c_str(), 1, &reader), CKPTD_NOT_FOUND);
  EXPECT_EQ(reader, nullptr);
  EXPECT_TRUE(Contains(Error(), missing)) << Error();

  const std::string empty = tmp_.Join("empty");
  ASSERT_EQ(::mkdir(empty.c_str(), 0700), 0);
  EXPECT_EQ(ckptd_reader_open(empty.c_str(), 1, &reader), CKPTD_NOT_FOUND);
  EXPECT_TRUE(Contains(Error(), ".metadata")) << Error();
  EXPECT_TRUE(Contains(Error(), empty)) << Error();

  // A rank-local checkpoint: __0.metadata but no .metadata.
  const std::string local = tmp_.Join("local");
  ASSERT_EQ(::mkdir(local.c_str(), 0700), 0);
  std::ofstream(local + "/__0.metadata") << "x";
  EXPECT_EQ(ckptd_reader_open(local.c_str(), 1, &reader), CKPTD_NOT_FOUND);
  EXPECT_TRUE(Contains(Error(), "rank-local")) << Error();

  // A file where the directory should be.
  const std::string file = tmp_.Join("file");
  std::ofstream(file) << "x";
  EXPECT_EQ(ckptd_reader_open(file.c_str(), 1, &reader), CKPTD_NOT_FOUND);
  EXPECT_TRUE(Contains(Error(), "not a directory")) << Error();

  // Garbage and a truncated .metadata.
  const std::string garbage = tmp_.Join("garbage");
  ASSERT_EQ(::mkdir(garbage.c_str(), 0700), 0);
  std::ofstream(garbage + "/.metadata") << "this is not a pickle";
  EXPECT_EQ(ckptd_reader_open(garbage.c_str(), 1, &reader), CKPTD_DATA_LOSS);
  EXPECT_TRUE(Contains(Error(), ".metadata")) << Error();
  std::string md;
  {
    std::ifstream in(dir_ + "/.metadata", std::ios::binary);
    md.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_GT(md.size(), 100u);
  const std::string truncated = tmp_.Join("truncated");
  ASSERT_EQ(::mkdir(truncated.c_str(), 0700), 0);
  std::ofstream(truncated + "/.metadata", std::ios::binary)
      << md.substr(0, md.size() / 2);
  EXPECT_EQ(ckptd_reader_open(truncated.c_str(), 1, &reader), CKPTD_DATA_LOSS);
  EXPECT_TRUE(Contains(Error(), truncated)) << Error();

  EXPECT_EQ(ckptd_reader_open(nullptr, 1, &reader), CKPTD_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(Error(), "dir is NULL")) << Error();
  EXPECT_EQ(ckptd_reader_open("", 1, &reader), CKPTD_INVALID_ARGUMENT);
  EXPECT_EQ(ckptd_reader_open(dir_.c_str(), 1, nullptr),
            CKPTD_INVALID_ARGUMENT);
  // threads < 1 means 1.
  ASSERT_EQ(ckptd_reader_open(dir_.c_str(), -5, &reader), CKPTD_OK) << Error();
  EXPECT_STREQ(ckptd_last_error(), "");
  float b[kCols];
  EXPECT_EQ(ReadOne(reader, {"model.b", "float32", {}, {kCols}, {}, b}),
            CKPTD_OK);
  ckptd_reader_close(reader);
}

TEST_F(CReaderTest, ReadErrorsNameTheTensor) {
  ckptd_reader* reader = Open();
  ASSERT_NE(reader, nullptr);
  std::vector<float> dst(kRows * kCols);
  auto expect = [&](const Request& r, int code,
                    std::vector<std::string> needles) {
    EXPECT_EQ(ReadOne(reader, r), code) << Error();
    for (const std::string& n : needles) {
      EXPECT_TRUE(Contains(Error(), n)) << "'" << n << "' not in: " << Error();
    }
  };
  expect({"model.nope", "float32", {}, {2}, {}, dst.data()}, CKPTD_NOT_FOUND,
         {"model.nope"});
  expect({"model.w", "int32", {}, {kRows, kCols}, {}, dst.data()},
         CKPTD_INVALID_ARGUMENT, {"model.w", "float32", "int32"});
  expect({"model.w", "float33", {}, {kRows, kCols}, {}, dst.data()},
         CKPTD_INVALID_ARGUMENT, {"model.w", "float33"});
  expect({"model.w", "float32", {}, {kRows * kCols}, {}, dst.data()},
         CKPTD_INVALID_ARGUMENT, {"model.w", "dimensions"});
  expect({"model.w", "float32", {4, 0}, {5, kCols}, {}, dst.data()},
         CKPTD_INVALID_ARGUMENT, {"model.w", "outside", "[4:9, 0:6]"});
  expect({"model.w", "float32", {-1, 0}, {1, 1}, {}, dst.data()},
         CKPTD_INVALID_ARGUMENT, {"model.w", "outside"});
  expect({"model.w", "float32", {}, {1, 1}, {-1, 1}, dst.data()},
         CKPTD_INVALID_ARGUMENT, {"model.w", "negative"});
  expect({"model.w", "float32", {}, {kRows, kCols}, {}, nullptr},
         CKPTD_INVALID_ARGUMENT, {"model.w", "data is NULL"});
  expect({"step", "float32", {}, {}, {}, dst.data()}, CKPTD_INVALID_ARGUMENT,
         {"step", "bytes item"});
  // A bad request among good ones: the error names it, by index too.
  std::vector<Request> reqs = {
      {"model.b", "float32", {}, {kCols}, {}, dst.data()},
      {"optim.bf", "float16", {}, {5, 3}, {}, dst.data()}};
  EXPECT_EQ(ReadAll(reader, reqs), CKPTD_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(Error(), "request 1")) << Error();
  EXPECT_TRUE(Contains(Error(), "optim.bf")) << Error();
  EXPECT_TRUE(Contains(Error(), "bfloat16")) << Error();

  // NULL arguments.
  const Request good{"model.b", "float32", {}, {kCols}, {}, dst.data()};
  const ckptd_read_request r = good.c();
  EXPECT_EQ(ckptd_reader_read(nullptr, &r, 1, nullptr), CKPTD_INVALID_ARGUMENT);
  EXPECT_EQ(ckptd_reader_read(reader, nullptr, 1, nullptr),
            CKPTD_INVALID_ARGUMENT);
  ckptd_read_request bad = r;
  bad.fqn = nullptr;
  EXPECT_EQ(ckptd_reader_read(reader, &bad, 1, nullptr),
            CKPTD_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(Error(), "fqn is NULL")) << Error();
  bad = r;
  bad.sizes = nullptr;
  EXPECT_EQ(ckptd_reader_read(reader, &bad, 1, nullptr),
            CKPTD_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(Error(), "sizes is NULL")) << Error();
  bad = r;
  bad.ndim = -1;
  EXPECT_EQ(ckptd_reader_read(reader, &bad, 1, nullptr),
            CKPTD_INVALID_ARGUMENT);
  bad = r;
  bad.dtype = nullptr;  // NULL means float32
  EXPECT_EQ(ckptd_reader_read(reader, &bad, 1, nullptr), CKPTD_OK) << Error();
  EXPECT_STREQ(ckptd_last_error(), "");

  // read_bytes.
  char* data = reinterpret_cast<char*>(0x1);
  uint64_t len = 7;
  EXPECT_EQ(ckptd_reader_read_bytes(reader, "model.w", &data, &len),
            CKPTD_INVALID_ARGUMENT);
  EXPECT_EQ(data, nullptr);
  EXPECT_EQ(len, 0u);
  EXPECT_TRUE(Contains(Error(), "model.w")) << Error();
  EXPECT_TRUE(Contains(Error(), "tensor")) << Error();
  EXPECT_EQ(ckptd_reader_read_bytes(reader, "nope", &data, &len),
            CKPTD_NOT_FOUND);
  EXPECT_TRUE(Contains(Error(), "nope")) << Error();
  EXPECT_EQ(ckptd_reader_read_bytes(nullptr, "step", &data, &len),
            CKPTD_INVALID_ARGUMENT);
  EXPECT_EQ(ckptd_reader_read_bytes(reader, nullptr, &data, &len),
            CKPTD_INVALID_ARGUMENT);
  EXPECT_EQ(ckptd_reader_read_bytes(reader, "step", nullptr, &len),
            CKPTD_INVALID_ARGUMENT);
  EXPECT_EQ(ckptd_reader_read_bytes(reader, "step", &data, nullptr),
            CKPTD_INVALID_ARGUMENT);
  ckptd_reader_close(reader);
}

TEST(CReaderPartialTest, BoxNotCoveredBySavedChunks) {
  // A checkpoint holding only rows [0, 2) of a [4, 6] tensor.
  TempDir tmp;
  std::vector<float> data(2 * 6, 1.0f);
  std::vector<std::vector<WriteItem>> ranks(1);
  WriteItem it;
  it.desc = {
      "w", ItemDesc::Type::kTensor, DType::kFloat32, {4, 6}, {0, 0}, {2, 6},
      {}};
  it.tensor = {
      DType::kFloat32, {2, 6}, {}, reinterpret_cast<const char*>(data.data())};
  ranks[0].push_back(it);
  format::CheckpointWriterOptions options;
  options.sync = false;
  options.plan.require_full_coverage = false;
  auto wr = format::WriteCheckpoint(tmp.Join("c"), ranks, options);
  ASSERT_TRUE(wr.ok()) << wr.status();
  ckptd_reader* reader = nullptr;
  ASSERT_EQ(ckptd_reader_open(tmp.Join("c").c_str(), 2, &reader), CKPTD_OK)
      << Error();
  std::vector<float> dst(4 * 6);
  EXPECT_EQ(ReadOne(reader, {"w", "float32", {}, {4, 6}, {}, dst.data()}),
            CKPTD_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(Error(), "w")) << Error();
  EXPECT_TRUE(Contains(Error(), "cover")) << Error();
  EXPECT_EQ(ReadOne(reader, {"w", "float32", {1, 0}, {1, 6}, {}, dst.data()}),
            CKPTD_OK)
      << Error();
  EXPECT_EQ(dst[0], 1.0f);
  ckptd_reader_close(reader);
}

TEST_F(CReaderTest, TruncatedDataFileIsDataLoss) {
  // Cut every data file short: the payloads' bytes are gone.
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) {
    if (e.path().extension() == ".distcp") files.push_back(e.path());
  }
  ASSERT_EQ(files.size(), static_cast<size_t>(kRanks));
  for (const std::string& f : files) {
    std::filesystem::resize_file(f, 10);
  }
  for (int threads : {1, 4}) {
    ckptd_reader* reader = Open(threads);
    ASSERT_NE(reader, nullptr);
    std::vector<float> dst(kRows * kCols);
    EXPECT_EQ(
        ReadOne(reader,
                {"model.w", "float32", {}, {kRows, kCols}, {}, dst.data()}),
        CKPTD_DATA_LOSS)
        << Error();
    EXPECT_TRUE(Contains(Error(), "model.w") || Contains(Error(), ".distcp"))
        << Error();
    char* data = nullptr;
    uint64_t len = 0;
    EXPECT_EQ(ckptd_reader_read_bytes(reader, "extra", &data, &len),
              CKPTD_DATA_LOSS)
        << Error();
    EXPECT_EQ(data, nullptr);
    ckptd_reader_close(reader);
  }
  // A missing data file.
  for (const std::string& f : files) std::filesystem::remove(f);
  ckptd_reader* reader = Open();
  ASSERT_NE(reader, nullptr);
  std::vector<float> dst(kRows * kCols);
  EXPECT_EQ(ReadOne(reader,
                    {"model.w", "float32", {}, {kRows, kCols}, {}, dst.data()}),
            CKPTD_DATA_LOSS)
      << Error();
  EXPECT_TRUE(Contains(Error(), ".distcp")) << Error();
  ckptd_reader_close(reader);
}

}  // namespace
}  // namespace ckptd
