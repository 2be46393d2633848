#!/usr/bin/env bash
# Installs every Debian package ckptd needs to build, test and benchmark.
# Idempotent: packages already present are skipped without touching the network.
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake ninja-build pkg-config git clang clang-format libclang-rt-14-dev
  # libraries (see docs/design.md "Dependencies")
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev liburing-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev
  libisal-dev libcpp-httplib-dev nlohmann-json3-dev
  # multi-node tests: certificates for the peer service's TLS
  openssl
  # Python side: torch 1.13 (CPU) is the reader/writer of record in tests
  python3 python3-torch python3-pytest python3-numpy python3-grpcio
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all ${#PACKAGES[@]} packages present"
fi
