// Copyright 2026 The ckptd Authors.
//
// The .metadata codec's decoder (format/metadata/metadata.h) on the shapes
// PyTorch's pickles take: the dcp-format.md §3.3 example in CPython's
// NEWOBJ/BUILD shape (§3.2, §3.4 A) in all its variants, and hand-made
// constructor-form pickles with defaults, positional and bare-tuple fields,
// unknown planner data and storage meta, and duplicate dict keys.
#include <string>
#include <variant>
#include <vector>

#include "fmt/format.h"
#include "format/metadata/metadata.h"
#include "format/pickle/pickle.h"
#include "gtest/gtest.h"
#include "tests/testing/metadata_pickles.h"
#include "tests/testing/test_util.h"

namespace ckptd::format {
namespace {

using ::ckptd::testing::DecodeChecked;
using ::ckptd::testing::DecodeParts;
using ::ckptd::testing::kFs;
using ::ckptd::testing::kM;
using ::ckptd::testing::kShard;
using ::ckptd::testing::NewObj;
using ::ckptd::testing::Parts;
using ::ckptd::testing::PySize;
using ::ckptd::testing::PythonStyleExample;
using ::ckptd::testing::PyVariant;
using pickle::Writer;

// ---------------------------------------------------------------------------
// Hand-built pickles in CPython's shape (NEWOBJ + BUILD, §3.2)
// ---------------------------------------------------------------------------

TEST(MetadataTest, DecodesPythonStyleVariants) {
  int n = 0;
  for (int enum_form = 0; enum_form < 3; ++enum_form) {
    for (int bits = 0; bits < 64; ++bits) {
      for (int transforms = 0; transforms < 3; ++transforms) {
        PyVariant pv;
        pv.enum_form = enum_form;
        pv.shard_props = bits & 1;
        pv.layout_global = bits & 2;
        pv.pathlib_local = bits & 4;
        pv.modules = bits & 8;
        pv.bytes_build = bits & 16;
        pv.version = bits & 32;
        pv.transforms = transforms;
        SCOPED_TRACE(fmt::format("enum {} bits {} transforms {}", enum_form,
                                 bits, transforms));
        ++n;
        DecodeOptions options;
        options.source_name = "/x/.metadata";
        ASSERT_OK_AND_ASSIGN(Metadata md,
                             DecodeChecked(PythonStyleExample(pv), options));
        ASSERT_EQ(md.state_dict_metadata.size(), 2u);
        EXPECT_EQ(md.state_dict_metadata[0].first, "model.w");
        const auto* t = std::get_if<TensorStorageMetadata>(
            &md.state_dict_metadata[0].second);
        ASSERT_NE(t, nullptr);
        EXPECT_EQ(t->properties.dtype, DType::kBFloat16);
        EXPECT_TRUE(t->properties.requires_grad);
        EXPECT_FALSE(t->properties.pin_memory);
        EXPECT_EQ(t->properties.memory_format, 1);
        EXPECT_EQ(t->size, (std::vector<int64_t>{4, 6}));
        ASSERT_EQ(t->chunks.size(), 2u);
        EXPECT_EQ(t->chunks[1].offsets, (std::vector<int64_t>{2, 0}));
        EXPECT_EQ(t->chunks[1].sizes, (std::vector<int64_t>{2, 6}));
        EXPECT_TRUE(std::holds_alternative<BytesStorageMetadata>(
            md.state_dict_metadata[1].second));
        ASSERT_TRUE(md.planner_data.has_value());
        ASSERT_EQ(md.planner_data->size(), 2u);
        EXPECT_EQ(
            (*md.planner_data)[0].second,
            (std::vector<PathElement>{std::string("model"), std::string("w")}));
        ASSERT_EQ(md.storage_data.size(), 3u);
        EXPECT_TRUE(md.storage_data[1].first ==
                    (StorageKey{"model.w", true, {2, 0}}));
        EXPECT_EQ(md.storage_data[1].second.length, uint64_t{5} << 32);
        EXPECT_TRUE(md.storage_data[2].first ==
                    (StorageKey{"step", false, {}}));
        EXPECT_EQ(md.storage_data[2].second.offset, 1234u);
        const std::vector<std::string> want_td =
            transforms == 2 ? std::vector<std::string>{"stream.zstd/1"}
                            : std::vector<std::string>{};
        EXPECT_EQ(md.storage_data[0].second.transform_descriptors, want_td);
        ASSERT_TRUE(md.storage_meta.has_value());
        EXPECT_EQ(md.storage_meta->checkpoint_id, "/ckpt/step-1");
        EXPECT_EQ(md.storage_meta->save_id, "0a1b-uuid");
        EXPECT_EQ(md.storage_meta->load_id, std::nullopt);
        EXPECT_TRUE(md.storage_meta->modules.empty());
        EXPECT_EQ(md.version, pv.version ? std::optional<std::string>("1.0.0")
                                         : std::nullopt);
        // Decoded metadata comes back indexed.
        const StorageInfo* info = md.FindStorage({"model.w", true, {0, 0}});
        ASSERT_NE(info, nullptr);
        EXPECT_EQ(info->length, 1234u);
        if (HasFailure()) return;
      }
    }
  }
  EXPECT_EQ(n, 3 * 64 * 3);
}

// ---------------------------------------------------------------------------
// Hand-made pickles in constructor form (testing::Parts)
// ---------------------------------------------------------------------------

TEST(MetadataTest, ConstructorFormWithDefaults) {
  ASSERT_OK_AND_ASSIGN(Metadata md, DecodeParts({}));
  EXPECT_FALSE(md.planner_data.has_value());  // None
  EXPECT_FALSE(md.storage_meta.has_value());
  EXPECT_FALSE(md.version.has_value());
  const auto& t =
      std::get<TensorStorageMetadata>(md.state_dict_metadata[0].second);
  EXPECT_EQ(t.properties.dtype, DType::kFloat16);
  EXPECT_FALSE(t.properties.requires_grad);
  EXPECT_EQ(t.properties.memory_format, 0);
  ASSERT_EQ(md.storage_data.size(), 2u);
  EXPECT_EQ(md.storage_data[1].second.offset, 200u);
}

TEST(MetadataTest, PositionalTensorPropertiesAndBareTuples) {
  Parts parts;
  parts.sdm = [](Writer& w) {
    w.EmptyDict();
    w.String("x");
    w.Global(kM, "TensorStorageMetadata");
    // TensorProperties(dtype, layout, requires_grad, memory_format, pin) of
    // the old module, memory format as torch.preserve_format.
    w.Global(kShard, "TensorProperties");
    w.Mark();
    w.Global("torch", "double");  // alias of float64
    w.Global("torch", "strided");
    w.Bool(true);
    w.Global("torch", "preserve_format");
    w.Bool(true);
    w.Tuple();
    w.Reduce();
    w.IntTuple({4});  // size as a bare tuple
    w.EmptyList();
    w.Global(kM, "ChunkStorageMetadata");
    w.IntTuple({0});
    w.EmptyList();  // sizes as a list
    w.Int(4);
    w.Append();
    w.Tuple2();
    w.Reduce();
    w.Append();
    w.Tuple3();
    w.Reduce();
    w.SetItem();
  };
  // MetadataIndex offset as a list (__init__ converts it to torch.Size),
  // _StorageInfo with transform_descriptors=None passed positionally.
  parts.storage = [](Writer& w) {
    w.EmptyDict();
    w.Global(kM, "MetadataIndex");
    w.String("x");
    w.EmptyList();
    w.Int(0);
    w.Append();
    w.Int(0);
    w.Tuple3();
    w.Reduce();
    w.Global(kFs, "_StorageInfo");
    w.Mark();
    w.String("f");
    w.Int(0);
    w.Int(32);
    w.None();
    w.Tuple();
    w.Reduce();
    w.SetItem();
  };
  ASSERT_OK_AND_ASSIGN(Metadata md, DecodeParts(parts));
  const auto& t =
      std::get<TensorStorageMetadata>(md.state_dict_metadata[0].second);
  EXPECT_EQ(t.properties.dtype, DType::kFloat64);
  EXPECT_TRUE(t.properties.requires_grad);
  EXPECT_TRUE(t.properties.pin_memory);
  EXPECT_EQ(t.properties.memory_format, 2);
  EXPECT_EQ(t.size, (std::vector<int64_t>{4}));
  EXPECT_EQ(t.chunks[0].sizes, (std::vector<int64_t>{4}));
  ASSERT_EQ(md.storage_data.size(), 1u);
  EXPECT_TRUE(md.storage_data[0].first == (StorageKey{"x", true, {0}}));
  EXPECT_TRUE(md.storage_data[0].second.transform_descriptors.empty());
}

TEST(MetadataTest, TensorPropertiesWithoutStateDefaultsToFloat32) {
  Parts parts;
  parts.sdm = [](Writer& w) {
    w.EmptyDict();
    w.String("x");
    NewObj(w, kM, "TensorStorageMetadata");
    w.EmptyDict();
    w.Mark();
    w.String("properties");
    NewObj(w, kM, "TensorProperties");
    w.String("size");
    PySize(w, {});
    w.String("chunks");
    w.EmptyList();
    w.SetItems();
    w.Build();
    w.SetItem();
  };
  parts.storage = [](Writer& w) { w.EmptyDict(); };
  ASSERT_OK_AND_ASSIGN(Metadata md, DecodeParts(parts));
  const auto& t =
      std::get<TensorStorageMetadata>(md.state_dict_metadata[0].second);
  EXPECT_EQ(t.properties.dtype, DType::kFloat32);
  EXPECT_TRUE(t.chunks.empty());
}

TEST(MetadataTest, ToleratesUnknownPlannerDataAndStorageMeta) {
  auto custom = [](Writer& w) {
    w.Global("my_planner", "State");
    w.EmptyTuple();
    w.NewObj();
    w.EmptyDict();
    w.String("x");
    w.Int(1);
    w.SetItem();
    w.Build();
  };
  {
    Parts parts;
    parts.planner = custom;
    parts.storage_meta = custom;
    ASSERT_OK_AND_ASSIGN(Metadata md, DecodeParts(parts));
    EXPECT_FALSE(md.planner_data.has_value());
    EXPECT_FALSE(md.storage_meta.has_value());
  }
  {
    // A custom object inside an otherwise fine planner_data dict.
    Parts parts;
    parts.planner = [&](Writer& w) {
      w.EmptyDict();
      w.String("model.w");
      w.String("model");
      custom(w);
      w.Tuple2();
      w.SetItem();
    };
    // StorageMeta whose checkpoint_id is an unknown PathLike: only that
    // field is dropped.
    parts.storage_meta = [&](Writer& w) {
      w.Global(kM, "StorageMeta");
      custom(w);
      w.String("save");
      w.Tuple2();
      w.Reduce();
    };
    ASSERT_OK_AND_ASSIGN(Metadata md, DecodeParts(parts));
    EXPECT_FALSE(md.planner_data.has_value());
    ASSERT_TRUE(md.storage_meta.has_value());
    EXPECT_FALSE(md.storage_meta->checkpoint_id.has_value());
    EXPECT_EQ(md.storage_meta->save_id, "save");
  }
  {
    // planner_data with list paths and int elements.
    Parts parts;
    parts.planner = [](Writer& w) {
      w.EmptyDict();
      w.String("opt.0.m");
      w.EmptyList();
      w.Mark();
      w.String("opt");
      w.Int(0);
      w.String("m");
      w.Appends();
      w.SetItem();
    };
    parts.storage_meta = [](Writer& w) {
      // pathlib.PurePosixPath('rel', 'dir') → "rel/dir"; no modules.
      w.Global(kM, "StorageMeta");
      w.Global("pathlib", "PurePosixPath");
      w.String("rel");
      w.String("dir");
      w.Tuple2();
      w.Reduce();
      w.Tuple1();
      w.Reduce();
    };
    ASSERT_OK_AND_ASSIGN(Metadata md, DecodeParts(parts));
    ASSERT_TRUE(md.planner_data.has_value());
    EXPECT_EQ((*md.planner_data)[0].second,
              (std::vector<PathElement>{std::string("opt"), int64_t{0},
                                        std::string("m")}));
    ASSERT_TRUE(md.storage_meta.has_value());
    EXPECT_EQ(md.storage_meta->checkpoint_id, "rel/dir");
  }
}

TEST(MetadataTest, DuplicateDictKeysFollowPythonDictSemantics) {
  Parts parts;
  parts.storage = [](Writer& w) {
    w.EmptyDict();
    w.Mark();
    for (int64_t len : {1, 2, 3}) {
      w.Global(kM, "MetadataIndex");
      w.String("model.w");
      PySize(w, {len == 2 ? 2 : 0});
      w.Tuple2();
      w.Reduce();
      w.Global(kFs, "_StorageInfo");
      w.String("f");
      w.Int(0);
      w.Int(len);
      w.Tuple3();
      w.Reduce();
    }
    w.SetItems();
  };
  ASSERT_OK_AND_ASSIGN(Metadata md, DecodeParts(parts));
  ASSERT_EQ(md.storage_data.size(), 2u);
  EXPECT_EQ(md.storage_data[0].second.length,
            3u);  // first position, last value
  EXPECT_EQ(md.storage_data[1].second.length, 2u);
}

}  // namespace
}  // namespace ckptd::format
