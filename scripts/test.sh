#!/usr/bin/env bash
# Sets up (Debian packages), builds and runs every test of ckptd.
#
#   scripts/test.sh            full run: clang-format check, release build +
#                              its scale tests, torch 2.6 and 2.14 interop, an
#                              ASan/UBSan build + all tests, the release
#                              build's pytest of what did not run under ASan,
#                              a clang ThreadSanitizer build
#                              (-Werror=thread-safety) + the C++ tests, then
#                              a short libFuzzer run of every fuzz target
#   scripts/test.sh --quick    release build + all tests only
#   scripts/test.sh --asan     ASan/UBSan build + all tests only
#   scripts/test.sh --tsan     clang TSan build (lock annotations checked:
#                              -Werror=thread-safety) + the C++ tests
#   scripts/test.sh --fuzz N   build the fuzzers (clang) and run each N seconds
#   scripts/test.sh --faults   release build + the fault schedule (tests/netns:
#                              partitions, SIGSTOP, SIGKILL at every step of
#                              the multi-node commit on 3 network namespaces)
#   scripts/test.sh --torch2   release build + tests/interop against real
#                              PyTorch 2.x: torch 2.6 (Debian 13's
#                              python3-torch) and 2.14 (Debian sid's), each
#                              in a debootstrap root (scripts/torch2_chroot.sh)
#   scripts/test.sh --netns    release build + tests/netns: nodes in separate
#                              network namespaces (root, `ip netns`)
#
# The full run includes the --torch2 step after the release suites; a root
# that cannot be made (no Debian archive reachable, no mount rights) is
# SKIPPED with the reason; the step fails only when a test fails.
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
  --tsan) MODE=tsan ;;
  --fuzz) MODE=fuzz; FUZZ_SECONDS=${2:-60} ;;
  --torch2) MODE=torch2 ;;
  --netns) MODE=netns ;;
  --faults) MODE=faults ;;
  "") ;;
  *) echo "usage: $0 [--quick|--asan|--tsan|--fuzz SECONDS|--torch2|--netns|--faults]" >&2; exit 2 ;;
esac

bash scripts/setup.sh

run_ctest() {  # $1 = build dir
  echo "=== ctest ($1) [$(date -u +%T)] ==="
  ctest --test-dir "$1" --output-on-failure -j2 --no-tests=error --timeout 600
}

run_pytest() {  # $1 = build dir, then extra pytest arguments
  local build=$1
  shift
  echo "=== pytest ($build) [$(date -u +%T)] ==="
  CKPTD_BUILD_DIR="$ROOT/$build" CKPTD_REQUIRE_TORCH=1 \
    /usr/bin/python3 -m pytest -q -p no:cacheprovider -rs --durations=15 "$@" \
    tests/python tests/interop tests/gpu
}

# The fault schedule (tests/netns/fault_schedule.py, DEVELOPERS.md
# "Failpoints and the fault schedule"): root and `ip netns`, else SKIPPED.
run_faults() {  # $1 = build dir
  echo "=== fault schedule ($1) [$(date -u +%T)] ==="
  CKPTD_BUILD_DIR="$ROOT/$1" /usr/bin/python3 -m pytest -q -p no:cacheprovider -rs \
    --durations=5 tests/faults/test_fault_schedule.py
}

run_suite() {  # $1 = build dir, then extra pytest arguments
  run_ctest "$1"
  run_pytest "$@"
}

# The torch 2.x roots (a debootstrap each, ~3 minutes of mostly download on
# a fresh machine) are made in the background while the release build and
# its suites run; run_torch2 waits for its root. Output goes to a log that
# run_torch2 prints.
TORCH2_LOGS=""
declare -A TORCH2_SETUP_PID=()
start_torch2_setups() {
  local suite
  TORCH2_LOGS=$(mktemp -d /tmp/ckptd-torch2-setup.XXXXXX)
  for suite in "$@"; do
    ( rc=0
      CKPTD_TORCH2_ROOT=/var/cache/ckptd/torch2-$suite CKPTD_TORCH2_SUITE=$suite \
        bash scripts/torch2_chroot.sh setup > "$TORCH2_LOGS/$suite.log" 2>&1 || rc=$?
      echo $rc > "$TORCH2_LOGS/$suite.rc" ) &
    TORCH2_SETUP_PID[$suite]=$!
  done
}

# tests/interop (stock dcp.save / dcp.load / async_save of torch 2.x against
# ckptd, both ways) and make_fixtures.py + the fixture check, inside a
# Debian root with python3-torch 2.x. $1 = the release build dir, $2 = the
# Debian suite (trixie: torch 2.6, sid: torch 2.14).
run_torch2() {
  local build=$1 suite=$2
  local root=/var/cache/ckptd/torch2-$suite
  echo "=== torch 2.x interop, Debian $suite (scripts/torch2_chroot.sh) [$(date -u +%T)] ==="
  local rc=0
  if [[ -n "${TORCH2_SETUP_PID[$suite]:-}" ]]; then
    wait "${TORCH2_SETUP_PID[$suite]}" || true
    cat "$TORCH2_LOGS/$suite.log"
    rc=$(cat "$TORCH2_LOGS/$suite.rc" 2>/dev/null || echo 1)
  else
    CKPTD_TORCH2_ROOT=$root CKPTD_TORCH2_SUITE=$suite bash scripts/torch2_chroot.sh setup || rc=$?
  fi
  # Torch 2.6 runs one multi-process case of each API that torch 2.14 runs
  # several of (the storage writer: dcp.save, not async_save or the
  # process-based async; the Python client: DTensor into 3 ranks, not into
  # 2 or FSDP2; dcp.save read by ckptd and dcp.load of ckptd: 4 and 3
  # ranks, not 2): the same ckptd code, about 2 min of the trixie pass.
  # make_fixtures.py runs in sid only (30 s a root): the torch 2.6 fixtures
  # it would make are committed and checked by every run
  # (tests/python/test_torch2_fixtures.py), and trixie's dcp.save output is
  # read by ckptd in test_ckptd_reads_dcp_save.py's other tests.
  local thin=""
  if [[ $suite == trixie ]]; then
    local t
    for t in 'test_ckptd_reads_dcp_save.py::test_make_fixtures_script' \
        'test_storage_writer_torch2.py::test_fsdp2_4_ranks_reshard_into_2_and_3[async]' \
        'test_storage_writer_torch2.py::test_fsdp2_4_ranks_reshard_into_2_and_3[process]' \
        'test_pyclient_torch2.py::test_dtensor_4_ranks_reshard[2]' \
        'test_pyclient_torch2.py::test_fsdp2_4_to_2_ranks' \
        'test_ckptd_reads_dcp_save.py::test_dtensor_saves[2]' \
        'test_dcp_load_ckptd.py::test_dtensor_reshard_load[2]'; do
      thin+="${thin:+ }--deselect=tests/interop/$t"
    done
  fi
  if [[ $rc -eq 0 ]]; then
    # SKIP_FIXTURES: the tree's committed fixtures stay as they are (the
    # suite's test_make_fixtures_script makes and checks a scratch set).
    CKPTD_TORCH2_ROOT=$root CKPTD_TORCH2_SUITE=$suite SKIP_FIXTURES=1 \
      PYTEST_ARGS="${PYTEST_ARGS:-}${thin:+ $thin}" \
      bash scripts/torch2_chroot.sh interop "$build" || rc=$?
  fi
  case $rc in
    0) echo "=== torch 2.x interop ($suite, torch $(cat "$root/.ckptd-ready")) passed ===" ;;
    3) echo "=== torch 2.x interop ($suite) SKIPPED: no torch 2.x root could be made or entered (see above) ===" ;;
    *) echo "torch 2.x interop ($suite) failed (exit $rc)" >&2; return 1 ;;
  esac
}

# Multi-node across network namespaces (tests/netns on
# tests/testing/netns_cluster.py): every node its own network stack and
# daemon, torch 2.14 / 2.6 ranks in the Debian roots, gloo across the
# bridge; skipped with the reason without root or `ip netns`. First removes
# what a killed earlier run left (namespaces, links named ckn*).
run_netns() {  # $1 = build dir
  echo "=== multi-node across network namespaces (tests/netns) [$(date -u +%T)] ==="
  /usr/bin/python3 tests/testing/netns_cluster.py down >/dev/null || true
  CKPTD_BUILD_DIR="$ROOT/$1" /usr/bin/python3 -m pytest -q -p no:cacheprovider -rs \
    --durations=15 tests/netns
}

# ThreadSanitizer: clang (so the lock annotations are checked too:
# -Werror=thread-safety fails the build on a violation), the C++ tests only.
# common/tsan_absl.cc makes Debian's uninstrumented absl::Mutex visible to
# TSan; halt_on_error makes a report fail its test.
#
# Not built or run under TSan: the tests of code that runs on one thread
# (format/'s pickle, metadata, zip and tensor-payload codecs, the save plan,
# the retention rule): TSan has nothing to find there, and their mutation
# and size tests were about 560 s of its 1210 (CPU) seconds. The release
# and ASan passes run them.
TSAN_SKIPPED_TESTS='metadata_test|metadata_decode_test|metadata_errors_test'
TSAN_SKIPPED_TESTS+='|metadata_fast_path_test|pickle_test|tensor_payload_test'
TSAN_SKIPPED_TESTS+='|zip_test|save_plan_test|retention_rule_test'
build_tsan() {
  echo "=== TSan build (build-tsan, clang, -Werror=thread-safety) [$(date -u +%T)] ==="
  local tests
  tests=$(find tests -name '*_test.cc' -not -path '*/fuzz/*' -printf '%f\n' | sed 's/\.cc$//' |
            grep -vxE "$TSAN_SKIPPED_TESTS" | sort | paste -sd';')
  # -O1 with line tables only: what TSan's reports need, at a fraction of
  # the compile time of -O2 -g.
  CKPTD_TESTS="$tests" bash scripts/build.sh build-tsan -DCMAKE_C_COMPILER=clang \
    -DCMAKE_CXX_COMPILER=clang++ -DCKPTD_TSAN=ON -DCKPTD_BUILD_BENCH=OFF -DCKPTD_BUILD_TOOLS=OFF \
    -DCMAKE_BUILD_TYPE=TSan \
    -DCMAKE_C_FLAGS_TSAN="-O1 -gline-tables-only" -DCMAKE_CXX_FLAGS_TSAN="-O1 -gline-tables-only"
}

test_tsan() {
  local build=build-tsan
  echo "=== ctest ($build) [$(date -u +%T)] ==="
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$ROOT/tests/tsan.supp" \
    ctest --test-dir $build --output-on-failure -j2 --no-tests=error --timeout 600
}

build_fuzz() {
  echo "=== fuzz build (build-fuzz, clang) [$(date -u +%T)] ==="
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCKPTD_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -gline-tables-only -DNDEBUG" \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -gline-tables-only -DNDEBUG" >/dev/null
  ninja -C build-fuzz ${CKPTD_NINJA_ARGS:-}
}

build_tsan_and_fuzz() {
  build_tsan && build_fuzz
}

# The fuzzers run side by side (each is one process on one core), each for
# FUZZ_SECONDS; then each one's result is reported in turn.
run_fuzzers() {
  local build=build-fuzz fuzzer name failed=0
  local -A work=() pid=()
  echo "=== fuzz $(ls $build/fuzz/ | grep -c '_fuzz$') targets side by side for ${FUZZ_SECONDS}s [$(date -u +%T)] ==="
  for fuzzer in $build/fuzz/*_fuzz; do
    name=$(basename "$fuzzer" _fuzz)
    work[$name]=$(mktemp -d)
    mkdir -p "${work[$name]}/corpus"
    "$fuzzer" -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=2048 -timeout=10 \
      -print_final_stats=1 -artifact_prefix="${work[$name]}/" "${work[$name]}/corpus" \
      "tests/fuzz/corpus/$name" > "${work[$name]}/log" 2>&1 &
    pid[$name]=$!
  done
  for name in "${!pid[@]}"; do
    if ! wait "${pid[$name]}"; then
      tail -n 60 "${work[$name]}/log" >&2
      echo "fuzzer $name found a failing input (artifacts in ${work[$name]})" >&2
      failed=1
      continue
    fi
    echo "fuzz $name: $(grep -E "stat::number_of_executed_units|stat::peak_rss_mb" \
      "${work[$name]}/log" | awk '{print $1, $2}' | paste -sd' ')"
    rm -rf "${work[$name]}"
  done
  [[ $failed -eq 0 ]] || exit 1
}

# A build that runs in the background, niced, beside a test phase that
# leaves a core mostly idle (the torch 2.x interop jobs, the pytest passes):
# on the 2-core CI machine the next build is then largely done when the
# tests end. `bg_build NAME CMD...` starts it (output in a log, -j2);
# `bg_wait NAME` waits for it and fails the run, printing the log's tail,
# if it failed. The tests beside it keep their CPU: the build runs at nice
# 19, and every test tolerates a busy second core (DEVELOPERS.md).
BG_LOGS=$(mktemp -d /tmp/ckptd-bg-build.XXXXXX)
declare -A BG_PID=()
kill_tree() {
  local child
  for child in $(pgrep -P "$1" 2>/dev/null); do kill_tree "$child"; done
  kill "$1" 2>/dev/null || true
}
# A run that fails leaves no build running behind it.
trap 'for p in "${BG_PID[@]}"; do kill_tree "$p"; done' EXIT
bg_build() {
  local name=$1
  shift
  echo "=== $name build started in the background (nice 19, -j2) [$(date -u +%T)] ==="
  ( rc=0; start=$(date +%s)
    renice -n 19 -p "$BASHPID" > /dev/null
    export CKPTD_NINJA_ARGS="-j2"
    "$@" > "$BG_LOGS/$name.log" 2>&1 || rc=$?
    echo "$rc $(( $(date +%s) - start ))" > "$BG_LOGS/$name.rc" ) &
  BG_PID[$name]=$!
}
bg_wait() {
  local name=$1
  echo "=== waiting for the $name build [$(date -u +%T)] ==="
  wait "${BG_PID[$name]}" || true
  local rc secs
  read -r rc secs < "$BG_LOGS/$name.rc" || { rc=1; secs=?; }
  if [[ $rc -ne 0 ]]; then
    tail -n 80 "$BG_LOGS/$name.log" >&2
    echo "the $name build failed (exit $rc; whole log: $BG_LOGS/$name.log)" >&2
    exit 1
  fi
  grep -E "^(ninja:|\[[0-9]+/[0-9]+\] Linking)" "$BG_LOGS/$name.log" | tail -n 1 || true
  echo "=== $name build done, ${secs}s in the background [$(date -u +%T)] ==="
}

case $MODE in
  quick)
    bash scripts/build.sh build
    run_suite build ;;
  asan)
    CKPTD_SANITIZE=1 bash scripts/build.sh build-asan
    ASAN_OPTIONS=detect_leaks=1 run_suite build-asan -m "not once" ;;
  fuzz)
    build_fuzz
    run_fuzzers ;;
  tsan)
    build_tsan
    test_tsan ;;
  faults)
    bash scripts/build.sh build
    run_faults build ;;
  torch2)
    start_torch2_setups trixie sid
    bash scripts/build.sh build
    run_torch2 build trixie
    run_torch2 build sid ;;
  netns)
    start_torch2_setups trixie sid
    bash scripts/build.sh build
    wait "${TORCH2_SETUP_PID[@]}" || true
    run_netns build ;;
  full)
    echo "=== clang-format and structure checks [$(date -u +%T)] ==="
    bash scripts/check_format.sh
    /usr/bin/python3 scripts/check_structure.py
    start_torch2_setups trixie sid
    # The release build's own C++ tests are the four suites whose scale the
    # sanitizer builds thin (tests/testing/sanitizers.h): the .metadata
    # codec's (metadata_test, metadata_decode_test, metadata_errors_test),
    # metadata_scale_test, metadata_fast_path_test and pickle_test. Every
    # C++ test runs under ASan/UBSan and under TSan, so building them all a
    # third time (gcc -O2, about 40 % of this build) would only repeat those
    # runs. A unity build: 9.6 CPU-minutes instead of 15.8 (DEVELOPERS.md).
    RELEASE_TESTS='metadata_test;metadata_decode_test;metadata_errors_test'
    RELEASE_TESTS+=';metadata_scale_test;metadata_fast_path_test;pickle_test'
    CKPTD_UNITY=ON CKPTD_TESTS="$RELEASE_TESTS" bash scripts/build.sh build
    # The ASan build runs beside the release ctest and the two torch roots'
    # suites; the TSan and fuzz builds beside the ASan and release pytest.
    bg_build asan env CKPTD_SANITIZE=1 bash scripts/build.sh build-asan
    run_ctest build
    run_torch2 build trixie
    run_torch2 build sid
    run_netns build
    bg_wait asan
    run_ctest build-asan
    bg_build tsan+fuzz build_tsan_and_fuzz
    # Each Python test runs once, under ASan where it can (tests/conftest.py):
    # the ASan pass lists what passed there, the release pass runs the rest
    # (the Python client's tests, which need the uninstrumented library; the
    # long multi-process suites, pytest marker `once`: the soak, the kill -9
    # and ENOSPC points on a real ext4). The C++ tests run under ASan and
    # TSan.
    PASSED_UNDER_ASAN=$(mktemp /tmp/ckptd-asan-passed.XXXXXX)
    ASAN_OPTIONS=detect_leaks=1 CKPTD_PYTEST_PASSED_OUT=$PASSED_UNDER_ASAN \
      run_pytest build-asan -m "not once"
    CKPTD_PYTEST_PASSED_IN=$PASSED_UNDER_ASAN run_pytest build
    rm -f "$PASSED_UNDER_ASAN"
    run_faults build
    bg_wait tsan+fuzz
    test_tsan
    run_fuzzers ;;
esac
echo "=== all tests passed ($MODE) [$(date -u +%T)] ==="
