// Copyright 2026 The ckptd Authors.
//
// payload_tool: drives the torch.save zip writer/reader from tests/python.
//
//   payload_tool write OUT DTYPE SHAPE [options]
//       Writes torch.save(tensor) of a deterministic pattern with
//       ZipArchiveBuilder + AddTensorRecords. SHAPE is "2,3" ("" or
//       "scalar" for 0-d). Options:
//         --layout contiguous|transpose|strided   source view (default
//             contiguous): transpose = base of the reversed shape, permuted;
//             strided = base[1::2, 1::2, ...] of a (2n+1)-sized base
//         --seed N          pattern seed (default 1)
//         --raw FILE        the tensor's expected bytes, C order
//         --base FILE       the source base buffer (shape base_sizes, C order)
//         --pad-before N / --pad-after N   bytes around the archive
//         --zip64           force zip64 fields everywhere (test threshold 0)
//         --segments        write with segments() instead of FinishInto
//       Prints JSON: offset, length, dtype, sizes, base_sizes, source_strides,
//       source_offset (the source view into the base buffer, elements).
//   payload_tool read FILE [--offset N --length N] [--raw FILE]
//       Parses a torch.save(tensor) file; prints JSON dtype, sizes, strides,
//       storage_offset, storage_key, storage_nbytes, big_endian, record;
//       --raw writes the view's bytes in C order (byte-swapped to native if
//       the archive is big-endian).
//   payload_tool records FILE [--offset N --length N]
//       Lists the zip entries (name, data_offset, size, crc32, crc_ok) and
//       parses data.pkl (pickle: "ok" + debug rendering, or the error).
//
// Exit status: 0 ok, 1 format error (message on stderr), 2 usage / I/O.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "common/env.h"
#include "fmt/format.h"
#include "format/tensor/strided_copy.h"
#include "format/tensor/tensor_payload.h"
#include "format/zip/zip.h"
#include "nlohmann/json.hpp"

namespace ckptd::format {
namespace {

using json = nlohmann::json;

int Usage(const std::string& why) {
  std::fprintf(stderr,
               "%s\nusage: payload_tool write OUT DTYPE SHAPE [--layout L] "
               "[--seed N] [--raw F] [--base F] [--pad-before N] "
               "[--pad-after N] [--zip64] [--segments]\n"
               "       payload_tool read FILE [--offset N --length N] "
               "[--raw F]\n"
               "       payload_tool records FILE [--offset N --length N]\n",
               why.c_str());
  return 2;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "%s\n", s.ToString().c_str());
  return 1;
}

bool WriteFile(const std::string& path, std::string_view data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
  return static_cast<bool>(f);
}

// Flags after the positional arguments: "--name value" or "--name".
struct Flags {
  std::map<std::string, std::string> values;
  bool Has(const std::string& k) const { return values.count(k) > 0; }
  std::string Get(const std::string& k, const std::string& def = "") const {
    auto it = values.find(k);
    return it == values.end() ? def : it->second;
  }
  uint64_t GetU64(const std::string& k, uint64_t def) const {
    auto it = values.find(k);
    return it == values.end() ? def : std::stoull(it->second);
  }
};

bool ParseFlags(int argc, char** argv, int first, Flags* flags) {
  static const char* kBool[] = {"--zip64", "--segments"};
  for (int i = first; i < argc; ++i) {
    std::string k = argv[i];
    if (k.rfind("--", 0) != 0) return false;
    bool is_bool = false;
    for (const char* b : kBool) is_bool = is_bool || k == b;
    if (is_bool) {
      flags->values[k] = "1";
    } else {
      if (i + 1 >= argc) return false;
      flags->values[k] = argv[++i];
    }
  }
  return true;
}

std::vector<int64_t> ParseShape(const std::string& s) {
  std::vector<int64_t> out;
  if (s.empty() || s == "scalar") return out;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = s.find(',', pos);
    const std::string part =
        s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (!part.empty()) out.push_back(std::stoll(part));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

// Deterministic pattern bytes (splitmix64); bool elements are 0/1.
std::string Pattern(DType dtype, int64_t numel, uint64_t seed) {
  const size_t e = ElementSize(dtype);
  std::string out(static_cast<size_t>(numel) * e, '\0');
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 12345;
  for (size_t i = 0; i < out.size(); ++i) {
    x += 0x9e3779b97f4a7c15ULL;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    out[i] = static_cast<char>(dtype == DType::kBool ? (z & 1) : z);
  }
  return out;
}

// Element-by-element gather in C order (independent of StridedCopy).
std::string NaiveGather(const char* data, size_t e,
                        const std::vector<int64_t>& sizes,
                        const std::vector<int64_t>& strides) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  std::string out;
  std::vector<int64_t> idx(sizes.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = 0;
    for (size_t k = 0; k < idx.size(); ++k) off += idx[k] * strides[k];
    out.append(data + off * static_cast<int64_t>(e), e);
    for (size_t k = idx.size(); k-- > 0;) {
      if (++idx[k] < sizes[k]) break;
      idx[k] = 0;
    }
  }
  return out;
}

int Write(int argc, char** argv) {
  if (argc < 5) return Usage("write: missing arguments");
  const std::string out_path = argv[2];
  auto dtype = DTypeFromName(argv[3]);
  if (!dtype.ok()) return Usage(std::string(dtype.status().message()));
  const std::vector<int64_t> sizes = ParseShape(argv[4]);
  Flags flags;
  if (!ParseFlags(argc, argv, 5, &flags)) return Usage("bad flags");
  const std::string layout = flags.Get("--layout", "contiguous");
  const size_t e = ElementSize(*dtype);

  // The source view into a base buffer.
  std::vector<int64_t> base_sizes, strides;
  int64_t base_offset = 0;
  const size_t nd = sizes.size();
  if (layout == "contiguous") {
    base_sizes = sizes;
    strides = ContiguousStrides(sizes);
  } else if (layout == "transpose") {
    base_sizes.assign(sizes.rbegin(), sizes.rend());
    const std::vector<int64_t> bs = ContiguousStrides(base_sizes);
    strides.assign(bs.rbegin(), bs.rend());
  } else if (layout == "strided") {
    for (int64_t s : sizes) base_sizes.push_back(2 * s + 1);
    const std::vector<int64_t> bs = ContiguousStrides(base_sizes);
    for (size_t k = 0; k < nd; ++k) {
      strides.push_back(2 * bs[k]);
      base_offset += bs[k];
    }
  } else {
    return Usage("unknown --layout " + layout);
  }
  int64_t base_numel = 1;
  for (int64_t s : base_sizes) base_numel *= s;
  const std::string base =
      Pattern(*dtype, base_numel, flags.GetU64("--seed", 1));

  TensorView view;
  view.dtype = *dtype;
  view.sizes = sizes;
  view.strides = strides;
  view.data = base.data() + base_offset * static_cast<int64_t>(e);
  const std::string expected =
      view.numel() == 0 ? std::string()
                        : NaiveGather(view.data, e, sizes, strides);

  if (flags.Has("--zip64")) ZipArchiveBuilder::SetZip64ThresholdForTest(0);
  ZipArchiveBuilder builder;
  std::string scratch;
  AddTensorRecords(view, &builder, &scratch);
  const uint64_t pad_before = flags.GetU64("--pad-before", 0);
  const uint64_t pad_after = flags.GetU64("--pad-after", 0);
  std::string file(pad_before, '\xab');
  if (flags.Has("--segments")) {
    builder.Finish();
    for (std::string_view s : builder.segments()) file.append(s);
  } else {
    file.resize(pad_before + builder.size());
    builder.FinishInto(file.data() + pad_before);
  }
  file.append(pad_after, '\xcd');
  if (!WriteFile(out_path, file)) return Usage("cannot write " + out_path);
  if (flags.Has("--raw") && !WriteFile(flags.Get("--raw"), expected)) {
    return Usage("cannot write --raw");
  }
  if (flags.Has("--base") && !WriteFile(flags.Get("--base"), base)) {
    return Usage("cannot write --base");
  }
  json j;
  j["offset"] = pad_before;
  j["length"] = builder.size();
  j["dtype"] = std::string(DTypeName(*dtype));
  j["sizes"] = sizes;
  j["base_sizes"] = base_sizes;
  j["source_strides"] = strides;
  j["source_offset"] = base_offset;
  std::cout << j.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
  return 0;
}

struct Opened {
  std::unique_ptr<RandomAccessFile> file;
  std::unique_ptr<ZipArchiveReader> reader;
};

absl::StatusOr<Opened> OpenArchive(const std::string& path,
                                   const Flags& flags) {
  Opened o;
  auto file = Env::Default()->NewRandomAccessFile(path);
  if (!file.ok()) return file.status();
  o.file = std::move(*file);
  const uint64_t offset = flags.GetU64("--offset", 0);
  const uint64_t length = flags.GetU64(
      "--length", o.file->Size() >= offset ? o.file->Size() - offset : 0);
  auto reader = ZipArchiveReader::Open(o.file.get(), offset, length);
  if (!reader.ok()) return reader.status();
  o.reader = std::move(*reader);
  return o;
}

int Read(int argc, char** argv) {
  if (argc < 3) return Usage("read: missing FILE");
  Flags flags;
  if (!ParseFlags(argc, argv, 3, &flags)) return Usage("bad flags");
  auto o = OpenArchive(argv[2], flags);
  if (!o.ok()) return Fail(o.status());
  auto rec = ParseTensorPayload(*o->reader);
  if (!rec.ok()) return Fail(rec.status());
  json j;
  j["dtype"] = std::string(DTypeName(rec->dtype));
  j["sizes"] = rec->sizes;
  j["strides"] = rec->strides;
  j["storage_offset"] = rec->storage_offset;
  j["storage_key"] = rec->storage_key;
  j["storage_nbytes"] = rec->storage_nbytes;
  j["big_endian"] = rec->big_endian;
  j["record"] = rec->entry->name;
  if (flags.Has("--raw")) {
    const size_t e = ElementSize(rec->dtype);
    std::string storage(rec->storage_nbytes, '\0');
    if (absl::Status s = o->reader->ReadRange(*rec->entry, 0, storage.size(),
                                              storage.data());
        !s.ok()) {
      return Fail(s);
    }
    int64_t n = 1;
    for (int64_t s : rec->sizes) n *= s;
    std::string out(static_cast<size_t>(n) * e, '\0');
    if (n > 0) {
      StridedCopy(e, rec->sizes,
                  storage.data() + rec->storage_offset * static_cast<int64_t>(e),
                  rec->strides, out.data(), ContiguousStrides(rec->sizes));
    }
    if (rec->big_endian) {
      // Complex numbers swap each component.
      const bool complex =
          rec->dtype == DType::kComplex64 || rec->dtype == DType::kComplex128;
      const size_t w = complex ? e / 2 : e;
      for (size_t i = 0; i + w <= out.size(); i += w) {
        std::reverse(out.begin() + i, out.begin() + i + w);
      }
    }
    if (!WriteFile(flags.Get("--raw"), out)) return Usage("cannot write --raw");
  }
  std::cout << j.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
  return 0;
}

int Records(int argc, char** argv) {
  if (argc < 3) return Usage("records: missing FILE");
  Flags flags;
  if (!ParseFlags(argc, argv, 3, &flags)) return Usage("bad flags");
  auto o = OpenArchive(argv[2], flags);
  if (!o.ok()) return Fail(o.status());
  json j;
  j["prefix"] = o->reader->prefix();
  j["entries"] = json::array();
  for (const ZipEntry& e : o->reader->entries()) {
    json je;
    je["name"] = e.name;
    je["data_offset"] = e.data_offset;
    je["size"] = e.size;
    je["crc32"] = e.crc32;
    je["crc_ok"] = o->reader->VerifyCrc(e).ok();
    j["entries"].push_back(je);
  }
  if (const ZipEntry* pkl = o->reader->Find("data.pkl"); pkl != nullptr) {
    auto data = o->reader->ReadRecord(*pkl, uint64_t{64} << 20);
    if (!data.ok()) return Fail(data.status());
    auto doc = pickle::Parse(*data);
    if (doc.ok()) {
      j["pickle"] = "ok";
      j["pickle_debug"] = pickle::DebugString((*doc)->root());
    } else {
      j["pickle"] = std::string(doc.status().message());
    }
  }
  std::cout << j.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
  return 0;
}

}  // namespace
}  // namespace ckptd::format

int main(int argc, char** argv) {
  if (argc < 2) return ckptd::format::Usage("missing subcommand");
  const std::string cmd = argv[1];
  try {
    if (cmd == "write") return ckptd::format::Write(argc, argv);
    if (cmd == "read") return ckptd::format::Read(argc, argv);
    if (cmd == "records") return ckptd::format::Records(argc, argv);
  } catch (const std::exception& e) {  // std::stoll on bad numbers
    return ckptd::format::Usage(std::string("bad argument: ") + e.what());
  }
  return ckptd::format::Usage("unknown subcommand " + cmd);
}
