// Copyright 2026 The ckptd Authors.
//
// The pickle VM's fast paths (superinstructions): the opcode sequences every
// pickler writes for torch.Size and for DCP's dataclasses, recognised in
// the buffered bytes and executed as one step with exactly the effects of
// their opcodes. Each declines (the opcodes then run one by one) wherever
// the effects could differ: a memo slot some GET reads back, a PUT seen
// earlier, a field the folds would not take, the stack, mark or memo
// limits, the end of the buffer.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "format/metadata/metadata_vm_ops.h"

namespace ckptd::format::mdvm {

using namespace ::ckptd::pickle::internal;  // NOLINT: opcodes and helpers

// GET / BINGET / LONG_BINGET at b: the memo value it reads (nullptr: not a
// GET, or not a value the fast paths may read), b past it.
const Val* Vm::Ops::PeekGet(Bytes& b) const {
  uint64_t index;
  const uint8_t op = b.Op();
  if (op == kBinGet && b.Has(2)) {
    index = b.U8(1);
    b.at += 2;
  } else if (op == kLongBinGet && b.Has(5)) {
    index = b.LE(1, 4);
    b.at += 5;
  } else {
    return nullptr;
  }
  const int64_t slot = vm_.referenced_.SlotForGet(index);
  if (slot < 0 || !vm_.memo_set_[slot]) return nullptr;
  return &vm_.memo_[slot];
}

// BININT1 / BININT2 / BININT / LONG1 (<= 8 bytes) at b: *out, b past it.
bool Vm::Ops::PeekInt(Bytes& b, uint8_t op, int64_t* out) {
  if (op == kBinInt1 && b.Has(2)) {
    *out = b.U8(1);
    b.at += 2;
  } else if (op == kBinInt2 && b.Has(3)) {
    *out = static_cast<int64_t>(b.LE(1, 2));
    b.at += 3;
  } else if (op == kBinInt && b.Has(5)) {
    *out = static_cast<int32_t>(static_cast<uint32_t>(b.LE(1, 4)));
    b.at += 5;
  } else if (op == kLong1 && b.Has(2) && b.U8(1) <= 8 && b.Has(2 + b.U8(1))) {
    const uint8_t len = b.U8(1);
    std::string big;
    if (!IntFromBytes(reinterpret_cast<const uint8_t*>(b.p + b.at + 2), len,
                      out, &big)) {
      return false;
    }
    b.at += 2 + len;
  } else {
    return false;
  }
  return true;
}

// torch.Size((ints...)) at b, as every pickler writes it:
//   GET <torch.Size> (BININT1|BININT2|BININT){1,2} TUPLE1|TUPLE2
//   [MEMOIZE] TUPLE1 [MEMOIZE] REDUCE [MEMOIZE]
//   GET <torch.Size> EMPTY_TUPLE TUPLE1 [MEMOIZE] REDUCE [MEMOIZE]  (0-d)
// into *out (a kSize), *memoized += its MEMOIZEs, b past it.
bool Vm::Ops::PeekSize(Bytes& in, Val* out, int* memoized) const {
  Bytes b = in;
  const Val* cls = PeekGet(b);
  if (cls == nullptr || cls->tag != Tag::kGlobal ||
      vm_.global_class_[cls->a] != kClsSize) {
    return false;
  }
  int64_t ints[2] = {0, 0};
  int n = 0;
  uint8_t op = b.Op();
  while (n < 2 && PeekInt(b, op, &ints[n])) {
    ++n;
    op = b.Op();
  }
  int m = 0;
  if (n == 0) {
    if (op != kEmptyTuple) return false;
    ++b.at;
  } else {
    if (op != (n == 2 ? kTuple2 : kTuple1)) return false;
    ++b.at;
    m += b.Skip(kMemoize);
  }
  if (b.Op() != kTuple1) return false;
  ++b.at;
  m += b.Skip(kMemoize);
  if (b.Op() != kReduce) return false;
  ++b.at;
  m += b.Skip(kMemoize);
  *out = Val{};
  out->tag = Tag::kSize;
  out->a = static_cast<uint32_t>(n);
  out->w[0] = ints[0];
  out->w[1] = ints[1];
  *memoized += m;
  in = b;
  return true;
}

// Whether `count` MEMOIZEs may run as plain slot counting: only MEMOIZE
// stored so far, no GET reads any of the slots, within the memo limit.
bool Vm::Ops::FreshMemos(uint64_t count) const {
  if (count == 0) return true;
  if (!vm_.only_memoize_ ||
      m_.memo_count + count > m_.limits.max_memo_entries) {
    return false;
  }
  return !vm_.referenced_.AnyIn(m_.memo_count, m_.memo_count + count);
}

bool Vm::Ops::SizeSequence() {
  Bytes b{in_.cursor(), in_.buffered(), 0};
  if (b.avail < 16) return false;
  // The bytes first (cheap): an int must follow the BINGET.
  const uint8_t first = b.U8(2);
  if (first != kBinInt1 && first != kBinInt2 && first != kBinInt) return false;
  Val v;
  int memoized = 0;
  if (!PeekSize(b, &v, &memoized) || !FreshMemos(memoized) ||
      vm_.stack_.size() + 3 > m_.limits.max_stack_depth) {
    return false;
  }
  vm_.stack_.push_back(v);
  m_.memo_count += memoized;
  vm_.fast_sizes_++;
  in_.Advance(b.at);
  return true;
}

// A field value at b: BININT1|BININT2|BININT|LONG1 (<= 8 bytes), NONE, a
// torch.Size (PeekSize) or a GET; *out as the opcodes leave it.
bool Vm::Ops::PeekValue(Bytes& b, Val* out, int* memoized) const {
  const uint8_t op = b.Op();
  *out = Val{};
  if (op == kNone) {
    out->tag = Tag::kNone;
    ++b.at;
  } else if (op != kBinGet && op != kLongBinGet) {
    if (!PeekInt(b, op, &out->w[0])) return false;
    out->tag = Tag::kInt;
  } else if (!PeekSize(b, out, memoized)) {
    const Val* g = PeekGet(b);
    if (g == nullptr) return false;
    *out = *g;
  }
  return true;
}

// One DCP dataclass (ChunkStorageMetadata, MetadataIndex, _StorageInfo) in
// either form writers use:
//   GET <cls> EMPTY_TUPLE NEWOBJ [MEMOIZE] EMPTY_DICT [MEMOIZE] MARK
//     (GET <str> value){0,8} SETITEMS BUILD        (pickle's, protocol 2+)
//   GET <cls> value{1,3} TUPLE1|TUPLE2|TUPLE3 [MEMOIZE] REDUCE [MEMOIZE]
//                                                  (ckptd's constructors)
// values as PeekValue. *out: the object as Schema::Fold would fold it.
bool Vm::Ops::PeekObject(Bytes& in, Val* out, int* memoized) const {
  Bytes b = in;
  const Val* cls = PeekGet(b);
  if (cls == nullptr || cls->tag != Tag::kGlobal) return false;
  const int c = vm_.global_class_[cls->a];
  FieldSetId set;
  if (c == kClsChunk) {
    set = kFsChunk;
  } else if (c == kClsIndex) {
    set = kFsIndex;
  } else if (c == kClsStorageInfo) {
    set = kFsInfo;
  } else {
    return false;
  }
  const size_t count = Schema::FieldCount(set);
  Val f[4];
  bool has[4] = {false, false, false, false};
  int m = 0;
  if (b.Op() != kEmptyTuple) {
    // cls(a, b, c): REDUCE over a tuple node of the values (a tuple of ints
    // only, or of one int tuple, is not a node: declined).
    size_t n = 0;
    bool all_ints = true;
    while (true) {
      const uint8_t op = b.Op();
      if (op >= kTuple1 && op <= kTuple3) break;
      if (n == 3 || !PeekValue(b, &f[n], &m)) return false;
      all_ints = all_ints && f[n].tag == Tag::kInt;
      has[n] = n < count;
      ++n;
    }
    if (n == 0 || all_ints || (n == 1 && f[0].tag == Tag::kIntSeq) ||
        b.Op() != kTuple1 + (n - 1)) {
      return false;
    }
    ++b.at;
    m += b.Skip(kMemoize);
    if (b.Op() != kReduce) return false;
    ++b.at;
    m += b.Skip(kMemoize);
  } else {
    ++b.at;
    if (b.Op() != kNewObj) return false;
    ++b.at;
    m += b.Skip(kMemoize);
    if (b.Op() != kEmptyDict) return false;
    ++b.at;
    m += b.Skip(kMemoize);
    if (b.Op() != kMark) return false;
    ++b.at;
    const uint32_t* ids = vm_.schema_->field_ids(set);
    for (int pairs = 0;; ++pairs) {
      if (pairs > 8) return false;
      if (b.Op() == kSetItems) {
        ++b.at;
        break;
      }
      const Val* key = PeekGet(b);
      Val v;
      if (key == nullptr || key->tag != Tag::kStr || !PeekValue(b, &v, &m)) {
        return false;
      }
      for (size_t i = 0; i < count; ++i) {
        if (key->a == ids[i]) {
          f[i] = v;
          has[i] = true;
          break;
        }
      }
    }
    if (b.Op() != kBuild) return false;
    ++b.at;
  }
  if (!vm_.schema_->FoldFields(c, f, has, out)) return false;
  *memoized += m;
  in = b;
  return true;
}

// A run of DCP dataclasses that APPENDS or SETITEMS then consumes (the
// chunk lists and the storage_data dict of a stock .metadata, in batches of
// up to 1000): pushed folded, as that consumer would fold them. Nothing
// between their pushes and that consumer reads or changes them, so the
// folded values are what the opcodes would have left there.
bool Vm::Ops::ObjectRun() {
  if (in_.pos() < fast_off_until_) return false;
  Bytes b{in_.cursor(), in_.buffered(), 0};
  int memoized = 0;
  run_.clear();
  while (true) {
    Val v;
    if (!PeekObject(b, &v, &memoized)) break;
    run_.push_back(v);
  }
  // The consumer (not run here: the loop runs it next, after any FRAME).
  const uint8_t end_op = b.Op();
  if (run_.empty() || (end_op != kAppends && end_op != kSetItems) ||
      !FreshMemos(memoized) || m_.marks_full() ||
      vm_.stack_.size() + run_.size() + 16 > m_.limits.max_stack_depth) {
    // One by one up to where the run stopped (no retry at every object).
    fast_off_until_ = in_.pos() + std::max<size_t>(b.at, 1);
    return false;
  }
  for (const Val& v : run_) vm_.stack_.push_back(v);
  m_.memo_count += memoized;
  vm_.fast_objects_ += run_.size();
  in_.Advance(b.at);
  return true;
}

}  // namespace ckptd::format::mdvm
