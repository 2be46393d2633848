// Copyright 2026 The ckptd Authors.
//
// interop_tool: drives ckptd's checkpoint writer and reader from the Python
// interop suites (tests/interop with torch >= 2.4, tests/python with
// Debian's torch 1.13).
//
//   interop_tool write-sample DIR [--overwrite]
//       Writes the deterministic 4-rank sample checkpoint described below
//       with WriteCheckpoint. tests/interop/sample_spec.py rebuilds the same
//       state dict independently, from the same formula.
//   interop_tool read DIR FQN OFFSETS SIZES DTYPE OUT.bin
//       Reads the box [OFFSETS, OFFSETS + SIZES) of tensor FQN with
//       CheckpointReader::ReadTensors and writes its raw bytes in C order to
//       OUT.bin. OFFSETS and SIZES are comma-separated ("0,3"); "-" (or an
//       empty string) means a 0-d tensor. DTYPE is a torch dtype name
//       ("float32") or "-" for the saved dtype.
//   interop_tool read-many DIR PLAN
//       `read` for every line of PLAN (FQN, OFFSETS, SIZES, DTYPE and
//       OUT.bin, tab-separated), through one CheckpointReader; stops at the
//       first failure.
//   interop_tool read-object DIR FQN...
//       Prints PyValue::Repr() of each bytes item FQN (one line each).
//   interop_tool list DIR [--json]
//       Prints every item: fqn, kind, dtype, shape, planner_data path and
//       saved chunk boxes, one per line; with --json one JSON document that
//       also gives each chunk's / bytes item's file, offset and length.
//
// Exit status: 0 ok, 1 the operation failed (message on stderr), 2 usage.
//
// The sample (every element value is defined by one formula):
//   element i (flat C-order index in the FULL tensor) of the tensor with
//   seed k has v = (i * 31 + k) mod 251, converted by dtype:
//     float64 / float32 / float16 / bfloat16: (v - 125) / 4   (exact)
//     complex128 / complex64: real (v - 125) / 4, imag (125 - v) / 8
//     int64: (v - 125) * 68719476767    int32: (v - 125) * 16777259
//     int16: (v - 125) * 257            int8: v - 125
//     uint8: v                          bool: v odd
//   Chunkings (4 ranks): "rows" = dim 0 split like torch.chunk (ceil(n/4)
//   rows per rank, trailing ranks may get fewer or none); "cols" = the same
//   on dim 1; "grid" = 2x2 blocks (rank r holds row half r/2, column half
//   r%2); "replicated" = every rank saves the full tensor (deduplicated);
//   "rank R" = one rank saves the full tensor. Bytes items are saved by
//   every rank (deduplicated).
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_split.h"
#include "fmt/format.h"
#include "format/checkpoint/checkpoint_reader.h"
#include "format/checkpoint/checkpoint_writer.h"
#include "format/tensor/dtype.h"
#include "format/metadata/metadata.h"
#include "format/pickle/py_value.h"
#include "format/plan/save_plan.h"
#include "nlohmann/json.hpp"

namespace ckptd::format {
namespace {

constexpr int kSampleRanks = 4;

std::string Msg(const absl::Status& s) {
  return std::string(s.message().data(), s.message().size());
}

int Fail(const absl::Status& s, std::string_view context) {
  std::fprintf(stderr, "interop_tool: %.*s: %s\n",
               static_cast<int>(context.size()), context.data(),
               Msg(s).c_str());
  return 1;
}

// ---------------------------------------------------------------------------
// Element encoding.

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const int32_t exp = static_cast<int32_t>((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffffu;
  if (((x >> 23) & 0xff) == 0xff) {  // inf / nan
    return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  }
  if (exp >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow
  if (exp <= 0) {                                                 // subnormal
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - exp;
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u)))
    ++half;  // may carry into exp: fine
  return static_cast<uint16_t>(half);
}

uint16_t FloatToBFloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if (std::isnan(f)) return static_cast<uint16_t>((x >> 16) | 0x40u);
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

template <typename T>
void Put(char* out, T value) {
  std::memcpy(out, &value, sizeof(T));
}

// Writes element value v (see the file comment) of `dtype` at `out`.
void StoreElement(DType dtype, int64_t v, char* out) {
  const double real = static_cast<double>(v - 125) / 4.0;
  const double imag = static_cast<double>(125 - v) / 8.0;
  switch (dtype) {
    case DType::kFloat64:
      Put<double>(out, real);
      return;
    case DType::kFloat32:
      Put<float>(out, static_cast<float>(real));
      return;
    case DType::kFloat16:
      Put<uint16_t>(out, FloatToHalf(static_cast<float>(real)));
      return;
    case DType::kBFloat16:
      Put<uint16_t>(out, FloatToBFloat16(static_cast<float>(real)));
      return;
    case DType::kComplex128:
      Put<double>(out, real);
      Put<double>(out + 8, imag);
      return;
    case DType::kComplex64:
      Put<float>(out, static_cast<float>(real));
      Put<float>(out + 4, static_cast<float>(imag));
      return;
    case DType::kInt64:
      Put<int64_t>(out, (v - 125) * int64_t{68719476767});
      return;
    case DType::kInt32:
      Put<int32_t>(out, static_cast<int32_t>((v - 125) * 16777259));
      return;
    case DType::kInt16:
      Put<int16_t>(out, static_cast<int16_t>((v - 125) * 257));
      return;
    case DType::kInt8:
      Put<int8_t>(out, static_cast<int8_t>(v - 125));
      return;
    case DType::kUInt8:
      Put<uint8_t>(out, static_cast<uint8_t>(v));
      return;
    case DType::kBool:
      Put<uint8_t>(out, static_cast<uint8_t>(v & 1));
      return;
    default:
      // The sample uses legacy dtypes only.
      std::memset(out, 0, ElementSize(dtype));
      return;
  }
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

// The full tensor of `shape`, C order, filled by the formula with `seed`.
std::string FillFull(DType dtype, const std::vector<int64_t>& shape, int seed) {
  const int64_t n = Numel(shape);
  const size_t es = ElementSize(dtype);
  std::string out(static_cast<size_t>(n) * es, '\0');
  for (int64_t i = 0; i < n; ++i) {
    StoreElement(dtype, (i * 31 + seed) % 251, out.data() + i * es);
  }
  return out;
}

// ---------------------------------------------------------------------------
// The sample's layout. Keep in sync with tests/interop/sample_spec.py.

struct SampleChunk {
  int rank;
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
};

enum class Layout {
  kRows,
  kCols,
  kGrid,
  kReplicated,
  kRank0,
  kRank1,
  kRank2,
  kRank3,
  kRows01,
  kCols23
};

struct SampleTensor {
  std::string fqn;
  std::vector<PathElement> path;
  DType dtype;
  std::vector<int64_t> shape;
  int seed;
  Layout layout;
};

struct SampleObject {
  std::string fqn;
  std::vector<PathElement> path;
  PyValue value;
};

// torch.chunk split of `n` into `parts`: (offset, size) per part, size 0
// for parts past the end.
std::vector<std::pair<int64_t, int64_t>> ChunkSplit(int64_t n, int parts) {
  const int64_t per = (n + parts - 1) / parts;
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int p = 0; p < parts; ++p) {
    const int64_t off = std::min(n, p * per);
    out.emplace_back(off, std::min(n, off + per) - off);
  }
  return out;
}

std::vector<SampleChunk> Chunks(const SampleTensor& t) {
  std::vector<SampleChunk> out;
  const std::vector<int64_t> zeros(t.shape.size(), 0);
  auto split_dim = [&](int dim, const std::vector<int>& ranks) {
    const auto parts = ChunkSplit(t.shape[dim], static_cast<int>(ranks.size()));
    for (size_t p = 0; p < ranks.size(); ++p) {
      if (parts[p].second == 0) continue;
      SampleChunk c{ranks[p], zeros, t.shape};
      c.offsets[dim] = parts[p].first;
      c.sizes[dim] = parts[p].second;
      out.push_back(std::move(c));
    }
  };
  switch (t.layout) {
    case Layout::kRows:
      split_dim(0, {0, 1, 2, 3});
      break;
    case Layout::kCols:
      split_dim(1, {0, 1, 2, 3});
      break;
    case Layout::kRows01:
      split_dim(0, {0, 1});
      break;
    case Layout::kCols23:
      split_dim(1, {2, 3});
      break;
    case Layout::kGrid: {
      const auto rows = ChunkSplit(t.shape[0], 2);
      const auto cols = ChunkSplit(t.shape[1], 2);
      for (int r = 0; r < 4; ++r) {
        out.push_back({r,
                       {rows[r / 2].first, cols[r % 2].first},
                       {rows[r / 2].second, cols[r % 2].second}});
      }
      break;
    }
    case Layout::kReplicated:
      for (int r = 0; r < kSampleRanks; ++r) out.push_back({r, zeros, t.shape});
      break;
    case Layout::kRank0:
      out.push_back({0, zeros, t.shape});
      break;
    case Layout::kRank1:
      out.push_back({1, zeros, t.shape});
      break;
    case Layout::kRank2:
      out.push_back({2, zeros, t.shape});
      break;
    case Layout::kRank3:
      out.push_back({3, zeros, t.shape});
      break;
  }
  return out;
}

std::vector<PathElement> P(std::initializer_list<PathElement> elems) {
  return elems;
}

std::vector<SampleTensor> SampleTensors() {
  using S = std::string;
  return {
      {"model.layers.0.weight",
       P({S("model"), S("layers.0.weight")}),
       DType::kFloat32,
       {10, 7},
       1,
       Layout::kRows},
      {"model.layers.0.proj.weight",
       P({S("model"), S("layers.0.proj.weight")}),
       DType::kBFloat16,
       {6, 12},
       2,
       Layout::kCols},
      {"model.layers.1.weight",
       P({S("model"), S("layers.1.weight")}),
       DType::kFloat64,
       {6, 8},
       3,
       Layout::kGrid},
      {"model.norm.scale",
       P({S("model"), S("norm.scale")}),
       DType::kFloat16,
       {16},
       4,
       Layout::kReplicated},
      {"model.num_batches_tracked",
       P({S("model"), S("num_batches_tracked")}),
       DType::kInt64,
       {},
       5,
       Layout::kReplicated},
      {"model.empty",
       P({S("model"), S("empty")}),
       DType::kFloat32,
       {0, 5},
       6,
       Layout::kRank0},
      {"model.buffers.complex128",
       P({S("model"), S("buffers.complex128")}),
       DType::kComplex128,
       {5},
       7,
       Layout::kRank1},
      {"model.buffers.complex64",
       P({S("model"), S("buffers.complex64")}),
       DType::kComplex64,
       {2, 3},
       8,
       Layout::kRank2},
      {"model.buffers.int32",
       P({S("model"), S("buffers.int32")}),
       DType::kInt32,
       {7},
       9,
       Layout::kRank3},
      {"model.buffers.int16",
       P({S("model"), S("buffers.int16")}),
       DType::kInt16,
       {4, 2},
       10,
       Layout::kRows01},
      {"model.buffers.int8",
       P({S("model"), S("buffers.int8")}),
       DType::kInt8,
       {9},
       11,
       Layout::kRank0},
      {"model.buffers.uint8",
       P({S("model"), S("buffers.uint8")}),
       DType::kUInt8,
       {11},
       12,
       Layout::kRank1},
      {"model.buffers.bool",
       P({S("model"), S("buffers.bool")}),
       DType::kBool,
       {13},
       13,
       Layout::kRank2},
      {"model.buffers.int64",
       P({S("model"), S("buffers.int64")}),
       DType::kInt64,
       {3, 4},
       14,
       Layout::kCols23},
      {"optim.state.layers.0.weight.exp_avg",
       P({S("optim"), S("state"), S("layers.0.weight"), S("exp_avg")}),
       DType::kFloat32,
       {10, 7},
       15,
       Layout::kRows},
      {"optim.state.layers.0.weight.step",
       P({S("optim"), S("state"), S("layers.0.weight"), S("step")}),
       DType::kFloat32,
       {},
       16,
       Layout::kReplicated},
  };
}

std::vector<SampleObject> SampleObjects() {
  using S = std::string;
  using V = PyValue;
  return {
      {"step", P({S("step")}), V::Int(1000)},
      {"optim.param_groups.0.lr",
       P({S("optim"), S("param_groups"), int64_t{0}, S("lr")}), V::Float(3e-4)},
      {"optim.param_groups.0.betas",
       P({S("optim"), S("param_groups"), int64_t{0}, S("betas")}),
       V::Tuple({V::Float(0.9), V::Float(0.95)})},
      {"optim.param_groups.0.eps",
       P({S("optim"), S("param_groups"), int64_t{0}, S("eps")}),
       V::Float(1e-8)},
      {"optim.param_groups.0.weight_decay",
       P({S("optim"), S("param_groups"), int64_t{0}, S("weight_decay")}),
       V::Float(0.1)},
      {"optim.param_groups.0.amsgrad",
       P({S("optim"), S("param_groups"), int64_t{0}, S("amsgrad")}),
       V::Bool(false)},
      {"optim.param_groups.0.params",
       P({S("optim"), S("param_groups"), int64_t{0}, S("params")}),
       V::List({V::Str("layers.0.weight"), V::Str("layers.0.proj.weight")})},
      {"optim.param_groups.1.lr",
       P({S("optim"), S("param_groups"), int64_t{1}, S("lr")}), V::Float(1e-3)},
      {"optim.param_groups.1.params",
       P({S("optim"), S("param_groups"), int64_t{1}, S("params")}),
       V::List({V::Str("norm.scale")})},
      {"extra.note", P({S("extra"), S("note")}),
       V::Str("ckptd interop sample \xe2\x80\x94 \xc3\xbc"
              "nic"
              "\xc3\xb6"
              "de \xe2\x9c\x93")},
      {"extra.config", P({S("extra"), S("config")}),
       V::Dict({{V::Str("name"), V::Str("tiny")},
                {V::Str("layers"), V::Int(2)},
                {V::Str("dims"), V::List({V::Int(10), V::Int(7)})},
                {V::Str("ratio"), V::Float(0.5)},
                {V::Str("tags"), V::None()}})},
      {"extra.nothing", P({S("extra"), S("nothing")}), V::None()},
      {"extra.flag", P({S("extra"), S("flag")}), V::Bool(true)},
      {"extra.big_int", P({S("extra"), S("big_int")}),
       V::Int((int64_t{1} << 40) + 3)},
      {"extra.neg_int", P({S("extra"), S("neg_int")}),
       V::Int(-(int64_t{1} << 62))},
      {"extra.neg_float", P({S("extra"), S("neg_float")}), V::Float(-2.5e-10)},
      {"extra.mixed_list", P({S("extra"), S("mixed_list")}),
       V::List({V::Int(1), V::Str("two"), V::Float(3.0), V::None(),
                V::Bool(true)})},
  };
}

int WriteSample(const std::string& dir, bool overwrite) {
  const std::vector<SampleTensor> tensors = SampleTensors();
  const std::vector<SampleObject> objects = SampleObjects();
  // Storage that the write items point into; must outlive WriteCheckpoint.
  std::vector<std::string> full(tensors.size());
  std::vector<std::string> payloads(objects.size());
  std::vector<std::vector<WriteItem>> ranks(kSampleRanks);
  for (size_t k = 0; k < tensors.size(); ++k) {
    const SampleTensor& t = tensors[k];
    full[k] = FillFull(t.dtype, t.shape, t.seed);
    const std::vector<int64_t> strides = ContiguousStrides(t.shape);
    for (const SampleChunk& c : Chunks(t)) {
      WriteItem it;
      it.desc.fqn = t.fqn;
      it.desc.type = ItemDesc::Type::kTensor;
      it.desc.dtype = t.dtype;
      it.desc.global_shape = t.shape;
      it.desc.chunk_offsets = c.offsets;
      it.desc.chunk_sizes = c.sizes;
      it.desc.path = t.path;
      int64_t elem_offset = 0;
      for (size_t d = 0; d < c.offsets.size(); ++d)
        elem_offset += c.offsets[d] * strides[d];
      // A strided view into the full tensor: the writer gathers it.
      it.tensor = TensorView{
          t.dtype, c.sizes, strides,
          full[k].data() +
              elem_offset * static_cast<int64_t>(ElementSize(t.dtype))};
      ranks[c.rank].push_back(std::move(it));
    }
  }
  for (size_t k = 0; k < objects.size(); ++k) {
    payloads[k] = EncodeTorchSaveObject(objects[k].value);
    for (int r = 0; r < kSampleRanks; ++r) {
      WriteItem it;
      it.desc.fqn = objects[k].fqn;
      it.desc.type = ItemDesc::Type::kBytes;
      it.desc.path = objects[k].path;
      it.bytes = payloads[k];
      ranks[r].push_back(std::move(it));
    }
  }
  CheckpointWriterOptions options;
  options.overwrite = overwrite;
  auto result = WriteCheckpoint(dir, ranks, options);
  if (!result.ok()) return Fail(result.status(), "write-sample " + dir);
  std::printf("wrote %s: %zu files, %" PRIu64 " data bytes, .metadata %" PRIu64
              " bytes\n",
              dir.c_str(), result->files, result->data_bytes,
              result->metadata_bytes);
  return 0;
}

// ---------------------------------------------------------------------------
// Reading.

absl::StatusOr<std::vector<int64_t>> ParseInts(std::string_view s) {
  std::vector<int64_t> out;
  if (s.empty() || s == "-" || s == "()" || s == "[]") return out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t end = s.find(',', pos);
    if (end == std::string_view::npos) end = s.size();
    std::string tok(s.substr(pos, end - pos));
    // Tolerate spaces and brackets: "(2, 3)".
    std::string clean;
    for (char c : tok) {
      if (c != ' ' && c != '(' && c != ')' && c != '[' && c != ']')
        clean.push_back(c);
    }
    if (clean.empty()) {
      if (end == s.size()) break;  // trailing comma
      return absl::InvalidArgumentError(
          fmt::format("bad integer list '{}'", s));
    }
    char* stop = nullptr;
    errno = 0;
    const long long v = std::strtoll(clean.c_str(), &stop, 10);
    if (errno != 0 || stop == nullptr || *stop != '\0') {
      return absl::InvalidArgumentError(
          fmt::format("bad integer '{}' in '{}'", clean, s));
    }
    out.push_back(v);
    pos = end + 1;
  }
  return out;
}

absl::StatusOr<std::unique_ptr<CheckpointReader>> OpenReader(
    const std::string& dir) {
  return CheckpointReader::Open(dir);
}

// One box of `read` (the reader is open already).
int ReadBox(CheckpointReader& reader, const std::string& fqn,
            std::string_view offsets_arg, std::string_view sizes_arg,
            std::string_view dtype_arg, const std::string& out_path) {
  auto offsets = ParseInts(offsets_arg);
  if (!offsets.ok()) return Fail(offsets.status(), "OFFSETS");
  auto sizes = ParseInts(sizes_arg);
  if (!sizes.ok()) return Fail(sizes.status(), "SIZES");
  DType dtype = DType::kFloat32;
  if (dtype_arg == "-" || dtype_arg.empty()) {
    const StorageMetadata* md = reader.metadata().Find(fqn);
    if (md == nullptr) return Fail(absl::NotFoundError("no such item"), fqn);
    const auto* tmd = std::get_if<TensorStorageMetadata>(md);
    if (tmd == nullptr)
      return Fail(absl::InvalidArgumentError("is a bytes item"), fqn);
    dtype = tmd->properties.dtype;
  } else {
    auto d = DTypeFromName(dtype_arg);
    if (!d.ok()) return Fail(d.status(), "DTYPE");
    dtype = *d;
  }
  const int64_t n = Numel(*sizes);
  if (n < 0) return Fail(absl::InvalidArgumentError("negative size"), "SIZES");
  std::string buf(static_cast<size_t>(n) * ElementSize(dtype), '\0');
  TensorRequest req;
  req.fqn = fqn;
  req.offsets = *offsets;
  req.dest = TensorDest{dtype, *sizes, {}, buf.data()};
  ReadStats stats;
  if (absl::Status s = reader.ReadTensors({&req, 1}, &stats); !s.ok()) {
    return Fail(s,
                fmt::format("read {} {}", fqn, DescribeBox(*offsets, *sizes)));
  }
  std::ofstream out(out_path, std::ios::binary | std::ios::trunc);
  out.write(buf.data(), static_cast<std::streamsize>(buf.size()));
  out.close();
  if (!out) return Fail(absl::InternalError("write failed"), out_path);
  return 0;
}

int Read(const std::string& dir, const std::string& fqn,
         std::string_view offsets_arg, std::string_view sizes_arg,
         std::string_view dtype_arg, const std::string& out_path) {
  auto reader = OpenReader(dir);
  if (!reader.ok()) return Fail(reader.status(), "open " + dir);
  return ReadBox(**reader, fqn, offsets_arg, sizes_arg, dtype_arg, out_path);
}

// `read` for every line of PLAN ("FQN<TAB>OFFSETS<TAB>SIZES<TAB>DTYPE<TAB>
// OUT.bin"), through one reader; stops at the first box that fails.
int ReadMany(const std::string& dir, const std::string& plan_path) {
  std::ifstream plan(plan_path);
  if (!plan) return Fail(absl::NotFoundError("cannot open"), plan_path);
  auto reader = OpenReader(dir);
  if (!reader.ok()) return Fail(reader.status(), "open " + dir);
  std::string line;
  for (int line_no = 1; std::getline(plan, line); ++line_no) {
    const std::vector<std::string> f = absl::StrSplit(line, '\t');
    if (f.size() != 5) {
      return Fail(absl::InvalidArgumentError("expected 5 tab-separated fields"),
                  fmt::format("{} line {}", plan_path, line_no));
    }
    if (int rc = ReadBox(**reader, f[0], f[1], f[2], f[3], f[4]); rc != 0) {
      return rc;
    }
  }
  return 0;
}

// PyValue::Repr() of each bytes item FQNS names, one line each.
int ReadObjects(const std::string& dir, const std::vector<std::string>& fqns) {
  auto reader = OpenReader(dir);
  if (!reader.ok()) return Fail(reader.status(), "open " + dir);
  for (const std::string& fqn : fqns) {
    auto value = (*reader)->ReadObject(fqn);
    if (!value.ok()) return Fail(value.status(), "read-object " + fqn);
    std::printf("%s\n", value->Repr().c_str());
  }
  return 0;
}

std::string PathRepr(const std::vector<PathElement>& path) {
  std::string out = "(";
  for (size_t k = 0; k < path.size(); ++k) {
    if (k) out += ", ";
    if (const auto* s = std::get_if<std::string>(&path[k])) {
      out += PyValue::Str(*s).Repr();
    } else {
      out += std::to_string(std::get<int64_t>(path[k]));
    }
  }
  if (path.size() == 1) out += ",";
  return out + ")";
}

std::string ShapeRepr(const std::vector<int64_t>& shape) {
  std::string out = "(";
  for (size_t k = 0; k < shape.size(); ++k) {
    if (k) out += ", ";
    out += std::to_string(shape[k]);
  }
  if (shape.size() == 1) out += ",";
  return out + ")";
}

nlohmann::json PathJson(const std::vector<PathElement>& path) {
  nlohmann::json j = nlohmann::json::array();
  for (const PathElement& e : path) {
    if (const auto* s = std::get_if<std::string>(&e)) {
      j.push_back(*s);
    } else {
      j.push_back(std::get<int64_t>(e));
    }
  }
  return j;
}

nlohmann::json StorageJson(const StorageInfo* info) {
  nlohmann::json j;
  if (info == nullptr) return j;  // null: no storage entry
  j["file"] = info->relative_path;
  j["offset"] = info->offset;
  j["length"] = info->length;
  j["transforms"] = info->transform_descriptors;
  return j;
}

int List(const std::string& dir, bool json) {
  auto reader = OpenReader(dir);
  if (!reader.ok()) return Fail(reader.status(), "open " + dir);
  const Metadata& md = (*reader)->metadata();
  // planner_data lookup.
  absl::flat_hash_map<std::string, const std::vector<PathElement>*> paths;
  if (md.planner_data.has_value()) {
    for (const auto& [fqn, path] : *md.planner_data) paths[fqn] = &path;
  }
  auto path_of =
      [&](const std::string& fqn) -> const std::vector<PathElement>* {
    auto it = paths.find(fqn);
    return it == paths.end() ? nullptr : it->second;
  };
  nlohmann::json items = nlohmann::json::array();
  for (const auto& [fqn, entry] : md.state_dict_metadata) {
    const std::vector<PathElement>* path = path_of(fqn);
    if (const auto* tmd = std::get_if<TensorStorageMetadata>(&entry)) {
      if (json) {
        nlohmann::json item;
        item["fqn"] = fqn;
        item["kind"] = "tensor";
        item["dtype"] = std::string(DTypeName(tmd->properties.dtype));
        item["shape"] = tmd->size;
        item["path"] = path ? PathJson(*path) : nlohmann::json();
        nlohmann::json chunks = nlohmann::json::array();
        for (const ChunkStorageMetadata& c : tmd->chunks) {
          nlohmann::json cj;
          cj["offsets"] = c.offsets;
          cj["sizes"] = c.sizes;
          cj["storage"] =
              StorageJson(md.FindStorage(StorageKey{fqn, true, c.offsets}));
          chunks.push_back(std::move(cj));
        }
        item["chunks"] = std::move(chunks);
        items.push_back(std::move(item));
      } else {
        std::string boxes;
        for (const ChunkStorageMetadata& c : tmd->chunks) {
          if (!boxes.empty()) boxes += ' ';
          boxes += DescribeBox(c.offsets, c.sizes);
        }
        std::printf("%s\ttensor\t%s\t%s\t%s\t%s\n", fqn.c_str(),
                    std::string(DTypeName(tmd->properties.dtype)).c_str(),
                    ShapeRepr(tmd->size).c_str(),
                    path ? PathRepr(*path).c_str() : "None", boxes.c_str());
      }
    } else {
      if (json) {
        nlohmann::json item;
        item["fqn"] = fqn;
        item["kind"] = "bytes";
        item["path"] = path ? PathJson(*path) : nlohmann::json();
        item["storage"] =
            StorageJson(md.FindStorage(StorageKey{fqn, false, {}}));
        items.push_back(std::move(item));
      } else {
        std::printf("%s\tbytes\t-\t-\t%s\t-\n", fqn.c_str(),
                    path ? PathRepr(*path).c_str() : "None");
      }
    }
  }
  if (json) {
    nlohmann::json doc;
    doc["dir"] = dir;
    doc["version"] =
        md.version.has_value() ? nlohmann::json(*md.version) : nlohmann::json();
    doc["has_storage_meta"] = md.storage_meta.has_value();
    doc["items"] = std::move(items);
    std::printf("%s\n", doc.dump(1).c_str());
  }
  return 0;
}

int Usage() {
  std::fprintf(stderr,
               "usage:\n"
               "  interop_tool write-sample DIR [--overwrite]\n"
               "  interop_tool read DIR FQN OFFSETS SIZES DTYPE OUT.bin\n"
               "  interop_tool read-many DIR PLAN\n"
               "  interop_tool read-object DIR FQN...\n"
               "  interop_tool list DIR [--json]\n");
  return 2;
}

int Main(int argc, char** argv) {
  if (argc < 3) return Usage();
  const std::string cmd = argv[1];
  if (cmd == "write-sample") {
    if (argc == 3) return WriteSample(argv[2], false);
    if (argc == 4 && std::string_view(argv[3]) == "--overwrite")
      return WriteSample(argv[2], true);
    return Usage();
  }
  if (cmd == "read" && argc == 8)
    return Read(argv[2], argv[3], argv[4], argv[5], argv[6], argv[7]);
  if (cmd == "read-many" && argc == 4) return ReadMany(argv[2], argv[3]);
  if (cmd == "read-object" && argc >= 4)
    return ReadObjects(argv[2],
                       std::vector<std::string>(argv + 3, argv + argc));
  if (cmd == "list") {
    if (argc == 3) return List(argv[2], false);
    if (argc == 4 && std::string_view(argv[3]) == "--json")
      return List(argv[2], true);
  }
  return Usage();
}

}  // namespace
}  // namespace ckptd::format

int main(int argc, char** argv) { return ckptd::format::Main(argc, argv); }
