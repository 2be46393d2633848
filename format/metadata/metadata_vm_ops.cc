// Copyright 2026 The ckptd Authors.
//
// The opcode bodies of the streaming decoder's VM: opcode for opcode the
// semantics, limits and error messages of pickle::Parse (pickle_reader.cc).
#include "format/metadata/metadata_vm_ops.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <utility>

namespace ckptd::format::mdvm {

using namespace ::ckptd::pickle::internal;  // NOLINT: opcodes and helpers

std::string_view Vm::Ops::KindName(const Val& v) const {
  switch (vm_.schema_->KindOf(v)) {
    case K::kNone:
      return "None";
    case K::kBool:
      return "bool";
    case K::kInt:
      return "int";
    case K::kBigInt:
      return "bigint";
    case K::kFloat:
      return "float";
    case K::kString:
      return "str";
    case K::kBytes:
      return "bytes";
    case K::kTuple:
      return "tuple";
    case K::kList:
      return "list";
    case K::kDict:
      return "dict";
    case K::kSet:
      return "set";
    case K::kGlobal:
      return "global";
    case K::kObject:
      return "object";
    case K::kPersId:
      return "persid";
  }
  return "?";
}

bool Vm::Ops::String(Tag tag, uint64_t len) {
  const char* p = nullptr;
  if (!Operand(len, &p)) return false;
  uint32_t id;
  if (tag == Tag::kStr) {
    if (ABSL_PREDICT_FALSE(!IsValidUtf8(p, len))) {
      return Invalid("string is not valid UTF-8");
    }
    const size_t before = vm_.builder_->strings().size();
    id = vm_.builder_->Intern(std::string_view(p, len));
    if (vm_.builder_->strings().size() != before && !vm_.Charge(len + 40)) {
      return false;
    }
  } else {
    if (!vm_.Charge(len + 32)) return false;
    id = static_cast<uint32_t>(vm_.blobs_.size());
    vm_.blobs_.emplace_back(p, len);
  }
  src_.Advance(len);
  return PushTagged(tag, 0, id);
}

bool Vm::Ops::Long(uint64_t len) {
  const char* p = nullptr;
  if (!Operand(len, &p)) return false;
  Val v;
  std::string big;
  if (IntFromBytes(reinterpret_cast<const uint8_t*>(p), len, &v.w[0], &big)) {
    v.tag = Tag::kInt;
  } else {
    if (!vm_.Charge(big.size() + 32)) return false;
    v.tag = Tag::kBigInt;
    v.a = static_cast<uint32_t>(vm_.blobs_.size());
    vm_.blobs_.push_back(std::move(big));
  }
  src_.Advance(len);
  return Push(v);
}

bool Vm::Ops::TextInt(bool allow_bool) {
  std::string_view line;
  if (!ReadLine(&line)) return false;
  Val v;
  if (allow_bool && (line == "00" || line == "01")) {
    v.tag = Tag::kBool;
    v.a = line == "01";
    return Push(v);
  }
  if (!allow_bool && !line.empty() && line.back() == 'L') line.remove_suffix(1);
  if (!vm_.Charge(line.size())) return false;
  std::string bytes;
  if (!DecimalToBytes(line, &bytes)) {
    return Invalid(fmt::format("bad integer literal ({} bytes)", line.size()));
  }
  std::string big;
  if (IntFromBytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                   &v.w[0], &big)) {
    v.tag = Tag::kInt;
  } else {
    v.tag = Tag::kBigInt;
    v.a = static_cast<uint32_t>(vm_.blobs_.size());
    vm_.blobs_.push_back(std::move(big));
  }
  return Push(v);
}

bool Vm::Ops::TextFloat() {
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
  Val v;
  v.tag = Tag::kFloat;
  std::memcpy(&v.w[0], &d, 8);
  return Push(v);
}

bool Vm::Ops::TextString() {
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
  if (!vm_.Charge(scratch_.size() + 40)) return false;
  Val v;
  v.tag = Tag::kStr;
  v.a = vm_.builder_->Intern(scratch_);
  return Push(v);
}

bool Vm::Ops::TextUnicode() {
  std::string_view line;
  if (!ReadLine(&line)) return false;
  if (!RawUnicodeEscapeDecode(line, &scratch_)) {
    return Invalid("bad \\u escape in UNICODE");
  }
  if (!vm_.Charge(scratch_.size() + 40)) return false;
  Val v;
  v.tag = Tag::kStr;
  v.a = vm_.builder_->Intern(scratch_);
  return Push(v);
}

bool Vm::Ops::Global(std::string_view module, std::string_view name) {
  const uint32_t m = vm_.builder_->Intern(module);
  const uint32_t n = vm_.builder_->Intern(name);
  auto [it, inserted] = vm_.global_ids_.try_emplace(
      std::make_pair(m, n), static_cast<uint32_t>(vm_.globals_.size()));
  if (inserted) {
    if (!vm_.Charge(module.size() + name.size() + 64)) return false;
    vm_.globals_.emplace_back(m, n);
    vm_.global_class_.push_back(ClassOf(module, name));
  }
  return PushTagged(Tag::kGlobal, 0, it->second);
}

bool Vm::Ops::GlobalOp() {
  std::string_view module, name;
  if (!ReadLine(&module)) return false;
  const std::string m(module);  // the next line may move the buffer
  if (!ReadLine(&name)) return false;
  if (!IsValidUtf8(m.data(), m.size()) ||
      !IsValidUtf8(name.data(), name.size())) {
    return Invalid("GLOBAL name is not valid UTF-8");
  }
  return Global(m, name);
}

bool Vm::Ops::StackGlobal() {
  if (!Require(2)) return false;
  const Val name = vm_.stack_[vm_.stack_.size() - 1];
  const Val module = vm_.stack_[vm_.stack_.size() - 2];
  if (module.tag != Tag::kStr || name.tag != Tag::kStr) {
    return Invalid(
        fmt::format("STACK_GLOBAL requires str module and name, got {} and {}",
                    KindName(module), KindName(name)));
  }
  vm_.stack_.resize(vm_.stack_.size() - 2);
  return Global(std::string(vm_.str(module)), std::string(vm_.str(name)));
}

bool Vm::Ops::AppendItems(size_t target, size_t from) {
  const Val t = vm_.stack_[target];
  const size_t n = vm_.stack_.size() - from;
  if (!IsNode(t, Kind::kList) && !IsObject(t)) {
    return Invalid(fmt::format("cannot append to a {}", KindName(t)));
  }
  if (t.tag != Tag::kNode) {  // a folded object: nothing reads its items
    for (size_t k = from; k < vm_.stack_.size(); ++k) {
      vm_.schema_->Fold(&vm_.stack_[k]);
    }
    vm_.stack_.resize(from);
    return vm_.Charge(8 * n);
  }
  const uint64_t id = t.w[0];
  for (size_t k = from; k < vm_.stack_.size(); ++k) {
    Val& v = vm_.stack_[k];
    vm_.schema_->Fold(&v);
    Node& node = vm_.nodes_[id];
    if (node.typed_chunks) {
      if (v.tag == Tag::kChunk &&
          (node.chunk_count == 0 || node.chunk_ndim == v.a)) {
        const auto ints = vm_.chunk_ints(v);
        const size_t cap = node.chunk_ints.capacity();
        node.chunk_ints.insert(node.chunk_ints.end(), ints.begin(), ints.end());
        node.chunk_ndim = v.a;
        node.chunk_count++;
        vm_.ReleaseInts(v);
        if (node.chunk_ints.capacity() != cap &&
            !vm_.Charge(8 * (node.chunk_ints.capacity() - cap))) {
          return false;
        }
        continue;
      }
      vm_.Untype(node, id);
    }
    Node& again = vm_.nodes_[id];
    const size_t cap = again.items.capacity();
    again.items.push_back(v);
    if (again.items.capacity() != cap &&
        !vm_.Charge(sizeof(Val) * (again.items.capacity() - cap))) {
      return false;
    }
  }
  vm_.stack_.resize(from);
  return true;
}

bool Vm::Ops::AddEntries(size_t target, size_t from, bool dict_op) {
  const size_t n = vm_.stack_.size() - from;
  if (n % 2 != 0) {
    return Invalid(dict_op ? "odd number of items for DICT"
                           : "odd number of items for SETITEMS");
  }
  const Val t = vm_.stack_[target];
  if (!IsNode(t, Kind::kDict) && !IsObject(t)) {
    return Invalid(fmt::format("cannot set items on a {}", KindName(t)));
  }
  if (t.tag != Tag::kNode) {
    for (size_t k = from; k < vm_.stack_.size(); ++k) {
      vm_.schema_->Fold(&vm_.stack_[k]);
    }
    vm_.stack_.resize(from);
    return vm_.Charge(8 * n);
  }
  const uint64_t id = t.w[0];
  CompactMetadataBuilder& b = *vm_.builder_;
  for (size_t k = from; k < vm_.stack_.size(); k += 2) {
    Val& key = vm_.stack_[k];
    Val& val = vm_.stack_[k + 1];
    vm_.schema_->Fold(&key);
    vm_.schema_->Fold(&val);
    Node& node = vm_.nodes_[id];
    if (node.kind == Kind::kDict && key.tag == Tag::kIndex &&
        val.tag == Tag::kInfo &&
        (node.typed_storage ||
         (vm_.typed_storage_node_ < 0 && node.entries.empty()))) {
      node.typed_storage = true;
      vm_.typed_storage_node_ = static_cast<int64_t>(id);
      const auto off = vm_.index_offsets(key);
      if (!vm_.Charge(sizeof(CompactMetadata::Storage) + 16 + 8 * off.size())) {
        return false;
      }
      b.AddStorage(
          key.a, key.flags & kHasOffset, off, val.a,
          static_cast<uint64_t>(val.w[0]), static_cast<uint64_t>(val.w[1]),
          val.w[2] < 0 ? nullptr : &vm_.transforms_[val.w[2]], key.w[3]);
      vm_.ReleaseInts(key);
      continue;
    }
    if (node.typed_storage) vm_.Untype(node, id);
    Node& again = vm_.nodes_[id];
    const size_t cap = again.entries.capacity();
    again.entries.push_back(key);
    again.entries.push_back(val);
    if (again.entries.capacity() != cap &&
        !vm_.Charge(sizeof(Val) * (again.entries.capacity() - cap))) {
      return false;
    }
  }
  vm_.stack_.resize(from);
  return true;
}

bool Vm::Ops::AddItems() {
  size_t mark = 0;
  if (!PopMarkWithTarget(&mark)) return false;
  const Val t = vm_.stack_[mark - 1];
  if (!IsNode(t, Kind::kSet) && !IsObject(t)) {
    return Invalid(fmt::format("cannot add items to a {}", KindName(t)));
  }
  const size_t n = vm_.stack_.size() - mark;
  if (!vm_.Charge(8 * n)) return false;
  if (t.tag != Tag::kNode) {
    for (size_t k = mark; k < vm_.stack_.size(); ++k) {
      vm_.schema_->Fold(&vm_.stack_[k]);
    }
    vm_.stack_.resize(mark);
    return true;
  }
  std::vector<Val> moved;
  Consume(mark, &moved);
  Node& node = vm_.nodes_[t.w[0]];
  node.items.insert(node.items.end(), moved.begin(), moved.end());
  return true;
}

bool Vm::Ops::Dict() {
  size_t mark = 0;
  if (!PopMark(&mark)) return false;
  const size_t n = vm_.stack_.size() - mark;
  if (n % 2 != 0) return Invalid("odd number of items for DICT");
  if (!NewContainer(Kind::kDict)) return false;
  // The new dict sits above the items: move it below them.
  const Val d = vm_.stack_.back();
  vm_.stack_.pop_back();
  vm_.stack_.insert(mark, d);
  return AddEntries(mark, mark + 1, /*dict_op=*/true) && vm_.error_.ok();
}

bool Vm::Ops::Obj() {
  size_t mark = 0;
  if (!PopMark(&mark)) return false;
  const size_t n = vm_.stack_.size() - mark;
  if (n == 0) return Invalid("OBJ needs a class after the MARK");
  vm_.schema_->Fold(&vm_.stack_[mark]);
  const Val cls = vm_.stack_[mark];
  if (!MakeTuple(mark + 1)) return false;
  const Val args = vm_.stack_.back();
  vm_.stack_.resize(mark);
  const uint64_t id = vm_.NewNodeId(Kind::kObject);
  Node& o = vm_.nodes_[id];
  o.callable = cls;
  o.args = args;
  return PushNode(id);
}

bool Vm::Ops::Inst() {
  if (!GlobalOp()) return false;
  const Val cls = vm_.stack_.back();
  vm_.stack_.pop_back();
  size_t mark = 0;
  if (!PopMark(&mark)) return false;
  if (!MakeTuple(mark)) return false;
  const Val args = vm_.stack_.back();
  vm_.stack_.pop_back();
  const uint64_t id = vm_.NewNodeId(Kind::kObject);
  Node& o = vm_.nodes_[id];
  o.callable = cls;
  o.args = args;
  return PushNode(id);
}

bool Vm::Ops::Reduce(bool newobj) {
  if (!Require(2)) return false;
  Val& args = vm_.stack_[vm_.stack_.size() - 1];
  if (args.tag != Tag::kIntSeq && args.tag != Tag::kIntSeq1 &&
      !IsNode(args, Kind::kTuple)) {
    return Invalid(
        fmt::format("arguments must be a tuple, got {}", KindName(args)));
  }
  Val& callable = vm_.stack_[vm_.stack_.size() - 2];
  vm_.schema_->Fold(&callable);
  vm_.schema_->Fold(&args);
  // torch.Size(ints): its meaning is final (the decoder ignores anything
  // BUILD or APPEND add to it). Made in the callable's slot.
  if (callable.tag == Tag::kGlobal &&
      vm_.global_class_[callable.a] == kClsSize) {
    const size_t top = vm_.stack_.size();
    Val& dst = vm_.stack_[top - 2];
    const Val& a = vm_.stack_[top - 1];
    if (a.tag == Tag::kIntSeq1 || (a.tag == Tag::kIntSeq && a.a == 0)) {
      dst.tag = Tag::kSize;
      dst.flags = 0;
      dst.n = 0;
      dst.a = a.a;
      CopyWords(dst.w, a.w);
      vm_.stack_.pop_back();
      return true;
    }
    if (a.tag == Tag::kNode) {
      const Node& t = vm_.nodes_[a.w[0]];
      Ints ints;
      bool made = false;
      if (t.items.size() == 1 && t.items[0].tag == Tag::kIntSeq) {
        const auto v = vm_.ints(t.items[0]);
        ints.assign(v.begin(), v.end());
        made = true;
      } else if (t.items.size() == 1 && IsNode(t.items[0], Kind::kList) &&
                 !t.items[0].shared()) {
        const Node& l = vm_.nodes_[t.items[0].w[0]];
        made = l.items.empty() ? l.chunk_count == 0 : !l.typed_chunks;
        for (const Val& e : l.items) made = made && e.tag == Tag::kInt;
        for (const Val& e : l.items) ints.push_back(e.w[0]);
      }
      if (made) {
        if (!a.shared()) vm_.FreeNode(a.w[0]);
        vm_.stack_.resize(top - 2);
        Val* v = Slot();
        if (v == nullptr) return false;
        vm_.FillInts(v, Tag::kSize, ints);
        return true;
      }
    }
  }
  const uint64_t id = vm_.NewNodeId(Kind::kObject);
  Node& o = vm_.nodes_[id];
  o.callable = vm_.stack_[vm_.stack_.size() - 2];
  o.args = vm_.stack_[vm_.stack_.size() - 1];
  o.newobj = newobj;
  vm_.stack_.resize(vm_.stack_.size() - 2);
  return PushNode(id);
}

bool Vm::Ops::NewObjEx() {
  if (!Require(3)) return false;
  Val& kwargs = vm_.stack_[vm_.stack_.size() - 1];
  Val& args = vm_.stack_[vm_.stack_.size() - 2];
  if ((args.tag != Tag::kIntSeq && args.tag != Tag::kIntSeq1 &&
       !IsNode(args, Kind::kTuple)) ||
      !IsNode(kwargs, Kind::kDict)) {
    return Invalid(fmt::format("needs a tuple and a dict, got {} and {}",
                               KindName(args), KindName(kwargs)));
  }
  for (size_t k = vm_.stack_.size() - 3; k < vm_.stack_.size(); ++k) {
    vm_.schema_->Fold(&vm_.stack_[k]);
  }
  const uint64_t id = vm_.NewNodeId(Kind::kObject);
  Node& o = vm_.nodes_[id];
  o.callable = vm_.stack_[vm_.stack_.size() - 3];
  o.args = vm_.stack_[vm_.stack_.size() - 2];
  o.kwargs = vm_.stack_[vm_.stack_.size() - 1];
  o.has_kwargs = true;
  o.newobj = true;
  vm_.stack_.resize(vm_.stack_.size() - 3);
  return PushNode(id);
}

bool Vm::Ops::Build() {
  if (!Require(2)) return false;
  const Val inst = vm_.stack_[vm_.stack_.size() - 2];
  if (!IsObject(inst)) {
    return Invalid(fmt::format("cannot BUILD a {}", KindName(inst)));
  }
  Val& state = vm_.stack_.back();
  vm_.schema_->Fold(&state);
  if (inst.tag == Tag::kNode) {
    Node& o = vm_.nodes_[inst.w[0]];
    o.state = state;
    o.has_state = true;
  }
  vm_.stack_.pop_back();
  return true;
}

bool Vm::Ops::PersId(const Val& pid) {
  const uint64_t id = vm_.NewNodeId(Kind::kPersId);
  vm_.nodes_[id].args = pid;
  return PushNode(id);
}

bool Vm::Ops::UseSlot(uint64_t index, bool* fresh) {
  auto& bits = vm_.used_bits_;
  if (vm_.only_memoize_) {
    // From now on slots are tracked: [0, memo_count_) are in use.
    vm_.only_memoize_ = false;
    const uint64_t n = vm_.memo_count_;
    if (!vm_.Charge(8 * (n / 64 + 1))) return false;
    bits.assign(n / 64 + 1, 0);
    for (uint64_t w = 0; w < n / 64; ++w) bits[w] = ~uint64_t{0};
    if (n % 64) bits[n / 64] = (uint64_t{1} << (n % 64)) - 1;
  }
  if (index < 64 * bits.size()) {
    uint64_t& word = bits[index / 64];
    const uint64_t bit = uint64_t{1} << (index % 64);
    *fresh = !(word & bit);
    word |= bit;
  } else if (!vm_.used_sparse_.empty() && vm_.used_sparse_.contains(index)) {
    *fresh = false;
  } else {
    *fresh = true;
    // Dense enough for the bits? They stay below 2 * entries + 1024 slots,
    // so sparse indices cannot make them large.
    const uint64_t cap = 2 * (vm_.memo_count_ + 1) + 1024;
    if (index < cap) {
      const uint64_t words =
          std::min(std::max(index / 64 + 1, 2 * bits.size()), cap / 64 + 1);
      if (!vm_.Charge(8 * (words - bits.size()))) return false;
      bits.resize(words, 0);
      for (auto it = vm_.used_sparse_.begin(); it != vm_.used_sparse_.end();) {
        if (*it < 64 * bits.size()) {
          bits[*it / 64] |= uint64_t{1} << (*it % 64);
          vm_.used_sparse_.erase(it++);
        } else {
          ++it;
        }
      }
      bits[index / 64] |= uint64_t{1} << (index % 64);
    } else {
      if (!vm_.Charge(32)) return false;
      vm_.used_sparse_.insert(index);
    }
  }
  if (*fresh) {
    if (ABSL_PREDICT_FALSE(vm_.memo_count_ >= vm_.limits_.max_memo_entries)) {
      return Exhausted(fmt::format("memo limit of {} entries exceeded",
                                   vm_.limits_.max_memo_entries));
    }
    ++vm_.memo_count_;
  }
  return true;
}

bool Vm::Ops::Memoize() {
  if (!vm_.only_memoize_) return MemoPut(vm_.memo_count_);
  if (ABSL_PREDICT_FALSE(!Require(1))) return false;
  // MEMOIZE stores at memo_count_, a fresh slot while only MEMOIZE stored.
  const uint64_t index = vm_.memo_count_;
  if (ABSL_PREDICT_FALSE(index >= vm_.limits_.max_memo_entries)) {
    return Exhausted(fmt::format("memo limit of {} entries exceeded",
                                 vm_.limits_.max_memo_entries));
  }
  ++vm_.memo_count_;
  const int64_t slot = vm_.referenced_.Slot(index);
  if (slot < 0) return true;  // never read back: not kept
  Val& top = vm_.stack_.back();
  top.flags |= kShared;
  vm_.memo_[slot] = top;
  vm_.memo_set_[slot] = 1;
  return true;
}

bool Vm::Ops::MemoPut(uint64_t index) {
  if (!Require(1)) return false;
  bool fresh = false;
  if (!UseSlot(index, &fresh)) return false;
  const int64_t slot = vm_.referenced_.Slot(index);
  if (slot < 0) return true;  // never read back: not kept
  Val& top = vm_.stack_.back();
  top.flags |= kShared;
  vm_.memo_[slot] = top;
  vm_.memo_set_[slot] = 1;
  return true;
}

bool Vm::Ops::MemoGet(uint64_t index) {
  const int64_t slot = vm_.referenced_.SlotForGet(index);
  if (ABSL_PREDICT_FALSE(slot < 0 || !vm_.memo_set_[slot])) {
    return Invalid(fmt::format("memo key {} not found", index));
  }
  return Push(vm_.memo_[slot]);
}

absl::Status Vm::Ops::Run() {
  while (true) {
    vm_.op_pos_ = src_.pos();
    if (ABSL_PREDICT_TRUE(src_.buffered() > 0)) {
      const auto op = static_cast<uint8_t>(*src_.cursor());
      if ((op == kBinGet || op == kLongBinGet) &&
          ((op == kBinGet && SizeSequence()) || ObjectRun())) {
        continue;
      }
    }
    if (ABSL_PREDICT_TRUE(src_.buffered() > 0) &&
        static_cast<uint8_t>(*src_.cursor()) == kMemoize) {
      // The most frequent opcode of protocol-4/5 pickles (half of them).
      vm_.op_ = kMemoize;
      src_.Advance(1);
      if (ABSL_PREDICT_FALSE(!Memoize())) return std::move(vm_.error_);
      continue;
    }
    const char* p = src_.Peek(1);
    if (ABSL_PREDICT_FALSE(p == nullptr)) {
      if (!src_.io_status().ok()) {
        IoFailed();
      } else {
        vm_.op_ = 0;
        Invalid("unexpected end of data (no STOP opcode)");
      }
      return std::move(vm_.error_);
    }
    const auto op = static_cast<uint8_t>(*p);
    vm_.op_ = op;
    src_.Advance(1);
    if (op == kStop) {
      if (!Require(1)) return std::move(vm_.error_);
      vm_.schema_->Fold(&vm_.stack_.back());
      vm_.root_ = vm_.stack_.back();
      return vm_.error_;
    }
    if (ABSL_PREDICT_FALSE(!Step(op) || !vm_.error_.ok())) {
      if (vm_.error_.ok()) Invalid("internal error");
      return std::move(vm_.error_);
    }
  }
}

inline bool Vm::Ops::Step(uint8_t op) {
  uint64_t u = 0;
  switch (op) {
    // --- ints ---
    case kBinInt1:
      return ReadLE(1, &u) && PushInt(static_cast<int64_t>(u));
    case kBinInt2:
      return ReadLE(2, &u) && PushInt(static_cast<int64_t>(u));
    case kBinInt:
      return ReadLE(4, &u) &&
             PushInt(static_cast<int32_t>(static_cast<uint32_t>(u)));
    case kLong1:
      return ReadLE(1, &u) && Long(u);
    case kLong4:
      if (!ReadLE(4, &u)) return false;
      if (static_cast<int32_t>(static_cast<uint32_t>(u)) < 0) {
        return Invalid("negative byte count");
      }
      return Long(u);
    case kInt:
      return TextInt(/*allow_bool=*/true);
    case kLong:
      return TextInt(/*allow_bool=*/false);
    // --- other scalars ---
    case kNone:
      return Slot() != nullptr;
    case kNewTrue:
    case kNewFalse:
      return PushTagged(Tag::kBool, 0, op == kNewTrue);
    case kBinFloat: {
      const char* q = src_.Peek(8);
      if (q == nullptr) return Truncated(8);
      uint64_t bits = 0;
      for (int k = 0; k < 8; ++k)
        bits = (bits << 8) | static_cast<uint8_t>(q[k]);
      src_.Advance(8);
      Val v;
      v.tag = Tag::kFloat;
      std::memcpy(&v.w[0], &bits, 8);
      return Push(v);
    }
    case kFloat:
      return TextFloat();
    // --- strings and bytes ---
    case kShortBinUnicode:
    case kShortBinString:
      return ReadLE(1, &u) && String(Tag::kStr, u);
    case kBinUnicode:
      return ReadLE(4, &u) && String(Tag::kStr, u);
    case kBinUnicode8:
      return ReadLE(8, &u) && String(Tag::kStr, u);
    case kShortBinBytes:
      return ReadLE(1, &u) && String(Tag::kBytes, u);
    case kBinBytes:
      return ReadLE(4, &u) && String(Tag::kBytes, u);
    case kBinBytes8:
    case kByteArray8:
      return ReadLE(8, &u) && String(Tag::kBytes, u);
    case kBinString:
      if (!ReadLE(4, &u)) return false;
      if (static_cast<int32_t>(static_cast<uint32_t>(u)) < 0) {
        return Invalid("negative byte count");
      }
      return String(Tag::kStr, u);
    case kString:
      return TextString();
    case kUnicode:
      return TextUnicode();
    // --- containers ---
    case kEmptyTuple:
      return PushTagged(Tag::kIntSeq, 0);
    case kEmptyList:
      return NewContainer(Kind::kList);
    case kEmptyDict:
      return NewContainer(Kind::kDict);
    case kEmptySet:
      return NewContainer(Kind::kSet);
    case kTuple1:
    case kTuple2:
    case kTuple3: {
      const size_t n = op == kTuple1 ? 1 : op == kTuple2 ? 2 : 3;
      return Require(n) && MakeTuple(vm_.stack_.size() - n);
    }
    case kTuple:
      return MarkToContainer(Kind::kTuple);
    case kList:
      return MarkToContainer(Kind::kList);
    case kFrozenSet:
      return MarkToContainer(Kind::kSet);
    case kDict:
      return Dict();
    case kAppend:
      return Require(2) &&
             AppendItems(vm_.stack_.size() - 2, vm_.stack_.size() - 1);
    case kAppends: {
      size_t mark = 0;
      return PopMarkWithTarget(&mark) && AppendItems(mark - 1, mark);
    }
    case kSetItem:
      return Require(3) &&
             AddEntries(vm_.stack_.size() - 3, vm_.stack_.size() - 2, false);
    case kSetItems: {
      size_t mark = 0;
      return PopMarkWithTarget(&mark) && AddEntries(mark - 1, mark, false);
    }
    case kAddItems:
      return AddItems();
    // --- stack manipulation ---
    case kMark:
      if (ABSL_PREDICT_FALSE(vm_.marks_.size() >= vm_.limits_.max_mark_depth)) {
        return Exhausted(fmt::format("MARK depth limit of {} exceeded",
                                     vm_.limits_.max_mark_depth));
      }
      vm_.marks_.push_back(vm_.stack_.size());
      vm_.fence_ = vm_.stack_.size();
      return true;
    case kPop:
      // Like CPython: POP with nothing above the innermost MARK drops it.
      if (vm_.stack_.size() > vm_.fence_) {
        vm_.stack_.pop_back();
        return true;
      }
      if (!vm_.marks_.empty()) {
        size_t mark = 0;
        return PopMark(&mark);
      }
      return Underflow(1);
    case kPopMark: {
      size_t mark = 0;
      if (!PopMark(&mark)) return false;
      vm_.stack_.resize(mark);
      return true;
    }
    case kDup:
      if (!Require(1)) return false;
      vm_.stack_.back().flags |= kShared;
      return Push(vm_.stack_.back());
    // --- memo ---
    case kBinPut:
      return ReadLE(1, &u) && MemoPut(u);
    case kLongBinPut:
      return ReadLE(4, &u) && MemoPut(u);
    case kMemoize:
      return Memoize();
    case kBinGet:
      return ReadLE(1, &u) && MemoGet(u);
    case kLongBinGet:
      return ReadLE(4, &u) && MemoGet(u);
    case kPut:
    case kGet: {
      std::string_view line;
      if (!ReadLine(&line)) return false;
      if (!ParseDecimalU64(line, &u)) return Invalid("bad memo index");
      return op == kPut ? MemoPut(u) : MemoGet(u);
    }
    // --- objects ---
    case kGlobal:
      return GlobalOp();
    case kStackGlobal:
      return StackGlobal();
    case kReduce:
      return Reduce(/*newobj=*/false);
    case kNewObj:
      return Reduce(/*newobj=*/true);
    case kNewObjEx:
      return NewObjEx();
    case kBuild:
      return Build();
    case kInst:
      return Inst();
    case kObj:
      return Obj();
    case kBinPersId: {
      if (!Require(1)) return false;
      Val pid = vm_.stack_.back();
      vm_.stack_.pop_back();
      vm_.schema_->Fold(&pid);
      return PersId(pid);
    }
    case kPersId: {
      std::string_view line;
      if (!ReadLine(&line)) return false;
      if (!IsValidUtf8(line.data(), line.size())) {
        return Invalid("persistent id is not valid UTF-8");
      }
      if (!vm_.Charge(line.size() + 40)) return false;
      Val pid;
      pid.tag = Tag::kStr;
      pid.a = vm_.builder_->Intern(line);
      return PersId(pid);
    }
    // --- framing ---
    case kProto:
      if (!ReadLE(1, &u)) return false;
      if (u > kHighestProtocol) {
        return Invalid(fmt::format("unsupported pickle protocol {}", u));
      }
      return true;
    case kFrame:
      // Frames are in-band: the opcodes follow; only check the length.
      if (!ReadLE(8, &u)) return false;
      if (u > src_.remaining()) {
        return Invalid(fmt::format("truncated: frame of {} bytes, {} left", u,
                                   src_.remaining()));
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

absl::Status Vm::Run() {
  Ops ops(*this);
  return ops.Run();
}

}  // namespace ckptd::format::mdvm
