// Copyright 2026 The ckptd Authors.
//
// The streaming decoder's fast paths (format/metadata/metadata_vm_fast.cc:
// torch.Size sequences and runs of DCP dataclasses consumed by APPENDS /
// SETITEMS) on stock-style programs and on variants built to make them decline:
// frames splitting objects anywhere, LONG1 and None fields, 0-d and 3-d sizes,
// unknown and duplicate keys, a second BUILD, a chunk read back through the
// memo, a run not ended by its consumer, APPEND one by one, invalid values;
// and random mutations of them. Each decode is compared with the generic
// decoder (DecodeMetadataGeneric): the same Metadata, or the same status
// code and, for pickle-level errors, the same offset and opcode.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "fmt/format.h"
#include "format/metadata/metadata.h"
#include "format/metadata/metadata_decode.h"
#include "gtest/gtest.h"
#include "tests/testing/sanitizers.h"
#include "tests/testing/stock_style.h"
#include "tests/testing/test_util.h"

namespace ckptd::format {
namespace {

using ::ckptd::testing::StockStyle;

struct Shape {
  size_t frame_bytes = 64 << 10;
  int ranks = 3;
  int tensors = 4;
  int batch = 1000;              // items per APPENDS / SETITEMS
  int dims = 2;                  // of tensor 1 (0..3); the others 2
  bool append_one = false;       // chunks appended one by one (APPEND)
  bool long1 = false;            // storage offsets / lengths as LONG1
  bool none_transforms = false;  // _StorageInfo.transform_descriptors None
  bool list_transforms = false;  // ... ["zstd"]
  bool index_none = false;       // MetadataIndex.index None
  bool extra_key = false;        // an unknown field in every chunk
  bool duplicate_key = false;    // "offsets" twice (the last one wins)
  bool second_build = false;     // BUILD onto chunk 1 of tensor 0 again
  bool chunk_read_back = false;  // chunk 0 of tensor 0 appended twice (GET)
  bool no_consumer = false;      // chunk, chunk, GET, BUILD
  bool negative_offset = false;  // a storage offset of -5
  bool big_offset = false;       // a storage offset of 2^40 (LONG1)
};

std::vector<int64_t> Dims(int dims, int64_t a, int64_t b) {
  std::vector<int64_t> v = {a, b, 2};
  v.resize(dims);
  return v;
}

std::string Program(const Shape& s) {
  const std::string md = "torch.distributed.checkpoint.metadata";
  auto fqn = [](int t) { return fmt::format("layer.{}.weight", t); };
  StockStyle p(s.frame_bytes);
  p.Begin();
  p.NewObj(md, "Metadata");
  p.Op('}');
  p.Memo();
  p.Op('(');
  p.Str("state_dict_metadata");
  p.Op('}');
  p.Memo();
  p.Op('(');
  uint64_t chunk0_memo = 0;
  for (int t = 0; t < s.tensors; ++t) {
    const int dims = t == 1 ? s.dims : 2;
    p.Str(fqn(t));
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
    p.Size(Dims(dims, 2 * s.ranks, 3));
    p.Str("chunks");
    p.Op(']');
    p.Memo();
    const int ranks = dims == 0 ? 1 : s.ranks;
    for (int r = 0; r < ranks; ++r) {
      if (!s.append_one && r % s.batch == 0) p.Op('(');
      p.NewObj(md, "ChunkStorageMetadata");
      if (t == 0 && r == 0) chunk0_memo = p.memo() - 1;  // NEWOBJ's
      p.Op('}');
      p.Memo();
      p.Op('(');
      if (s.duplicate_key) {
        p.Str("offsets");
        p.Size(Dims(dims, 77, 0));
      }
      p.Str("offsets");
      p.Size(Dims(dims, 2 * r, 0));
      if (s.extra_key) {
        p.Str("extra");
        p.Int(7);
      }
      p.Str("sizes");
      p.Size(Dims(dims, 2, 3));
      p.Op('u');
      p.Op('b');
      if (t == 0 && r == 1 && s.second_build) {
        p.Op('}');
        p.Memo();
        p.Op('(');
        p.Str("offsets");
        p.Size(Dims(dims, 4, 0));
        p.Op('u');
        p.Op('b');
      }
      if (t == 0 && r == 1 && s.chunk_read_back) p.Get(chunk0_memo);
      if (t == 0 && r == 1 && s.no_consumer) {
        p.Str("sizes");
        p.Op('b');
      }
      if (s.append_one) {
        p.Op('a');
      } else if (r % s.batch == s.batch - 1 || r + 1 == ranks) {
        p.Op('e');
      }
    }
    p.Op('u');
    p.Op('b');
  }
  p.Op('u');
  p.Str("planner_data");
  p.Op('}');
  p.Memo();
  p.Str("storage_data");
  p.Op('}');
  p.Memo();
  int64_t n = 0;
  const int64_t total = [&] {
    int64_t k = 0;
    for (int t = 0; t < s.tensors; ++t)
      k += (t == 1 && s.dims == 0) ? 1 : s.ranks;
    return k;
  }();
  for (int r = 0; r < s.ranks; ++r) {
    const std::string file = fmt::format("__{}_0.distcp", r);
    for (int t = 0; t < s.tensors; ++t) {
      const int dims = t == 1 ? s.dims : 2;
      if (dims == 0 && r > 0) continue;
      if (n % s.batch == 0) p.Op('(');
      p.NewObj(md, "MetadataIndex");
      p.Op('}');
      p.Memo();
      p.Op('(');
      p.Str("fqn");
      p.Str(fqn(t));
      p.Str("index");
      if (s.index_none) {
        p.Op('N');
      } else {
        p.Int(r);
      }
      p.Str("offset");
      p.Size(Dims(dims, 2 * r, 0));
      p.Op('u');
      p.Op('b');
      p.NewObj("torch.distributed.checkpoint.filesystem", "_StorageInfo");
      p.Op('}');
      p.Memo();
      p.Op('(');
      p.Str("relative_path");
      p.Str(file);
      p.Str("offset");
      const int64_t off = s.negative_offset && n == 3 ? -5
                          : s.big_offset && n == 2    ? int64_t{1} << 40
                                                      : t * 700;
      if (s.long1 || (s.big_offset && n == 2)) {
        p.Long1(off, n % 2 == 0 ? 8 : 3);
      } else {
        p.Int(off);
      }
      p.Str("length");
      if (s.long1) {
        p.Long1(700, 2);
      } else {
        p.Int(700);
      }
      if (s.none_transforms) {
        p.Str("transform_descriptors");
        p.Op('N');
      } else if (s.list_transforms) {
        p.Str("transform_descriptors");
        p.Op(']');
        p.Memo();
        p.Str("zstd");
        p.Op('a');
      }
      p.Op('u');
      p.Op('b');
      ++n;
      if (n % s.batch == 0 || n == total) p.Op('u');
    }
  }
  p.Str("version");
  p.Str("1.0.0");
  p.Op('u');
  p.Op('b');
  return p.Take();
}

bool Same(const Metadata& a, const Metadata& b) {
  return a.state_dict_metadata == b.state_dict_metadata &&
         a.planner_data == b.planner_data && a.storage_data == b.storage_data &&
         a.storage_meta == b.storage_meta && a.version == b.version;
}

std::string OpPrefix(const absl::Status& s) {
  const std::string m(s.message());
  const size_t at = m.find(": offset ");
  if (at == std::string::npos) return {};
  const size_t op = m.find("): ", at);
  return op == std::string::npos ? std::string() : m.substr(0, op + 3);
}

// Both decoders agree on `bytes`; returns the streaming decoder's result.
absl::StatusOr<Metadata> Agree(const std::string& bytes,
                               const std::string& what) {
  absl::StatusOr<Metadata> got = DecodeMetadata(bytes);
  absl::StatusOr<Metadata> ref = DecodeMetadataGeneric(bytes);
  if (absl::IsResourceExhausted(got.status()) ||
      absl::IsResourceExhausted(ref.status())) {
    return got;
  }
  EXPECT_EQ(got.ok(), ref.ok()) << what << "\nstreaming: " << got.status()
                                << "\nreference: " << ref.status();
  if (got.ok() && ref.ok()) {
    EXPECT_TRUE(Same(*got, *ref)) << what;
  } else if (!got.ok() && !ref.ok()) {
    EXPECT_EQ(got.status().code(), ref.status().code())
        << what << "\nstreaming: " << got.status()
        << "\nreference: " << ref.status();
    EXPECT_EQ(OpPrefix(got.status()), OpPrefix(ref.status()))
        << what << "\nstreaming: " << got.status()
        << "\nreference: " << ref.status();
  }
  return got;
}

std::vector<std::pair<std::string, Shape>> Variants() {
  std::vector<std::pair<std::string, Shape>> v;
  auto add = [&](std::string name, auto set) {
    Shape s;
    set(s);
    v.emplace_back(std::move(name), s);
  };
  add("plain", [](Shape&) {});
  add("batches of 2", [](Shape& s) { s.batch = 2; });
  add("0-d", [](Shape& s) { s.dims = 0; });
  add("1-d", [](Shape& s) { s.dims = 1; });
  add("3-d", [](Shape& s) { s.dims = 3; });
  add("APPEND", [](Shape& s) { s.append_one = true; });
  add("LONG1", [](Shape& s) { s.long1 = true; });
  add("transforms None", [](Shape& s) { s.none_transforms = true; });
  add("transforms list", [](Shape& s) { s.list_transforms = true; });
  add("index None", [](Shape& s) { s.index_none = true; });
  add("unknown key", [](Shape& s) { s.extra_key = true; });
  add("duplicate key", [](Shape& s) { s.duplicate_key = true; });
  add("second BUILD", [](Shape& s) { s.second_build = true; });
  add("chunk read back", [](Shape& s) { s.chunk_read_back = true; });
  add("no consumer", [](Shape& s) { s.no_consumer = true; });
  add("negative offset", [](Shape& s) { s.negative_offset = true; });
  add("offset 2^40", [](Shape& s) { s.big_offset = true; });
  return v;
}

TEST(MetadataFastPathTest, StockStyleProgramsAndVariantsAgree) {
  for (const auto& [name, shape] : Variants()) {
    for (size_t frame : {size_t{64} << 10, size_t{1}, size_t{7}, size_t{29}}) {
      Shape s = shape;
      s.frame_bytes = frame;
      const std::string what = fmt::format("{}, frames of {}", name, frame);
      absl::StatusOr<Metadata> md = Agree(Program(s), what);
      if (name == "plain" || name == "batches of 2" || name == "LONG1" ||
          name == "APPEND" || name == "0-d" || name == "3-d") {
        ASSERT_TRUE(md.ok()) << what << ": " << md.status();
        EXPECT_EQ(md->storage_data.size(),
                  static_cast<size_t>(s.dims == 0 ? 10 : 12))
            << what;
        // The fast paths ran: every storage entry but the first pair of
        // each file (its strings are new) came as one run of objects.
        DecodeStats stats;
        const std::string bytes = Program(s);
        ASSERT_TRUE(DecodeCompactMetadata(bytes, {}, &stats).ok());
        EXPECT_GE(stats.fast_objects, name == "APPEND" ? 6u : 12u) << what;
        EXPECT_GT(stats.fast_objects + stats.fast_sizes, 0u) << what;
      }
      if (name == "negative offset") {
        EXPECT_FALSE(md.ok()) << what;
      }
      if (name == "offset 2^40" && md.ok()) {
        EXPECT_EQ(md->storage_data[2].second.offset, uint64_t{1} << 40);
      }
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// ckptd's own encoding: constructors (REDUCE over a tuple of fields).
std::string CkptdProgram(int variant) {
  Metadata md;
  for (int t = 0; t < 4; ++t) {
    TensorStorageMetadata ts;
    ts.properties.dtype = DType::kFloat32;
    const int dims = variant == 1 && t == 1   ? 0
                     : variant == 2 && t == 1 ? 3
                                              : 2;
    std::vector<int64_t> size = {6, 3, 2};
    size.resize(dims);
    ts.size = size;
    const int ranks = dims == 0 ? 1 : 3;
    for (int r = 0; r < ranks; ++r) {
      std::vector<int64_t> off(dims, 0), sz = size;
      if (dims > 0) {
        off[0] = 2 * r;
        sz[0] = 2;
      }
      ts.chunks.push_back({off, sz});
      md.storage_data.push_back(
          {StorageKey{fmt::format("t{}", t), true, off},
           StorageInfo{
               fmt::format("__{}_0.distcp", r),
               variant == 3 ? (uint64_t{1} << 40) + 700 * t : uint64_t(700 * t),
               700,
               variant == 4 ? std::vector<std::string>{"zstd"}
                            : std::vector<std::string>{}}});
    }
    md.state_dict_metadata.emplace_back(fmt::format("t{}", t), ts);
  }
  md.state_dict_metadata.emplace_back("step", BytesStorageMetadata{});
  md.storage_data.push_back(
      {StorageKey{"step", false, {}}, StorageInfo{"__0_0.distcp", 9000, 5}});
  auto bytes = EncodeMetadata(md);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.ok() ? *bytes : std::string();
}

TEST(MetadataFastPathTest, CkptdEncodingsAgree) {
  for (int variant = 0; variant < 5; ++variant) {
    const std::string bytes = CkptdProgram(variant);
    const std::string what = fmt::format("ckptd variant {}", variant);
    absl::StatusOr<Metadata> md = Agree(bytes, what);
    ASSERT_TRUE(md.ok()) << what << ": " << md.status();
    DecodeStats stats;
    ASSERT_TRUE(DecodeCompactMetadata(bytes, {}, &stats).ok());
    EXPECT_GE(stats.fast_objects, 8u) << what;
  }
}

// Pass 1 scans unframed programs of 256 KiB and more as two halves side
// by side (the second starts blind in the middle of an opcode): programs of
// ~1 MB in ckptd's protocol-2 encoding, with fqns of every length so the
// middle falls anywhere, and mutations of them.
TEST(MetadataFastPathTest, LargeUnframedProgramsAgree) {
  std::mt19937_64 rng(::ckptd::testing::TestSeed());
  std::vector<std::string> samples;
  for (int variant = 0; variant < 3; ++variant) {
    Metadata md;
    const int tensors = 1500 + 37 * variant;
    for (int t = 0; t < tensors; ++t) {
      const std::string fqn =
          fmt::format("{}.{}", std::string(1 + rng() % 300, 'a' + t % 26), t);
      TensorStorageMetadata ts;
      ts.size = {8, 3};
      for (int r = 0; r < 4; ++r) {
        ts.chunks.push_back({{2 * r, 0}, {2, 3}});
        md.storage_data.push_back(
            {StorageKey{fqn, true, {2 * r, 0}},
             StorageInfo{fmt::format("__{}_0.distcp", r),
                         static_cast<uint64_t>(rng() % (uint64_t{1} << 40)),
                         static_cast<uint64_t>(rng() % 100000)}});
      }
      md.state_dict_metadata.emplace_back(fqn, ts);
    }
    ASSERT_OK_AND_ASSIGN(std::string bytes, EncodeMetadata(md));
    ASSERT_GT(bytes.size(), size_t{600} << 10);
    absl::StatusOr<Metadata> got = Agree(bytes, "large");
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->storage_data, md.storage_data);
    samples.push_back(std::move(bytes));
  }
  // A quarter under the sanitizers (16 s under ASan at -O0 whole); the
  // release build (scripts/test.sh) and the metadata fuzzer do the rest.
  const int iterations = ::ckptd::testing::kSlowSanitizer ? 8 : 30;
  for (int iter = 0; iter < iterations; ++iter) {
    std::string s = samples[iter % samples.size()];
    // Around the middle, where the second half starts.
    const size_t mid = s.size() / 2;
    for (int f = 0; f < 3; ++f) {
      s[mid - 64 + rng() % 128] = static_cast<char>(rng());
    }
    (void)Agree(s, fmt::format("large mutation {}", iter));
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(MetadataFastPathTest, MutatedProgramsAgree) {
  std::mt19937_64 rng(::ckptd::testing::TestSeed());
  std::vector<std::string> samples;
  for (const auto& [name, shape] : Variants()) {
    Shape s = shape;
    s.frame_bytes = samples.size() % 3 == 0 ? 13 : 64 << 10;
    samples.push_back(Program(s));
  }
  for (int variant = 0; variant < 5; ++variant) {
    samples.push_back(CkptdProgram(variant));
  }
  // A quarter under the sanitizers, as above.
  const int iterations = ::ckptd::testing::kSlowSanitizer ? 1500 : 6000;
  for (int iter = 0; iter < iterations; ++iter) {
    std::string s = samples[iter % samples.size()];
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f)
      s[rng() % s.size()] = static_cast<char>(rng());
    (void)Agree(s, fmt::format("mutation {}", iter));
    if (::testing::Test::HasFailure()) return;
  }
}

}  // namespace
}  // namespace ckptd::format
