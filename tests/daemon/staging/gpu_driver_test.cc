// Copyright 2026 The ckptd Authors.
//
// The CUDA driver backend on a real GPU (ctest label "gpu"; skipped with the
// reason where libcuda.so.1 or a device is missing): devices and their PCI
// bus ids, the pinned pool, and device-to-host copies on the daemon's own
// streams from memory this test allocates with the driver API. IPC handles
// cannot be opened in the process that made them, so the end-to-end IPC
// path is tested from PyTorch trainers in tests/gpu/.
#include <dlfcn.h>

#include <cstring>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "daemon/staging/cuda_driver.h"
#include "daemon/staging/gpu_stager.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace ckptd::daemon {
namespace {

class GpuDriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::shared_ptr<DeviceBackend>> b =
        OpenCudaBackend("libcuda.so.1", 2);
    if (!b.ok())
      GTEST_SKIP() << "no usable CUDA driver/GPU here: " << b.status();
    backend_ = *std::move(b);
    lib_ = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    ASSERT_NE(lib_, nullptr);
    mem_alloc_ = reinterpret_cast<MemAlloc>(dlsym(lib_, "cuMemAlloc_v2"));
    mem_free_ = reinterpret_cast<MemFree>(dlsym(lib_, "cuMemFree_v2"));
    memcpy_htod_ = reinterpret_cast<MemcpyHtoD>(dlsym(lib_, "cuMemcpyHtoD_v2"));
    ASSERT_TRUE(mem_alloc_ && mem_free_ && memcpy_htod_);
  }

  using MemAlloc = int (*)(uint64_t*, size_t);
  using MemFree = int (*)(uint64_t);
  using MemcpyHtoD = int (*)(uint64_t, const void*, size_t);
  std::shared_ptr<DeviceBackend> backend_;
  void* lib_ = nullptr;
  MemAlloc mem_alloc_ = nullptr;
  MemFree mem_free_ = nullptr;
  MemcpyHtoD memcpy_htod_ = nullptr;
};

TEST_F(GpuDriverTest, DevicesHavePciBusIds) {
  ASSERT_FALSE(backend_->devices().empty());
  const std::regex pci("[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-9a-f]");
  for (const std::string& d : backend_->devices()) {
    EXPECT_TRUE(std::regex_match(d, pci)) << d;
  }
}

TEST_F(GpuDriverTest, StagesDeviceMemoryIntoThePinnedPool) {
  GpuStager::Options o;
  o.pinned_bytes = 256 << 20;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GpuStager> stager,
                       GpuStager::Create(backend_, o));
  // The backend's streams copy from device memory of device 0's primary
  // context (the stager does the same from opened IPC handles).
  const size_t n = 96 << 20;
  std::vector<char> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<char>((i * 131) >> 3);
  ASSERT_OK(backend_->Synchronize(0, 0));  // makes device 0's context current
  uint64_t dptr = 0;
  ASSERT_EQ(mem_alloc_(&dptr, n), 0);
  ASSERT_EQ(memcpy_htod_(dptr, host.data(), n), 0);
  ASSERT_OK_AND_ASSIGN(char* pinned, backend_->AllocPinned(n));
  const absl::Time start = absl::Now();
  for (size_t off = 0; off < n; off += 16 << 20) {
    ASSERT_OK(backend_->CopyAsync(0, static_cast<int>((off >> 24) % 2),
                                  pinned + off, dptr + off, 16 << 20));
  }
  ASSERT_OK(backend_->Synchronize(0, 0));
  ASSERT_OK(backend_->Synchronize(0, 1));
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  EXPECT_EQ(std::memcmp(pinned, host.data(), n), 0);
  std::printf("D2H into pinned memory on 2 streams: %.2f GB/s\n",
              n / secs / 1e9);
  backend_->FreePinned(pinned);
  EXPECT_EQ(mem_free_(dptr), 0);
  // A garbage handle is refused, not a crash.
  absl::StatusOr<DeviceBackend::Opened> bad =
      backend_->Open(0, std::string(64, '\x5a'));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckptd::daemon
