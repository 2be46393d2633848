// Copyright 2026 The ckptd Authors.
//
// ckptctl: the operator CLI. Format commands (inspect, verify, convert) work
// on a checkpoint directory directly; daemon commands (list, status, cancel,
// wait: cli/ckptctl_daemon.cc) talk to a running ckptd.
#include "CLI/CLI.hpp"
#include "cli/ckptctl.h"

namespace ckptd::cli {
namespace {

// Adds `inspect DIR` to `app`, parsing into `args`.
CLI::App* AddInspectCommand(CLI::App& app, InspectArgs& args) {
  auto* ins = app.add_subcommand("inspect",
                                 "List tensors, chunks, bytes items and files");
  ins->add_option("DIR", args.dir, "checkpoint directory")->required();
  ins->add_flag("--json", args.json, "machine-readable output");
  ins->add_flag("--chunks", args.chunks,
                "list every chunk with its file and offset");
  return ins;
}

// Adds `verify DIR` to `app`, parsing into `args`.
CLI::App* AddVerifyCommand(CLI::App& app, VerifyArgs& args) {
  auto* ver = app.add_subcommand("verify",
                                 "Check .metadata, chunk coverage, payload "
                                 "structure, lengths and CRC-32s");
  ver->add_option("DIR", args.dir, "checkpoint directory")->required();
  ver->add_flag("--json", args.json, "machine-readable output");
  ver->add_flag("--no-crc", args.no_crc,
                "skip reading payload bytes for CRC-32 checks");
  ver->add_flag("--allow-unsafe-globals", args.allow_unsafe_globals,
                "report bytes items whose pickle references globals outside "
                "the allowlist "
                "as notes instead of errors");
  return ver;
}

// Adds `convert DIR OUT` to `app`, parsing into `args`.
CLI::App* AddConvertCommand(CLI::App& app, ConvertArgs& args) {
  auto* conv = app.add_subcommand("convert",
                                  "Write the whole state dict as one "
                                  "torch.save file (dcp_to_torch_save), or its "
                                  "tensors as a Hugging Face safetensors model "
                                  "directory (--format safetensors)");
  conv->add_option("DIR", args.dir, "checkpoint directory")->required();
  conv->add_option("OUT", args.out,
                   "output .pt file (torch_save) or directory (safetensors)")
      ->required();
  conv->add_flag(
      "--allow-unsafe-globals", args.allow_unsafe_globals,
      "torch_save: carry bytes items whose pickle references globals outside "
      "the allowlist into the output (refused by default)");
  conv->add_option(
      "--format", args.format,
      "torch_save (default) or safetensors: model.safetensors, or "
      "model-0000k-of-0000N.safetensors + model.safetensors.index.json");
  conv->add_option(
      "--max-shard-size", args.max_shard_size,
      "safetensors: largest shard, e.g. 5GB (default), 500MB, 2GiB");
  conv->add_option(
      "--dtype", args.dtype,
      "safetensors: write floating tensors as bf16, fp16, fp32 or fp64");
  conv->add_option(
      "--only", args.only,
      "safetensors: export only tensors whose name starts with this "
      "(repeatable), e.g. model.");
  conv->add_option(
      "--strip", args.strip,
      "safetensors: remove this prefix from tensor names, e.g. model.");
  conv->add_flag(
      "--overwrite", args.overwrite,
      "replace OUT (torch_save) or OUT's earlier export (safetensors)");
  conv->add_flag(
      "--no-verify-crc", args.no_verify_crc,
      "do not check payload CRC-32s (convert a damaged checkpoint as it is)");
  return conv;
}

// Adds `import FILE DIR` to `app`, parsing into `args`.
CLI::App* AddImportCommand(CLI::App& app, ImportArgs& args) {
  auto* imp = app.add_subcommand(
      "import",
      "Write a torch.save state dict as a DCP checkpoint stock dcp.load reads "
      "(torch_save_to_dcp)");
  imp->add_option("FILE", args.file, "torch.save file (.pt)")->required();
  imp->add_option("DIR", args.dir, "checkpoint directory to create")
      ->required();
  imp->add_flag("--overwrite", args.overwrite,
                "replace a checkpoint committed in DIR");
  imp->add_flag("--no-verify-crc", args.no_verify_crc,
                "do not check the CRC-32s of FILE's records");
  return imp;
}

// Adds `gc ROOT` to `app`, parsing into `args`.
CLI::App* AddGcCommand(CLI::App& app, GcArgs& args) {
  auto* gcc = app.add_subcommand(
      "gc",
      "Remove unfinished checkpoint directories no daemon is writing and, with "
      "--keep-last, committed checkpoints beyond the retention (never the "
      "newest)");
  gcc->add_option("ROOT", args.root,
                  "directory to clean (searched recursively)")
      ->required();
  gcc->add_option("--keep-last", args.keep_last,
                  "keep the newest N committed checkpoints of each directory "
                  "(by the step number ending their name, else by commit time)")
      ->check(CLI::Range(1, 1 << 20));
  gcc->add_option("--keep-every", args.keep_every,
                  "with --keep-last: also keep every checkpoint whose step is "
                  "a multiple of K")
      ->check(CLI::Range(1, 1 << 30));
  gcc->add_option(
      "--min-age", args.min_age,
      "remove an unfinished directory only when untouched this long (default "
      "1h; e.g. 30m, 2d)");
  gcc->add_flag("--dry-run", args.dry_run,
                "report what would be removed, remove nothing");
  gcc->add_flag("--json", args.daemon.json, "machine-readable output");
  gcc->add_option(
      "--socket", args.daemon.socket,
      "the daemon asked which checkpoints are in progress (default: "
      "$CKPTD_SOCKET, else /run/ckptd/ckptd.sock)");
  return gcc;
}

}  // namespace
}  // namespace ckptd::cli

int main(int argc, char** argv) {
  using namespace ckptd::cli;
  CLI::App app{
      "ckptctl: inspect, verify and convert PyTorch DCP checkpoints; control "
      "ckptd"};
  app.require_subcommand(1);
  app.footer(kExitCodeHelp);

  InspectArgs inspect;
  CLI::App* ins = AddInspectCommand(app, inspect);
  VerifyArgs verify;
  CLI::App* ver = AddVerifyCommand(app, verify);
  ConvertArgs convert;
  CLI::App* conv = AddConvertCommand(app, convert);
  ImportArgs import;
  CLI::App* imp = AddImportCommand(app, import);
  GcArgs gc;
  CLI::App* gcc = AddGcCommand(app, gc);
  // list, status, cancel, wait (cli/ckptctl_daemon.cc).
  const auto run_daemon_command = AddDaemonCommands(&app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 reports parse errors by exception; this is the only place they
    // are caught. Usage errors exit 2.
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kExitUsage;
  }
  if (*ins) return Inspect(inspect);
  if (*ver) return Verify(verify);
  if (*conv) return Convert(convert);
  if (*imp) return Import(import);
  if (*gcc) return Gc(gc);
  if (const int rc = run_daemon_command(); rc >= 0) return rc;
  return kExitUsage;
}
