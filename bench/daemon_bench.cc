// Copyright 2026 The ckptd Authors.
//
// daemon_bench: the trainer side of bench/daemon_bench.py. In one process
// and one run it measures, for the same bytes (pre-faulted buffers):
//   memcpy_s   a plain single-threaded memcpy of the state into another
//              buffer (best of 3): the stall reference;
//   raw_s      sequential 4 MiB pwrites + fsync of the state to a file in
//              the checkpoint directory: the durable-bandwidth reference;
//   stall_s    ckptd Save() until "staged" (the trainer's stall), median of
//              --repeat saves after one warm-up save that creates the arena;
//   durable_s  Save() start → commit reported by Wait (median).
// Prints one JSON object.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "client/ckptd_client.h"
#include "nlohmann/json.hpp"

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int Main(int argc, char** argv) {
  CLI::App app{"ckptd daemon benchmark (trainer side)"};
  std::string socket, prefix, raw_file;
  uint64_t bytes = uint64_t{1} << 30;
  int tensors = 16, repeat = 3, copy_threads = 2, rank = 0, world = 1;
  app.add_option("--socket", socket)->required();
  app.add_option("--checkpoint-prefix", prefix, "checkpoint ids are PREFIX/runN")->required();
  app.add_option("--raw-file", raw_file, "file for the raw write+fsync reference");
  app.add_option("--bytes", bytes);
  app.add_option("--tensors", tensors);
  app.add_option("--repeat", repeat);
  app.add_option("--copy-threads", copy_threads);
  CLI11_PARSE(app, argc, argv);

  const uint64_t per = bytes / tensors / 4 * 4;
  std::vector<std::vector<char>> state(tensors);
  for (int t = 0; t < tensors; ++t) {
    state[t].resize(per);
    for (uint64_t i = 0; i < per; i += 4096) state[t][i] = static_cast<char>(i + t);  // pre-fault
  }
  const uint64_t total = per * tensors;
  nlohmann::json out = {{"bytes", total}, {"tensors", tensors}};

  // memcpy reference (destination pre-faulted).
  std::vector<char> dst(total);
  std::memset(dst.data(), 1, total);
  std::vector<double> mc;
  for (int k = 0; k < 3; ++k) {
    const double t0 = Now();
    uint64_t off = 0;
    for (const auto& s : state) {
      std::memcpy(dst.data() + off, s.data(), s.size());
      off += s.size();
    }
    mc.push_back(Now() - t0);
  }
  out["memcpy_s"] = *std::min_element(mc.begin(), mc.end());
  dst.clear();
  dst.shrink_to_fit();

  // Raw sequential write + fsync reference.
  if (!raw_file.empty()) {
    const int fd = ::open(raw_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      std::perror("open raw file");
      return 2;
    }
    const double t0 = Now();
    uint64_t off = 0;
    for (const auto& s : state) {
      for (uint64_t i = 0; i < s.size();) {
        const size_t n = std::min<uint64_t>(4 << 20, s.size() - i);
        const ssize_t w = ::pwrite(fd, s.data() + i, n, off);
        if (w <= 0) {
          std::perror("pwrite");
          return 2;
        }
        i += w;
        off += w;
      }
    }
    ::fsync(fd);
    out["raw_s"] = Now() - t0;
    ::close(fd);
    ::unlink(raw_file.c_str());
  }

  std::vector<ckptd::client::SaveItem> items(tensors);
  for (int t = 0; t < tensors; ++t) {
    auto& it = items[t];
    it.fqn = "layer." + std::to_string(t) + ".weight";
    const int64_t n = static_cast<int64_t>(per / 4);
    it.global_shape = it.chunk_sizes = {n};
    it.chunk_offsets = {0};
    it.data = state[t].data();
  }
  ckptd::client::ClientOptions co;
  co.socket_path = socket;
  co.copy_threads = copy_threads;
  co.owner = "daemon_bench";
  auto client = ckptd::client::Client::Connect(co);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 2;
  }
  std::vector<double> stall, copy, durable;
  int batches = 0;
  for (int k = 0; k <= repeat; ++k) {  // k == 0: warm-up (creates the arena)
    const std::string id = prefix + "/run" + std::to_string(k);
    ckptd::client::SaveStats stats;
    const double t0 = Now();
    auto saved = (*client)->Save(id, "", rank, world, items, {}, &stats);
    const double t1 = Now();
    if (!saved.ok()) {
      std::fprintf(stderr, "save: %s\n", saved.status().ToString().c_str());
      return 2;
    }
    auto info = (*client)->Wait(*saved);
    const double t2 = Now();
    if (!info.ok() || info->state != "COMMITTED") {
      std::fprintf(stderr, "wait: %s %s\n", info.ok() ? info->state.c_str() : "",
                   info.ok() ? info->error.c_str() : info.status().ToString().c_str());
      return 2;
    }
    if (k == 0) {
      out["first_stall_s"] = t1 - t0;
      continue;
    }
    stall.push_back(t1 - t0);
    copy.push_back(stats.copy_seconds);
    durable.push_back(t2 - t0);
    batches = stats.batches;
  }
  out["stall_s"] = Median(stall);
  out["copy_s"] = Median(copy);
  out["durable_s"] = Median(durable);
  out["batches"] = batches;
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Main(argc, argv); }
