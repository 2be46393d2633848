#!/usr/bin/env bash
# Installs every Debian package ckptd needs to build, test and benchmark.
# Idempotent: packages already present are skipped without touching the network.
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake ninja-build pkg-config git clang clang-format libclang-rt-14-dev lld
  # libraries (see ../shared/docs/design.md "Dependencies")
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev liburing-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev
  libisal-dev libcpp-httplib-dev nlohmann-json3-dev libzstd-dev
  # GPU / torch 2.x bundles (tests/interop/run_on_gpu_machine.sh --make-bundle):
  # RPATHs instead of LD_LIBRARY_PATH
  patchelf
  # multi-node tests: certificates for the peer service's TLS
  openssl
  # metrics tests: promtool checks /metrics, a real prometheus server scrapes it
  prometheus
  # Python side: torch 1.13 (CPU) is the reader/writer of record in tests
  python3 python3-torch python3-pytest python3-numpy python3-grpcio
  # packaging checks: systemd-analyze verify (systemd/), manifest tests (deploy/,
  # PyYAML; node runs deploy/validate, npm is installed at the end if missing)
  systemd python3-yaml nodejs
  # torch 2.6 / 2.14 interop: Debian roots made by scripts/torch2_chroot.sh
  debootstrap
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

# --- deploy/validate: the Kubernetes manifest validator (npm) ---------------
# Optional: without it tests/python/test_deploy.py skips the schema check
# with the reason (the PyYAML checks still run). Never fails the setup.
# npm is installed only when the `npm` command is missing: a nodejs build
# that bundles npm (e.g. NodeSource's) conflicts with Debian's npm package.
(
  set +e
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  if ! command -v npm >/dev/null 2>&1; then
    echo "setup: installing npm"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends npm
  fi
  "$(dirname "$0")/../deploy/validate/install.sh"
) || echo "setup: WARNING: deploy/validate dependencies not installed (offline?);" \
          "the manifest schema test will be skipped" >&2
