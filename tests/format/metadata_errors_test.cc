// Copyright 2026 The ckptd Authors.
//
// The .metadata codec's decoder (format/metadata/metadata.h) on bad input:
// errors that name the path of the bad field, a root that is not Metadata
// and a bad version, cyclic structures, truncated and randomly corrupted
// pickles (no crash; INVALID_ARGUMENT or RESOURCE_EXHAUSTED), and the
// allocation limit.
#include <cstdio>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "format/metadata/metadata.h"
#include "format/pickle/pickle.h"
#include "gtest/gtest.h"
#include "tests/testing/metadata_pickles.h"
#include "tests/testing/sanitizers.h"
#include "tests/testing/test_util.h"

namespace ckptd::format {
namespace {

using ::ckptd::testing::DecodeChecked;
using ::ckptd::testing::DecodeParts;
using ::ckptd::testing::ExpectError;
using ::ckptd::testing::kFs;
using ::ckptd::testing::kM;
using ::ckptd::testing::Msg;
using ::ckptd::testing::NewObj;
using ::ckptd::testing::Parts;
using ::ckptd::testing::PySize;
using ::ckptd::testing::PythonStyleExample;
using ::ckptd::testing::PyVariant;
using ::ckptd::testing::SmallExample;
using pickle::Writer;

TEST(MetadataTest, ErrorsNameThePath) {
  {
    Parts parts;
    parts.storage = [](Writer& w) { w.None(); };
    ExpectError(parts,
                "storage_data: expected a dict {MetadataIndex: _StorageInfo}");
    ExpectError(parts, "other StorageWriters are not supported");
  }
  {
    Parts parts;
    parts.storage = [](Writer& w) { w.EmptyList(); };
    ExpectError(parts, "storage_data: expected a dict");
  }
  {
    Parts parts;
    parts.sdm = [](Writer& w) {
      w.EmptyDict();
      w.String("model.w");
      w.Global(kM, "TensorStorageMetadata");
      w.Global(kM, "TensorProperties");
      w.Global("torch", "float32");
      w.Tuple1();
      w.Reduce();
      PySize(w, {4});
      w.EmptyList();
      w.Mark();
      for (int i = 0; i < 2; ++i) {
        w.Global(kM, "ChunkStorageMetadata");
        if (i == 1) {
          w.String("zero");
        } else {
          PySize(w, {0});
        }
        PySize(w, {2});
        w.Tuple2();
        w.Reduce();
      }
      w.Appends();
      w.Tuple3();
      w.Reduce();
      w.SetItem();
    };
    ExpectError(parts,
                "state_dict_metadata['model.w'].chunks[1].offsets: expected "
                "torch.Size, got");
  }
  {
    Parts parts;
    parts.storage = [](Writer& w) {
      w.EmptyDict();
      w.Global(kM, "MetadataIndex");
      w.String("model.w");
      PySize(w, {2, 0});
      w.Tuple2();
      w.Reduce();
      w.String("not a _StorageInfo");
      w.SetItem();
    };
    ExpectError(
        parts,
        "storage_data[model.w@(2, 0)]: expected filesystem._StorageInfo");
  }
  {
    Parts parts;
    parts.storage = [](Writer& w) {
      w.EmptyDict();
      w.String("model.w");
      w.Int(0);
      w.SetItem();
    };
    ExpectError(parts, "storage_data entry 0 (key): expected MetadataIndex");
  }
  {
    Parts parts;
    parts.storage = [](Writer& w) {
      w.EmptyDict();
      w.Global(kM, "MetadataIndex");
      w.String("s");
      w.Tuple1();
      w.Reduce();
      w.Global(kFs, "_StorageInfo");
      w.String("f");
      w.Int(-5);
      w.Int(1);
      w.Tuple3();
      w.Reduce();
      w.SetItem();
    };
    ExpectError(parts, "storage_data[s].offset: negative value -5");
  }
  {
    Parts parts;
    parts.sdm = [](Writer& w) {
      w.EmptyDict();
      w.String("t");
      w.Global(kM, "TensorStorageMetadata");
      w.Global(kM, "TensorProperties");
      w.Global("torch", "float128");
      w.Tuple1();
      w.Reduce();
      PySize(w, {});
      w.EmptyList();
      w.Tuple3();
      w.Reduce();
      w.SetItem();
    };
    ExpectError(parts,
                "state_dict_metadata['t'].properties.dtype: unknown dtype");
  }
  {
    Parts parts;
    parts.sdm = [](Writer& w) {
      w.EmptyDict();
      w.String("t");
      w.Global(kM, "TensorStorageMetadata");
      NewObj(w, kM, "TensorProperties");
      w.Global("torch", "float32");
      w.Global("torch", "strided");
      w.Bool(false);
      w.Tuple3();
      w.Build();
      PySize(w, {});
      w.EmptyList();
      w.Tuple3();
      w.Reduce();
      w.SetItem();
    };
    ExpectError(parts, "TensorProperties state: expected (dtype, layout");
  }
  {
    Parts parts;
    parts.sdm = [](Writer& w) {
      w.EmptyDict();
      w.String("t");
      w.Global(kM, "TensorStorageMetadata");
      w.Global(kM, "TensorProperties");
      w.Mark();
      w.Global("torch", "float32");
      w.Global("torch", "strided");
      w.Bool(false);
      w.Global(kM, "_MEM_FORMAT_ENCODING");
      w.Int(7);
      w.Tuple1();
      w.Reduce();
      w.Tuple();
      w.Reduce();
      PySize(w, {});
      w.EmptyList();
      w.Tuple3();
      w.Reduce();
      w.SetItem();
    };
    ExpectError(parts, "properties.memory_format: expected a memory format");
  }
  {
    Parts parts;
    parts.sdm = [](Writer& w) {
      w.EmptyDict();
      w.String("t");
      w.Global(kM, "TensorStorageMetadata");
      w.EmptyTuple();
      w.Reduce();
      w.SetItem();
    };
    ExpectError(
        parts,
        "state_dict_metadata['t']: TensorStorageMetadata has no 'properties'");
  }
  {
    Parts parts;
    parts.sdm = [](Writer& w) {
      w.EmptyDict();
      w.String("t");
      w.Global("collections", "OrderedDict");
      w.EmptyTuple();
      w.Reduce();
      w.SetItem();
    };
    ExpectError(parts,
                "state_dict_metadata['t']: expected TensorStorageMetadata or "
                "BytesStorageMetadata");
  }
}

TEST(MetadataTest, RejectsNonMetadataRootAndBadVersion) {
  std::string out;
  Writer w(&out);
  w.Proto(2);
  w.Int(7);
  w.Stop();
  DecodeOptions options;
  options.source_name = "/x/.metadata";
  auto md = DecodeChecked(out, options);
  ASSERT_FALSE(md.ok());
  EXPECT_NE(Msg(md.status()).find("/x/.metadata: not a DCP .metadata"),
            std::string::npos)
      << md.status();

  out.clear();
  Writer v(&out);
  v.Proto(2);
  NewObj(v, kM, "Metadata");
  v.EmptyDict();
  v.Mark();
  v.String("state_dict_metadata");
  v.EmptyDict();
  v.String("storage_data");
  v.EmptyDict();
  v.String("version");
  v.Int(1);
  v.SetItems();
  v.Build();
  v.Stop();
  md = DecodeChecked(out, options);
  ASSERT_FALSE(md.ok());
  EXPECT_NE(Msg(md.status()).find("version: expected str"), std::string::npos)
      << md.status();
}

TEST(MetadataTest, CyclicStructuresAreErrorsOrIgnored) {
  {
    // chunks = [chunks]  (a list containing itself).
    Parts parts;
    parts.sdm = [](Writer& w) {
      w.EmptyDict();
      w.String("t");
      w.Global(kM, "TensorStorageMetadata");
      w.Global(kM, "TensorProperties");
      w.Global("torch", "float32");
      w.Tuple1();
      w.Reduce();
      PySize(w, {1});
      w.EmptyList();
      w.Put(0);
      w.Get(0);
      w.Append();
      w.Tuple3();
      w.Reduce();
      w.SetItem();
    };
    ExpectError(parts, "chunks[0]: expected ChunkStorageMetadata");
  }
  {
    // planner_data = {'a': d}: a dict containing itself; storage_meta whose
    // modules list contains itself.
    Parts parts;
    parts.planner = [](Writer& w) {
      w.EmptyDict();
      w.Put(1);
      w.String("a");
      w.Get(1);
      w.SetItem();
    };
    parts.storage_meta = [](Writer& w) {
      w.Global(kM, "StorageMeta");
      w.EmptyTuple();
      w.NewObj();
      w.EmptyDict();
      w.String("modules");
      w.EmptyList();
      w.Put(2);
      w.Get(2);
      w.Append();
      w.SetItem();
      w.Build();
    };
    ASSERT_OK_AND_ASSIGN(Metadata md, DecodeParts(parts));
    EXPECT_FALSE(md.planner_data.has_value());
    ASSERT_TRUE(md.storage_meta.has_value());
    EXPECT_TRUE(md.storage_meta->modules.empty());
  }
  {
    // 200k nested lists as a planner path: no recursion on our side.
    Parts parts;
    parts.planner = [](Writer& w) {
      w.EmptyDict();
      w.String("a");
      for (int i = 0; i < 200000; ++i) w.EmptyList();
      for (int i = 0; i < 200000 - 1; ++i) w.Append();
      w.SetItem();
    };
    auto md = DecodeParts(parts);
    if (md.ok()) {
      EXPECT_FALSE(md->planner_data.has_value());
    }
  }
}

TEST(MetadataTest, TruncatedAndCorruptInputsDoNotCrash) {
  const uint64_t seed = testing::TestSeed();
  Metadata md = SmallExample();
  EncodeOptions options;
  options.write_storage_meta = true;
  ASSERT_OK_AND_ASSIGN(std::string good, EncodeMetadata(md, options));
  std::vector<std::string> samples = {good};
  PyVariant pv;
  pv.enum_form = 1;
  pv.transforms = 2;
  samples.push_back(PythonStyleExample(pv));
  for (const std::string& s : samples) {
    ASSERT_OK(DecodeChecked(s));
    for (size_t n = 0; n + 1 < s.size(); ++n) {
      auto r = DecodeChecked(std::string_view(s).substr(0, n));
      EXPECT_FALSE(r.ok()) << "prefix " << n;
    }
  }
  std::mt19937_64 rng(seed);
  int ok = 0;
  // A minute at -O0 under ASan for the full count: the sanitizer builds
  // try a fifth (the release build and the metadata fuzzer do the rest).
  constexpr int kMutations = testing::kSlowSanitizer ? 4000 : 20000;
  for (int iter = 0; iter < kMutations; ++iter) {
    std::string s = samples[iter % samples.size()];
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      s[rng() % s.size()] = static_cast<char>(rng());
    }
    auto r = DecodeChecked(s);
    if (r.ok()) {
      ++ok;
    } else {
      EXPECT_TRUE(r.status().code() == absl::StatusCode::kInvalidArgument ||
                  r.status().code() == absl::StatusCode::kResourceExhausted)
          << r.status();
    }
  }
  std::printf("[ corrupt ] %d of %d mutated pickles still decoded\n", ok,
              kMutations);
}

TEST(MetadataTest, AllocationLimitIsHonoured) {
  Metadata md = SmallExample();
  ASSERT_OK_AND_ASSIGN(std::string bytes, EncodeMetadata(md));
  DecodeOptions options;
  options.max_alloc_bytes = 1000;
  auto r = DecodeChecked(bytes, options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace ckptd::format
