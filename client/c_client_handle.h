// Copyright 2026 The ckptd Authors.
//
// Internal to libckptd_client (not installed): what a ckptd_client* of the
// C ABI (client/ckptd_c.h) holds, shared by the translation units that
// implement its functions (ckptd_c.cc, ckptd_c_restore.cc).
#ifndef CKPTD_CLIENT_C_CLIENT_HANDLE_H_
#define CKPTD_CLIENT_C_CLIENT_HANDLE_H_

#include <memory>

#include "client/ckptd_c.h"
#include "client/ckptd_client.h"

struct ckptd_client {
  std::unique_ptr<ckptd::client::Client> client;
};

#endif  // CKPTD_CLIENT_C_CLIENT_HANDLE_H_
