// Copyright 2026 The ckptd Authors.
//
// The CUDA driver API, loaded at run time (dlopen of libcuda.so.1), so that
// one daemon binary runs on every node: with a GPU it stages CUDA IPC
// handles, without one it serves host (shared-memory) saves and rejects
// device extents with a clear error. Only the handful of driver calls the
// stager needs are declared here (their ABI is stable: the versioned symbol
// names cuda.h maps them to, e.g. cuIpcOpenMemHandle → cuIpcOpenMemHandle_v2);
// no CUDA header is needed to build.
#ifndef CKPTD_DAEMON_STAGING_CUDA_DRIVER_H_
#define CKPTD_DAEMON_STAGING_CUDA_DRIVER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckptd::daemon::cuda {

// Driver API types (cuda.h), as the ABI defines them.
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;  // NOLINT(runtime/int): cuda.h's type
using CUcontext = struct CUctx_st*;
using CUstream = struct CUstream_st*;
inline constexpr size_t kIpcHandleSize = 64;
struct CUipcMemHandle {
  char reserved[kIpcHandleSize];
};

inline constexpr CUresult kSuccess = 0;
inline constexpr CUresult kErrorStubLibrary = 34;
inline constexpr CUresult kErrorNoDevice = 100;
inline constexpr unsigned kIpcMemLazyEnablePeerAccess = 0x1;
inline constexpr unsigned kMemHostAllocPortable = 0x1;
inline constexpr unsigned kStreamNonBlocking = 0x1;

// The loaded driver: function pointers resolved by dlsym. Immutable after
// Load; the functions themselves are thread-safe (the driver's contract).
struct Driver {
  CUresult (*Init)(unsigned flags) = nullptr;
  CUresult (*DriverGetVersion)(int* version) = nullptr;
  CUresult (*GetErrorName)(CUresult error, const char** name) = nullptr;
  CUresult (*GetErrorString)(CUresult error, const char** text) = nullptr;
  CUresult (*DeviceGetCount)(int* count) = nullptr;
  CUresult (*DeviceGet)(CUdevice* device, int ordinal) = nullptr;
  CUresult (*DeviceGetPCIBusId)(char* bus_id, int len,
                                CUdevice device) = nullptr;
  CUresult (*DevicePrimaryCtxRetain)(CUcontext* ctx, CUdevice device) = nullptr;
  CUresult (*DevicePrimaryCtxRelease)(CUdevice device) = nullptr;
  CUresult (*CtxSetCurrent)(CUcontext ctx) = nullptr;
  CUresult (*IpcOpenMemHandle)(CUdeviceptr* ptr, CUipcMemHandle handle,
                               unsigned flags) = nullptr;
  CUresult (*IpcCloseMemHandle)(CUdeviceptr ptr) = nullptr;
  CUresult (*MemGetAddressRange)(CUdeviceptr* base, size_t* size,
                                 CUdeviceptr ptr) = nullptr;
  CUresult (*MemHostAlloc)(void** ptr, size_t bytes, unsigned flags) = nullptr;
  CUresult (*MemFreeHost)(void* ptr) = nullptr;
  CUresult (*MemcpyDtoHAsync)(void* dst, CUdeviceptr src, size_t bytes,
                              CUstream stream) = nullptr;
  CUresult (*StreamCreate)(CUstream* stream, unsigned flags) = nullptr;
  CUresult (*StreamDestroy)(CUstream stream) = nullptr;
  CUresult (*StreamSynchronize)(CUstream stream) = nullptr;

  // "CUDA_ERROR_INVALID_VALUE (1): invalid argument" for `r`.
  std::string ErrorText(CUresult r) const;
  // OK for kSuccess, else an error of `code` "<what>: <ErrorText>".
  absl::Status Check(CUresult r, std::string_view what,
                     absl::StatusCode code = absl::StatusCode::kInternal) const;

  void* handle = nullptr;  // dlopen handle (never closed: the driver stays)
  std::string path;
};

// dlopen()s `library` (normally "libcuda.so.1"), resolves every symbol
// above and calls cuInit(0). Errors (FAILED_PRECONDITION) say why CUDA is
// unusable here: "libcuda.so.1 not found (no NVIDIA driver on this host):
// ...", a missing symbol (driver too old), or cuInit's error (e.g.
// CUDA_ERROR_NO_DEVICE, or CUDA_ERROR_STUB_LIBRARY for the toolkit's link
// stub). The Driver is never unloaded.
absl::StatusOr<std::shared_ptr<const Driver>> LoadDriver(
    std::string_view library);

}  // namespace ckptd::daemon::cuda

#endif  // CKPTD_DAEMON_STAGING_CUDA_DRIVER_H_
