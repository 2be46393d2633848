// Copyright 2026 The ckptd Authors.
//
// Internal to the streaming `.metadata` decoder: the opcode bodies of its
// pickle VM (metadata_vm.h), run by the pickle machine
// (format/pickle/pickle_machine.h), as a class sharing the Vm's state.
#ifndef CKPTD_FORMAT_METADATA_METADATA_VM_OPS_H_
#define CKPTD_FORMAT_METADATA_METADATA_VM_OPS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "common/absl_fmt.h"
#include "fmt/format.h"
#include "format/metadata/metadata_schema.h"
#include "format/metadata/metadata_vm.h"
#include "format/pickle/pickle.h"
#include "format/pickle/pickle_machine.h"
#include "format/pickle/pickle_util.h"

namespace ckptd::format::mdvm {

using ::ckptd::pickle::internal::LoadLE;

// The KnownClass of a global.
int ClassOf(std::string_view module, std::string_view name);

// Copies Val::w one 8-byte word at a time: `src` may have been written just
// before by 8-byte stores, and a wider (vectorized) load over several of
// them would stall on store forwarding.
inline void CopyWords(int64_t* dst, const int64_t* src) {
  for (int i = 0; i < 4; ++i) {
    int64_t x = src[i];
    asm("" : "+r"(x));
    dst[i] = x;
  }
}

// The value model of the VM: the hooks of the pickle machine
// (pickle_machine.h) over Vm's stack of Vals, folding what the schema can
// fold as it leaves the stack.
class Vm::Ops : public pickle::internal::Machine<Vm::Ops> {
 public:
  // A stream buffers no more than max_string_bytes + 1 bytes of a line.
  static constexpr bool kWholeLines = false;
  // The heap's charges (Vm::Charge, the folds) set the error and go on.
  static constexpr bool kErrorsBesideSteps = true;

  explicit Ops(Vm& vm) : Machine(vm.src_, vm.machine_), vm_(vm) {}

 private:
  friend class pickle::internal::Machine<Vm::Ops>;
  using PKind = pickle::Value::Kind;

  // --- the machine's view of the stack
  size_t stack_size() const { return vm_.stack_.size(); }
  bool Is(size_t i, PKind kind) const {
    const Val& v = vm_.stack_[i];
    switch (kind) {
      case PKind::kString:
        return v.tag == Tag::kStr;
      case PKind::kTuple:
        return v.tag == Tag::kIntSeq || v.tag == Tag::kIntSeq1 ||
               IsNode(v, NodeKind::kTuple);
      case PKind::kList:
        return IsNode(v, NodeKind::kList);
      case PKind::kDict:
        return IsNode(v, NodeKind::kDict);
      case PKind::kSet:
        return IsNode(v, NodeKind::kSet);
      case PKind::kObject:
        return IsObject(v);
      default:
        return false;
    }
  }
  std::string_view KindNameAt(size_t i) const;
  // The superinstructions at a GET (metadata_vm_fast.cc), and MEMOIZE, the
  // most frequent opcode of protocol-4/5 pickles (half of them), ahead of
  // the machine's dispatch.
  ABSL_ATTRIBUTE_ALWAYS_INLINE bool FastPath() {
    if (ABSL_PREDICT_FALSE(in_.buffered() == 0)) return false;
    const auto op = static_cast<uint8_t>(*in_.cursor());
    if ((op == pickle::internal::kBinGet ||
         op == pickle::internal::kLongBinGet) &&
        ((op == pickle::internal::kBinGet && SizeSequence()) || ObjectRun())) {
      return true;
    }
    if (op != pickle::internal::kMemoize) return false;
    m_.op = op;
    in_.Advance(1);
    Step(pickle::internal::kMemoize);
    return true;
  }

  // --- the stack
  ABSL_ATTRIBUTE_ALWAYS_INLINE bool Push(const Val& v) {
    if (ABSL_PREDICT_FALSE(vm_.stack_.size() >= m_.limits.max_stack_depth)) {
      return StackFull();
    }
    vm_.stack_.push_back(v);
    return true;
  }
  // A new zeroed value on top of the stack (nullptr: the stack limit, the
  // error is set). Values are built in place: a Val built in a local and
  // copied would be read back with wide loads over the narrow stores that
  // just wrote it (a store-forwarding stall on every push).
  ABSL_ATTRIBUTE_ALWAYS_INLINE Val* Slot() {
    if (ABSL_PREDICT_FALSE(vm_.stack_.size() >= m_.limits.max_stack_depth)) {
      StackFull();
      return nullptr;
    }
    return &vm_.stack_.emplace_back();
  }
  bool PushTagged(Tag tag, int64_t w0, uint32_t a = 0) {
    Val* v = Slot();
    if (v == nullptr) return false;
    v->tag = tag;
    v->a = a;
    v->w[0] = w0;
    return true;
  }
  bool PushNode(uint64_t id) {
    return PushTagged(Tag::kNode, static_cast<int64_t>(id));
  }
  // Moves stack[from, end) off the stack into `out`, folding each.
  void Consume(size_t from, std::vector<Val>* out) {
    for (size_t k = from; k < vm_.stack_.size(); ++k) {
      vm_.schema_->Fold(&vm_.stack_[k]);
      out->push_back(vm_.stack_[k]);
    }
    vm_.stack_.resize(from);
  }
  // Folds stack[from, end) and drops it: what is added to a folded object
  // (nothing reads it).
  void DropFolded(size_t from) {
    for (size_t k = from; k < vm_.stack_.size(); ++k) {
      vm_.schema_->Fold(&vm_.stack_[k]);
    }
    vm_.stack_.resize(from);
  }
  // A tuple of stack[from, end): a kIntSeq when every item is an int.
  bool MakeTuple(size_t from) {
    const size_t n = vm_.stack_.size() - from;
    bool ints = true;
    for (size_t k = from; k < vm_.stack_.size() && ints; ++k) {
      ints = vm_.stack_[k].tag == Tag::kInt;
    }
    if (n == 1 && vm_.stack_[from].tag == Tag::kIntSeq) {
      Val& v = vm_.stack_[from];  // in place
      v.tag = Tag::kIntSeq1;
      v.flags = 0;
      return true;
    }
    if (ints) {
      int64_t small[4];
      std::vector<int64_t> big;
      int64_t* p = small;
      if (n > 4) {
        big.resize(n);
        p = big.data();
      }
      for (size_t k = 0; k < n; ++k) p[k] = vm_.stack_[from + k].w[0];
      vm_.stack_.resize(from);
      Val* v = Slot();
      if (v == nullptr) return false;
      vm_.FillInts(v, Tag::kIntSeq, {p, n});
      return true;
    }
    return MakeContainer(NodeKind::kTuple, from);
  }
  // A list, set or tuple node of stack[from, end).
  bool MakeContainer(NodeKind kind, size_t from) {
    const uint64_t id = vm_.NewNodeId(kind);
    Node& n = vm_.nodes_[id];
    n.typed_chunks = false;
    const size_t cap = n.items.capacity();
    n.items.reserve(vm_.stack_.size() - from);
    Consume(from, &n.items);
    if (!vm_.Charge(sizeof(Val) * (n.items.capacity() - cap))) return false;
    return PushNode(id);
  }
  bool NewContainer(NodeKind kind) {
    const uint64_t id = vm_.NewNodeId(kind);
    return m_.error.ok() && PushNode(id);
  }
  static NodeKind NodeKindOf(PKind kind) {
    return kind == PKind::kList   ? NodeKind::kList
           : kind == PKind::kSet  ? NodeKind::kSet
           : kind == PKind::kDict ? NodeKind::kDict
                                  : NodeKind::kTuple;
  }

  bool IsNode(const Val& v, NodeKind kind) const {
    return v.tag == Tag::kNode && vm_.nodes_[v.w[0]].kind == kind;
  }
  // Folded objects and object nodes accept what REDUCE results accept.
  bool IsObject(const Val& v) const {
    switch (v.tag) {
      case Tag::kSize:
      case Tag::kChunk:
      case Tag::kProps:
      case Tag::kTensor:
      case Tag::kBytesMd:
      case Tag::kIndex:
      case Tag::kInfo:
        return true;
      case Tag::kNode:
        return vm_.nodes_[v.w[0]].kind == NodeKind::kObject;
      default:
        return false;
    }
  }

  // --- opcode bodies (the machine's hooks)
  bool PushNone() { return Slot() != nullptr; }
  bool PushBool(bool b) { return PushTagged(Tag::kBool, 0, b); }
  bool PushInt(int64_t i) { return PushTagged(Tag::kInt, i); }
  bool PushFloat(double d) {
    Val v;
    v.tag = Tag::kFloat;
    std::memcpy(&v.w[0], &d, 8);
    return Push(v);
  }
  bool PushLong(std::string_view le);
  bool PushIntLiteral(std::string_view digits);
  bool PushString(std::string_view utf8);
  bool PushTextString(std::string_view utf8);
  // *v: a str from a text operand (charged whether or not it is new).
  bool TextStr(std::string_view utf8, Val* v);
  bool PushBytes(std::string_view raw);
  bool PushGlobal(std::string_view module, std::string_view name);
  bool StackGlobal();
  bool PushEmptyTuple() { return PushTagged(Tag::kIntSeq, 0); }
  bool PushEmpty(PKind kind) { return NewContainer(NodeKindOf(kind)); }
  bool Collect(PKind kind, size_t from) {
    return kind == PKind::kTuple ? MakeTuple(from)
                                 : MakeContainer(NodeKindOf(kind), from);
  }
  bool Dict(size_t from);
  bool Append(size_t target, size_t from);
  bool SetItems(size_t target, size_t from);
  bool AddItems(size_t target, size_t from);
  bool Reduce(bool newobj);
  bool NewObjEx();
  bool Build();
  bool Obj(size_t mark);
  bool Inst(size_t mark);
  bool BinPersId();
  bool PersIdText(std::string_view pid);
  bool PersId(const Val& pid);
  void PopTop() { vm_.stack_.pop_back(); }
  void Truncate(size_t n) { vm_.stack_.resize(n); }
  bool Dup() {
    Val& top = vm_.stack_.back();
    top.flags |= kShared;
    const Val copy = top;  // the push may move the stack
    return Push(copy);
  }
  bool MemoPut(uint64_t index);
  bool MemoNext();
  bool MemoGet(uint64_t index);
  void Finish() {
    vm_.schema_->Fold(&vm_.stack_.back());
    vm_.root_ = vm_.stack_.back();
  }
  // Counts slot `index` in use (a new one within the memo limit).
  bool UseSlot(uint64_t index);
  // The top of the stack into memo slot `index` if some GET reads it back
  // (flagged shared: it may still change).
  void Keep(uint64_t index);

  // Fast paths (metadata_vm_fast.cc): bytes of the buffer from `at`.
  struct Bytes {
    const char* p;
    size_t avail;
    size_t at;
    bool Has(size_t n) const { return avail - at >= n; }
    uint8_t U8(size_t k) const { return static_cast<uint8_t>(p[at + k]); }
    uint64_t LE(size_t k, int n) const { return LoadLE(p + at + k, n); }
    // The opcode at `at`, past any FRAME header whose frame lies in the
    // buffer (a FRAME only checks its length); 0 at the end.
    uint8_t Op() {
      while (true) {
        if (at >= avail) return 0;
        const uint8_t op = U8(0);
        if (ABSL_PREDICT_TRUE(op != ::ckptd::pickle::internal::kFrame)) {
          return op;
        }
        if (!Has(9) || LE(1, 8) > avail - at - 9) return 0;
        at += 9;
      }
    }
    // Skips `op` if it is next: 1, else 0.
    int Skip(uint8_t op) {
      if (Op() != op) return 0;
      ++at;
      return 1;
    }
  };
  const Val* PeekGet(Bytes& b) const;
  static bool PeekInt(Bytes& b, uint8_t op, int64_t* out);
  bool PeekSize(Bytes& b, Val* out, int* memoized) const;
  bool PeekValue(Bytes& b, Val* out, int* memoized) const;
  bool PeekObject(Bytes& b, Val* out, int* memoized) const;
  bool FreshMemos(uint64_t count) const;
  bool SizeSequence();
  bool ObjectRun();

  Vm& vm_;
  std::vector<Val> run_;         // ObjectRun's values
  uint64_t fast_off_until_ = 0;  // ObjectRun declined up to here
};

}  // namespace ckptd::format::mdvm

#endif  // CKPTD_FORMAT_METADATA_METADATA_VM_OPS_H_
