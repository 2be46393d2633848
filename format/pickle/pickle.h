// Copyright 2026 The ckptd Authors.
//
// Python pickle: a protocol-2 writer and a bounded reader VM for protocols
// 2–5 (dcp-format.md §2.1, §3.6).
//
// The reader never executes anything. GLOBAL/STACK_GLOBAL produce a Global
// value; REDUCE/NEWOBJ/NEWOBJ_EX produce an Object value recording the
// callable and its arguments; BUILD records the state on that Object;
// SETITEM(S)/APPEND(S) on an Object (e.g. OrderedDict()) record items on it;
// BINPERSID produces a PersId value. Higher layers (tensor payloads,
// .metadata) interpret these by the callable's module and name.
//
// All values of one parse live in a PickleDocument (an arena) and refer to
// each other by raw pointer, so cyclic or shared structures (memo) are
// representable and destruction is not recursive. Consumers that recurse must
// bound their own depth (pickled structures may be cyclic). None, True, False,
// () and the ints 0..255 are shared values (as in CPython).
#ifndef CKPTD_FORMAT_PICKLE_PICKLE_H_
#define CKPTD_FORMAT_PICKLE_PICKLE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ckptd::pickle {

struct Value {
  enum class Kind : uint8_t {
    kNone,
    kBool,
    kInt,     // fits in int64
    kBigInt,  // LONG1/LONG4 wider than 64 bits: `str` holds the raw
              // little-endian two's-complement bytes
    kFloat,
    kString,  // unicode, UTF-8 in `str`
    kBytes,   // bytes / bytearray, raw in `str`
    kTuple,   // `items`
    kList,    // `items`
    kDict,    // `entries`, in insertion order (keys may be any value)
    kSet,     // set / frozenset, `items`
    kGlobal,  // `module`, `name`
    kObject,  // result of REDUCE / NEWOBJ / NEWOBJ_EX
    kPersId,  // result of BINPERSID / PERSID: `pid` is the persistent id
  };

  Kind kind = Kind::kNone;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string str;     // kString, kBytes, kBigInt
  std::string module;  // kGlobal
  std::string name;    // kGlobal
  std::vector<const Value*> items;                            // tuple/list/set; object APPENDs
  std::vector<std::pair<const Value*, const Value*>> entries;  // dict; object SETITEMs
  // kObject:
  const Value* callable = nullptr;  // usually a kGlobal
  const Value* args = nullptr;      // a kTuple (NEWOBJ_EX: positional args)
  const Value* kwargs = nullptr;    // NEWOBJ_EX only, else nullptr
  const Value* state = nullptr;     // set by BUILD, else nullptr
  bool newobj = false;              // NEWOBJ/NEWOBJ_EX (cls.__new__) vs REDUCE
  // kPersId:
  const Value* pid = nullptr;

  bool is_none() const { return kind == Kind::kNone; }
  // True for a kGlobal, or a kObject whose callable is, named module.name.
  bool IsGlobal(std::string_view module, std::string_view name) const;
  // For a kObject: true if the callable is the global module.name.
  bool IsCallTo(std::string_view module, std::string_view name) const;
  // Looks up a string key in a kDict (or an Object's `entries`); nullptr if
  // absent.
  const Value* Get(std::string_view key) const;
};

// A short human-readable rendering for error messages and debugging, bounded
// in depth and length (cycles print as "...").
std::string DebugString(const Value& v, int max_depth = 6,
                        size_t max_len = 2000);

// "int", "tuple", "dict", ... (Python's type names; "global", "object",
// "persid" and "bigint" for the reader's own kinds).
std::string_view KindName(Value::Kind kind);

// Typed accessors with precise errors ("expected int, got tuple (1, 2)").
// AsInt accepts kInt only (not kBool, not kBigInt).
absl::StatusOr<int64_t> AsInt(const Value& v);
absl::StatusOr<std::string_view> AsString(const Value& v);
// A tuple or list of ints.
absl::StatusOr<std::vector<int64_t>> AsIntVector(const Value& v);
// The raw bytes of a kBytes value, or of the protocol-2 spellings of bytes:
// `_codecs.encode(str, 'latin1' | 'latin-1')` (see Writer::Bytes) and the
// empty `builtins.bytes()` / `__builtin__.bytes()`.
absl::StatusOr<std::string> AsBytes(const Value& v);

struct ReaderOptions {
  // Values stored by the parse (containers, strings, memo) may total at most
  // this many bytes (approximate accounting: sizeof(Value) per value, plus
  // string bytes, 8 per child pointer and memo slot).
  uint64_t max_alloc_bytes = uint64_t{4} << 30;
  // Largest single string/bytes operand.
  uint64_t max_string_bytes = uint64_t{1} << 30;
  // Values on the VM stack, and MARKs open at once. Nesting of the result is
  // not bounded (TUPLE1 chains, memo cycles): consumers bound their own depth.
  int max_stack_depth = 1 << 20;
  int max_mark_depth = 4096;
  // Distinct memo slots in use (BINPUT / LONG_BINPUT / PUT / MEMOIZE).
  // Indices may be sparse anywhere in 0..2^32-1 (PUT: 0..2^64-1).
  uint64_t max_memo_entries = uint64_t{1} << 26;
  // Name used in error messages ("/ckpt/.metadata").
  std::string source_name = "<pickle>";
};

// Owns every value of one parse.
class PickleDocument {
 public:
  const Value& root() const { return *root_; }
  // Approximate bytes accounted against ReaderOptions::max_alloc_bytes.
  uint64_t allocated_bytes() const { return allocated_; }
  // Every global the program references (GLOBAL, STACK_GLOBAL, INST), in
  // program order, whether or not it is reachable from the root (a value
  // popped or left on the stack still got imported by Python's unpickler).
  const std::vector<const Value*>& globals() const { return globals_; }

 private:
  friend class Parser;
  // A new default value with a stable address.
  Value* NewValue();
  // Values live in fixed blocks (one allocation per kBlockValues values).
  static constexpr size_t kBlockValues = 1024;
  std::vector<std::unique_ptr<Value[]>> blocks_;
  size_t used_in_last_block_ = kBlockValues;
  const Value* root_ = nullptr;
  uint64_t allocated_ = 0;
  std::vector<const Value*> globals_;
};

// Parses one pickle (up to and including STOP). Errors are INVALID_ARGUMENT
// (malformed / unsupported opcode) or RESOURCE_EXHAUSTED (a limit), and name
// `source_name`, the byte offset and the opcode: "<src>: offset 17: opcode
// 0x52 'R' (REDUCE): stack underflow". Trailing bytes after STOP are ignored.
absl::StatusOr<std::unique_ptr<PickleDocument>> Parse(
    std::string_view data, const ReaderOptions& options = {});

// Appends a protocol-2 pickle program to a string. The caller composes the
// program from opcodes; helpers cover the common value shapes. No memo is
// used unless the caller asks for it (Put/Get), and no FRAME.
//
// Typical use:
//   Writer w(&out);
//   w.Proto();
//   w.Global("torch", "Size"); w.Mark(); w.Int(4); w.Int(6); w.Tuple();
//   w.Tuple1(); w.Reduce();
//   w.Stop();
class Writer {
 public:
  explicit Writer(std::string* out) : out_(out) {}

  void Proto(int version = 2);        // \x80 v
  void Stop();                        // .
  void None();                        // N
  void Bool(bool v);                  // \x88 / \x89
  void Int(int64_t v);                // BININT1 / BININT2 / BININT / LONG1
  void Float(double v);               // BINFLOAT (big-endian double)
  void String(std::string_view utf8); // BINUNICODE
  // Bytes: protocol 2 has no bytes opcode; emits
  // _codecs.encode(latin-1 str, 'latin1') exactly like Python's protocol-2
  // pickler, so Python reads back a `bytes` object.
  void Bytes(std::string_view raw);
  void Global(std::string_view module, std::string_view name);  // c mod\nname\n
  void Mark();                        // (
  void Tuple();                       // t  (pops to MARK)
  void EmptyTuple();                  // )
  void Tuple1();                      // \x85
  void Tuple2();                      // \x86
  void Tuple3();                      // \x87
  void EmptyList();                   // ]
  void Append();                      // a
  void Appends();                     // e  (pops to MARK)
  void EmptyDict();                   // }
  void SetItem();                     // s
  void SetItems();                    // u  (pops to MARK)
  void Reduce();                      // R
  void NewObj();                      // \x81
  void Build();                       // b
  void BinPersId();                   // Q
  void NewTrue() { Bool(true); }
  void NewFalse() { Bool(false); }
  // Memo: BINPUT/LONG_BINPUT the top of stack into slot `index`; BINGET/
  // LONG_BINGET it back.
  void Put(uint32_t index);
  void Get(uint32_t index);

  // Helpers.
  // A tuple of ints: EMPTY_TUPLE, TUPLE1..3, or MARK ... TUPLE.
  void IntTuple(absl::Span<const int64_t> values);
  // A GLOBAL that is emitted once and afterwards fetched from the memo.
  // The writer assigns memo slots 0, 1, ... itself: do not mix these helpers
  // with manual Put/Get in one pickle.
  void MemoGlobal(std::string_view module, std::string_view name);
  // Same for strings (e.g. a repeated FQN or file name).
  void MemoString(std::string_view utf8);

  std::string* out() { return out_; }

 private:
  std::string* out_;
  uint32_t next_memo_ = 0;
  // Key "\x01module\nname" for globals, "\x02" + s for strings.
  absl::flat_hash_map<std::string, uint32_t> memo_;
};

}  // namespace ckptd::pickle

#endif  // CKPTD_FORMAT_PICKLE_PICKLE_H_
