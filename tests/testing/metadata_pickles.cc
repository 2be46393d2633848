// Copyright 2026 The ckptd Authors.
//
// The .metadata codec tests' shared pickles and checked decode
// (metadata_pickles.h).
#include "tests/testing/metadata_pickles.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace ckptd::testing {

using format::BytesStorageMetadata;
using format::DecodeMetadata;
using format::DecodeMetadataGeneric;
using format::DecodeOptions;
using format::DescribeKey;
using format::DType;
using format::Metadata;
using format::StorageKey;
using format::TensorStorageMetadata;
using pickle::Writer;

std::string Msg(const absl::Status& s) {
  return std::string(s.message().data(), s.message().size());
}

void ExpectSameMetadata(const Metadata& got, const Metadata& want) {
  ASSERT_EQ(got.state_dict_metadata.size(), want.state_dict_metadata.size());
  for (size_t i = 0; i < want.state_dict_metadata.size(); ++i) {
    SCOPED_TRACE("state_dict_metadata entry " + std::to_string(i));
    EXPECT_EQ(got.state_dict_metadata[i].first,
              want.state_dict_metadata[i].first);
    EXPECT_TRUE(got.state_dict_metadata[i].second ==
                want.state_dict_metadata[i].second);
  }
  EXPECT_EQ(got.planner_data, want.planner_data);
  ASSERT_EQ(got.storage_data.size(), want.storage_data.size());
  for (size_t i = 0; i < want.storage_data.size(); ++i) {
    SCOPED_TRACE("storage_data entry " + std::to_string(i));
    EXPECT_EQ(DescribeKey(got.storage_data[i].first),
              DescribeKey(want.storage_data[i].first));
    EXPECT_TRUE(got.storage_data[i].first == want.storage_data[i].first);
    EXPECT_TRUE(got.storage_data[i].second == want.storage_data[i].second);
  }
  EXPECT_EQ(got.storage_meta.has_value(), want.storage_meta.has_value());
  if (got.storage_meta && want.storage_meta) {
    EXPECT_TRUE(*got.storage_meta == *want.storage_meta);
  }
  EXPECT_EQ(got.version, want.version);
}

absl::StatusOr<Metadata> DecodeChecked(std::string_view data,
                                       const DecodeOptions& options) {
  absl::StatusOr<Metadata> got = DecodeMetadata(data, options);
  if (data.size() > (size_t{64} << 20))
    return got;  // the reference: ~5 KB/chunk
  absl::StatusOr<Metadata> ref = DecodeMetadataGeneric(data, options);
  const bool exhausted = absl::IsResourceExhausted(got.status()) ||
                         absl::IsResourceExhausted(ref.status());
  if (got.ok() && ref.ok()) {
    ExpectSameMetadata(*got, *ref);
  } else if (!exhausted) {
    EXPECT_EQ(got.status().code(), ref.status().code())
        << "streaming: " << got.status() << "\nreference: " << ref.status();
    const std::string rm = Msg(ref.status());
    const size_t at = rm.find(": offset ");
    const size_t op = rm.find("): ", at == std::string::npos ? 0 : at);
    if (at != std::string::npos && op != std::string::npos) {
      // "<src>: offset N: opcode 0x.. 'c' (NAME): "
      EXPECT_EQ(Msg(got.status()).substr(0, op + 3), rm.substr(0, op + 3))
          << "streaming: " << got.status() << "\nreference: " << ref.status();
    }
  }
  return got;
}

Metadata SmallExample() {
  // dcp-format.md §3.3: {"model": {"w": T[4,6] sharded on dim 0}, "step": 7}.
  Metadata md;
  TensorStorageMetadata w;
  w.properties.dtype = DType::kFloat32;
  w.size = {4, 6};
  w.chunks = {{{0, 0}, {2, 6}}, {{2, 0}, {2, 6}}};
  md.state_dict_metadata.emplace_back("model.w", w);
  md.state_dict_metadata.emplace_back("step", BytesStorageMetadata{});
  // Rank order differs from chunk order: rank 0 wrote chunk 1.
  md.storage_data.push_back(
      {StorageKey{"model.w", true, {2, 0}}, {"__0_0.distcp", 0, 1000, {}}});
  md.storage_data.push_back(
      {StorageKey{"step", false, {}}, {"__0_0.distcp", 1000, 50, {}}});
  md.storage_data.push_back(
      {StorageKey{"model.w", true, {0, 0}}, {"__1_0.distcp", 0, 1000, {}}});
  return md;
}

// Emits `module.name` the way CPython does for a dataclass instance:
// GLOBAL, EMPTY_TUPLE, NEWOBJ (the caller adds the state and BUILD).
void NewObj(Writer& w, std::string_view module, std::string_view name) {
  w.Global(module, name);
  w.EmptyTuple();
  w.NewObj();
}

void PySize(Writer& w, std::vector<int64_t> v) {
  w.Global("torch", "Size");
  w.IntTuple(v);
  w.Tuple1();
  w.Reduce();
}

namespace {

void PyProps(Writer& w, const PyVariant& pv, std::string_view dtype,
             int memfmt) {
  const std::string_view mod = pv.shard_props ? kShard : kM;
  const std::string_view enum_name =
      pv.shard_props ? "MEM_FORMAT_ENCODING" : "_MEM_FORMAT_ENCODING";
  NewObj(w, mod, "TensorProperties");
  w.Mark();
  w.Global("torch", dtype);
  if (pv.layout_global) {
    w.Global("torch", "strided");
  } else {
    w.Global("torch.serialization", "_get_layout");
    w.String("torch.strided");
    w.Tuple1();
    w.Reduce();
  }
  w.Bool(true);  // requires_grad
  static const char* kNames[] = {"TORCH_CONTIGUOUS_FORMAT",
                                 "TORCH_CHANNELS_LAST",
                                 "TORCH_PRESERVE_FORMAT"};
  if (pv.enum_form == 0) {
    w.Global(mod, enum_name);
    w.Int(memfmt);
    w.Tuple1();
    w.Reduce();
  } else {
    w.Global(pv.enum_form == 1 ? "builtins" : "__builtin__", "getattr");
    w.Global(mod, enum_name);
    w.String(kNames[memfmt]);
    w.Tuple2();
    w.Reduce();
  }
  w.Bool(false);  // pin_memory
  w.Tuple();
  w.Build();
}

void PyChunk(Writer& w, std::vector<int64_t> off, std::vector<int64_t> sz) {
  NewObj(w, kM, "ChunkStorageMetadata");
  w.EmptyDict();
  w.Mark();
  w.String("offsets");
  PySize(w, off);
  w.String("sizes");
  PySize(w, sz);
  w.SetItems();
  w.Build();
}

void PyIndex(Writer& w, std::string_view fqn,
             std::optional<std::vector<int64_t>> off,
             std::optional<int64_t> index) {
  // __dict__ order fqn, index, offset (custom __init__); no offset for bytes.
  NewObj(w, kM, "MetadataIndex");
  w.EmptyDict();
  w.Mark();
  w.String("fqn");
  w.String(fqn);
  w.String("index");
  if (index) {
    w.Int(*index);
  } else {
    w.None();
  }
  if (off) {
    w.String("offset");
    PySize(w, *off);
  }
  w.SetItems();
  w.Build();
}

void PyInfo(Writer& w, const PyVariant& pv, std::string_view path, uint64_t off,
            uint64_t len) {
  NewObj(w, kFs, "_StorageInfo");
  w.EmptyDict();
  w.Mark();
  w.String("relative_path");
  w.String(path);
  w.String("offset");
  w.Int(static_cast<int64_t>(off));
  w.String("length");
  w.Int(static_cast<int64_t>(len));
  if (pv.transforms == 1) {
    w.String("transform_descriptors");
    w.None();
  } else if (pv.transforms == 2) {
    w.String("transform_descriptors");
    w.EmptyList();
    w.String("stream.zstd/1");
    w.Append();
  }
  w.SetItems();
  w.Build();
}

}  // namespace

// The §3.3 example as Python 2.4+ pickles it (protocol 2 opcodes).
std::string PythonStyleExample(const PyVariant& pv) {
  std::string out;
  Writer w(&out);
  w.Proto(2);
  NewObj(w, kM, "Metadata");
  w.EmptyDict();
  w.Mark();
  {
    w.String("state_dict_metadata");
    w.EmptyDict();
    w.Mark();
    w.String("model.w");
    NewObj(w, kM, "TensorStorageMetadata");
    w.EmptyDict();
    w.Mark();
    w.String("properties");
    PyProps(w, pv, "bfloat16", 1);
    w.String("size");
    PySize(w, {4, 6});
    w.String("chunks");
    w.EmptyList();
    w.Mark();
    PyChunk(w, {0, 0}, {2, 6});
    PyChunk(w, {2, 0}, {2, 6});
    w.Appends();
    w.SetItems();
    w.Build();
    w.String("step");
    NewObj(w, kM, "BytesStorageMetadata");
    if (pv.bytes_build) {
      w.EmptyDict();
      w.Build();
    }
    w.SetItems();
  }
  {
    w.String("planner_data");
    w.EmptyDict();
    w.Mark();
    w.String("model.w");
    w.String("model");
    w.String("w");
    w.Tuple2();
    w.String("step");
    w.String("step");
    w.Tuple1();
    w.SetItems();
  }
  {
    w.String("storage_data");
    w.EmptyDict();
    w.Mark();
    PyIndex(w, "model.w", std::vector<int64_t>{0, 0}, 0);
    PyInfo(w, pv, "__0_0.distcp", 0, 1234);
    PyIndex(w, "model.w", std::vector<int64_t>{2, 0}, 1);
    PyInfo(w, pv, "__1_0.distcp", 0, uint64_t{5} << 32);
    PyIndex(w, "step", std::nullopt, std::nullopt);
    PyInfo(w, pv, "__0_0.distcp", 1234, 77);
    w.SetItems();
  }
  {
    w.String("storage_meta");
    NewObj(w, kM, "StorageMeta");
    w.EmptyDict();
    w.Mark();
    w.String("checkpoint_id");
    w.Global(pv.pathlib_local ? "pathlib._local" : "pathlib", "PosixPath");
    w.String("/");
    w.String("ckpt");
    w.String("step-1");
    w.Tuple3();
    w.Reduce();
    w.String("save_id");
    w.String("0a1b-uuid");
    w.String("load_id");
    w.None();
    if (pv.modules) {
      w.String("modules");
      w.EmptyList();
    }
    w.SetItems();
    w.Build();
  }
  if (pv.version) {
    w.String("version");
    w.String("1.0.0");
  }
  w.SetItems();
  w.Build();
  w.Stop();
  return out;
}

namespace {

void StdSdm(Writer& w) {
  w.EmptyDict();
  w.String("model.w");
  w.Global(kM, "TensorStorageMetadata");
  w.Global(kM, "TensorProperties");
  w.Global("torch", "float16");
  w.Tuple1();
  w.Reduce();
  PySize(w, {4});
  w.EmptyList();
  w.Mark();
  for (int64_t off : {0, 2}) {
    w.Global(kM, "ChunkStorageMetadata");
    PySize(w, {off});
    PySize(w, {2});
    w.Tuple2();
    w.Reduce();
  }
  w.Appends();
  w.Tuple3();
  w.Reduce();
  w.SetItem();
}

void StdStorage(Writer& w) {
  w.EmptyDict();
  w.Mark();
  for (int64_t off : {0, 2}) {
    w.Global(kM, "MetadataIndex");
    w.String("model.w");
    PySize(w, {off});
    w.Tuple2();
    w.Reduce();
    w.Global(kFs, "_StorageInfo");
    w.String("f");
    w.Int(off * 100);
    w.Int(100);
    w.Tuple3();
    w.Reduce();
  }
  w.SetItems();
}

std::string Build(const Parts& parts) {
  std::string out;
  Writer w(&out);
  w.Proto(2);
  w.Global(kM, "Metadata");
  w.Mark();
  (parts.sdm ? parts.sdm : StdSdm)(w);
  if (parts.planner) {
    parts.planner(w);
  } else {
    w.None();
  }
  (parts.storage ? parts.storage : StdStorage)(w);
  if (parts.storage_meta) parts.storage_meta(w);
  w.Tuple();
  w.Reduce();
  w.Stop();
  return out;
}

}  // namespace

absl::StatusOr<Metadata> DecodeParts(const Parts& parts) {
  DecodeOptions options;
  options.source_name = "/x/.metadata";
  return DecodeChecked(Build(parts), options);
}

void ExpectError(const Parts& parts, std::string_view needle) {
  auto md = DecodeParts(parts);
  ASSERT_FALSE(md.ok());
  EXPECT_EQ(md.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg = Msg(md.status());
  EXPECT_EQ(msg.rfind("/x/.metadata: ", 0), 0u) << msg;
  EXPECT_NE(msg.find(needle), std::string::npos)
      << "message: " << msg << "\nexpected to contain: " << needle;
}

}  // namespace ckptd::testing
