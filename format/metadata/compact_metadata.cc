// Copyright 2026 The ckptd Authors.
#include "format/metadata/compact_metadata.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>

#include "absl/hash/hash.h"
#include "common/tsan_annotations.h"
#include "fmt/format.h"

namespace ckptd::format {

// ---------------------------------------------------------------------------
// StringTable
// ---------------------------------------------------------------------------

uint32_t StringTable::Intern(std::string_view s) {
  if (auto it = ids_.find(s); it != ids_.end()) return it->second;
  const char* data;
  if (s.size() > kBlockBytes / 4) {
    auto block = std::make_unique<char[]>(s.size() + 1);
    std::memcpy(block.get(), s.data(), s.size());
    data = block.get();
    block_bytes_ += s.size() + 1;
    // Keep the current (partly filled) block last.
    blocks_.insert(blocks_.empty() ? blocks_.end() : blocks_.end() - 1,
                   std::move(block));
  } else {
    if (blocks_.empty() || block_used_ + s.size() > kBlockBytes) {
      blocks_.push_back(std::make_unique<char[]>(kBlockBytes));
      block_bytes_ += kBlockBytes;
      block_used_ = 0;
    }
    char* p = blocks_.back().get() + block_used_;
    if (!s.empty()) std::memcpy(p, s.data(), s.size());
    block_used_ += s.size();
    data = p;
  }
  const auto id = static_cast<uint32_t>(views_.size());
  views_.emplace_back(data, s.size());
  ids_.emplace(views_.back(), id);
  return id;
}

std::optional<uint32_t> StringTable::Find(std::string_view s) const {
  auto it = ids_.find(s);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

uint64_t StringTable::MemoryBytes() const {
  return block_bytes_ + views_.capacity() * sizeof(std::string_view) +
         ids_.capacity() * (sizeof(std::string_view) + sizeof(uint32_t) + 1);
}

// ---------------------------------------------------------------------------
// Lazy indexes
// ---------------------------------------------------------------------------

// Chunks of one tensor sorted by their start along `dim`, with the running
// maximum of their ends: the chunks overlapping [lo, hi) along `dim` are a
// contiguous range of `order`, found by two binary searches.
struct CompactMetadata::BoxIndex {
  bool zero_dim = false;  // 0-d tensor: every chunk overlaps
  uint32_t dim = 0;
  std::vector<uint32_t> order;   // non-empty chunks of the tensor's rank
  std::vector<int64_t> start;    // start along dim, ascending
  std::vector<int64_t> max_end;  // max end over order[0..k]
};

struct CompactMetadata::Lazy {
  explicit Lazy(size_t items)
      : box_once(new absl::once_flag[items]),
        box(new std::unique_ptr<BoxIndex>[items]) {}
  std::unique_ptr<absl::once_flag[]> box_once;
  std::unique_ptr<std::unique_ptr<BoxIndex>[]> box;
};

CompactMetadata::CompactMetadata() = default;
CompactMetadata::CompactMetadata(CompactMetadata&&) noexcept = default;
CompactMetadata& CompactMetadata::operator=(CompactMetadata&&) noexcept =
    default;
CompactMetadata::~CompactMetadata() = default;

// ---------------------------------------------------------------------------
// Accessors
// ---------------------------------------------------------------------------

std::optional<size_t> CompactMetadata::FindItem(std::string_view fqn) const {
  std::optional<uint32_t> id = strings_.Find(fqn);
  if (!id || *id >= item_of_string_.size() || item_of_string_[*id] == kNone) {
    return std::nullopt;
  }
  return item_of_string_[*id];
}

absl::Span<const int64_t> CompactMetadata::chunk_offsets(size_t i,
                                                         size_t j) const {
  const ChunkLoc c = ChunkAt(i, j);
  return {ints_.data() + c.pos, c.off_n};
}

absl::Span<const int64_t> CompactMetadata::chunk_sizes(size_t i,
                                                       size_t j) const {
  const ChunkLoc c = ChunkAt(i, j);
  return {ints_.data() + c.pos + c.off_n, c.size_n};
}

ChunkStorageMetadata CompactMetadata::chunk(size_t i, size_t j) const {
  const auto off = chunk_offsets(i, j), sz = chunk_sizes(i, j);
  return {{off.begin(), off.end()}, {sz.begin(), sz.end()}};
}

std::vector<std::string> CompactMetadata::transform_descriptors(
    const Storage& s) const {
  std::vector<std::string> out;
  if (s.transforms == kNone) return out;
  for (uint32_t id : transforms_[s.transforms]) {
    out.emplace_back(strings_.Get(id));
  }
  return out;
}

StorageKey CompactMetadata::Key(const Storage& s) const {
  StorageKey k;
  k.fqn = std::string(strings_.Get(s.fqn));
  k.has_offset = s.has_offset;
  const auto off = key_offsets(s);
  k.offset.assign(off.begin(), off.end());
  return k;
}

StorageInfo CompactMetadata::Info(const Storage& s) const {
  StorageInfo info;
  info.relative_path = std::string(strings_.Get(s.path));
  info.offset = s.offset;
  info.length = s.length;
  info.transform_descriptors = transform_descriptors(s);
  return info;
}

std::string CompactMetadata::DescribeStorageKey(const Storage& s) const {
  if (!s.has_offset) return std::string(strings_.Get(s.fqn));
  return fmt::format("{}@({})", strings_.Get(s.fqn),
                     fmt::join(key_offsets(s), ", "));
}

const CompactMetadata::Storage* CompactMetadata::FindStorage(
    const StorageKey& key) const {
  const std::optional<size_t> i = FindItem(key.fqn);
  if (i) {
    const Item& it = items_[*i];
    if (!it.tensor && !key.has_offset) return bytes_storage(*i);
    if (it.tensor && key.has_offset) {
      for (size_t j = 0; j < it.num_chunks; ++j) {
        const auto off = chunk_offsets(*i, j);
        if (std::equal(off.begin(), off.end(), key.offset.begin(),
                       key.offset.end())) {
          return chunk_storage(*i, j);
        }
      }
      return nullptr;
    }
  }
  // Orphans (keys that name no item or chunk): rare, scanned.
  for (const Storage& s : storage_) {
    if (s.item != kNone || s.has_offset != key.has_offset ||
        strings_.Get(s.fqn) != key.fqn) {
      continue;
    }
    const auto off = key_offsets(s);
    if (std::equal(off.begin(), off.end(), key.offset.begin(),
                   key.offset.end())) {
      return &s;
    }
  }
  return nullptr;
}

uint64_t CompactMetadata::MemoryBytes() const {
  uint64_t n = strings_.MemoryBytes() + items_.capacity() * sizeof(Item) +
               ints_.capacity() * sizeof(int64_t) +
               irregular_.capacity() * sizeof(irregular_[0]) +
               chunk_storage_.capacity() * sizeof(uint32_t) +
               storage_.capacity() * sizeof(Storage) +
               item_of_string_.capacity() * sizeof(uint32_t);
  for (const auto& t : transforms_) n += 24 + t.capacity() * 4;
  return n;
}

// ---------------------------------------------------------------------------
// Chunks by box
// ---------------------------------------------------------------------------

const CompactMetadata::BoxIndex& CompactMetadata::IndexOf(size_t i) const {
  CallOnce(lazy_->box_once[i], [&] {
    auto idx = std::make_unique<BoxIndex>();
    const Item& it = items_[i];
    const size_t nd = it.ndim;
    if (nd == 0) {
      idx->zero_dim = true;
      lazy_->box[i] = std::move(idx);
      return;
    }
    std::vector<uint32_t> live;
    live.reserve(it.num_chunks);
    for (uint32_t j = 0; j < it.num_chunks; ++j) {
      const auto sz = chunk_sizes(i, j);
      if (sz.size() != nd || chunk_offsets(i, j).size() != nd) {
        continue;  // never overlaps a box of the tensor
      }
      if (std::all_of(sz.begin(), sz.end(), [](int64_t s) { return s > 0; })) {
        live.push_back(j);
      }
    }
    // Sweep along the dimension with the most distinct chunk starts.
    size_t best = 0;
    std::vector<int64_t> starts(live.size());
    for (size_t d = 0; d < nd && live.size() > 1; ++d) {
      for (size_t k = 0; k < live.size(); ++k) {
        starts[k] = chunk_offsets(i, live[k])[d];
      }
      std::sort(starts.begin(), starts.end());
      const size_t distinct =
          std::unique(starts.begin(), starts.end()) - starts.begin();
      if (distinct > best) best = distinct, idx->dim = static_cast<uint32_t>(d);
    }
    const uint32_t dim = idx->dim;
    std::stable_sort(live.begin(), live.end(), [&](uint32_t a, uint32_t b) {
      return chunk_offsets(i, a)[dim] < chunk_offsets(i, b)[dim];
    });
    idx->order = std::move(live);
    idx->start.resize(idx->order.size());
    idx->max_end.resize(idx->order.size());
    int64_t max_end = INT64_MIN;
    for (size_t k = 0; k < idx->order.size(); ++k) {
      const uint32_t j = idx->order[k];
      const int64_t s = chunk_offsets(i, j)[dim];
      idx->start[k] = s;
      max_end = std::max(max_end, s + chunk_sizes(i, j)[dim]);
      idx->max_end[k] = max_end;
    }
    lazy_->box[i] = std::move(idx);
  });
  return *lazy_->box[i];
}

void CompactMetadata::OverlappingChunks(size_t i,
                                        absl::Span<const int64_t> offsets,
                                        absl::Span<const int64_t> sizes,
                                        std::vector<uint32_t>* out) const {
  const Item& it = items_[i];
  if (!it.tensor || offsets.size() != it.ndim || sizes.size() != it.ndim) {
    return;
  }
  const BoxIndex& idx = IndexOf(i);
  if (idx.zero_dim) {
    for (uint32_t j = 0; j < it.num_chunks; ++j) out->push_back(j);
    return;
  }
  const size_t nd = it.ndim;
  for (size_t d = 0; d < nd; ++d) {
    if (sizes[d] <= 0) return;
  }
  const int64_t lo = offsets[idx.dim], hi = offsets[idx.dim] + sizes[idx.dim];
  // [first, last): chunks with max_end > lo (monotone) and start < hi.
  const size_t first =
      std::partition_point(idx.max_end.begin(), idx.max_end.end(),
                           [&](int64_t e) { return e <= lo; }) -
      idx.max_end.begin();
  const size_t last = std::lower_bound(idx.start.begin(), idx.start.end(), hi) -
                      idx.start.begin();
  const size_t before = out->size();
  for (size_t k = first; k < last; ++k) {
    const uint32_t j = idx.order[k];
    const auto off = chunk_offsets(i, j), sz = chunk_sizes(i, j);
    bool overlap = true;
    for (size_t d = 0; d < nd && overlap; ++d) {
      overlap = offsets[d] < off[d] + sz[d] && off[d] < offsets[d] + sizes[d];
    }
    if (overlap) out->push_back(j);
  }
  std::sort(out->begin() + before, out->end());
}

// ---------------------------------------------------------------------------
// Conversions
// ---------------------------------------------------------------------------

Metadata CompactMetadata::ToMetadata() const {
  Metadata md;
  md.state_dict_metadata.reserve(items_.size());
  for (size_t i = 0; i < items_.size(); ++i) {
    const Item& it = items_[i];
    std::string fqn(strings_.Get(it.fqn));
    if (!it.tensor) {
      md.state_dict_metadata.emplace_back(std::move(fqn),
                                          BytesStorageMetadata{});
      continue;
    }
    TensorStorageMetadata t;
    t.properties = it.properties;
    const auto sh = shape(i);
    t.size.assign(sh.begin(), sh.end());
    t.chunks.reserve(it.num_chunks);
    for (size_t j = 0; j < it.num_chunks; ++j) t.chunks.push_back(chunk(i, j));
    md.state_dict_metadata.emplace_back(std::move(fqn), std::move(t));
  }
  md.planner_data = planner_data_;
  md.storage_data.reserve(storage_.size());
  for (const Storage& s : storage_) {
    md.storage_data.emplace_back(Key(s), Info(s));
  }
  md.storage_meta = storage_meta_;
  md.version = version_;
  md.BuildIndex();
  return md;
}

CompactMetadata CompactMetadata::FromMetadata(const Metadata& md) {
  CompactMetadataBuilder b;
  std::vector<int64_t> ints;
  for (const auto& [fqn, sm] : md.state_dict_metadata) {
    const uint32_t id = b.Intern(fqn);
    const auto* t = std::get_if<TensorStorageMetadata>(&sm);
    if (t == nullptr) {
      b.AddBytesItem(id);
      continue;
    }
    const size_t cnd = t->chunks.empty() ? 0 : t->chunks[0].offsets.size();
    bool regular = true;
    for (const auto& c : t->chunks) {
      regular = regular && c.offsets.size() == cnd && c.sizes.size() == cnd;
    }
    if (!regular) {
      b.AddIrregularTensor(id, t->properties, t->size, t->chunks);
      continue;
    }
    ints.clear();
    ints.reserve(2 * cnd * t->chunks.size());
    for (const auto& c : t->chunks) {
      ints.insert(ints.end(), c.offsets.begin(), c.offsets.end());
      ints.insert(ints.end(), c.sizes.begin(), c.sizes.end());
    }
    b.AddTensor(id, t->properties, t->size, static_cast<uint32_t>(cnd),
                static_cast<uint32_t>(t->chunks.size()), ints);
  }
  std::vector<uint32_t> td;
  for (const auto& [key, info] : md.storage_data) {
    td.clear();
    for (const auto& d : info.transform_descriptors) td.push_back(b.Intern(d));
    b.AddStorage(b.Intern(key.fqn), key.has_offset, key.offset,
                 b.Intern(info.relative_path), info.offset, info.length, &td,
                 -1);
  }
  b.SetPlannerData(md.planner_data);
  b.SetStorageMeta(md.storage_meta);
  b.SetVersion(md.version);
  return std::move(b).Finish();
}

// ---------------------------------------------------------------------------
// Builder
// ---------------------------------------------------------------------------

CompactMetadataBuilder::CompactMetadataBuilder() = default;

void CompactMetadataBuilder::Reserve(uint64_t chunks) {
  chunks = std::min<uint64_t>(chunks, uint64_t{1} << 28);
  md_.ints_.reserve(4 * chunks);
  md_.chunk_storage_.reserve(chunks);
  md_.storage_.reserve(chunks);
  key_ints_.reserve(2 * chunks);
  hints_.reserve(chunks);
}

uint32_t CompactMetadataBuilder::StartItem(uint32_t fqn) {
  auto& index = md_.item_of_string_;
  if (index.size() <= fqn) {
    index.resize(std::max<size_t>(fqn + 1, 2 * index.size()),
                 CompactMetadata::kNone);
  }
  if (index[fqn] == CompactMetadata::kNone) {
    index[fqn] = static_cast<uint32_t>(md_.items_.size());
    md_.items_.emplace_back();
  } else {
    // Python dict semantics: the first position, the last value.
    md_.items_[index[fqn]] = CompactMetadata::Item{};
  }
  md_.items_[index[fqn]].fqn = fqn;
  return index[fqn];
}

CompactMetadata::Item& CompactMetadataBuilder::StartTensor(
    uint32_t fqn, const TensorProperties& properties,
    absl::Span<const int64_t> shape) {
  CompactMetadata::Item& it = md_.items_[StartItem(fqn)];
  it.tensor = true;
  it.properties = properties;
  it.ndim = static_cast<uint32_t>(shape.size());
  it.shape_pos = md_.ints_.size();
  md_.ints_.insert(md_.ints_.end(), shape.begin(), shape.end());
  return it;
}

void CompactMetadataBuilder::AddTensor(uint32_t fqn,
                                       const TensorProperties& properties,
                                       absl::Span<const int64_t> shape,
                                       uint32_t chunk_ndim, uint32_t num_chunks,
                                       absl::Span<const int64_t> ints) {
  CompactMetadata::Item& it = StartTensor(fqn, properties, shape);
  it.num_chunks = num_chunks;
  it.chunk_ndim = chunk_ndim;
  it.chunk_pos = md_.ints_.size();
  md_.ints_.insert(md_.ints_.end(), ints.begin(), ints.end());
}

void CompactMetadataBuilder::AddIrregularTensor(
    uint32_t fqn, const TensorProperties& properties,
    absl::Span<const int64_t> shape,
    absl::Span<const ChunkStorageMetadata> chunks) {
  CompactMetadata::Item& it = StartTensor(fqn, properties, shape);
  it.num_chunks = static_cast<uint32_t>(chunks.size());
  it.chunk_ndim = CompactMetadata::kNone;
  it.chunk_pos = md_.irregular_.size();
  for (const ChunkStorageMetadata& c : chunks) {
    md_.irregular_.push_back({md_.ints_.size(),
                              static_cast<uint32_t>(c.offsets.size()),
                              static_cast<uint32_t>(c.sizes.size())});
    md_.ints_.insert(md_.ints_.end(), c.offsets.begin(), c.offsets.end());
    md_.ints_.insert(md_.ints_.end(), c.sizes.begin(), c.sizes.end());
  }
}

void CompactMetadataBuilder::AddBytesItem(uint32_t fqn) {
  md_.items_[StartItem(fqn)].tensor = false;
}

void CompactMetadataBuilder::AddStorage(uint32_t fqn, bool has_offset,
                                        absl::Span<const int64_t> key_offsets,
                                        uint32_t path, uint64_t offset,
                                        uint64_t length,
                                        const std::vector<uint32_t>* transforms,
                                        int64_t hint) {
  CompactMetadata::Storage s;
  s.fqn = fqn;
  s.path = path;
  s.has_offset = has_offset;
  s.key_ndim = static_cast<uint32_t>(key_offsets.size());
  s.key_pos = key_ints_.size();
  key_ints_.insert(key_ints_.end(), key_offsets.begin(), key_offsets.end());
  s.offset = offset;
  s.length = length;
  if (transforms != nullptr && !transforms->empty()) {
    s.transforms = static_cast<uint32_t>(md_.transforms_.size());
    md_.transforms_.push_back(*transforms);
  }
  md_.storage_.push_back(s);
  hints_.push_back(hint);
}

CompactMetadataBuilder::PendingStorage CompactMetadataBuilder::pending_storage(
    size_t k) const {
  const CompactMetadata::Storage& s = md_.storage_[k];
  return {s.fqn,
          s.has_offset,
          {key_ints_.data() + s.key_pos, s.key_ndim},
          s.path,
          s.offset,
          s.length,
          s.transforms == CompactMetadata::kNone
              ? nullptr
              : &md_.transforms_[s.transforms],
          hints_[k]};
}

void CompactMetadataBuilder::ClearStorage() {
  md_.storage_.clear();
  md_.transforms_.clear();
  key_ints_.clear();
  hints_.clear();
}

uint64_t CompactMetadataBuilder::MemoryBytes() const {
  return md_.MemoryBytes() + key_ints_.capacity() * sizeof(int64_t) +
         hints_.capacity() * sizeof(int64_t);
}

namespace {

uint64_t Fingerprint(absl::Span<const int64_t> v) {
  uint64_t h = 0x2545f4914f6cdd1dull ^ v.size();
  for (int64_t x : v) {
    h = (h ^ static_cast<uint64_t>(x)) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
  }
  return h;
}

}  // namespace

// Match()'s state: per tensor, the chunk lookups made on first need; the
// entries that match nothing (orphans) by key; the entries merged into an
// earlier one with the same key.
class CompactMetadataBuilder::Matcher {
 public:
  explicit Matcher(CompactMetadataBuilder* b)
      : md_(b->md_),
        key_ints_(b->key_ints_),
        hints_(b->hints_),
        per_(md_.items_.size()),
        dead_(md_.storage_.size(), 0) {}

  void Run() {
    for (uint32_t k = 0; k < md_.storage_.size(); ++k) MatchEntry(k);
    ShareRepresentativeEntries();
    if (any_dead_) DropMerged();
  }

 private:
  using Storage = CompactMetadata::Storage;
  using Key = absl::Span<const int64_t>;
  static constexpr uint32_t kNone = CompactMetadata::kNone;

  // Per tensor, made on first need: the representative of each chunk (the
  // first chunk with equal offsets; only tensors where two chunks share
  // offsets have one), a fingerprint map, and a cursor for keys in order.
  struct PerItem {
    bool checked = false;
    std::vector<uint32_t> rep;
    std::unique_ptr<absl::flat_hash_map<uint64_t, uint32_t>> by_fp;
    uint32_t cursor = 0;
  };

  // (Inline: a memcmp call costs more than comparing 1-3 ints.)
  static bool Same(Key a, Key b) {
    if (a.size() != b.size()) return false;
    for (size_t d = 0; d < a.size(); ++d) {
      if (a[d] != b[d]) return false;
    }
    return true;
  }
  bool OffsetsEqual(size_t i, uint32_t j, Key k) const {
    return Same(md_.chunk_offsets(i, j), k);
  }

  // Entry k into the slot of the chunk or bytes item its key names (merged
  // into the entry there if any), or else among the orphans.
  void MatchEntry(uint32_t k) {
    Storage& s = md_.storage_[k];
    const Key key(key_ints_.data() + s.key_pos, s.key_ndim);
    const uint32_t i =
        s.fqn < md_.item_of_string_.size() ? md_.item_of_string_[s.fqn] : kNone;
    uint32_t* slot = nullptr;
    if (i != kNone) {
      auto& it = md_.items_[i];
      if (it.tensor && s.has_offset) {
        const uint32_t j = MatchChunk(i, key, hints_[k]);
        if (j != kNone) {
          slot = &md_.chunk_storage_[it.first_chunk + j];
          s.chunk = j;
        }
      } else if (!it.tensor && !s.has_offset) {
        slot = &it.bytes_storage;
      }
    }
    if (slot == nullptr) {
      s.chunk = kNone;
      AddOrphan(k, key);
      return;
    }
    s.item = i;
    if (*slot == kNone) {
      *slot = k;
    } else {
      Merge(*slot, k);
    }
  }

  // Orphan entry k (keyed by fqn, has_offset, offsets), merged into an
  // earlier orphan with the same key.
  void AddOrphan(uint32_t k, Key key) {
    const Storage& s = md_.storage_[k];
    auto& bucket = orphans_[{Fingerprint(key) ^ (s.has_offset ? 1 : 0), s.fqn}];
    for (uint32_t e : bucket) {
      const Storage& o = md_.storage_[e];
      if (o.has_offset == s.has_offset &&
          std::equal(key.begin(), key.end(), key_ints_.begin() + o.key_pos,
                     key_ints_.begin() + o.key_pos + o.key_ndim)) {
        Merge(e, k);
        return;
      }
    }
    bucket.push_back(k);
  }

  // Once per tensor i: the representatives of chunks whose offsets equal an
  // earlier chunk's (none where the first offsets increase).
  void FindRepresentatives(size_t i) {
    PerItem& p = per_[i];
    if (p.checked) return;
    p.checked = true;
    const auto& it = md_.items_[i];
    if (it.num_chunks < 2) return;
    bool increasing = it.chunk_ndim != kNone && it.chunk_ndim > 0;
    for (uint32_t j = 1; increasing && j < it.num_chunks; ++j) {
      increasing = md_.chunk_offsets(i, j)[0] > md_.chunk_offsets(i, j - 1)[0];
    }
    if (increasing) return;  // all offsets differ
    std::vector<std::pair<uint64_t, uint32_t>> fps(it.num_chunks);
    for (uint32_t j = 0; j < it.num_chunks; ++j) {
      fps[j] = {Fingerprint(md_.chunk_offsets(i, j)), j};
    }
    std::sort(fps.begin(), fps.end());
    for (size_t a = 0; a < fps.size();) {
      size_t b = a + 1;
      while (b < fps.size() && fps[b].first == fps[a].first) ++b;
      for (size_t x = a + 1; x < b; ++x) {
        // fps is sorted by (fp, j): earlier chunks come first.
        for (size_t y = a; y < x; ++y) {
          if (OffsetsEqual(i, fps[x].second,
                           md_.chunk_offsets(i, fps[y].second))) {
            if (p.rep.empty()) {
              p.rep.resize(it.num_chunks);
              std::iota(p.rep.begin(), p.rep.end(), 0u);
            }
            p.rep[fps[x].second] = p.rep[fps[y].second];
            break;
          }
        }
      }
      a = b;
    }
  }

  // The chunk of tensor i whose offsets are `key` (its representative),
  // tried at the hint, then at the cursor, then by fingerprint; or kNone.
  uint32_t MatchChunk(size_t i, Key key, int64_t hint) {
    FindRepresentatives(i);
    PerItem& p = per_[i];
    const auto& it = md_.items_[i];
    auto rep = [&](uint32_t j) { return p.rep.empty() ? j : p.rep[j]; };
    if (hint >= 0 && static_cast<uint64_t>(hint) < it.num_chunks &&
        OffsetsEqual(i, static_cast<uint32_t>(hint), key)) {
      return rep(static_cast<uint32_t>(hint));
    }
    if (p.cursor < it.num_chunks && OffsetsEqual(i, p.cursor, key)) {
      return rep(p.cursor++);
    }
    const uint32_t j = FindByFingerprint(i, key);
    if (j == kNone) return kNone;
    p.cursor = j + 1;
    return rep(j);
  }

  // The first chunk of tensor i whose offsets are `key`, through the
  // tensor's fingerprint map (built on first use); kNone if none.
  uint32_t FindByFingerprint(size_t i, Key key) {
    PerItem& p = per_[i];
    const auto& it = md_.items_[i];
    if (p.by_fp == nullptr) {
      p.by_fp = std::make_unique<absl::flat_hash_map<uint64_t, uint32_t>>();
      p.by_fp->reserve(it.num_chunks);
      for (uint32_t j = 0; j < it.num_chunks; ++j) {
        p.by_fp->try_emplace(Fingerprint(md_.chunk_offsets(i, j)), j);
      }
    }
    auto f = p.by_fp->find(Fingerprint(key));
    if (f == p.by_fp->end()) return kNone;
    const uint32_t j = f->second;
    if (OffsetsEqual(i, j, key)) return j;
    // A fingerprint collision: scan.
    for (uint32_t c = 0; c < it.num_chunks; ++c) {
      if (OffsetsEqual(i, c, key)) return c;
    }
    return kNone;
  }

  // Entry `from` repeats the key of entry `into`: its value wins, in the
  // earlier position.
  void Merge(uint32_t into, uint32_t from) {
    Storage& a = md_.storage_[into];
    const Storage& b = md_.storage_[from];
    a.path = b.path;
    a.offset = b.offset;
    a.length = b.length;
    a.transforms = b.transforms;
    dead_[from] = 1;
    any_dead_ = true;
  }

  // Chunks that share offsets with an earlier chunk share its entry.
  void ShareRepresentativeEntries() {
    for (size_t i = 0; i < per_.size(); ++i) {
      if (per_[i].rep.empty()) continue;
      const auto& it = md_.items_[i];
      for (uint32_t j = 0; j < it.num_chunks; ++j) {
        md_.chunk_storage_[it.first_chunk + j] =
            md_.chunk_storage_[it.first_chunk + per_[i].rep[j]];
      }
    }
  }

  // Drops merged duplicates, keeping the order; renumbers the references.
  void DropMerged() {
    std::vector<uint32_t> remap(md_.storage_.size(), kNone);
    size_t w = 0;
    for (size_t k = 0; k < md_.storage_.size(); ++k) {
      if (dead_[k]) continue;
      remap[k] = static_cast<uint32_t>(w);
      md_.storage_[w++] = md_.storage_[k];
    }
    md_.storage_.resize(w);
    for (uint32_t& s : md_.chunk_storage_) {
      if (s != kNone) s = remap[s];
    }
    for (auto& it : md_.items_) {
      if (it.bytes_storage != kNone) it.bytes_storage = remap[it.bytes_storage];
    }
  }

  CompactMetadata& md_;
  const std::vector<int64_t>& key_ints_;  // storage key offsets
  const std::vector<int64_t>& hints_;     // per storage entry
  std::vector<PerItem> per_;              // per item
  // Orphans by (fingerprint of the offsets ^ has_offset, fqn).
  absl::flat_hash_map<std::pair<uint64_t, uint32_t>, std::vector<uint32_t>>
      orphans_;
  std::vector<uint8_t> dead_;  // per entry: merged into an earlier one
  bool any_dead_ = false;
};

// Resolves every storage entry to the chunk or bytes item its key names and
// merges duplicate keys (first position, last value).
void CompactMetadataBuilder::Match() { Matcher(this).Run(); }

CompactMetadata CompactMetadataBuilder::Finish() && {
  CompactMetadata& md = md_;
  uint64_t chunks = 0;
  md.num_tensors_ = 0;
  for (auto& it : md.items_) {
    it.first_chunk = chunks;
    if (it.tensor) {
      chunks += it.num_chunks;
      md.num_tensors_++;
    } else {
      it.num_chunks = 0;
    }
  }
  md.chunk_storage_.assign(chunks, CompactMetadata::kNone);
  Match();
  // Key offsets: a matched key equals its chunk's offsets and points there;
  // orphans' keys move into ints_.
  for (auto& s : md.storage_) {
    if (s.item != CompactMetadata::kNone && s.has_offset) {
      s.key_pos = md.ChunkAt(s.item, s.chunk).pos;
    } else {
      const uint64_t pos = md.ints_.size();
      md.ints_.insert(md.ints_.end(), key_ints_.begin() + s.key_pos,
                      key_ints_.begin() + s.key_pos + s.key_ndim);
      s.key_pos = pos;
    }
  }
  std::vector<int64_t>().swap(key_ints_);
  std::vector<int64_t>().swap(hints_);
  md.lazy_ = std::make_unique<CompactMetadata::Lazy>(md.items_.size());
  return std::move(md);
}

}  // namespace ckptd::format
