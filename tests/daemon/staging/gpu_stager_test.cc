// Copyright 2026 The ckptd Authors.
//
// The GPU staging path without a GPU: the CUDA driver loader against the
// toolkit's link stub (every symbol the daemon resolves must exist in a real
// libcuda) and against a missing library; GpuStager over a host-memory
// device (slab packing, handle cache, bounds, faults, backpressure,
// cancellation, shutdown); and CheckpointManager saving device extents
// through it to a committed checkpoint read back by the format library, or
// refusing them with the reason when CUDA is off. The same paths against a
// real GPU: tests/daemon/staging/gpu_driver_test.cc (label gpu) and tests/gpu/
// (pytest).
#include "daemon/staging/gpu_stager.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "daemon/config.h"
#include "daemon/save/checkpoint_manager.h"
#include "daemon/staging/cuda_driver.h"
#include "format/checkpoint/checkpoint_reader.h"
#include "format/checkpoint/verify.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/manager_util.h"
#include "tests/testing/test_util.h"

namespace ckptd::daemon {
namespace {

using ::ckptd::testing::TempDir;
using ::testing::HasSubstr;

// ---------------------------------------------------------------------------
// The driver loader
// ---------------------------------------------------------------------------

TEST(CudaDriverTest, MissingLibraryIsAClearPrecondition) {
  absl::StatusOr<std::shared_ptr<const cuda::Driver>> d =
      cuda::LoadDriver("libcuda-does-not-exist.so.1");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(d.status().message(), HasSubstr("libcuda-does-not-exist.so.1"));
  EXPECT_THAT(d.status().message(), HasSubstr("no NVIDIA driver"));
}

TEST(CudaDriverTest, EverySymbolResolvesInTheToolkitStub) {
  const char* stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
  if (::access(stub, R_OK) != 0)
    GTEST_SKIP() << "no CUDA toolkit stub at " << stub;
  // Symbols resolve (else: "lacks ..."), and cuInit answers the stub's own
  // error, rendered by the stub's cuGetErrorName.
  absl::StatusOr<std::shared_ptr<const cuda::Driver>> d =
      cuda::LoadDriver(stub);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(d.status().message(), ::testing::Not(HasSubstr("lacks")));
  EXPECT_THAT(d.status().message(), HasSubstr("cuInit"));
  EXPECT_THAT(d.status().message(),
              HasSubstr("(34)"));  // CUDA_ERROR_STUB_LIBRARY
}

// ---------------------------------------------------------------------------
// A host-memory device
// ---------------------------------------------------------------------------

constexpr char kDevice[] = "0000:0a:00.0";

class FakeDevice final : public DeviceBackend {
 public:
  // A "device allocation" of `bytes` bytes, filled with a pattern of `seed`;
  // returns its 64-byte IPC handle.
  std::string Allocate(uint64_t bytes, int seed) {
    absl::MutexLock l(&mu_);
    std::string handle(64, '\0');
    const std::string tag = "fake-ipc-" + std::to_string(next_++);
    std::memcpy(handle.data(), tag.data(), tag.size());
    auto& mem = mem_[handle];
    mem.resize(bytes);
    for (uint64_t i = 0; i < bytes; ++i)
      mem[i] = static_cast<char>((i * 7 + seed) & 0xff);
    return handle;
  }
  std::string Bytes(const std::string& handle, uint64_t off, uint64_t len) {
    absl::MutexLock l(&mu_);
    return std::string(mem_[handle].data() + off, len);
  }

  const std::vector<std::string>& devices() const override { return devices_; }
  int streams_per_device() const override { return 2; }
  absl::StatusOr<char*> AllocPinned(uint64_t bytes) override {
    void* p = std::aligned_alloc(4096, bytes);
    if (p == nullptr) return absl::ResourceExhaustedError("no memory");
    return static_cast<char*>(p);
  }
  void FreePinned(char* p) override { std::free(p); }
  absl::StatusOr<Opened> Open(int device, std::string_view handle) override {
    absl::MutexLock l(&mu_);
    ++opens_;
    auto it = mem_.find(std::string(handle));
    if (it == mem_.end() || fail_open_) {
      return absl::InvalidArgumentError(
          "cuIpcOpenMemHandle: CUDA_ERROR_INVALID_VALUE (1)");
    }
    ++open_now_;
    uint64_t size = it->second.size();
    if (short_map_ > 0) size -= std::min(size, short_map_);
    return Opened{reinterpret_cast<uint64_t>(it->second.data()), size};
  }
  absl::Status Close(int, uint64_t) override {
    absl::MutexLock l(&mu_);
    --open_now_;
    return absl::OkStatus();
  }
  absl::Status CopyAsync(int, int stream, char* dst, uint64_t src,
                         uint64_t len) override {
    absl::MutexLock l(&mu_);
    if (fail_copy_after_ >= 0 && copies_ >= fail_copy_after_) {
      return absl::InternalError(
          "cuMemcpyDtoHAsync: CUDA_ERROR_ILLEGAL_ADDRESS (700)");
    }
    ++copies_;
    max_copy_ = std::max(max_copy_, len);
    pending_[stream] += 1;
    std::memcpy(dst, reinterpret_cast<const char*>(src), len);
    return absl::OkStatus();
  }
  absl::Status Synchronize(int, int stream) override {
    absl::MutexLock l(&mu_);
    pending_[stream] = 0;
    ++syncs_;
    return absl::OkStatus();
  }

  int opens() {
    absl::MutexLock l(&mu_);
    return opens_;
  }
  int open_now() {
    absl::MutexLock l(&mu_);
    return open_now_;
  }
  int unsynced() {
    absl::MutexLock l(&mu_);
    int n = 0;
    for (auto& [s, c] : pending_) n += c;
    return n;
  }
  uint64_t max_copy() {
    absl::MutexLock l(&mu_);
    return max_copy_;
  }
  void set_fail_open(bool v) {
    absl::MutexLock l(&mu_);
    fail_open_ = v;
  }
  void set_fail_copy_after(int n) {
    absl::MutexLock l(&mu_);
    fail_copy_after_ = n;
    copies_ = 0;
  }
  void set_short_map(uint64_t n) {
    absl::MutexLock l(&mu_);
    short_map_ = n;
  }

 private:
  const std::vector<std::string> devices_{kDevice};
  absl::Mutex mu_;
  int next_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::vector<char>> mem_ ABSL_GUARDED_BY(mu_);
  int opens_ ABSL_GUARDED_BY(mu_) = 0;
  int open_now_ ABSL_GUARDED_BY(mu_) = 0;
  int copies_ ABSL_GUARDED_BY(mu_) = 0;
  int syncs_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t max_copy_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, int> pending_ ABSL_GUARDED_BY(mu_);
  bool fail_open_ ABSL_GUARDED_BY(mu_) = false;
  int fail_copy_after_ ABSL_GUARDED_BY(mu_) = -1;
  uint64_t short_map_ ABSL_GUARDED_BY(mu_) = 0;
};

absl::StatusOr<StageResult> StageSync(GpuStager& stager, StageJob job) {
  absl::Notification n;
  absl::StatusOr<StageResult> out;
  stager.Stage(std::move(job), [&](absl::StatusOr<StageResult> r) {
    out = std::move(r);
    n.Notify();
  });
  n.WaitForNotification();
  return out;
}

std::string Join(const std::vector<StagedPiece>& pieces) {
  std::string s;
  for (const StagedPiece& p : pieces) s.append(p.data, p.length);
  return s;
}

class StagerTest : public ::testing::Test {
 protected:
  void Make(uint64_t pool, uint64_t slab = 1 << 20,
            uint64_t chunk = 256 << 10) {
    GpuStager::Options o;
    o.pinned_bytes = pool;
    o.slab_bytes = slab;
    o.chunk_bytes = chunk;
    auto s = GpuStager::Create(dev_, o);
    ASSERT_TRUE(s.ok()) << s.status();
    stager_ = *std::move(s);
  }
  std::shared_ptr<FakeDevice> dev_ = std::make_shared<FakeDevice>();
  std::unique_ptr<GpuStager> stager_;
};

TEST_F(StagerTest, CopiesPackIntoSlabsAndHandlesCloseAfterTheJob) {
  Make(8 << 20);
  EXPECT_EQ(stager_->pool_bytes(), 8u << 20);
  const std::string a = dev_->Allocate(3 << 20, 1);
  const std::string b = dev_->Allocate(100, 2);
  StageJob job;
  job.what = "test";
  // Buffer 0 and 2 are the same allocation (views of one storage): opened once.
  job.buffers = {
      {a, kDevice, 3 << 20}, {b, "0000:0A:00.0", 100}, {a, kDevice, 3 << 20}};
  job.copies = {
      {0, 5, (1 << 20) + 17}, {1, 0, 100}, {2, 1 << 20, (2 << 20) - 3}};
  ASSERT_OK_AND_ASSIGN(StageResult r, StageSync(*stager_, job));
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(Join(r[0]), dev_->Bytes(a, 5, (1 << 20) + 17));
  EXPECT_EQ(Join(r[1]), dev_->Bytes(b, 0, 100));
  EXPECT_EQ(Join(r[2]), dev_->Bytes(a, 1 << 20, (2 << 20) - 3));
  // Packed: 3 MiB + 114 bytes take 4 slabs; no copy crosses a slab or
  // exceeds the chunk size.
  EXPECT_EQ(stager_->pool_in_use(), 4u << 20);
  EXPECT_LE(dev_->max_copy(), 256u << 10);
  for (const auto& pieces : r) {
    for (const StagedPiece& p : pieces) EXPECT_TRUE(p.hold != nullptr);
  }
  EXPECT_EQ(dev_->opens(), 2);
  EXPECT_EQ(dev_->open_now(), 0);  // closed before the answer
  EXPECT_EQ(dev_->unsynced(), 0);
  r.clear();  // the writer is done with the pieces: slabs return
  EXPECT_EQ(stager_->pool_in_use(), 0u);
}

TEST_F(StagerTest, BadHandlesAndRangesAreInvalidArguments) {
  Make(4 << 20);
  const std::string a = dev_->Allocate(4096, 1);
  StageJob job;
  job.what = "ckpt x rank 1";
  job.buffers = {{a, kDevice, 4096}};
  job.copies = {{0, 4000, 200}};  // past the mapped end
  absl::StatusOr<StageResult> r = StageSync(*stager_, job);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("outside CUDA buffer 0"));
  EXPECT_THAT(r.status().message(), HasSubstr("ckpt x rank 1"));

  dev_->set_short_map(100);  // the handle maps less than the client claims
  job.copies = {{0, 0, 10}};
  r = StageSync(*stager_, job);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("fewer than the claimed 4096"));
  dev_->set_short_map(0);

  dev_->set_fail_open(true);
  r = StageSync(*stager_, job);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("cuIpcOpenMemHandle"));
  dev_->set_fail_open(false);

  job.buffers[0].device = "0000:ff:00.0";
  r = StageSync(*stager_, job);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(dev_->open_now(), 0);
  EXPECT_EQ(stager_->pool_in_use(), 0u);
}

TEST_F(StagerTest, AFailedCopySynchronizesBeforeFreeingItsSlabs) {
  Make(4 << 20);
  const std::string a = dev_->Allocate(2 << 20, 1);
  dev_->set_fail_copy_after(3);
  StageJob job{"t", {{a, kDevice, 2 << 20}}, {{0, 0, 2 << 20}}, nullptr};
  absl::StatusOr<StageResult> r = StageSync(*stager_, job);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(r.status().message(), HasSubstr("ILLEGAL_ADDRESS"));
  EXPECT_EQ(dev_->unsynced(), 0);  // the 3 enqueued copies were waited for
  EXPECT_EQ(dev_->open_now(), 0);
  EXPECT_EQ(stager_->pool_in_use(), 0u);
  dev_->set_fail_copy_after(-1);
  EXPECT_TRUE(StageSync(*stager_, job).ok());
}

TEST_F(StagerTest, AJobLargerThanThePoolIsRefused) {
  Make(2 << 20);
  const std::string a = dev_->Allocate(3 << 20, 1);
  absl::StatusOr<StageResult> r = StageSync(
      *stager_,
      {"t", {{a, kDevice, 3 << 20}}, {{0, 0, (2 << 20) + 1}}, nullptr});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(stager_->PoolBytesFor((2 << 20) + 1), 3u << 20);
}

TEST_F(StagerTest, AJobWaitsForPoolRoomAndCanBeCancelledWhileWaiting) {
  Make(2 << 20);
  const std::string a = dev_->Allocate(2 << 20, 1);
  StageJob job{"t", {{a, kDevice, 2 << 20}}, {{0, 0, 2 << 20}}, nullptr};
  ASSERT_OK_AND_ASSIGN(StageResult held,
                       StageSync(*stager_, job));  // fills the pool
  absl::Notification second_done;
  absl::StatusOr<StageResult> second;
  stager_->Stage(job, [&](absl::StatusOr<StageResult> r) {
    second = std::move(r);
    second_done.Notify();
  });
  EXPECT_FALSE(
      second_done.WaitForNotificationWithTimeout(absl::Milliseconds(300)));
  held.clear();  // written: the slabs return and the waiting job proceeds
  ASSERT_TRUE(second_done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_OK(second.status());
  EXPECT_EQ(Join((*second)[0]), dev_->Bytes(a, 0, 2 << 20));

  // The pool is full again; a cancelled job stops waiting.
  std::atomic<bool> cancel{false};
  StageJob third = job;
  third.cancelled = [&] { return cancel.load(); };
  absl::Notification third_done;
  absl::Status third_status;
  stager_->Stage(third, [&](absl::StatusOr<StageResult> r) {
    third_status = r.status();
    third_done.Notify();
  });
  EXPECT_FALSE(
      third_done.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  cancel = true;
  ASSERT_TRUE(third_done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(third_status.code(), absl::StatusCode::kCancelled);
}

TEST_F(StagerTest, ShutdownAnswersEveryJob) {
  Make(1 << 20);
  const std::string a = dev_->Allocate(1 << 20, 1);
  StageJob job{"t", {{a, kDevice, 1 << 20}}, {{0, 0, 1 << 20}}, nullptr};
  ASSERT_OK_AND_ASSIGN(StageResult held,
                       StageSync(*stager_, job));  // pool full
  std::atomic<int> cancelled{0};
  absl::Notification all;
  for (int i = 0; i < 3; ++i) {
    stager_->Stage(job, [&](absl::StatusOr<StageResult> r) {
      if (absl::IsCancelled(r.status())) ++cancelled;
      if (cancelled == 3) all.Notify();
    });
  }
  stager_->Shutdown();
  ASSERT_TRUE(all.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(cancelled, 3);
  held.clear();  // pieces outlive the stager's workers
  stager_.reset();
}

// ---------------------------------------------------------------------------
// CheckpointManager with device extents
// ---------------------------------------------------------------------------

class ManagerGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.checkpoint_roots = std::vector<std::string>{dir_.Join("ck")};
    options_.shm_dir = dir_.Join("shm");
    options_.state_dir = dir_.Join("state");
    options_.staging_budget = 64 << 20;
    options_.pinned_staging_bytes = 8 << 20;
    options_.device_backend = dev_;
    options_.env = Env::Default();
    options_.stage_timeout = absl::Seconds(20);
  }
  void Start() {
    ASSERT_OK(FinalizeOptions(&options_));
    ASSERT_OK_AND_ASSIGN(manager_, CheckpointManager::Create(options_));
  }

  // A rank whose "w" float32 [rows, 64] lives in a device allocation (at
  // offset 256 of it) and whose "b" [16] is a view at offset 0 of the same
  // allocation; batches of at most `batch_bytes` device bytes.
  std::vector<SaveBatch> DeviceRank(const std::string& id, int64_t rows,
                                    uint64_t batch_bytes, std::string* handle) {
    const uint64_t w_bytes = rows * 64 * 4;
    *handle = dev_->Allocate(256 + w_bytes, 0);
    // Overwrite the fake allocation with float values via a host round trip:
    // the fake's pattern is bytes; recompute expected values from it instead.
    SaveBatch first;
    first.checkpoint_id = id;
    first.world_size = 1;
    format::ItemDesc wd;
    wd.fqn = "w";
    wd.global_shape = wd.chunk_sizes = {rows, 64};
    wd.chunk_offsets = {0, 0};
    format::ItemDesc bd;
    bd.fqn = "b";
    bd.global_shape = bd.chunk_sizes = {16};
    bd.chunk_offsets = {0};
    first.items = {wd, bd};
    first.item_nbytes = {w_bytes, 64};
    std::vector<SaveBatch> out;
    const CudaBufferDesc buf{*handle, kDevice, 256 + w_bytes};
    // Extents in index order, cut at batch_bytes.
    struct Piece {
      uint32_t item;
      uint64_t off, src, len;
    };
    std::vector<Piece> pieces;
    for (uint64_t o = 0; o < w_bytes; o += batch_bytes) {
      pieces.push_back({0, o, 256 + o, std::min(batch_bytes, w_bytes - o)});
    }
    pieces.push_back({1, 0, 0, 64});
    SaveBatch cur = first;
    uint64_t in_cur = 0;
    for (const Piece& p : pieces) {
      if (in_cur + p.len > batch_bytes && !cur.extents.empty()) {
        out.push_back(std::move(cur));
        cur = SaveBatch{};
        cur.checkpoint_id = id;
        cur.world_size = 1;
        cur.sequence = static_cast<uint32_t>(out.size());
        in_cur = 0;
      }
      if (cur.cuda_buffers.empty()) cur.cuda_buffers = {buf};
      cur.extents.push_back({p.item, p.off, p.src, p.len, 1});
      in_cur += p.len;
    }
    cur.last = true;
    out.push_back(std::move(cur));
    return out;
  }

  absl::StatusOr<SaveReply> SaveSync(SaveBatch batch) {
    return ckptd::testing::SaveSync(*manager_, std::move(batch));
  }
  absl::StatusOr<CheckpointInfo> WaitFinal(const std::string& id) {
    return ckptd::testing::WaitFinal(*manager_, id);
  }
  // The checkpoint holds the fake allocation's bytes.
  void ExpectContent(const std::string& id, const std::string& handle,
                     int64_t rows) {
    const std::string dir = dir_.Join("ck/" + id);
    ASSERT_OK_AND_ASSIGN(format::VerifyReport report,
                         format::VerifyCheckpoint(dir));
    ASSERT_TRUE(report.ok()) << report.problems[0];
    ASSERT_OK_AND_ASSIGN(auto reader, format::CheckpointReader::Open(dir));
    std::string w(rows * 64 * 4, '\0'), b(64, '\0');
    format::TensorRequest rw{
        "w", {0, 0}, {format::DType::kFloat32, {rows, 64}, {}, w.data()}};
    format::TensorRequest rb{
        "b", {0}, {format::DType::kFloat32, {16}, {}, b.data()}};
    ASSERT_OK(reader->ReadTensors({rw, rb}));
    EXPECT_TRUE(w == dev_->Bytes(handle, 256, w.size()));
    EXPECT_TRUE(b == dev_->Bytes(handle, 0, 64));
  }

  TempDir dir_;
  std::shared_ptr<FakeDevice> dev_ = std::make_shared<FakeDevice>();
  DaemonOptions options_;
  std::unique_ptr<CheckpointManager> manager_;
};

TEST_F(ManagerGpuTest, DeviceExtentsCommitAndStreamThroughASmallPool) {
  Start();
  const CudaInfo info = manager_->cuda_info();
  ASSERT_TRUE(info.available) << info.unavailable_reason;
  EXPECT_EQ(info.pinned_bytes, 8u << 20);
  EXPECT_THAT(info.devices, ::testing::ElementsAre(kDevice));
  // 24 MiB of device bytes through an 8 MiB pool, in 4 MiB batches: later
  // batches wait for the writer to free slabs.
  std::string handle;
  std::vector<SaveBatch> batches =
      DeviceRank("job/gpu", (24 << 20) / 256, 4 << 20, &handle);
  ASSERT_GT(batches.size(), 2u);
  for (size_t i = 0; i < batches.size(); ++i) {
    ASSERT_OK_AND_ASSIGN(SaveReply r, SaveSync(batches[i]));
    EXPECT_EQ(r.state,
              i + 1 == batches.size() ? State::kStaged : State::kStaging);
  }
  EXPECT_EQ(dev_->open_now(), 0);  // handles closed once staged
  ASSERT_OK_AND_ASSIGN(CheckpointInfo done, WaitFinal("job/gpu"));
  ASSERT_EQ(done.state, State::kCommitted) << done.error;
  ExpectContent("job/gpu", handle, (24 << 20) / 256);
  EXPECT_EQ(manager_->cuda_info().pinned_in_use, 0u);
  EXPECT_EQ(manager_->staged_bytes_in_use(), 0u);
}

TEST_F(ManagerGpuTest, BadDeviceRequestsFailPreciselyAndTheDaemonGoesOn) {
  Start();
  std::string handle;
  // Out of the claimed buffer.
  std::vector<SaveBatch> b = DeviceRank("job/bad1", 16, 1 << 20, &handle);
  b[0].extents[0].arena_offset = b[0].cuda_buffers[0].size - 8;
  absl::StatusOr<SaveReply> r = SaveSync(b[0]);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("outside CUDA buffer 1"));
  // Unknown buffer index, short handle, foreign device.
  b = DeviceRank("job/bad2", 16, 1 << 20, &handle);
  b[0].extents[0].cuda_buffer = 2;
  EXPECT_THAT(SaveSync(b[0]).status().message(),
              HasSubstr("names CUDA buffer 2 of 1"));
  b = DeviceRank("job/bad3", 16, 1 << 20, &handle);
  b[0].cuda_buffers[0].ipc_handle.resize(10);
  EXPECT_THAT(SaveSync(b[0]).status().message(),
              HasSubstr("10-byte IPC handle"));
  b = DeviceRank("job/bad4", 16, 1 << 20, &handle);
  b[0].cuda_buffers[0].device = "0000:99:00.0";
  EXPECT_THAT(SaveSync(b[0]).status().message(),
              HasSubstr("not one of this daemon's devices"));
  // A handle that does not open: the checkpoint fails with the stager's
  // error, after validation passed.
  b = DeviceRank("job/bad5", 16, 1 << 20, &handle);
  dev_->set_fail_open(true);
  r = SaveSync(b[0]);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("cuIpcOpenMemHandle"));
  ASSERT_OK_AND_ASSIGN(CheckpointInfo failed, WaitFinal("job/bad5"));
  EXPECT_EQ(failed.state, State::kFailed);
  dev_->set_fail_open(false);
  // More device bytes in one batch than the pool holds.
  b = DeviceRank("job/bad6", 9 * 1024 * 4, 16 << 20, &handle);
  r = SaveSync(b[0]);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(), HasSubstr("pinned_staging_bytes"));
  // The daemon goes on: a good save commits.
  b = DeviceRank("job/good", 16, 1 << 20, &handle);
  for (SaveBatch& x : b) ASSERT_OK(SaveSync(x).status());
  ASSERT_OK_AND_ASSIGN(CheckpointInfo ok, WaitFinal("job/good"));
  EXPECT_EQ(ok.state, State::kCommitted) << ok.error;
  ExpectContent("job/good", handle, 16);
  EXPECT_EQ(dev_->open_now(), 0);
  EXPECT_EQ(manager_->cuda_info().pinned_in_use, 0u);
}

TEST_F(ManagerGpuTest, CancelWhileStagingReleasesThePool) {
  options_.pinned_staging_bytes = 8 << 20;
  Start();
  std::string handle;
  std::vector<SaveBatch> b =
      DeviceRank("job/cancel", 8 * 1024 * 4, 8 << 20, &handle);
  ASSERT_OK(SaveSync(b[0]).status());  // fills the pool; the writer drains it
  ASSERT_OK(manager_->Cancel("job/cancel", "test").status());
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, WaitFinal("job/cancel"));
  EXPECT_EQ(info.state, State::kCancelled);
  // Every slab comes back once the writer let go.
  for (int i = 0; i < 100 && manager_->cuda_info().pinned_in_use != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(manager_->cuda_info().pinned_in_use, 0u);
  EXPECT_EQ(dev_->open_now(), 0);
}

TEST_F(ManagerGpuTest, WithoutCudaDeviceExtentsAreRefusedWithTheReason) {
  options_.cuda = "off";
  Start();
  EXPECT_FALSE(manager_->cuda_info().available);
  EXPECT_THAT(manager_->cuda_info().unavailable_reason, HasSubstr("cuda=off"));
  std::string handle;
  std::vector<SaveBatch> b = DeviceRank("job/nocuda", 16, 1 << 20, &handle);
  absl::StatusOr<SaveReply> r = SaveSync(b[0]);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("does not stage CUDA tensors"));
  EXPECT_THAT(r.status().message(), HasSubstr("cuda=off"));
}

TEST_F(ManagerGpuTest, CudaOnWithoutADriverFailsStartUp) {
  options_.cuda = "on";
  options_.device_backend = nullptr;
  options_.cuda_library = "libcuda-not-here.so.1";
  ASSERT_OK(FinalizeOptions(&options_));
  absl::StatusOr<std::unique_ptr<CheckpointManager>> m =
      CheckpointManager::Create(options_);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("cuda=on"));
  EXPECT_THAT(m.status().message(), HasSubstr("libcuda-not-here.so.1"));
  // auto: the daemon starts and says why there is no GPU path.
  options_.cuda = "auto";
  ASSERT_OK_AND_ASSIGN(manager_, CheckpointManager::Create(options_));
  EXPECT_FALSE(manager_->cuda_info().available);
  EXPECT_THAT(manager_->cuda_info().unavailable_reason,
              HasSubstr("libcuda-not-here.so.1"));
}

}  // namespace
}  // namespace ckptd::daemon
