// Copyright 2026 The ckptd Authors.
#include "daemon/cluster/peer_codec.h"

#include <algorithm>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "common/absl_fmt.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "format/tensor/payload_transform.h"
#include "proto/item_codec.h"

namespace ckptd::daemon {

namespace pb = ::ckptd::v1;

std::string_view TruncateUtf8(std::string_view s, size_t max) {
  if (s.size() <= max) return s;
  size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n);
}

namespace {
bool ValidState(int s) { return s >= 1 && s <= 8; }

// SaveOptions.compression of a zstd level (0: none), as the trainers send.
std::string CompressionOf(int zstd_level) {
  return zstd_level == 0 ? std::string() : fmt::format("zstd:{}", zstd_level);
}

absl::StatusOr<int> ZstdLevelOf(std::string_view compression) {
  if (std::optional<int> level = format::ZstdLevelOfName(compression)) {
    return *level;
  }
  return absl::InvalidArgumentError(fmt::format(
      "plan request: compression '{}' is not \"\" or \"zstd:N\" (N in "
      "1..19)",
      TruncateUtf8(compression, 64)));
}

// One rank's transforms: none, or one list per written item, each a
// transform this daemon knows (format::ParseTransforms).
absl::Status DecodeTransforms(const pb::RankStorage& rs,
                              PrepareCall::Rank& rank) {
  if (rs.transforms_size() == 0) return absl::OkStatus();
  if (rs.transforms_size() != rs.offset_size()) {
    return absl::InvalidArgumentError(
        fmt::format("rank {}: {} transform lists for {} written items",
                    rs.rank(), rs.transforms_size(), rs.offset_size()));
  }
  rank.transforms.reserve(rs.transforms_size());
  for (const pb::ItemTransforms& t : rs.transforms()) {
    std::vector<std::string> d(t.descriptors().begin(), t.descriptors().end());
    if (d.size() > 8) {
      return absl::InvalidArgumentError(fmt::format(
          "rank {}: an item names {} transforms", rs.rank(), d.size()));
    }
    if (absl::Status s = format::ParseTransforms(d).status(); !s.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("rank {}: {}", rs.rank(), s.message()));
    }
    rank.transforms.push_back(std::move(d));
  }
  return absl::OkStatus();
}
}  // namespace

void ToProto(const PeerCallId& id, pb::PeerCall* out) {
  out->set_checkpoint_id(id.checkpoint_id);
  out->set_job(id.job);
  out->set_node(id.node);
  out->set_attempt(id.attempt);
  out->set_node_name(id.node_name);
}

absl::StatusOr<PeerCallId> FromProto(const pb::PeerCall& in) {
  if (in.checkpoint_id().size() > 4096 || in.job().size() > 4096 ||
      in.node_name().size() > 1024) {
    return absl::InvalidArgumentError(
        "peer call: checkpoint_id, job or node_name too long");
  }
  if (in.node() < 0)
    return absl::InvalidArgumentError("peer call: negative node");
  return PeerCallId{in.checkpoint_id(), in.job(), in.node(), in.attempt(),
                    in.node_name()};
}

void EncodeIndex(const NodeIndex& index, pb::NodeIndex* out) {
  // Kinds: one table entry per distinct (fqn, type, dtype, shape, path).
  absl::flat_hash_map<std::string_view, std::vector<uint32_t>> by_fqn;
  std::vector<const format::ItemDesc*> kinds;
  auto same_kind = [](const format::ItemDesc& a, const format::ItemDesc& b) {
    return a.type == b.type && a.dtype == b.dtype &&
           a.global_shape == b.global_shape && a.path == b.path;
  };
  // The kind of `it` (a new one if no earlier item has it).
  auto kind_of = [&](const format::ItemDesc& it) {
    std::vector<uint32_t>& cands = by_fqn[it.fqn];
    for (uint32_t c : cands) {
      if (same_kind(*kinds[c], it)) return c;
    }
    const auto k = static_cast<uint32_t>(kinds.size());
    kinds.push_back(&it);
    cands.push_back(k);
    return k;
  };
  out->mutable_ranks()->Reserve(static_cast<int>(index.ranks.size()));
  const pb::RankIndex* prev = nullptr;
  for (size_t r = 0; r < index.ranks.size(); ++r) {
    pb::RankIndex* ri = out->add_ranks();
    ri->set_rank(index.ranks[r]);
    const auto& items = index.items[r];
    size_t dims = 0;
    for (const format::ItemDesc& it : items) dims += it.chunk_offsets.size();
    ri->mutable_kind()->Reserve(static_cast<int>(items.size()));
    ri->mutable_nbytes()->Reserve(static_cast<int>(items.size()));
    ri->mutable_offsets()->Reserve(static_cast<int>(dims));
    ri->mutable_sizes()->Reserve(static_cast<int>(dims));
    for (size_t i = 0; i < items.size(); ++i) {
      const format::ItemDesc& it = items[i];
      // Ranks usually hold the same items in the same order: the previous
      // rank's kind at this position, if it is this item's, before the
      // hash lookup (kinds are distinct, so either finds the same one).
      uint32_t k = UINT32_MAX;
      if (prev != nullptr && static_cast<int>(i) < prev->kind_size()) {
        const uint32_t h = prev->kind(static_cast<int>(i));
        if (kinds[h]->fqn == it.fqn && same_kind(*kinds[h], it)) k = h;
      }
      if (k == UINT32_MAX) k = kind_of(it);
      ri->add_kind(k);
      ri->add_nbytes(index.nbytes[r][i]);
      for (int64_t v : it.chunk_offsets) ri->add_offsets(v);
      for (int64_t v : it.chunk_sizes) ri->add_sizes(v);
    }
    prev = ri;
  }
  for (const format::ItemDesc* it : kinds)
    EncodeItemFields(*it, out->add_kinds());
}

absl::StatusOr<std::shared_ptr<NodeIndex>> DecodeIndex(
    const pb::NodeIndex& in) {
  std::vector<format::ItemDesc> kinds;
  kinds.reserve(in.kinds_size());
  for (int i = 0; i < in.kinds_size(); ++i) {
    ASSIGN_OR_RETURN(
        format::ItemDesc d,
        DecodeItemFields(in.kinds(i), fmt::format("index kind {}", i)));
    if (d.fqn.empty()) {
      return absl::InvalidArgumentError(
          fmt::format("index kind {}: empty fqn", i));
    }
    kinds.push_back(std::move(d));
  }
  auto index = std::make_shared<NodeIndex>();
  index->ranks.reserve(in.ranks_size());
  index->items.reserve(in.ranks_size());
  index->nbytes.reserve(in.ranks_size());
  for (const pb::RankIndex& ri : in.ranks()) {
    index->ranks.push_back(ri.rank());
    auto& items = index->items.emplace_back();
    auto& nbytes = index->nbytes.emplace_back();
    if (ri.nbytes_size() != ri.kind_size()) {
      return absl::InvalidArgumentError(
          fmt::format("rank {}: index columns differ", ri.rank()));
    }
    items.reserve(ri.kind_size());
    nbytes.assign(ri.nbytes().begin(), ri.nbytes().end());
    int pos = 0;
    for (int i = 0; i < ri.kind_size(); ++i) {
      if (ri.kind(i) >= kinds.size()) {
        return absl::InvalidArgumentError(
            fmt::format("rank {} item {}: bad kind", ri.rank(), i));
      }
      const format::ItemDesc& k = kinds[ri.kind(i)];
      const int nd = k.type == format::ItemDesc::Type::kTensor
                         ? static_cast<int>(k.global_shape.size())
                         : 0;
      if (pos + nd > ri.offsets_size() || pos + nd > ri.sizes_size()) {
        return absl::InvalidArgumentError(
            fmt::format("rank {} item {}: boxes run short", ri.rank(), i));
      }
      format::ItemDesc& d = items.emplace_back(k);
      d.chunk_offsets.assign(ri.offsets().begin() + pos,
                             ri.offsets().begin() + pos + nd);
      d.chunk_sizes.assign(ri.sizes().begin() + pos,
                           ri.sizes().begin() + pos + nd);
      pos += nd;
    }
    if (pos != ri.offsets_size() || pos != ri.sizes_size()) {
      return absl::InvalidArgumentError(
          fmt::format("rank {}: extra box values", ri.rank()));
    }
  }
  return index;
}

void ToProto(const NodePlan& plan, pb::PlanResponse* out) {
  out->set_cached(plan.cached);
  for (const NodePlan::Rank& r : plan.ranks) {
    pb::RankPlan* rp = out->add_ranks();
    rp->set_rank(r.rank);
    rp->set_file(r.file);
    std::string bits((r.keep.size() + 7) / 8, '\0');
    for (size_t i = 0; i < r.keep.size(); ++i) {
      if (r.keep[i]) bits[i / 8] |= static_cast<char>(1 << (i % 8));
    }
    rp->set_keep(std::move(bits));
  }
}

NodePlan FromProto(const pb::PlanResponse& in,
                   const std::vector<size_t>& item_counts) {
  NodePlan plan;
  plan.cached = in.cached();
  for (int i = 0; i < in.ranks_size(); ++i) {
    const pb::RankPlan& rp = in.ranks(i);
    NodePlan::Rank& r = plan.ranks.emplace_back();
    r.rank = rp.rank();
    r.file = rp.file();
    const size_t n =
        i < static_cast<int>(item_counts.size()) ? item_counts[i] : 0;
    if (rp.keep().size() * 8 < n)
      continue;  // the manager rejects the size mismatch
    r.keep.resize(n);
    for (size_t k = 0; k < n; ++k)
      r.keep[k] = (rp.keep()[k / 8] >> (k % 8)) & 1;
  }
  return plan;
}

void ToProto(const GlobalStatus& g, pb::HeartbeatResponse* out) {
  out->set_state(static_cast<pb::CheckpointState>(g.state));
  out->set_num_nodes(g.num_nodes);
  out->set_nodes_planned(g.nodes_planned);
  out->set_nodes_prepared(g.nodes_prepared);
  out->set_ranks_staged(g.ranks_staged);
  out->set_total_bytes(g.total_bytes);
  out->set_staged_bytes(g.staged_bytes);
  out->set_written_bytes(g.written_bytes);
  if (!g.error.ok()) {
    out->set_error(std::string(g.error.message()));
    out->set_error_code(static_cast<int>(g.error.code()));
  }
}

GlobalStatus FromProto(const pb::HeartbeatResponse& in) {
  GlobalStatus g;
  g.state = static_cast<State>(in.state());
  g.num_nodes = in.num_nodes();
  g.nodes_planned = in.nodes_planned();
  g.nodes_prepared = in.nodes_prepared();
  g.ranks_staged = in.ranks_staged();
  g.total_bytes = in.total_bytes();
  g.staged_bytes = in.staged_bytes();
  g.written_bytes = in.written_bytes();
  if (in.error_code() != 0) {
    g.error = absl::Status(static_cast<absl::StatusCode>(in.error_code()),
                           in.error());
  }
  return g;
}

void ToProto(const NodeProgress& p, pb::NodeProgress* out) {
  out->set_state(static_cast<pb::CheckpointState>(p.state));
  out->set_ranks_staged(p.ranks_staged);
  out->set_total_bytes(p.total_bytes);
  out->set_staged_bytes(p.staged_bytes);
  out->set_written_bytes(p.written_bytes);
}

NodeProgress FromProto(const pb::NodeProgress& in) {
  NodeProgress p;
  p.state = ValidState(in.state()) ? static_cast<State>(in.state()) : State{};
  p.ranks_staged = std::max(0, in.ranks_staged());
  p.total_bytes = in.total_bytes();
  p.staged_bytes = in.staged_bytes();
  p.written_bytes = in.written_bytes();
  return p;
}

std::vector<size_t> EncodePlanRequest(const PlanCall& call,
                                      pb::PlanRequest* out) {
  ToProto(call.id, out->mutable_call());
  out->set_world_size(call.world_size);
  out->set_num_nodes(call.num_nodes);
  out->mutable_options()->set_overwrite(call.overwrite);
  out->mutable_options()->set_dedup_save_to_lowest_rank(
      call.dedup_save_to_lowest_rank);
  out->mutable_options()->set_keep_last_n(
      static_cast<uint32_t>(std::max(0, call.keep_last_n)));
  out->mutable_options()->set_keep_every(static_cast<uint32_t>(
      std::clamp<int64_t>(call.keep_every, 0, INT32_MAX)));
  out->mutable_options()->set_external_metadata(call.external_metadata);
  out->mutable_options()->set_metadata_timeout_ms(
      static_cast<uint32_t>(std::clamp<int64_t>(
          absl::ToInt64Milliseconds(call.metadata_timeout), 0, UINT32_MAX)));
  out->mutable_options()->set_compression(CompressionOf(call.zstd_level));
  out->set_index_digest(call.index_digest);
  out->set_started_unix_ms(absl::ToUnixMillis(call.started));
  out->set_failure_domain(call.failure_domain);
  for (int r : call.ranks) out->add_ranks(r);
  if (!call.index) return call.item_counts;
  EncodeIndex(*call.index, out->mutable_index());
  std::vector<size_t> counts;
  for (const auto& items : call.index->items) counts.push_back(items.size());
  return counts;
}

absl::StatusOr<PlanCall> DecodePlanRequest(const pb::PlanRequest& req) {
  PlanCall c;
  ASSIGN_OR_RETURN(c.id, FromProto(req.call()));
  c.world_size = req.world_size();
  c.num_nodes = req.num_nodes();
  c.overwrite = req.options().overwrite();
  c.dedup_save_to_lowest_rank = req.options().dedup_save_to_lowest_rank();
  c.keep_last_n = static_cast<int>(
      std::min<uint32_t>(req.options().keep_last_n(), 1 << 20));
  c.keep_every = std::min<int64_t>(req.options().keep_every(), INT32_MAX);
  c.external_metadata = req.options().external_metadata();
  c.metadata_timeout = absl::Milliseconds(req.options().metadata_timeout_ms());
  ASSIGN_OR_RETURN(c.zstd_level, ZstdLevelOf(req.options().compression()));
  c.index_digest = req.index_digest();
  c.started = absl::FromUnixMillis(req.started_unix_ms());
  if (req.failure_domain().size() > 256) {
    return absl::InvalidArgumentError(
        "PlanRequest.failure_domain: longer than 256 bytes");
  }
  c.failure_domain = req.failure_domain();
  c.ranks.assign(req.ranks().begin(), req.ranks().end());
  if (req.has_index()) {
    ASSIGN_OR_RETURN(c.index, DecodeIndex(req.index()));
  }
  return c;
}

void ToProto(const GlobalStatus& g, pb::PrepareResponse* out) {
  out->set_state(pb::COMMITTED);
  ToProto(g, out->mutable_global());
  for (const ClusterNode& n : g.nodes) {
    pb::ClusterNode* o = out->add_nodes();
    o->set_node(n.node);
    o->set_address(n.address);
    o->set_failure_domain(n.failure_domain);
  }
}

GlobalStatus FromProto(const pb::PrepareResponse& in) {
  GlobalStatus g = FromProto(in.global());
  // Bounded by the message limit; a node list a coordinator garbled only
  // misplaces replicas (each holder checks what it accepts).
  for (const pb::ClusterNode& n : in.nodes()) {
    g.nodes.push_back({n.node(), n.address(), n.failure_domain()});
  }
  return g;
}

void EncodePrepareRequest(const PrepareCall& call, pb::PrepareRequest* out) {
  ToProto(call.id, out->mutable_call());
  for (const PrepareCall::Rank& r : call.ranks) {
    pb::RankStorage* rs = out->add_ranks();
    rs->set_rank(r.rank);
    rs->mutable_offset()->Add(r.offset.begin(), r.offset.end());
    rs->mutable_length()->Add(r.length.begin(), r.length.end());
    for (const std::vector<std::string>& t : r.transforms) {
      rs->add_transforms()->mutable_descriptors()->Add(t.begin(), t.end());
    }
  }
  ToProto(call.progress, out->mutable_progress());
}

absl::StatusOr<PrepareCall> DecodePrepareRequest(
    const pb::PrepareRequest& req) {
  PrepareCall c;
  ASSIGN_OR_RETURN(c.id, FromProto(req.call()));
  c.progress = FromProto(req.progress());
  for (const pb::RankStorage& rs : req.ranks()) {
    if (rs.offset_size() != rs.length_size()) {
      return absl::InvalidArgumentError(
          fmt::format("rank {}: offsets and lengths differ", rs.rank()));
    }
    PrepareCall::Rank& rank = c.ranks.emplace_back();
    rank.rank = rs.rank();
    rank.offset.assign(rs.offset().begin(), rs.offset().end());
    rank.length.assign(rs.length().begin(), rs.length().end());
    RETURN_IF_ERROR(DecodeTransforms(rs, rank));
  }
  return c;
}

}  // namespace ckptd::daemon
