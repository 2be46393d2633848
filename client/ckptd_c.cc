// Copyright 2026 The ckptd Authors.
//
// The C ABI (client/ckptd_c.h) over ckptd::client::Client.
#include "client/ckptd_c.h"

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/batching.h"
#include "client/c_abi_util.h"
#include "client/c_client_handle.h"
#include "client/ckptd_client.h"
#include "client/info_json.h"
#include "nlohmann/json.hpp"

namespace {

using ckptd::client::CheckpointInfo;
using ckptd::client::Client;
using ckptd::client::SaveItem;
using ckptd::client::internal::Fail;
using ckptd::client::internal::Guard;
using ckptd::client::internal::LastError;
using ckptd::client::internal::Ok;
using ckptd::client::internal::ReturnString;

absl::Status ParsePath(size_t i, const char* json,
                       std::vector<ckptd::client::PathElement>* out) {
  if (json == nullptr || *json == '\0') return absl::OkStatus();
  const auto j =
      nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "item ", i,
        ": path_json must be a JSON array of strings and integers, "
        "got '",
        json, "'"));
  };
  if (j.is_discarded() || !j.is_array()) return bad();
  for (const auto& e : j) {
    if (e.is_string()) {
      out->emplace_back(e.get_ref<const std::string&>());
    } else if (e.is_number_integer()) {
      if (e.is_number_unsigned() &&
          e.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
        return bad();
      }
      out->emplace_back(e.get<int64_t>());
    } else {
      return bad();
    }
  }
  return absl::OkStatus();
}

absl::Status ToSaveItems(
    const ckptd_item* items, size_t n, std::vector<SaveItem>* out,
    const ckptd_cuda_source* const* cuda_sources = nullptr,
    std::vector<ckptd::client::CudaSource>* cuda_out = nullptr) {
  if (items == nullptr && n > 0) {
    return absl::InvalidArgumentError("items is NULL");
  }
  out->resize(n);
  if (cuda_sources != nullptr) cuda_out->resize(n);
  bool check_nbytes = false;
  for (size_t i = 0; i < n; ++i) {
    const ckptd_item& c = items[i];
    SaveItem& s = (*out)[i];
    if (c.fqn == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("item ", i, ": fqn is NULL"));
    }
    s.fqn = c.fqn;
    s.is_bytes = c.is_bytes != 0;
    if (auto st = ParsePath(i, c.path_json, &s.path); !st.ok()) return st;
    if (s.is_bytes) {
      if (c.data == nullptr && c.nbytes > 0) {
        return absl::InvalidArgumentError(absl::StrCat("item ", i, " ('", s.fqn,
                                                       "'): data is NULL for ",
                                                       c.nbytes, " bytes"));
      }
      s.bytes = std::string_view(static_cast<const char*>(c.data), c.nbytes);
      continue;
    }
    if (c.ndim < 0 ||
        static_cast<size_t>(c.ndim) > ckptd::client::internal::kMaxDims) {
      return absl::InvalidArgumentError(absl::StrCat(
          "item ", i, " ('", s.fqn, "'): ndim ", c.ndim, " is not in [0, 64]"));
    }
    const size_t nd = static_cast<size_t>(c.ndim);
    if (nd > 0 && c.global_shape == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("item ", i, " ('", s.fqn, "'): global_shape is NULL"));
    }
    s.dtype = c.dtype != nullptr ? c.dtype : "float32";
    s.global_shape.assign(c.global_shape, c.global_shape + nd);
    if (c.chunk_offsets != nullptr) {
      s.chunk_offsets.assign(c.chunk_offsets, c.chunk_offsets + nd);
    } else {
      s.chunk_offsets.assign(nd, 0);
    }
    if (c.chunk_sizes != nullptr) {
      s.chunk_sizes.assign(c.chunk_sizes, c.chunk_sizes + nd);
    } else {
      s.chunk_sizes = s.global_shape;
    }
    if (c.strides != nullptr) s.strides.assign(c.strides, c.strides + nd);
    s.data = c.data;
    if (cuda_sources != nullptr && cuda_sources[i] != nullptr) {
      const ckptd_cuda_source& src = *cuda_sources[i];
      ckptd::client::CudaSource& dst = (*cuda_out)[i];
      std::memcpy(dst.ipc_handle.data(), src.ipc_handle, sizeof src.ipc_handle);
      dst.device.assign(src.device, strnlen(src.device, sizeof src.device));
      dst.offset = src.offset;
      dst.allocation_size = src.allocation_size;
      s.cuda = &dst;
    }
    if (c.nbytes != 0) check_nbytes = true;
  }
  if (check_nbytes) {
    auto prepared = ckptd::client::internal::ValidateItems(*out, 0);
    if (!prepared.ok()) return prepared.status();
    for (size_t i = 0; i < n; ++i) {
      if (items[i].is_bytes == 0 && items[i].nbytes != 0 &&
          items[i].nbytes != (*prepared)[i].nbytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "item ", i, " ('", (*out)[i].fqn, "'): nbytes ", items[i].nbytes,
            " disagrees with the shape (", (*prepared)[i].nbytes, " bytes)"));
      }
    }
  }
  return absl::OkStatus();
}

// sizeof(ckptd_save_options) of C API version 2: overwrite,
// dedup_save_to_lowest_rank, keep_last_n.
constexpr size_t kSaveOptionsV2Size =
    offsetof(ckptd_save_options, keep_last_n) + sizeof(int32_t);
static_assert(kSaveOptionsV2Size == 12);
// Larger sizes are a caller's bug (not sizeof of any header's struct).
constexpr size_t kMaxSaveOptionsSize = 4096;

// The caller's `options_size` bytes of options, as this library's struct:
// fields the caller's struct does not hold completely are zero.
absl::StatusOr<ckptd_save_options> ReadSaveOptions(
    const ckptd_save_options* options, size_t options_size) {
  ckptd_save_options o = {};
  if (options == nullptr) return o;
  if (options_size < kSaveOptionsV2Size) {
    return absl::InvalidArgumentError(
        absl::StrCat("options_size ", options_size,
                     " is smaller than ckptd_save_options of C API version 2 (",
                     kSaveOptionsV2Size, " bytes)"));
  }
  if (options_size > kMaxSaveOptionsSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("options_size ", options_size,
                     " is not the size of a ckptd_save_options"));
  }
  if (options_size > sizeof(o)) {
    // A newer header's struct: its fields unknown here must be unset.
    const auto* extra = reinterpret_cast<const unsigned char*>(options);
    if (std::any_of(extra + sizeof(o), extra + options_size,
                    [](unsigned char b) { return b != 0; })) {
      return absl::InvalidArgumentError(
          absl::StrCat("ckptd_save_options of ", options_size,
                       " bytes sets fields this library (C API version ",
                       CKPTD_C_API_VERSION, ", ", sizeof(o),
                       " bytes) does not know: use a newer libckptd_client"));
    }
  }
  std::memcpy(&o, options, std::min(options_size, sizeof(o)));
  // A caller's struct that ends inside a field (no real header's does) must
  // not hand over half a pointer.
  auto covered = [&](size_t offset, size_t size) {
    return offset + size <= options_size;
  };
  if (!covered(offsetof(ckptd_save_options, coordinator),
               sizeof(o.coordinator))) {
    o.coordinator = nullptr;
  }
  if (!covered(offsetof(ckptd_save_options, local_ranks),
               sizeof(o.local_ranks))) {
    o.local_ranks = nullptr;
  }
  if (!covered(offsetof(ckptd_save_options, num_local_ranks),
               sizeof(o.num_local_ranks))) {
    o.num_local_ranks = 0;
  }
  if (!covered(offsetof(ckptd_save_options, num_nodes), sizeof(o.num_nodes))) {
    o.num_nodes = 0;
  }
  if (!covered(offsetof(ckptd_save_options, cuda_sources),
               sizeof(o.cuda_sources))) {
    o.cuda_sources = nullptr;
  }
  if (!covered(offsetof(ckptd_save_options, external_metadata),
               sizeof(o.external_metadata))) {
    o.external_metadata = 0;
  }
  if (!covered(offsetof(ckptd_save_options, metadata_timeout_ms),
               sizeof(o.metadata_timeout_ms))) {
    o.metadata_timeout_ms = 0;
  }
  if (!covered(offsetof(ckptd_save_options, keep_every),
               sizeof(o.keep_every))) {
    o.keep_every = 0;
  }
  if (!covered(offsetof(ckptd_save_options, compression),
               sizeof(o.compression))) {
    o.compression = nullptr;
  }
  return o;
}

// The C++ SaveOptions of a (complete) C struct.
absl::StatusOr<ckptd::client::SaveOptions> ToSaveOptions(
    const ckptd_save_options& o) {
  ckptd::client::SaveOptions opts;
  opts.overwrite = o.overwrite != 0;
  opts.dedup_save_to_lowest_rank = o.dedup_save_to_lowest_rank != 0;
  opts.keep_last_n = o.keep_last_n;
  if (o.coordinator != nullptr) opts.cluster.coordinator = o.coordinator;
  if (o.num_local_ranks < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cluster: num_local_ranks ", o.num_local_ranks, " is negative"));
  }
  if (o.num_local_ranks > 0 && o.local_ranks == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster: local_ranks is NULL with num_local_ranks ",
                     o.num_local_ranks));
  }
  if (o.num_local_ranks > 0) {
    opts.cluster.local_ranks.assign(o.local_ranks,
                                    o.local_ranks + o.num_local_ranks);
  }
  opts.cluster.num_nodes = o.num_nodes == 0 ? 1 : o.num_nodes;
  if (o.keep_every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("keep_every ", o.keep_every, " is negative"));
  }
  opts.keep_every = o.keep_every;
  if (o.compression != nullptr) opts.compression = o.compression;
  opts.external_metadata = o.external_metadata != 0;
  opts.metadata_timeout = absl::Milliseconds(o.metadata_timeout_ms);
  return opts;
}

absl::Duration TimeoutFromMs(int64_t timeout_ms) {
  return timeout_ms < 0 ? absl::InfiniteDuration()
                        : absl::Milliseconds(timeout_ms);
}

void CopyState(const std::string& state, char* buf, size_t len) {
  if (buf == nullptr || len == 0) return;
  const size_t n = std::min(len - 1, state.size());
  std::memcpy(buf, state.data(), n);
  buf[n] = '\0';
}

}  // namespace

extern "C" {

const char* ckptd_last_error(void) { return LastError().c_str(); }

int ckptd_api_version(void) { return CKPTD_C_API_VERSION; }

int ckptd_connect_ex(const char* socket_path, int copy_threads,
                     const char* owner, double rpc_timeout_seconds,
                     ckptd_client** out) {
  return Guard([&] {
    CKPTD_REQUIRE(out != nullptr, "out is NULL");
    *out = nullptr;
    ckptd::client::ClientOptions options;
    if (socket_path != nullptr) options.socket_path = socket_path;
    options.copy_threads = copy_threads;
    if (owner != nullptr) options.owner = owner;
    if (rpc_timeout_seconds > 0) {
      options.rpc_timeout = absl::Seconds(rpc_timeout_seconds);
    }
    auto client = Client::Connect(options);
    if (!client.ok()) return Fail(client.status());
    *out = new ckptd_client{*std::move(client)};
    return Ok();
  });
}

int ckptd_connect(const char* socket_path, int copy_threads,
                  ckptd_client** out) {
  return ckptd_connect_ex(socket_path, copy_threads, nullptr, 0, out);
}

void ckptd_close(ckptd_client* client) {
  LastError().clear();
  delete client;
}

int ckptd_info_json(ckptd_client* client, char** json_out) {
  return Guard([&] {
    CKPTD_REQUIRE(client != nullptr, "client is NULL");
    CKPTD_REQUIRE(json_out != nullptr, "json_out is NULL");
    return ReturnString(
        ckptd::client::DumpJson(ckptd::client::ToJson(client->client->info())),
        json_out);
  });
}

int ckptd_save_ex2(ckptd_client* client, const char* checkpoint_id,
                   const char* job, int rank, int world_size,
                   const ckptd_item* items, size_t n,
                   const ckptd_save_options* options, size_t options_size,
                   ckptd_save_stats* stats_out, char** resolved_id_out) {
  return Guard([&] {
    CKPTD_REQUIRE(client != nullptr, "client is NULL");
    CKPTD_REQUIRE(checkpoint_id != nullptr, "checkpoint_id is NULL");
    if (resolved_id_out != nullptr) *resolved_id_out = nullptr;
    auto c_opts = ReadSaveOptions(options, options_size);
    if (!c_opts.ok()) return Fail(c_opts.status());
    auto opts = ToSaveOptions(*c_opts);
    if (!opts.ok()) return Fail(opts.status());
    std::vector<SaveItem> save_items;
    std::vector<ckptd::client::CudaSource> cuda;  // SaveItem::cuda points here
    if (absl::Status s =
            ToSaveItems(items, n, &save_items, c_opts->cuda_sources, &cuda);
        !s.ok()) {
      return Fail(s);
    }
    ckptd::client::SaveStats stats;
    auto id = client->client->Save(checkpoint_id, job != nullptr ? job : "",
                                   rank, world_size, save_items, *opts, &stats);
    if (!id.ok()) return Fail(id.status());
    if (stats_out != nullptr) {
      stats_out->copy_seconds = stats.copy_seconds;
      stats_out->total_seconds = stats.total_seconds;
      stats_out->bytes = stats.bytes;
      stats_out->batches = stats.batches;
    }
    if (resolved_id_out != nullptr) return ReturnString(*id, resolved_id_out);
    return Ok();
  });
}

int ckptd_save_ex(ckptd_client* client, const char* checkpoint_id,
                  const char* job, int rank, int world_size,
                  const ckptd_item* items, size_t n,
                  const ckptd_save_options* options,
                  ckptd_save_stats* stats_out, char** resolved_id_out) {
  return ckptd_save_ex2(client, checkpoint_id, job, rank, world_size, items, n,
                        options, kSaveOptionsV2Size, stats_out,
                        resolved_id_out);
}

int ckptd_save(ckptd_client* client, const char* checkpoint_id, const char* job,
               int rank, int world_size, const ckptd_item* items, size_t n,
               int overwrite, double* copy_seconds_out) {
  ckptd_save_options options = {};
  options.overwrite = overwrite;
  ckptd_save_stats stats = {};
  const int rc =
      ckptd_save_ex2(client, checkpoint_id, job, rank, world_size, items, n,
                     &options, sizeof(options), &stats, nullptr);
  if (rc == CKPTD_OK && copy_seconds_out != nullptr) {
    *copy_seconds_out = stats.copy_seconds;
  }
  return rc;
}

int ckptd_wait(ckptd_client* client, const char* checkpoint_id,
               int64_t timeout_ms, char* state_buf, size_t len) {
  return Guard([&] {
    CKPTD_REQUIRE(client != nullptr, "client is NULL");
    CKPTD_REQUIRE(checkpoint_id != nullptr, "checkpoint_id is NULL");
    CKPTD_REQUIRE(state_buf != nullptr || len == 0, "state_buf is NULL");
    auto info = client->client->Wait(checkpoint_id, TimeoutFromMs(timeout_ms));
    if (!info.ok()) return Fail(info.status());
    CopyState(info->state, state_buf, len);
    const int rc = Ok();
    if (info->state == "FAILED" || info->state == "CANCELLED") {
      LastError() = info->error;
    }
    return rc;
  });
}

int ckptd_wait_json(ckptd_client* client, const char* checkpoint_id,
                    int64_t timeout_ms, char** json_out) {
  return Guard([&] {
    CKPTD_REQUIRE(client != nullptr, "client is NULL");
    CKPTD_REQUIRE(checkpoint_id != nullptr, "checkpoint_id is NULL");
    CKPTD_REQUIRE(json_out != nullptr, "json_out is NULL");
    auto info = client->client->Wait(checkpoint_id, TimeoutFromMs(timeout_ms));
    if (!info.ok()) return Fail(info.status());
    return ReturnString(ckptd::client::DumpJson(ckptd::client::ToJson(*info)),
                        json_out);
  });
}

int ckptd_wait_data_durable_json(ckptd_client* client,
                                 const char* checkpoint_id, int64_t timeout_ms,
                                 char** json_out) {
  return Guard([&] {
    CKPTD_REQUIRE(client != nullptr, "client is NULL");
    CKPTD_REQUIRE(checkpoint_id != nullptr, "checkpoint_id is NULL");
    CKPTD_REQUIRE(json_out != nullptr, "json_out is NULL");
    auto info = client->client->WaitDataDurable(checkpoint_id,
                                                TimeoutFromMs(timeout_ms));
    if (!info.ok()) return Fail(info.status());
    return ReturnString(ckptd::client::DumpJson(ckptd::client::ToJson(*info)),
                        json_out);
  });
}

int ckptd_layout_json(ckptd_client* client, const char* checkpoint_id,
                      char** json_out) {
  return Guard([&] {
    CKPTD_REQUIRE(client != nullptr, "client is NULL");
    CKPTD_REQUIRE(checkpoint_id != nullptr, "checkpoint_id is NULL");
    CKPTD_REQUIRE(json_out != nullptr, "json_out is NULL");
    auto layout = client->client->GetLayout(checkpoint_id);
    if (!layout.ok()) return Fail(layout.status());
    nlohmann::ordered_json entries = nlohmann::ordered_json::array();
    for (const ckptd::client::LayoutEntry& e : *layout) {
      entries.push_back({{"fqn", e.fqn},
                         {"bytes", e.is_bytes},
                         {"offsets", e.offsets},
                         {"path", e.relative_path},
                         {"offset", e.offset},
                         {"length", e.length},
                         {"transforms", e.transform_descriptors}});
    }
    nlohmann::ordered_json out{{"checkpoint_id", checkpoint_id},
                               {"entries", std::move(entries)}};
    return ReturnString(ckptd::client::DumpJson(out), json_out);
  });
}

int ckptd_commit_metadata(ckptd_client* client, const char* checkpoint_id,
                          const void* metadata, size_t len) {
  return Guard([&] {
    CKPTD_REQUIRE(client != nullptr, "client is NULL");
    CKPTD_REQUIRE(checkpoint_id != nullptr, "checkpoint_id is NULL");
    CKPTD_REQUIRE(metadata != nullptr || len == 0, "metadata is NULL");
    const absl::Status s = client->client->CommitMetadata(
        checkpoint_id,
        std::string_view(static_cast<const char*>(metadata), len));
    return s.ok() ? CKPTD_OK : Fail(s);
  });
}

int ckptd_status_json(ckptd_client* client, const char* checkpoint_id,
                      char** json_out) {
  return Guard([&] {
    CKPTD_REQUIRE(client != nullptr, "client is NULL");
    CKPTD_REQUIRE(checkpoint_id != nullptr, "checkpoint_id is NULL");
    CKPTD_REQUIRE(json_out != nullptr, "json_out is NULL");
    auto info = client->client->GetStatus(checkpoint_id);
    if (!info.ok()) return Fail(info.status());
    return ReturnString(ckptd::client::DumpJson(ckptd::client::ToJson(*info)),
                        json_out);
  });
}

int ckptd_list_json(ckptd_client* client, const char* job, int include_disk,
                    char** json_out) {
  return Guard([&] {
    CKPTD_REQUIRE(client != nullptr, "client is NULL");
    CKPTD_REQUIRE(json_out != nullptr, "json_out is NULL");
    auto list =
        client->client->List(job != nullptr ? job : "", include_disk != 0);
    if (!list.ok()) return Fail(list.status());
    nlohmann::ordered_json j = nlohmann::ordered_json::array();
    for (const CheckpointInfo& info : *list) {
      j.push_back(ckptd::client::ToJson(info));
    }
    return ReturnString(ckptd::client::DumpJson(j), json_out);
  });
}

int ckptd_cancel(ckptd_client* client, const char* checkpoint_id,
                 const char* reason) {
  return Guard([&] {
    CKPTD_REQUIRE(client != nullptr, "client is NULL");
    CKPTD_REQUIRE(checkpoint_id != nullptr, "checkpoint_id is NULL");
    const absl::Status s =
        client->client->Cancel(checkpoint_id, reason != nullptr ? reason : "");
    return s.ok() ? Ok() : Fail(s);
  });
}

int ckptd_reserve(ckptd_client* client, uint64_t bytes) {
  return Guard([&] {
    CKPTD_REQUIRE(client != nullptr, "client is NULL");
    const absl::Status s = client->client->Reserve(bytes);
    return s.ok() ? Ok() : Fail(s);
  });
}

void ckptd_free_string(char* s) { std::free(s); }

}  // extern "C"
