// Copyright 2026 The ckptd Authors.
//
// The GPU side of staging: a trainer's CUDA tensors, named by legacy CUDA
// IPC handles (daemon.proto CudaBuffer), are copied device-to-host by the
// daemon on its own streams into its pinned staging pool; the Save call is
// answered only when the copies have completed and the handles are closed.
//
//   Save (device extents)
//     │  CheckpointManager validates bounds against the claimed sizes
//     ▼
//   GpuStager::Stage        per-device worker thread:
//     1. takes slabs of the pinned pool for the batch's bytes (waits while
//        the writer still holds them: a checkpoint larger than the pool
//        streams through it);
//     2. opens each IPC handle once (a stager-wide, reference-counted cache)
//        and checks every copy against the size it maps;
//     3. enqueues the copies, split at slab and chunk boundaries, round-robin
//        on the device's streams (cuMemcpyDtoHAsync);
//     4. synchronizes the streams, closes the handles;
//     5. hands back, per copy, the pinned pieces now holding its bytes.
//   The writer consumes the pieces like arena extents; a slab returns to the
//   pool when the last piece in it has been written.
//
// DeviceBackend is the device behind it: the CUDA driver (dlopen, no link
// dependency) in the daemon, a host-memory fake in the unit tests.
#ifndef CKPTD_DAEMON_STAGING_GPU_STAGER_H_
#define CKPTD_DAEMON_STAGING_GPU_STAGER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/types/save_types.h"

namespace ckptd::daemon {

// Where device bytes come from. Thread-safety: every method may be called
// from any thread; one (device, stream) pair is used by one thread at a time.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  // PCI bus ids of the usable devices, lower case; index = device number.
  virtual const std::vector<std::string>& devices() const = 0;
  virtual int streams_per_device() const = 0;
  // Page-locked host memory for the pool (allocated once, at start-up).
  virtual absl::StatusOr<char*> AllocPinned(uint64_t bytes) = 0;
  virtual void FreePinned(char* p) = 0;
  struct Opened {
    uint64_t ptr = 0;   // device address of the allocation's first byte
    uint64_t size = 0;  // bytes the handle maps
  };
  // Opens an IPC handle on `device`. INVALID_ARGUMENT for a handle that does
  // not open (garbage, freed, another node's).
  virtual absl::StatusOr<Opened> Open(int device,
                                      std::string_view ipc_handle) = 0;
  virtual absl::Status Close(int device, uint64_t ptr) = 0;
  // Enqueues a device-to-host copy of `len` bytes at `src` on `stream`.
  virtual absl::Status CopyAsync(int device, int stream, char* dst,
                                 uint64_t src, uint64_t len) = 0;
  // Waits for everything enqueued on `stream`.
  virtual absl::Status Synchronize(int device, int stream) = 0;
};

// The CUDA driver backend: loads `library` (normally "libcuda.so.1"),
// retains every visible device's primary context and creates `streams`
// non-blocking streams per device. FAILED_PRECONDITION saying why when
// there is no usable driver or device.
absl::StatusOr<std::shared_ptr<DeviceBackend>> OpenCudaBackend(
    std::string_view library, int streams);

// One range to copy: bytes [offset, offset + length) of job.buffers[buffer].
struct StageCopy {
  uint32_t buffer = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// Pinned bytes now holding (part of) a copy; `hold` keeps its slab.
struct StagedPiece {
  const char* data = nullptr;
  uint64_t length = 0;
  std::shared_ptr<const void> hold;
};

struct StageJob {
  std::string what;  // for messages: "checkpoint /x rank 3 batch 0"
  std::vector<CudaBufferDesc> buffers;
  std::vector<StageCopy> copies;
  // Polled while waiting for pool room; true drops the job (CANCELLED).
  std::function<bool()> cancelled;
};

// Per copy (in job order), the pieces holding its bytes in order.
using StageResult = std::vector<std::vector<StagedPiece>>;
using StageDone = absl::AnyInvocable<void(absl::StatusOr<StageResult>) &&>;

class GpuStager {
 public:
  struct Options {
    uint64_t pinned_bytes = uint64_t{4} << 30;  // the pool, allocated once
    uint64_t slab_bytes = uint64_t{8} << 20;    // allocation unit of the pool
    uint64_t chunk_bytes = uint64_t{64} << 20;  // largest single copy
  };

  // Allocates the pool (rounded down to whole slabs, at least one) and
  // starts one worker per device.
  static absl::StatusOr<std::unique_ptr<GpuStager>> Create(
      std::shared_ptr<DeviceBackend> backend, const Options& options);
  // Shutdown().
  ~GpuStager();
  GpuStager(const GpuStager&) = delete;
  GpuStager& operator=(const GpuStager&) = delete;

  const std::vector<std::string>& devices() const;
  // Device number of a PCI bus id (case-insensitive); NOT_FOUND otherwise.
  absl::StatusOr<int> DeviceIndex(std::string_view pci_bus_id) const;
  uint64_t pool_bytes() const;
  uint64_t pool_in_use() const;
  // Pool bytes a batch of `bytes` device bytes takes (whole slabs).
  uint64_t PoolBytesFor(uint64_t bytes) const;

  // Runs `job` on its device's worker; `done` runs there (never under a
  // caller's lock) exactly once: with the pieces, or with the error
  // (INVALID_ARGUMENT for a handle that does not open or a copy outside
  // what it maps, RESOURCE_EXHAUSTED for a job larger than the pool,
  // CANCELLED when job.cancelled() or Shutdown() stopped it, INTERNAL for a
  // failed copy).
  void Stage(StageJob job, StageDone done);

  // Fails queued jobs with CANCELLED, lets running ones finish, joins the
  // workers. Pieces already handed out stay valid (they own their slabs).
  void Shutdown();

 private:
  class Impl;
  explicit GpuStager(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_STAGING_GPU_STAGER_H_
