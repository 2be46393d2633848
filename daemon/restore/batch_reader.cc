// Copyright 2026 The ckptd Authors.
#include "daemon/restore/batch_reader.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/absl_fmt.h"
#include "daemon/arena/arena_registry.h"
#include "fmt/format.h"
#include "format/checkpoint/checkpoint_reader.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {
namespace {

// Where one member wants one box.
struct Target {
  size_t member;
  size_t box;       // index in the member's request
  char* data;       // in its arena
  uint64_t nbytes;  // numel * element size
};

// Where a box lies in a file the memory tier holds (PlaceInHeld).
struct HeldPlace {
  size_t file;      // index into the batch's held files
  uint64_t offset;  // of the box's bytes in that file
};

// A distinct box: read once (into the group buffer at buffer_offset, or
// into targets[0]), then taken by (or copied to) the others; or, when
// `held`, not read at all: lent in place.
struct UniqueBox {
  format::TensorRequest request;
  std::vector<Target> targets;
  uint64_t buffer_offset = 0;
  std::optional<HeldPlace> held;
};

// Boxes this large or larger whose bytes lie whole in a file the memory
// tier holds are lent in place; below it a box is cheaper to copy than to
// look up (the archive parse of its chunk).
constexpr uint64_t kLendMinBytes = uint64_t{64} << 10;

constexpr uint64_t kBufferAlign = 64;
// Boxes the reader reads directly (format::kDirectReadMinBytes and more,
// whole stored records) get a place in the group buffer whose address
// shares the record's file offset modulo a page, so that direct_io reads
// them straight into it (no page cache, no copy); a box costs at most two
// pages of slack for that.
constexpr uint64_t kPage = 4096;

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

std::string BoxKey(const RestoreBox& b) {
  return absl::StrCat(b.fqn, "\x1f", absl::StrJoin(b.offsets, ","), "\x1f",
                      absl::StrJoin(b.sizes, ","), "\x1f",
                      static_cast<int>(b.dtype));
}

// The member's boxes as reader requests into its arena, checked against the
// checkpoint on their own (PlanReads) so a mistake fails only this member.
absl::StatusOr<std::vector<format::TensorRequest>> MemberRequests(
    const format::CheckpointReader& reader, const GroupMember& m) {
  std::vector<format::TensorRequest> out;
  out.reserve(m.batch.boxes.size());
  for (const RestoreBox& b : m.batch.boxes) {
    absl::StatusOr<absl::Span<char>> span =
        m.arena->map->WritableSlice(b.arena_offset, b.nbytes);
    if (!span.ok()) {
      return absl::Status(
          span.status().code(),
          fmt::format("box of '{}': {}", b.fqn, span.status().message()));
    }
    format::TensorRequest r;
    r.fqn = b.fqn;
    r.offsets = b.offsets;
    r.dest.dtype = b.dtype;
    r.dest.sizes = b.sizes;
    r.dest.data = span->data();
    out.push_back(std::move(r));
  }
  const format::CompactMetadata& md = reader.compact();
  for (const format::TensorRequest& r : out) {
    const std::optional<size_t> i = md.FindItem(r.fqn);
    if (i.has_value() && md.item(*i).tensor &&
        md.item(*i).properties.dtype != r.dest.dtype) {
      return absl::InvalidArgumentError(
          fmt::format("'{}': the checkpoint holds {}, the box asks for {}",
                      r.fqn, format::DTypeName(md.item(*i).properties.dtype),
                      format::DTypeName(r.dest.dtype)));
    }
  }
  absl::StatusOr<std::vector<format::ReadItem>> plan = reader.PlanReads(out);
  if (!plan.ok()) return plan.status();
  return out;
}

// Reads each bytes item the members want once and copies it into their
// slots; returns the payload bytes read.
uint64_t ServeBytesItems(format::CheckpointReader& reader,
                         const GroupBatch& group, bool verify_crc,
                         const Cancellation* cancel,
                         std::vector<absl::StatusOr<RestoreReply>>* results,
                         std::vector<RestoreReply>* replies) {
  uint64_t storage_bytes = 0;
  const size_t n = group.members.size();
  absl::flat_hash_map<std::string, absl::StatusOr<std::string>> payloads;
  for (size_t i = 0; i < n; ++i) {
    const GroupMember& m = group.members[i];
    for (const RestoreBytes& b : m.batch.bytes_items) {
      if (!(*results)[i].ok()) break;
      auto [it, fresh] = payloads.try_emplace(b.fqn, std::string());
      if (fresh && cancel != nullptr && cancel->cancelled()) {
        it->second = cancel->status();
      } else if (fresh) {
        it->second = reader.ReadBytesItem(b.fqn, verify_crc);
        if (it->second.ok()) storage_bytes += it->second->size();
      }
      if (!it->second.ok()) {
        (*results)[i] = OwnStatus(it->second.status());
        break;
      }
      const std::string& raw = *it->second;
      if (raw.size() > b.capacity) {
        (*results)[i] = absl::InvalidArgumentError(
            fmt::format("bytes item '{}' is {} bytes, its slot only {}", b.fqn,
                        raw.size(), b.capacity));
        break;
      }
      absl::StatusOr<absl::Span<char>> span =
          m.arena->map->WritableSlice(b.arena_offset, raw.size());
      if (!span.ok()) {
        (*results)[i] = span.status();
        break;
      }
      std::memcpy(span->data(), raw.data(), raw.size());
      (*replies)[i].bytes_lengths.push_back(raw.size());
      (*replies)[i].copied_bytes += raw.size();
    }
  }
  return storage_bytes;
}

// A group buffer for the batch's distinct boxes (their buffer_offset set),
// when several members take part, all accept one and there is room;
// nullopt otherwise (the boxes then go through the members' arenas).
std::optional<FilledBuffer> BufferFor(
    format::CheckpointReader& reader, const GroupBatch& group,
    const std::vector<absl::StatusOr<RestoreReply>>& results,
    GroupBuffers* buffers, std::vector<UniqueBox>* boxes) {
  if (buffers == nullptr || boxes->empty()) return std::nullopt;
  int taking = 0;
  for (size_t i = 0; i < group.members.size(); ++i) {
    if (!group.members[i].batch.accept_group_buffer) return std::nullopt;
    if (results[i].ok()) ++taking;
  }
  if (taking < 2) return std::nullopt;
  // The buffer's memory starts on a page: a box at `offset` lies at an
  // address congruent to `offset` modulo a page.
  const bool direct = reader.options().direct_io;
  uint64_t size = 0;
  for (UniqueBox& u : *boxes) {
    if (u.held.has_value()) continue;
    const uint64_t n = u.targets[0].nbytes;
    std::optional<uint64_t> file_offset;
    if (direct && n >= format::kDirectReadMinBytes) {
      // An error here (a damaged archive) is the read's to report.
      absl::StatusOr<std::optional<uint64_t>> at =
          reader.WholeRecordOffset(u.request);
      if (at.ok()) file_offset = *at;
    }
    u.buffer_offset = file_offset.has_value()
                          ? AlignUp(size, kPage) + *file_offset % kPage
                          : size;
    size = AlignUp(u.buffer_offset + n, kBufferAlign);
  }
  if (size == 0) return std::nullopt;
  absl::StatusOr<FilledBuffer> b = buffers->Create(size, KeyOf(group));
  if (!b.ok()) {
    spdlog::info("restore of {}: batch {} served through the arenas: {}",
                 group.dir, group.members[0].batch.batch,
                 b.status().ToString());
    return std::nullopt;
  }
  return *std::move(b);
}

// The boxes whose bytes lie in one piece in a file the memory tier holds (a
// saved chunk of an uncompressed little-endian payload, or a part of one the
// client cut along its first dimension; the record's CRC-32 checked once per
// node as for a read), when every member accepts lent memory: their `held`
// set. Returns the files they lie in, each once.
std::vector<std::shared_ptr<const TierFileBytes>> PlaceInHeld(
    const CachedCheckpoint& ckpt, const GroupBatch& group, bool verify_crc,
    std::vector<UniqueBox>* boxes) {
  std::vector<std::shared_ptr<const TierFileBytes>> files;
  if (ckpt.tier_env == nullptr) return files;
  for (const GroupMember& m : group.members) {
    if (!m.batch.accept_held_buffers) return files;
  }
  for (UniqueBox& u : *boxes) {
    if (u.targets[0].nbytes < kLendMinBytes) continue;
    // An error here (a damaged archive, a CRC mismatch) is the read's to
    // report: the box is read as any other. Where the box lies first, its
    // CRC checked only once it is known to lie in a held file (from the
    // tier's piece CRCs): checking a record on storage here would read it
    // whole, and then again for the box.
    absl::StatusOr<std::optional<format::CheckpointReader::RecordSpan>> span =
        ckpt.reader->RecordRange(u.request, /*verify_crc=*/false);
    if (!span.ok() || !span->has_value() || (*span)->big_endian) continue;
    const format::CheckpointReader::RecordSpan& r = **span;
    std::shared_ptr<const TierFileBytes> held = HeldBytesOf(r.file);
    if (held == nullptr || !held->sealed || r.offset > held->size ||
        r.size > held->size - r.offset || r.size != u.targets[0].nbytes) {
      continue;
    }
    if (verify_crc) {
      absl::StatusOr<std::optional<format::CheckpointReader::RecordSpan>>
          checked = ckpt.reader->RecordRange(u.request, /*verify_crc=*/true);
      if (!checked.ok() || !checked->has_value()) continue;
    }
    auto it = std::find(files.begin(), files.end(), held);
    u.held = HeldPlace{static_cast<size_t>(it - files.begin()), r.offset};
    if (it == files.end()) files.push_back(std::move(held));
  }
  return files;
}

// Lends `files` to the members still served that take boxes from them
// (one token per file) and tells each where its boxes lie. Returns the
// bytes lent (each distinct box once).
uint64_t LendHeld(const GroupBatch& group, const std::vector<UniqueBox>& boxes,
                  std::vector<std::shared_ptr<const TierFileBytes>> files,
                  GroupBuffers* buffers, absl::Time now,
                  const std::vector<absl::StatusOr<RestoreReply>>& results,
                  std::vector<RestoreReply>* replies) {
  const size_t n = group.members.size();
  // slot[f][i]: 1 + the index of file f in member i's held_buffers; 0: none.
  std::vector<std::vector<uint32_t>> slot(files.size(),
                                          std::vector<uint32_t>(n, 0));
  for (const UniqueBox& u : boxes) {
    if (!u.held.has_value()) continue;
    for (const Target& t : u.targets) {
      if (results[t.member].ok()) slot[u.held->file][t.member] = 1;
    }
  }
  for (size_t f = 0; f < files.size(); ++f) {
    int fetches = 0;
    for (size_t i = 0; i < n; ++i) fetches += slot[f][i];
    if (fetches == 0) continue;
    const uint64_t size = files[f]->size;
    const int fd = files[f]->fd.get();
    const std::string token = buffers->Lend(
        LentMemory{fd, size, std::move(files[f])}, KeyOf(group), fetches, now);
    for (size_t i = 0; i < n; ++i) {
      if (slot[f][i] == 0) continue;
      std::vector<RestoreReply::Held>& held = (*replies)[i].held_buffers;
      held.push_back({token, size});
      slot[f][i] = static_cast<uint32_t>(held.size());
    }
  }
  uint64_t lent = 0;
  for (const UniqueBox& u : boxes) {
    if (!u.held.has_value()) continue;
    bool served = false;
    for (const Target& t : u.targets) {
      if (!results[t.member].ok()) continue;
      RestoreReply& r = (*replies)[t.member];
      const size_t nboxes = group.members[t.member].batch.boxes.size();
      r.box_buffers.resize(nboxes, 0);
      r.box_buffer_offsets.resize(nboxes, 0);
      r.box_buffers[t.box] = slot[u.held->file][t.member];
      r.box_buffer_offsets[t.box] = u.held->offset;
      r.copied_bytes += t.nbytes;
      served = true;
    }
    if (served) lent += u.targets[0].nbytes;
  }
  return lent;
}

// Tells each member where its boxes are in the group buffer.
void PointAtBuffer(const GroupBatch& group, const std::vector<UniqueBox>& boxes,
                   std::vector<RestoreReply>* replies) {
  for (const UniqueBox& u : boxes) {
    if (u.held.has_value()) continue;
    for (const Target& t : u.targets) {
      RestoreReply& r = (*replies)[t.member];
      r.box_buffer_offsets.resize(group.members[t.member].batch.boxes.size());
      r.box_buffer_offsets[t.box] = u.buffer_offset;
      r.copied_bytes += t.nbytes;
    }
  }
}

// Publishes the filled group buffer for the members served that take boxes
// from it, with its token in their replies; discarded if none does.
void PublishBuffer(const GroupBatch& group, FilledBuffer buffer,
                   GroupBuffers* buffers, absl::Time now,
                   const std::vector<absl::StatusOr<RestoreReply>>& results,
                   std::vector<RestoreReply>* replies) {
  const size_t n = group.members.size();
  std::vector<bool> takes(n, false);
  int fetches = 0;
  for (size_t i = 0; i < n; ++i) {
    takes[i] = results[i].ok() && !(*replies)[i].box_buffer_offsets.empty();
    fetches += takes[i] ? 1 : 0;
  }
  if (fetches == 0) {
    buffers->Discard(std::move(buffer));
    return;
  }
  bool final = true;
  for (const GroupMember& m : group.members) final = final && m.batch.last;
  const uint64_t size = buffer.memory->size();
  const std::string token =
      buffers->Publish(std::move(buffer), KeyOf(group), fetches, final, now);
  for (size_t i = 0; i < n; ++i) {
    if (!takes[i]) continue;
    (*replies)[i].group_buffer_token = token;
    (*replies)[i].group_buffer_size = size;
  }
}

// After the read of the distinct boxes: its error for every member it
// served (the group buffer discarded); else the members pointed at the
// group buffer, or the boxes copied from each first target into the other
// members' arenas.
void TakeRead(const GroupBatch& group, const absl::Status& read,
              std::optional<FilledBuffer>* buffer,
              const std::vector<UniqueBox>& boxes, GroupBuffers* buffers,
              std::vector<absl::StatusOr<RestoreReply>>* results,
              std::vector<RestoreReply>* replies) {
  if (!read.ok()) {
    for (const UniqueBox& u : boxes) {
      if (u.held.has_value()) continue;  // not read
      for (const Target& t : u.targets) {
        (*results)[t.member] = OwnStatus(read);
      }
    }
    if (buffer->has_value()) buffers->Discard(**std::move(buffer));
    buffer->reset();
  } else if (buffer->has_value()) {
    PointAtBuffer(group, boxes, replies);
  } else {
    for (const UniqueBox& u : boxes) {
      if (u.held.has_value()) continue;
      for (const Target& t : u.targets) {
        if (t.data != u.targets[0].data) {
          std::memmove(t.data, u.targets[0].data, t.nbytes);
        }
        (*replies)[t.member].copied_bytes += t.nbytes;
      }
    }
  }
}

// The distinct boxes the members still served want, each with every
// member that wants it; a member whose boxes do not fit its arena or the
// checkpoint gets that error in `results` and no box.
std::vector<UniqueBox> DistinctBoxes(
    const format::CheckpointReader& reader, const GroupBatch& group,
    std::vector<absl::StatusOr<RestoreReply>>* results) {
  std::vector<UniqueBox> boxes;
  absl::flat_hash_map<std::string, size_t> box_index;
  for (size_t i = 0; i < group.members.size(); ++i) {
    if (!(*results)[i].ok()) continue;
    const GroupMember& m = group.members[i];
    absl::StatusOr<std::vector<format::TensorRequest>> reqs =
        MemberRequests(reader, m);
    if (!reqs.ok()) {
      (*results)[i] = reqs.status();
      continue;
    }
    for (size_t j = 0; j < reqs->size(); ++j) {
      const RestoreBox& b = m.batch.boxes[j];
      const Target t{i, j, (*reqs)[j].dest.data, b.nbytes};
      auto [it, fresh] = box_index.try_emplace(BoxKey(b), boxes.size());
      if (fresh) boxes.push_back(UniqueBox{std::move((*reqs)[j]), {}});
      boxes[it->second].targets.push_back(t);
    }
  }
  return boxes;
}

}  // namespace

void ServeGroupBatch(const CachedCheckpoint& ckpt, const GroupBatch& group,
                     GroupBuffers* buffers, absl::Time now,
                     const Cancellation* cancel,
                     std::vector<absl::StatusOr<RestoreReply>>* results) {
  format::CheckpointReader& reader = *ckpt.reader;
  const size_t n = group.members.size();
  std::vector<RestoreReply> replies(n);
  // 1. Each member's boxes, checked; the distinct ones collected.
  std::vector<UniqueBox> boxes = DistinctBoxes(reader, group, results);
  // 2. Boxes that lie whole in memory-held files are lent in place; one
  // read of every other distinct box: into a group buffer, or into its
  // first target.
  bool verify_crc = false;  // skipped only if every member asks to skip
  for (const GroupMember& m : group.members) verify_crc |= m.batch.verify_crc;
  std::vector<std::shared_ptr<const TierFileBytes>> held =
      buffers == nullptr ? std::vector<std::shared_ptr<const TierFileBytes>>()
                         : PlaceInHeld(ckpt, group, verify_crc, &boxes);
  std::optional<FilledBuffer> buffer =
      BufferFor(reader, group, *results, buffers, &boxes);
  std::vector<format::TensorRequest> requests;
  requests.reserve(boxes.size());
  for (const UniqueBox& u : boxes) {
    if (u.held.has_value()) continue;
    requests.push_back(u.request);
    if (buffer.has_value()) {
      requests.back().dest.data = buffer->memory->data() + u.buffer_offset;
    }
  }
  format::ReadStats stats;
  const uint64_t peer_before = ckpt.peer_bytes.load();
  absl::Status read = reader.ReadTensors(requests, &stats, verify_crc, cancel);
  uint64_t storage_bytes = stats.bytes_read;
  // A cancel during the read is the answer of every member still served
  // (also those whose boxes were all lent or whose reads were done).
  if (cancel != nullptr && cancel->cancelled()) {
    read = cancel->status();
    for (auto& r : *results) {
      if (r.ok()) r = cancel->status();
    }
  }
  // 3. Where each member finds its boxes.
  TakeRead(group, read, &buffer, boxes, buffers, results, &replies);
  // 4. Bytes items: each read once. Then the group buffer is published
  // for the members still served.
  storage_bytes +=
      ServeBytesItems(reader, group, verify_crc, cancel, results, &replies);
  uint64_t peer_bytes = ckpt.peer_bytes.load() - peer_before;
  if (buffer.has_value()) {
    PublishBuffer(group, *std::move(buffer), buffers, now, *results, &replies);
  }
  if (!held.empty()) {
    const uint64_t lent = LendHeld(group, boxes, std::move(held), buffers, now,
                                   *results, &replies);
    if (ckpt.tier != nullptr) ckpt.tier->CountLent(lent);
  }
  // 5. Answers. After a rank's last batch the daemon's page mappings of
  // its arena are dropped (the bytes stay in the client's memory); between
  // batches they are kept, so the next batch does not fault them in again
  // (dropping them after every batch made restores 1.7-1.9x slower).
  for (size_t i = 0; i < n; ++i) {
    const GroupMember& m = group.members[i];
    if (m.batch.last || !(*results)[i].ok()) {
      m.arena->map->DropPages(0, m.arena->map->size());
    }
    if (!(*results)[i].ok()) continue;
    // The group's reads are counted once, on its first served member.
    replies[i].storage_bytes = storage_bytes;
    replies[i].peer_bytes = peer_bytes;
    storage_bytes = peer_bytes = 0;
    replies[i].group_ranks = static_cast<int>(n);
    (*results)[i] = std::move(replies[i]);
  }
}

}  // namespace ckptd::daemon
