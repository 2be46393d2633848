// Copyright 2026 The ckptd Authors.
#include "format/tensor/tensor_record_writer.h"

#include <utility>

#include "common/status_macros.h"

namespace ckptd::format {
namespace {

constexpr std::string_view kPickleRecord = "data.pkl";
constexpr std::string_view kByteorderRecord = "byteorder";
constexpr std::string_view kByteorder = "little";
constexpr std::string_view kVersionRecord = "version";
constexpr std::string_view kVersion = "3\n";

std::string StorageRecord(std::string_view key) {
  return "data/" + std::string(key);
}

}  // namespace

absl::Status TorchSaveStream::Begin(std::string_view pickle) {
  RETURN_IF_ERROR(zip_.AddRecord(kPickleRecord, pickle));
  return zip_.AddRecord(kByteorderRecord, kByteorder);
}

absl::Status TorchSaveStream::BeginStorage(std::string_view key,
                                           uint64_t size) {
  return zip_.BeginRecord(StorageRecord(key), size);
}

absl::Status TorchSaveStream::Finish() {
  RETURN_IF_ERROR(zip_.AddRecord(kVersionRecord, kVersion));
  return zip_.Finish();
}

void BeginTorchSaveRecords(ZipArchiveBuilder* builder, std::string pickle) {
  builder->AddOwnedRecord(kPickleRecord, std::move(pickle));
  builder->AddOwnedRecord(kByteorderRecord, std::string(kByteorder));
}

void AddTorchSaveStorage(ZipArchiveBuilder* builder, std::string_view key,
                         absl::Span<const std::string_view> pieces) {
  builder->AddRecord(StorageRecord(key), pieces);
}

void FinishTorchSaveRecords(ZipArchiveBuilder* builder) {
  builder->AddOwnedRecord(kVersionRecord, std::string(kVersion));
}

}  // namespace ckptd::format
