#!/usr/bin/env bash
# Configures and builds ckptd. Usage: scripts/build.sh [BUILD_DIR] [extra cmake args...]
#   CKPTD_SANITIZE=1  → ASan + UBSan build
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
shift || true
ARGS=(-G Ninja -DPython3_EXECUTABLE=/usr/bin/python3)
# The default build type (RelWithDebInfo) with line tables only (-g1): the
# file:line of every frame in a backtrace or a sanitizer report, at a third
# less compile time than full debug info (-g; CI builds from scratch on 2
# cores). A -DCMAKE_CXX_FLAGS_RELWITHDEBINFO=... given here wins.
ARGS+=("-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG"
       "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG")
# The ASan/UBSan build: clang (it compiles an instrumented -O0 test 2.5x
# faster than gcc; the lock annotations are checked there too), -O0 (each
# test binary starts and runs fast enough there, and it compiles fastest),
# line tables only as above. A -DCMAKE_CXX_COMPILER=... given here wins.
if [[ "${CKPTD_SANITIZE:-0}" == 1 ]]; then
  ARGS+=(-DCKPTD_SANITIZE=ON -DCKPTD_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Debug
         -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
         "-DCMAKE_C_FLAGS_DEBUG=-g1" "-DCMAKE_CXX_FLAGS_DEBUG=-g1")
fi
# CKPTD_TESTS: the GoogleTest executables to build (e.g.
# "metadata_test;metadata_scale_test"); unset: every one. Passed on each
# call, so a build directory never keeps an earlier call's choice.
ARGS+=("-DCKPTD_TESTS=${CKPTD_TESTS:-}")
# CKPTD_UNITY=ON: a unity build (CMakeLists.txt), likewise passed each call.
ARGS+=("-DCKPTD_UNITY=${CKPTD_UNITY:-OFF}")
cmake -S . -B "$BUILD" "${ARGS[@]}" "$@" >/dev/null
# CKPTD_NINJA_ARGS: e.g. -j2 (scripts/test.sh's background builds).
# shellcheck disable=SC2086
ninja -C "$BUILD" ${CKPTD_NINJA_ARGS:-}
