// Copyright 2026 The ckptd Authors.
//
// The opcode bodies of the streaming decoder's VM: the value model the
// pickle machine (format/pickle/pickle_machine.h) runs, the same machine as
// pickle::Parse's, so the opcodes' semantics, limits and error messages are
// those of pickle::Parse.
#include "format/metadata/metadata_vm_ops.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace ckptd::format::mdvm {

using namespace ::ckptd::pickle::internal;  // NOLINT: opcodes and helpers

// K (metadata_schema.h) names the kinds of pickle::Value::Kind, in order.
static_assert(static_cast<int>(K::kNone) ==
                  static_cast<int>(pickle::Value::Kind::kNone) &&
              static_cast<int>(K::kBool) ==
                  static_cast<int>(pickle::Value::Kind::kBool) &&
              static_cast<int>(K::kInt) ==
                  static_cast<int>(pickle::Value::Kind::kInt) &&
              static_cast<int>(K::kBigInt) ==
                  static_cast<int>(pickle::Value::Kind::kBigInt) &&
              static_cast<int>(K::kFloat) ==
                  static_cast<int>(pickle::Value::Kind::kFloat) &&
              static_cast<int>(K::kString) ==
                  static_cast<int>(pickle::Value::Kind::kString) &&
              static_cast<int>(K::kBytes) ==
                  static_cast<int>(pickle::Value::Kind::kBytes) &&
              static_cast<int>(K::kTuple) ==
                  static_cast<int>(pickle::Value::Kind::kTuple) &&
              static_cast<int>(K::kList) ==
                  static_cast<int>(pickle::Value::Kind::kList) &&
              static_cast<int>(K::kDict) ==
                  static_cast<int>(pickle::Value::Kind::kDict) &&
              static_cast<int>(K::kSet) ==
                  static_cast<int>(pickle::Value::Kind::kSet) &&
              static_cast<int>(K::kGlobal) ==
                  static_cast<int>(pickle::Value::Kind::kGlobal) &&
              static_cast<int>(K::kObject) ==
                  static_cast<int>(pickle::Value::Kind::kObject) &&
              static_cast<int>(K::kPersId) ==
                  static_cast<int>(pickle::Value::Kind::kPersId));

std::string_view Vm::Ops::KindNameAt(size_t i) const {
  return pickle::KindName(
      static_cast<pickle::Value::Kind>(vm_.schema_->KindOf(vm_.stack_[i])));
}

bool Vm::Ops::PushLong(std::string_view le) {
  Val v;
  std::string big;
  if (IntFromBytes(reinterpret_cast<const uint8_t*>(le.data()), le.size(),
                   &v.w[0], &big)) {
    v.tag = Tag::kInt;
  } else {
    if (!vm_.Charge(big.size() + 32)) return false;
    v.tag = Tag::kBigInt;
    v.a = static_cast<uint32_t>(vm_.blobs_.size());
    vm_.blobs_.push_back(std::move(big));
  }
  return Push(v);
}

bool Vm::Ops::PushIntLiteral(std::string_view digits) {
  if (!vm_.Charge(digits.size())) return false;
  Val v;
  std::string big;
  bool fits = false;
  if (!ParseIntLiteral(digits, &v.w[0], &big, &fits)) return false;
  if (fits) {
    v.tag = Tag::kInt;
  } else {
    v.tag = Tag::kBigInt;
    v.a = static_cast<uint32_t>(vm_.blobs_.size());
    vm_.blobs_.push_back(std::move(big));
  }
  return Push(v);
}

bool Vm::Ops::PushString(std::string_view utf8) {
  const size_t before = vm_.builder_->strings().size();
  const uint32_t id = vm_.builder_->Intern(utf8);
  if (vm_.builder_->strings().size() != before &&
      !vm_.Charge(utf8.size() + 40)) {
    return false;
  }
  return PushTagged(Tag::kStr, 0, id);
}

bool Vm::Ops::TextStr(std::string_view utf8, Val* v) {
  if (!vm_.Charge(utf8.size() + 40)) return false;
  v->tag = Tag::kStr;
  v->a = vm_.builder_->Intern(utf8);
  return true;
}

bool Vm::Ops::PushTextString(std::string_view utf8) {
  Val v;
  return TextStr(utf8, &v) && Push(v);
}

bool Vm::Ops::PushBytes(std::string_view raw) {
  if (!vm_.Charge(raw.size() + 32)) return false;
  const auto id = static_cast<uint32_t>(vm_.blobs_.size());
  vm_.blobs_.emplace_back(raw);
  return PushTagged(Tag::kBytes, 0, id);
}

bool Vm::Ops::PushGlobal(std::string_view module, std::string_view name) {
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

bool Vm::Ops::StackGlobal() {
  const Val name = vm_.stack_[vm_.stack_.size() - 1];
  const Val module = vm_.stack_[vm_.stack_.size() - 2];
  vm_.stack_.resize(vm_.stack_.size() - 2);
  return PushGlobal(std::string(vm_.str(module)), std::string(vm_.str(name)));
}

bool Vm::Ops::Append(size_t target, size_t from) {
  const Val t = vm_.stack_[target];
  const size_t n = vm_.stack_.size() - from;
  if (t.tag != Tag::kNode) {  // a folded object: nothing reads its items
    DropFolded(from);
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

bool Vm::Ops::SetItems(size_t target, size_t from) {
  const size_t n = vm_.stack_.size() - from;
  const Val t = vm_.stack_[target];
  if (t.tag != Tag::kNode) {
    DropFolded(from);
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
    if (node.kind == NodeKind::kDict && key.tag == Tag::kIndex &&
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

bool Vm::Ops::AddItems(size_t target, size_t from) {
  const Val t = vm_.stack_[target];
  const size_t n = vm_.stack_.size() - from;
  if (!vm_.Charge(8 * n)) return false;
  if (t.tag != Tag::kNode) {
    DropFolded(from);
    return true;
  }
  std::vector<Val> moved;
  Consume(from, &moved);
  Node& node = vm_.nodes_[t.w[0]];
  node.items.insert(node.items.end(), moved.begin(), moved.end());
  return true;
}

bool Vm::Ops::Dict(size_t from) {
  if (!NewContainer(NodeKind::kDict)) return false;
  // The new dict sits above the items: move it below them.
  const Val d = vm_.stack_.back();
  vm_.stack_.pop_back();
  vm_.stack_.insert(from, d);
  return SetItems(from, from + 1) && m_.error.ok();
}

bool Vm::Ops::Obj(size_t mark) {
  vm_.schema_->Fold(&vm_.stack_[mark]);
  const Val cls = vm_.stack_[mark];
  if (!MakeTuple(mark + 1)) return false;
  const Val args = vm_.stack_.back();
  vm_.stack_.resize(mark);
  const uint64_t id = vm_.NewNodeId(NodeKind::kObject);
  Node& o = vm_.nodes_[id];
  o.callable = cls;
  o.args = args;
  return PushNode(id);
}

bool Vm::Ops::Inst(size_t mark) {
  const Val cls = vm_.stack_.back();
  vm_.stack_.pop_back();
  if (!MakeTuple(mark)) return false;
  const Val args = vm_.stack_.back();
  vm_.stack_.pop_back();
  const uint64_t id = vm_.NewNodeId(NodeKind::kObject);
  Node& o = vm_.nodes_[id];
  o.callable = cls;
  o.args = args;
  return PushNode(id);
}

bool Vm::Ops::Reduce(bool newobj) {
  Val& args = vm_.stack_[vm_.stack_.size() - 1];
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
      } else if (t.items.size() == 1 && IsNode(t.items[0], NodeKind::kList) &&
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
  const uint64_t id = vm_.NewNodeId(NodeKind::kObject);
  Node& o = vm_.nodes_[id];
  o.callable = vm_.stack_[vm_.stack_.size() - 2];
  o.args = vm_.stack_[vm_.stack_.size() - 1];
  o.newobj = newobj;
  vm_.stack_.resize(vm_.stack_.size() - 2);
  return PushNode(id);
}

bool Vm::Ops::NewObjEx() {
  for (size_t k = vm_.stack_.size() - 3; k < vm_.stack_.size(); ++k) {
    vm_.schema_->Fold(&vm_.stack_[k]);
  }
  const uint64_t id = vm_.NewNodeId(NodeKind::kObject);
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
  const Val inst = vm_.stack_[vm_.stack_.size() - 2];
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

bool Vm::Ops::BinPersId() {
  Val pid = vm_.stack_.back();
  vm_.stack_.pop_back();
  vm_.schema_->Fold(&pid);
  return PersId(pid);
}

bool Vm::Ops::PersIdText(std::string_view pid) {
  Val v;
  return TextStr(pid, &v) && PersId(v);
}

bool Vm::Ops::PersId(const Val& pid) {
  const uint64_t id = vm_.NewNodeId(NodeKind::kPersId);
  vm_.nodes_[id].args = pid;
  return PushNode(id);
}

bool Vm::Ops::UseSlot(uint64_t index) {
  auto& bits = vm_.used_bits_;
  if (vm_.only_memoize_) {
    // From now on slots are tracked: [0, memo_count) are in use.
    vm_.only_memoize_ = false;
    const uint64_t n = m_.memo_count;
    if (!vm_.Charge(8 * (n / 64 + 1))) return false;
    bits.assign(n / 64 + 1, 0);
    for (uint64_t w = 0; w < n / 64; ++w) bits[w] = ~uint64_t{0};
    if (n % 64) bits[n / 64] = (uint64_t{1} << (n % 64)) - 1;
  }
  bool fresh = true;
  if (index < 64 * bits.size()) {
    uint64_t& word = bits[index / 64];
    const uint64_t bit = uint64_t{1} << (index % 64);
    fresh = !(word & bit);
    word |= bit;
  } else if (!vm_.used_sparse_.empty() && vm_.used_sparse_.contains(index)) {
    fresh = false;
  } else {
    // Dense enough for the bits (MemoDenseLimit, counting this slot)?
    const uint64_t cap = MemoDenseLimit(m_.memo_count + 1);
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
  return !fresh || CountMemoEntry();
}

void Vm::Ops::Keep(uint64_t index) {
  const int64_t slot = vm_.referenced_.Slot(index);
  if (slot < 0) return;  // never read back: not kept
  Val& top = vm_.stack_.back();
  top.flags |= kShared;
  vm_.memo_[slot] = top;
  vm_.memo_set_[slot] = 1;
}

bool Vm::Ops::MemoNext() {
  if (!vm_.only_memoize_) return MemoPut(m_.memo_count);
  // MEMOIZE stores at memo_count, a fresh slot while only MEMOIZE stored.
  const uint64_t index = m_.memo_count;
  if (ABSL_PREDICT_FALSE(!CountMemoEntry())) return false;
  Keep(index);
  return true;
}

bool Vm::Ops::MemoPut(uint64_t index) {
  if (!UseSlot(index)) return false;
  Keep(index);
  return true;
}

bool Vm::Ops::MemoGet(uint64_t index) {
  const int64_t slot = vm_.referenced_.SlotForGet(index);
  if (ABSL_PREDICT_FALSE(slot < 0 || !vm_.memo_set_[slot])) {
    return MemoKeyNotFound(index);
  }
  return Push(vm_.memo_[slot]);
}

absl::Status Vm::Run() {
  Ops ops(*this);
  return ops.Run();
}

}  // namespace ckptd::format::mdvm
