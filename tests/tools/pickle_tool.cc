// Copyright 2026 The ckptd Authors.
//
// pickle_tool: drives the pickle reader/writer from tests/python.
//
//   pickle_tool render FILE        canonical rendering (see Render below),
//                                  compared with the same rendering computed
//                                  in Python by test_pickle_interop.py
//   pickle_tool debug FILE         DebugString of the root
//   pickle_tool check FILE         parse only; exit 0 "ok" or exit 1 + error
//   pickle_tool check-prefixes FILE
//                                  parse every proper prefix of FILE (each
//                                  copied to a buffer of its own size, so
//                                  ASan sees a read past its end); one line
//                                  per prefix: "N<TAB>ok" or "N<TAB>error"
//   pickle_tool bench FILE [N]     parse N times (default 3), print timings
//   pickle_tool write CASE OUT     write a protocol-2 pickle made with Writer
//
// Exit status: 0 ok, 1 parse error (message on stderr), 2 usage / I/O error.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "fmt/format.h"
#include "format/pickle/pickle.h"

namespace ckptd::pickle {
namespace {

using Kind = Value::Kind;

std::string Hex(std::string_view s) {
  std::string out;
  out.reserve(2 * s.size());
  for (unsigned char c : s) out += fmt::format("{:02x}", c);
  return out;
}

// Canonical rendering, mirrored by render() in test_pickle_interop.py.
//   None N, bool T/F, int i:<decimal> (int64) or I:<hex of the minimal
//   little-endian two's complement>, float f:<hex of the IEEE bits>,
//   str s:<hex of UTF-8>, bytes/bytearray b:<hex>, tuple (a,b),
//   global g:<module>.<name>.
//   Mutable values get a label "#n=" on first visit (pre-order) and render
//   as "@n" afterwards: list [a,b], dict {k:v,...}, set/frozenset <a,b>,
//   OrderedDict odict{k:v}, class instance obj:<module>.<qualname>(<state>).
// Protocol-2 spellings are lowered to what Python's loads() builds:
// _codecs.encode / bytes() / bytearray() → b:, set()/frozenset() → <..>,
// copyreg._reconstructor and NEWOBJ of a class → obj:.
class Renderer {
 public:
  std::string Render(const Value* v) {
    out_.clear();
    Visit(v);
    return out_;
  }

 private:
  // Emits "@n" and returns true if `v` was labeled before; else labels it.
  bool Label(const Value* v) {
    auto [it, inserted] = labels_.try_emplace(v, labels_.size());
    out_ += inserted ? fmt::format("#{}=", it->second)
                     : fmt::format("@{}", it->second);
    return !inserted;
  }

  void Items(const std::vector<const Value*>& items) {
    for (size_t k = 0; k < items.size(); ++k) {
      if (k > 0) out_ += ',';
      Visit(items[k]);
    }
  }

  void Entries(
      const std::vector<std::pair<const Value*, const Value*>>& entries) {
    for (size_t k = 0; k < entries.size(); ++k) {
      if (k > 0) out_ += ',';
      Visit(entries[k].first);
      out_ += ':';
      Visit(entries[k].second);
    }
  }

  static bool IsBuiltin(const Value& v, std::string_view name) {
    return v.IsCallTo("builtins", name) || v.IsCallTo("__builtin__", name);
  }

  void Object(const Value* v) {
    const std::vector<const Value*> no_args;
    const auto& args = v->args != nullptr ? v->args->items : no_args;
    if (auto bytes = AsBytes(*v); bytes.ok()) {
      out_ += "b:" + Hex(*bytes);
      return;
    }
    if (!v->newobj && IsBuiltin(*v, "bytearray")) {
      if (args.empty()) {
        out_ += "b:";
        return;
      }
      if (args.size() == 2 &&
          args[0]->kind == Kind::kString) {  // (str, 'latin-1')
        Value tmp;
        Value encode_fn;
        encode_fn.kind = Kind::kGlobal;
        encode_fn.module = "_codecs";
        encode_fn.name = "encode";
        tmp.kind = Kind::kObject;
        tmp.callable = &encode_fn;
        tmp.args = v->args;
        if (auto bytes = AsBytes(tmp); bytes.ok()) {
          out_ += "b:" + Hex(*bytes);
          return;
        }
      }
      if (args.size() == 1) {
        Visit(args[0]);
        return;
      }
    }
    if (!v->newobj && (IsBuiltin(*v, "set") || IsBuiltin(*v, "frozenset"))) {
      if (Label(v)) return;
      out_ += '<';
      if (args.size() == 1 && args[0] != nullptr) Items(args[0]->items);
      out_ += '>';
      return;
    }
    if (!v->newobj && v->IsCallTo("collections", "OrderedDict") &&
        args.empty()) {
      if (Label(v)) return;
      out_ += "odict{";
      Entries(v->entries);
      out_ += '}';
      return;
    }
    const Value* cls = nullptr;
    if (v->newobj && args.empty() && v->kwargs == nullptr) {
      cls = v->callable;
    } else if (!v->newobj &&
               (v->IsCallTo("copyreg", "_reconstructor") ||
                v->IsCallTo("copy_reg", "_reconstructor")) &&
               args.size() == 3) {
      cls = args[0];
    }
    if (cls != nullptr && cls->kind == Kind::kGlobal) {
      if (Label(v)) return;
      out_ += fmt::format("obj:{}.{}(", cls->module, cls->name);
      if (v->state != nullptr) {
        Visit(v->state);
      } else {
        out_ += 'N';
      }
      out_ += ')';
      return;
    }
    // Anything else: the raw call.
    if (Label(v)) return;
    out_ += v->newobj ? "new(" : "call(";
    Visit(v->callable);
    out_ += ',';
    Visit(v->args);
    if (v->kwargs != nullptr) {
      out_ += ',';
      Visit(v->kwargs);
    }
    out_ += ")[";
    Items(v->items);
    out_ += "]{";
    Entries(v->entries);
    out_ += '}';
    if (v->state != nullptr) {
      out_ += '=';
      Visit(v->state);
    }
  }

  void Visit(const Value* v) {
    if (v == nullptr) {
      out_ += "null";
      return;
    }
    switch (v->kind) {
      case Kind::kNone:
        out_ += 'N';
        break;
      case Kind::kBool:
        out_ += v->b ? 'T' : 'F';
        break;
      case Kind::kInt:
        out_ += fmt::format("i:{}", v->i);
        break;
      case Kind::kBigInt:
        out_ += "I:" + Hex(v->str);
        break;
      case Kind::kFloat: {
        uint64_t bits;
        std::memcpy(&bits, &v->f, 8);
        out_ += fmt::format("f:{:016x}", bits);
        break;
      }
      case Kind::kString:
        out_ += "s:" + Hex(v->str);
        break;
      case Kind::kBytes:
        out_ += "b:" + Hex(v->str);
        break;
      case Kind::kTuple:
        out_ += '(';
        Items(v->items);
        out_ += ')';
        break;
      case Kind::kList:
        if (Label(v)) break;
        out_ += '[';
        Items(v->items);
        out_ += ']';
        break;
      case Kind::kDict:
        if (Label(v)) break;
        out_ += '{';
        Entries(v->entries);
        out_ += '}';
        break;
      case Kind::kSet:
        if (Label(v)) break;
        out_ += '<';
        Items(v->items);
        out_ += '>';
        break;
      case Kind::kGlobal:
        out_ += fmt::format("g:{}.{}", v->module, v->name);
        break;
      case Kind::kPersId:
        out_ += "pid(";
        Visit(v->pid);
        out_ += ')';
        break;
      case Kind::kObject:
        Object(v);
        break;
    }
  }

  std::string out_;
  absl::flat_hash_map<const Value*, size_t> labels_;
};

// Pickles written with Writer, loaded by Python in test_pickle_interop.py.
// Globals under module "ckptd_test" are resolved by the test's find_class.
bool WriteCase(std::string_view name, std::string* out) {
  Writer w(out);
  w.Proto();
  if (name == "ints") {
    w.EmptyList();
    w.Mark();
    for (int64_t v : std::vector<int64_t>{0,
                                          1,
                                          127,
                                          128,
                                          255,
                                          256,
                                          65535,
                                          65536,
                                          -1,
                                          -128,
                                          -129,
                                          -256,
                                          -257,
                                          INT32_MAX,
                                          INT32_MIN,
                                          int64_t{INT32_MAX} + 1,
                                          int64_t{INT32_MIN} - 1,
                                          int64_t{1} << 40,
                                          -(int64_t{1} << 40),
                                          INT64_MAX,
                                          INT64_MIN,
                                          INT64_MAX - 1,
                                          INT64_MIN + 1}) {
      w.Int(v);
    }
    w.Appends();
  } else if (name == "scalars") {
    w.Mark();
    w.None();
    w.NewTrue();
    w.NewFalse();
    w.Float(1.5);
    w.Float(-0.0);
    w.Float(1e300);
    w.Float(std::numeric_limits<double>::infinity());
    w.Float(5e-324);
    w.String("");
    w.String("h\xc3\xa9llo \xf0\x9f\x98\x80");
    w.String(std::string("nul\0byte", 8));
    w.Tuple();
  } else if (name == "bytes") {
    w.EmptyList();
    w.Mark();
    w.Bytes("");
    w.Bytes(std::string("\x00\xff\x80\x7f", 4));
    std::string all;
    for (int c = 0; c < 256; ++c) all.push_back(static_cast<char>(c));
    w.Bytes(all);
    w.Appends();
  } else if (name == "nested") {
    // {"t": ((), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)), "l": [[], [None]],
    //  "d": {1: "one", (2,): {}}}
    w.EmptyDict();
    w.Mark();
    w.String("t");
    w.Mark();
    for (int n = 0; n <= 4; ++n) {
      std::vector<int64_t> v;
      for (int k = 1; k <= n; ++k) v.push_back(k);
      w.IntTuple(v);
    }
    w.Tuple();
    w.String("l");
    w.EmptyList();
    w.EmptyList();
    w.Append();
    w.EmptyList();
    w.None();
    w.Append();
    w.Append();
    w.String("d");
    w.EmptyDict();
    w.Int(1);
    w.String("one");
    w.SetItem();
    w.Int(2);
    w.Tuple1();
    w.EmptyDict();
    w.SetItem();
    w.SetItems();
  } else if (name == "memo") {
    // [OrderedDict(), OrderedDict(), "fqn", "fqn", "other", x, x] with
    // x = [7] stored with Put/Get at slot 1000 (LONG_BINPUT/LONG_BINGET).
    w.EmptyList();
    w.Mark();
    for (int k = 0; k < 2; ++k) {
      w.MemoGlobal("collections", "OrderedDict");
      w.EmptyTuple();
      w.Reduce();
    }
    w.MemoString("fqn");
    w.MemoString("fqn");
    w.MemoString("other");
    w.EmptyList();
    w.Int(7);
    w.Append();
    w.Put(1000);
    w.Get(1000);
    w.Appends();
  } else if (name == "objects") {
    // [OrderedDict(a=1, b=2), set([1, 2]), ckptd_test.Thing(x=1, y='s'),
    //  torch.Size((4, 6)), persid(('storage', 'k'))]
    w.EmptyList();
    w.Mark();
    w.Global("collections", "OrderedDict");
    w.EmptyTuple();
    w.Reduce();
    w.Mark();
    w.String("a");
    w.Int(1);
    w.String("b");
    w.Int(2);
    w.SetItems();
    w.Global("__builtin__", "set");
    w.EmptyList();
    w.Mark();
    w.Int(1);
    w.Int(2);
    w.Appends();
    w.Tuple1();
    w.Reduce();
    w.Global("ckptd_test", "Thing");
    w.EmptyTuple();
    w.NewObj();
    w.EmptyDict();
    w.String("x");
    w.Int(1);
    w.SetItem();
    w.String("y");
    w.String("s");
    w.SetItem();
    w.Build();
    w.Global("ckptd_test", "Size");
    w.IntTuple({4, 6});
    w.Tuple1();
    w.Reduce();
    w.String("storage");
    w.String("k");
    w.Tuple2();
    w.BinPersId();
    w.Appends();
  } else {
    return false;
  }
  w.Stop();
  return true;
}

bool ReadFile(const char* path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

int Usage() {
  std::fprintf(stderr,
               "usage: pickle_tool render|debug|check|check-prefixes FILE\n"
               "       pickle_tool bench FILE [N]\n"
               "       pickle_tool write CASE OUT\n");
  return 2;
}

int Main(int argc, char** argv) {
  if (argc < 3) return Usage();
  const std::string cmd = argv[1];
  if (cmd == "write") {
    if (argc != 4) return Usage();
    std::string out;
    if (!WriteCase(argv[2], &out)) {
      std::fprintf(stderr, "unknown case %s\n", argv[2]);
      return 2;
    }
    std::ofstream f(argv[3], std::ios::binary);
    f.write(out.data(), static_cast<std::streamsize>(out.size()));
    return f ? 0 : 2;
  }
  std::string data;
  if (!ReadFile(argv[2], &data)) {
    std::fprintf(stderr, "cannot read %s\n", argv[2]);
    return 2;
  }
  ReaderOptions options;
  options.source_name = argv[2];
  if (cmd == "check-prefixes") {
    for (size_t n = 0; n < data.size(); ++n) {
      const std::string prefix = data.substr(0, n);
      auto doc = Parse(prefix, options);
      std::printf("%zu\t%s\n", n,
                  doc.ok() ? "ok" : doc.status().ToString().c_str());
    }
    return 0;
  }
  if (cmd == "bench") {
    const int n = argc > 3 ? std::atoi(argv[3]) : 3;
    for (int k = 0; k < n; ++k) {
      const auto start = std::chrono::steady_clock::now();
      const std::clock_t cpu_start = std::clock();
      auto doc = Parse(data, options);
      const double s = std::chrono::duration<double>(
                           std::chrono::steady_clock::now() - start)
                           .count();
      const double cpu =
          static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
      if (!doc.ok()) {
        std::fprintf(stderr, "%s\n",
                     std::string(doc.status().message()).c_str());
        return 1;
      }
      const uint64_t accounted = (*doc)->allocated_bytes();
      const std::clock_t free_start = std::clock();
      doc = absl::InternalError("freed");
      const double free_cpu =
          static_cast<double>(std::clock() - free_start) / CLOCKS_PER_SEC;
      std::printf(
          "parse %zu bytes: %.3f s wall, %.3f s cpu (%.1f MB/s cpu), free %.3f "
          "s cpu, "
          "accounted %.1f MB\n",
          data.size(), s, cpu, data.size() / cpu / 1e6, free_cpu,
          accounted / 1e6);
    }
    return 0;
  }
  auto doc = Parse(data, options);
  if (!doc.ok()) {
    std::fprintf(stderr, "%s\n", doc.status().ToString().c_str());
    return 1;
  }
  if (cmd == "render") {
    std::printf("%s\n", Renderer().Render(&(*doc)->root()).c_str());
  } else if (cmd == "debug") {
    std::printf("%s\n", DebugString((*doc)->root(), 20, 1 << 20).c_str());
  } else if (cmd == "check") {
    std::printf("ok\n");
  } else {
    return Usage();
  }
  return 0;
}

}  // namespace
}  // namespace ckptd::pickle

int main(int argc, char** argv) { return ckptd::pickle::Main(argc, argv); }
