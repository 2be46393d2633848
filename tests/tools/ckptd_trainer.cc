// Copyright 2026 The ckptd Authors.
//
// ckptd_trainer: one trainer rank for end-to-end tests, the main job and
// benchmarks. It builds a deterministic synthetic state dict for
// (rank, world_size), saves it through libckptd_client and optionally waits
// for the commit, printing one JSON line with its timings.
//
// The synthetic state (values by the formula of tests/interop/sample_spec.py:
// element i of a tensor with seed s holds (i * 31 + s) % 251):
//   layers.{k}.weight  float32 [rows, 256], rows split over the ranks along
//                      dim 0 (torch.chunk), seed k        (sharded)
//   embed              float32 [64, 64], every rank, seed 1000  (replicated)
//   step               bytes: torch.save(int 7), every rank     (replicated)
//   rank_state.{r}     bytes: torch.save({"rank": r, "name": "rank r"}),
//                      rank r only
// `--mb` sets the rows so that the sharded tensors hold about mb MiB per
// rank.
#include <cstdio>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/time/clock.h"
#include "client/ckptd_client.h"
#include "format/py_value.h"
#include "nlohmann/json.hpp"

namespace {

using ckptd::client::SaveItem;

std::vector<std::pair<int64_t, int64_t>> ChunkSplit(int64_t n, int parts) {
  const int64_t per = (n + parts - 1) / parts;
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int p = 0; p < parts; ++p) {
    const int64_t off = std::min(n, p * per);
    out.emplace_back(off, std::min(n, off + per) - off);
  }
  return out;
}

// Elements [first, first + n) of the flattened tensor with `seed`.
void Fill(float* out, int64_t first, int64_t n, int seed) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(((first + i) * 31 + seed) % 251);
}

int Main(int argc, char** argv) {
  CLI::App app{"ckptd test trainer"};
  std::string socket, checkpoint, job;
  int rank = 0, world = 1, tensors = 4, copy_threads = 2;
  double mb = 1;
  bool wait = true, overwrite = false;
  double timeout_s = 600;
  app.add_option("--socket", socket)->required();
  app.add_option("--checkpoint", checkpoint)->required();
  app.add_option("--job", job);
  app.add_option("--rank", rank);
  app.add_option("--world", world);
  app.add_option("--mb", mb, "MiB of sharded tensors per rank");
  app.add_option("--tensors", tensors, "sharded tensors");
  app.add_option("--copy-threads", copy_threads);
  app.add_option("--timeout", timeout_s, "seconds to wait for the commit");
  app.add_flag("--wait,!--no-wait", wait, "wait for the commit");
  app.add_flag("--overwrite", overwrite);
  CLI11_PARSE(app, argc, argv);

  const int64_t cols = 256;
  const int64_t rows = std::max<int64_t>(
      1, static_cast<int64_t>(mb * (1 << 20) * world / (tensors * cols * 4.0)));
  std::vector<std::vector<float>> buffers;
  std::vector<SaveItem> items;
  std::vector<std::string> payloads;
  payloads.reserve(2);
  for (int k = 0; k < tensors; ++k) {
    const auto part = ChunkSplit(rows, world)[rank];
    if (part.second == 0) continue;
    buffers.emplace_back(static_cast<size_t>(part.second * cols));
    Fill(buffers.back().data(), part.first * cols, part.second * cols, k);
    SaveItem it;
    it.fqn = "layers." + std::to_string(k) + ".weight";
    it.global_shape = {rows, cols};
    it.chunk_offsets = {part.first, 0};
    it.chunk_sizes = {part.second, cols};
    it.data = buffers.back().data();
    items.push_back(std::move(it));
  }
  buffers.emplace_back(64 * 64);
  Fill(buffers.back().data(), 0, 64 * 64, 1000);
  SaveItem embed;
  embed.fqn = "embed";
  embed.global_shape = embed.chunk_sizes = {64, 64};
  embed.chunk_offsets = {0, 0};
  embed.data = buffers.back().data();
  items.push_back(std::move(embed));

  using ckptd::format::PyValue;
  payloads.push_back(ckptd::format::EncodeTorchSaveObject(PyValue::Int(7)));
  payloads.push_back(ckptd::format::EncodeTorchSaveObject(PyValue::Dict(
      {{PyValue::Str("rank"), PyValue::Int(rank)},
       {PyValue::Str("name"), PyValue::Str("rank " + std::to_string(rank))}})));
  SaveItem step;
  step.fqn = "step";
  step.is_bytes = true;
  step.bytes = payloads[0];
  items.push_back(std::move(step));
  SaveItem rs;
  rs.fqn = "rank_state." + std::to_string(rank);
  rs.is_bytes = true;
  rs.bytes = payloads[1];
  items.push_back(std::move(rs));

  ckptd::client::ClientOptions co;
  co.socket_path = socket;
  co.copy_threads = copy_threads;
  co.owner = "ckptd_trainer rank " + std::to_string(rank);
  auto client = ckptd::client::Client::Connect(co);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 3;
  }
  ckptd::client::SaveOptions so;
  so.overwrite = overwrite;
  ckptd::client::SaveStats stats;
  auto id = (*client)->Save(checkpoint, job, rank, world, items, so, &stats);
  if (!id.ok()) {
    std::fprintf(stderr, "save: %s\n", id.status().ToString().c_str());
    return 1;
  }
  nlohmann::json out = {{"rank", rank},
                        {"checkpoint", *id},
                        {"bytes", stats.bytes},
                        {"stall_s", stats.total_seconds},
                        {"copy_s", stats.copy_seconds},
                        {"batches", stats.batches}};
  std::fprintf(stdout, "%s\n", out.dump().c_str());
  std::fflush(stdout);
  if (!wait) return 0;
  auto info = (*client)->Wait(*id, absl::Seconds(timeout_s));
  if (!info.ok()) {
    std::fprintf(stderr, "wait: %s\n", info.status().ToString().c_str());
    return 1;
  }
  out["state"] = info->state;
  out["error"] = info->error;
  out["durable_s"] = (info->finished_unix_ms - info->created_unix_ms) / 1e3;
  std::fprintf(stdout, "%s\n", out.dump().c_str());
  return info->state == "COMMITTED" ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) { return Main(argc, argv); }
