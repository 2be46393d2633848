// Copyright 2026 The ckptd Authors.
//
// Internal to the streaming `.metadata` decoder: the opcode bodies of its
// pickle VM (metadata_vm.h), as a class sharing the Vm's state.
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
#include "format/pickle/pickle_util.h"

namespace ckptd::format::mdvm {

using ::ckptd::pickle::internal::LoadLE;
using ::ckptd::pickle::internal::OpName;

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

class Vm::Ops {
 public:
  explicit Ops(Vm& vm) : vm_(vm), src_(vm.src_) {}

  absl::Status Run();

 private:
  using Kind = NodeKind;

  bool Fail(absl::StatusCode code, std::string_view what) {
    if (!vm_.error_.ok()) return false;
    std::string op;
    if (vm_.op_pos_ < src_.size()) {
      const uint8_t c = vm_.op_;
      op = c >= 0x20 && c < 0x7f
               ? fmt::format("opcode 0x{:02x} '{}' ({}): ", c,
                             static_cast<char>(c), OpName(c))
               : fmt::format("opcode 0x{:02x} ({}): ", c, OpName(c));
    }
    vm_.error_ =
        absl::Status(code, fmt::format("{}: offset {}: {}{}", vm_.source_name_,
                                       vm_.op_pos_, op, what));
    return false;
  }
  bool Invalid(std::string_view what) {
    return Fail(absl::StatusCode::kInvalidArgument, what);
  }
  bool Exhausted(std::string_view what) {
    return Fail(absl::StatusCode::kResourceExhausted, what);
  }
  bool IoFailed() {
    if (!vm_.error_.ok()) return false;
    vm_.error_ = absl::DataLossError(fmt::format("{}: offset {}: {}",
                                                 vm_.source_name_, src_.pos(),
                                                 src_.io_status().message()));
    return false;
  }
  ABSL_ATTRIBUTE_NOINLINE bool Truncated(uint64_t need) {
    if (!src_.io_status().ok()) return IoFailed();
    return Invalid(
        fmt::format("truncated: needs {} bytes at offset {}, {} left", need,
                    src_.pos(), src_.remaining()));
  }
  ABSL_ATTRIBUTE_NOINLINE bool Underflow(size_t need) {
    return Invalid(
        fmt::format("stack underflow: needs {} value{}, {} available{}", need,
                    need == 1 ? "" : "s", vm_.stack_.size() - vm_.fence_,
                    vm_.marks_.empty() ? "" : " above the innermost MARK"));
  }

  bool ReadLE(int n, uint64_t* v) {
    const char* p = src_.Peek(n);
    if (ABSL_PREDICT_FALSE(p == nullptr)) return Truncated(n);
    *v = LoadLE(p, n);
    src_.Advance(n);
    return true;
  }
  bool ReadLine(std::string_view* line) {
    bool too_long = false;
    const int64_t len =
        src_.LineLength(vm_.limits_.max_string_bytes, &too_long);
    if (len < 0) {
      if (!src_.io_status().ok()) return IoFailed();
      if (too_long) {
        return Exhausted(fmt::format(
            "line of more than {} bytes exceeds max_string_bytes {}",
            vm_.limits_.max_string_bytes, vm_.limits_.max_string_bytes));
      }
      return Invalid("truncated: missing end of line");
    }
    *line = std::string_view(src_.Peek(len + 1), len);
    src_.Advance(len + 1);
    return true;
  }
  // Reads a length-prefixed operand of `len` bytes.
  bool Operand(uint64_t len, const char** p) {
    if (ABSL_PREDICT_FALSE(len > src_.remaining())) {
      return Invalid(
          fmt::format("truncated: length {} exceeds the {} bytes left", len,
                      src_.remaining()));
    }
    if (ABSL_PREDICT_FALSE(len > vm_.limits_.max_string_bytes)) {
      return Exhausted(fmt::format("length {} exceeds max_string_bytes {}", len,
                                   vm_.limits_.max_string_bytes));
    }
    *p = src_.Peek(len);
    if (*p == nullptr) return IoFailed();
    return true;
  }

  ABSL_ATTRIBUTE_ALWAYS_INLINE bool Push(const Val& v) {
    if (ABSL_PREDICT_FALSE(vm_.stack_.size() >= vm_.limits_.max_stack_depth)) {
      return Exhausted(fmt::format("stack depth limit of {} exceeded",
                                   vm_.limits_.max_stack_depth));
    }
    vm_.stack_.push_back(v);
    return true;
  }
  // A new zeroed value on top of the stack (nullptr: the stack limit, the
  // error is set). Values are built in place: a Val built in a local and
  // copied would be read back with wide loads over the narrow stores that
  // just wrote it (a store-forwarding stall on every push).
  ABSL_ATTRIBUTE_ALWAYS_INLINE Val* Slot() {
    if (ABSL_PREDICT_FALSE(vm_.stack_.size() >= vm_.limits_.max_stack_depth)) {
      Exhausted(fmt::format("stack depth limit of {} exceeded",
                            vm_.limits_.max_stack_depth));
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
  bool PushInt(int64_t i) { return PushTagged(Tag::kInt, i); }
  bool PushNode(uint64_t id) {
    return PushTagged(Tag::kNode, static_cast<int64_t>(id));
  }
  bool Require(size_t n) {
    if (ABSL_PREDICT_FALSE(vm_.stack_.size() - vm_.fence_ < n)) {
      return Underflow(n);
    }
    return true;
  }
  bool PopMark(size_t* mark) {
    if (ABSL_PREDICT_FALSE(vm_.marks_.empty())) {
      return Invalid("no MARK on the stack");
    }
    *mark = vm_.marks_.back();
    vm_.marks_.pop_back();
    vm_.fence_ = vm_.marks_.empty() ? 0 : vm_.marks_.back();
    return true;
  }
  bool PopMarkWithTarget(size_t* mark) {
    if (!PopMark(mark)) return false;
    if (ABSL_PREDICT_FALSE(*mark <= vm_.fence_)) {
      return Invalid("stack underflow: no target value below the MARK");
    }
    return true;
  }
  // Moves stack[from, end) off the stack into `out`, folding each.
  void Consume(size_t from, std::vector<Val>* out) {
    for (size_t k = from; k < vm_.stack_.size(); ++k) {
      vm_.schema_->Fold(&vm_.stack_[k]);
      out->push_back(vm_.stack_[k]);
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
    const uint64_t id = vm_.NewNodeId(Kind::kTuple);
    std::vector<Val>& items = vm_.nodes_[id].items;
    const size_t cap = items.capacity();
    items.reserve(n);
    Consume(from, &items);
    if (!vm_.Charge(sizeof(Val) * (items.capacity() - cap))) return false;
    return PushNode(id);
  }
  bool NewContainer(Kind kind) {
    const uint64_t id = vm_.NewNodeId(kind);
    return vm_.error_.ok() && PushNode(id);
  }
  bool MarkToContainer(Kind kind) {
    size_t mark = 0;
    if (!PopMark(&mark)) return false;
    if (kind == Kind::kTuple) return MakeTuple(mark);
    const uint64_t id = vm_.NewNodeId(kind);
    Node& n = vm_.nodes_[id];
    n.typed_chunks = false;
    const size_t count = vm_.stack_.size() - mark;
    const size_t cap = n.items.capacity();
    n.items.reserve(count);
    Consume(mark, &n.items);
    if (!vm_.Charge(sizeof(Val) * (n.items.capacity() - cap))) return false;
    return PushNode(id);
  }

  bool IsNode(const Val& v, Kind kind) const {
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
        return vm_.nodes_[v.w[0]].kind == Kind::kObject;
      default:
        return false;
    }
  }
  std::string_view KindName(const Val& v) const;

  bool String(Tag tag, uint64_t len);
  bool Long(uint64_t len);
  bool TextInt(bool allow_bool);
  bool TextFloat();
  bool TextString();
  bool TextUnicode();
  bool Global(std::string_view module, std::string_view name);
  bool GlobalOp();
  bool StackGlobal();
  bool AppendItems(size_t target, size_t from);
  bool AddEntries(size_t target, size_t from, bool dict_op);
  bool AddItems();
  bool Dict();
  bool Obj();
  bool Inst();
  bool Reduce(bool newobj);
  bool NewObjEx();
  bool Build();
  bool PersId(const Val& pid);
  bool MemoPut(uint64_t index);
  bool Memoize();
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
  bool MemoGet(uint64_t index);
  bool UseSlot(uint64_t index, bool* fresh);
  ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool Step(uint8_t op);

  Vm& vm_;
  Source& src_;
  std::string scratch_;
  std::vector<Val> run_;         // ObjectRun's values
  uint64_t fast_off_until_ = 0;  // ObjectRun declined up to here
};

}  // namespace ckptd::format::mdvm

#endif  // CKPTD_FORMAT_METADATA_METADATA_VM_OPS_H_
