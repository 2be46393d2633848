// Copyright 2026 The ckptd Authors.
//
// ckptctl inspect / verify.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "cli/ckptctl.h"
#include "cli/progress.h"
#include "client/info_json.h"
#include "common/absl_fmt.h"
#include "common/env.h"
#include "fmt/format.h"
#include "format/checkpoint/checkpoint_reader.h"
#include "format/checkpoint/verify.h"
#include "format/metadata/compact_metadata.h"
#include "format/metadata/metadata.h"
#include "format/plan/save_plan.h"
#include "nlohmann/json.hpp"

namespace ckptd::cli {
namespace {

using json = nlohmann::ordered_json;

std::string Shape(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

int ReportOpenError(const std::string& dir, const absl::Status& s,
                    bool as_json) {
  const int rc = absl::IsNotFound(s) || absl::IsPermissionDenied(s)
                     ? kExitUnreadable
                     : kExitInvalid;
  if (as_json) {
    json j = {{"dir", dir}, {"ok", false}, {"error", std::string(s.message())}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::fprintf(stderr, "ckptctl: %s\n", std::string(s.message()).c_str());
  }
  return rc;
}

// Per-file totals of a checkpoint's storage entries.
struct FileTotal {
  size_t items = 0;
  uint64_t payload = 0;
};

// The files the storage entries name, by name, with their totals.
std::map<std::string, FileTotal> FileTotals(const format::CompactMetadata& md) {
  std::vector<FileTotal> by_path;  // by interned file name
  for (const auto& s : md.storage_entries()) {
    if (s.path >= by_path.size()) by_path.resize(s.path + 1);
    by_path[s.path].items++;
    by_path[s.path].payload += s.length;
  }
  std::map<std::string, FileTotal> files;  // by name
  for (uint32_t p = 0; p < by_path.size(); ++p) {
    if (by_path[p].items > 0) files[std::string(md.str(p))] = by_path[p];
  }
  return files;
}

// Writes one JSON value, compact, to stdout.
void PutJson(const json& j) { std::fputs(j.dump().c_str(), stdout); }

// The "tensors" array of `inspect --json`: one object per tensor with its
// chunks and where each is stored.
void PutTensorsJson(const format::CompactMetadata& md) {
  std::printf("[");
  bool first = true;
  for (size_t i = 0; i < md.num_items(); ++i) {
    const auto& it = md.item(i);
    if (!it.tensor) continue;
    json chunks = json::array();
    for (size_t j = 0; j < it.num_chunks; ++j) {
      const auto off = md.chunk_offsets(i, j), size = md.chunk_sizes(i, j);
      json cj = {{"offsets", std::vector<int64_t>(off.begin(), off.end())},
                 {"sizes", std::vector<int64_t>(size.begin(), size.end())}};
      if (const auto* info = md.chunk_storage(i, j)) {
        cj["file"] = std::string(md.relative_path(*info));
        cj["offset"] = info->offset;
        cj["length"] = info->length;
      }
      chunks.push_back(std::move(cj));
    }
    const auto shape = md.shape(i);
    std::printf("%s", first ? "" : ",");
    first = false;
    PutJson({{"fqn", std::string(md.fqn(i))},
             {"dtype", std::string(format::DTypeName(it.properties.dtype))},
             {"shape", std::vector<int64_t>(shape.begin(), shape.end())},
             {"chunks", std::move(chunks)}});
  }
  std::printf("]");
}

// The "bytes_items" array of `inspect --json`.
void PutBytesItemsJson(const format::CompactMetadata& md) {
  std::printf("[");
  bool first = true;
  for (size_t i = 0; i < md.num_items(); ++i) {
    if (md.item(i).tensor) continue;
    json bj = {{"fqn", std::string(md.fqn(i))}};
    if (const auto* info = md.bytes_storage(i)) {
      bj["file"] = std::string(md.relative_path(*info));
      bj["offset"] = info->offset;
      bj["length"] = info->length;
    }
    std::printf("%s", first ? "" : ",");
    first = false;
    PutJson(bj);
  }
  std::printf("]");
}

// `inspect --json`, written entry by entry: a checkpoint of millions of
// chunks never becomes one JSON tree.
void PrintInspectJson(const InspectArgs& args,
                      const format::CompactMetadata& md,
                      const std::map<std::string, FileTotal>& files,
                      uint64_t payload) {
  std::printf("{\"dir\":");
  PutJson(json(args.dir));
  std::printf(",\"version\":");
  PutJson(md.version() ? json(*md.version()) : json(nullptr));
  std::printf(",\"tensors\":");
  PutTensorsJson(md);
  std::printf(",\"bytes_items\":");
  PutBytesItemsJson(md);
  json fj = json::array();
  for (const auto& [name, f] : files) {
    auto size = Env::Default()->GetFileSize(JoinPath(args.dir, name));
    fj.push_back({{"name", name},
                  {"items", f.items},
                  {"payload_bytes", f.payload},
                  {"size", size.ok() ? json(*size) : json(nullptr)}});
  }
  std::printf(",\"files\":");
  PutJson(fj);
  std::printf(",\"planner_data\":");
  if (md.planner_data()) {
    json pd = json::object();
    for (const auto& [fqn, path] : *md.planner_data())
      pd[fqn] = client::PathToJson(path);
    PutJson(pd);
  } else {
    PutJson(json(nullptr));
  }
  std::printf(",\"payload_bytes\":%llu}\n",
              static_cast<unsigned long long>(payload));
}

// The "tensors:" section of `inspect`: a line per tensor, with --chunks a
// line per chunk under it.
void PrintTensorsText(const InspectArgs& args,
                      const format::CompactMetadata& md) {
  std::printf("tensors:\n");
  for (size_t i = 0; i < md.num_items(); ++i) {
    const auto& it = md.item(i);
    if (!it.tensor) continue;
    const auto shape = md.shape(i);
    std::printf("  %-48s %-9s %-18s %u chunk%s\n",
                std::string(md.fqn(i)).c_str(),
                std::string(format::DTypeName(it.properties.dtype)).c_str(),
                Shape({shape.begin(), shape.end()}).c_str(), it.num_chunks,
                it.num_chunks == 1 ? "" : "s");
    if (!args.chunks) continue;
    for (size_t j = 0; j < it.num_chunks; ++j) {
      const auto* info = md.chunk_storage(i, j);
      std::printf(
          "      %-30s %s\n",
          format::DescribeBox(md.chunk_offsets(i, j), md.chunk_sizes(i, j))
              .c_str(),
          info ? fmt::format("{} @ {} +{}", md.relative_path(*info),
                             info->offset, info->length)
                     .c_str()
               : "(no storage entry)");
    }
  }
}

// `inspect`: a summary line, then the tensors, bytes items (with their
// values, cut at 60 characters) and files.
void PrintInspectText(const InspectArgs& args, format::CheckpointReader& reader,
                      const std::map<std::string, FileTotal>& files,
                      uint64_t payload) {
  const format::CompactMetadata& md = reader.compact();
  const size_t n_tensors = md.num_tensors();
  const uint64_t n_chunks = md.num_chunks();
  std::printf(
      "checkpoint %s: %zu tensors (%llu chunks), %zu bytes items, %zu files, "
      "%s payload\n",
      args.dir.c_str(), n_tensors, static_cast<unsigned long long>(n_chunks),
      md.num_items() - n_tensors, files.size(), HumanBytes(payload).c_str());
  PrintTensorsText(args, md);
  std::printf("bytes items:\n");
  for (size_t i = 0; i < md.num_items(); ++i) {
    if (md.item(i).tensor) continue;
    const std::string fqn(md.fqn(i));
    std::string value;
    if (auto v = reader.ReadObject(fqn); v.ok()) {
      value = v->Repr();
      if (value.size() > 60) value = value.substr(0, 57) + "...";
    } else {
      value = "(not a plain Python value)";
    }
    std::printf("  %-48s %s\n", fqn.c_str(), value.c_str());
  }
  std::printf("files:\n");
  for (const auto& [name, f] : files) {
    std::printf("  %-24s %4zu items  %s\n", name.c_str(), f.items,
                HumanBytes(f.payload).c_str());
  }
}

}  // namespace

int Inspect(const InspectArgs& args) {
  auto reader = format::CheckpointReader::Open(args.dir);
  if (!reader.ok())
    return ReportOpenError(args.dir, reader.status(), args.json);
  const std::map<std::string, FileTotal> files =
      FileTotals((*reader)->compact());
  uint64_t payload = 0;
  for (const auto& [name, f] : files) payload += f.payload;
  if (args.json) {
    PrintInspectJson(args, (*reader)->compact(), files, payload);
  } else {
    PrintInspectText(args, **reader, files, payload);
  }
  return kExitOk;
}

int Verify(const VerifyArgs& args) {
  format::VerifyOptions opts;
  opts.check_crc = !args.no_crc;
  opts.allow_unsafe_globals = args.allow_unsafe_globals;
  auto report = format::VerifyCheckpoint(args.dir, opts);
  if (!report.ok())
    return ReportOpenError(args.dir, report.status(), args.json);
  if (args.json) {
    json j = {{"dir", args.dir},
              {"ok", report->ok()},
              {"problems", report->problems},
              {"notes", report->notes},
              {"tensors", report->tensors},
              {"chunks", report->chunks},
              {"bytes_items", report->bytes_items},
              {"files", report->files},
              {"payload_bytes", report->payload_bytes},
              {"crc_bytes", report->crc_bytes}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    for (const auto& n : report->notes) std::printf("note: %s\n", n.c_str());
    for (const auto& p : report->problems)
      std::fprintf(stderr, "error: %s\n", p.c_str());
    if (report->ok()) {
      std::printf(
          "OK %s: %zu tensors, %zu chunks, %zu bytes items, %zu files, %s "
          "checked%s\n",
          args.dir.c_str(), report->tensors, report->chunks,
          report->bytes_items, report->files,
          HumanBytes(report->payload_bytes).c_str(),
          args.no_crc ? " (structure only, no CRC)" : " (CRC-32 verified)");
    } else {
      std::fprintf(stderr, "INVALID %s: %zu problem%s\n", args.dir.c_str(),
                   report->problems.size(),
                   report->problems.size() == 1 ? "" : "s");
    }
  }
  return report->ok() ? kExitOk : kExitInvalid;
}

}  // namespace ckptd::cli
