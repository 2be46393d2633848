// Copyright 2026 The ckptd Authors.
//
// Internal: the one pickle machine both pickle VMs run, pickle::Parse
// (pickle_reader.cc: a graph of pickle::Values) and the streaming
// `.metadata` decoder's VM (format/metadata/metadata_vm*.cc: 40-byte Vals,
// folding).
//
// Machine<Impl> is everything of a pickle program that does not depend on
// how values are represented: the loop, reading each opcode and its
// operand (protocols 0-5, PROTO, FRAME), decoding text operands (INT/LONG/
// FLOAT literals, STRING escapes, UNICODE raw-unicode-escapes, PUT/GET
// indices) and checking that str operands are UTF-8, the MARK stack (POP
// and POP_MARK included), what each opcode needs on the stack and of which
// kind, the count of memo slots in use (MEMOIZE's index), the limits, and
// every error message ("<src>: offset 17: opcode 0x52 'R' (REDUCE): stack
// underflow: ...").
//
// Impl is a value model (CRTP: its hooks are inlined, nothing is virtual):
// what stays its own is what depends on the representation, its values and
// memo store, its allocation accounting (ReaderOptions::max_alloc_bytes),
// and the .metadata VM's superinstructions. It provides:
//   static constexpr bool kWholeLines;  how far ReadLine looks for a '\n'
//   static constexpr bool kErrorsBesideSteps;  a body may set the error and
//       return true (Run then checks the error after every opcode)
//   size_t stack_size() const;
//   bool Is(size_t i, Value::Kind kind) const;  stack[i] is of `kind`
//       (asked for kString, kTuple, kList, kDict, kSet and kObject)
//   std::string_view KindNameAt(size_t i) const;  KindName of stack[i]
//   bool FastPath();  ran a superinstruction at the cursor (false: none)
// and the opcode bodies. Each body runs after the machine's checks passed
// (operand read and decoded, enough values above the MARK, their kinds) and
// returns false with the error set where a limit of its own stops it (the
// stack depth: StackFull(); allocation):
//   PushNone() PushBool(b) PushInt(i) PushFloat(d)
//   PushLong(le)             LONG1/LONG4: little-endian two's complement
//   PushIntLiteral(digits)   INT/LONG text (ParseIntLiteral decodes it)
//   PushString(utf8) PushBytes(raw)  the binary str/bytes opcodes
//   PushTextString(utf8)     STRING/UNICODE, decoded
//   PushGlobal(module, name) GLOBAL, INST
//   StackGlobal()            the top two are str
//   PushEmptyTuple() PushEmpty(kList | kDict | kSet)
//   Collect(kTuple | kList | kSet, from)   stack[from, end) into one
//   Dict(from)               an even number of values above `from`
//   Append(target, from)     target: a list or object; likewise
//   SetItems(target, from)   (a dict or object; pairs) and
//   AddItems(target, from)   (a set or object); target = from - 1 or the
//                            value below APPEND's / SETITEM's operands
//   Reduce(newobj)           callable, a tuple on top
//   NewObjEx()               class, tuple, dict
//   Build()                  an object, its state on top
//   Obj(mark) Inst(mark)     the class at stack[mark] / on top
//   BinPersId() PersIdText(pid)
//   PopTop() Truncate(size) Dup()
//   MemoPut(index) MemoNext() MemoGet(index)   MemoNext: MEMOIZE, into slot
//                            memo_count; MemoGet reports MemoKeyNotFound
//   Finish()                 STOP: the top is the root
#ifndef CKPTD_FORMAT_PICKLE_PICKLE_MACHINE_H_
#define CKPTD_FORMAT_PICKLE_PICKLE_MACHINE_H_

#include <array>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "fmt/format.h"
#include "format/pickle/pickle.h"
#include "format/pickle/pickle_source.h"
#include "format/pickle/pickle_util.h"

namespace ckptd::pickle::internal {

// ReaderOptions' limits as the machine compares them.
struct MachineLimits {
  explicit MachineLimits(const ReaderOptions& options)
      : max_string_bytes(options.max_string_bytes),
        max_stack_depth(options.max_stack_depth < 0
                            ? 0
                            : static_cast<uint64_t>(options.max_stack_depth)),
        max_mark_depth(options.max_mark_depth),
        max_memo_entries(options.max_memo_entries) {}

  uint64_t max_string_bytes;
  uint64_t max_stack_depth;  // a negative option reads as 0
  int64_t max_mark_depth;    // as given: a negative one allows no MARK
  uint64_t max_memo_entries;
};

// What the machine keeps between opcodes. The VM owns it (its heap's own
// errors, an allocation limit, go to `error` too).
struct MachineState {
  MachineState(const ReaderOptions& options, std::string name)
      : limits(options), source_name(std::move(name)) {}

  const MachineLimits limits;
  const std::string source_name;  // named by every error
  std::vector<size_t> marks;      // stack sizes at each open MARK
  size_t fence = 0;               // marks.back(), or 0
  uint64_t memo_count = 0;        // memo slots in use
  uint64_t op_pos = 0;            // offset of the current opcode
  uint8_t op = 0;                 // the current opcode
  absl::Status error;             // the first error

  bool marks_full() const {
    return static_cast<int64_t>(marks.size()) >= limits.max_mark_depth;
  }
};

// Sets m.error, unless an error is set already, to `code` and "<src>:
// offset N: opcode 0x.. 'c' (NAME): <what>" (the opcode only when N lies
// inside the input of `input_size` bytes). Returns false.
bool SetError(MachineState& m, uint64_t input_size, absl::StatusCode code,
              std::string_view what);
// The same for a failed read of `in`: DATA_LOSS "<src>: offset N: <why>".
bool SetIoError(MachineState& m, const Source& in);

// Memo indices below this bound, for `entries` slots in use, are kept in
// the dense part of a memo (a vector, a bitmap), the others in a hash
// table: sparse indices cannot make the dense part large.
inline uint64_t MemoDenseLimit(uint64_t entries) { return 2 * entries + 1024; }

template <class Impl>
class Machine {
 public:
  // The VM's state and input must outlive the machine.
  Machine(Source& in, MachineState& m) : in_(in), m_(m) {}

  // Runs the program up to and including STOP (Impl's Finish() keeps the
  // root); the first error otherwise.
  absl::Status Run();

 protected:
  using Kind = Value::Kind;

  // --- errors: each sets the error (unless one is set) and returns false
  bool Fail(absl::StatusCode code, std::string_view what) {
    return SetError(m_, in_.size(), code, what);
  }
  bool Invalid(std::string_view what) {
    return Fail(absl::StatusCode::kInvalidArgument, what);
  }
  bool Exhausted(std::string_view what) {
    return Fail(absl::StatusCode::kResourceExhausted, what);
  }
  ABSL_ATTRIBUTE_NOINLINE bool IoFailed() { return SetIoError(m_, in_); }
  ABSL_ATTRIBUTE_NOINLINE bool Truncated(uint64_t need);
  ABSL_ATTRIBUTE_NOINLINE bool Underflow(size_t need);
  // The stack depth limit (Impl's pushes check it).
  ABSL_ATTRIBUTE_NOINLINE bool StackFull() {
    return Exhausted(fmt::format("stack depth limit of {} exceeded",
                                 m_.limits.max_stack_depth));
  }
  ABSL_ATTRIBUTE_NOINLINE bool MemoKeyNotFound(uint64_t index) {
    return Invalid(fmt::format("memo key {} not found", index));
  }
  // "<what> <kind of stack[i]>".
  ABSL_ATTRIBUTE_NOINLINE bool WrongKind(std::string_view what, size_t i) {
    return Invalid(fmt::format("{} {}", what, impl().KindNameAt(i)));
  }
  // "<what> <kind of stack[i]> and <kind of stack[j]>".
  ABSL_ATTRIBUTE_NOINLINE bool WrongKinds(std::string_view what, size_t i,
                                          size_t j) {
    return Invalid(fmt::format("{} {} and {}", what, impl().KindNameAt(i),
                               impl().KindNameAt(j)));
  }

  // --- memo: counts a new slot in use, within max_memo_entries
  bool CountMemoEntry() {
    if (ABSL_PREDICT_FALSE(m_.memo_count >= m_.limits.max_memo_entries)) {
      return Exhausted(fmt::format("memo limit of {} entries exceeded",
                                   m_.limits.max_memo_entries));
    }
    ++m_.memo_count;
    return true;
  }
  // INT/LONG digits (sign, surrounding whitespace): *fits and *small if the
  // integer fits in int64, else *big = its minimal little-endian two's
  // complement bytes.
  bool ParseIntLiteral(std::string_view digits, int64_t* small,
                       std::string* big, bool* fits) {
    if (!DecimalToBytes(digits, &scratch_)) {
      return Invalid(
          fmt::format("bad integer literal ({} bytes)", digits.size()));
    }
    *fits = IntFromBytes(reinterpret_cast<const uint8_t*>(scratch_.data()),
                         scratch_.size(), small, big);
    return true;
  }

  // One opcode (not STOP) whose byte was consumed; inlined where `op` is a
  // constant (Run's dispatch table, a fast path), the switches fold away.
  bool Step(uint8_t op);

  Source& in_;
  MachineState& m_;

 private:
  Impl& impl() { return static_cast<Impl&>(*this); }

  // --- input
  // Reads an n-byte little-endian unsigned operand.
  bool ReadLE(int n, uint64_t* v) {
    if (ABSL_PREDICT_FALSE(in_.buffered() < static_cast<size_t>(n)) &&
        in_.Peek(n) == nullptr) {
      return Truncated(n);
    }
    *v = LoadLE(in_.cursor(), n);
    in_.Advance(n);
    return true;
  }
  // Reads a 4-byte length that must not be negative (LONG4, BINSTRING).
  bool ReadSignedLength(uint64_t* v) {
    if (!ReadLE(4, v)) return false;
    if (static_cast<int32_t>(static_cast<uint32_t>(*v)) < 0) {
      return Invalid("negative byte count");
    }
    return true;
  }
  bool ReadLine(std::string_view* line);
  // Points *p at the `len`-byte operand at the cursor (not consumed).
  bool Operand(uint64_t len, const char** p);
  // GLOBAL and INST: module and name, a line each, UTF-8.
  bool ReadGlobal(std::string_view* module, std::string_view* name);

  // --- the stack and its MARKs
  // At least n values above the innermost MARK.
  bool Require(size_t n) {
    if (ABSL_PREDICT_FALSE(impl().stack_size() - m_.fence < n)) {
      return Underflow(n);
    }
    return true;
  }
  bool PushMark();
  bool PopMark(size_t* mark);
  // For APPENDS/SETITEMS/ADDITEMS: pops the MARK and checks that a target
  // sits below it.
  bool PopMarkWithTarget(size_t* mark);

  // --- Run's dispatch: Step for each opcode byte, one indirect call per
  // opcode (a switch over all of them would be a chain of compares here)
  using StepFn = bool (*)(Machine&);
  template <uint8_t kOp>
  static bool StepOp(Machine& m) {
    return m.Step(kOp);
  }
  template <size_t... kOps>
  static constexpr std::array<StepFn, 256> StepTable(
      std::index_sequence<kOps...>) {
    return {&StepOp<static_cast<uint8_t>(kOps)>...};
  }

  // --- the opcodes, by what they make (Step dispatches)
  bool Number(uint8_t op);
  bool Long(uint64_t len);
  bool TextInt(bool allow_bool);
  bool TextFloat();
  bool Text(uint8_t op);
  bool Strings(uint8_t op);
  bool BinString(uint64_t len, Kind kind);
  bool TextString();
  bool TextUnicode();
  bool Container(uint8_t op);
  bool AppendOp(size_t target, size_t from);
  bool SetItemsOp(size_t target, size_t from);
  bool StackOrMemo(uint8_t op);
  bool MemoPutOp(uint64_t index);
  bool Object(uint8_t op);
  bool Inst();
  bool Framing(uint8_t op);

  std::string scratch_;  // decoded text operands
  std::string module_;   // GLOBAL's module (reading its name may refill)
};

// ---------------------------------------------------------------------------
// Implementation
// ---------------------------------------------------------------------------

template <class Impl>
absl::Status Machine<Impl>::Run() {
  static constexpr std::array<StepFn, 256> kSteps =
      StepTable(std::make_index_sequence<256>());
  while (true) {
    m_.op_pos = in_.pos();
    if (impl().FastPath()) {
      if (ABSL_PREDICT_FALSE(!m_.error.ok())) return std::move(m_.error);
      continue;
    }
    if (ABSL_PREDICT_FALSE(in_.buffered() == 0) && in_.Peek(1) == nullptr) {
      if (!in_.io_status().ok()) {
        IoFailed();
      } else {
        m_.op = 0;
        Invalid("unexpected end of data (no STOP opcode)");
      }
      return std::move(m_.error);
    }
    const auto op = static_cast<uint8_t>(*in_.cursor());
    m_.op = op;
    in_.Advance(1);
    if (op == kStop) {
      if (!Require(1)) return std::move(m_.error);
      impl().Finish();
      return m_.error;
    }
    if (ABSL_PREDICT_FALSE(!kSteps[op](*this) ||
                           (Impl::kErrorsBesideSteps && !m_.error.ok()))) {
      if (m_.error.ok()) Invalid("internal error");
      return std::move(m_.error);
    }
  }
}

template <class Impl>
bool Machine<Impl>::Truncated(uint64_t need) {
  if (!in_.io_status().ok()) return IoFailed();
  return Invalid(fmt::format("truncated: needs {} bytes at offset {}, {} left",
                             need, in_.pos(), in_.remaining()));
}

template <class Impl>
bool Machine<Impl>::Underflow(size_t need) {
  return Invalid(
      fmt::format("stack underflow: needs {} value{}, {} available{}", need,
                  need == 1 ? "" : "s", impl().stack_size() - m_.fence,
                  m_.marks.empty() ? "" : " above the innermost MARK"));
}

// Reads up to (excluding) the next '\n' and consumes the newline; the line
// may be max_string_bytes long. Impl::kWholeLines: the '\n' is looked for
// up to the end of the input (all in memory, so a longer line is reported
// with its length), else only max_string_bytes + 1 bytes ahead (a stream
// buffers no more).
template <class Impl>
bool Machine<Impl>::ReadLine(std::string_view* line) {
  const uint64_t max = m_.limits.max_string_bytes;
  bool too_long = false;
  const int64_t len =
      in_.LineLength(Impl::kWholeLines ? in_.remaining() : max, &too_long);
  if (len < 0) {
    if (!in_.io_status().ok()) return IoFailed();
    if (too_long) {
      return Exhausted(fmt::format(
          "line of more than {} bytes exceeds max_string_bytes {}", max, max));
    }
    return Invalid("truncated: missing end of line");
  }
  if (static_cast<uint64_t>(len) > max) {
    return Exhausted(
        fmt::format("line of {} bytes exceeds max_string_bytes {}", len, max));
  }
  *line = std::string_view(in_.Peek(len + 1), len);
  in_.Advance(len + 1);
  return true;
}

template <class Impl>
bool Machine<Impl>::Operand(uint64_t len, const char** p) {
  if (ABSL_PREDICT_FALSE(len > in_.remaining())) {
    return Invalid(fmt::format("truncated: length {} exceeds the {} bytes left",
                               len, in_.remaining()));
  }
  if (ABSL_PREDICT_FALSE(len > m_.limits.max_string_bytes)) {
    return Exhausted(fmt::format("length {} exceeds max_string_bytes {}", len,
                                 m_.limits.max_string_bytes));
  }
  *p = in_.Peek(len);
  if (*p == nullptr) return IoFailed();
  return true;
}

template <class Impl>
bool Machine<Impl>::ReadGlobal(std::string_view* module,
                               std::string_view* name) {
  std::string_view m;
  if (!ReadLine(&m)) return false;
  module_.assign(m);
  if (!ReadLine(name)) return false;
  if (!IsValidUtf8(module_.data(), module_.size()) ||
      !IsValidUtf8(name->data(), name->size())) {
    return Invalid("GLOBAL name is not valid UTF-8");
  }
  *module = module_;
  return true;
}

template <class Impl>
bool Machine<Impl>::PushMark() {
  if (ABSL_PREDICT_FALSE(m_.marks_full())) {
    return Exhausted(fmt::format("MARK depth limit of {} exceeded",
                                 m_.limits.max_mark_depth));
  }
  m_.marks.push_back(impl().stack_size());
  m_.fence = impl().stack_size();
  return true;
}

template <class Impl>
bool Machine<Impl>::PopMark(size_t* mark) {
  if (ABSL_PREDICT_FALSE(m_.marks.empty())) {
    return Invalid("no MARK on the stack");
  }
  *mark = m_.marks.back();
  m_.marks.pop_back();
  m_.fence = m_.marks.empty() ? 0 : m_.marks.back();
  return true;
}

template <class Impl>
bool Machine<Impl>::PopMarkWithTarget(size_t* mark) {
  if (!PopMark(mark)) return false;
  if (ABSL_PREDICT_FALSE(*mark <= m_.fence)) {
    return Invalid("stack underflow: no target value below the MARK");
  }
  return true;
}

// One opcode (not STOP), its byte consumed: to the opcodes of its kind.
template <class Impl>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool Machine<Impl>::Step(uint8_t op) {
  switch (op) {
    case kBinInt1:
    case kBinInt2:
    case kBinInt:
    case kLong1:
    case kLong4:
    case kNone:
    case kNewTrue:
    case kNewFalse:
    case kBinFloat:
      return Number(op);
    case kInt:
    case kLong:
    case kFloat:
    case kString:
    case kUnicode:
    case kPersId:
    case kGet:
    case kPut:
    case kGlobal:
    case kInst:
      return Text(op);
    case kShortBinUnicode:
    case kShortBinString:
    case kBinUnicode:
    case kBinUnicode8:
    case kShortBinBytes:
    case kBinBytes:
    case kBinBytes8:
    case kByteArray8:
    case kBinString:
      return Strings(op);
    case kEmptyTuple:
    case kEmptyList:
    case kEmptyDict:
    case kEmptySet:
    case kTuple1:
    case kTuple2:
    case kTuple3:
    case kTuple:
    case kList:
    case kFrozenSet:
    case kDict:
    case kAppend:
    case kAppends:
    case kSetItem:
    case kSetItems:
    case kAddItems:
      return Container(op);
    case kMark:
    case kPop:
    case kPopMark:
    case kDup:
    case kBinPut:
    case kLongBinPut:
    case kMemoize:
    case kBinGet:
    case kLongBinGet:
      return StackOrMemo(op);
    case kStackGlobal:
    case kReduce:
    case kNewObj:
    case kNewObjEx:
    case kBuild:
    case kObj:
    case kBinPersId:
      return Object(op);
    default:
      return Framing(op);
  }
}

template <class Impl>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool Machine<Impl>::Number(uint8_t op) {
  uint64_t u = 0;
  switch (op) {
    case kBinInt1:
      return ReadLE(1, &u) && impl().PushInt(static_cast<int64_t>(u));
    case kBinInt2:
      return ReadLE(2, &u) && impl().PushInt(static_cast<int64_t>(u));
    case kBinInt:
      return ReadLE(4, &u) &&
             impl().PushInt(static_cast<int32_t>(static_cast<uint32_t>(u)));
    case kLong1:
      return ReadLE(1, &u) && Long(u);
    case kLong4:
      return ReadSignedLength(&u) && Long(u);
    case kNone:
      return impl().PushNone();
    case kNewTrue:
    case kNewFalse:
      return impl().PushBool(op == kNewTrue);
    default: {  // kBinFloat: a big-endian double
      const char* q = in_.Peek(8);
      if (q == nullptr) return Truncated(8);
      uint64_t bits = 0;
      for (int k = 0; k < 8; ++k) {
        bits = (bits << 8) | static_cast<uint8_t>(q[k]);
      }
      in_.Advance(8);
      double d;
      std::memcpy(&d, &bits, 8);
      return impl().PushFloat(d);
    }
  }
}

// LONG1/LONG4: `len` bytes of little-endian two's complement.
template <class Impl>
bool Machine<Impl>::Long(uint64_t len) {
  const char* p = nullptr;
  if (!Operand(len, &p)) return false;
  in_.Advance(len);
  return impl().PushLong(std::string_view(p, len));
}

template <class Impl>
bool Machine<Impl>::TextInt(bool allow_bool) {
  std::string_view line;
  if (!ReadLine(&line)) return false;
  if (allow_bool && (line == "00" || line == "01")) {
    return impl().PushBool(line == "01");
  }
  if (!allow_bool && !line.empty() && line.back() == 'L') line.remove_suffix(1);
  return impl().PushIntLiteral(line);
}

template <class Impl>
bool Machine<Impl>::TextFloat() {
  std::string_view line;
  if (!ReadLine(&line)) return false;
  line = TrimSpace(line);
  if (!line.empty() && line[0] == '+') line.remove_prefix(1);
  double d = 0;
  const auto [ptr, ec] =
      std::from_chars(line.data(), line.data() + line.size(), d);
  if (line.empty() || ptr != line.data() + line.size() ||
      (ec != std::errc() && ec != std::errc::result_out_of_range)) {
    return Invalid("bad float literal");
  }
  return impl().PushFloat(d);
}

// The opcodes whose operand is a line of text (protocol 0 mostly).
template <class Impl>
bool Machine<Impl>::Text(uint8_t op) {
  std::string_view line, name;
  uint64_t u = 0;
  switch (op) {
    case kInt:
      return TextInt(/*allow_bool=*/true);
    case kLong:
      return TextInt(/*allow_bool=*/false);
    case kFloat:
      return TextFloat();
    case kString:
      return TextString();
    case kUnicode:
      return TextUnicode();
    case kPersId:
      if (!ReadLine(&line)) return false;
      if (!IsValidUtf8(line.data(), line.size())) {
        return Invalid("persistent id is not valid UTF-8");
      }
      return impl().PersIdText(line);
    case kPut:
    case kGet:
      if (!ReadLine(&line)) return false;
      if (!ParseDecimalU64(line, &u)) return Invalid("bad memo index");
      return op == kPut ? MemoPutOp(u) : impl().MemoGet(u);
    case kGlobal:
      return ReadGlobal(&line, &name) && impl().PushGlobal(line, name);
    default:  // kInst
      return Inst();
  }
}

// The binary str and bytes opcodes: a 1-, 4- or 8-byte length, the bytes.
template <class Impl>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool Machine<Impl>::Strings(uint8_t op) {
  uint64_t u = 0;
  switch (op) {
    case kShortBinUnicode:
    case kShortBinString:
      return ReadLE(1, &u) && BinString(u, Kind::kString);
    case kBinUnicode:
      return ReadLE(4, &u) && BinString(u, Kind::kString);
    case kBinUnicode8:
      return ReadLE(8, &u) && BinString(u, Kind::kString);
    case kBinString:
      return ReadSignedLength(&u) && BinString(u, Kind::kString);
    case kShortBinBytes:
      return ReadLE(1, &u) && BinString(u, Kind::kBytes);
    case kBinBytes:
      return ReadLE(4, &u) && BinString(u, Kind::kBytes);
    default:  // kBinBytes8, kByteArray8
      return ReadLE(8, &u) && BinString(u, Kind::kBytes);
  }
}

// A str (UTF-8, checked) or bytes operand of `len` bytes.
template <class Impl>
bool Machine<Impl>::BinString(uint64_t len, Kind kind) {
  const char* p = nullptr;
  if (!Operand(len, &p)) return false;
  if (kind == Kind::kString && ABSL_PREDICT_FALSE(!IsValidUtf8(p, len))) {
    return Invalid("string is not valid UTF-8");
  }
  in_.Advance(len);
  const std::string_view s(p, len);
  return kind == Kind::kString ? impl().PushString(s) : impl().PushBytes(s);
}

// STRING: a quoted Python 2 str literal with escapes; UTF-8 (torch.load
// decodes these as UTF-8).
template <class Impl>
bool Machine<Impl>::TextString() {
  std::string_view line;
  if (!ReadLine(&line)) return false;
  if (line.size() < 2 || line.front() != line.back() ||
      (line.front() != '\'' && line.front() != '"')) {
    return Invalid("the STRING opcode argument must be quoted");
  }
  if (!EscapeDecode(line.substr(1, line.size() - 2), &scratch_)) {
    return Invalid("bad escape in STRING");
  }
  if (!IsValidUtf8(scratch_.data(), scratch_.size())) {
    return Invalid("string is not valid UTF-8");
  }
  return impl().PushTextString(scratch_);
}

// UNICODE: raw-unicode-escape text.
template <class Impl>
bool Machine<Impl>::TextUnicode() {
  std::string_view line;
  if (!ReadLine(&line)) return false;
  if (!RawUnicodeEscapeDecode(line, &scratch_)) {
    return Invalid("bad \\u escape in UNICODE");
  }
  return impl().PushTextString(scratch_);
}

template <class Impl>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool Machine<Impl>::Container(uint8_t op) {
  const size_t top = impl().stack_size();
  size_t mark = 0;
  switch (op) {
    case kEmptyTuple:
      return impl().PushEmptyTuple();
    case kEmptyList:
      return impl().PushEmpty(Kind::kList);
    case kEmptyDict:
      return impl().PushEmpty(Kind::kDict);
    case kEmptySet:
      return impl().PushEmpty(Kind::kSet);
    case kTuple1:
    case kTuple2:
    case kTuple3: {
      const size_t n = op - kTuple1 + 1;
      return Require(n) && impl().Collect(Kind::kTuple, top - n);
    }
    case kTuple:
      return PopMark(&mark) && impl().Collect(Kind::kTuple, mark);
    case kList:
      return PopMark(&mark) && impl().Collect(Kind::kList, mark);
    case kFrozenSet:
      return PopMark(&mark) && impl().Collect(Kind::kSet, mark);
    case kDict:
      if (!PopMark(&mark)) return false;
      if ((top - mark) % 2 != 0) return Invalid("odd number of items for DICT");
      return impl().Dict(mark);
    case kAppend:
      return Require(2) && AppendOp(top - 2, top - 1);
    case kAppends:
      return PopMarkWithTarget(&mark) && AppendOp(mark - 1, mark);
    case kSetItem:
      return Require(3) && SetItemsOp(top - 3, top - 2);
    case kSetItems:
      return PopMarkWithTarget(&mark) && SetItemsOp(mark - 1, mark);
    default:  // kAddItems
      if (!PopMarkWithTarget(&mark)) return false;
      if (!impl().Is(mark - 1, Kind::kSet) &&
          !impl().Is(mark - 1, Kind::kObject)) {
        return WrongKind("cannot add items to a", mark - 1);
      }
      return impl().AddItems(mark - 1, mark);
  }
}

// APPEND(S): stack[from, end) onto the list (or object) stack[target].
template <class Impl>
bool Machine<Impl>::AppendOp(size_t target, size_t from) {
  if (!impl().Is(target, Kind::kList) && !impl().Is(target, Kind::kObject)) {
    return WrongKind("cannot append to a", target);
  }
  return impl().Append(target, from);
}

// SETITEM(S): the pairs of stack[from, end) into the dict (or object)
// stack[target].
template <class Impl>
bool Machine<Impl>::SetItemsOp(size_t target, size_t from) {
  if ((impl().stack_size() - from) % 2 != 0) {
    return Invalid("odd number of items for SETITEMS");
  }
  if (!impl().Is(target, Kind::kDict) && !impl().Is(target, Kind::kObject)) {
    return WrongKind("cannot set items on a", target);
  }
  return impl().SetItems(target, from);
}

template <class Impl>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool Machine<Impl>::StackOrMemo(
    uint8_t op) {
  uint64_t u = 0;
  size_t mark = 0;
  switch (op) {
    case kMark:
      return PushMark();
    case kPop:
      // Like CPython: POP with nothing above the innermost MARK drops it.
      if (impl().stack_size() > m_.fence) {
        impl().PopTop();
        return true;
      }
      if (!m_.marks.empty()) return PopMark(&mark);
      return Underflow(1);
    case kPopMark:
      if (!PopMark(&mark)) return false;
      impl().Truncate(mark);
      return true;
    case kDup:
      return Require(1) && impl().Dup();
    case kBinPut:
      return ReadLE(1, &u) && MemoPutOp(u);
    case kLongBinPut:
      return ReadLE(4, &u) && MemoPutOp(u);
    case kMemoize:  // into the next slot, memo_count
      return Require(1) && impl().MemoNext();
    case kBinGet:
      return ReadLE(1, &u) && impl().MemoGet(u);
    default:  // kLongBinGet
      return ReadLE(4, &u) && impl().MemoGet(u);
  }
}

// BINPUT, LONG_BINPUT, PUT: the top of the stack into slot `index`.
template <class Impl>
bool Machine<Impl>::MemoPutOp(uint64_t index) {
  return Require(1) && impl().MemoPut(index);
}

template <class Impl>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool Machine<Impl>::Object(uint8_t op) {
  const size_t top = impl().stack_size();
  size_t mark = 0;
  switch (op) {
    case kStackGlobal:
      if (!Require(2)) return false;
      if (!impl().Is(top - 2, Kind::kString) ||
          !impl().Is(top - 1, Kind::kString)) {
        return WrongKinds("STACK_GLOBAL requires str module and name, got",
                          top - 2, top - 1);
      }
      return impl().StackGlobal();
    case kReduce:
    case kNewObj:
      if (!Require(2)) return false;
      if (!impl().Is(top - 1, Kind::kTuple)) {
        return WrongKind("arguments must be a tuple, got", top - 1);
      }
      return impl().Reduce(/*newobj=*/op == kNewObj);
    case kNewObjEx:
      if (!Require(3)) return false;
      if (!impl().Is(top - 2, Kind::kTuple) ||
          !impl().Is(top - 1, Kind::kDict)) {
        return WrongKinds("needs a tuple and a dict, got", top - 2, top - 1);
      }
      return impl().NewObjEx();
    case kBuild:
      if (!Require(2)) return false;
      if (!impl().Is(top - 2, Kind::kObject)) {
        return WrongKind("cannot BUILD a", top - 2);
      }
      return impl().Build();
    case kObj:
      if (!PopMark(&mark)) return false;
      if (top == mark) return Invalid("OBJ needs a class after the MARK");
      return impl().Obj(mark);
    default:  // kBinPersId
      return Require(1) && impl().BinPersId();
  }
}

// INST: GLOBAL's operand, then the arguments above the MARK.
template <class Impl>
bool Machine<Impl>::Inst() {
  std::string_view module, name;
  if (!ReadGlobal(&module, &name) || !impl().PushGlobal(module, name)) {
    return false;
  }
  size_t mark = 0;
  return PopMark(&mark) && impl().Inst(mark);
}

// PROTO, FRAME, and the opcodes refused.
template <class Impl>
bool Machine<Impl>::Framing(uint8_t op) {
  uint64_t u = 0;
  switch (op) {
    case kProto:
      if (!ReadLE(1, &u)) return false;
      if (u > kHighestProtocol) {
        return Invalid(fmt::format("unsupported pickle protocol {}", u));
      }
      return true;
    case kFrame:
      // Frames are in-band: the opcodes follow; only check the length.
      if (!ReadLE(8, &u)) return false;
      if (u > in_.remaining()) {
        return Invalid(fmt::format("truncated: frame of {} bytes, {} left", u,
                                   in_.remaining()));
      }
      return true;
    case kExt1:
    case kExt2:
    case kExt4:
    case kNextBuffer:
    case kReadOnlyBuffer:
      return Invalid("unsupported opcode");
    default:
      return Invalid("unknown opcode");
  }
}

}  // namespace ckptd::pickle::internal

#endif  // CKPTD_FORMAT_PICKLE_PICKLE_MACHINE_H_
