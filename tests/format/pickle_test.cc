// Copyright 2026 The ckptd Authors.
//
// Tests for the pickle reader VM and writer (format/pickle/pickle.h). Python
// cross-checks live in tests/python/test_pickle_interop.py.
#include "format/pickle/pickle.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tests/testing/sanitizers.h"
#include "tests/testing/test_util.h"

namespace ckptd::pickle {
namespace {

using Kind = Value::Kind;

// Bytes from a list of byte values / characters (avoids "\x01e"-style
// escape pitfalls in string literals).
std::string B(std::initializer_list<int> bytes) {
  std::string s;
  for (int b : bytes) s.push_back(static_cast<char>(b));
  return s;
}

std::string LE(uint64_t v, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
  return s;
}

// Writes PROTO 2, calls `body`, then STOP.
template <typename F>
std::string Program(F body) {
  std::string out;
  Writer w(&out);
  w.Proto();
  body(w);
  w.Stop();
  return out;
}

ReaderOptions Named(std::string name) {
  ReaderOptions o;
  o.source_name = std::move(name);
  return o;
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// --- Writer -> reader round trips ---------------------------------------

TEST(PickleRoundTrip, IntsAtEveryBoundary) {
  const std::vector<int64_t> values = {0,
                                       1,
                                       127,
                                       128,
                                       255,
                                       256,
                                       65535,
                                       65536,
                                       -1,
                                       -127,
                                       -128,
                                       -129,
                                       -255,
                                       -256,
                                       -257,
                                       -65536,
                                       INT32_MAX,
                                       INT32_MIN,
                                       int64_t{INT32_MAX} + 1,
                                       int64_t{INT32_MIN} - 1,
                                       int64_t{UINT32_MAX},
                                       int64_t{UINT32_MAX} + 1,
                                       int64_t{1} << 39,
                                       -(int64_t{1} << 39),
                                       (int64_t{1} << 55) - 1,
                                       int64_t{1} << 55,
                                       -(int64_t{1} << 55),
                                       -(int64_t{1} << 55) - 1,
                                       INT64_MAX,
                                       INT64_MIN,
                                       INT64_MAX - 1,
                                       INT64_MIN + 1};
  for (int64_t v : values) {
    const std::string data = Program([&](Writer& w) { w.Int(v); });
    ASSERT_OK_AND_ASSIGN(auto doc, Parse(data));
    EXPECT_EQ(doc->root().kind, Kind::kInt) << v;
    EXPECT_EQ(doc->root().i, v);
    ASSERT_OK_AND_ASSIGN(int64_t got, AsInt(doc->root()));
    EXPECT_EQ(got, v);
  }
  // The writer picks the smallest opcode.
  EXPECT_EQ(Program([](Writer& w) { w.Int(255); })[2], 'K');
  EXPECT_EQ(Program([](Writer& w) { w.Int(256); })[2], 'M');
  EXPECT_EQ(Program([](Writer& w) { w.Int(-1); })[2], 'J');
  EXPECT_EQ(Program([](Writer& w) { w.Int(int64_t{1} << 31); })[2], '\x8a');
  EXPECT_EQ(Program([](Writer& w) { w.Int(int64_t{1} << 31); })[3], 5);
  EXPECT_EQ(Program([](Writer& w) { w.Int(INT64_MIN); })[3], 8);
}

TEST(PickleReader, Long1AndLong4) {
  // 2^64: nine bytes, beyond int64 -> kBigInt with the raw bytes.
  ASSERT_OK_AND_ASSIGN(
      auto big, Parse(B({0x80, 2, 0x8a, 9, 0, 0, 0, 0, 0, 0, 0, 0, 1, '.'})));
  EXPECT_EQ(big->root().kind, Kind::kBigInt);
  EXPECT_EQ(big->root().str, B({0, 0, 0, 0, 0, 0, 0, 0, 1}));
  EXPECT_EQ(DebugString(big->root()), "18446744073709551616");
  EXPECT_FALSE(AsInt(big->root()).ok());
  // -2^64 - 1 in LONG4.
  ASSERT_OK_AND_ASSIGN(
      auto neg, Parse(B({0x8b, 9, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                         0xff, 0xff, 0xfe, '.'})));
  EXPECT_EQ(neg->root().kind, Kind::kBigInt);
  EXPECT_EQ(DebugString(neg->root()), "-18446744073709551617");
  // Non-minimal encodings of small values are still kInt.
  ASSERT_OK_AND_ASSIGN(
      auto padded, Parse(B({0x8a, 10, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                            0xff, 0xff, 0xff, '.'})));
  EXPECT_EQ(padded->root().kind, Kind::kInt);
  EXPECT_EQ(padded->root().i, -2);
  // Redundant sign bytes are dropped from kBigInt.
  ASSERT_OK_AND_ASSIGN(
      auto padded_big,
      Parse(B({0x8a, 11, 0, 0, 0, 0, 0, 0, 0, 0x80, 0, 0, 0, '.'})));
  EXPECT_EQ(padded_big->root().kind, Kind::kBigInt);
  EXPECT_EQ(padded_big->root().str.size(), 9u);
  // LONG1 of length 0 is 0; INT64_MIN exactly.
  ASSERT_OK_AND_ASSIGN(auto zero, Parse(B({0x8a, 0, '.'})));
  EXPECT_EQ(zero->root().i, 0);
  ASSERT_OK_AND_ASSIGN(auto min,
                       Parse(B({0x8a, 8, 0, 0, 0, 0, 0, 0, 0, 0x80, '.'})));
  EXPECT_EQ(min->root().kind, Kind::kInt);
  EXPECT_EQ(min->root().i, INT64_MIN);
}

TEST(PickleRoundTrip, Floats) {
  const double values[] = {0.0,
                           -0.0,
                           1.5,
                           -2.25,
                           1e300,
                           5e-324,
                           std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity(),
                           std::numeric_limits<double>::quiet_NaN()};
  for (double v : values) {
    ASSERT_OK_AND_ASSIGN(auto doc,
                         Parse(Program([&](Writer& w) { w.Float(v); })));
    ASSERT_EQ(doc->root().kind, Kind::kFloat);
    uint64_t a, b;
    std::memcpy(&a, &v, 8);
    std::memcpy(&b, &doc->root().f, 8);
    EXPECT_EQ(a, b) << v;
  }
}

TEST(PickleRoundTrip, Strings) {
  std::string all_planes = "a\xc3\xa9\xe6\x97\xa5\xf0\x9f\x98\x80";
  const std::vector<std::string> values = {
      "", "x", all_planes, std::string("n\0l", 3), std::string(70000, 'q')};
  for (const std::string& v : values) {
    ASSERT_OK_AND_ASSIGN(auto doc,
                         Parse(Program([&](Writer& w) { w.String(v); })));
    ASSERT_OK_AND_ASSIGN(std::string_view got, AsString(doc->root()));
    EXPECT_EQ(got, v);
  }
}

TEST(PickleRoundTrip, BytesViaCodecsEncode) {
  std::string all;
  for (int c = 0; c < 256; ++c) all.push_back(static_cast<char>(c));
  for (const std::string& v : {std::string(), std::string("abc"), all}) {
    ASSERT_OK_AND_ASSIGN(auto doc,
                         Parse(Program([&](Writer& w) { w.Bytes(v); })));
    const Value& root = doc->root();
    EXPECT_EQ(root.kind, Kind::kObject);
    EXPECT_TRUE(root.IsCallTo("_codecs", "encode"));
    EXPECT_TRUE(root.IsGlobal("_codecs", "encode"));
    ASSERT_OK_AND_ASSIGN(std::string got, AsBytes(root));
    EXPECT_EQ(got, v);
  }
  // The binary opcodes.
  for (const std::string& data :
       {B({'C', 2, 'h', 'i', '.'}), B({'B', 2, 0, 0, 0, 'h', 'i', '.'}),
        B({0x8e, 2, 0, 0, 0, 0, 0, 0, 0, 'h', 'i', '.'}),
        B({0x96, 2, 0, 0, 0, 0, 0, 0, 0, 'h', 'i', '.'})}) {
    ASSERT_OK_AND_ASSIGN(auto doc, Parse(data));
    EXPECT_EQ(doc->root().kind, Kind::kBytes);
    ASSERT_OK_AND_ASSIGN(std::string got, AsBytes(doc->root()));
    EXPECT_EQ(got, "hi");
  }
  // Empty bytes in protocol 2: builtins.bytes().
  ASSERT_OK_AND_ASSIGN(auto empty, Parse(Program([](Writer& w) {
                         w.Global("__builtin__", "bytes");
                         w.EmptyTuple();
                         w.Reduce();
                       })));
  ASSERT_OK_AND_ASSIGN(std::string got, AsBytes(empty->root()));
  EXPECT_EQ(got, "");
  ASSERT_OK_AND_ASSIGN(auto str,
                       Parse(Program([](Writer& w) { w.String("x"); })));
  EXPECT_EQ(Message(AsBytes(str->root()).status()),
            "expected bytes, got str 'x'");
}

TEST(PickleRoundTrip, ScalarsAndGlobals) {
  ASSERT_OK_AND_ASSIGN(auto doc, Parse(Program([](Writer& w) {
                         w.Mark();
                         w.None();
                         w.NewTrue();
                         w.NewFalse();
                         w.Global("torch", "float32");
                         w.Tuple();
                       })));
  const Value& t = doc->root();
  ASSERT_EQ(t.kind, Kind::kTuple);
  ASSERT_EQ(t.items.size(), 4u);
  EXPECT_TRUE(t.items[0]->is_none());
  EXPECT_EQ(t.items[1]->kind, Kind::kBool);
  EXPECT_TRUE(t.items[1]->b);
  EXPECT_FALSE(t.items[2]->b);
  EXPECT_EQ(t.items[3]->kind, Kind::kGlobal);
  EXPECT_EQ(t.items[3]->module, "torch");
  EXPECT_EQ(t.items[3]->name, "float32");
  EXPECT_TRUE(t.items[3]->IsGlobal("torch", "float32"));
  EXPECT_FALSE(t.items[3]->IsGlobal("torch", "float16"));
  EXPECT_FALSE(t.items[3]->IsCallTo("torch", "float32"));
  EXPECT_EQ(DebugString(t), "(None, True, False, torch.float32)");
}

TEST(PickleRoundTrip, NestedContainers) {
  ASSERT_OK_AND_ASSIGN(auto doc, Parse(Program([](Writer& w) {
                         w.EmptyDict();
                         w.Mark();
                         w.String("tuples");
                         w.Mark();
                         for (int n = 0; n <= 5; ++n) {
                           std::vector<int64_t> v;
                           for (int k = 0; k < n; ++k) v.push_back(k * 1000);
                           w.IntTuple(v);
                         }
                         w.Tuple();
                         w.String("list");
                         w.EmptyList();
                         w.Int(1);
                         w.Append();
                         w.Mark();
                         w.Int(2);
                         w.EmptyList();
                         w.Appends();
                         w.String("dict");
                         w.EmptyDict();
                         w.Int(5);
                         w.String("five");
                         w.SetItem();
                         w.SetItems();
                         w.String("single");
                         w.Int(-7);
                         w.SetItem();
                       })));
  const Value& root = doc->root();
  ASSERT_EQ(root.kind, Kind::kDict);
  ASSERT_EQ(root.entries.size(), 4u);
  const Value* tuples = root.Get("tuples");
  ASSERT_NE(tuples, nullptr);
  ASSERT_EQ(tuples->items.size(), 6u);
  for (int n = 0; n <= 5; ++n) {
    ASSERT_OK_AND_ASSIGN(std::vector<int64_t> v,
                         AsIntVector(*tuples->items[n]));
    ASSERT_EQ(v.size(), static_cast<size_t>(n));
    for (int k = 0; k < n; ++k) EXPECT_EQ(v[k], k * 1000);
  }
  const Value* list = root.Get("list");
  ASSERT_NE(list, nullptr);
  EXPECT_EQ(DebugString(*list), "[1, 2, []]");
  EXPECT_EQ(DebugString(*root.Get("dict")), "{5: 'five'}");
  EXPECT_EQ(root.Get("single")->i, -7);
  EXPECT_EQ(root.Get("missing"), nullptr);
  EXPECT_EQ(list->Get("x"), nullptr);  // not a dict
}

TEST(PickleRoundTrip, MemoPutGetAndHelpers) {
  ASSERT_OK_AND_ASSIGN(auto doc, Parse(Program([](Writer& w) {
                         w.Mark();
                         w.MemoGlobal("torch", "Size");
                         w.MemoString("fqn");
                         w.MemoGlobal("torch", "Size");
                         w.MemoString("fqn");
                         w.MemoString("other");
                         w.Tuple();
                       })));
  const auto& items = doc->root().items;
  ASSERT_EQ(items.size(), 5u);
  EXPECT_EQ(items[0], items[2]);  // BINGET yields the same value
  EXPECT_EQ(items[1], items[3]);
  EXPECT_NE(items[1], items[4]);
  EXPECT_EQ(items[3]->str, "fqn");

  ASSERT_OK_AND_ASSIGN(auto manual, Parse(Program([](Writer& w) {
                         w.EmptyList();
                         w.Put(300);  // LONG_BINPUT
                         w.Int(1);
                         w.Append();
                         w.Get(300);  // LONG_BINGET
                         w.Append();
                       })));
  const Value& root = manual->root();
  ASSERT_EQ(root.items.size(), 2u);
  EXPECT_EQ(root.items[1], &root);  // a cycle
  EXPECT_EQ(DebugString(root), "[1, ...]");
}

TEST(PickleRoundTrip, ObjectsReduceNewObjBuildPersId) {
  ASSERT_OK_AND_ASSIGN(auto doc, Parse(Program([](Writer& w) {
                         w.Mark();
                         // torch.Size((4, 6))
                         w.Global("torch", "Size");
                         w.IntTuple({4, 6});
                         w.Tuple1();
                         w.Reduce();
                         // OrderedDict() with items
                         w.Global("collections", "OrderedDict");
                         w.EmptyTuple();
                         w.Reduce();
                         w.Mark();
                         w.String("a");
                         w.Int(1);
                         w.String("a");
                         w.Int(2);
                         w.SetItems();
                         w.String("b");
                         w.Int(3);
                         w.SetItem();
                         // Dataclass: cls.__new__(cls) + BUILD
                         w.Global("m", "Chunk");
                         w.EmptyTuple();
                         w.NewObj();
                         w.EmptyDict();
                         w.String("sizes");
                         w.IntTuple({2, 6});
                         w.SetItem();
                         w.Build();
                         // persistent id
                         w.String("storage");
                         w.Global("torch", "FloatStorage");
                         w.Tuple2();
                         w.BinPersId();
                         w.Tuple();
                       })));
  const auto& items = doc->root().items;
  ASSERT_EQ(items.size(), 4u);
  const Value& size = *items[0];
  EXPECT_TRUE(size.IsCallTo("torch", "Size"));
  EXPECT_TRUE(size.IsGlobal("torch", "Size"));
  EXPECT_FALSE(size.newobj);
  ASSERT_EQ(size.args->items.size(), 1u);
  ASSERT_OK_AND_ASSIGN(std::vector<int64_t> dims,
                       AsIntVector(*size.args->items[0]));
  EXPECT_EQ(dims, (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(DebugString(size), "torch.Size((4, 6))");

  const Value& od = *items[1];
  EXPECT_TRUE(od.IsCallTo("collections", "OrderedDict"));
  ASSERT_EQ(od.entries.size(), 3u);  // duplicates kept
  EXPECT_EQ(od.Get("a")->i, 2);      // the last one wins, as in Python
  EXPECT_EQ(od.Get("b")->i, 3);
  EXPECT_EQ(DebugString(od),
            "collections.OrderedDict(){'a': 1, 'a': 2, 'b': 3}");

  const Value& chunk = *items[2];
  EXPECT_TRUE(chunk.newobj);
  ASSERT_NE(chunk.state, nullptr);
  EXPECT_EQ(DebugString(*chunk.state->Get("sizes")), "(2, 6)");
  EXPECT_EQ(DebugString(chunk), "m.Chunk.__new__() state={'sizes': (2, 6)}");

  const Value& pid = *items[3];
  EXPECT_EQ(pid.kind, Kind::kPersId);
  EXPECT_EQ(DebugString(*pid.pid), "('storage', torch.FloatStorage)");
}

// Protocol 4/5 opcodes the Writer does not emit, built by hand.
TEST(PickleReader, Protocol4Opcodes) {
  std::string body;
  body += B({0x8c, 1}) + "m";     // SHORT_BINUNICODE 'm'
  body += B({0x94});              // MEMOIZE -> 0
  body += B({0x8c, 1}) + "C";     // 'C'
  body += B({0x94, 0x93, 0x94});  // MEMOIZE, STACK_GLOBAL, MEMOIZE -> 2
  body += B({')', '}', 0x92});    // () {} NEWOBJ_EX
  body += B({0x8f, '(', 'K', 1, 'K', 2, 0x90});  // EMPTY_SET MARK 1 2 ADDITEMS
  body += B({'(', 'K', 3, 0x91});                // FROZENSET {3}
  body += B({0x8d}) + LE(2, 8) + "\xc3\xa9";     // BINUNICODE8 'é'
  body += B({0x87});                             // TUPLE3
  body += B({'h', 2, 'e', '.'});                 // BINGET 2 (the global)
  const std::string data =
      B({0x80, 4, 0x95}) + LE(body.size() + 2, 8) + B({']', '('}) + body;
  ASSERT_OK_AND_ASSIGN(auto doc, Parse(data));
  const auto& items = doc->root().items;
  ASSERT_EQ(items.size(), 3u);
  const Value& obj = *items[0];
  EXPECT_TRUE(obj.IsCallTo("m", "C"));
  EXPECT_TRUE(obj.newobj);
  ASSERT_NE(obj.kwargs, nullptr);
  EXPECT_EQ(obj.kwargs->kind, Kind::kDict);
  EXPECT_EQ(DebugString(*items[1]), "({1, 2}, {3}, '\xc3\xa9')");
  EXPECT_EQ(items[2], obj.callable);
}

TEST(PickleReader, TextOpcodes) {
  // Protocol 0 as CPython writes it, plus the protocol-1 string opcodes.
  const std::string data =
      "(lp0\n("
      "I42\nI-7\nI01\nL123456789012345678901234567890L\nF1.25\nFinf\n"
      "S'a\\x41\\101\\n\\''\n"
      "Va\\u00e9\\U0001f600\\\\u0041\n"
      "p1\ng1\n"
      "(dp2\nVk\nNs"
      "(I1\nI2\nt"
      "(ccollections\nOrderedDict\n(to"
      "(I3\nimod\nCls\n"
      "Ppid\n" +
      B({'U', 2}) + "hi" + B({'T', 1, 0, 0, 0}) + "x" + "e.";
  ASSERT_OK_AND_ASSIGN(auto doc, Parse(data));
  const auto& it = doc->root().items;
  ASSERT_EQ(it.size(), 16u) << DebugString(doc->root());
  EXPECT_EQ(it[0]->i, 42);
  EXPECT_EQ(it[1]->i, -7);
  EXPECT_EQ(it[2]->kind, Kind::kBool);
  EXPECT_EQ(it[3]->kind, Kind::kBigInt);
  EXPECT_EQ(DebugString(*it[3]), "123456789012345678901234567890");
  EXPECT_EQ(it[4]->f, 1.25);
  EXPECT_TRUE(std::isinf(it[5]->f));
  EXPECT_EQ(it[6]->str, "aAA\n'");
  EXPECT_EQ(it[7]->str, "a\xc3\xa9\xf0\x9f\x98\x80\\\\u0041");
  EXPECT_EQ(it[8], it[7]);  // PUT/GET
  EXPECT_EQ(DebugString(*it[9]), "{'k': None}");
  EXPECT_EQ(DebugString(*it[10]), "(1, 2)");
  EXPECT_TRUE(it[11]->IsCallTo("collections", "OrderedDict"));  // OBJ
  EXPECT_TRUE(it[12]->IsCallTo("mod", "Cls"));                  // INST
  EXPECT_EQ(DebugString(*it[12]->args), "(3,)");
  EXPECT_EQ(it[13]->kind, Kind::kPersId);
  EXPECT_EQ(it[13]->pid->str, "pid");
  EXPECT_EQ(it[14]->str, "hi");
  EXPECT_EQ(it[15]->str, "x");
}

TEST(PickleReader, PopAndPopMarkAndDup) {
  ASSERT_OK_AND_ASSIGN(auto doc, Parse(B({'K', 1, 'K', 2, '0', '(', 'K', 3, 'K',
                                          4, '1', '2', 0x86, '.'})));
  EXPECT_EQ(DebugString(doc->root()), "(1, 1)");
  // Like CPython, POP with nothing above the MARK drops the MARK.
  ASSERT_OK_AND_ASSIGN(auto popped, Parse(B({'K', 1, '(', '0', 0x85, '.'})));
  EXPECT_EQ(DebugString(popped->root()), "(1,)");
  auto no_mark = Parse(B({'(', '0', 'K', 1, 't', '.'}));
  EXPECT_EQ(no_mark.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PickleReader, TrailingBytesAfterStopIgnored) {
  ASSERT_OK_AND_ASSIGN(auto doc, Parse(B({'K', 9, '.', 0xff, 0xff})));
  EXPECT_EQ(doc->root().i, 9);
}

// --- Errors -----------------------------------------------------------------

// A pickle using every Writer opcode.
std::string Kitchen() {
  return Program([](Writer& w) {
    w.EmptyDict();
    w.Mark();
    w.MemoString("a");
    w.IntTuple({1, 300, 70000, int64_t{1} << 40, -5});
    w.MemoString("b");
    w.Bytes(std::string("\x00\xff", 2));
    w.MemoString("c");
    w.EmptyList();
    w.Float(2.5);
    w.Append();
    w.Mark();
    w.None();
    w.NewTrue();
    w.NewFalse();
    w.Appends();
    w.MemoString("d");
    w.MemoGlobal("collections", "OrderedDict");
    w.EmptyTuple();
    w.Reduce();
    w.MemoString("a");
    w.Int(1);
    w.SetItem();
    w.MemoString("e");
    w.MemoGlobal("m", "C");
    w.EmptyTuple();
    w.NewObj();
    w.EmptyDict();
    w.Build();
    w.MemoString("f");
    w.String("storage");
    w.Tuple1();
    w.BinPersId();
    w.MemoString("g");
    w.Int(1);
    w.Int(2);
    w.Int(3);
    w.Tuple3();
    w.Put(500);
    w.SetItems();
  });
}

TEST(PickleErrors, EveryTruncationIsAnError) {
  const std::string data = Kitchen();
  ASSERT_OK(Parse(data));
  for (size_t n = 0; n < data.size(); ++n) {
    auto r = Parse(std::string_view(data).substr(0, n), Named("/ckpt/x.pkl"));
    ASSERT_FALSE(r.ok()) << "prefix " << n;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
        << r.status();
    EXPECT_EQ(Message(r.status()).rfind("/ckpt/x.pkl: offset ", 0), 0u)
        << r.status();
  }
}

TEST(PickleErrors, MessageFormat) {
  auto unknown = Parse(B({0x80, 2, 0xff, '.'}), Named("/ckpt/.metadata"));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(unknown.status()),
            "/ckpt/.metadata: offset 2: opcode 0xff (unknown): unknown opcode");
  auto reduce = Parse(B({0x80, 2, 'N', 'R', '.'}));
  EXPECT_EQ(
      Message(reduce.status()),
      "<pickle>: offset 3: opcode 0x52 'R' (REDUCE): stack underflow: needs 2 "
      "values, 1 available");
  auto eof = Parse(B({0x80, 2, 'N'}));
  EXPECT_EQ(Message(eof.status()),
            "<pickle>: offset 3: unexpected end of data (no STOP opcode)");
  auto ext = Parse(B({0x82, 1, '.'}));
  EXPECT_EQ(Message(ext.status()),
            "<pickle>: offset 0: opcode 0x82 (EXT1): unsupported opcode");
  auto trunc = Parse(B({'J', 1, 2}));
  EXPECT_EQ(Message(trunc.status()),
            "<pickle>: offset 0: opcode 0x4a 'J' (BININT): truncated: needs 4 "
            "bytes at "
            "offset 1, 2 left");
}

TEST(PickleErrors, UnsupportedOpcodes) {
  for (int op : {0x82, 0x83, 0x84, 0x97, 0x98}) {
    auto r = Parse(B({op, 0, 0, 0, 0, '.'}));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(Message(r.status()).find("unsupported opcode"),
              std::string::npos);
  }
  int unknown = 0;
  for (int op = 0; op < 256; ++op) {
    auto r = Parse(B({op, '.'}));
    if (!r.ok() &&
        Message(r.status()).find("unknown opcode") != std::string::npos)
      ++unknown;
  }
  EXPECT_EQ(unknown, 256 - 68);  // CPython defines 68 opcodes
}

TEST(PickleErrors, StackUnderflowAndMarkMisuse) {
  const std::vector<std::string> bad = {
      B({'a', '.'}),       // APPEND, empty stack
      B({']', 'a', '.'}),  // APPEND without value
      B({'s', '.'}), B({'}', 'K', 1, 's', '.'}), B({'R', '.'}),
      B({'N', 0x81, '.'}), B({'N', 'N', 0x92, '.'}), B({'b', '.'}),
      B({'Q', '.'}), B({'2', '.'}), B({'0', '.'}), B({0x85, '.'}),
      B({'N', 0x86, '.'}), B({'N', 'N', 0x87, '.'}), B({0x93, '.'}),
      B({'q', 0, '.'}), B({0x94, '.'}), B({'.'}),
      // Below the fence: APPEND needs the list above the MARK.
      B({']', '(', 'K', 1, 'a', '.'}), B({']', '(', '.'}),
      // No MARK.
      B({'t', '.'}), B({'l', '.'}), B({'d', '.'}), B({'e', '.'}), B({'u', '.'}),
      B({0x90, '.'}), B({0x91, '.'}), B({'1', '.'}), B({'o', '.'}),
      B({'i', 'm', '\n', 'n', '\n', '.'}),
      // MARK but no target below it.
      B({'(', 'e', '.'}), B({'(', 'u', '.'}), B({'(', 0x90, '.'}),
      B({']', '(', '(', 'e', '.'}),
      // Odd SETITEMS / DICT, OBJ without class.
      B({'}', '(', 'K', 1, 'u', '.'}), B({'(', 'K', 1, 'd', '.'}),
      B({'(', 'o', '.'}),
      // Wrong target kinds.
      B({')', 'K', 1, 'a', '.'}), B({'K', 1, 'K', 1, 'K', 1, 's', '.'}),
      B({']', '(', 'K', 1, 0x90, '.'}), B({'N', ')', 'b', '.'}),
      B({'N', 'N', 'R', '.'}),         // args not a tuple
      B({'N', ')', ')', 0x92, '.'}),   // kwargs not a dict
      B({'K', 1, 'K', 2, 0x93, '.'}),  // STACK_GLOBAL of ints
  };
  for (const std::string& data : bad) {
    auto r = Parse(data);
    ASSERT_FALSE(r.ok()) << "case " << &data - &bad[0];
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
        << r.status() << " case " << &data - &bad[0];
  }
}

TEST(PickleErrors, HugeLengthsFailBeforeAllocating) {
  ReaderOptions o;
  o.max_alloc_bytes = 1 << 20;
  const std::vector<std::string> bad = {
      B({'X', 0xff, 0xff, 0xff, 0xff, 'a', '.'}),
      B({0x8d}) + LE(~uint64_t{0}, 8) + "a.",
      B({0x8e}) + LE(uint64_t{1} << 62, 8) + "a.",
      B({0x96}) + LE(~uint64_t{0} - 7, 8) + "a.",
      B({'B', 0xff, 0xff, 0xff, 0xff, '.'}),
      B({0x8b, 0xff, 0xff, 0xff, 0x7f, '.'}),
      B({0x8b, 0xff, 0xff, 0xff, 0xff, '.'}),  // negative count
      B({'T', 0xff, 0xff, 0xff, 0xff, '.'}),
      B({0x95}) + LE(~uint64_t{0}, 8) + "N.",
      B({0x8c, 200, 'a', '.'}),
      B({'C', 10, '.'}),
  };
  for (const std::string& data : bad) {
    auto r = Parse(data, o);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
        << r.status();
  }
  // Present in the input but over max_string_bytes: RESOURCE_EXHAUSTED.
  o.max_string_bytes = 10;
  auto r = Parse(B({'X', 11, 0, 0, 0}) + std::string(11, 'a') + ".", o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted)
      << r.status();
  auto line = Parse("c" + std::string(11, 'm') + "\nn\n.", o);
  EXPECT_EQ(line.status().code(), absl::StatusCode::kResourceExhausted)
      << line.status();
}

TEST(PickleErrors, Memo) {
  auto unset = Parse(B({'h', 3, '.'}));
  EXPECT_EQ(unset.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(Message(unset.status()).find("memo key 3 not found"),
            std::string::npos);
  auto unset_long = Parse(B({'N', 'q', 1, 'j', 0xff, 0xff, 0xff, 0xff, '.'}));
  EXPECT_EQ(unset_long.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Parse("g12\n.").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Parse("Np-1\n.").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Parse("Np99999999999999999999999\n.").status().code(),
            absl::StatusCode::kInvalidArgument);

  // The largest index is legal and costs no index-sized memory.
  ASSERT_OK_AND_ASSIGN(
      auto top, Parse(B({'K', 5, 'r', 0xff, 0xff, 0xff, 0xff, '0', 'j', 0xff,
                         0xff, 0xff, 0xff, '.'})));
  EXPECT_EQ(top->root().i, 5);
  EXPECT_LT(top->allocated_bytes(), 4096u);
  ASSERT_OK_AND_ASSIGN(
      auto text,
      Parse("K\x05p18446744073709551615\n0g18446744073709551615\n."));
  EXPECT_EQ(text->root().i, 5);

  // Sparse and geometrically growing indices stay bounded.
  std::mt19937_64 rng(testing::TestSeed());
  std::string sparse = "N";
  for (int k = 0; k < 5000; ++k) sparse += "r" + LE(rng() & 0xffffffff, 4);
  uint64_t idx = 0;
  for (int k = 0; k < 40 && idx < 0xffffffff; ++k, idx = 2 * idx + 1000) {
    sparse += "r" + LE(idx, 4);
  }
  sparse += "h" + LE(0, 1) + ".";
  ASSERT_OK_AND_ASSIGN(auto s, Parse(sparse));
  EXPECT_LT(s->allocated_bytes(), 1u << 20) << s->allocated_bytes();

  // Overwriting a slot does not count a new entry; the limit is on entries.
  ReaderOptions o;
  o.max_memo_entries = 3;
  ASSERT_OK(
      Parse(B({'N', 'q', 0, 'q', 0, 'q', 1, 'q', 1, 'r', 9, 9, 9, 9, '.'}), o));
  auto over = Parse(B({'N', 'q', 0, 'q', 1, 'q', 2, 0x94, '.'}), o);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted)
      << over.status();
  // MEMOIZE uses the entry count, like len(memo) in Python.
  ASSERT_OK_AND_ASSIGN(auto m,
                       Parse(B({'K', 1, 0x94, 'K', 2, 0x94, 'h', 1, '.'})));
  EXPECT_EQ(m->root().i, 2);
}

TEST(PickleErrors, DeepNesting) {
  constexpr int kDepth = 100000;
  // [[[...]]] built as EMPTY_LIST x N, APPEND x (N-1).
  std::string lists =
      std::string(kDepth, ']') + std::string(kDepth - 1, 'a') + ".";
  ASSERT_OK_AND_ASSIGN(auto doc, Parse(lists));
  const std::string d = DebugString(doc->root());
  EXPECT_EQ(d, "[[[[[[...]]]]]]");
  // TUPLE1 chains nest without using the stack.
  std::string tuples = "N" + std::string(kDepth, '\x85') + ".";
  ASSERT_OK_AND_ASSIGN(auto t, Parse(tuples));
  const Value* v = &t->root();
  int depth = 0;
  while (v->kind == Kind::kTuple) v = v->items[0], ++depth;
  EXPECT_EQ(depth, kDepth);
  // MARKs and the stack are limited.
  auto marks = Parse(std::string(kDepth, '(') + ".");
  EXPECT_EQ(marks.status().code(), absl::StatusCode::kResourceExhausted);
  ReaderOptions small;
  small.max_stack_depth = 1000;
  auto stack = Parse(std::string(1001, 'N') + ".", small);
  EXPECT_EQ(stack.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(Message(stack.status()).find("stack depth limit of 1000"),
            std::string::npos);
  ASSERT_OK(Parse(std::string(1000, 'N') + ".", small));
}

TEST(PickleErrors, AllocationLimit) {
  const std::string data = Program([](Writer& w) {
    w.EmptyList();
    for (int k = 0; k < 1000; ++k) {
      w.Int(k);
      w.Append();
    }
  });
  ASSERT_OK_AND_ASSIGN(auto doc, Parse(data));
  const uint64_t used = doc->allocated_bytes();
  EXPECT_GE(used, 1000 * sizeof(Value));
  ReaderOptions o;
  o.max_alloc_bytes = used - 1;
  auto r = Parse(data, o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(Message(r.status()).find("allocation limit"), std::string::npos);
  o.max_alloc_bytes = used;
  ASSERT_OK(Parse(data, o));
  // Strings count their bytes.
  o.max_alloc_bytes = 5000;
  auto s =
      Parse(Program([](Writer& w) { w.String(std::string(6000, 'x')); }), o);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(PickleErrors, InvalidUtf8AndProtocol) {
  for (const std::string& bad :
       {B({0x8c, 1, 0x80, '.'}), B({0x8c, 2, 0xc0, 0x80, '.'}),
        B({0x8c, 3, 0xe0, 0x80, 0x80, '.'}),        // overlong
        B({0x8c, 4, 0xf4, 0x90, 0x80, 0x80, '.'}),  // > U+10FFFF
        B({0x8c, 1, 0xff, '.'}), B({'c', 0xff, '\n', 'n', '\n', '.'})}) {
    EXPECT_EQ(Parse(bad).status().code(), absl::StatusCode::kInvalidArgument);
  }
  // Lone surrogates pass, as with Python's surrogatepass.
  ASSERT_OK(Parse(B({0x8c, 3, 0xed, 0xa0, 0x80, '.'})));
  EXPECT_EQ(Parse(B({0x80, 6, 'N', '.'})).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_OK(Parse(B({0x80, 5, 'N', '.'})));
}

TEST(PickleErrors, RandomMutationsNeverCrash) {
  std::mt19937_64 rng(testing::TestSeed());
  const std::vector<std::string> seeds = {
      Kitchen(), "(lp0\nI42\nL12L\nF1.5\nS'x'\nVy\np1\ng1\n(dp2\nVk\nNsa.",
      Program([](Writer& w) {
        w.EmptyList();
        w.Put(0);
        w.Get(0);
        w.Append();
      })};
  ReaderOptions o;
  o.max_alloc_bytes = 1 << 20;
  o.max_string_bytes = 1 << 16;
  int ok = 0, failed = 0;
  // A quarter under the sanitizers (31 s under ASan at -O0 whole); the
  // release build (scripts/test.sh) runs all, the pickle fuzzer more.
  const int iterations = ::ckptd::testing::kSlowSanitizer ? 5000 : 20000;
  for (int iter = 0; iter < iterations; ++iter) {
    std::string data = seeds[rng() % seeds.size()];
    const int edits = 1 + rng() % 4;
    for (int e = 0; e < edits && !data.empty(); ++e) {
      const size_t pos = rng() % data.size();
      switch (rng() % 4) {
        case 0:
          data[pos] = static_cast<char>(rng());
          break;
        case 1:
          data.erase(pos, 1 + rng() % 4);
          break;
        case 2:
          data.insert(pos, 1, static_cast<char>(rng()));
          break;
        case 3:
          data.resize(pos);
          break;
      }
    }
    auto r = Parse(data, o);
    if (r.ok()) {
      ++ok;
      EXPECT_LE(DebugString((*r)->root(), 6, 300).size(), 303u);
    } else {
      ++failed;
      EXPECT_TRUE(r.status().code() == absl::StatusCode::kInvalidArgument ||
                  r.status().code() == absl::StatusCode::kResourceExhausted)
          << r.status();
    }
  }
  EXPECT_GT(failed, 0);
  RecordProperty("ok", ok);
}

// --- DebugString and accessors ---------------------------------------------

TEST(PickleDebugString, BoundedAndCycleSafe) {
  // A list of 100k ints: the rendering stops at max_len.
  std::string data = "]";
  for (int k = 0; k < 100000; ++k) data += B({'K', k & 0xff, 'a'});
  data += ".";
  ASSERT_OK_AND_ASSIGN(auto doc, Parse(data));
  const std::string s = DebugString(doc->root(), 6, 100);
  EXPECT_EQ(s.size(), 103u);
  EXPECT_EQ(s.substr(s.size() - 3), "...");
  // Depth bound.
  ASSERT_OK_AND_ASSIGN(auto nested, Parse("N" + std::string(10, '\x85') + "."));
  EXPECT_EQ(DebugString(nested->root(), 3), "(((...,),),)");
  // Huge bounds are clamped to a safe recursion depth.
  ASSERT_OK_AND_ASSIGN(auto deep,
                       Parse("N" + std::string(100000, '\x85') + "."));
  EXPECT_LT(DebugString(deep->root(), 1 << 30, 1 << 30).size(), 1000u);
  // Self-referencing dict.
  ASSERT_OK_AND_ASSIGN(
      auto cyc,
      Parse(B({'}', 'q', 0, 'X', 1, 0, 0, 0, 's', 'h', 0, 's', '.'})));
  EXPECT_EQ(DebugString(cyc->root()), "{'s': ...}");
  // Long strings are shortened on a UTF-8 boundary; bytes are escaped.
  std::string euros;
  for (int k = 0; k < 150; ++k) euros += "\xe2\x82\xac";
  ASSERT_OK_AND_ASSIGN(auto str,
                       Parse(Program([&](Writer& w) { w.String(euros); })));
  const std::string shown = DebugString(str->root());
  EXPECT_EQ(shown, "'" + euros.substr(0, 198) + "...(450 bytes)'");
  ASSERT_OK_AND_ASSIGN(auto bytes, Parse(B({'C', 3, 0, '\'', 0xff, '.'})));
  EXPECT_EQ(DebugString(bytes->root()), "b'\\x00\\'\\xff'");
  // Hand-made values with null pointers do not crash.
  Value obj;
  obj.kind = Kind::kObject;
  EXPECT_EQ(DebugString(obj), "<null>(<null>)");
}

TEST(PickleAccessors, Errors) {
  ASSERT_OK_AND_ASSIGN(
      auto doc, Parse(B({'(', 'K', 1, 'X', 1, 0, 0, 0, 'x', 'N', 't', '.'})));
  const Value& t = doc->root();
  EXPECT_EQ(Message(AsInt(t).status()),
            "expected int, got tuple (1, 'x', None)");
  EXPECT_EQ(Message(AsString(*t.items[0]).status()), "expected str, got int 1");
  EXPECT_EQ(Message(AsIntVector(t).status()),
            "element 1: expected int, got str 'x'");
  EXPECT_EQ(Message(AsInt(*t.items[2]).status()), "expected int, got None");
  EXPECT_EQ(Message(AsIntVector(*t.items[2]).status()),
            "expected tuple or list of ints, got None");
  EXPECT_EQ(AsInt(t).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_OK_AND_ASSIGN(auto b, Parse(B({0x88, '.'})));
  EXPECT_FALSE(AsInt(b->root()).ok());  // bool is not accepted as int
  EXPECT_EQ(KindName(Kind::kPersId), "persid");
}

// --- Performance smoke
// --------------------------------------------------------

// A .metadata-like program: many small chunk objects with memoized globals
// and strings. Logs the throughput; the bound is loose (sanitizer builds).
TEST(PicklePerf, LargeMetadataLikePickle) {
  std::string data;
  Writer w(&data);
  w.Proto();
  w.EmptyDict();
  // 200,000 entries; a quarter under the sanitizers.
  const int batches = ::ckptd::testing::kSlowSanitizer ? 50 : 200;
  for (int batch = 0; batch < batches; ++batch) {
    w.Mark();
    for (int k = 0; k < 1000; ++k) {
      w.String("layers." + std::to_string(batch) + ".mlp.weight." +
               std::to_string(k));
      w.MemoGlobal("torch.distributed.checkpoint.metadata",
                   "ChunkStorageMetadata");
      w.EmptyTuple();
      w.NewObj();
      w.EmptyDict();
      w.MemoString("offsets");
      w.MemoGlobal("torch", "Size");
      w.IntTuple({k * 128, 0});
      w.Tuple1();
      w.Reduce();
      w.SetItem();
      w.MemoString("sizes");
      w.MemoGlobal("torch", "Size");
      w.IntTuple({128, 4096});
      w.Tuple1();
      w.Reduce();
      w.SetItem();
      w.Build();
    }
    w.SetItems();
  }
  w.Stop();
  const auto start = std::chrono::steady_clock::now();
  ASSERT_OK_AND_ASSIGN(auto doc, Parse(data));
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  EXPECT_EQ(doc->root().entries.size(), static_cast<size_t>(batches) * 1000);
  std::fprintf(stderr,
               "parsed %.1f MB in %.3f s (%.0f MB/s), accounted %.0f MB\n",
               data.size() / 1e6, s, data.size() / 1e6 / s,
               doc->allocated_bytes() / 1e6);
  EXPECT_LT(s, 30.0);
}

}  // namespace
}  // namespace ckptd::pickle
