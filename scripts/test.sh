#!/usr/bin/env bash
# Sets up (Debian packages), builds and runs every test of ckptd.
#
#   scripts/test.sh            full run: release build + all tests, then an
#                              ASan/UBSan build + all tests, then a short
#                              libFuzzer run of every fuzz target
#   scripts/test.sh --quick    release build + all tests only
#   scripts/test.sh --asan     ASan/UBSan build + all tests only
#   scripts/test.sh --fuzz N   build the fuzzers (clang) and run each N seconds
#   scripts/test.sh --torch2   release build + tests/interop against real
#                              PyTorch 2.x (Debian 13's python3-torch in a
#                              debootstrap root, scripts/torch2_chroot.sh)
#
# The full run includes the --torch2 step after the release suites; it is
# SKIPPED, with the reason, where the root cannot be made (no Debian 13
# archive reachable, no mount rights), and fails only when a test fails.
#
# Exit status is non-zero if any step fails, if ctest finds no tests, or if
# pytest collects none.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

MODE=full
FUZZ_SECONDS=20
case "${1:-}" in
  --quick) MODE=quick ;;
  --asan) MODE=asan ;;
  --fuzz) MODE=fuzz; FUZZ_SECONDS=${2:-60} ;;
  --torch2) MODE=torch2 ;;
  "") ;;
  *) echo "usage: $0 [--quick|--asan|--fuzz SECONDS|--torch2]" >&2; exit 2 ;;
esac

bash scripts/setup.sh

run_suite() {  # $1 = build dir, then extra pytest arguments
  local build=$1
  shift
  echo "=== ctest ($build) [$(date -u +%T)] ==="
  ctest --test-dir "$build" --output-on-failure -j2 --no-tests=error --timeout 600
  echo "=== pytest ($build) [$(date -u +%T)] ==="
  CKPTD_BUILD_DIR="$ROOT/$build" CKPTD_REQUIRE_TORCH=1 \
    /usr/bin/python3 -m pytest -q -p no:cacheprovider -rs --durations=15 "$@" \
    tests/python tests/interop tests/gpu
}

# tests/interop (stock dcp.save / dcp.load / async_save of torch 2.x against
# ckptd, both ways) and make_fixtures.py + the fixture check, inside a
# Debian 13 root with python3-torch 2.x. $1 = the release build dir.
run_torch2() {
  echo "=== torch 2.x interop (scripts/torch2_chroot.sh) [$(date -u +%T)] ==="
  local rc=0
  bash scripts/torch2_chroot.sh setup || rc=$?
  if [[ $rc -eq 0 ]]; then
    # SKIP_FIXTURES: the tree's committed fixtures stay as they are (the
    # suite's test_make_fixtures_script makes and checks a scratch set).
    SKIP_FIXTURES=1 bash scripts/torch2_chroot.sh interop "$1" || rc=$?
  fi
  case $rc in
    0) echo "=== torch 2.x interop passed ===" ;;
    3) echo "=== torch 2.x interop SKIPPED: no torch 2.x root could be made or entered (see above) ===" ;;
    *) echo "torch 2.x interop failed (exit $rc)" >&2; return 1 ;;
  esac
}

run_fuzz() {
  local build=build-fuzz
  cmake -S . -B $build -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCKPTD_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  ninja -C $build
  for fuzzer in $build/fuzz/*_fuzz; do
    local name; name=$(basename "$fuzzer" _fuzz)
    local corpus=tests/fuzz/corpus/$name
    local work; work=$(mktemp -d)
    echo "=== fuzz $name for ${FUZZ_SECONDS}s ==="
    mkdir -p "$work/corpus"
    if ! "$fuzzer" -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=2048 -timeout=10 \
        -print_final_stats=1 -artifact_prefix="$work/" "$work/corpus" "$corpus" \
        >"$work/log" 2>&1; then
      tail -n 60 "$work/log" >&2
      echo "fuzzer $name found a failing input (artifacts in $work)" >&2
      exit 1
    fi
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$work/log" || true
    rm -rf "$work"
  done
}

case $MODE in
  quick)
    bash scripts/build.sh build
    run_suite build ;;
  asan)
    CKPTD_SANITIZE=1 bash scripts/build.sh build-asan
    ASAN_OPTIONS=detect_leaks=1 run_suite build-asan -m "not once" ;;
  fuzz)
    run_fuzz ;;
  torch2)
    bash scripts/build.sh build
    run_torch2 build ;;
  full)
    bash scripts/build.sh build
    run_suite build
    run_torch2 build
    CKPTD_SANITIZE=1 bash scripts/build.sh build-asan
    # The long multi-process suites (pytest marker `once`: the soak, the
    # kill -9 and ENOSPC points on a real ext4) run in the release pass only.
    ASAN_OPTIONS=detect_leaks=1 run_suite build-asan -m "not once"
    run_fuzz ;;
esac
echo "=== all tests passed ($MODE) ==="
