// Copyright 2026 The ckptd Authors.
//
// ckptd_demo: a sample multi-rank save and resharded restore. N ranks hold
// an FSDP-style sharded model (row-sharded weights), replicated small
// parameters (deduplicated on save) and optimizer hyper-parameters (bytes
// items). With --socket, N trainer processes (forked) hand their state to a
// running ckptd through libckptd_client and go on as soon as it is staged;
// the demo then waits for the commit. Without it, the format library writes
// the checkpoint in-process. Either way the stock-compatible DCP directory is
// restored into a different number of ranks and compared byte for byte.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/ckptd_client.h"
#include "fmt/format.h"
#include "format/checkpoint/checkpoint_reader.h"
#include "format/checkpoint/checkpoint_writer.h"
#include "format/pickle/py_value.h"

namespace ckptd::format {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct Param {
  std::string fqn;
  std::vector<int64_t> shape;
  bool sharded;
  std::string data;  // full tensor, C order, float32
};

// One trainer process: saves rank r's items through the daemon and exits
// once they are staged (the daemon finishes the checkpoint on its own).
int SaveThroughDaemon(const std::string& socket, const std::string& dir, int r,
                      int world, const std::vector<WriteItem>& items,
                      bool overwrite) {
  std::vector<client::SaveItem> out;
  for (const WriteItem& it : items) {
    client::SaveItem s;
    s.fqn = it.desc.fqn;
    s.is_bytes = it.desc.type == ItemDesc::Type::kBytes;
    s.dtype = std::string(DTypeName(it.desc.dtype));
    s.global_shape = it.desc.global_shape;
    s.chunk_offsets = it.desc.chunk_offsets;
    s.chunk_sizes = it.desc.chunk_sizes;
    for (const PathElement& e : it.desc.path) s.path.push_back(e);
    s.data = it.tensor.data;
    s.bytes = it.bytes;
    out.push_back(std::move(s));
  }
  client::ClientOptions co;
  co.socket_path = socket;
  co.owner = fmt::format("ckptd_demo rank {}", r);
  auto c = client::Client::Connect(co);
  if (!c.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", r, c.status().ToString().c_str());
    return 1;
  }
  client::SaveOptions so;
  so.overwrite = overwrite;
  client::SaveStats stats;
  auto id = (*c)->Save(dir, "", r, world, out, so, &stats);
  if (!id.ok()) {
    std::fprintf(stderr, "rank %d: save failed: %s\n", r,
                 id.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "  rank %d: %.1f MiB staged, trainer stall %.1f ms (copy %.1f ms; a "
      "first save also creates the arena)\n",
      r, stats.bytes / 1048576.0, stats.total_seconds * 1e3,
      stats.copy_seconds * 1e3);
  std::fflush(stdout);
  return 0;
}

// What one run does (the flags).
struct DemoOptions {
  std::string dir = "demo_ckpt/step_1000";
  int save_ranks = 4;
  int load_ranks = 3;
  int size_mb = 512;
  bool overwrite = false;
  std::string socket;  // empty: the format library writes in-process
  double wait_timeout_s = 600;
};

// The state the ranks save: the model's parameters (full tensors) and the
// optimizer's bytes items. The ranks' WriteItems point into it.
struct Model {
  std::vector<Param> params;
  // Optimizer hyper-parameters: key, torch.save payload.
  std::vector<std::pair<std::string, std::string>> optim;
  std::string step;    // torch.save payload of the step number
  uint64_t total = 0;  // bytes of all parameters
};

// Weights of [rows, 1024] float32 summing to ~size_mb, sharded on dim 0;
// biases and norms replicated; values from a fixed seed.
Model MakeModel(int save_ranks, int size_mb) {
  Model m;
  const int64_t cols = 1024;
  const int n_layers = 8;
  const int64_t rows = std::max<int64_t>(
      save_ranks, (int64_t{size_mb} << 20) / (4 * cols * n_layers) /
                      save_ranks * save_ranks);
  std::mt19937 rng(1234);
  for (int l = 0; l < n_layers; ++l) {
    m.params.push_back(
        {fmt::format("model.layers.{}.weight", l), {rows, cols}, true, {}});
    m.params.push_back(
        {fmt::format("model.layers.{}.bias", l), {cols}, false, {}});
    m.params.push_back(
        {fmt::format("model.layers.{}.norm.scale", l), {}, false, {}});
  }
  for (Param& p : m.params) {
    int64_t n = 1;
    for (int64_t s : p.shape) n *= s;
    p.data.resize(n * 4);
    auto* f = reinterpret_cast<float*>(p.data.data());
    for (int64_t i = 0; i < n; ++i)
      f[i] = static_cast<float>(rng() % 100000) / 997.0f;
    m.total += p.data.size();
  }
  // Optimizer hyper-parameters as DCP flattens {"optim": {"param_groups":
  // [{...}]}}: a list holding a dict is descended, so every key is its own
  // leaf ("optim.param_groups.0.lr"); tuples stay leaves (§4.1).
  m.optim = {{"lr", EncodeTorchSaveObject(PyValue::Float(3e-4))},
             {"betas", EncodeTorchSaveObject(PyValue::Tuple(
                           {PyValue::Float(0.9), PyValue::Float(0.95)}))},
             {"weight_decay", EncodeTorchSaveObject(PyValue::Float(0.1))}};
  m.step = EncodeTorchSaveObject(PyValue::Int(1000));
  return m;
}

// Rank r's items: its row shard of each weight, the replicated parameters
// and the bytes items, pointing into `m`.
std::vector<WriteItem> RankItems(const Model& m, int r, int save_ranks) {
  std::vector<WriteItem> items;
  for (const Param& p : m.params) {
    WriteItem it;
    it.desc.fqn = p.fqn;
    it.desc.dtype = DType::kFloat32;
    it.desc.global_shape = p.shape;
    it.desc.chunk_offsets.assign(p.shape.size(), 0);
    it.desc.chunk_sizes = p.shape;
    // {"model": model.state_dict()} flattens to "model." + name with the
    // path ("model", name) — what planner_data records (§4.1).
    it.desc.path = {std::string("model"), p.fqn.substr(6)};
    const char* data = p.data.data();
    if (p.sharded) {
      const int64_t per = p.shape[0] / save_ranks;
      it.desc.chunk_offsets[0] = r * per;
      it.desc.chunk_sizes[0] = per;
      data += r * per * p.shape[1] * 4;
    }
    it.tensor = {DType::kFloat32, it.desc.chunk_sizes, {}, data};
    items.push_back(std::move(it));
  }
  for (const auto& [key, payload] : m.optim) {
    WriteItem o;
    o.desc.fqn = "optim.param_groups.0." + key;
    o.desc.type = ItemDesc::Type::kBytes;
    o.desc.path = {std::string("optim"), std::string("param_groups"),
                   int64_t{0}, key};
    o.bytes = payload;
    items.push_back(o);
  }
  WriteItem s;
  s.desc.fqn = "step";
  s.desc.type = ItemDesc::Type::kBytes;
  s.bytes = m.step;
  items.push_back(s);
  return items;
}

// Forks one trainer process per rank, each saving its items through the
// daemon, and waits for them all to exit. False if one failed.
bool ForkTrainers(const DemoOptions& o,
                  const std::vector<std::vector<WriteItem>>& ranks) {
  std::vector<pid_t> children;
  for (int r = 0; r < o.save_ranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0)
      _exit(SaveThroughDaemon(o.socket, o.dir, r, o.save_ranks, ranks[r],
                              o.overwrite));
    children.push_back(pid);
  }
  bool failed = false;
  for (pid_t pid : children) {
    int st = 0;
    waitpid(pid, &st, 0);
    failed |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  }
  return !failed;
}

// Saves through the daemon at o.socket and waits up to o.wait_timeout_s for
// the commit. Returns the committed directory, or nothing (error printed).
std::optional<std::string> SaveThroughDaemonAndWait(
    const DemoOptions& o, const Model& m,
    const std::vector<std::vector<WriteItem>>& ranks) {
  std::printf(
      "ckptd_demo: %d trainer processes save %.1f MiB of state through ckptd "
      "at %s\n",
      o.save_ranks, m.total / 1048576.0, o.socket.c_str());
  std::fflush(stdout);
  const auto t0 = Clock::now();
  const bool staged = ForkTrainers(o, ranks);
  const auto t1 = Clock::now();
  if (!staged) return std::nullopt;
  std::printf(
      "  all ranks staged after %.3f s (the trainers could resume here)\n",
      Seconds(t0, t1));
  client::ClientOptions co;
  co.socket_path = o.socket;
  auto c = client::Client::Connect(co);
  if (!c.ok()) {
    std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
    return std::nullopt;
  }
  auto info = (*c)->Wait(o.dir, absl::Seconds(o.wait_timeout_s));
  const auto t2 = Clock::now();
  if (!info.ok() && absl::IsDeadlineExceeded(info.status())) {
    std::fprintf(stderr,
                 "checkpoint %s not final within %gs of all ranks staged "
                 "(--wait-timeout): %s\n",
                 o.dir.c_str(), o.wait_timeout_s,
                 std::string(info.status().message()).c_str());
    return std::nullopt;
  }
  if (!info.ok() || info->state != "COMMITTED") {
    std::fprintf(stderr, "checkpoint not committed: %s\n",
                 info.ok() ? (info->state + ": " + info->error).c_str()
                           : info.status().ToString().c_str());
    return std::nullopt;
  }
  std::printf(
      "  committed %s: durable %.3f s after the first request, %.2f GB/s "
      "(%u files, %.1f MiB)\n",
      info->checkpoint_id.c_str(), Seconds(t0, t2),
      info->file_bytes / Seconds(t0, t2) / 1e9, info->files,
      info->file_bytes / 1048576.0);
  return info->checkpoint_id;
}

// Writes the checkpoint in-process with the format library. False if that
// failed (error printed).
bool SaveInProcess(const DemoOptions& o, const Model& m,
                   const std::vector<std::vector<WriteItem>>& ranks) {
  std::printf("ckptd_demo: saving %.1f MiB of state from %d ranks to %s\n",
              m.total / 1048576.0, o.save_ranks, o.dir.c_str());
  CheckpointWriterOptions wopts;
  wopts.overwrite = o.overwrite;
  const auto t0 = Clock::now();
  auto written = WriteCheckpoint(o.dir, ranks, wopts);
  const auto t1 = Clock::now();
  if (!written.ok()) {
    std::fprintf(stderr, "save failed: %s\n",
                 std::string(written.status().message()).c_str());
    return false;
  }
  std::printf(
      "  durable save: %.3f s, %.2f GB/s (%zu files, %.1f MiB data, "
      ".metadata %llu bytes)\n",
      Seconds(t0, t1), written->data_bytes / Seconds(t0, t1) / 1e9,
      written->files, written->data_bytes / 1048576.0,
      static_cast<unsigned long long>(written->metadata_bytes));
  return true;
}

// Restores rank r of `load_ranks` (its row shard of each weight, resharded)
// and compares it with the model byte for byte; rank 0 also prints the
// optimizer's values. Adds the bytes read to `restored`. False on a failure
// or a mismatch (error printed).
bool RestoreRank(CheckpointReader& reader, const Model& m, int r,
                 int load_ranks, uint64_t& restored) {
  std::vector<std::string> bufs;
  std::vector<TensorRequest> reqs;
  bufs.reserve(m.params.size());
  for (const Param& p : m.params) {
    std::vector<int64_t> off(p.shape.size(), 0), size = p.shape;
    if (p.sharded) {
      const int64_t per = (p.shape[0] + load_ranks - 1) / load_ranks;
      off[0] = std::min<int64_t>(p.shape[0], r * per);
      size[0] = std::min<int64_t>(p.shape[0], off[0] + per) - off[0];
    }
    int64_t n = 1;
    for (int64_t s : size) n *= s;
    bufs.emplace_back(n * 4, '\0');
    reqs.push_back(
        {p.fqn, off, {DType::kFloat32, size, {}, bufs.back().data()}});
  }
  if (absl::Status s = reader.ReadTensors(reqs); !s.ok()) {
    std::fprintf(stderr, "restore failed: %s\n",
                 std::string(s.message()).c_str());
    return false;
  }
  for (size_t k = 0; k < m.params.size(); ++k) {
    const Param& p = m.params[k];
    size_t byte_off = 0;
    if (p.sharded) byte_off = reqs[k].offsets[0] * p.shape[1] * 4;
    if (std::memcmp(bufs[k].data(), p.data.data() + byte_off, bufs[k].size()) !=
        0) {
      std::fprintf(stderr, "restore mismatch in %s on rank %d\n", p.fqn.c_str(),
                   r);
      return false;
    }
    restored += bufs[k].size();
  }
  for (const auto& [key, payload] : m.optim) {
    auto o = reader.ReadObject("optim.param_groups.0." + key);
    if (!o.ok()) {
      std::fprintf(stderr, "restore failed: %s\n",
                   std::string(o.status().message()).c_str());
      return false;
    }
    if (r == 0)
      std::printf("  optim.param_groups.0.%s = %s\n", key.c_str(),
                  o->Repr().c_str());
  }
  return true;
}

// Restores `ckpt_dir` into o.load_ranks ranks (resharded) and compares.
int RestoreAndCompare(const DemoOptions& o, const Model& m,
                      const std::string& ckpt_dir) {
  const auto t2 = Clock::now();
  auto reader = CheckpointReader::Open(ckpt_dir);
  if (!reader.ok()) {
    std::fprintf(stderr, "open failed: %s\n",
                 std::string(reader.status().message()).c_str());
    return 1;
  }
  uint64_t restored = 0;
  for (int r = 0; r < o.load_ranks; ++r) {
    if (!RestoreRank(**reader, m, r, o.load_ranks, restored)) return 1;
  }
  const auto t3 = Clock::now();
  std::printf(
      "  restore into %d ranks (resharded): %.3f s, %.2f GB/s, byte-exact\n",
      o.load_ranks, Seconds(t2, t3), restored / Seconds(t2, t3) / 1e9);
  return 0;
}

// The demo: make the state, save it (through the daemon or in-process),
// restore it resharded and compare. 0 if every byte came back.
int Run(const DemoOptions& o) {
  const Model model = MakeModel(o.save_ranks, o.size_mb);
  std::vector<std::vector<WriteItem>> ranks(o.save_ranks);
  for (int r = 0; r < o.save_ranks; ++r) {
    ranks[r] = RankItems(model, r, o.save_ranks);
  }
  std::string ckpt_dir = o.dir;
  if (!o.socket.empty()) {
    std::optional<std::string> committed =
        SaveThroughDaemonAndWait(o, model, ranks);
    if (!committed.has_value()) return 1;
    ckpt_dir = *std::move(committed);
  } else if (!SaveInProcess(o, model, ranks)) {
    return 1;
  }
  return RestoreAndCompare(o, model, ckpt_dir);
}

}  // namespace
}  // namespace ckptd::format

int main(int argc, char** argv) {
  CLI::App app{"ckptd_demo: sample multi-rank DCP save and resharded restore"};
  ckptd::format::DemoOptions o;
  app.add_option("--dir", o.dir,
                 "checkpoint directory to write (with --socket: absolute, or "
                 "relative to the "
                 "daemon's first checkpoint root)");
  app.add_option("--socket", o.socket,
                 "save through the ckptd daemon on this Unix socket");
  app.add_option("--save-ranks", o.save_ranks, "ranks that save")
      ->check(CLI::Range(1, 1024));
  app.add_option("--load-ranks", o.load_ranks, "ranks that restore")
      ->check(CLI::Range(1, 1024));
  app.add_option("--size-mb", o.size_mb, "approximate state size in MiB")
      ->check(CLI::Range(1, 65536));
  app.add_flag("--overwrite", o.overwrite,
               "replace an existing checkpoint in --dir");
  app.add_option("--wait-timeout", o.wait_timeout_s,
                 "with --socket: seconds to wait for the commit after all "
                 "ranks are staged (default 600)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  return ckptd::format::Run(o);
}
