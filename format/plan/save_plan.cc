// Copyright 2026 The ckptd Authors.
#include "format/plan/save_plan.h"

#include <algorithm>
#include <atomic>
#include <numeric>
#include <queue>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "common/parallel.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "format/metadata/compact_metadata.h"

namespace ckptd::format {

uint64_t ItemDesc::DedupWeight() const {
  if (type == Type::kBytes) return 1;
  uint64_t n = 1;
  for (int64_t s : chunk_sizes) n *= static_cast<uint64_t>(s);
  return n * ElementSize(dtype);
}

StorageKey ItemDesc::Key() const {
  StorageKey k;
  k.fqn = fqn;
  k.has_offset = type == Type::kTensor;
  if (k.has_offset) k.offset = chunk_offsets;
  return k;
}

std::string DescribeBox(absl::Span<const int64_t> offsets,
                        absl::Span<const int64_t> sizes) {
  std::string out = "[";
  for (size_t d = 0; d < offsets.size(); ++d) {
    if (d) out += ", ";
    const int64_t size = d < sizes.size() ? sizes[d] : 0;
    out += fmt::format("{}:{}", offsets[d], offsets[d] + size);
  }
  return out + "]";
}

namespace {

// Folds the count and the values of `values` into the hash `h`: the mix of
// both item hashes below.
uint64_t MixInts(uint64_t h, absl::Span<const int64_t> values) {
  h ^= values.size();
  for (int64_t v : values) {
    h = (h ^ static_cast<uint64_t>(v)) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
  }
  return h;
}

// A 64-bit fingerprint of the chunk part of an item's key (its offsets;
// bytes items have none). Dedup looks items up by fingerprint in a small
// per-tensor map and confirms a hit by comparing the offsets exactly.
uint64_t OffsetsFingerprint(const ItemDesc& it) {
  return MixInts(it.type == ItemDesc::Type::kBytes ? 0x51ed270b27c0f1a5ull
                                                   : 0x2545f4914f6cdd1dull,
                 it.chunk_offsets);
}

bool SameKeyWithinFqn(const ItemDesc& a, const ItemDesc& b) {
  return a.type == b.type && a.chunk_offsets == b.chunk_offsets;
}

absl::Status CheckItem(const ItemDesc& it, int rank,
                       const PlanOptions& options) {
  if (it.fqn.empty()) {
    return absl::InvalidArgumentError(
        fmt::format("rank {}: item with an empty fqn", rank));
  }
  if (it.type == ItemDesc::Type::kBytes) return absl::OkStatus();
  const size_t nd = it.global_shape.size();
  if (nd > static_cast<size_t>(options.max_ndim)) {
    return absl::InvalidArgumentError(
        fmt::format("{} (rank {}): {} dimensions, more than the limit of {}",
                    it.fqn, rank, nd, options.max_ndim));
  }
  if (it.chunk_offsets.size() != nd || it.chunk_sizes.size() != nd) {
    return absl::InvalidArgumentError(fmt::format(
        "{} (rank {}): global shape has {} dimensions but chunk offsets "
        "have {} and chunk sizes {}",
        it.fqn, rank, nd, it.chunk_offsets.size(), it.chunk_sizes.size()));
  }
  for (size_t d = 0; d < nd; ++d) {
    if (it.global_shape[d] < 0 || it.chunk_offsets[d] < 0 ||
        it.chunk_sizes[d] < 0) {
      return absl::InvalidArgumentError(fmt::format(
          "{} (rank {}): negative extent in shape or chunk {}", it.fqn, rank,
          DescribeBox(it.chunk_offsets, it.chunk_sizes)));
    }
  }
  return absl::OkStatus();
}

// A hash of what every item of one tensor must share: type, dtype and
// global shape.
uint64_t DescHash(const ItemDesc& it) {
  return MixInts(0x51ed270b27c0f1a5ull ^ (static_cast<uint64_t>(it.type) << 8) ^
                     static_cast<uint64_t>(it.dtype),
                 it.global_shape);
}

bool SameTensorDesc(const ItemDesc& a, const ItemDesc& b) {
  return a.type == b.type && a.dtype == b.dtype &&
         a.global_shape == b.global_shape && a.chunk_sizes == b.chunk_sizes;
}

// One tensor's chunk list as ValidateChunks reads it: offsets(c) and
// sizes(c) give chunk c's box as spans.
template <typename Offsets, typename Sizes>
struct ChunkList {
  std::string_view fqn;
  absl::Span<const int64_t> global_shape;
  size_t n_chunks;
  Offsets offsets;
  Sizes sizes;
};

// Checks that every chunk has the tensor's dimensions and lies in bounds;
// adds their volumes up in *covered and lists the non-empty ones.
template <typename List>
absl::Status CheckChunkBounds(const List& l, unsigned __int128* covered,
                              std::vector<size_t>* nonempty) {
  const size_t nd = l.global_shape.size();
  for (size_t c = 0; c < l.n_chunks; ++c) {
    const absl::Span<const int64_t> off = l.offsets(c), size = l.sizes(c);
    if (off.size() != nd || size.size() != nd) {
      return absl::InvalidArgumentError(
          fmt::format("{}: chunk {} has {} dimensions, the tensor {}", l.fqn,
                      DescribeBox(off, size), off.size(), nd));
    }
    unsigned __int128 vol = 1;
    for (size_t d = 0; d < nd; ++d) {
      if (off[d] < 0 || size[d] < 0 || off[d] > l.global_shape[d] ||
          size[d] > l.global_shape[d] - off[d]) {
        return absl::InvalidArgumentError(fmt::format(
            "{}: chunk {} is out of bounds of shape {}", l.fqn,
            DescribeBox(off, size),
            DescribeBox(std::vector<int64_t>(nd, 0), l.global_shape)));
      }
      vol *= static_cast<uint64_t>(size[d]);
    }
    *covered += vol;
    if (vol > 0) nonempty->push_back(c);
  }
  return absl::OkStatus();
}

// The dimension along which the chunks `nonempty` have the most distinct
// starts (the first such one): the overlap sweep's.
template <typename List>
size_t SweepDimension(const List& l, absl::Span<const size_t> nonempty) {
  size_t sweep = 0, best = 0;
  std::vector<int64_t> starts(nonempty.size());
  for (size_t d = 0; d < l.global_shape.size(); ++d) {
    for (size_t k = 0; k < nonempty.size(); ++k) {
      starts[k] = l.offsets(nonempty[k])[d];
    }
    // Already sorted and distinct (row bands in order): nothing to sort.
    bool increasing = true;
    for (size_t k = 1; k < starts.size() && increasing; ++k) {
      increasing = starts[k] > starts[k - 1];
    }
    if (!increasing) std::sort(starts.begin(), starts.end());
    const size_t distinct =
        increasing ? starts.size()
                   : std::unique(starts.begin(), starts.end()) - starts.begin();
    if (distinct > best) best = distinct, sweep = d;
    if (best == nonempty.size()) break;  // cannot do better
  }
  return sweep;
}

// Overlap check of the chunks `nonempty` (at least two, of a tensor of at
// least one dimension): sweep along the dimension with the most distinct
// chunk starts, keeping the chunks whose interval is still open in a heap
// keyed by their end. For one-dimensional shardings the open set stays tiny,
// which makes the whole check O(n log n). Reorders `nonempty`.
template <typename List>
absl::Status CheckNoOverlap(const List& l, std::vector<size_t>& nonempty) {
  const size_t nd = l.global_shape.size();
  auto overlap = [&](size_t a, size_t b) {
    const auto ao = l.offsets(a), as = l.sizes(a), bo = l.offsets(b),
               bs = l.sizes(b);
    for (size_t d = 0; d < nd; ++d) {
      if (!(ao[d] < bo[d] + bs[d] && bo[d] < ao[d] + as[d])) return false;
    }
    return true;
  };
  const size_t sweep = SweepDimension(l, nonempty);
  auto starts_before = [&](size_t a, size_t b) {
    return l.offsets(a)[sweep] < l.offsets(b)[sweep];
  };
  // Row bands in rank order are sorted already (stable_sort would leave
  // them as they are, but allocates and merges).
  if (!std::is_sorted(nonempty.begin(), nonempty.end(), starts_before)) {
    std::stable_sort(nonempty.begin(), nonempty.end(), starts_before);
  }
  auto end_of = [&](size_t c) {
    return l.offsets(c)[sweep] + l.sizes(c)[sweep];
  };
  auto later_end = [&](size_t a, size_t b) { return end_of(a) > end_of(b); };
  std::vector<size_t> open;  // min-heap on end
  for (size_t c : nonempty) {
    const int64_t start = l.offsets(c)[sweep];
    while (!open.empty() && end_of(open.front()) <= start) {
      std::pop_heap(open.begin(), open.end(), later_end);
      open.pop_back();
    }
    for (size_t o : open) {
      if (overlap(c, o)) {
        return absl::InvalidArgumentError(
            fmt::format("{}: chunk {} overlaps chunk {}", l.fqn,
                        DescribeBox(l.offsets(c), l.sizes(c)),
                        DescribeBox(l.offsets(o), l.sizes(o))));
      }
    }
    open.push_back(c);
    std::push_heap(open.begin(), open.end(), later_end);
  }
  return absl::OkStatus();
}

// ValidateChunks over any chunk list: bounds, then overlaps, then coverage.
template <typename Offsets, typename Sizes>
absl::Status ValidateChunksImpl(std::string_view fqn,
                                absl::Span<const int64_t> global_shape,
                                size_t n_chunks, Offsets offsets, Sizes sizes,
                                bool require_full_coverage) {
  const size_t nd = global_shape.size();
  if (n_chunks == 0) {
    return absl::InvalidArgumentError(
        fmt::format("{}: tensor has no chunks", fqn));
  }
  const ChunkList<Offsets, Sizes> list{fqn, global_shape, n_chunks, offsets,
                                       sizes};
  unsigned __int128 total = 1;
  for (int64_t s : global_shape) total *= static_cast<uint64_t>(s);
  unsigned __int128 covered = 0;
  std::vector<size_t> nonempty;
  nonempty.reserve(n_chunks);
  RETURN_IF_ERROR(CheckChunkBounds(list, &covered, &nonempty));
  if (nd == 0 && n_chunks > 1) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: a 0-d tensor has {} chunks (they overlap)", fqn, n_chunks));
  }
  if (nd > 0 && nonempty.size() > 1) {
    RETURN_IF_ERROR(CheckNoOverlap(list, nonempty));
  }
  if (require_full_coverage && covered != total) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: chunks cover {} of the {} elements of shape {}", fqn,
        static_cast<uint64_t>(covered), static_cast<uint64_t>(total),
        DescribeBox(std::vector<int64_t>(nd, 0), global_shape)));
  }
  return absl::OkStatus();
}

// A replicated item: the ranks holding it, in rank order, and its index in
// each of them.
struct Distinct {
  absl::InlinedVector<int32_t, 2> holders;
  absl::InlinedVector<uint32_t, 2> indices;  // item index in each holder
};

// An item in its fqn's bucket of the dedup: its offsets' fingerprint and
// where it is.
struct Entry {
  uint64_t fp;
  int32_t rank;
  uint32_t index;
};

// SavePlanner::item_distinct_: kUnique, or kReplicated | the Distinct record.
constexpr uint32_t kUnique = 0xffffffffu;
constexpr uint32_t kReplicated = 0x80000000u;

// PlanSave's passes, in the order Run makes them. The per-item arrays are
// indexed [rank][item index]; each pass fills what the later ones read.
class SavePlanner {
 public:
  SavePlanner(absl::Span<const std::vector<ItemDesc>> ranks,
              const PlanOptions& options)
      : ranks_(ranks), options_(options) {}

  absl::StatusOr<SavePlan> Run();

 private:
  // files_per_rank at least 1 and at most max_items items in all.
  absl::Status CheckLimits();
  // One pass over every item: checks it, interns its fqn and fills the
  // flat per-item arrays.
  absl::Status IndexItems();
  // 1. Dedup: classes of equal keys; fills item_distinct_ and distinct_.
  absl::Status Dedup();
  // The items bucketed by fqn, in rank order; fills bucket_start_.
  std::vector<Entry> BucketByFqn();
  // Splits a run of equal fingerprints of one fqn into classes of equal
  // keys and records the classes of two or more as replicated items.
  absl::Status ClassifyRun(std::vector<Entry>::iterator run,
                           std::vector<Entry>::iterator run_end);
  // The writer of each distinct item; fills survivors_.
  void ChooseWriters();
  // 2. The global plan's items and its state_dict_metadata skeleton.
  absl::Status BuildMetadata(SavePlan* plan);
  // Adds surviving item i of rank r to the plan and its tensor's chunks.
  absl::Status AddSurvivor(size_t r, uint32_t i, SavePlan* plan);
  // 3. Every tensor's chunks in bounds, disjoint and (if asked) covering.
  absl::Status ValidateTensors(const SavePlan& plan) const;
  // planner_data: the first (lowest-rank) path seen for each fqn.
  void AddPlannerData(SavePlan* plan) const;
  // 4. Files: __{r}_{k}.distcp; bytes items first, then tensors.
  void AssignFiles(SavePlan* plan) const;
  // The files of rank r, whose survivors are plan->items[begin, end).
  void AssignRankFiles(size_t r, size_t begin, size_t end,
                       SavePlan* plan) const;

  const absl::Span<const std::vector<ItemDesc>> ranks_;
  const PlanOptions& options_;
  uint64_t n_items_ = 0;
  // Interned fqns: the id of each, and the first item seen with each
  // (whose path planner_data records).
  absl::flat_hash_map<std::string_view, uint32_t> fqn_ids_;
  std::vector<const ItemDesc*> fqn_first_;
  // Per item: fqn id, dedup weight, DescHash and OffsetsFingerprint.
  std::vector<std::vector<uint32_t>> item_fqn_;
  std::vector<std::vector<uint64_t>> item_weight_;
  std::vector<std::vector<uint64_t>> item_desc_hash_;
  std::vector<std::vector<uint64_t>> item_fp_;
  // Fqn f's items are [bucket_start_[f], bucket_start_[f + 1]) of the
  // dedup's buckets.
  std::vector<size_t> bucket_start_;
  std::vector<Distinct> distinct_;
  std::vector<std::vector<uint32_t>> item_distinct_;
  // survivors_[r] = item indices of rank r that it writes, in its order.
  std::vector<std::vector<uint32_t>> survivors_;
  size_t n_survivors_ = 0;
  // The state_dict_metadata index of each fqn (-1: none), and the DescHash
  // of each tensor's first item.
  std::vector<int64_t> sdm_of_fqn_;
  std::vector<uint64_t> desc_of_sdm_;
};

absl::StatusOr<SavePlan> SavePlanner::Run() {
  RETURN_IF_ERROR(CheckLimits());
  RETURN_IF_ERROR(IndexItems());
  RETURN_IF_ERROR(Dedup());
  ChooseWriters();
  SavePlan plan;
  RETURN_IF_ERROR(BuildMetadata(&plan));
  RETURN_IF_ERROR(ValidateTensors(plan));
  AddPlannerData(&plan);
  AssignFiles(&plan);
  return plan;
}

absl::Status SavePlanner::CheckLimits() {
  if (options_.files_per_rank < 1) {
    return absl::InvalidArgumentError("files_per_rank must be at least 1");
  }
  for (const auto& r : ranks_) n_items_ += r.size();
  if (n_items_ > options_.max_items) {
    return absl::ResourceExhaustedError(
        fmt::format("{} items in the save, more than the limit of {}", n_items_,
                    options_.max_items));
  }
  return absl::OkStatus();
}

// Every later per-item lookup is an index, not a string hash, and the later
// passes find what they need in flat arrays, without coming back to the
// ItemDescs' heap blocks: the dedup weight and a hash of (type, dtype,
// global shape) that items of one tensor must share.
absl::Status SavePlanner::IndexItems() {
  item_fqn_.resize(ranks_.size());
  item_weight_.resize(ranks_.size());
  item_desc_hash_.resize(ranks_.size());
  item_fp_.resize(ranks_.size());
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const size_t n = ranks_[r].size();
    item_fqn_[r].resize(n);
    item_weight_[r].resize(n);
    item_desc_hash_[r].resize(n);
    item_fp_[r].resize(n);
    // Ranks usually hold the same fqns in the same order: try the previous
    // rank's fqn at this position before hashing.
    const std::vector<uint32_t>* prev = r > 0 ? &item_fqn_[r - 1] : nullptr;
    for (size_t i = 0; i < n; ++i) {
      const ItemDesc& it = ranks_[r][i];
      RETURN_IF_ERROR(CheckItem(it, static_cast<int>(r), options_));
      uint32_t id;
      if (prev != nullptr && i < prev->size() &&
          fqn_first_[(*prev)[i]]->fqn == it.fqn) {
        id = (*prev)[i];
      } else {
        auto [pos, inserted] = fqn_ids_.try_emplace(it.fqn, fqn_first_.size());
        if (inserted) fqn_first_.push_back(&it);
        id = pos->second;
      }
      item_fqn_[r][i] = id;
      item_weight_[r][i] = it.DedupWeight();
      item_desc_hash_[r][i] = DescHash(it);
      item_fp_[r][i] = OffsetsFingerprint(it);
    }
  }
  return absl::OkStatus();
}

// Dedup (dcp-format.md §4.3) groups equal keys. It works tensor by tensor
// (cache-friendly): the items bucketed by fqn in rank order, each bucket
// sorted by (offsets' fingerprint, rank), and runs of equal fingerprints
// split into exact-equality classes. Each class of two or more is a
// replicated item whose holders are in rank order; items alone in their
// class (the FSDP shards: nearly all) get no record.
absl::Status SavePlanner::Dedup() {
  std::vector<Entry> entries = BucketByFqn();
  item_distinct_.resize(ranks_.size());
  for (size_t r = 0; r < ranks_.size(); ++r) {
    item_distinct_[r].assign(ranks_[r].size(), kUnique);
  }
  for (size_t f = 0; f < fqn_first_.size(); ++f) {
    auto begin = entries.begin() + bucket_start_[f],
         end = entries.begin() + bucket_start_[f + 1];
    std::sort(begin, end, [](const Entry& a, const Entry& b) {
      return a.fp != b.fp ? a.fp < b.fp : a.rank < b.rank;
    });
    for (auto run = begin; run != end;) {
      auto run_end = run + 1;
      while (run_end != end && run_end->fp == run->fp) ++run_end;
      // An item alone in its run is unique.
      if (run_end - run > 1) RETURN_IF_ERROR(ClassifyRun(run, run_end));
      run = run_end;
    }
  }
  item_fp_.clear();
  return absl::OkStatus();
}

std::vector<Entry> SavePlanner::BucketByFqn() {
  bucket_start_.assign(fqn_first_.size() + 1, 0);
  for (size_t r = 0; r < ranks_.size(); ++r) {
    for (uint32_t f : item_fqn_[r]) bucket_start_[f + 1]++;
  }
  for (size_t f = 0; f < fqn_first_.size(); ++f) {
    bucket_start_[f + 1] += bucket_start_[f];
  }
  std::vector<Entry> entries(n_items_);
  std::vector<size_t> fill(bucket_start_.begin(), bucket_start_.end() - 1);
  for (size_t r = 0; r < ranks_.size(); ++r) {
    for (size_t i = 0; i < ranks_[r].size(); ++i) {
      entries[fill[item_fqn_[r][i]]++] = {
          item_fp_[r][i], static_cast<int32_t>(r), static_cast<uint32_t>(i)};
    }
  }
  return entries;
}

absl::Status SavePlanner::ClassifyRun(std::vector<Entry>::iterator run,
                                      std::vector<Entry>::iterator run_end) {
  const size_t first_class = distinct_.size();
  for (auto e = run; e != run_end; ++e) {
    const ItemDesc& it = ranks_[e->rank][e->index];
    size_t d = first_class;
    while (d < distinct_.size() &&
           !SameKeyWithinFqn(
               ranks_[distinct_[d].holders[0]][distinct_[d].indices[0]], it)) {
      ++d;
    }
    if (d == distinct_.size()) {
      distinct_.push_back({{e->rank}, {e->index}});
      continue;
    }
    Distinct& dd = distinct_[d];
    const ItemDesc& first = ranks_[dd.holders[0]][dd.indices[0]];
    if (dd.holders.back() == e->rank) {
      return absl::InvalidArgumentError(fmt::format(
          "rank {}: item {} appears twice", e->rank, DescribeKey(it.Key())));
    }
    if (!SameTensorDesc(first, it)) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: ranks {} and {} save it under the same key with different "
          "dtype or shape ({} {} vs {} {})",
          it.fqn, dd.holders[0], e->rank, DTypeName(first.dtype),
          DescribeBox(first.chunk_offsets, first.chunk_sizes),
          DTypeName(it.dtype), DescribeBox(it.chunk_offsets, it.chunk_sizes)));
    }
    dd.holders.push_back(e->rank);
    dd.indices.push_back(e->index);
  }
  // Classes of one (a fingerprint collision) stay unique.
  for (size_t d = first_class; d < distinct_.size(); ++d) {
    if (distinct_[d].holders.size() < 2) continue;
    if (d >= kReplicated) {
      return absl::ResourceExhaustedError("too many replicated items");
    }
    for (size_t h = 0; h < distinct_[d].holders.size(); ++h) {
      item_distinct_[distinct_[d].holders[h]][distinct_[d].indices[h]] =
          kReplicated | static_cast<uint32_t>(d);
    }
  }
  return absl::OkStatus();
}

// The writer of a distinct item is its least-loaded holder (ties to the
// lowest rank), or its lowest rank with dedup_save_to_lowest_rank.
void SavePlanner::ChooseWriters() {
  std::vector<uint64_t> load(ranks_.size(), 0);
  survivors_.resize(ranks_.size());
  for (size_t r0 = 0; r0 < ranks_.size(); ++r0) {
    survivors_[r0].reserve(ranks_[r0].size());
    for (size_t i0 = 0; i0 < ranks_[r0].size(); ++i0) {
      const uint32_t id = item_distinct_[r0][i0];
      if (id == kUnique) {
        // Held by this rank alone: it writes it.
        load[r0] += item_weight_[r0][i0];
        survivors_[r0].push_back(static_cast<uint32_t>(i0));
        continue;
      }
      const Distinct& d = distinct_[id & ~kReplicated];
      // Visit each distinct item once, at its first appearance.
      if (d.holders[0] != static_cast<int32_t>(r0) || d.indices[0] != i0) {
        continue;
      }
      size_t best = 0;
      if (!options_.dedup_save_to_lowest_rank) {
        for (size_t h = 1; h < d.holders.size(); ++h) {
          if (load[d.holders[h]] < load[d.holders[best]]) best = h;
        }
      }
      const int32_t r = d.holders[best];
      load[r] += item_weight_[r][d.indices[best]];
      survivors_[r].push_back(d.indices[best]);
    }
  }
  for (auto& s : survivors_) {
    if (!std::is_sorted(s.begin(), s.end())) std::sort(s.begin(), s.end());
    n_survivors_ += s.size();
  }
}

// The global plan and the Metadata skeleton (§4.4): rank order, item order.
absl::Status SavePlanner::BuildMetadata(SavePlan* plan) {
  plan->items.reserve(n_survivors_);
  plan->chunk_index.reserve(n_survivors_);
  sdm_of_fqn_.assign(fqn_first_.size(), -1);
  for (size_t r = 0; r < ranks_.size(); ++r) {
    for (uint32_t i : survivors_[r]) RETURN_IF_ERROR(AddSurvivor(r, i, plan));
  }
  return absl::OkStatus();
}

absl::Status SavePlanner::AddSurvivor(size_t r, uint32_t i, SavePlan* plan) {
  auto& sdm = plan->metadata.state_dict_metadata;
  const ItemDesc& it = ranks_[r][i];
  plan->items.push_back({static_cast<int>(r), i, 0});
  int64_t& sdm_index = sdm_of_fqn_[item_fqn_[r][i]];
  const bool inserted = sdm_index < 0;
  if (inserted) sdm_index = static_cast<int64_t>(sdm.size());
  if (it.type == ItemDesc::Type::kBytes) {
    if (!inserted) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: saved both as a bytes item and as a tensor (or twice as bytes)",
          it.fqn));
    }
    sdm.emplace_back(it.fqn, BytesStorageMetadata{});
    desc_of_sdm_.resize(sdm.size(), 0);
    plan->chunk_index.push_back(-1);
    return absl::OkStatus();
  }
  if (inserted) {
    TensorStorageMetadata tmd;
    tmd.properties.dtype = it.dtype;
    tmd.size = it.global_shape;
    const uint32_t f = item_fqn_[r][i];
    tmd.chunks.reserve(bucket_start_[f + 1] - bucket_start_[f]);
    sdm.emplace_back(it.fqn, std::move(tmd));
    desc_of_sdm_.resize(sdm.size(), 0);
    desc_of_sdm_[sdm_index] = item_desc_hash_[r][i];
  }
  auto* tmd = std::get_if<TensorStorageMetadata>(&sdm[sdm_index].second);
  if (tmd == nullptr) {
    return absl::InvalidArgumentError(
        fmt::format("{}: saved both as a bytes item and as a tensor", it.fqn));
  }
  // (dtype, shape) agree with the tensor's first item: by hash, and in
  // full where the hashes differ.
  if (item_desc_hash_[r][i] != desc_of_sdm_[sdm_index] &&
      (tmd->properties.dtype != it.dtype || tmd->size != it.global_shape)) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: rank {} saves a chunk of a {} tensor of shape {} but an earlier "
        "chunk declared {} {}",
        it.fqn, r, DTypeName(it.dtype),
        DescribeBox(std::vector<int64_t>(it.global_shape.size(), 0),
                    it.global_shape),
        DTypeName(tmd->properties.dtype),
        DescribeBox(std::vector<int64_t>(tmd->size.size(), 0), tmd->size)));
  }
  plan->chunk_index.push_back(static_cast<int64_t>(tmd->chunks.size()));
  // Built in place (a temporary would be copied back with wide loads
  // over the narrow stores that just wrote it).
  ChunkStorageMetadata& chunk = tmd->chunks.emplace_back();
  chunk.offsets.assign(it.chunk_offsets.begin(), it.chunk_offsets.end());
  chunk.sizes.assign(it.chunk_sizes.begin(), it.chunk_sizes.end());
  return absl::OkStatus();
}

// Tensor by tensor, in blocks of kValidateBlock; a plan of at least
// kParallelChunks chunks (2 M at 1,024 ranks × 2,000 tensors: a third of
// PlanSave) shares the blocks out among up to kValidateThreads threads,
// the caller's included. The error reported is the first in
// state_dict_metadata order, as one thread would find it: a block is
// checked in order up to its first error, and no block before a failed one
// is skipped.
absl::Status SavePlanner::ValidateTensors(const SavePlan& plan) const {
  constexpr size_t kValidateBlock = 64;
  constexpr size_t kParallelChunks = size_t{1} << 18;
  constexpr unsigned kValidateThreads = 4;
  const auto& sdm = plan.metadata.state_dict_metadata;
  auto validate_block = [&](size_t b) {
    const size_t end = std::min(sdm.size(), (b + 1) * kValidateBlock);
    for (size_t k = b * kValidateBlock; k < end; ++k) {
      if (const auto* t = std::get_if<TensorStorageMetadata>(&sdm[k].second)) {
        RETURN_IF_ERROR(ValidateChunks(sdm[k].first, t->size, t->chunks,
                                       options_.require_full_coverage));
      }
    }
    return absl::OkStatus();
  };
  const size_t blocks = (sdm.size() + kValidateBlock - 1) / kValidateBlock;
  const int threads = n_survivors_ < kParallelChunks
                          ? 1
                          : static_cast<int>(std::min<size_t>(
                                {std::clamp(std::thread::hardware_concurrency(),
                                            1u, kValidateThreads),
                                 blocks}));
  if (threads <= 1) {
    for (size_t b = 0; b < blocks; ++b) RETURN_IF_ERROR(validate_block(b));
    return absl::OkStatus();
  }
  std::vector<absl::Status> errors(blocks);
  std::atomic<size_t> next{0}, first_bad{blocks};
  RunOnThreads(threads, [&] {
    for (size_t b; (b = next.fetch_add(1)) < blocks;) {
      if (b > first_bad.load()) continue;  // a block before it failed
      errors[b] = validate_block(b);
      if (errors[b].ok()) continue;
      size_t seen = first_bad.load();
      while (b < seen && !first_bad.compare_exchange_weak(seen, b)) {
      }
    }
  });
  const size_t bad = first_bad.load();
  return bad < blocks ? errors[bad] : absl::OkStatus();
}

void SavePlanner::AddPlannerData(SavePlan* plan) const {
  const auto& sdm = plan->metadata.state_dict_metadata;
  auto& pd = plan->metadata.planner_data.emplace();
  pd.reserve(sdm.size());
  std::vector<uint32_t> fqn_of_sdm(sdm.size());
  for (size_t f = 0; f < fqn_first_.size(); ++f) {
    if (sdm_of_fqn_[f] >= 0) {
      fqn_of_sdm[sdm_of_fqn_[f]] = static_cast<uint32_t>(f);
    }
  }
  for (size_t k = 0; k < sdm.size(); ++k) {
    const ItemDesc* it = fqn_first_[fqn_of_sdm[k]];
    std::vector<PathElement> path = it->path;
    if (path.empty()) path.emplace_back(it->fqn);
    pd.emplace_back(it->fqn, std::move(path));
  }
}

// dcp-format.md §1, §2.
void SavePlanner::AssignFiles(SavePlan* plan) const {
  size_t next = 0;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const size_t begin = next;
    next = begin + survivors_[r].size();
    AssignRankFiles(r, begin, next, plan);
  }
}

// As FileSystemWriter buckets them: bytes items round-robin, tensors
// largest-first to the lightest file.
void SavePlanner::AssignRankFiles(size_t r, size_t begin, size_t end,
                                  SavePlan* plan) const {
  const int T = options_.files_per_rank;
  std::vector<std::vector<size_t>> bytes_b(T), tensor_b(T);
  std::vector<size_t> tensors;
  size_t n_bytes = 0;
  for (size_t p = begin; p < end; ++p) {
    if (plan->chunk_index[p] < 0) {  // a bytes item
      bytes_b[n_bytes++ % T].push_back(p);
    } else {
      tensors.push_back(p);
    }
  }
  if (T == 1) {
    tensor_b[0] = tensors;
  } else {
    const std::vector<uint64_t>& weight = item_weight_[r];
    std::stable_sort(tensors.begin(), tensors.end(), [&](size_t a, size_t b) {
      return weight[plan->items[a].item_index] >
             weight[plan->items[b].item_index];
    });
    std::vector<uint64_t> bucket_bytes(T, 0);
    for (size_t p : tensors) {
      const int k = static_cast<int>(
          std::min_element(bucket_bytes.begin(), bucket_bytes.end()) -
          bucket_bytes.begin());
      bucket_bytes[k] += weight[plan->items[p].item_index];
      tensor_b[k].push_back(p);
    }
  }
  for (int k = 0; k < T; ++k) {
    PlannedFile f;
    f.relative_path = fmt::format("__{}_{}.distcp", r, k);
    f.rank = static_cast<int>(r);
    f.items = std::move(bytes_b[k]);
    f.items.insert(f.items.end(), tensor_b[k].begin(), tensor_b[k].end());
    for (size_t p : f.items) plan->items[p].file_index = k;
    plan->files.push_back(std::move(f));
  }
}

}  // namespace

absl::Status ValidateChunks(std::string_view fqn,
                            absl::Span<const int64_t> global_shape,
                            absl::Span<const ChunkStorageMetadata> chunks,
                            bool require_full_coverage) {
  return ValidateChunksImpl(
      fqn, global_shape, chunks.size(),
      [&](size_t c) { return absl::MakeConstSpan(chunks[c].offsets); },
      [&](size_t c) { return absl::MakeConstSpan(chunks[c].sizes); },
      require_full_coverage);
}

absl::Status ValidateChunks(const CompactMetadata& md, size_t item,
                            bool require_full_coverage) {
  return ValidateChunksImpl(
      md.fqn(item), md.shape(item), md.item(item).num_chunks,
      [&](size_t c) { return md.chunk_offsets(item, c); },
      [&](size_t c) { return md.chunk_sizes(item, c); }, require_full_coverage);
}

absl::StatusOr<SavePlan> PlanSave(absl::Span<const std::vector<ItemDesc>> ranks,
                                  const PlanOptions& options) {
  return SavePlanner(ranks, options).Run();
}

}  // namespace ckptd::format
