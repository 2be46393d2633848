// Copyright 2026 The ckptd Authors.
//
// The restore half of the C ABI (client/ckptd_c.h, API version 5):
// ckptd_restore_index and ckptd_restore over Client::GetRestoreIndex and
// Client::Restore.
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/c_abi_util.h"
#include "client/c_client_handle.h"
#include "client/ckptd_c.h"
#include "client/ckptd_client.h"

namespace {

using ckptd::client::RestoreBytesItem;
using ckptd::client::RestoreOptions;
using ckptd::client::RestoreTensor;
using ckptd::client::internal::CopyString;
using ckptd::client::internal::Fail;
using ckptd::client::internal::Guard;
using ckptd::client::internal::Ok;
using ckptd::client::internal::ReturnString;

// Most dimensions a request may have (as ckptd_item).
constexpr int32_t kMaxDims = 64;

absl::StatusOr<RestoreOptions> ToRestoreOptions(
    const ckptd_restore_options* o) {
  RestoreOptions out;
  if (o == nullptr) return out;
  if ((o->flags & ~CKPTD_RESTORE_NO_VERIFY_CRC) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown bits in ckptd_restore_options.flags (", o->flags, ")"));
  }
  if (o->group != nullptr) out.group = o->group;
  out.local_rank = o->local_rank;
  out.local_world_size = o->local_world_size == 0 ? 1 : o->local_world_size;
  out.verify_crc = (o->flags & CKPTD_RESTORE_NO_VERIFY_CRC) == 0;
  if (o->identity != nullptr) out.identity = o->identity;
  if (o->batch_bytes != 0) out.batch_bytes = o->batch_bytes;
  return out;
}

absl::Status ToRestoreTensor(size_t i, const ckptd_read_request& c,
                             RestoreTensor* out) {
  if (c.fqn == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", i, ": fqn is NULL"));
  }
  out->fqn = c.fqn;
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", i, " ('", out->fqn, "'): ", what));
  };
  out->dtype = c.dtype != nullptr ? c.dtype : "float32";
  if (c.ndim < 0 || c.ndim > kMaxDims) {
    return bad(absl::StrCat("ndim ", c.ndim, " is not in [0, 64]"));
  }
  const size_t nd = static_cast<size_t>(c.ndim);
  if (nd > 0 && c.sizes == nullptr) return bad("sizes is NULL");
  out->sizes.assign(c.sizes, c.sizes + nd);
  if (c.offsets != nullptr) {
    out->offsets.assign(c.offsets, c.offsets + nd);
  } else {
    out->offsets.assign(nd, 0);
  }
  if (c.strides != nullptr) out->strides.assign(c.strides, c.strides + nd);
  out->data = c.data;
  return absl::OkStatus();
}

// Hands the restored bytes items to the caller (malloc'ed copies); on
// failure frees what it allocated and leaves every data NULL.
int ReturnBytesItems(const std::vector<RestoreBytesItem>& items,
                     ckptd_restore_bytes* out) {
  for (size_t i = 0; i < items.size(); ++i) {
    out[i].data = CopyString(items[i].value);
    if (out[i].data == nullptr) {
      for (size_t k = 0; k <= i; ++k) {
        std::free(out[k].data);
        out[k].data = nullptr;
        out[k].length = 0;
      }
      return Fail(absl::ResourceExhaustedError("out of memory"));
    }
    out[i].length = items[i].value.size();
  }
  return Ok();
}

}  // namespace

extern "C" {

int ckptd_restore_index(ckptd_client* client, const char* checkpoint_id,
                        char** json_out, char** identity_out) {
  return Guard([&] {
    CKPTD_REQUIRE(json_out != nullptr, "json_out is NULL");
    *json_out = nullptr;
    if (identity_out != nullptr) *identity_out = nullptr;
    CKPTD_REQUIRE(client != nullptr, "client is NULL");
    CKPTD_REQUIRE(checkpoint_id != nullptr, "checkpoint_id is NULL");
    auto index = client->client->GetRestoreIndex(checkpoint_id);
    if (!index.ok()) return Fail(index.status());
    if (identity_out != nullptr) {
      if (const int rc = ReturnString(index->identity, identity_out);
          rc != CKPTD_OK) {
        return rc;
      }
    }
    const int rc = ReturnString(index->index_json, json_out);
    if (rc != CKPTD_OK && identity_out != nullptr) {
      std::free(*identity_out);
      *identity_out = nullptr;
    }
    return rc;
  });
}

int ckptd_restore(ckptd_client* client, const char* checkpoint_id,
                  const ckptd_restore_options* opts,
                  const ckptd_read_request* tensors, size_t n_tensors,
                  ckptd_restore_bytes* bytes_items, size_t n_bytes,
                  ckptd_restore_stats* stats_out) {
  return Guard([&] {
    if (stats_out != nullptr) *stats_out = ckptd_restore_stats{};
    CKPTD_REQUIRE(bytes_items != nullptr || n_bytes == 0,
                  "bytes_items is NULL");
    for (size_t i = 0; i < n_bytes; ++i) {
      bytes_items[i].data = nullptr;
      bytes_items[i].length = 0;
    }
    CKPTD_REQUIRE(client != nullptr, "client is NULL");
    CKPTD_REQUIRE(checkpoint_id != nullptr, "checkpoint_id is NULL");
    CKPTD_REQUIRE(tensors != nullptr || n_tensors == 0, "tensors is NULL");
    auto options = ToRestoreOptions(opts);
    if (!options.ok()) return Fail(options.status());
    std::vector<RestoreTensor> wants(n_tensors);
    for (size_t i = 0; i < n_tensors; ++i) {
      const absl::Status s = ToRestoreTensor(i, tensors[i], &wants[i]);
      if (!s.ok()) return Fail(s);
    }
    std::vector<RestoreBytesItem> items(n_bytes);
    for (size_t i = 0; i < n_bytes; ++i) {
      if (bytes_items[i].fqn == nullptr) {
        return Fail(absl::InvalidArgumentError(
            absl::StrCat("bytes item ", i, ": fqn is NULL")));
      }
      items[i].fqn = bytes_items[i].fqn;
      items[i].nbytes = bytes_items[i].nbytes;
    }
    auto stats = client->client->Restore(checkpoint_id, *options, wants,
                                         absl::MakeSpan(items));
    if (!stats.ok()) return Fail(stats.status());
    if (const int rc = ReturnBytesItems(items, bytes_items); rc != CKPTD_OK) {
      return rc;
    }
    if (stats_out != nullptr) {
      stats_out->storage_bytes = stats->storage_bytes;
      stats_out->copied_bytes = stats->copied_bytes;
      stats_out->bytes = stats->bytes;
      stats_out->batches = stats->batches;
      stats_out->group_ranks = stats->group_ranks;
      stats_out->seconds = stats->seconds;
    }
    return Ok();
  });
}

}  // extern "C"
