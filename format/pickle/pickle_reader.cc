// Copyright 2026 The ckptd Authors.
//
// Bounded pickle reader VM (see pickle.h; dcp-format.md §2.1, §3.6).
//
// The VM is a single pass over the input: every opcode does O(1 + operand
// size + items popped) work, so parsing is linear in the input. Every read is
// checked against the remaining input, and every length operand is checked
// against the remaining input and the limits before anything is allocated.
//
// Semantics that differ from (or are narrower than) CPython's unpickler:
//  * Nothing is imported or called; REDUCE/NEWOBJ/NEWOBJ_EX/INST/OBJ build a
//    kObject. BUILD is accepted on a kObject only (a second BUILD replaces
//    `state`).
//  * SETITEM(S) never replaces: a duplicate key (only possible in crafted
//    pickles) is appended again, and Value::Get returns the last one, which
//    is the one Python keeps.
//  * set and frozenset are both kSet; bytes and bytearray are both kBytes.
//  * The text opcodes INT/LONG/PUT/GET accept decimal only (Python also takes
//    0x.. etc.); STRING/BINSTRING/SHORT_BINSTRING (Python 2 str) become a
//    kString and must be UTF-8 (torch.load decodes them as UTF-8).
//  * Strings are UTF-8 with Python's "surrogatepass" (lone surrogates as
//    3-byte sequences) and are validated like Python does.
//  * EXT1/EXT2/EXT4 (copyreg extension registry), NEXT_BUFFER and
//    READONLY_BUFFER (out-of-band buffers) are rejected.
//  * None, True, False, () and the ints 0..255 are one shared Value each per
//    document (as in CPython), so pointer identity means nothing for them.
#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <utility>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "format/pickle/pickle.h"
#include "format/pickle/pickle_util.h"

namespace ckptd::pickle {
namespace {

using namespace ::ckptd::pickle::internal;  // NOLINT: opcodes and helpers

// Sets `v` to the integer in n little-endian two's-complement bytes: kInt if
// it fits in int64, else kBigInt with the minimal bytes.
void SetIntFromBytes(const uint8_t* b, size_t n, Value* v) {
  int64_t small = 0;
  if (IntFromBytes(b, n, &small, &v->str)) {
    v->kind = Value::Kind::kInt;
    v->i = small;
  } else {
    v->kind = Value::Kind::kBigInt;
  }
}

// Parses a decimal integer (optional sign, surrounding whitespace) into `v`.
bool ParseDecimalInt(std::string_view s, Value* v) {
  std::string bytes;
  if (!DecimalToBytes(s, &bytes)) return false;
  SetIntFromBytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                  v);
  return true;
}

}  // namespace

// The VM. One instance per Parse().
class Parser {
 public:
  Parser(std::string_view data, const ReaderOptions& options,
         PickleDocument* doc)
      : data_(data),
        opts_(options),
        doc_(doc),
        max_stack_(options.max_stack_depth < 0
                       ? 0
                       : static_cast<size_t>(options.max_stack_depth)) {}

  absl::Status Run();

 private:
  using Kind = Value::Kind;

  // --- errors (cold) ---
  ABSL_ATTRIBUTE_NOINLINE bool Fail(absl::StatusCode code,
                                    std::string_view what);
  bool Invalid(std::string_view what) {
    return Fail(absl::StatusCode::kInvalidArgument, what);
  }
  ABSL_ATTRIBUTE_NOINLINE bool Truncated(uint64_t need);
  ABSL_ATTRIBUTE_NOINLINE bool Underflow(size_t need);

  // --- input ---
  size_t remaining() const { return data_.size() - pos_; }
  // Reads an n-byte little-endian unsigned operand.
  bool ReadLE(int n, uint64_t* v) {
    if (ABSL_PREDICT_FALSE(remaining() < static_cast<size_t>(n)))
      return Truncated(n);
    *v = LoadLE(data_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  // Reads up to (excluding) the next '\n' and consumes the newline.
  bool ReadLine(std::string_view* line);
  // Checks a length operand against the input and the string limit.
  bool CheckLength(uint64_t len);

  // --- allocation ---
  bool Charge(uint64_t bytes) {
    doc_->allocated_ += bytes;
    if (ABSL_PREDICT_FALSE(doc_->allocated_ > opts_.max_alloc_bytes)) {
      return Fail(absl::StatusCode::kResourceExhausted,
                  fmt::format("allocation limit of {} bytes exceeded",
                              opts_.max_alloc_bytes));
    }
    return true;
  }
  Value* New(Kind kind, uint64_t extra_bytes = 0) {
    if (!Charge(sizeof(Value) + extra_bytes)) return nullptr;
    Value* v = doc_->NewValue();
    v->kind = kind;
    return v;
  }

  // --- stack ---
  bool Push(Value* v) {
    if (ABSL_PREDICT_FALSE(stack_.size() >= max_stack_)) {
      return Fail(absl::StatusCode::kResourceExhausted,
                  fmt::format("stack depth limit of {} exceeded", max_stack_));
    }
    stack_.push_back(v);
    return true;
  }
  bool PushNew(Kind kind) {
    Value* v = New(kind);
    return v != nullptr && Push(v);
  }
  // Pushes a shared immutable value, creating it on first use.
  bool PushShared(Value** slot, Kind kind, int64_t i = 0) {
    if (*slot == nullptr) {
      *slot = New(kind);
      if (*slot == nullptr) return false;
      (*slot)->i = i;
      if (kind == Kind::kBool) (*slot)->b = i != 0;
    }
    return Push(*slot);
  }
  bool PushInt(int64_t i) {
    if (static_cast<uint64_t>(i) < small_ints_.size()) {
      return PushShared(&small_ints_[i], Kind::kInt, i);
    }
    Value* v = New(Kind::kInt);
    if (v == nullptr) return false;
    v->i = i;
    return Push(v);
  }
  // At least n values above the innermost MARK.
  bool Require(size_t n) {
    if (ABSL_PREDICT_FALSE(stack_.size() - fence_ < n)) return Underflow(n);
    return true;
  }
  Value* Pop() {
    Value* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  bool PopMark(size_t* mark);
  // Pops to the MARK into a new container of `kind`.
  bool MarkToContainer(Kind kind);
  // For APPENDS/SETITEMS/ADDITEMS: pops the MARK and checks that a target
  // sits below it.
  bool PopMarkWithTarget(size_t* mark);

  // --- opcode bodies ---
  bool String(Kind kind, uint64_t len);
  bool Long(uint64_t len);
  bool TextInt(bool allow_bool);
  bool TextFloat();
  bool TextString();
  bool TextUnicode();
  bool Global();
  bool StackGlobal();
  bool TupleN(size_t n);
  bool Append();
  bool Appends();
  bool SetItem();
  bool SetItems();
  bool AddItems();
  bool Dict();
  bool Obj();
  bool Inst();
  bool Reduce(bool newobj);
  bool NewObjEx();
  bool Build();
  bool PersId(Value* pid);
  bool AppendItems(Value* target, size_t from);
  bool AddEntries(Value* target, size_t from);
  bool MemoPut(uint64_t index);
  bool MemoGet(uint64_t index);
  bool CountMemoEntry();

  std::string_view data_;
  const ReaderOptions& opts_;
  PickleDocument* doc_;
  const size_t max_stack_;
  size_t pos_ = 0;
  size_t op_pos_ = 0;  // offset of the current opcode
  absl::Status error_;

  std::vector<Value*> stack_;
  std::vector<size_t> marks_;  // stack sizes at each open MARK
  size_t fence_ = 0;           // marks_.back(), or 0

  // Memo: dense indices in a vector (size kept <= 2 * entries + 1024), the
  // rest in a hash map; no map key is < memo_vec_.size().
  std::vector<Value*> memo_vec_;
  absl::flat_hash_map<uint64_t, Value*> memo_map_;
  uint64_t memo_count_ = 0;

  // Immutable values shared by every occurrence (CPython shares them too),
  // which keeps large .metadata pickles much smaller.
  Value* none_ = nullptr;
  Value* true_ = nullptr;
  Value* false_ = nullptr;
  Value* empty_tuple_ = nullptr;
  std::array<Value*, 256> small_ints_{};
  std::string scratch_;
};

bool Parser::Fail(absl::StatusCode code, std::string_view what) {
  std::string op;
  if (op_pos_ < data_.size()) {
    const auto c = static_cast<uint8_t>(data_[op_pos_]);
    op = c >= 0x20 && c < 0x7f
             ? fmt::format("opcode 0x{:02x} '{}' ({}): ", c,
                           static_cast<char>(c), OpName(c))
             : fmt::format("opcode 0x{:02x} ({}): ", c, OpName(c));
  }
  error_ = absl::Status(
      code,
      fmt::format("{}: offset {}: {}{}", opts_.source_name, op_pos_, op, what));
  return false;
}

bool Parser::Truncated(uint64_t need) {
  return Invalid(fmt::format("truncated: needs {} bytes at offset {}, {} left",
                             need, pos_, remaining()));
}

bool Parser::Underflow(size_t need) {
  return Invalid(
      fmt::format("stack underflow: needs {} value{}, {} available{}", need,
                  need == 1 ? "" : "s", stack_.size() - fence_,
                  marks_.empty() ? "" : " above the innermost MARK"));
}

bool Parser::ReadLine(std::string_view* line) {
  const char* start = data_.data() + pos_;
  const void* nl = std::memchr(start, '\n', remaining());
  if (nl == nullptr) return Invalid("truncated: missing end of line");
  const size_t len = static_cast<const char*>(nl) - start;
  if (len > opts_.max_string_bytes) {
    return Fail(absl::StatusCode::kResourceExhausted,
                fmt::format("line of {} bytes exceeds max_string_bytes {}", len,
                            opts_.max_string_bytes));
  }
  *line = std::string_view(start, len);
  pos_ += len + 1;
  return true;
}

bool Parser::CheckLength(uint64_t len) {
  if (ABSL_PREDICT_FALSE(len > remaining())) {
    return Invalid(fmt::format("truncated: length {} exceeds the {} bytes left",
                               len, remaining()));
  }
  if (ABSL_PREDICT_FALSE(len > opts_.max_string_bytes)) {
    return Fail(absl::StatusCode::kResourceExhausted,
                fmt::format("length {} exceeds max_string_bytes {}", len,
                            opts_.max_string_bytes));
  }
  return true;
}

bool Parser::PopMark(size_t* mark) {
  if (ABSL_PREDICT_FALSE(marks_.empty()))
    return Invalid("no MARK on the stack");
  *mark = marks_.back();
  marks_.pop_back();
  fence_ = marks_.empty() ? 0 : marks_.back();
  return true;
}

bool Parser::PopMarkWithTarget(size_t* mark) {
  if (!PopMark(mark)) return false;
  if (ABSL_PREDICT_FALSE(*mark <= fence_)) {
    return Invalid("stack underflow: no target value below the MARK");
  }
  return true;
}

bool Parser::MarkToContainer(Kind kind) {
  size_t mark = 0;
  if (!PopMark(&mark)) return false;
  const size_t n = stack_.size() - mark;
  Value* v = New(kind, 8 * n);
  if (v == nullptr) return false;
  v->items.assign(stack_.begin() + mark, stack_.end());
  stack_.resize(mark);
  return Push(v);
}

bool Parser::String(Kind kind, uint64_t len) {
  if (!CheckLength(len)) return false;
  const char* s = data_.data() + pos_;
  if (kind == Kind::kString && ABSL_PREDICT_FALSE(!IsValidUtf8(s, len))) {
    return Invalid("string is not valid UTF-8");
  }
  Value* v = New(kind, len);
  if (v == nullptr) return false;
  v->str.assign(s, len);
  pos_ += len;
  return Push(v);
}

bool Parser::Long(uint64_t len) {
  if (!CheckLength(len)) return false;
  Value* v = New(Kind::kInt, len);
  if (v == nullptr) return false;
  SetIntFromBytes(reinterpret_cast<const uint8_t*>(data_.data() + pos_), len,
                  v);
  pos_ += len;
  return Push(v);
}

bool Parser::TextInt(bool allow_bool) {
  std::string_view line;
  if (!ReadLine(&line)) return false;
  if (allow_bool && line == "00") return PushShared(&false_, Kind::kBool, 0);
  if (allow_bool && line == "01") return PushShared(&true_, Kind::kBool, 1);
  if (!allow_bool && !line.empty() && line.back() == 'L') line.remove_suffix(1);
  Value* v = New(Kind::kInt, line.size());
  if (v == nullptr) return false;
  if (!ParseDecimalInt(line, v)) {
    return Invalid(fmt::format("bad integer literal ({} bytes)", line.size()));
  }
  return Push(v);
}

bool Parser::TextFloat() {
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
  Value* v = New(Kind::kFloat);
  if (v == nullptr) return false;
  v->f = d;
  return Push(v);
}

bool Parser::TextString() {
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
  Value* v = New(Kind::kString, scratch_.size());
  if (v == nullptr) return false;
  v->str = scratch_;
  return Push(v);
}

bool Parser::TextUnicode() {
  std::string_view line;
  if (!ReadLine(&line)) return false;
  if (!RawUnicodeEscapeDecode(line, &scratch_))
    return Invalid("bad \\u escape in UNICODE");
  Value* v = New(Kind::kString, scratch_.size());
  if (v == nullptr) return false;
  v->str = scratch_;
  return Push(v);
}

bool Parser::Global() {
  std::string_view module, name;
  if (!ReadLine(&module) || !ReadLine(&name)) return false;
  if (!IsValidUtf8(module.data(), module.size()) ||
      !IsValidUtf8(name.data(), name.size())) {
    return Invalid("GLOBAL name is not valid UTF-8");
  }
  Value* v = New(Kind::kGlobal, module.size() + name.size());
  if (v == nullptr) return false;
  v->module.assign(module);
  v->name.assign(name);
  doc_->globals_.push_back(v);
  return Push(v);
}

bool Parser::StackGlobal() {
  if (!Require(2)) return false;
  const Value* name = stack_[stack_.size() - 1];
  const Value* module = stack_[stack_.size() - 2];
  if (module->kind != Kind::kString || name->kind != Kind::kString) {
    return Invalid(
        fmt::format("STACK_GLOBAL requires str module and name, got {} and {}",
                    KindName(module->kind), KindName(name->kind)));
  }
  Value* v = New(Kind::kGlobal, module->str.size() + name->str.size());
  if (v == nullptr) return false;
  v->module = module->str;
  v->name = name->str;
  doc_->globals_.push_back(v);
  stack_.resize(stack_.size() - 2);
  return Push(v);
}

bool Parser::TupleN(size_t n) {
  if (!Require(n)) return false;
  Value* v = New(Kind::kTuple, 8 * n);
  if (v == nullptr) return false;
  v->items.assign(stack_.end() - n, stack_.end());
  stack_.resize(stack_.size() - n);
  return Push(v);
}

bool Parser::AppendItems(Value* target, size_t from) {
  const size_t n = stack_.size() - from;
  if (target->kind != Kind::kList && target->kind != Kind::kObject) {
    return Invalid(
        fmt::format("cannot append to a {}", KindName(target->kind)));
  }
  if (!Charge(8 * n)) return false;
  target->items.insert(target->items.end(), stack_.begin() + from,
                       stack_.end());
  stack_.resize(from);
  return true;
}

bool Parser::Append() {
  if (!Require(2)) return false;
  return AppendItems(stack_[stack_.size() - 2], stack_.size() - 1);
}

bool Parser::Appends() {
  size_t mark = 0;
  if (!PopMarkWithTarget(&mark)) return false;
  return AppendItems(stack_[mark - 1], mark);
}

bool Parser::AddEntries(Value* target, size_t from) {
  const size_t n = stack_.size() - from;
  if (n % 2 != 0) return Invalid("odd number of items for SETITEMS");
  if (target->kind != Kind::kDict && target->kind != Kind::kObject) {
    return Invalid(
        fmt::format("cannot set items on a {}", KindName(target->kind)));
  }
  if (!Charge(8 * n)) return false;
  for (size_t k = from; k < stack_.size(); k += 2) {
    target->entries.emplace_back(stack_[k], stack_[k + 1]);
  }
  stack_.resize(from);
  return true;
}

bool Parser::SetItem() {
  if (!Require(3)) return false;
  return AddEntries(stack_[stack_.size() - 3], stack_.size() - 2);
}

bool Parser::SetItems() {
  size_t mark = 0;
  if (!PopMarkWithTarget(&mark)) return false;
  return AddEntries(stack_[mark - 1], mark);
}

bool Parser::AddItems() {
  size_t mark = 0;
  if (!PopMarkWithTarget(&mark)) return false;
  Value* target = stack_[mark - 1];
  if (target->kind != Kind::kSet && target->kind != Kind::kObject) {
    return Invalid(
        fmt::format("cannot add items to a {}", KindName(target->kind)));
  }
  const size_t n = stack_.size() - mark;
  if (!Charge(8 * n)) return false;
  target->items.insert(target->items.end(), stack_.begin() + mark,
                       stack_.end());
  stack_.resize(mark);
  return true;
}

bool Parser::Dict() {
  size_t mark = 0;
  if (!PopMark(&mark)) return false;
  const size_t n = stack_.size() - mark;
  if (n % 2 != 0) return Invalid("odd number of items for DICT");
  Value* v = New(Kind::kDict, 8 * n);
  if (v == nullptr) return false;
  v->entries.reserve(n / 2);
  for (size_t k = mark; k < stack_.size(); k += 2) {
    v->entries.emplace_back(stack_[k], stack_[k + 1]);
  }
  stack_.resize(mark);
  return Push(v);
}

bool Parser::Obj() {
  size_t mark = 0;
  if (!PopMark(&mark)) return false;
  const size_t n = stack_.size() - mark;
  if (n == 0) return Invalid("OBJ needs a class after the MARK");
  Value* args = New(Kind::kTuple, 8 * (n - 1));
  Value* obj = args == nullptr ? nullptr : New(Kind::kObject);
  if (obj == nullptr) return false;
  args->items.assign(stack_.begin() + mark + 1, stack_.end());
  obj->callable = stack_[mark];
  obj->args = args;
  stack_.resize(mark);
  return Push(obj);
}

bool Parser::Inst() {
  // Pushes the GLOBAL and the tuple, then turns them into an Object.
  if (!Global()) return false;
  Value* cls = Pop();
  size_t mark = 0;
  if (!PopMark(&mark)) return false;
  const size_t n = stack_.size() - mark;
  Value* args = New(Kind::kTuple, 8 * n);
  Value* obj = args == nullptr ? nullptr : New(Kind::kObject);
  if (obj == nullptr) return false;
  args->items.assign(stack_.begin() + mark, stack_.end());
  obj->callable = cls;
  obj->args = args;
  stack_.resize(mark);
  return Push(obj);
}

bool Parser::Reduce(bool newobj) {
  if (!Require(2)) return false;
  Value* args = stack_[stack_.size() - 1];
  if (args->kind != Kind::kTuple) {
    return Invalid(
        fmt::format("arguments must be a tuple, got {}", KindName(args->kind)));
  }
  Value* v = New(Kind::kObject);
  if (v == nullptr) return false;
  v->callable = stack_[stack_.size() - 2];
  v->args = args;
  v->newobj = newobj;
  stack_.resize(stack_.size() - 2);
  return Push(v);
}

bool Parser::NewObjEx() {
  if (!Require(3)) return false;
  Value* kwargs = stack_[stack_.size() - 1];
  Value* args = stack_[stack_.size() - 2];
  if (args->kind != Kind::kTuple || kwargs->kind != Kind::kDict) {
    return Invalid(fmt::format("needs a tuple and a dict, got {} and {}",
                               KindName(args->kind), KindName(kwargs->kind)));
  }
  Value* v = New(Kind::kObject);
  if (v == nullptr) return false;
  v->callable = stack_[stack_.size() - 3];
  v->args = args;
  v->kwargs = kwargs;
  v->newobj = true;
  stack_.resize(stack_.size() - 3);
  return Push(v);
}

bool Parser::Build() {
  if (!Require(2)) return false;
  Value* state = stack_[stack_.size() - 1];
  Value* inst = stack_[stack_.size() - 2];
  if (inst->kind != Kind::kObject) {
    return Invalid(fmt::format("cannot BUILD a {}", KindName(inst->kind)));
  }
  inst->state = state;
  stack_.pop_back();
  return true;
}

bool Parser::PersId(Value* pid) {
  Value* v = New(Kind::kPersId);
  if (v == nullptr) return false;
  v->pid = pid;
  return Push(v);
}

bool Parser::CountMemoEntry() {
  if (ABSL_PREDICT_FALSE(memo_count_ >= opts_.max_memo_entries)) {
    return Fail(absl::StatusCode::kResourceExhausted,
                fmt::format("memo limit of {} entries exceeded",
                            opts_.max_memo_entries));
  }
  ++memo_count_;
  return true;
}

bool Parser::MemoPut(uint64_t index) {
  if (!Require(1)) return false;
  Value* v = stack_.back();
  if (index < memo_vec_.size()) {
    if (memo_vec_[index] == nullptr && !CountMemoEntry()) return false;
    memo_vec_[index] = v;
    return true;
  }
  if (!memo_map_.empty()) {
    if (auto it = memo_map_.find(index); it != memo_map_.end()) {
      it->second = v;
      return true;
    }
  }
  if (!CountMemoEntry()) return false;
  // Dense enough for the vector? Its size stays below 2 * entries + 1024, so
  // sparse indices cannot make it large.
  const uint64_t cap = 2 * memo_count_ + 1024;
  if (index < cap) {
    const uint64_t old_size = memo_vec_.size();
    const uint64_t new_size = std::min(std::max(index + 1, 2 * old_size), cap);
    if (!Charge(8 * (new_size - old_size))) return false;
    memo_vec_.resize(new_size, nullptr);
    if (!memo_map_.empty()) {  // keep map keys >= memo_vec_.size()
      std::vector<uint64_t> moved;
      for (const auto& [k, val] : memo_map_) {
        if (k < new_size) {
          memo_vec_[k] = val;
          moved.push_back(k);
        }
      }
      for (uint64_t k : moved) memo_map_.erase(k);
    }
    memo_vec_[index] = v;
    return true;
  }
  if (!Charge(32)) return false;
  memo_map_.emplace(index, v);
  return true;
}

bool Parser::MemoGet(uint64_t index) {
  Value* v = nullptr;
  if (index < memo_vec_.size()) {
    v = memo_vec_[index];
  } else if (auto it = memo_map_.find(index); it != memo_map_.end()) {
    v = it->second;
  }
  if (ABSL_PREDICT_FALSE(v == nullptr)) {
    return Invalid(fmt::format("memo key {} not found", index));
  }
  return Push(v);
}

absl::Status Parser::Run() {
  const size_t size = data_.size();
  while (true) {
    if (ABSL_PREDICT_FALSE(pos_ >= size)) {
      op_pos_ = size;
      Invalid("unexpected end of data (no STOP opcode)");
      return std::move(error_);
    }
    op_pos_ = pos_;
    const auto op = static_cast<uint8_t>(data_[pos_++]);
    uint64_t u = 0;
    bool ok;
    switch (op) {
      // --- ints ---
      case kBinInt1:
        ok = ReadLE(1, &u) && PushInt(static_cast<int64_t>(u));
        break;
      case kBinInt2:
        ok = ReadLE(2, &u) && PushInt(static_cast<int64_t>(u));
        break;
      case kBinInt:
        ok = ReadLE(4, &u) &&
             PushInt(static_cast<int32_t>(static_cast<uint32_t>(u)));
        break;
      case kLong1:
        ok = ReadLE(1, &u) && Long(u);
        break;
      case kLong4:
        ok = ReadLE(4, &u);
        if (ok && static_cast<int32_t>(static_cast<uint32_t>(u)) < 0) {
          ok = Invalid("negative byte count");
        }
        ok = ok && Long(u);
        break;
      case kInt:
        ok = TextInt(/*allow_bool=*/true);
        break;
      case kLong:
        ok = TextInt(/*allow_bool=*/false);
        break;
      // --- other scalars ---
      case kNone:
        ok = PushShared(&none_, Kind::kNone);
        break;
      case kNewTrue:
        ok = PushShared(&true_, Kind::kBool, 1);
        break;
      case kNewFalse:
        ok = PushShared(&false_, Kind::kBool, 0);
        break;
      case kBinFloat: {
        ok = remaining() >= 8 || Truncated(8);
        Value* v = ok ? New(Kind::kFloat) : nullptr;
        ok = v != nullptr;
        if (ok) {
          uint64_t bits = 0;
          for (int k = 0; k < 8; ++k)
            bits = (bits << 8) | static_cast<uint8_t>(data_[pos_ + k]);
          pos_ += 8;
          std::memcpy(&v->f, &bits, 8);
          ok = Push(v);
        }
        break;
      }
      case kFloat:
        ok = TextFloat();
        break;
      // --- strings and bytes ---
      case kShortBinUnicode:
        ok = ReadLE(1, &u) && String(Kind::kString, u);
        break;
      case kBinUnicode:
        ok = ReadLE(4, &u) && String(Kind::kString, u);
        break;
      case kBinUnicode8:
        ok = ReadLE(8, &u) && String(Kind::kString, u);
        break;
      case kShortBinBytes:
        ok = ReadLE(1, &u) && String(Kind::kBytes, u);
        break;
      case kBinBytes:
        ok = ReadLE(4, &u) && String(Kind::kBytes, u);
        break;
      case kBinBytes8:
      case kByteArray8:
        ok = ReadLE(8, &u) && String(Kind::kBytes, u);
        break;
      case kShortBinString:
        ok = ReadLE(1, &u) && String(Kind::kString, u);
        break;
      case kBinString:
        ok = ReadLE(4, &u);
        if (ok && static_cast<int32_t>(static_cast<uint32_t>(u)) < 0) {
          ok = Invalid("negative byte count");
        }
        ok = ok && String(Kind::kString, u);
        break;
      case kString:
        ok = TextString();
        break;
      case kUnicode:
        ok = TextUnicode();
        break;
      // --- containers ---
      case kEmptyTuple:
        ok = PushShared(&empty_tuple_, Kind::kTuple);
        break;
      case kEmptyList:
        ok = PushNew(Kind::kList);
        break;
      case kEmptyDict:
        ok = PushNew(Kind::kDict);
        break;
      case kEmptySet:
        ok = PushNew(Kind::kSet);
        break;
      case kTuple1:
        ok = TupleN(1);
        break;
      case kTuple2:
        ok = TupleN(2);
        break;
      case kTuple3:
        ok = TupleN(3);
        break;
      case kTuple:
        ok = MarkToContainer(Kind::kTuple);
        break;
      case kList:
        ok = MarkToContainer(Kind::kList);
        break;
      case kFrozenSet:
        ok = MarkToContainer(Kind::kSet);
        break;
      case kDict:
        ok = Dict();
        break;
      case kAppend:
        ok = Append();
        break;
      case kAppends:
        ok = Appends();
        break;
      case kSetItem:
        ok = SetItem();
        break;
      case kSetItems:
        ok = SetItems();
        break;
      case kAddItems:
        ok = AddItems();
        break;
      // --- stack manipulation ---
      case kMark:
        if (ABSL_PREDICT_FALSE(
                marks_.size() >=
                static_cast<size_t>(std::max(opts_.max_mark_depth, 0)))) {
          ok = Fail(absl::StatusCode::kResourceExhausted,
                    fmt::format("MARK depth limit of {} exceeded",
                                opts_.max_mark_depth));
        } else {
          marks_.push_back(stack_.size());
          fence_ = stack_.size();
          ok = true;
        }
        break;
      case kPop:
        // Like CPython: POP with nothing above the innermost MARK drops it.
        if (stack_.size() > fence_) {
          stack_.pop_back();
          ok = true;
        } else if (!marks_.empty()) {
          size_t mark = 0;
          ok = PopMark(&mark);
        } else {
          ok = Underflow(1);
        }
        break;
      case kPopMark: {
        size_t mark = 0;
        ok = PopMark(&mark);
        if (ok) stack_.resize(mark);
        break;
      }
      case kDup:
        ok = Require(1) && Push(stack_.back());
        break;
      // --- memo ---
      case kBinPut:
        ok = ReadLE(1, &u) && MemoPut(u);
        break;
      case kLongBinPut:
        ok = ReadLE(4, &u) && MemoPut(u);
        break;
      case kMemoize:
        ok = MemoPut(memo_count_);
        break;
      case kBinGet:
        ok = ReadLE(1, &u) && MemoGet(u);
        break;
      case kLongBinGet:
        ok = ReadLE(4, &u) && MemoGet(u);
        break;
      case kPut:
      case kGet: {
        std::string_view line;
        ok = ReadLine(&line);
        if (ok && !ParseDecimalU64(line, &u)) ok = Invalid("bad memo index");
        if (ok) ok = op == kPut ? MemoPut(u) : MemoGet(u);
        break;
      }
      // --- objects ---
      case kGlobal:
        ok = Global();
        break;
      case kStackGlobal:
        ok = StackGlobal();
        break;
      case kReduce:
        ok = Reduce(/*newobj=*/false);
        break;
      case kNewObj:
        ok = Reduce(/*newobj=*/true);
        break;
      case kNewObjEx:
        ok = NewObjEx();
        break;
      case kBuild:
        ok = Build();
        break;
      case kInst:
        ok = Inst();
        break;
      case kObj:
        ok = Obj();
        break;
      case kBinPersId:
        ok = Require(1) && PersId(Pop());
        break;
      case kPersId: {
        std::string_view line;
        ok = ReadLine(&line);
        if (ok && !IsValidUtf8(line.data(), line.size())) {
          ok = Invalid("persistent id is not valid UTF-8");
        }
        Value* pid = ok ? New(Kind::kString, line.size()) : nullptr;
        ok = pid != nullptr;
        if (ok) {
          pid->str.assign(line);
          ok = PersId(pid);
        }
        break;
      }
      // --- framing ---
      case kProto:
        ok = ReadLE(1, &u);
        if (ok && u > kHighestProtocol) {
          ok = Invalid(fmt::format("unsupported pickle protocol {}", u));
        }
        break;
      case kFrame:
        // Frames are in-band: the opcodes follow; only check the length.
        ok = ReadLE(8, &u);
        if (ok && u > remaining()) {
          ok = Invalid(fmt::format("truncated: frame of {} bytes, {} left", u,
                                   remaining()));
        }
        break;
      case kStop:
        if (!Require(1)) return std::move(error_);
        doc_->root_ = stack_.back();
        return absl::OkStatus();
      case kExt1:
      case kExt2:
      case kExt4:
      case kNextBuffer:
      case kReadOnlyBuffer:
        ok = Invalid("unsupported opcode");
        break;
      default:
        ok = Invalid("unknown opcode");
        break;
    }
    if (ABSL_PREDICT_FALSE(!ok)) return std::move(error_);
  }
}

Value* PickleDocument::NewValue() {
  if (used_in_last_block_ == kBlockValues) {
    blocks_.push_back(std::make_unique<Value[]>(kBlockValues));
    used_in_last_block_ = 0;
  }
  return &blocks_.back()[used_in_last_block_++];
}

absl::StatusOr<std::unique_ptr<PickleDocument>> Parse(
    std::string_view data, const ReaderOptions& options) {
  auto doc = std::make_unique<PickleDocument>();
  Parser parser(data, options, doc.get());
  RETURN_IF_ERROR(parser.Run());
  return doc;
}

}  // namespace ckptd::pickle
