// Copyright 2026 The ckptd Authors.

#include "daemon/commit/state_record.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/absl_fmt.h"
#include "common/checksummed_record.h"
#include "common/crc32.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace ckptd::daemon {
namespace {

std::string Wrap(const nlohmann::json& body) {
  return WrapChecksummed(body.dump());
}

// The body of a v1 record, checked; nullopt: not a v1 record (legacy).
absl::StatusOr<std::optional<nlohmann::json>> Unwrap(std::string_view text,
                                                     std::string_view what) {
  absl::StatusOr<std::optional<std::string_view>> body =
      UnwrapChecksummed(text, what);
  if (!body.ok()) return body.status();
  if (!body->has_value()) return std::optional<nlohmann::json>();
  nlohmann::json j =
      nlohmann::json::parse(**body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::DataLossError(
        fmt::format("{}: body is not a JSON object", what));
  }
  return std::optional<nlohmann::json>(std::move(j));
}

absl::StatusOr<std::string> Str(const nlohmann::json& j, const char* key,
                                std::string_view what) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) {
    return absl::DataLossError(
        fmt::format("{}: field '{}' missing or not a string", what, key));
  }
  return it->get<std::string>();
}

int64_t Uid(const nlohmann::json& j) {
  auto it = j.find("uid");
  if (it == j.end() || !it->is_number_integer()) return kUnknownUid;
  const int64_t v = it->get<int64_t>();
  return v >= 0 && v <= 0xffffffffLL ? v : kUnknownUid;
}

}  // namespace

std::string EncodeJournal(const JournalRecord& r) {
  nlohmann::json j = {{"dir", r.dir}, {"job", r.job}, {"uid", r.uid}};
  if (r.ranks) j["ranks"] = *r.ranks;
  if (r.deleting) j["deleting"] = true;
  if (r.started_ms != 0) j["started_ms"] = r.started_ms;
  if (r.settle_ms != 0) j["settle_ms"] = r.settle_ms;
  return Wrap(j);
}

std::string EncodeHistory(const HistoryRecord& r) {
  nlohmann::json j = {{"job", r.job}, {"uid", r.uid}, {"dirs", r.dirs}};
  if (!r.started_ms.empty()) j["started_ms"] = r.started_ms;
  return Wrap(j);
}

absl::StatusOr<JournalRecord> DecodeJournal(std::string_view text,
                                            std::string_view what) {
  absl::StatusOr<std::optional<nlohmann::json>> body = Unwrap(text, what);
  if (!body.ok()) return body.status();
  JournalRecord r;
  if (!body->has_value()) {
    // Legacy: "dir\njob\n[ranks r r ...\n]".
    std::vector<std::string> lines = absl::StrSplit(
        absl::string_view(text.data(), text.size()), '\n', absl::SkipEmpty());
    if (lines.empty())
      return absl::DataLossError(fmt::format("{}: empty", what));
    r.dir = lines[0];
    if (lines.size() > 1) r.job = lines[1];
    if (lines.size() > 2 && lines[2].starts_with("ranks ")) {
      r.ranks.emplace();
      for (absl::string_view v :
           absl::StrSplit(lines[2].substr(6), ' ', absl::SkipEmpty())) {
        int rank = 0;
        if (!absl::SimpleAtoi(v, &rank)) {
          return absl::DataLossError(
              fmt::format("{}: bad rank '{}'", what, std::string(v)));
        }
        r.ranks->push_back(rank);
      }
    }
    if (lines.size() > 3) {
      return absl::DataLossError(
          fmt::format("{}: {} lines in a legacy journal entry (at most 3)",
                      what, lines.size()));
    }
    return r;
  }
  const nlohmann::json& j = **body;
  ASSIGN_OR_RETURN(r.dir, Str(j, "dir", what));
  ASSIGN_OR_RETURN(r.job, Str(j, "job", what));
  r.uid = Uid(j);
  if (auto it = j.find("deleting"); it != j.end())
    r.deleting = it->is_boolean() && it->get<bool>();
  if (auto it = j.find("started_ms");
      it != j.end() && it->is_number_integer()) {
    r.started_ms = it->get<int64_t>();
  }
  if (auto it = j.find("settle_ms");
      it != j.end() && it->is_number_integer() && it->get<int64_t>() > 0) {
    r.settle_ms = it->get<int64_t>();
  }
  if (auto it = j.find("ranks"); it != j.end()) {
    if (!it->is_array())
      return absl::DataLossError(fmt::format("{}: 'ranks' not a list", what));
    r.ranks.emplace();
    for (const auto& v : *it) {
      if (!v.is_number_integer()) {
        return absl::DataLossError(
            fmt::format("{}: 'ranks' holds a non-integer", what));
      }
      r.ranks->push_back(v.get<int>());
    }
  }
  return r;
}

absl::StatusOr<HistoryRecord> DecodeHistory(std::string_view text,
                                            std::string_view what) {
  absl::StatusOr<std::optional<nlohmann::json>> body = Unwrap(text, what);
  if (!body.ok()) return body.status();
  HistoryRecord r;
  if (!body->has_value()) {
    // Legacy: "job\ndir\ndir\n..." (no owner: never pruned automatically).
    std::vector<std::string> lines = absl::StrSplit(
        absl::string_view(text.data(), text.size()), '\n', absl::SkipEmpty());
    if (lines.empty())
      return absl::DataLossError(fmt::format("{}: empty", what));
    r.job = lines[0];
    r.dirs.assign(lines.begin() + 1, lines.end());
    return r;
  }
  const nlohmann::json& j = **body;
  ASSIGN_OR_RETURN(r.job, Str(j, "job", what));
  r.uid = Uid(j);
  auto it = j.find("dirs");
  if (it == j.end() || !it->is_array()) {
    return absl::DataLossError(
        fmt::format("{}: 'dirs' missing or not a list", what));
  }
  for (const auto& v : *it) {
    if (!v.is_string())
      return absl::DataLossError(
          fmt::format("{}: 'dirs' holds a non-string", what));
    r.dirs.push_back(v.get<std::string>());
  }
  // Optional (earlier versions: none): when each save started.
  if (auto st = j.find("started_ms"); st != j.end()) {
    if (!st->is_array() || st->size() != r.dirs.size()) {
      return absl::DataLossError(fmt::format(
          "{}: 'started_ms' is not a list parallel to 'dirs'", what));
    }
    for (const auto& v : *st) {
      if (!v.is_number_integer()) {
        return absl::DataLossError(
            fmt::format("{}: 'started_ms' holds a non-integer", what));
      }
      r.started_ms.push_back(v.get<int64_t>());
    }
  }
  return r;
}

}  // namespace ckptd::daemon
