// Copyright 2026 The ckptd Authors.
#include "format/metadata/metadata_json.h"

#include <variant>

#include "format/tensor/dtype.h"

namespace ckptd::format {

using json = nlohmann::ordered_json;

std::string DumpJson(const json& j, int indent) {
  return j.dump(indent, ' ', /*ensure_ascii=*/false,
                json::error_handler_t::replace);
}

json PathToJson(const std::vector<PathElement>& path) {
  json p = json::array();
  for (const PathElement& e : path) {
    if (const auto* key = std::get_if<std::string>(&e)) {
      p.push_back(*key);
    } else {
      p.push_back(std::get<int64_t>(e));
    }
  }
  return p;
}

json ChunkJson(const CompactMetadata& md, size_t i, size_t j,
               bool with_storage) {
  json cj = json::object();
  const auto off = md.chunk_offsets(i, j), size = md.chunk_sizes(i, j);
  cj["offsets"] = std::vector<int64_t>(off.begin(), off.end());
  cj["sizes"] = std::vector<int64_t>(size.begin(), size.end());
  if (with_storage) {
    if (const auto* s = md.chunk_storage(i, j)) {
      cj["file"] = std::string(md.relative_path(*s));
      cj["offset"] = s->offset;
      cj["length"] = s->length;
    }
  }
  return cj;
}

std::string MetadataJson(
    const std::string& dir, const CompactMetadata& md, bool chunks,
    bool bytes_sizes,
    const absl::flat_hash_map<size_t, int64_t>* decoded_sizes) {
  json head = json::object();
  head["dir"] = dir;
  head["version"] =
      md.version().has_value() ? json(*md.version()) : json(nullptr);
  std::string out = DumpJson(head);
  out.pop_back();  // the closing brace
  out += ",\"entries\":[";
  for (size_t i = 0; i < md.num_items(); ++i) {
    json e = json::object();
    e["fqn"] = std::string(md.fqn(i));
    const auto& it = md.item(i);
    if (it.tensor) {
      e["type"] = "tensor";
      e["dtype"] = std::string(DTypeName(it.properties.dtype));
      const auto shape = md.shape(i);
      e["size"] = std::vector<int64_t>(shape.begin(), shape.end());
      if (chunks) {
        json cs = json::array();
        for (size_t j = 0; j < it.num_chunks; ++j) {
          cs.push_back(ChunkJson(md, i, j, /*with_storage=*/false));
        }
        e["chunks"] = std::move(cs);
      } else {
        e["num_chunks"] = it.num_chunks;
      }
    } else {
      e["type"] = "bytes";
      if (bytes_sizes) {
        const CompactMetadata::Storage* s = md.bytes_storage(i);
        e["nbytes"] = s != nullptr ? static_cast<int64_t>(s->length) : -1;
        if (decoded_sizes != nullptr) {
          if (auto d = decoded_sizes->find(i); d != decoded_sizes->end())
            e["nbytes"] = d->second;
        }
      }
    }
    if (i > 0) out += ',';
    out += DumpJson(e);
  }
  out += "],\"planner_data\":";
  if (md.planner_data().has_value()) {
    json pd = json::object();
    for (const auto& [fqn, path] : *md.planner_data())
      pd[fqn] = PathToJson(path);
    out += DumpJson(pd);
  } else {
    out += "null";
  }
  out += '}';
  return out;
}

}  // namespace ckptd::format
