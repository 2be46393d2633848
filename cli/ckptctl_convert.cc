// Copyright 2026 The ckptd Authors.
//
// ckptctl convert: the dcp_to_torch_save equivalent (--format torch_save,
// the default) and the Hugging Face safetensors export (--format
// safetensors); ckptctl import: torch_save_to_dcp.
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <string_view>

#include "cli/ckptctl.h"
#include "common/absl_fmt.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "format/convert/convert.h"
#include "format/convert/export_safetensors.h"
#include "format/convert/import_torch_save.h"

namespace ckptd::cli {
namespace {

// "5GB" → 5e9 (decimal units, as transformers' max_shard_size), "4GiB" →
// 4 << 30, "1000" bytes.
std::optional<uint64_t> ParseShardSize(std::string_view text) {
  double v = 0;
  const auto [end, ec] =
      std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || v <= 0) return std::nullopt;
  std::string unit(end, text.data() + text.size());
  for (char& c : unit) c = static_cast<char>(std::toupper(c));
  static const std::pair<std::string_view, double> kUnits[] = {
      {"", 1},
      {"B", 1},
      {"KB", 1e3},
      {"MB", 1e6},
      {"GB", 1e9},
      {"TB", 1e12},
      {"KIB", 1 << 10},
      {"MIB", 1 << 20},
      {"GIB", double(1u << 30)},
      {"TIB", 1099511627776.0}};
  for (const auto& [name, mult] : kUnits) {
    if (unit == name && v * mult >= 1 && v * mult < 1.8e19)
      return static_cast<uint64_t>(v * mult);
  }
  return std::nullopt;
}

std::optional<format::DType> ParseExportDType(std::string_view s) {
  if (s == "bf16" || s == "bfloat16") return format::DType::kBFloat16;
  if (s == "fp16" || s == "float16" || s == "half")
    return format::DType::kFloat16;
  if (s == "fp32" || s == "float32" || s == "float")
    return format::DType::kFloat32;
  if (s == "fp64" || s == "float64" || s == "double")
    return format::DType::kFloat64;
  return std::nullopt;
}

int ConvertError(const ConvertArgs& args, const absl::Status& s) {
  std::fprintf(stderr, "ckptctl: convert %s: %s\n", args.dir.c_str(),
               std::string(s.message()).c_str());
  if (absl::IsNotFound(s)) return kExitUnreadable;
  return kExitInvalid;
}

int ExportSafetensors(const ConvertArgs& args) {
  format::SafetensorsExportOptions opts;
  opts.overwrite = args.overwrite;
  opts.verify_crc = !args.no_verify_crc;
  opts.only = args.only;
  opts.strip = args.strip;
  if (!args.max_shard_size.empty()) {
    std::optional<uint64_t> n = ParseShardSize(args.max_shard_size);
    if (!n.has_value()) {
      std::fprintf(stderr,
                   "ckptctl: convert: --max-shard-size '%s' is not a size "
                   "(e.g. 5GB, 500MB, 2GiB)\n",
                   args.max_shard_size.c_str());
      return kExitUsage;
    }
    opts.max_shard_bytes = *n;
  }
  if (!args.dtype.empty()) {
    opts.dtype = ParseExportDType(args.dtype);
    if (!opts.dtype.has_value()) {
      std::fprintf(stderr,
                   "ckptctl: convert: --dtype '%s': use bf16, fp16, fp32 or "
                   "fp64\n",
                   args.dtype.c_str());
      return kExitUsage;
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto stats = format::ExportSafetensors(args.dir, args.out, opts);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  if (!stats.ok()) return ConvertError(args, stats.status());
  for (const std::string& s : stats->skipped)
    std::printf("skipped %s\n", s.c_str());
  std::printf("wrote %s: %zu tensors (%.1f MiB) in %zu file(s): %s; %.2f s\n",
              args.out.c_str(), stats->tensors, stats->tensor_bytes / 1048576.0,
              stats->files.size(),
              fmt::format("{}", fmt::join(stats->files, ", ")).c_str(), secs);
  return kExitOk;
}

}  // namespace

int Convert(const ConvertArgs& args) {
  if (args.format == "safetensors") return ExportSafetensors(args);
  if (args.format != "torch_save") {
    std::fprintf(
        stderr,
        "ckptctl: convert: --format '%s': use torch_save or safetensors\n",
        args.format.c_str());
    return kExitUsage;
  }
  if (!args.only.empty() || !args.strip.empty() || !args.dtype.empty() ||
      !args.max_shard_size.empty()) {
    std::fprintf(
        stderr,
        "ckptctl: convert: --only, --strip, --dtype and --max-shard-size "
        "apply to --format safetensors\n");
    return kExitUsage;
  }
  format::ConvertOptions opts;
  opts.overwrite = args.overwrite;
  opts.verify_crc = !args.no_verify_crc;
  opts.allow_unsafe_globals = args.allow_unsafe_globals;
  const auto t0 = std::chrono::steady_clock::now();
  auto stats = format::ConvertToTorchSave(args.dir, args.out, opts);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  if (!stats.ok()) return ConvertError(args, stats.status());
  std::printf("wrote %s: %zu tensors, %zu other values, %.1f MiB in %.2f s\n",
              args.out.c_str(), stats->tensors, stats->objects,
              stats->bytes_written / 1048576.0, secs);
  return kExitOk;
}

int Import(const ImportArgs& args) {
  format::ImportOptions opts;
  opts.overwrite = args.overwrite;
  opts.verify_crc = !args.no_verify_crc;
  const auto t0 = std::chrono::steady_clock::now();
  auto stats = format::ImportTorchSave(args.file, args.dir, opts);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  if (!stats.ok()) {
    std::fprintf(stderr, "ckptctl: import %s: %s\n", args.file.c_str(),
                 std::string(stats.status().message()).c_str());
    return absl::IsNotFound(stats.status()) ? kExitUnreadable : kExitInvalid;
  }
  std::printf(
      "wrote %s: %zu tensors (%.1f MiB), %zu other values, %.1f MiB in %.2f "
      "s\n",
      args.dir.c_str(), stats->tensors, stats->tensor_bytes / 1048576.0,
      stats->objects, stats->bytes_written / 1048576.0, secs);
  return kExitOk;
}

}  // namespace ckptd::cli
