#!/usr/bin/env bash
# One command for a session on a machine with PyTorch >= 2.4 (the GPU
# machine: torch 2.11, Python 3.12, no network):
#
#   bash tests/interop/run_on_gpu_machine.sh
#
#   1. finds a Python whose torch is >= 2.4 ($PYTHON, else python3, python,
#      /usr/bin/python3, /usr/local/bin/python3);
#   2. runs tests/interop/make_fixtures.py --force (needs only torch, so it
#      comes first: its output is what the session must bring back);
#   3. builds interop_tool, ckptd_demo, the daemon (bin/ckptd),
#      tools/ckptd_trainer, the Python package's native library
#      (client/libckptd_client.so) and (if it builds) ckptctl into
#      $CKPTD_BUILD_DIR (default build-gpu), or reuses that directory when
#      its interop_tool already runs (building the daemon / client library
#      there if they are missing); if cmake / a compiler / the Debian dev
#      packages are missing it tries scripts/setup.sh (apt), and otherwise
#      says exactly what is missing and goes on without the C++ side;
#      then exports CKPTD_CLIENT_LIB and puts client/python on PYTHONPATH
#      for the ckptd package tests (test_pyclient_torch2.py);
#   4. checks the new fixtures with tests/python/test_torch2_fixtures.py;
#   5. runs `python -m pytest tests/interop -v` plus
#      tests/python/test_interop_sample_payloads.py (test_make_fixtures_script
#      is deselected unless SKIP_FIXTURES=1: steps 2 and 4 did that work).
#
# Results, refreshed after every step so that a run cut off by a time limit
# still leaves them: if $OUT is set, $OUT/summary.txt, $OUT/fixtures.tar.gz
# (the tests/fixtures/dcp_torch<ver>/ directory: extract with
# `tar -xzf fixtures.tar.gz -C tests/fixtures`), $OUT/pytest_interop.log and
# $OUT/logs.tar.gz (every log). Few files, no deep folders: the device
# tool brings back at most 8 files, 2 folders down.
#
# Exit status: 0 if every step that could run passed; 1 otherwise (the
# summary lists each step). Environment knobs: PYTHON, CKPTD_BUILD_DIR,
# SKIP_FIXTURES=1, SKIP_BUILD=1, SKIP_PYTEST=1, PYTEST_ARGS (extra args,
# e.g. "-k dtensor"). A run that must fit a 10-minute limit can be split:
# first SKIP_PYTEST=1, then SKIP_FIXTURES=1 (the build dir is reused).
#
# Where the GPU machine cannot build (no cmake / dev packages, no network),
# prebuilt tools can be carried instead: here, on the build machine,
#   bash tests/interop/run_on_gpu_machine.sh --make-bundle build build-bundle
# copies stripped interop_tool, ckptd_trainer, ckptd_demo, ckptctl (if
# built), the daemon ckptd, client/libckptd_client.so, the Python package
# (client/python/ckptd -> build-bundle/python/ckptd) and the shared
# libraries they need (not glibc) into build-bundle/{tools,bin,client,
# python,lib}; carry build-bundle and run there with
# CKPTD_BUILD_DIR=build-bundle. Each bundled binary and library finds the
# bundle's lib/ through its own RPATH ($ORIGIN/../lib, set with patchelf),
# not through LD_LIBRARY_PATH: a Python process keeps the host's libstdc++,
# OpenSSL, ... that its torch was built against (the bundle carries no
# libstdc++ / libgcc_s; the host's must be GCC 12's or newer). The tree's client/python is used when present (it is what
# the tests are about); the bundle's copy only where the tree lacks it.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$(pwd)

if [[ "${1:-}" == "--make-bundle" ]]; then
  src=${2:?usage: $0 --make-bundle BUILD_DIR OUT_DIR}
  dst=${3:?usage: $0 --make-bundle BUILD_DIR OUT_DIR}
  rm -rf "$dst" && mkdir -p "$dst/tools" "$dst/bin" "$dst/client" "$dst/python" "$dst/lib" || exit 1
  exes=()
  for e in tools/interop_tool tools/ckptd_trainer bin/ckptd_demo bin/ckptctl bin/ckptd \
           client/libckptd_client.so; do
    [[ -f "$src/$e" ]] || continue
    cp "$src/$e" "$dst/$e" && strip --strip-debug "$dst/$e" && exes+=("$dst/$e")
  done
  [[ -x "$dst/tools/interop_tool" ]] || { echo "no $src/tools/interop_tool" >&2; exit 1; }
  for e in bin/ckptd client/libckptd_client.so; do
    [[ -f "$dst/$e" ]] || echo "warning: no $src/$e: test_dcp_load_daemon.py / test_pyclient_torch2.py will fail" >&2
  done
  # The ckptd Python package (pure Python; loads client/libckptd_client.so).
  (cd "$ROOT/client/python" && tar --exclude=__pycache__ -cf - ckptd) | tar -xf - -C "$dst/python" || exit 1
  # The daemon API's Python stubs for tests/python/daemon_util.py, where the
  # machine has no protoc / grpc_python_plugin (the GPU machine).
  mkdir -p "$dst/python_pb" || exit 1
  protoc --python_out="$dst/python_pb" --grpc_out="$dst/python_pb" \
      --plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin -I "$ROOT/proto" \
      "$ROOT/proto/ckptd/v1/daemon.proto" \
    || echo "warning: no python stubs (protoc, grpc_python_plugin): the daemon tests need them there" >&2
  # shellcheck source=../../scripts/bundle_lib.sh
  source "$ROOT/scripts/bundle_lib.sh"
  bundle_add_binaries "$dst" "${exes[@]}" || exit 1
  du -sh "$dst"
  exit 0
fi
LOGS=$(mktemp -d /tmp/ckptd_interop_logs.XXXXXX)
SUMMARY=()
FAILED=0
export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo}
export PYTHONUNBUFFERED=1
BUILD=${CKPTD_BUILD_DIR:-$ROOT/build-gpu}
PY=""
TORCH_VERSION=""

note() { echo "== $*"; SUMMARY+=("$*"); publish; }
fail() { echo "!! $*" >&2; SUMMARY+=("FAILED: $*"); FAILED=1; publish; }

publish() {
  {
    echo "ckptd interop run on $(hostname) at $(date -u +%FT%TZ)"
    echo "python: ${PY:-none}; torch: ${TORCH_VERSION:-none}; build dir: ${BUILD}"
    printf '%s\n' "${SUMMARY[@]}"
  } > "$LOGS/summary.txt"
  [[ -n "${OUT:-}" ]] || return 0
  mkdir -p "$OUT"
  cp -f "$LOGS/summary.txt" "$OUT/summary.txt"
  [[ -f "$LOGS/pytest_interop.log" ]] && cp -f "$LOGS/pytest_interop.log" "$OUT/pytest_interop.log"
  tar -czf "$OUT/logs.tar.gz" -C "$LOGS" . 2>/dev/null || true
  if compgen -G "$ROOT/tests/fixtures/dcp_torch*" >/dev/null; then
    (cd "$ROOT/tests/fixtures" && tar -czf "$OUT/fixtures.tar.gz" dcp_torch*) || true
  fi
}

finish() {
  publish
  echo
  cat "$LOGS/summary.txt"
  [[ -n "${OUT:-}" ]] && echo "(results in $OUT)"
  exit $FAILED
}

# --- 1. Python with torch >= 2.4 -------------------------------------------
for cand in ${PYTHON:-} python3 python /usr/bin/python3 /usr/local/bin/python3; do
  command -v "$cand" >/dev/null 2>&1 || continue
  v=$("$cand" -c 'import torch, re; m = re.match(r"(\d+)\.(\d+)", torch.__version__); print(torch.__version__ if (int(m[1]), int(m[2])) >= (2, 4) else "")' 2>/dev/null) || continue
  if [[ -n "$v" ]]; then PY=$(command -v "$cand"); TORCH_VERSION=$v; break; fi
done
if [[ -z "$PY" ]]; then
  fail "no Python with torch>=2.4 found (tried \$PYTHON, python3, python, /usr/bin/python3, /usr/local/bin/python3)"
  finish
fi
note "python $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])')), torch $TORCH_VERSION, cuda available: $("$PY" -c 'import torch; print(torch.cuda.is_available())' 2>/dev/null)"
HAVE_PYTEST=1
if ! "$PY" -c 'import pytest' 2>/dev/null; then
  HAVE_PYTEST=0
  fail "pytest is not importable by $PY: tests not run (make_fixtures.py still runs)"
fi

# --- 2. fixtures (torch only) ------------------------------------------------
MADE_FIXTURES=0
if [[ "${SKIP_FIXTURES:-0}" != 1 ]]; then
  echo "== make_fixtures.py"
  if timeout 900 "$PY" tests/interop/make_fixtures.py --force 2>&1 | tee "$LOGS/make_fixtures.log"; [[ ${PIPESTATUS[0]} -eq 0 ]]; then
    MADE_FIXTURES=1
    note "make_fixtures: $(tail -n 1 "$LOGS/make_fixtures.log")"
  else
    fail "make_fixtures.py failed (see make_fixtures.log in logs.tar.gz): $(tail -n 1 "$LOGS/make_fixtures.log")"
  fi
fi

# --- 3. build ----------------------------------------------------------------
tool_runs() {  # interop_tool with no args prints usage and exits 2 if it loads
  [[ -x "$BUILD/tools/interop_tool" ]] || return 1
  "$BUILD/tools/interop_tool" >/dev/null 2>&1
  [[ $? -eq 2 ]]
}

missing_build_tools() {
  local m=()
  command -v cmake >/dev/null 2>&1 || m+=(cmake)
  command -v c++ >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1 || m+=("g++ (build-essential)")
  command -v pkg-config >/dev/null 2>&1 || m+=(pkg-config)
  echo "${m[*]}"
}

configure_and_build() {
  local gen=(-G "Unix Makefiles")
  command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
  echo "configure: cmake -S $ROOT -B $BUILD ${gen[*]} -DPython3_EXECUTABLE=$PY -DCKPTD_BUILD_BENCH=OFF"
  cmake -S "$ROOT" -B "$BUILD" "${gen[@]}" -DPython3_EXECUTABLE="$PY" -DCKPTD_BUILD_BENCH=OFF \
    > "$LOGS/cmake.log" 2>&1 || { echo "cmake configure failed:"; tail -n 25 "$LOGS/cmake.log"; return 1; }
  local jobs; jobs=$(nproc 2>/dev/null || echo 4)
  cmake --build "$BUILD" -j "$jobs" --target interop_tool ckptd_demo > "$LOGS/build.log" 2>&1 \
    || { echo "build failed:"; tail -n 40 "$LOGS/build.log"; return 1; }
  build_daemon_targets
  # ckptctl is optional (being written); its absence only skips some tests.
  if cmake --build "$BUILD" -j "$jobs" --target ckptctl > "$LOGS/build_ckptctl.log" 2>&1; then
    echo "ckptctl built"
  else
    echo "ckptctl not built (optional; see build_ckptctl.log)"
  fi
  return 0
}

# The daemon, the trainer ranks and the Python package's native library:
# test_dcp_load_daemon.py and test_pyclient_torch2.py start a real daemon.
# Built apart so that a failure here leaves the other interop tests running.
build_daemon_targets() {
  local jobs; jobs=$(nproc 2>/dev/null || echo 4)
  if cmake --build "$BUILD" -j "$jobs" --target ckptd ckptd_trainer ckptd_client_shared \
      > "$LOGS/build_daemon.log" 2>&1; then
    echo "ckptd, ckptd_trainer and libckptd_client.so built"
  else
    echo "ckptd / ckptd_trainer / libckptd_client.so not built (see build_daemon.log):"
    tail -n 20 "$LOGS/build_daemon.log"
  fi
}

daemon_targets_present() {
  [[ -x "$BUILD/bin/ckptd" && -x "$BUILD/tools/ckptd_trainer" && -f "$BUILD/client/libckptd_client.so" ]]
}

BUILT=0
if [[ "${SKIP_BUILD:-0}" == 1 ]]; then
  tool_runs && BUILT=1
  note "build skipped (SKIP_BUILD=1); $BUILD/tools/interop_tool usable: $BUILT"
elif tool_runs; then
  BUILT=1
  if ! daemon_targets_present && [[ -f "$BUILD/CMakeCache.txt" ]] && command -v cmake >/dev/null 2>&1; then
    build_daemon_targets 2>&1 | tee "$LOGS/build_daemon_steps.log"
  fi
  note "reusing $BUILD (its interop_tool runs)"
else
  miss=$(missing_build_tools)
  if [[ -n "$miss" ]]; then
    echo "build tools missing: $miss; trying scripts/setup.sh (apt-get; needs root/sudo and a package mirror)"
    if timeout 600 bash scripts/setup.sh > "$LOGS/setup.log" 2>&1; then
      echo "scripts/setup.sh succeeded"
    else
      echo "scripts/setup.sh failed:"; tail -n 15 "$LOGS/setup.log"
    fi
    miss=$(missing_build_tools)
  fi
  if [[ -n "$miss" ]]; then
    fail "cannot build ckptd: missing $miss and apt could not install them; C++-side tests not run (fixtures above need only torch)"
  elif configure_and_build 2>&1 | tee "$LOGS/build_steps.log"; [[ ${PIPESTATUS[0]} -eq 0 ]]; then
    BUILT=1
    note "built interop_tool, ckptd_demo in $BUILD ($(grep -c 'ckptctl built' "$LOGS/build_steps.log") ckptctl)"
  else
    # Most likely missing Debian dev packages (absl, spdlog, fmt, isal,
    # CLI11, nlohmann-json, gtest): try setup.sh once, then rebuild.
    echo "build failed; trying scripts/setup.sh for the dev packages"
    if timeout 600 bash scripts/setup.sh > "$LOGS/setup.log" 2>&1 && configure_and_build; then
      BUILT=1
      note "built after scripts/setup.sh"
    else
      pkgs=$(grep -hoE "Could NOT find [A-Za-z0-9_]+|Could not find a package configuration file provided by \"[^\"]+\"|No package '[^']+' found" "$LOGS/cmake.log" 2>/dev/null | sort -u | tr '\n' ';')
      fail "cannot build ckptd (${pkgs:-see cmake.log / build.log in logs.tar.gz}); C++-side tests not run"
    fi
  fi
fi
export CKPTD_BUILD_DIR=$BUILD
# The ckptd Python package (tests/interop/test_pyclient_torch2.py): the
# tree's client/python (else a bundle's python/) and the built native library.
PKG_DIR="$ROOT/client/python"
[[ -d "$PKG_DIR/ckptd" ]] || PKG_DIR="$BUILD/python"
export PYTHONPATH="$PKG_DIR${PYTHONPATH:+:$PYTHONPATH}"
if [[ -f "$BUILD/client/libckptd_client.so" ]]; then
  export CKPTD_CLIENT_LIB="$BUILD/client/libckptd_client.so"
fi
if [[ $BUILT == 1 ]]; then
  if daemon_targets_present; then
    note "daemon, ckptd_trainer and libckptd_client.so present in $BUILD (ckptd package: $PKG_DIR)"
  else
    fail "$BUILD lacks bin/ckptd, tools/ckptd_trainer or client/libckptd_client.so: test_dcp_load_daemon.py and test_pyclient_torch2.py will fail"
  fi
fi

# --- 4. ckptd reads the new fixtures -----------------------------------------
if [[ $MADE_FIXTURES == 1 && $HAVE_PYTEST == 1 && $BUILT == 1 ]]; then
  echo "== test_torch2_fixtures.py on the new fixtures"
  "$PY" -m pytest -v -rs -p no:cacheprovider tests/python/test_torch2_fixtures.py 2>&1 \
    | tee "$LOGS/pytest_fixtures.log"
  rc=${PIPESTATUS[0]}
  if [[ $rc -eq 0 ]]; then note "ckptd reads the new fixtures: $(tail -n 1 "$LOGS/pytest_fixtures.log")"
  else fail "test_torch2_fixtures.py on the new fixtures exited $rc: $(tail -n 1 "$LOGS/pytest_fixtures.log")"; fi
fi

# --- 5. the interop suite ----------------------------------------------------
if [[ "${SKIP_PYTEST:-0}" != 1 && $HAVE_PYTEST == 1 && $BUILT == 1 ]]; then
  echo "== pytest tests/interop (CKPTD_BUILD_DIR=$BUILD)"
  # shellcheck disable=SC2086
  # test_make_fixtures_script repeats step 2's work: only where it was skipped.
  deselect=()
  [[ "${SKIP_FIXTURES:-0}" != 1 ]] &&
    deselect=(--deselect tests/interop/test_ckptd_reads_dcp_save.py::test_make_fixtures_script)
  # shellcheck disable=SC2086
  "$PY" -m pytest -v -rs --durations=10 -p no:cacheprovider tests/interop \
    tests/python/test_interop_sample_payloads.py "${deselect[@]}" \
    ${PYTEST_ARGS:-} 2>&1 | tee "$LOGS/pytest_interop.log"
  rc=${PIPESTATUS[0]}
  if [[ $rc -eq 0 ]]; then note "pytest tests/interop: passed ($(tail -n 1 "$LOGS/pytest_interop.log"))"
  else fail "pytest tests/interop exited $rc ($(tail -n 1 "$LOGS/pytest_interop.log"))"; fi
elif [[ "${SKIP_PYTEST:-0}" != 1 ]]; then
  SUMMARY+=("pytest tests/interop: not run (no build or no pytest)")
fi

finish
