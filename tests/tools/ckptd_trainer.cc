// Copyright 2026 The ckptd Authors.
//
// ckptd_trainer: one trainer rank for end-to-end tests, the main job and
// benchmarks. It builds a deterministic synthetic state dict for
// (rank, world_size), saves it through libckptd_client and optionally waits
// for the commit, printing JSON lines with its timings.
// tests/python/daemon_util.py (TrainerSpec) rebuilds the same state dict
// independently; keep the two in sync.
//
// Values: the formula of tests/interop/sample_spec.py. Element i (flat
// C-order index in the FULL tensor) of a tensor with seed s has
// v = (i * 31 + s) % 251, stored by dtype as
//   float64 / float32 / float16 / bfloat16: (v - 125) / 4   (exact)
//   int64: (v - 125) * 68719476767   int32: (v - 125) * 16777259
//   int16: (v - 125) * 257           int8: v - 125
//   uint8: v                         bool: v odd
//
// The synthetic state:
//   layers.{k}.weight  [rows, 256] of dtype dtypes[k % len(dtypes)], seed k,
//                      split over the ranks like torch.chunk along dim 0
//                      (--layout rows) or dim 1 (--layout cols); a rank whose
//                      part is empty saves nothing of it       (sharded)
//   embed              float32 [64, 64], every rank, seed 1000  (replicated)
//   extra.{r}.{j}      float32 [16], seed 2000 + j, rank r only,
//                      j < --extra-items                        (per rank)
//   step               bytes: torch.save(int STEP), every rank  (replicated)
//   rank_state.{r}     bytes: torch.save({"rank": r, "name": "rank r"}),
//                      rank r only
// `--mb` sets rows = max(1, trunc(mb * 2^20 * world / (tensors * 256 * 4)))
// so that the sharded tensors hold about mb MiB per rank (counted as if
// float32). `--strided` keeps every sharded chunk in column-major memory
// (the client gathers it into C order).
//
// Output (stdout), one JSON object per line:
//   after Save: {"rank", "checkpoint", "bytes", "stall_s", "copy_s",
//                "batches"}
//   after Wait: the same plus "state", "error", "error_code", "durable_s"
//   on failure: {"rank", "save_error" | "wait_error", "code"} (exit 1)
// With --saves N the rank saves N times through one client (one arena),
// each save to --checkpoint with "{i}" replaced by the save's index, and
// every line carries "save": i. --pause-between prints {"rank", "paused": i}
// before save i > 0 and waits for a line on stdin. --retries N retries a
// save that failed with UNAVAILABLE (a daemon restarting) N times.
// --coordinator ADDR, --local-ranks 0,1,... and --num-nodes N fill
// SaveOptions::cluster (a multi-node checkpoint; the client validates them).
// Exit status: 0 committed (or staged with --no-wait), 1 failed, 2 usage,
// 3 no daemon.
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "client/ckptd_client.h"
#include "format/pickle/py_value.h"
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

size_t ElementSize(const std::string& dtype) {
  if (dtype == "float64" || dtype == "int64") return 8;
  if (dtype == "float32" || dtype == "int32") return 4;
  if (dtype == "float16" || dtype == "bfloat16" || dtype == "int16") return 2;
  if (dtype == "int8" || dtype == "uint8" || dtype == "bool") return 1;
  return 0;
}

// float16 bits of x, for the formula's values ((v - 125) / 4: 0 or a
// normal number with at most 7 significant bits, so exact).
uint16_t HalfBits(double x) {
  if (x == 0) return 0;
  const uint16_t sign = x < 0 ? 0x8000 : 0;
  int e = 0;
  const double m = std::frexp(std::fabs(x), &e);  // |x| = m * 2^e, m in [0.5, 1)
  const int exp = e - 1 + 15;
  const auto mant = static_cast<uint16_t>(std::lround((m * 2 - 1) * 1024));
  return static_cast<uint16_t>(sign | (exp << 10) | mant);
}

template <typename T>
void Put(char* out, T value) {
  std::memcpy(out, &value, sizeof(T));
}

// Stores element value v (see the file comment) of `dtype` at `out`.
void StoreElement(const std::string& dtype, int64_t v, char* out) {
  const double real = static_cast<double>(v - 125) / 4.0;
  if (dtype == "float64") {
    Put<double>(out, real);
  } else if (dtype == "float32") {
    Put<float>(out, static_cast<float>(real));
  } else if (dtype == "float16") {
    Put<uint16_t>(out, HalfBits(real));
  } else if (dtype == "bfloat16") {
    const float f = static_cast<float>(real);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    Put<uint16_t>(out, static_cast<uint16_t>(bits >> 16));  // exact: <= 8 bits
  } else if (dtype == "int64") {
    Put<int64_t>(out, (v - 125) * int64_t{68719476767});
  } else if (dtype == "int32") {
    Put<int32_t>(out, static_cast<int32_t>((v - 125) * 16777259));
  } else if (dtype == "int16") {
    Put<int16_t>(out, static_cast<int16_t>((v - 125) * 257));
  } else if (dtype == "int8") {
    Put<int8_t>(out, static_cast<int8_t>(v - 125));
  } else if (dtype == "uint8") {
    Put<uint8_t>(out, static_cast<uint8_t>(v));
  } else if (dtype == "bool") {
    Put<uint8_t>(out, static_cast<uint8_t>(v & 1));
  }
}

// A 2-D chunk [r0, r0 + nr) x [c0, c0 + nc) of a [*, cols] tensor with
// `seed`, in C order, or column-major if `column_major`.
std::vector<char> FillChunk(const std::string& dtype, int64_t cols, int64_t r0, int64_t nr,
                            int64_t c0, int64_t nc, int seed, bool column_major) {
  const size_t es = ElementSize(dtype);
  std::vector<char> out(static_cast<size_t>(nr * nc) * es);
  for (int64_t i = 0; i < nr; ++i) {
    for (int64_t j = 0; j < nc; ++j) {
      const int64_t flat = (r0 + i) * cols + (c0 + j);
      const int64_t pos = column_major ? j * nr + i : i * nc + j;
      StoreElement(dtype, (flat * 31 + seed) % 251, out.data() + pos * es);
    }
  }
  return out;
}

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = s.find(',', start);
    std::string part = s.substr(start, comma == std::string::npos ? std::string::npos
                                                                  : comma - start);
    if (!part.empty()) out.push_back(part);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

void PrintJson(const nlohmann::json& j) {
  std::fprintf(stdout, "%s\n", j.dump().c_str());
  std::fflush(stdout);
}

int Main(int argc, char** argv) {
  CLI::App app{"ckptd test trainer"};
  std::string socket, checkpoint, job, dtype_list = "float32", layout = "rows";
  int rank = 0, world = 1, tensors = 4, copy_threads = 2, extra_items = 0;
  int64_t step_value = 7;
  int saves = 1, retries = 0;
  bool pause_between = false;
  double mb = 1;
  bool wait = true, overwrite = false, strided = false, dedup_lowest = false;
  bool hold_after_staged = false, exit_after_staged = false;
  std::string coordinator, local_ranks_list;
  int num_nodes = 1;
  double timeout_s = 600, sleep_before_save = 0;
  app.add_option("--socket", socket)->required();
  app.add_option("--checkpoint", checkpoint)->required();
  app.add_option("--job", job);
  app.add_option("--rank", rank);
  app.add_option("--world", world);
  app.add_option("--mb", mb, "MiB of sharded tensors per rank (as float32)");
  app.add_option("--tensors", tensors, "sharded tensors");
  app.add_option("--dtype", dtype_list,
                 "comma-separated dtypes of the sharded tensors, cycled over them");
  app.add_option("--layout", layout, "rows | cols: the dimension the ranks split")
      ->check(CLI::IsMember({"rows", "cols"}));
  app.add_flag("--strided", strided, "sharded chunks in column-major memory");
  app.add_option("--extra-items", extra_items, "small per-rank tensors extra.{rank}.{j}");
  app.add_option("--step", step_value, "value of the replicated bytes item `step`");
  app.add_option("--copy-threads", copy_threads);
  app.add_option("--timeout", timeout_s, "seconds to wait for the commit");
  app.add_option("--sleep-before-save", sleep_before_save, "seconds to sleep before Save");
  app.add_flag("--wait,!--no-wait", wait, "wait for the commit");
  app.add_flag("--hold-after-staged", hold_after_staged,
               "after the staged line, sleep until killed (without waiting)");
  app.add_flag("--exit-after-staged", exit_after_staged,
               "after the staged line, _exit(0) at once (no cleanup, arena not released)");
  app.add_flag("--overwrite", overwrite);
  app.add_option("--saves", saves, "saves through the same client; {i} in --checkpoint: index");
  app.add_option("--retries", retries,
                 "retry a save that fails with UNAVAILABLE (daemon restarting), 100 ms apart");
  app.add_flag("--pause-between", pause_between,
               "before each save after the first, print a 'paused' line and read a stdin line");
  app.add_flag("--dedup-lowest", dedup_lowest, "SaveOptions.dedup_save_to_lowest_rank");
  app.add_option("--coordinator", coordinator,
                 "multi-node: peer address (host:port) of rank 0's daemon");
  app.add_option("--local-ranks", local_ranks_list,
                 "multi-node: comma-separated ranks saving through this node's daemon");
  app.add_option("--num-nodes", num_nodes, "multi-node: daemons taking part");
  CLI11_PARSE(app, argc, argv);

  const std::vector<std::string> dtypes = SplitList(dtype_list);
  if (dtypes.empty()) {
    std::fprintf(stderr, "--dtype: no dtype given\n");
    return 2;
  }
  for (const std::string& d : dtypes) {
    if (ElementSize(d) == 0) {
      std::fprintf(stderr, "--dtype: unsupported dtype '%s'\n", d.c_str());
      return 2;
    }
  }
  if (world < 1 || rank < 0 || rank >= world || tensors < 0 || extra_items < 0) {
    std::fprintf(stderr, "bad --rank/--world/--tensors/--extra-items\n");
    return 2;
  }
  std::vector<int> local_ranks;
  for (const std::string& r : SplitList(local_ranks_list)) {
    int v = 0;
    if (!absl::SimpleAtoi(r, &v)) {
      std::fprintf(stderr, "--local-ranks: '%s' is not an integer\n", r.c_str());
      return 2;
    }
    local_ranks.push_back(v);
  }

  const int64_t cols = 256;
  const int64_t rows = std::max<int64_t>(
      1, static_cast<int64_t>(mb * (1 << 20) * world / (tensors * cols * 4.0)));
  std::vector<std::vector<char>> buffers;
  buffers.reserve(tensors + extra_items + 1);
  std::vector<SaveItem> items;
  for (int k = 0; k < tensors; ++k) {
    const std::string& dtype = dtypes[k % dtypes.size()];
    int64_t r0 = 0, nr = rows, c0 = 0, nc = cols;
    if (layout == "rows") {
      std::tie(r0, nr) = ChunkSplit(rows, world)[rank];
    } else {
      std::tie(c0, nc) = ChunkSplit(cols, world)[rank];
    }
    if (nr == 0 || nc == 0) continue;
    buffers.push_back(FillChunk(dtype, cols, r0, nr, c0, nc, k, strided));
    SaveItem it;
    it.fqn = "layers." + std::to_string(k) + ".weight";
    it.dtype = dtype;
    it.global_shape = {rows, cols};
    it.chunk_offsets = {r0, c0};
    it.chunk_sizes = {nr, nc};
    if (strided) it.strides = {1, nr};
    it.data = buffers.back().data();
    items.push_back(std::move(it));
  }
  buffers.push_back(FillChunk("float32", 64, 0, 64, 0, 64, 1000, false));
  SaveItem embed;
  embed.fqn = "embed";
  embed.global_shape = embed.chunk_sizes = {64, 64};
  embed.chunk_offsets = {0, 0};
  embed.data = buffers.back().data();
  items.push_back(std::move(embed));
  for (int j = 0; j < extra_items; ++j) {
    buffers.push_back(FillChunk("float32", 16, 0, 1, 0, 16, 2000 + j, false));
    SaveItem it;
    it.fqn = "extra." + std::to_string(rank) + "." + std::to_string(j);
    it.global_shape = it.chunk_sizes = {16};
    it.chunk_offsets = {0};
    it.data = buffers.back().data();
    items.push_back(std::move(it));
  }

  using ckptd::format::PyValue;
  std::vector<std::string> payloads;
  payloads.push_back(ckptd::format::EncodeTorchSaveObject(PyValue::Int(step_value)));
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

  if (sleep_before_save > 0) absl::SleepFor(absl::Seconds(sleep_before_save));

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
  so.dedup_save_to_lowest_rank = dedup_lowest;
  so.cluster.coordinator = coordinator;
  so.cluster.local_ranks = local_ranks;
  so.cluster.num_nodes = num_nodes;
  bool committed = true;
  for (int i = 0; i < saves; ++i) {
    std::string id_in = checkpoint;
    for (size_t pos; (pos = id_in.find("{i}")) != std::string::npos;) {
      id_in.replace(pos, 3, std::to_string(i));
    }
    if (i > 0 && pause_between) {
      PrintJson({{"rank", rank}, {"paused", i}});
      char line[256];
      if (std::fgets(line, sizeof(line), stdin) == nullptr) return 1;
    }
    ckptd::client::SaveStats stats;
    auto id = (*client)->Save(id_in, job, rank, world, items, so, &stats);
    for (int r = 0; r < retries && absl::IsUnavailable(id.status()); ++r) {
      absl::SleepFor(absl::Milliseconds(100));
      id = (*client)->Save(id_in, job, rank, world, items, so, &stats);
    }
    if (!id.ok()) {
      std::fprintf(stderr, "save: %s\n", id.status().ToString().c_str());
      PrintJson({{"rank", rank},
                 {"save", i},
                 {"save_error", std::string(id.status().message())},
                 {"code", static_cast<int>(id.status().code())}});
      return 1;
    }
    nlohmann::json out = {{"rank", rank},
                          {"save", i},
                          {"checkpoint", *id},
                          {"bytes", stats.bytes},
                          {"stall_s", stats.total_seconds},
                          {"copy_s", stats.copy_seconds},
                          {"batches", stats.batches}};
    PrintJson(out);
    if (exit_after_staged) std::_Exit(0);
    if (hold_after_staged) {
      while (true) ::pause();
    }
    if (!wait) continue;
    auto info = (*client)->Wait(*id, absl::Seconds(timeout_s));
    if (!info.ok()) {
      std::fprintf(stderr, "wait: %s\n", info.status().ToString().c_str());
      PrintJson({{"rank", rank},
                 {"save", i},
                 {"wait_error", std::string(info.status().message())},
                 {"code", static_cast<int>(info.status().code())}});
      return 1;
    }
    out["state"] = info->state;
    out["error"] = info->error;
    out["error_code"] = info->error_code;
    out["durable_s"] = (info->finished_unix_ms - info->created_unix_ms) / 1e3;
    PrintJson(out);
    if (info->state != "COMMITTED") committed = false;
  }
  return committed ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) { return Main(argc, argv); }
