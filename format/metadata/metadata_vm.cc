// Copyright 2026 The ckptd Authors.
//
// The streaming decoder's pickle VM (metadata_vm.h): pass 1 (the memo
// slots a program reads back) and the VM's heap. The opcode bodies are
// metadata_vm_ops.cc.
#include "format/metadata/metadata_vm.h"

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <utility>

#include "absl/base/optimization.h"
#include "absl/container/inlined_vector.h"
#include "common/absl_fmt.h"
#include "fmt/format.h"
#include "format/metadata/metadata_schema.h"
#include "format/metadata/metadata_vm_ops.h"
#include "format/pickle/pickle_util.h"

namespace ckptd::format::mdvm {

using namespace ::ckptd::pickle::internal;  // NOLINT: opcodes and helpers

// ---------------------------------------------------------------------------
// Pass 1
// ---------------------------------------------------------------------------

MemoRefs::MemoRefs(uint64_t limit) {
  const size_t bytes = ((limit + 63) / 64) * 8;
  void* p = bytes == 0
                ? MAP_FAILED
                : ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p != MAP_FAILED) {
    bits_ = static_cast<uint64_t*>(p);
    map_bytes_ = bytes;
    limit_ = limit;
  }  // else: every index goes to the map
}

MemoRefs::MemoRefs(MemoRefs&& o) noexcept
    : bits_(std::exchange(o.bits_, nullptr)),
      map_bytes_(std::exchange(o.map_bytes_, 0)),
      limit_(std::exchange(o.limit_, 0)),
      end_(std::exchange(o.end_, 0)),
      rank_(std::move(o.rank_)),
      big_(std::move(o.big_)),
      size_(o.size_),
      table_(std::move(o.table_)),
      mask_(o.mask_) {}

MemoRefs::~MemoRefs() {
  if (bits_ != nullptr) ::munmap(bits_, map_bytes_);
}

void MemoRefs::Finish() {
  const size_t words = (end_ + 63) / 64;
  rank_.resize(words);
  uint32_t n = 0;
  for (size_t w = 0; w < words; ++w) {
    rank_[w] = n;
    n += PopCount(bits_[w]);
  }
  for (auto& [index, slot] : big_) slot = n++;
  size_ = n;
  // The GET table: at most half full.
  size_t cap = 16;
  while (cap < 2 * size_ + 2) cap *= 2;
  mask_ = cap - 1;
  table_.assign(cap, Entry{kEmpty, -1});
  auto put = [&](uint64_t index, int64_t slot) {
    size_t h = Hash(index);
    while (table_[h].index != kEmpty) h = (h + 1) & mask_;
    table_[h] = {index, slot};
  };
  for (size_t w = 0; w < words; ++w) {
    for (uint64_t bits = bits_[w]; bits != 0; bits &= bits - 1) {
      const uint64_t index =
          64 * w + static_cast<uint64_t>(__builtin_ctzll(bits));
      put(index, Slot(index));
    }
  }
  for (const auto& [index, slot] : big_) put(index, slot);
}

namespace {

// Pass 1's table-driven step over [p, e) for the opcodes with nothing to
// look at, GETs and counted operands; false where it cannot go on (fewer
// than 9 bytes left, a line operand, the end, an operand past e).
struct ScanTables {
  std::array<OperandLayout, 256> ops;  // pickle_util.h
  std::array<uint8_t, 256> skip;       // bytes to skip, 0: see ops
};

const ScanTables& Tables() {
  static const ScanTables t = [] {
    ScanTables t;
    t.ops = OperandLayouts();
    t.skip.fill(0);
    for (int op = 0; op < 256; ++op) {
      if (t.ops[op].kind == OperandKind::kNone) t.skip[op] = 1;
      if (t.ops[op].kind == OperandKind::kFixed)
        t.skip[op] = 1 + t.ops[op].size;
    }
    return t;
  }();
  return t;
}

// One opcode at p, wholly inside [p, e); false (p unchanged) where the
// opcode does not fit or needs the slow path.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool ScanStep(const ScanTables& t,
                                                  const char*& p, const char* e,
                                                  MemoRefs& refs) {
  const auto op = static_cast<uint8_t>(*p);
  const size_t left = static_cast<size_t>(e - p);
  if (const uint8_t skip = t.skip[op]; skip != 0) {
    if (ABSL_PREDICT_FALSE(skip > left)) return false;
    p += skip;
    return true;
  }
  const OperandLayout info = t.ops[op];
  if (left < 1u + info.size) return false;
  if (info.kind == OperandKind::kGet) {
    refs.Add(info.size == 1 ? static_cast<uint8_t>(p[1]) : LoadLE(p + 1, 4));
    p += 1 + info.size;
    return true;
  }
  if (info.kind == OperandKind::kCounted) {
    const uint64_t u = LoadLE(p + 1, info.size);
    if (u > left - 1 - info.size) return false;
    p += 1 + info.size + u;
    return true;
  }
  return false;
}

// Protocol 4+ programs come in frames (FRAME n, then n bytes) that end on
// opcode boundaries. K consecutive frames wholly in [p, end) are scanned
// side by side (one table walk is a chain of dependent loads; K of them
// overlap). Returns where the sequential scan goes on: after the frames
// that scanned clean, i.e. each ending exactly at its end; a frame that
// does not (a large operand written after its frame, a line operand, the
// end) is left to the sequential scan, which also sees the frames' bytes
// as one opcode stream, so the result is the same either way.
template <int K>
const char* ScanFrames(const char* p, const char* end, MemoRefs& refs) {
  const ScanTables& t = Tables();
  const char* s[K];
  const char* e[K];
  const char* q = p;
  for (int i = 0; i < K; ++i) {
    if (end - q < 9 || static_cast<uint8_t>(*q) != kFrame) return p;
    const uint64_t len = LoadLE(q + 1, 8);
    if (len > static_cast<uint64_t>(end - q) - 9) return p;
    s[i] = q + 9;
    e[i] = s[i] + len;
    q = e[i];
  }
  // Side by side while every frame has 9+ bytes left and steps cleanly.
  bool stuck = false;
  while (!stuck) {
    for (int i = 0; i < K; ++i) {
      if (e[i] - s[i] < 9 || !ScanStep(t, s[i], e[i], refs)) stuck = true;
    }
  }
  // Each frame to its end on its own.
  const char* done = p;
  for (int i = 0; i < K; ++i) {
    while (s[i] < e[i] && ScanStep(t, s[i], e[i], refs)) {
    }
    if (s[i] != e[i]) break;
    done = e[i];
  }
  return done;
}

// Programs without frames (protocols 0-3; ckptd writes 2): [p, end) as
// two chains side by side, A from p and B from the middle. B starts blind
// (perhaps inside an operand), but opcode streams fall into step within a
// few opcodes: B marks every position it reaches, and once A reaches one of
// them both read the same opcodes from there on. What B read before that
// point can only add indices no GET names (a superset of the references:
// a few memo values kept that need not be, nothing else changes). Returns
// where the sequential scan goes on: B's last position when A fell into
// step with B, else A's; *past_mid: A got past the middle.
const char* SplitScan(const char* p, const char* end, MemoRefs& refs,
                      std::vector<uint64_t>& seen, bool* past_mid) {
  const ScanTables& t = Tables();
  const char* const mid = p + (end - p) / 2;
  seen.assign((static_cast<size_t>(end - mid) + 64) / 64, 0);
  auto mark = [&](const char* b) {
    const size_t k = static_cast<size_t>(b - mid);
    seen[k / 64] |= uint64_t{1} << (k % 64);
  };
  const char* a = p;
  const char* b = mid;
  bool a_on = true, b_on = true;
  while (a_on && b_on && a < mid) {
    a_on = ScanStep(t, a, end, refs);
    mark(b);
    b_on = ScanStep(t, b, end, refs);
  }
  while (b_on) {
    mark(b);
    b_on = ScanStep(t, b, end, refs);
  }
  mark(b);
  while (a_on && a < mid) a_on = ScanStep(t, a, end, refs);
  *past_mid = a >= mid;
  if (!a_on) return a;
  while (a < b) {
    const size_t k = static_cast<size_t>(a - mid);
    if ((seen[k / 64] >> (k % 64)) & 1) return b;  // in step with B
    if (!ScanStep(t, a, end, refs)) return a;
  }
  return a;
}

// Pass 1 over one program: the fast scans of what lies in the buffer, and
// one opcode at a time through Peek where they stop.
class MemoScan {
 public:
  MemoScan(Source& src, MemoRefs& refs) : src_(src), refs_(refs) {
    // Framed (protocol 4+: PROTO n, FRAME): frames side by side; else two
    // halves of each buffer side by side.
    const char* first = src.Peek(3);
    framed_ = first != nullptr && static_cast<uint8_t>(first[0]) == kProto &&
              static_cast<uint8_t>(first[2]) == kFrame;
  }

  // Runs of opcodes that lie wholly in the buffer, read in place.
  void ScanBuffered();
  // One opcode through Peek (refills the buffer); false where the scan
  // ends (STOP or what pass 2 rejects, the end of the input, an operand
  // past it).
  bool ScanOne();

 private:
  // A line operand, '\n' consumed.
  bool Line(std::string_view* out) {
    bool too_long = false;
    const int64_t len = src_.LineLength(src_.remaining(), &too_long);
    if (len < 0) return false;
    *out = std::string_view(src_.Peek(len + 1), len);
    src_.Advance(len + 1);
    return true;
  }

  static constexpr ptrdiff_t kSplitMin = ptrdiff_t{256} << 10;
  Source& src_;
  MemoRefs& refs_;
  const ScanTables& t_ = Tables();
  bool framed_ = false;
  std::vector<uint64_t> seen_;    // SplitScan's
  uint64_t split_off_until_ = 0;  // file position
};

void MemoScan::ScanBuffered() {
  // The loop's state in locals (members would be reloaded after every
  // store into the MemoRefs).
  const ScanTables& t = t_;
  MemoRefs& refs = refs_;
  const bool framed = framed_;
  uint64_t split_off_until = split_off_until_;
  const char* const start = src_.cursor();
  const char* const end = start + src_.buffered();
  const uint64_t pos0 = src_.pos();  // the file position of start
  const char* p = start;
  while (end - p >= 9) {
    const auto op = static_cast<uint8_t>(*p);
    if (!framed && end - p >= kSplitMin &&
        pos0 + static_cast<uint64_t>(p - start) >= split_off_until) {
      bool past_mid = false;
      const char* q = SplitScan(p, end, refs, seen_, &past_mid);
      // Not past the middle (a line operand, the end): no second try in
      // this buffer.
      if (!past_mid) {
        split_off_until = pos0 + static_cast<uint64_t>(end - start);
      }
      if (q != p) {
        p = q;
        continue;
      }
    }
    if (op == kFrame) {
      const char* f = ScanFrames<4>(p, end, refs);
      if (f == p) f = ScanFrames<2>(p, end, refs);
      if (f != p) {
        p = f;
        continue;
      }
    }
    if (const uint8_t skip = t.skip[op]; skip != 0) {
      p += skip;
      continue;
    }
    const OperandLayout info = t.ops[op];
    if (info.kind == OperandKind::kGet) {
      refs.Add(LoadLE(p + 1, info.size));
      p += 1 + info.size;
    } else if (info.kind == OperandKind::kCounted) {
      const uint64_t u = LoadLE(p + 1, info.size);
      if (u > static_cast<uint64_t>(end - p) - 1 - info.size) break;
      p += 1 + info.size + u;
    } else {
      break;  // lines, the end: ScanOne
    }
  }
  split_off_until_ = split_off_until;
  src_.Advance(p - start);
}

bool MemoScan::ScanOne() {
  const char* q = src_.Peek(9);
  if (q == nullptr && (q = src_.Peek(1)) == nullptr) return false;
  const OperandLayout info = t_.ops[static_cast<uint8_t>(*q)];
  std::string_view l;
  uint64_t u = 0;
  switch (info.kind) {
    case OperandKind::kEnd:
      return false;
    case OperandKind::kNone:
      src_.Advance(1);
      return true;
    case OperandKind::kFixed:
    case OperandKind::kCounted:
    case OperandKind::kGet:
      if ((q = src_.Peek(1 + info.size)) == nullptr) return false;
      u = LoadLE(q + 1, info.size);
      src_.Advance(1 + info.size);
      if (info.kind == OperandKind::kGet) {
        refs_.Add(u);
      } else if (info.kind == OperandKind::kCounted) {
        if (u > src_.remaining() || src_.Peek(u) == nullptr) return false;
        src_.Advance(u);
      }
      return true;
    case OperandKind::kTwoLines:
      src_.Advance(1);
      return Line(&l) && Line(&l);
    default:  // kLine, kGetLine
      src_.Advance(1);
      if (!Line(&l)) return false;
      if (info.kind == OperandKind::kGetLine && ParseDecimalU64(l, &u)) {
        refs_.Add(u);
      }
      return true;
  }
}

}  // namespace

MemoRefs ScanMemoReferences(Source& src) {
  // No program has more memo entries than opcodes (bytes); sparse indices
  // beyond that go to the map.
  MemoRefs refs(src.size() + 64);
  MemoScan scan(src, refs);
  do {
    scan.ScanBuffered();
  } while (scan.ScanOne());
  refs.Finish();
  return refs;
}

// ---------------------------------------------------------------------------
// Vm: heap
// ---------------------------------------------------------------------------

namespace {

constexpr uint16_t kPooled = 0xffff;

}  // namespace

int ClassOf(std::string_view module, std::string_view name) {
  constexpr std::string_view kMd = "torch.distributed.checkpoint.metadata";
  if (module == kMd) {
    if (name == "Metadata") return kClsMetadata;
    if (name == "ChunkStorageMetadata") return kClsChunk;
    if (name == "TensorStorageMetadata") return kClsTensorStorage;
    if (name == "BytesStorageMetadata") return kClsBytesStorage;
    if (name == "TensorProperties") return kClsProperties;
    if (name == "MetadataIndex") return kClsIndex;
    if (name == "StorageMeta") return kClsStorageMeta;
  } else if (module == "torch.distributed._shard.sharded_tensor.metadata") {
    if (name == "TensorProperties") return kClsShardProperties;
  } else if (module == "torch.distributed.checkpoint.filesystem") {
    if (name == "_StorageInfo") return kClsStorageInfo;
  } else if (module == "torch" && name == "Size") {
    return kClsSize;
  }
  return kOther;
}

Vm::Vm(Source& src, const Limits& limits, std::string source_name,
       CompactMetadataBuilder* builder, MemoRefs referenced)
    : src_(src),
      machine_(limits, std::move(source_name)),
      max_alloc_bytes_(limits.max_alloc_bytes),
      builder_(builder),
      schema_(std::make_unique<Schema>(this)),
      referenced_(std::move(referenced)),
      memo_(referenced_.size()),
      memo_set_(referenced_.size(), 0) {
  Charge(referenced_.MemoryBytes() + 48 * referenced_.size());
}

Vm::~Vm() = default;

std::string_view Vm::str(const Val& v) const {
  return builder_->strings().Get(v.a);
}

std::pair<std::string_view, std::string_view> Vm::global(uint32_t id) const {
  const auto& [m, n] = globals_[id];
  return {builder_->strings().Get(m), builder_->strings().Get(n)};
}

absl::Span<const int64_t> Vm::ints(const Val& v) const {  // kIntSeq(1), kSize
  if (v.a <= 4) return {v.w, v.a};
  return {pool_.data() + v.w[0], v.a};
}

absl::Span<const int64_t> Vm::index_offsets(const Val& v) const {
  if (v.n != kPooled) return {v.w, v.n};
  return {pool_.data() + v.w[0], static_cast<size_t>(v.w[1])};
}

absl::Span<const int64_t> Vm::chunk_ints(const Val& v) const {
  if (v.a <= 2) return {v.w, 2 * size_t{v.a}};
  return {pool_.data() + v.w[0], 2 * size_t{v.a}};
}

bool Vm::Charge(uint64_t bytes) {
  allocated_ += bytes;
  if (ABSL_PREDICT_FALSE(allocated_ > max_alloc_bytes_)) {
    pickle::internal::MachineState& m = machine_;
    if (m.error.ok()) {
      m.error = absl::ResourceExhaustedError(fmt::format(
          "{}: offset {}: opcode 0x{:02x} ({}): allocation limit of {} bytes "
          "exceeded",
          m.source_name, m.op_pos, m.op, OpName(m.op), max_alloc_bytes_));
    }
    return false;
  }
  return true;
}

uint64_t Vm::NewNodeId(NodeKind kind) {
  uint64_t id;
  if (!free_nodes_.empty()) {
    id = free_nodes_.back();
    free_nodes_.pop_back();
  } else {
    id = nodes_.size();
    nodes_.emplace_back();
    Charge(sizeof(Node));
  }
  Node& n = nodes_[id];
  n.kind = kind;
  n.newobj = n.has_state = n.has_kwargs = false;
  n.callable.tag = n.args.tag = Tag::kNone;
  n.typed_chunks = kind == NodeKind::kList;
  n.typed_storage = false;
  n.pos = machine_.op_pos;
  n.chunk_ndim = n.chunk_count = 0;
  return id;
}

void Vm::FreeNode(uint64_t id) {
  Node& n = nodes_[id];
  if (n.typed_storage) {
    builder_->ClearStorage();
    typed_storage_node_ = -1;
  }
  n.items.clear();
  n.entries.clear();
  n.chunk_ints.clear();
  // callable/args/kwargs/state are read only where kind and the has_
  // flags say they are set (NewNodeId resets those).
  free_nodes_.push_back(id);
}

uint32_t Vm::NewTensor(TensorRec rec) {
  Charge(sizeof(TensorRec) + 8 * (rec.shape.size() + rec.ints.size()));
  tensors_.push_back(std::move(rec));
  return static_cast<uint32_t>(tensors_.size() - 1);
}

int64_t Vm::NewTransforms(std::vector<uint32_t> ids) {
  Charge(32 + 4 * ids.size());
  transforms_.push_back(std::move(ids));
  return static_cast<int64_t>(transforms_.size() - 1);
}

Val Vm::MakeInts(Tag tag, absl::Span<const int64_t> v) {
  Val out;
  FillInts(&out, tag, v);
  return out;
}

void Vm::FillInts(Val* out_ptr, Tag tag, absl::Span<const int64_t> v) {
  Val& out = *out_ptr;
  out.tag = tag;
  out.a = static_cast<uint32_t>(v.size());
  if (v.size() <= 4) {
    std::copy(v.begin(), v.end(), out.w);
    return;
  }
  // `v` may point into the pool itself: reserve first.
  const size_t pos = pool_.size();
  if (v.data() >= pool_.data() && v.data() < pool_.data() + pool_.size()) {
    const size_t from = v.data() - pool_.data();
    pool_.resize(pos + v.size());
    std::copy_n(pool_.begin() + from, v.size(), pool_.begin() + pos);
  } else {
    pool_.insert(pool_.end(), v.begin(), v.end());
  }
  Charge(8 * v.size());
  out.w[0] = static_cast<int64_t>(pos);
}

Val Vm::MakeChunk(absl::Span<const int64_t> offsets,
                  absl::Span<const int64_t> sizes) {
  Val out;
  out.tag = Tag::kChunk;
  const size_t nd = offsets.size();
  out.a = static_cast<uint32_t>(nd);
  if (nd <= 2) {
    std::copy(offsets.begin(), offsets.end(), out.w);
    std::copy(sizes.begin(), sizes.end(), out.w + nd);
    return out;
  }
  std::vector<int64_t> tmp(offsets.begin(), offsets.end());
  tmp.insert(tmp.end(), sizes.begin(), sizes.end());
  out.w[0] = static_cast<int64_t>(pool_.size());
  pool_.insert(pool_.end(), tmp.begin(), tmp.end());
  Charge(8 * tmp.size());
  return out;
}

Val Vm::MakeIndex(uint32_t fqn, bool has_offset,
                  absl::Span<const int64_t> offsets, int64_t hint) {
  Val out;
  out.tag = Tag::kIndex;
  out.a = fqn;
  out.flags = has_offset ? kHasOffset : 0;
  if (offsets.size() <= 2) {
    out.n = static_cast<uint16_t>(offsets.size());
    std::copy(offsets.begin(), offsets.end(), out.w);
  } else {
    std::vector<int64_t> tmp(offsets.begin(), offsets.end());
    out.n = kPooled;
    out.w[0] = static_cast<int64_t>(pool_.size());
    out.w[1] = static_cast<int64_t>(tmp.size());
    pool_.insert(pool_.end(), tmp.begin(), tmp.end());
    Charge(8 * tmp.size());
  }
  out.w[3] = hint;
  return out;
}

void Vm::ReleaseInts(const Val& v) {
  int64_t pos = -1;
  size_t n = 0;
  if ((v.tag == Tag::kIntSeq || v.tag == Tag::kIntSeq1 ||
       v.tag == Tag::kSize) &&
      v.a > 4) {
    pos = v.w[0], n = v.a;
  } else if (v.tag == Tag::kChunk && v.a > 2) {
    pos = v.w[0], n = 2 * size_t{v.a};
  } else if (v.tag == Tag::kIndex && v.n == kPooled) {
    pos = v.w[0], n = static_cast<size_t>(v.w[1]);
  }
  if (pos >= 0 && static_cast<size_t>(pos) + n == pool_.size()) {
    pool_.resize(pos);
  }
}

void Vm::Untype(Node& n, uint64_t id) {
  if (n.typed_chunks) {
    n.typed_chunks = false;
    if (n.chunk_count == 0) return;
    const size_t nd = n.chunk_ndim;
    std::vector<int64_t> ints = std::move(n.chunk_ints);
    n.chunk_ints.clear();
    const uint32_t count = n.chunk_count;
    n.chunk_count = 0;
    std::vector<Val> items;
    items.reserve(count);
    for (size_t c = 0; c < count; ++c) {
      const int64_t* p = ints.data() + 2 * nd * c;
      items.push_back(MakeChunk({p, nd}, {p + nd, nd}));
    }
    Node& again = nodes_[id];  // MakeChunk does not allocate nodes
    Charge(sizeof(Val) * items.size());
    again.items = std::move(items);
    return;
  }
  if (n.typed_storage) {
    n.typed_storage = false;
    typed_storage_node_ = -1;
    CompactMetadataBuilder& b = *builder_;
    std::vector<Val> entries;
    entries.reserve(2 * b.num_storage());
    for (size_t k = 0; k < b.num_storage(); ++k) {
      const auto e = b.pending_storage(k);
      entries.push_back(MakeIndex(e.fqn, e.has_offset, e.key, e.hint));
      Val info;
      info.tag = Tag::kInfo;
      info.a = e.path;
      info.w[0] = static_cast<int64_t>(e.offset);
      info.w[1] = static_cast<int64_t>(e.length);
      info.w[2] = e.transforms == nullptr ? -1 : NewTransforms(*e.transforms);
      entries.push_back(info);
    }
    b.ClearStorage();
    Charge(sizeof(Val) * entries.size());
    nodes_[id].entries = std::move(entries);
  }
}

}  // namespace ckptd::format::mdvm
