// Copyright 2026 The ckptd Authors.
#include "daemon/staging/cuda_driver.h"

#include <dlfcn.h>

#include <string>

#include "fmt/format.h"

namespace ckptd::daemon::cuda {

std::string Driver::ErrorText(CUresult r) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (GetErrorName == nullptr || GetErrorName(r, &name) != kSuccess)
    name = nullptr;
  if (GetErrorString == nullptr || GetErrorString(r, &text) != kSuccess)
    text = nullptr;
  return fmt::format("{} ({}){}{}", name != nullptr ? name : "CUDA error", r,
                     text != nullptr ? ": " : "", text != nullptr ? text : "");
}

absl::Status Driver::Check(CUresult r, std::string_view what,
                           absl::StatusCode code) const {
  if (r == kSuccess) return absl::OkStatus();
  return absl::Status(code, fmt::format("{}: {}", what, ErrorText(r)));
}

namespace {

template <typename F>
bool Resolve(void* lib, const char* symbol, F*& out, std::string& missing) {
  out = reinterpret_cast<F*>(dlsym(lib, symbol));
  if (out == nullptr)
    missing += fmt::format("{}{}", missing.empty() ? "" : ", ", symbol);
  return out != nullptr;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Driver>> LoadDriver(
    std::string_view library) {
  const std::string lib(library);
  // RTLD_NOW: a missing symbol shows here, not mid-checkpoint.
  void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* err = dlerror();
    return absl::FailedPreconditionError(
        fmt::format("cannot load the CUDA driver library '{}' (no NVIDIA "
                    "driver on this host?): {}",
                    lib, err != nullptr ? err : "dlopen failed"));
  }
  auto d = std::make_shared<Driver>();
  d->handle = h;
  d->path = lib;
  std::string missing;
  // The versioned names cuda.h (CUDA 12/13) maps the API names to.
  Resolve(h, "cuInit", d->Init, missing);
  Resolve(h, "cuDriverGetVersion", d->DriverGetVersion, missing);
  Resolve(h, "cuGetErrorName", d->GetErrorName, missing);
  Resolve(h, "cuGetErrorString", d->GetErrorString, missing);
  Resolve(h, "cuDeviceGetCount", d->DeviceGetCount, missing);
  Resolve(h, "cuDeviceGet", d->DeviceGet, missing);
  Resolve(h, "cuDeviceGetPCIBusId", d->DeviceGetPCIBusId, missing);
  Resolve(h, "cuDevicePrimaryCtxRetain", d->DevicePrimaryCtxRetain, missing);
  Resolve(h, "cuDevicePrimaryCtxRelease_v2", d->DevicePrimaryCtxRelease,
          missing);
  Resolve(h, "cuCtxSetCurrent", d->CtxSetCurrent, missing);
  Resolve(h, "cuIpcOpenMemHandle_v2", d->IpcOpenMemHandle, missing);
  Resolve(h, "cuIpcCloseMemHandle", d->IpcCloseMemHandle, missing);
  Resolve(h, "cuMemGetAddressRange_v2", d->MemGetAddressRange, missing);
  Resolve(h, "cuMemHostAlloc", d->MemHostAlloc, missing);
  Resolve(h, "cuMemFreeHost", d->MemFreeHost, missing);
  Resolve(h, "cuMemcpyDtoHAsync_v2", d->MemcpyDtoHAsync, missing);
  Resolve(h, "cuStreamCreate", d->StreamCreate, missing);
  Resolve(h, "cuStreamDestroy_v2", d->StreamDestroy, missing);
  Resolve(h, "cuStreamSynchronize", d->StreamSynchronize, missing);
  if (!missing.empty()) {
    return absl::FailedPreconditionError(fmt::format(
        "the CUDA driver '{}' lacks {} (driver too old; ckptd needs CUDA 12+)",
        lib, missing));
  }
  if (absl::Status s = d->Check(d->Init(0), fmt::format("cuInit ({})", lib),
                                absl::StatusCode::kFailedPrecondition);
      !s.ok()) {
    return s;
  }
  return std::shared_ptr<const Driver>(std::move(d));
}

}  // namespace ckptd::daemon::cuda
