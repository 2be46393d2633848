// Copyright 2026 The ckptd Authors.
//
// ckptctl convert: the dcp_to_torch_save equivalent.
#include <chrono>
#include <cstdio>

#include "cli/ckptctl.h"
#include "common/absl_fmt.h"
#include "format/convert.h"

namespace ckptd::cli {

int Convert(const ConvertArgs& args) {
  format::ConvertOptions opts;
  opts.overwrite = args.overwrite;
  opts.verify_crc = !args.no_verify_crc;
  const auto t0 = std::chrono::steady_clock::now();
  auto stats = format::ConvertToTorchSave(args.dir, args.out, opts);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!stats.ok()) {
    std::fprintf(stderr, "ckptctl: convert %s: %s\n", args.dir.c_str(),
                 std::string(stats.status().message()).c_str());
    return absl::IsNotFound(stats.status()) ? kExitUnreadable : kExitInvalid;
  }
  std::printf("wrote %s: %zu tensors, %zu other values, %.1f MiB in %.2f s\n", args.out.c_str(),
              stats->tensors, stats->objects, stats->bytes_written / 1048576.0, secs);
  return kExitOk;
}

}  // namespace ckptd::cli
