// Copyright 2026 The ckptd Authors.
//
// metadata_tool: drives the .metadata codec from tests and the shell.
//
//   metadata_tool decode FILE          canonical JSON of DecodeMetadata(FILE)
//                                      (the streaming decoder); fails if
//                                      the generic reference decoder
//                                      (DecodeMetadataGeneric) disagrees
//   metadata_tool encode JSON_IN OUT   EncodeMetadata of a JSON description
//   metadata_tool bench RANKS TENSORS [--encode-only]
//                                      time encode (+ decode) of a synthetic
//                                      RANKS x TENSORS checkpoint (dim-0
//                                      shards)
//
// The JSON description (same shape as `decode` prints):
//   {"state_dict_metadata": [
//      {"fqn": "model.w", "type": "tensor", "dtype": "float32",
//       "requires_grad": false, "pin_memory": false, "memory_format": 0,
//       "size": [4, 6], "chunks": [{"offsets": [0, 0], "sizes": [2, 6]}]},
//      {"fqn": "step", "type": "bytes"}],
//    "planner_data": null | [["model.w", ["model", "w"]], ...],
//    "storage_data": [{"fqn": "model.w", "offset": [0, 0] | null,
//                      "relative_path": "__0_0.distcp", "file_offset": 0,
//                      "length": 10, "transform_descriptors": []}],
//    "storage_meta": null | {"checkpoint_id": str|null, "save_id": str|null,
//                            "load_id": str|null, "modules": [str]},
//    "version": null | str}
// `encode` writes storage_meta (EncodeOptions::write_storage_meta) iff it is
// not null.
#include <time.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "format/metadata/metadata.h"
#include "nlohmann/json.hpp"

namespace ckptd::format {
namespace {

using Json = nlohmann::ordered_json;

// ---- output ----

Json IntArray(const std::vector<int64_t>& v) {
  Json a = Json::array();
  for (int64_t x : v) a.push_back(x);
  return a;
}

Json OptString(const std::optional<std::string>& s) {
  return s ? Json(*s) : Json(nullptr);
}

Json ToJson(const Metadata& md) {
  Json out = Json::object();
  Json sdm = Json::array();
  for (const auto& [fqn, sm] : md.state_dict_metadata) {
    Json e = Json::object();
    e["fqn"] = fqn;
    if (const auto* t = std::get_if<TensorStorageMetadata>(&sm)) {
      e["type"] = "tensor";
      e["dtype"] = std::string(DTypeName(t->properties.dtype));
      e["requires_grad"] = t->properties.requires_grad;
      e["pin_memory"] = t->properties.pin_memory;
      e["memory_format"] = t->properties.memory_format;
      e["size"] = IntArray(t->size);
      Json chunks = Json::array();
      for (const auto& c : t->chunks) {
        chunks.push_back(Json{{"offsets", IntArray(c.offsets)},
                              {"sizes", IntArray(c.sizes)}});
      }
      e["chunks"] = std::move(chunks);
    } else {
      e["type"] = "bytes";
    }
    sdm.push_back(std::move(e));
  }
  out["state_dict_metadata"] = std::move(sdm);
  if (md.planner_data) {
    Json pd = Json::array();
    for (const auto& [fqn, path] : *md.planner_data) {
      Json p = Json::array();
      for (const auto& el : path) {
        if (const auto* s = std::get_if<std::string>(&el)) {
          p.push_back(*s);
        } else {
          p.push_back(std::get<int64_t>(el));
        }
      }
      pd.push_back(Json::array({fqn, std::move(p)}));
    }
    out["planner_data"] = std::move(pd);
  } else {
    out["planner_data"] = nullptr;
  }
  Json sd = Json::array();
  for (const auto& [key, info] : md.storage_data) {
    Json e = Json::object();
    e["fqn"] = key.fqn;
    e["offset"] = key.has_offset ? IntArray(key.offset) : Json(nullptr);
    e["relative_path"] = info.relative_path;
    e["file_offset"] = info.offset;
    e["length"] = info.length;
    e["transform_descriptors"] = info.transform_descriptors;
    sd.push_back(std::move(e));
  }
  out["storage_data"] = std::move(sd);
  if (md.storage_meta) {
    const StorageMeta& sm = *md.storage_meta;
    out["storage_meta"] = Json{{"checkpoint_id", OptString(sm.checkpoint_id)},
                               {"save_id", OptString(sm.save_id)},
                               {"load_id", OptString(sm.load_id)},
                               {"modules", sm.modules}};
  } else {
    out["storage_meta"] = nullptr;
  }
  out["version"] = OptString(md.version);
  return out;
}

// ---- input ----

absl::Status Bad(std::string_view where, std::string_view what) {
  return absl::InvalidArgumentError(fmt::format("JSON {}: {}", where, what));
}

const Json* Member(const Json& j, const char* name) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(name);
  return it == j.end() ? nullptr : &*it;
}

absl::StatusOr<std::string> Str(const Json& j, const char* name) {
  const Json* v = Member(j, name);
  if (v == nullptr || !v->is_string()) return Bad(name, "expected a string");
  return v->get<std::string>();
}

absl::StatusOr<std::optional<std::string>> OptStr(const Json& j,
                                                  const char* name) {
  const Json* v = Member(j, name);
  if (v == nullptr || v->is_null()) return std::optional<std::string>();
  if (!v->is_string()) return Bad(name, "expected a string or null");
  return std::optional<std::string>(v->get<std::string>());
}

absl::StatusOr<int64_t> I64(const Json& v, std::string_view where) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX))
      return Bad(where, "int64 overflow");
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  return Bad(where, "expected an integer");
}

absl::StatusOr<uint64_t> U64(const Json& j, const char* name) {
  const Json* v = Member(j, name);
  if (v == nullptr) return Bad(name, "missing");
  if (v->is_number_unsigned()) return v->get<uint64_t>();
  if (v->is_number_integer() && v->get<int64_t>() >= 0) {
    return static_cast<uint64_t>(v->get<int64_t>());
  }
  return Bad(name, "expected a non-negative integer");
}

absl::StatusOr<bool> Flag(const Json& j, const char* name) {
  const Json* v = Member(j, name);
  if (v == nullptr) return false;
  if (!v->is_boolean()) return Bad(name, "expected a bool");
  return v->get<bool>();
}

absl::StatusOr<std::vector<int64_t>> Ints(const Json& v,
                                          std::string_view where) {
  if (!v.is_array()) return Bad(where, "expected an array of integers");
  std::vector<int64_t> out;
  for (const Json& e : v) {
    ASSIGN_OR_RETURN(int64_t x, I64(e, where));
    out.push_back(x);
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> Strings(const Json& j,
                                                 const char* name) {
  std::vector<std::string> out;
  const Json* v = Member(j, name);
  if (v == nullptr || v->is_null()) return out;
  if (!v->is_array()) return Bad(name, "expected an array of strings");
  for (const Json& e : *v) {
    if (!e.is_string()) return Bad(name, "expected an array of strings");
    out.push_back(e.get<std::string>());
  }
  return out;
}

absl::StatusOr<Metadata> FromJson(const Json& j) {
  Metadata md;
  const Json* sdm = Member(j, "state_dict_metadata");
  if (sdm == nullptr || !sdm->is_array()) {
    return Bad("state_dict_metadata", "expected an array");
  }
  for (const Json& e : *sdm) {
    ASSIGN_OR_RETURN(std::string fqn, Str(e, "fqn"));
    ASSIGN_OR_RETURN(std::string type, Str(e, "type"));
    if (type == "bytes") {
      md.state_dict_metadata.emplace_back(fqn, BytesStorageMetadata{});
      continue;
    }
    if (type != "tensor") return Bad("type", "expected 'tensor' or 'bytes'");
    TensorStorageMetadata t;
    ASSIGN_OR_RETURN(std::string dtype, Str(e, "dtype"));
    ASSIGN_OR_RETURN(t.properties.dtype, DTypeFromName(dtype));
    ASSIGN_OR_RETURN(t.properties.requires_grad, Flag(e, "requires_grad"));
    ASSIGN_OR_RETURN(t.properties.pin_memory, Flag(e, "pin_memory"));
    if (const Json* mf = Member(e, "memory_format")) {
      ASSIGN_OR_RETURN(int64_t v, I64(*mf, "memory_format"));
      t.properties.memory_format = static_cast<int>(v);
    }
    const Json* size = Member(e, "size");
    if (size == nullptr) return Bad("size", "missing");
    ASSIGN_OR_RETURN(t.size, Ints(*size, "size"));
    const Json* chunks = Member(e, "chunks");
    if (chunks == nullptr || !chunks->is_array()) {
      return Bad("chunks", "expected an array");
    }
    for (const Json& c : *chunks) {
      const Json* off = Member(c, "offsets");
      const Json* sz = Member(c, "sizes");
      if (off == nullptr || sz == nullptr)
        return Bad("chunks", "missing field");
      ChunkStorageMetadata chunk;
      ASSIGN_OR_RETURN(chunk.offsets, Ints(*off, "offsets"));
      ASSIGN_OR_RETURN(chunk.sizes, Ints(*sz, "sizes"));
      t.chunks.push_back(std::move(chunk));
    }
    md.state_dict_metadata.emplace_back(fqn, std::move(t));
  }
  if (const Json* pd = Member(j, "planner_data"); pd && !pd->is_null()) {
    if (!pd->is_array())
      return Bad("planner_data", "expected an array or null");
    auto& out = md.planner_data.emplace();
    for (const Json& e : *pd) {
      if (!e.is_array() || e.size() != 2 || !e[0].is_string() ||
          !e[1].is_array()) {
        return Bad("planner_data", "expected [fqn, [path...]] pairs");
      }
      std::vector<PathElement> path;
      for (const Json& p : e[1]) {
        if (p.is_string()) {
          path.emplace_back(p.get<std::string>());
        } else {
          ASSIGN_OR_RETURN(int64_t v, I64(p, "planner_data path"));
          path.emplace_back(v);
        }
      }
      out.emplace_back(e[0].get<std::string>(), std::move(path));
    }
  }
  const Json* sd = Member(j, "storage_data");
  if (sd == nullptr || !sd->is_array())
    return Bad("storage_data", "expected an array");
  for (const Json& e : *sd) {
    StorageKey key;
    StorageInfo info;
    ASSIGN_OR_RETURN(key.fqn, Str(e, "fqn"));
    if (const Json* off = Member(e, "offset"); off && !off->is_null()) {
      key.has_offset = true;
      ASSIGN_OR_RETURN(key.offset, Ints(*off, "offset"));
    }
    ASSIGN_OR_RETURN(info.relative_path, Str(e, "relative_path"));
    ASSIGN_OR_RETURN(info.offset, U64(e, "file_offset"));
    ASSIGN_OR_RETURN(info.length, U64(e, "length"));
    ASSIGN_OR_RETURN(info.transform_descriptors,
                     Strings(e, "transform_descriptors"));
    md.storage_data.emplace_back(std::move(key), std::move(info));
  }
  if (const Json* sm = Member(j, "storage_meta"); sm && !sm->is_null()) {
    StorageMeta meta;
    ASSIGN_OR_RETURN(meta.checkpoint_id, OptStr(*sm, "checkpoint_id"));
    ASSIGN_OR_RETURN(meta.save_id, OptStr(*sm, "save_id"));
    ASSIGN_OR_RETURN(meta.load_id, OptStr(*sm, "load_id"));
    ASSIGN_OR_RETURN(meta.modules, Strings(*sm, "modules"));
    md.storage_meta = std::move(meta);
  }
  ASSIGN_OR_RETURN(md.version, OptStr(j, "version"));
  return md;
}

// ---- files ----

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(fmt::format("cannot open {}", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::Status WriteFile(const std::string& path, std::string_view data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  out.close();
  if (!out) return absl::InternalError(fmt::format("cannot write {}", path));
  return absl::OkStatus();
}

// ---- commands ----

absl::Status Decode(const std::string& path) {
  ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  DecodeOptions options;
  options.source_name = path;
  absl::StatusOr<Metadata> got = DecodeMetadata(bytes, options);
  absl::StatusOr<Metadata> ref = DecodeMetadataGeneric(bytes, options);
  if (got.ok() != ref.ok() ||
      (!got.ok() && got.status().code() != ref.status().code()) ||
      (got.ok() && ToJson(*got) != ToJson(*ref))) {
    return absl::InternalError(fmt::format(
        "{}: the streaming decoder and the generic reference disagree: {} vs "
        "{}",
        path, got.ok() ? "OK" : got.status().ToString(),
        ref.ok() ? "OK" : ref.status().ToString()));
  }
  if (!got.ok()) return got.status();
  const std::string text =
      ToJson(*got).dump(1, ' ', false, Json::error_handler_t::replace);
  std::printf("%s\n", text.c_str());
  return absl::OkStatus();
}

absl::Status Encode(const std::string& in, const std::string& out) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(in));
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad(in, "parse error");
  ASSIGN_OR_RETURN(Metadata md, FromJson(j));
  EncodeOptions options;
  options.write_storage_meta = md.storage_meta.has_value();
  ASSIGN_OR_RETURN(std::string bytes, EncodeMetadata(md, options));
  return WriteFile(out, bytes);
}

double CpuNow() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

absl::Status Bench(int ranks, int tensors, bool decode) {
  Metadata md;
  for (int t = 0; t < tensors; ++t) {
    TensorStorageMetadata tsm;
    tsm.properties.dtype = DType::kBFloat16;
    tsm.size = {int64_t{ranks} * 4096, 8192};
    for (int r = 0; r < ranks; ++r) {
      tsm.chunks.push_back({{int64_t{r} * 4096, 0}, {4096, 8192}});
    }
    md.state_dict_metadata.emplace_back(
        fmt::format("model.layers.{}.mlp.w{}.weight", t / 8, t % 8),
        std::move(tsm));
  }
  const uint64_t chunk_bytes = uint64_t{4096} * 8192 * 2;
  for (int r = 0; r < ranks; ++r) {
    const std::string file = fmt::format("__{}_0.distcp", r);
    for (int t = 0; t < tensors; ++t) {
      md.storage_data.push_back(
          {StorageKey{
               md.state_dict_metadata[t].first, true, {int64_t{r} * 4096, 0}},
           StorageInfo{file,
                       uint64_t(t) * (chunk_bytes + 1024),
                       chunk_bytes + 900,
                       {}}});
    }
  }
  const double chunks = double(ranks) * tensors;
  // Reference: one pass that only reads what the encoder must read.
  double t0 = CpuNow();
  uint64_t sum = 0;
  for (const auto& [fqn, sm] : md.state_dict_metadata) {
    for (const auto& c : std::get<TensorStorageMetadata>(sm).chunks) {
      for (int64_t v : c.offsets) sum += static_cast<uint64_t>(v);
      for (int64_t v : c.sizes) sum += static_cast<uint64_t>(v);
    }
  }
  for (const auto& [key, info] : md.storage_data) {
    for (char ch : key.fqn) sum += static_cast<unsigned char>(ch);
    for (int64_t v : key.offset) sum += static_cast<uint64_t>(v);
    sum += info.relative_path.size() + info.offset + info.length;
  }
  std::printf("read-only pass over the input: %.3f s cpu (checksum %llu)\n",
              CpuNow() - t0, static_cast<unsigned long long>(sum));
  t0 = CpuNow();
  ASSIGN_OR_RETURN(std::string bytes, EncodeMetadata(md));
  const double enc = CpuNow() - t0;
  std::printf("encode: %.0f chunks, %.3f s cpu, %zu bytes, %.1f bytes/chunk\n",
              chunks, enc, bytes.size(), double(bytes.size()) / chunks);
  if (!decode) return absl::OkStatus();
  DecodeOptions options;
  options.max_alloc_bytes = uint64_t{64} << 30;
  t0 = CpuNow();
  ASSIGN_OR_RETURN(Metadata got, DecodeMetadata(bytes, options));
  const double dec = CpuNow() - t0;
  std::printf("decode: %.3f s cpu, %.2f us/chunk, %zu storage entries\n", dec,
              dec * 1e6 / chunks, got.storage_data.size());
  return absl::OkStatus();
}

int Usage() {
  std::fprintf(stderr,
               "usage: metadata_tool decode FILE\n"
               "       metadata_tool encode JSON_IN OUT\n"
               "       metadata_tool bench RANKS TENSORS [--encode-only]\n");
  return 2;
}

int Main(int argc, char** argv) {
  if (argc < 2) return Usage();
  const std::string cmd = argv[1];
  absl::Status s;
  if (cmd == "decode" && argc == 3) {
    s = Decode(argv[2]);
  } else if (cmd == "encode" && argc == 4) {
    s = Encode(argv[2], argv[3]);
  } else if (cmd == "bench" && (argc == 4 || argc == 5)) {
    s = Bench(std::atoi(argv[2]), std::atoi(argv[3]),
              argc == 4 || std::string(argv[4]) != "--encode-only");
  } else {
    return Usage();
  }
  if (!s.ok()) {
    const std::string msg(s.message().data(), s.message().size());
    std::fprintf(stderr, "metadata_tool %s: %s\n", cmd.c_str(), msg.c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace ckptd::format

int main(int argc, char** argv) { return ckptd::format::Main(argc, argv); }
