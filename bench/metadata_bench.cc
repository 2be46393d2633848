// Copyright 2026 The ckptd Authors.
//
// metadata_bench: decoding a large `.metadata`, ckptd's streaming decoder
// beside stock `FileSystemReader.read_metadata()` on the same file in the
// same run. Each side runs in a process of its own, so that each
// peak RSS is that side's alone; the two alternate (--reps, default 3) and
// the figures are medians with their range.
//
//   # the 2 M-chunk .metadata pickled by stock torch (inside its root;
//   # the command is one line):
//   bash scripts/torch2_chroot.sh run python3 bench/make_big_metadata.py
//       make --ranks 1000 --tensors 2000 --out /tmp/big_stock
//   # ckptd's own .metadata of the same checkpoint (PlanSave + encode):
//   build/bin/metadata_bench --make-ckptd=/tmp/big_ckptd
//   # or a whole checkpoint of it with tiny data (2 x 3 float32 per chunk),
//   # for ckptctl inspect / verify at scale:
//   build/bin/metadata_bench --make-ckptd-data=/tmp/big_data
//   # decode each, beside stock read_metadata() in the torch root:
//   build/bin/metadata_bench --dir=/tmp/big_stock --stock-cmd='bash
//       scripts/torch2_chroot.sh run python3 bench/make_big_metadata.py read'
//
// Targets: decode time <= 0.1 x stock read_metadata(), peak RSS <= 600 MB.
// Without --stock-cmd only ckptd's figures are printed. Exit status: 0
// targets met (or none), 1 a target missed, 2 usage or I/O error.
//
// The child mode (--decode-one=DIR) decodes DIR/.metadata once with
// ReadCompactMetadata (streaming the file in 4 MiB blocks) and prints one
// JSON line: seconds, peak_rss_bytes (ru_maxrss), baseline_rss_bytes (RSS
// before decoding), chunks, storage_entries, allocated_bytes.
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/absl_fmt.h"
#include "common/env.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "format/checkpoint/checkpoint_writer.h"
#include "format/metadata/metadata.h"
#include "format/metadata/metadata_decode.h"
#include "format/plan/save_plan.h"

namespace ckptd::format {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t RssBytes() {
  std::ifstream in("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

uint64_t PeakRssBytes() {
  struct rusage ru;
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
}

// ---- ckptd's .metadata of plan_metadata_RxT (format_bench's model) ----

std::vector<std::vector<ItemDesc>> PlanInput(int n_ranks, int n_tensors) {
  struct Kind {
    const char* name;
    int64_t k, d;
    DType dtype;
  };
  static const Kind kLayer[] = {
      {"self_attn.q_proj.weight", 4, 4096, DType::kBFloat16},
      {"self_attn.k_proj.weight", 1, 4096, DType::kBFloat16},
      {"self_attn.v_proj.weight", 1, 4096, DType::kBFloat16},
      {"self_attn.o_proj.weight", 4, 4096, DType::kBFloat16},
      {"mlp.gate_proj.weight", 11, 4096, DType::kBFloat16},
      {"mlp.up_proj.weight", 11, 4096, DType::kBFloat16},
      {"mlp.down_proj.weight", 4, 11008, DType::kBFloat16},
      {"input_layernorm.weight", 1, 4, DType::kFloat32},
      {"post_attention_layernorm.weight", 1, 4, DType::kFloat32},
  };
  struct T {
    std::string fqn;
    int64_t k, d;
    DType dtype;
  };
  std::vector<T> model;
  if (n_tensors > 0) {
    model.push_back({"model.embed_tokens.weight", 32, 4096, DType::kBFloat16});
  }
  for (int layer = 0; static_cast<int>(model.size()) + 1 < n_tensors; ++layer) {
    for (const Kind& k : kLayer) {
      if (static_cast<int>(model.size()) + 1 >= n_tensors) break;
      model.push_back({fmt::format("model.layers.{}.{}", layer, k.name), k.k,
                       k.d, k.dtype});
    }
  }
  if (n_tensors > 1) {
    model.push_back({"lm_head.weight", 32, 4096, DType::kBFloat16});
  }
  std::vector<std::vector<ItemDesc>> ranks(n_ranks);
  for (int r = 0; r < n_ranks; ++r) {
    for (const T& t : model) {
      ItemDesc it;
      it.fqn = t.fqn;
      it.dtype = t.dtype;
      it.global_shape = {int64_t{n_ranks} * t.k, t.d};
      it.chunk_offsets = {int64_t{r} * t.k, 0};
      it.chunk_sizes = {t.k, t.d};
      ranks[r].push_back(std::move(it));
    }
  }
  return ranks;
}

absl::Status MakeCkptd(const std::string& dir, int n_ranks, int n_tensors) {
  const auto ranks = PlanInput(n_ranks, n_tensors);
  ASSIGN_OR_RETURN(SavePlan plan, PlanSave(ranks));
  Metadata& md = plan.metadata;
  for (const PlannedFile& pf : plan.files) {
    uint64_t offset = 0;
    for (size_t p : pf.items) {
      const PlannedItem& pi = plan.items[p];
      const ItemDesc& it = ranks[pi.rank][pi.item_index];
      StorageInfo info{pf.relative_path, offset, it.DedupWeight() + 1088, {}};
      offset += info.length;
      md.storage_data.emplace_back(it.Key(), std::move(info));
    }
  }
  StorageMeta sm;
  sm.checkpoint_id = dir;
  md.storage_meta = sm;
  EncodeOptions eo;
  eo.write_storage_meta = true;
  ASSIGN_OR_RETURN(std::string bytes, EncodeMetadata(md, eo));
  Env* env = Env::Default();
  RETURN_IF_ERROR(env->CreateDirs(dir));
  ASSIGN_OR_RETURN(auto f, env->NewWritableFile(JoinPath(dir, kMetadataName)));
  RETURN_IF_ERROR(f->Append(bytes));
  RETURN_IF_ERROR(f->Sync());
  RETURN_IF_ERROR(f->Close());
  fmt::print("{{\"path\": \"{}\", \"bytes\": {}, \"chunks\": {}}}\n",
             JoinPath(dir, kMetadataName), bytes.size(), plan.items.size());
  return absl::OkStatus();
}

// A real checkpoint of that shape with tiny data (every chunk 2 x 3
// float32), for `ckptctl inspect` / `ckptctl verify` at scale.
absl::Status MakeCkptdData(const std::string& dir, int n_ranks, int n_tensors) {
  std::vector<std::vector<ItemDesc>> descs = PlanInput(n_ranks, n_tensors);
  static const float kData[6] = {1, 2, 3, 4, 5, 6};
  std::vector<std::vector<WriteItem>> ranks(n_ranks);
  for (int r = 0; r < n_ranks; ++r) {
    ranks[r].reserve(descs[r].size());
    for (ItemDesc& d : descs[r]) {
      WriteItem w;
      d.global_shape = {int64_t{n_ranks} * 2, 3};
      d.chunk_offsets = {int64_t{r} * 2, 0};
      d.chunk_sizes = {2, 3};
      d.dtype = DType::kFloat32;
      w.desc = std::move(d);
      w.tensor = {
          DType::kFloat32, {2, 3}, {}, reinterpret_cast<const char*>(kData)};
      ranks[r].push_back(std::move(w));
    }
  }
  CheckpointWriterOptions options;
  options.sync = false;
  const auto t0 = Clock::now();
  ASSIGN_OR_RETURN(WriteResult written, WriteCheckpoint(dir, ranks, options));
  fmt::print(
      "{{\"dir\": \"{}\", \"files\": {}, \"data_bytes\": {}, "
      "\"metadata_bytes\": {}, \"seconds\": {:.2f}}}\n",
      dir, written.files, written.data_bytes, written.metadata_bytes,
      std::chrono::duration<double>(Clock::now() - t0).count());
  return absl::OkStatus();
}

// ---- child: decode once ----

absl::Status DecodeOne(const std::string& dir) {
  const uint64_t baseline = RssBytes();
  const auto t0 = Clock::now();
  DecodeStats stats;
  ASSIGN_OR_RETURN(
      CompactMetadata md,
      ReadCompactMetadata(Env::Default(), JoinPath(dir, kMetadataName), {},
                          &stats));
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  fmt::print(
      "{{\"seconds\": {:.4f}, \"peak_rss_bytes\": {}, \"baseline_rss_bytes\": "
      "{}, \"chunks\": {}, \"storage_entries\": {}, \"allocated_bytes\": {}, "
      "\"model_bytes\": {}, \"memo_slots\": {}, \"memo_stored\": {}, "
      "\"fast_objects\": {}, \"fast_sizes\": {}}}\n",
      s, PeakRssBytes(), baseline, md.num_chunks(), md.num_storage(),
      stats.allocated_bytes, md.MemoryBytes(), stats.memo_slots,
      stats.memo_stored, stats.fast_objects, stats.fast_sizes);
  return absl::OkStatus();
}

// ---- parent ----

struct Sample {
  double seconds = 0;
  double peak = 0;
  double baseline = 0;
  double chunks = 0;
};

std::optional<double> JsonNumber(std::string_view j, std::string_view key) {
  const std::string k = fmt::format("\"{}\": ", key);
  const size_t at = j.find(k);
  if (at == std::string_view::npos) return std::nullopt;
  return std::strtod(std::string(j.substr(at + k.size(), 40)).c_str(), nullptr);
}

absl::StatusOr<Sample> RunChild(const std::string& cmd) {
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return absl::ErrnoToStatus(errno, "popen " + cmd);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int rc = ::pclose(p);
  const size_t line = out.rfind("{\"seconds\"");
  if (rc != 0 || line == std::string::npos) {
    return absl::InternalError(fmt::format("`{}` failed (status {}): {}", cmd,
                                           rc, out.substr(0, 2000)));
  }
  const std::string_view j = std::string_view(out).substr(line);
  Sample s;
  s.seconds = JsonNumber(j, "seconds").value_or(0);
  s.peak = JsonNumber(j, "peak_rss_bytes").value_or(0);
  s.baseline = JsonNumber(j, "baseline_rss_bytes").value_or(0);
  s.chunks = JsonNumber(j, "chunks").value_or(0);
  return s;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string Range(const std::vector<double>& v, double scale, int prec) {
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return fmt::format("[{:.{}f}–{:.{}f}]", *lo / scale, prec, *hi / scale, prec);
}

int Compare(const std::string& self, const std::string& dir,
            const std::string& stock_cmd, int reps) {
  std::vector<double> t_ck, p_ck, t_st, p_st, g_st;
  double chunks = 0;
  for (int i = 0; i < reps; ++i) {
    auto ck = RunChild(fmt::format("'{}' --decode-one='{}'", self, dir));
    if (!ck.ok()) {
      fmt::print(stderr, "metadata_bench: {}\n", ck.status());
      return 2;
    }
    t_ck.push_back(ck->seconds);
    p_ck.push_back(ck->peak);
    chunks = ck->chunks;
    if (!stock_cmd.empty()) {
      auto st = RunChild(fmt::format("{} '{}'", stock_cmd, dir));
      if (!st.ok()) {
        fmt::print(stderr, "metadata_bench: {}\n", st.status());
        return 2;
      }
      t_st.push_back(st->seconds);
      p_st.push_back(st->peak);
      g_st.push_back(st->peak - st->baseline);
      if (st->chunks != chunks) {
        fmt::print(stderr, "metadata_bench: stock read {} chunks, ckptd {}\n",
                   st->chunks, chunks);
        return 2;
      }
    }
  }
  auto size = Env::Default()->GetFileSize(JoinPath(dir, kMetadataName));
  const double mb = size.ok() ? static_cast<double>(*size) / 1e6 : 0;
  fmt::print("decode {} ({:.1f} MB, {:.0f} chunks), median of {}:\n", dir, mb,
             chunks, reps);
  fmt::print(
      "  ckptd ReadCompactMetadata: {:.3f} s {} , peak RSS {:.0f} MB {}\n",
      Median(t_ck), Range(t_ck, 1, 3), Median(p_ck) / 1e6, Range(p_ck, 1e6, 0));
  bool pass = Median(p_ck) <= 600e6;
  if (!t_st.empty()) {
    const double ratio = Median(t_ck) / Median(t_st);
    std::vector<double> ratios;
    for (size_t i = 0; i < t_ck.size(); ++i)
      ratios.push_back(t_ck[i] / t_st[i]);
    fmt::print(
        "  stock read_metadata():    {:.3f} s {} , peak RSS {:.0f} MB {} "
        "(+{:.0f} MB over its baseline)\n",
        Median(t_st), Range(t_st, 1, 3), Median(p_st) / 1e6,
        Range(p_st, 1e6, 0), Median(g_st) / 1e6);
    fmt::print(
        "  ratio ckptd / stock: time {:.4f} {} (target <= 0.1), peak RSS "
        "{:.3f}\n",
        ratio, Range(ratios, 1, 4), Median(p_ck) / Median(p_st));
    pass = pass && ratio <= 0.1;
  }
  fmt::print("  targets (time <= 0.1 x stock, peak RSS <= 600 MB): {}\n",
             pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

int Main(int argc, char** argv) {
  std::string dir, stock_cmd, make, make_data, decode_one;
  int reps = 3, ranks = 1000, tensors = 2000;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&](std::string_view flag) -> std::optional<std::string> {
      if (a.substr(0, flag.size()) == flag && a.size() > flag.size() &&
          a[flag.size()] == '=') {
        return std::string(a.substr(flag.size() + 1));
      }
      return std::nullopt;
    };
    if (auto v = value("--dir")) {
      dir = *v;
    } else if (auto v = value("--stock-cmd")) {
      stock_cmd = *v;
    } else if (auto v = value("--make-ckptd")) {
      make = *v;
    } else if (auto v = value("--make-ckptd-data")) {
      make_data = *v;
    } else if (auto v = value("--decode-one")) {
      decode_one = *v;
    } else if (auto v = value("--reps")) {
      reps = std::max(1, std::atoi(v->c_str()));
    } else if (auto v = value("--ranks")) {
      ranks = std::max(1, std::atoi(v->c_str()));
    } else if (auto v = value("--tensors")) {
      tensors = std::max(1, std::atoi(v->c_str()));
    } else {
      fmt::print(
          stderr,
          "usage: metadata_bench --dir=DIR [--stock-cmd=CMD] [--reps=N]\n"
          "       metadata_bench --make-ckptd=DIR [--ranks=R] "
          "[--tensors=T]\n"
          "       metadata_bench --decode-one=DIR\n");
      return 2;
    }
  }
  absl::Status s;
  if (!decode_one.empty()) {
    s = DecodeOne(decode_one);
  } else if (!make.empty()) {
    s = MakeCkptd(make, ranks, tensors);
  } else if (!make_data.empty()) {
    s = MakeCkptdData(make_data, ranks, tensors);
  } else if (!dir.empty()) {
    struct utsname un;
    ::uname(&un);
    fmt::print("metadata_bench: {} CPUs, kernel {}\n",
               ::sysconf(_SC_NPROCESSORS_ONLN), un.release);
    char self[4096];
    const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) return 2;
    self[n] = '\0';
    return Compare(self, dir, stock_cmd, reps);
  } else {
    fmt::print(stderr, "metadata_bench: nothing to do (--help)\n");
    return 2;
  }
  if (!s.ok()) {
    fmt::print(stderr, "metadata_bench: {}\n", s);
    return 2;
  }
  return 0;
}

}  // namespace
}  // namespace ckptd::format

int main(int argc, char** argv) { return ckptd::format::Main(argc, argv); }
