// Copyright 2026 The ckptd Authors.
#include "daemon/staging/gpu_stager.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <deque>
#include <map>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/absl_fmt.h"
#include "common/status_macros.h"
#include "daemon/staging/cuda_driver.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// ---------------------------------------------------------------------------
// The CUDA driver backend
// ---------------------------------------------------------------------------

class CudaBackend final : public DeviceBackend {
 public:
  static absl::StatusOr<std::shared_ptr<DeviceBackend>> Open(
      std::string_view library, int streams) {
    ASSIGN_OR_RETURN(std::shared_ptr<const cuda::Driver> drv,
                     cuda::LoadDriver(library));
    int count = 0;  // left untouched by some errors (environment.md)
    RETURN_IF_ERROR(drv->Check(drv->DeviceGetCount(&count), "cuDeviceGetCount",
                               absl::StatusCode::kFailedPrecondition));
    if (count <= 0) {
      const char* vis = std::getenv("CUDA_VISIBLE_DEVICES");
      return absl::FailedPreconditionError(fmt::format(
          "the CUDA driver sees no device (CUDA_VISIBLE_DEVICES={})",
          vis != nullptr ? fmt::format("'{}'", vis) : "unset"));
    }
    auto b = std::shared_ptr<CudaBackend>(
        new CudaBackend(drv, std::max(1, streams)));
    for (int i = 0; i < count; ++i) {
      Device dev;
      RETURN_IF_ERROR(drv->Check(drv->DeviceGet(&dev.device, i), "cuDeviceGet",
                                 absl::StatusCode::kFailedPrecondition));
      char bus[64] = {};
      RETURN_IF_ERROR(drv->Check(
          drv->DeviceGetPCIBusId(bus, sizeof bus, dev.device),
          "cuDeviceGetPCIBusId", absl::StatusCode::kFailedPrecondition));
      RETURN_IF_ERROR(
          drv->Check(drv->DevicePrimaryCtxRetain(&dev.ctx, dev.device),
                     fmt::format("cuDevicePrimaryCtxRetain (device {})", bus),
                     absl::StatusCode::kFailedPrecondition));
      b->devs_.push_back(dev);  // released by the destructor from here on
      RETURN_IF_ERROR(
          drv->Check(drv->CtxSetCurrent(dev.ctx), "cuCtxSetCurrent"));
      for (int s = 0; s < b->streams_; ++s) {
        cuda::CUstream stream = nullptr;
        RETURN_IF_ERROR(
            drv->Check(drv->StreamCreate(&stream, cuda::kStreamNonBlocking),
                       fmt::format("cuStreamCreate (device {})", bus),
                       absl::StatusCode::kFailedPrecondition));
        b->devs_.back().streams.push_back(stream);
      }
      b->names_.push_back(Lower(bus));
    }
    int version = 0;
    (void)drv->DriverGetVersion(&version);
    spdlog::info(
        "CUDA driver {} (API {}.{}): {} device(s) [{}], {} copy stream(s) each",
        drv->path, version / 1000, (version % 1000) / 10, count,
        fmt::join(b->names_, ", "), b->streams_);
    return std::shared_ptr<DeviceBackend>(std::move(b));
  }

  ~CudaBackend() override {
    for (Device& d : devs_) {
      if (drv_->CtxSetCurrent(d.ctx) == cuda::kSuccess) {
        for (cuda::CUstream s : d.streams) (void)drv_->StreamDestroy(s);
      }
      (void)drv_->DevicePrimaryCtxRelease(d.device);
    }
  }

  const std::vector<std::string>& devices() const override { return names_; }
  int streams_per_device() const override { return streams_; }

  absl::StatusOr<char*> AllocPinned(uint64_t bytes) override {
    RETURN_IF_ERROR(Use(0));
    void* p = nullptr;
    // Portable: usable for copies in every device's context.
    RETURN_IF_ERROR(drv_->Check(
        drv_->MemHostAlloc(&p, bytes, cuda::kMemHostAllocPortable),
        fmt::format("cuMemHostAlloc of {} bytes for the pinned staging "
                    "pool (lower pinned_staging_bytes, or raise "
                    "LimitMEMLOCK)",
                    bytes),
        absl::StatusCode::kResourceExhausted));
    return static_cast<char*>(p);
  }
  void FreePinned(char* p) override {
    if (Use(0).ok()) (void)drv_->MemFreeHost(p);
  }

  absl::StatusOr<Opened> Open(int device,
                              std::string_view ipc_handle) override {
    RETURN_IF_ERROR(Use(device));
    cuda::CUipcMemHandle h;
    std::memcpy(h.reserved, ipc_handle.data(), sizeof h.reserved);
    cuda::CUdeviceptr ptr = 0;
    RETURN_IF_ERROR(drv_->Check(
        drv_->IpcOpenMemHandle(&ptr, h, cuda::kIpcMemLazyEnablePeerAccess),
        fmt::format("cuIpcOpenMemHandle on device {} (a handle of another "
                    "node, of a freed "
                    "allocation, or not an IPC handle)",
                    names_[device]),
        absl::StatusCode::kInvalidArgument));
    cuda::CUdeviceptr base = 0;
    size_t size = 0;
    if (absl::Status s =
            drv_->Check(drv_->MemGetAddressRange(&base, &size, ptr),
                        "cuMemGetAddressRange of an opened IPC handle");
        !s.ok()) {
      (void)drv_->IpcCloseMemHandle(ptr);
      return s;
    }
    // The handle maps its allocation from `ptr`; base == ptr for legacy IPC.
    return Opened{ptr, static_cast<uint64_t>(base + size - ptr)};
  }

  absl::Status Close(int device, uint64_t ptr) override {
    RETURN_IF_ERROR(Use(device));
    return drv_->Check(drv_->IpcCloseMemHandle(ptr), "cuIpcCloseMemHandle");
  }

  absl::Status CopyAsync(int device, int stream, char* dst, uint64_t src,
                         uint64_t len) override {
    RETURN_IF_ERROR(Use(device));
    return drv_->Check(
        drv_->MemcpyDtoHAsync(dst, src, len, devs_[device].streams[stream]),
        fmt::format("cuMemcpyDtoHAsync of {} bytes on device {}", len,
                    names_[device]));
  }

  absl::Status Synchronize(int device, int stream) override {
    RETURN_IF_ERROR(Use(device));
    return drv_->Check(
        drv_->StreamSynchronize(devs_[device].streams[stream]),
        fmt::format("cuStreamSynchronize on device {}", names_[device]));
  }

 private:
  struct Device {
    cuda::CUdevice device = 0;
    cuda::CUcontext ctx = nullptr;
    std::vector<cuda::CUstream> streams;
  };

  CudaBackend(std::shared_ptr<const cuda::Driver> drv, int streams)
      : drv_(std::move(drv)), streams_(streams) {}

  // Makes the device's primary context current on the calling thread.
  absl::Status Use(int device) {
    return drv_->Check(drv_->CtxSetCurrent(devs_[device].ctx),
                       "cuCtxSetCurrent");
  }

  const std::shared_ptr<const cuda::Driver> drv_;
  const int streams_;
  std::vector<Device> devs_;  // immutable after Open
  std::vector<std::string> names_;
};

// ---------------------------------------------------------------------------
// The pinned pool: fixed-size slabs of one page-locked region
// ---------------------------------------------------------------------------

class SlabPool : public std::enable_shared_from_this<SlabPool> {
 public:
  SlabPool(std::shared_ptr<DeviceBackend> backend, char* base, uint64_t slab,
           size_t count)
      : backend_(std::move(backend)), base_(base), slab_(slab), count_(count) {
    free_.reserve(count);
    for (size_t i = count; i > 0; --i) free_.push_back(i - 1);
  }
  ~SlabPool() { backend_->FreePinned(base_); }

  uint64_t slab_bytes() const { return slab_; }
  size_t count() const { return count_; }
  uint64_t in_use() const {
    absl::MutexLock l(&mu_);
    return (count_ - free_.size()) * slab_;
  }

  // Waits until `n` slabs are free (n <= count()) or `give_up` says so
  // (polled every 50 ms without the pool's lock: it may take the caller's
  // locks, and slabs are returned under them).
  absl::StatusOr<std::vector<std::shared_ptr<const void>>> Take(
      size_t n, const std::function<bool()>& give_up,
      std::vector<char*>& data) {
    std::vector<size_t> got;
    while (got.empty() && n > 0) {
      {
        absl::MutexLock l(&mu_);
        auto room = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return woken_ || free_.size() >= n;
        };
        mu_.AwaitWithTimeout(absl::Condition(&room), absl::Milliseconds(50));
        if (free_.size() >= n) {
          got.assign(free_.end() - static_cast<std::ptrdiff_t>(n), free_.end());
          free_.resize(free_.size() - n);
          break;
        }
      }
      if (give_up())
        return absl::CancelledError(
            "stopped while waiting for pinned pool room");
    }
    std::vector<std::shared_ptr<const void>> holds;
    holds.reserve(n);
    data.clear();
    auto self = shared_from_this();
    for (size_t i : got) {
      char* p = base_ + i * slab_;
      data.push_back(p);
      // The slab returns to the pool when the last piece in it is gone.
      holds.emplace_back(p, [self, i](const void*) { self->Return(i); });
    }
    return holds;
  }

  // Shutdown: waiters re-poll at once.
  void Wake() {
    absl::MutexLock l(&mu_);
    woken_ = true;
  }

 private:
  void Return(size_t i) {
    absl::MutexLock l(&mu_);
    free_.push_back(i);
  }

  const std::shared_ptr<DeviceBackend> backend_;
  char* const base_;
  const uint64_t slab_;
  const size_t count_;
  mutable absl::Mutex mu_;
  std::vector<size_t> free_ ABSL_GUARDED_BY(mu_);
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

// ---------------------------------------------------------------------------
// GpuStager
// ---------------------------------------------------------------------------

class GpuStager::Impl {
 public:
  Impl(std::shared_ptr<DeviceBackend> backend, const Options& options,
       std::shared_ptr<SlabPool> pool)
      : backend_(std::move(backend)),
        options_(options),
        pool_(std::move(pool)) {
    const size_t n = backend_->devices().size();
    queues_.resize(n);
    for (size_t d = 0; d < n; ++d) {
      workers_.emplace_back([this, d] { Work(static_cast<int>(d)); });
    }
  }
  ~Impl() { Shutdown(); }

  const std::vector<std::string>& devices() const {
    return backend_->devices();
  }
  absl::StatusOr<int> DeviceIndex(std::string_view pci) const {
    const std::string want = Lower(pci);
    const auto& devs = backend_->devices();
    for (size_t i = 0; i < devs.size(); ++i) {
      if (devs[i] == want) return static_cast<int>(i);
    }
    return absl::NotFoundError(
        fmt::format("GPU '{}' is not one of this daemon's devices [{}]", pci,
                    fmt::join(devs, ", ")));
  }
  uint64_t pool_bytes() const { return pool_->count() * pool_->slab_bytes(); }
  uint64_t pool_in_use() const { return pool_->in_use(); }
  uint64_t PoolBytesFor(uint64_t bytes) const {
    const uint64_t s = pool_->slab_bytes();
    return (bytes / s + (bytes % s != 0 ? 1 : 0)) * s;
  }

  void Stage(StageJob job, StageDone done) {
    int dev = 0;
    if (!job.buffers.empty()) {
      absl::StatusOr<int> d = DeviceIndex(job.buffers[0].device);
      if (!d.ok()) return std::move(done)(d.status());
      dev = *d;
    }
    {
      absl::MutexLock l(&mu_);
      if (!stopping_) {
        queues_[dev].push_back({std::move(job), std::move(done)});
        return;
      }
    }
    std::move(done)(absl::CancelledError("the daemon is shutting down"));
  }

  void Shutdown() {
    std::vector<Queued> dropped;
    {
      absl::MutexLock l(&mu_);
      if (stopping_) return;
      stopping_ = true;
      for (auto& q : queues_) {
        for (auto& j : q) dropped.push_back(std::move(j));
        q.clear();
      }
    }
    pool_->Wake();
    for (Queued& q : dropped) {
      std::move(q.done)(absl::CancelledError("the daemon is shutting down"));
    }
    for (std::thread& t : workers_) t.join();
    workers_.clear();
  }

 private:
  struct Queued {
    StageJob job;
    StageDone done;
  };
  // An opened handle, shared by the jobs that name it.
  struct OpenHandle {
    uint64_t ptr = 0;
    uint64_t size = 0;
    int refs = 0;
  };

  bool Stopping() const {
    absl::MutexLock l(&mu_);
    return stopping_;
  }

  void Work(int dev) {
    while (true) {
      Queued q;
      {
        absl::MutexLock l(&mu_);
        auto ready = [this, dev]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || !queues_[dev].empty();
        };
        mu_.Await(absl::Condition(&ready));
        if (queues_[dev].empty()) return;  // stopping
        q = std::move(queues_[dev].front());
        queues_[dev].pop_front();
      }
      std::move(q.done)(Run(q.job));
    }
  }

  // Steps 1–5 of gpu_stager.h.
  absl::StatusOr<StageResult> Run(const StageJob& job) {
    const absl::Time start = absl::Now();
    uint64_t total = 0;
    for (const StageCopy& c : job.copies) total += c.length;
    const uint64_t slab = pool_->slab_bytes();
    const size_t need = static_cast<size_t>(PoolBytesFor(total) / slab);
    if (need > pool_->count()) {
      return absl::ResourceExhaustedError(fmt::format(
          "{}: {} device bytes do not fit the pinned staging pool of {} bytes",
          job.what, total, pool_bytes()));
    }
    // 1. Pool room.
    std::vector<char*> slabs;
    ASSIGN_OR_RETURN(
        std::vector<std::shared_ptr<const void>> holds,
        pool_->Take(
            need,
            [&] { return Stopping() || (job.cancelled && job.cancelled()); },
            slabs));
    // 2. Handles.
    std::vector<std::pair<int, std::string>>
        keys;  // per buffer: (device, handle)
    std::vector<OpenHandle> opened;
    absl::Status s = OpenAll(job, keys, opened);
    // 3. Copies.
    StageResult result(job.copies.size());
    const int nstreams = backend_->streams_per_device();
    std::vector<std::vector<bool>> used(devices().size(),
                                        std::vector<bool>(nstreams, false));
    size_t next_stream = 0;
    size_t si = 0;     // current slab
    uint64_t pos = 0;  // its next free byte
    for (size_t i = 0; s.ok() && i < job.copies.size(); ++i) {
      const StageCopy& c = job.copies[i];
      const int dev = keys[c.buffer].first;
      uint64_t done = 0;
      while (done < c.length) {
        if (pos == slab) {
          ++si;
          pos = 0;
        }
        const uint64_t take =
            std::min({c.length - done, slab - pos, options_.chunk_bytes});
        const int stream = static_cast<int>(next_stream++ % nstreams);
        s = backend_->CopyAsync(dev, stream, slabs[si] + pos,
                                opened[c.buffer].ptr + c.offset + done, take);
        if (!s.ok()) {
          s = absl::InternalError(fmt::format("{}: {}", job.what, s.message()));
          break;
        }
        used[dev][stream] = true;
        result[i].push_back({slabs[si] + pos, take, holds[si]});
        pos += take;
        done += take;
      }
    }
    // 4. Every enqueued copy must finish before its slab can be reused, even
    // after an error.
    for (size_t d = 0; d < used.size(); ++d) {
      for (int st = 0; st < nstreams; ++st) {
        if (!used[d][st]) continue;
        if (absl::Status e = backend_->Synchronize(static_cast<int>(d), st);
            !e.ok() && s.ok()) {
          s = absl::InternalError(fmt::format("{}: {}", job.what, e.message()));
        }
      }
    }
    CloseAll(keys, opened);
    if (!s.ok()) return s;
    const double secs = absl::ToDoubleSeconds(absl::Now() - start);
    spdlog::debug(
        "{}: {} bytes from {} CUDA buffer(s) staged in {:.3f} s ({:.2f} GB/s)",
        job.what, total, job.buffers.size(), secs,
        secs > 0 ? total / secs / 1e9 : 0.0);
    return result;
  }

  absl::Status OpenAll(const StageJob& job,
                       std::vector<std::pair<int, std::string>>& keys,
                       std::vector<OpenHandle>& opened) {
    for (size_t b = 0; b < job.buffers.size(); ++b) {
      const CudaBufferDesc& desc = job.buffers[b];
      absl::StatusOr<int> dev = DeviceIndex(desc.device);
      if (!dev.ok()) {
        return absl::InvalidArgumentError(fmt::format(
            "{}: CUDA buffer {}: {}", job.what, b, dev.status().message()));
      }
      std::pair<int, std::string> key{*dev, desc.ipc_handle};
      absl::StatusOr<OpenHandle> h = Acquire(key);
      if (!h.ok()) {
        return absl::Status(h.status().code(),
                            fmt::format("{}: CUDA buffer {}: {}", job.what, b,
                                        h.status().message()));
      }
      keys.push_back(std::move(key));
      opened.push_back(*h);
      if (h->size < desc.size) {
        return absl::InvalidArgumentError(fmt::format(
            "{}: CUDA buffer {} maps {} bytes, fewer than the claimed {}",
            job.what, b, h->size, desc.size));
      }
    }
    for (size_t i = 0; i < job.copies.size(); ++i) {
      const StageCopy& c = job.copies[i];
      if (c.buffer >= opened.size() || c.offset > opened[c.buffer].size ||
          c.length > opened[c.buffer].size - c.offset) {
        return absl::InvalidArgumentError(fmt::format(
            "{}: copy {} [{}, +{}) is outside CUDA buffer {} ({} bytes mapped)",
            job.what, i, c.offset, c.length, c.buffer,
            c.buffer < opened.size() ? opened[c.buffer].size : 0));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<OpenHandle> Acquire(const std::pair<int, std::string>& key) {
    absl::MutexLock l(&handles_mu_);
    auto it = handles_.find(key);
    if (it == handles_.end()) {
      ASSIGN_OR_RETURN(DeviceBackend::Opened o,
                       backend_->Open(key.first, key.second));
      it = handles_.emplace(key, OpenHandle{o.ptr, o.size, 0}).first;
    }
    ++it->second.refs;
    return it->second;
  }

  // 4b. Handles are closed as soon as no running job needs them.
  void CloseAll(const std::vector<std::pair<int, std::string>>& keys,
                const std::vector<OpenHandle>& opened) {
    absl::MutexLock l(&handles_mu_);
    for (size_t b = 0; b < keys.size(); ++b) {
      auto it = handles_.find(keys[b]);
      if (it == handles_.end() || --it->second.refs > 0) continue;
      if (absl::Status s = backend_->Close(keys[b].first, opened[b].ptr);
          !s.ok()) {
        spdlog::warn("closing a CUDA IPC handle: {}", s);
      }
      handles_.erase(it);
    }
  }

  const std::shared_ptr<DeviceBackend> backend_;
  const Options options_;
  const std::shared_ptr<SlabPool> pool_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::deque<Queued>> queues_ ABSL_GUARDED_BY(mu_);  // per device
  std::vector<std::thread> workers_;

  absl::Mutex handles_mu_;
  std::map<std::pair<int, std::string>, OpenHandle> handles_
      ABSL_GUARDED_BY(handles_mu_);
};

absl::StatusOr<std::shared_ptr<DeviceBackend>> OpenCudaBackend(
    std::string_view library, int streams) {
  return CudaBackend::Open(library, streams);
}

absl::StatusOr<std::unique_ptr<GpuStager>> GpuStager::Create(
    std::shared_ptr<DeviceBackend> backend, const Options& options) {
  if (backend == nullptr || backend->devices().empty()) {
    return absl::FailedPreconditionError("no CUDA device to stage from");
  }
  if (options.slab_bytes == 0 || options.chunk_bytes == 0) {
    return absl::InvalidArgumentError(
        "pinned slab and chunk sizes must be positive");
  }
  const uint64_t count = options.pinned_bytes / options.slab_bytes;
  if (count == 0) {
    return absl::InvalidArgumentError(fmt::format(
        "pinned_staging_bytes {} is smaller than one slab ({} bytes)",
        options.pinned_bytes, options.slab_bytes));
  }
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(char* base,
                   backend->AllocPinned(count * options.slab_bytes));
  spdlog::info(
      "pinned staging pool: {} bytes ({} slabs of {} bytes) allocated in {}",
      count * options.slab_bytes, count, options.slab_bytes,
      absl::FormatDuration(absl::Now() - start));
  auto pool =
      std::make_shared<SlabPool>(backend, base, options.slab_bytes, count);
  return std::unique_ptr<GpuStager>(new GpuStager(
      std::make_unique<Impl>(std::move(backend), options, std::move(pool))));
}

GpuStager::GpuStager(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuStager::~GpuStager() = default;
const std::vector<std::string>& GpuStager::devices() const {
  return impl_->devices();
}
absl::StatusOr<int> GpuStager::DeviceIndex(std::string_view pci) const {
  return impl_->DeviceIndex(pci);
}
uint64_t GpuStager::pool_bytes() const { return impl_->pool_bytes(); }
uint64_t GpuStager::pool_in_use() const { return impl_->pool_in_use(); }
uint64_t GpuStager::PoolBytesFor(uint64_t bytes) const {
  return impl_->PoolBytesFor(bytes);
}
void GpuStager::Stage(StageJob job, StageDone done) {
  impl_->Stage(std::move(job), std::move(done));
}
void GpuStager::Shutdown() { impl_->Shutdown(); }

}  // namespace ckptd::daemon
