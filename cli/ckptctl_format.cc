// Copyright 2026 The ckptd Authors.
//
// ckptctl inspect / verify.
#include <cstdio>
#include <map>

#include "cli/ckptctl.h"
#include "common/absl_fmt.h"
#include "common/env.h"
#include "fmt/format.h"
#include "format/checkpoint_reader.h"
#include "format/metadata.h"
#include "format/save_plan.h"
#include "format/verify.h"
#include "nlohmann/json.hpp"

namespace ckptd::cli {
namespace {

using format::BytesStorageMetadata;
using format::Metadata;
using format::StorageKey;
using format::TensorStorageMetadata;
using json = nlohmann::ordered_json;

std::string HumanBytes(uint64_t n) {
  if (n < 1024) return fmt::format("{} B", n);
  if (n < (1 << 20)) return fmt::format("{:.1f} KiB", n / 1024.0);
  if (n < (1ull << 30)) return fmt::format("{:.1f} MiB", n / 1048576.0);
  return fmt::format("{:.2f} GiB", n / 1073741824.0);
}

std::string Shape(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

int ReportOpenError(const std::string& dir, const absl::Status& s, bool as_json) {
  const int rc = absl::IsNotFound(s) || absl::IsPermissionDenied(s) ? kExitUnreadable : kExitInvalid;
  if (as_json) {
    json j = {{"dir", dir}, {"ok", false}, {"error", std::string(s.message())}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::fprintf(stderr, "ckptctl: %s\n", std::string(s.message()).c_str());
  }
  return rc;
}

json PathJson(const std::vector<format::PathElement>& path) {
  json p = json::array();
  for (const auto& e : path) {
    if (const auto* s = std::get_if<std::string>(&e)) {
      p.push_back(*s);
    } else {
      p.push_back(std::get<int64_t>(e));
    }
  }
  return p;
}

}  // namespace

int Inspect(const InspectArgs& args) {
  auto reader = format::CheckpointReader::Open(args.dir);
  if (!reader.ok()) return ReportOpenError(args.dir, reader.status(), args.json);
  const Metadata& md = (*reader)->metadata();

  // Per-file totals.
  std::map<std::string, std::pair<size_t, uint64_t>> files;  // items, payload bytes
  for (const auto& [key, info] : md.storage_data) {
    auto& f = files[info.relative_path];
    f.first++;
    f.second += info.length;
  }
  uint64_t payload = 0;
  for (const auto& [name, f] : files) payload += f.second;

  if (args.json) {
    json j;
    j["dir"] = args.dir;
    j["version"] = md.version ? json(*md.version) : json(nullptr);
    json tensors = json::array(), bytes_items = json::array();
    for (const auto& [fqn, entry] : md.state_dict_metadata) {
      if (const auto* t = std::get_if<TensorStorageMetadata>(&entry)) {
        json chunks = json::array();
        for (const auto& c : t->chunks) {
          json cj = {{"offsets", c.offsets}, {"sizes", c.sizes}};
          if (const auto* info = md.FindStorage(StorageKey{fqn, true, c.offsets})) {
            cj["file"] = info->relative_path;
            cj["offset"] = info->offset;
            cj["length"] = info->length;
          }
          chunks.push_back(std::move(cj));
        }
        tensors.push_back({{"fqn", fqn},
                           {"dtype", std::string(format::DTypeName(t->properties.dtype))},
                           {"shape", t->size},
                           {"chunks", std::move(chunks)}});
      } else {
        json bj = {{"fqn", fqn}};
        if (const auto* info = md.FindStorage(StorageKey{fqn, false, {}})) {
          bj["file"] = info->relative_path;
          bj["offset"] = info->offset;
          bj["length"] = info->length;
        }
        bytes_items.push_back(std::move(bj));
      }
    }
    j["tensors"] = std::move(tensors);
    j["bytes_items"] = std::move(bytes_items);
    json fj = json::array();
    for (const auto& [name, f] : files) {
      auto size = Env::Default()->GetFileSize(JoinPath(args.dir, name));
      fj.push_back({{"name", name},
                    {"items", f.first},
                    {"payload_bytes", f.second},
                    {"size", size.ok() ? json(*size) : json(nullptr)}});
    }
    j["files"] = std::move(fj);
    if (md.planner_data) {
      json pd = json::object();
      for (const auto& [fqn, path] : *md.planner_data) pd[fqn] = PathJson(path);
      j["planner_data"] = std::move(pd);
    } else {
      j["planner_data"] = nullptr;
    }
    j["payload_bytes"] = payload;
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }

  size_t n_tensors = 0, n_chunks = 0;
  for (const auto& [fqn, entry] : md.state_dict_metadata) {
    if (const auto* t = std::get_if<TensorStorageMetadata>(&entry)) {
      n_tensors++;
      n_chunks += t->chunks.size();
    }
  }
  std::printf("checkpoint %s: %zu tensors (%zu chunks), %zu bytes items, %zu files, %s payload\n",
              args.dir.c_str(), n_tensors, n_chunks, md.state_dict_metadata.size() - n_tensors,
              files.size(), HumanBytes(payload).c_str());
  std::printf("tensors:\n");
  for (const auto& [fqn, entry] : md.state_dict_metadata) {
    const auto* t = std::get_if<TensorStorageMetadata>(&entry);
    if (t == nullptr) continue;
    std::printf("  %-48s %-9s %-18s %zu chunk%s\n", fqn.c_str(),
                std::string(format::DTypeName(t->properties.dtype)).c_str(), Shape(t->size).c_str(),
                t->chunks.size(), t->chunks.size() == 1 ? "" : "s");
    if (args.chunks) {
      for (const auto& c : t->chunks) {
        const auto* info = md.FindStorage(StorageKey{fqn, true, c.offsets});
        std::printf("      %-30s %s\n", format::DescribeBox(c.offsets, c.sizes).c_str(),
                    info ? fmt::format("{} @ {} +{}", info->relative_path, info->offset, info->length).c_str()
                         : "(no storage entry)");
      }
    }
  }
  std::printf("bytes items:\n");
  for (const auto& [fqn, entry] : md.state_dict_metadata) {
    if (!std::holds_alternative<BytesStorageMetadata>(entry)) continue;
    std::string value;
    if (auto v = (*reader)->ReadObject(fqn); v.ok()) {
      value = v->Repr();
      if (value.size() > 60) value = value.substr(0, 57) + "...";
    } else {
      value = "(not a plain Python value)";
    }
    std::printf("  %-48s %s\n", fqn.c_str(), value.c_str());
  }
  std::printf("files:\n");
  for (const auto& [name, f] : files) {
    std::printf("  %-24s %4zu items  %s\n", name.c_str(), f.first, HumanBytes(f.second).c_str());
  }
  return kExitOk;
}

int Verify(const VerifyArgs& args) {
  format::VerifyOptions opts;
  opts.check_crc = !args.no_crc;
  opts.allow_unsafe_globals = args.allow_unsafe_globals;
  auto report = format::VerifyCheckpoint(args.dir, opts);
  if (!report.ok()) return ReportOpenError(args.dir, report.status(), args.json);
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
    for (const auto& p : report->problems) std::fprintf(stderr, "error: %s\n", p.c_str());
    if (report->ok()) {
      std::printf("OK %s: %zu tensors, %zu chunks, %zu bytes items, %zu files, %s checked%s\n",
                  args.dir.c_str(), report->tensors, report->chunks, report->bytes_items,
                  report->files, HumanBytes(report->payload_bytes).c_str(),
                  args.no_crc ? " (structure only, no CRC)" : " (CRC-32 verified)");
    } else {
      std::fprintf(stderr, "INVALID %s: %zu problem%s\n", args.dir.c_str(),
                   report->problems.size(), report->problems.size() == 1 ? "" : "s");
    }
  }
  return report->ok() ? kExitOk : kExitInvalid;
}

}  // namespace ckptd::cli
