#!/usr/bin/env bash
# Configures and builds ckptd. Usage: scripts/build.sh [BUILD_DIR] [extra cmake args...]
#   CKPTD_SANITIZE=1  → ASan + UBSan build
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
shift || true
ARGS=(-G Ninja -DPython3_EXECUTABLE=/usr/bin/python3)
if [[ "${CKPTD_SANITIZE:-0}" == 1 ]]; then
  ARGS+=(-DCKPTD_SANITIZE=ON -DCKPTD_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Debug)
fi
cmake -S . -B "$BUILD" "${ARGS[@]}" "$@" >/dev/null
ninja -C "$BUILD"
