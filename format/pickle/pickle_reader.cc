// Copyright 2026 The ckptd Authors.
//
// Bounded pickle reader (see pickle.h; dcp-format.md §2.1, §3.6): the value
// model of pickle::Parse, a graph of Values, run by the pickle machine
// (pickle_machine.h: opcodes, operands, MARKs, limits and errors).
//
// The machine is a single pass over the input: every opcode does O(1 +
// operand size + items popped) work, so parsing is linear in the input.
// Every read is checked against the remaining input, and every length
// operand is checked against the remaining input and the limits before
// anything is allocated.
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
#include <utility>

#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "format/pickle/pickle.h"
#include "format/pickle/pickle_machine.h"
#include "format/pickle/pickle_source.h"
#include "format/pickle/pickle_util.h"

namespace ckptd::pickle {

// The value model of Parse: the hooks of internal::Machine (see
// pickle_machine.h) over a stack of Value pointers. One instance per Parse.
class Parser : public internal::Machine<Parser> {
 public:
  // The input is one string in memory: a line is measured to its end.
  static constexpr bool kWholeLines = true;
  // Every failing body returns false.
  static constexpr bool kErrorsBesideSteps = false;

  Parser(internal::Source& in, internal::MachineState& m,
         const ReaderOptions& options, PickleDocument* doc)
      : Machine(in, m), max_alloc_bytes_(options.max_alloc_bytes), doc_(doc) {}

 private:
  friend class internal::Machine<Parser>;

  // --- the machine's view of the stack
  size_t stack_size() const { return stack_.size(); }
  bool Is(size_t i, Kind kind) const { return stack_[i]->kind == kind; }
  std::string_view KindNameAt(size_t i) const {
    return KindName(stack_[i]->kind);
  }
  bool FastPath() { return false; }

  // --- allocation
  bool Charge(uint64_t bytes) {
    doc_->allocated_ += bytes;
    if (ABSL_PREDICT_FALSE(doc_->allocated_ > max_alloc_bytes_)) {
      return Exhausted(fmt::format("allocation limit of {} bytes exceeded",
                                   max_alloc_bytes_));
    }
    return true;
  }
  Value* New(Kind kind, uint64_t extra_bytes = 0) {
    if (!Charge(sizeof(Value) + extra_bytes)) return nullptr;
    Value* v = doc_->NewValue();
    v->kind = kind;
    return v;
  }

  // --- the stack
  bool Push(Value* v) {
    if (ABSL_PREDICT_FALSE(stack_.size() >= m_.limits.max_stack_depth)) {
      return StackFull();
    }
    stack_.push_back(v);
    return true;
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
  // A new string-like value holding `s`.
  bool PushStr(Kind kind, std::string_view s) {
    Value* v = New(kind, s.size());
    if (v == nullptr) return false;
    v->str.assign(s);
    return Push(v);
  }
  // Moves stack[from, end) into `items`, charging 8 bytes per item.
  bool MoveItems(size_t from, std::vector<const Value*>* items) {
    if (!Charge(8 * (stack_.size() - from))) return false;
    items->insert(items->end(), stack_.begin() + from, stack_.end());
    stack_.resize(from);
    return true;
  }
  // Pushes a new kObject calling `callable` with a tuple of stack[from,
  // end), after cutting the stack to `to`.
  bool PushCall(Value* callable, size_t from, size_t to);

  // --- opcode bodies (the machine's hooks)
  bool PushNone() { return PushShared(&none_, Kind::kNone); }
  bool PushBool(bool b) {
    return b ? PushShared(&true_, Kind::kBool, 1)
             : PushShared(&false_, Kind::kBool, 0);
  }
  bool PushInt(int64_t i);
  bool PushFloat(double d);
  bool PushLong(std::string_view le);
  bool PushIntLiteral(std::string_view digits);
  bool PushString(std::string_view utf8) {
    return PushStr(Kind::kString, utf8);
  }
  bool PushTextString(std::string_view utf8) { return PushString(utf8); }
  bool PushBytes(std::string_view raw) { return PushStr(Kind::kBytes, raw); }
  bool PushGlobal(std::string_view module, std::string_view name);
  bool StackGlobal();
  bool PushEmptyTuple() { return PushShared(&empty_tuple_, Kind::kTuple); }
  bool PushEmpty(Kind kind) {
    Value* v = New(kind);
    return v != nullptr && Push(v);
  }
  bool Collect(Kind kind, size_t from);
  bool Dict(size_t from);
  bool Append(size_t target, size_t from) {
    return MoveItems(from, &stack_[target]->items);
  }
  bool SetItems(size_t target, size_t from);
  bool AddItems(size_t target, size_t from) { return Append(target, from); }
  bool Reduce(bool newobj);
  bool NewObjEx();
  bool Build() {
    stack_[stack_.size() - 2]->state = stack_.back();
    stack_.pop_back();
    return true;
  }
  bool Obj(size_t mark) { return PushCall(stack_[mark], mark + 1, mark); }
  bool Inst(size_t mark) {
    Value* cls = stack_.back();
    stack_.pop_back();
    return PushCall(cls, mark, mark);
  }
  bool BinPersId() {
    Value* pid = stack_.back();
    stack_.pop_back();
    return PersId(pid);
  }
  bool PersIdText(std::string_view pid);
  bool PersId(Value* pid);
  void PopTop() { stack_.pop_back(); }
  void Truncate(size_t n) { stack_.resize(n); }
  bool Dup() { return Push(stack_.back()); }
  bool MemoPut(uint64_t index);
  bool MemoNext() { return MemoPut(m_.memo_count); }
  bool MemoGet(uint64_t index);
  void Finish() { doc_->root_ = stack_.back(); }

  const uint64_t max_alloc_bytes_;
  PickleDocument* doc_;
  std::vector<Value*> stack_;

  // Memo: dense indices in a vector (size kept below MemoDenseLimit), the
  // rest in a hash map; no map key is < memo_vec_.size().
  std::vector<Value*> memo_vec_;
  absl::flat_hash_map<uint64_t, Value*> memo_map_;

  // Immutable values shared by every occurrence (CPython shares them too),
  // which keeps large .metadata pickles much smaller.
  Value* none_ = nullptr;
  Value* true_ = nullptr;
  Value* false_ = nullptr;
  Value* empty_tuple_ = nullptr;
  std::array<Value*, 256> small_ints_{};
};

bool Parser::PushInt(int64_t i) {
  if (static_cast<uint64_t>(i) < small_ints_.size()) {
    return PushShared(&small_ints_[i], Kind::kInt, i);
  }
  Value* v = New(Kind::kInt);
  if (v == nullptr) return false;
  v->i = i;
  return Push(v);
}

bool Parser::PushFloat(double d) {
  Value* v = New(Kind::kFloat);
  if (v == nullptr) return false;
  v->f = d;
  return Push(v);
}

// The integer in little-endian two's-complement bytes: kInt if it fits in
// int64, else kBigInt with the minimal bytes.
bool Parser::PushLong(std::string_view le) {
  Value* v = New(Kind::kInt, le.size());
  if (v == nullptr) return false;
  if (!internal::IntFromBytes(reinterpret_cast<const uint8_t*>(le.data()),
                              le.size(), &v->i, &v->str)) {
    v->kind = Kind::kBigInt;
  }
  return Push(v);
}

bool Parser::PushIntLiteral(std::string_view digits) {
  Value* v = New(Kind::kInt, digits.size());
  if (v == nullptr) return false;
  bool fits = false;
  if (!ParseIntLiteral(digits, &v->i, &v->str, &fits)) return false;
  if (!fits) v->kind = Kind::kBigInt;
  return Push(v);
}

bool Parser::PushGlobal(std::string_view module, std::string_view name) {
  Value* v = New(Kind::kGlobal, module.size() + name.size());
  if (v == nullptr) return false;
  v->module.assign(module);
  v->name.assign(name);
  doc_->globals_.push_back(v);
  return Push(v);
}

bool Parser::StackGlobal() {
  const Value* name = stack_[stack_.size() - 1];
  const Value* module = stack_[stack_.size() - 2];
  Value* v = New(Kind::kGlobal, module->str.size() + name->str.size());
  if (v == nullptr) return false;
  v->module = module->str;
  v->name = name->str;
  doc_->globals_.push_back(v);
  stack_.resize(stack_.size() - 2);
  return Push(v);
}

bool Parser::Collect(Kind kind, size_t from) {
  Value* v = New(kind, 8 * (stack_.size() - from));
  if (v == nullptr) return false;
  v->items.assign(stack_.begin() + from, stack_.end());
  stack_.resize(from);
  return Push(v);
}

bool Parser::Dict(size_t from) {
  const size_t n = stack_.size() - from;
  Value* v = New(Kind::kDict, 8 * n);
  if (v == nullptr) return false;
  v->entries.reserve(n / 2);
  for (size_t k = from; k < stack_.size(); k += 2) {
    v->entries.emplace_back(stack_[k], stack_[k + 1]);
  }
  stack_.resize(from);
  return Push(v);
}

bool Parser::SetItems(size_t target, size_t from) {
  if (!Charge(8 * (stack_.size() - from))) return false;
  Value* t = stack_[target];
  for (size_t k = from; k < stack_.size(); k += 2) {
    t->entries.emplace_back(stack_[k], stack_[k + 1]);
  }
  stack_.resize(from);
  return true;
}

bool Parser::PushCall(Value* callable, size_t from, size_t to) {
  Value* args = New(Kind::kTuple, 8 * (stack_.size() - from));
  Value* obj = args == nullptr ? nullptr : New(Kind::kObject);
  if (obj == nullptr) return false;
  args->items.assign(stack_.begin() + from, stack_.end());
  obj->callable = callable;
  obj->args = args;
  stack_.resize(to);
  return Push(obj);
}

bool Parser::Reduce(bool newobj) {
  Value* v = New(Kind::kObject);
  if (v == nullptr) return false;
  v->callable = stack_[stack_.size() - 2];
  v->args = stack_[stack_.size() - 1];
  v->newobj = newobj;
  stack_.resize(stack_.size() - 2);
  return Push(v);
}

bool Parser::NewObjEx() {
  Value* v = New(Kind::kObject);
  if (v == nullptr) return false;
  v->callable = stack_[stack_.size() - 3];
  v->args = stack_[stack_.size() - 2];
  v->kwargs = stack_[stack_.size() - 1];
  v->newobj = true;
  stack_.resize(stack_.size() - 3);
  return Push(v);
}

bool Parser::PersIdText(std::string_view pid) {
  Value* v = New(Kind::kString, pid.size());
  if (v == nullptr) return false;
  v->str.assign(pid);
  return PersId(v);
}

bool Parser::PersId(Value* pid) {
  Value* v = New(Kind::kPersId);
  if (v == nullptr) return false;
  v->pid = pid;
  return Push(v);
}

bool Parser::MemoPut(uint64_t index) {
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
  const uint64_t cap = internal::MemoDenseLimit(m_.memo_count);
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
  if (ABSL_PREDICT_FALSE(v == nullptr)) return MemoKeyNotFound(index);
  return Push(v);
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
  internal::Source in(data);
  internal::MachineState machine(options, options.source_name);
  Parser parser(in, machine, options, doc.get());
  RETURN_IF_ERROR(parser.Run());
  return doc;
}

}  // namespace ckptd::pickle
