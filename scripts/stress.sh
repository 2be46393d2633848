#!/usr/bin/env bash
# Runs one test command many times in a row with other cores kept busy, and
# stops at the first failure (its log is kept). For the "passes N
# consecutive runs under load" checks of the concurrency suites.
#
#   scripts/stress.sh [-n RUNS] [-b BUSY_LOOPS] [-t TIMEOUT_S] [-o LOGDIR] -- CMD [ARGS...]
#
#   -n  runs (default 50)
#   -b  busy loops (processes spinning on `:`) running for the whole time
#       (default: nproc - 1, i.e. "the other core busy" on a 2-core machine)
#   -t  timeout of each run in seconds (default 900): a run that hangs fails
#   -o  where each failing run's log goes (default: a new /tmp dir)
#
# Prints one line per run (number, seconds, status) and a summary line
# "stress: K of N runs passed ..."; exit status 0 only if all N passed.
# Examples:
#   scripts/stress.sh -n 50 -- build/tests/multinode_test
#   scripts/stress.sh -n 50 -- env CKPTD_BUILD_DIR=$PWD/build /usr/bin/python3 -m pytest -q \
#       -p no:cacheprovider tests/python/test_pyclient_dist.py
set -uo pipefail

RUNS=50
BUSY=$(( $(nproc) - 1 ))
TIMEOUT=900
LOGDIR=""
while getopts "n:b:t:o:" opt; do
  case $opt in
    n) RUNS=$OPTARG ;;
    b) BUSY=$OPTARG ;;
    t) TIMEOUT=$OPTARG ;;
    o) LOGDIR=$OPTARG ;;
    *) echo "usage: $0 [-n RUNS] [-b BUSY] [-t TIMEOUT_S] [-o LOGDIR] -- CMD..." >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[[ "${1:-}" == "--" ]] && shift
(( $# > 0 )) || { echo "usage: $0 [-n RUNS] [-b BUSY] [-t TIMEOUT_S] [-o LOGDIR] -- CMD..." >&2; exit 2; }
[[ -n "$LOGDIR" ]] || LOGDIR=$(mktemp -d /tmp/ckptd-stress.XXXXXX)
mkdir -p "$LOGDIR"

busy_pids=()
stop_busy() {
  local p
  for p in "${busy_pids[@]}"; do kill "$p" 2>/dev/null; done
  wait "${busy_pids[@]}" 2>/dev/null
}
trap stop_busy EXIT
for ((i = 0; i < BUSY; i++)); do
  ( while :; do :; done ) &
  busy_pids+=($!)
done

echo "stress: $RUNS runs of: $* ($BUSY busy loops, ${TIMEOUT}s timeout each, logs of failures in $LOGDIR)"
passed=0
start=$(date +%s)
worst=0
for ((run = 1; run <= RUNS; run++)); do
  log="$LOGDIR/run-$run.log"
  t0=$(date +%s.%N)
  timeout --kill-after=10 "$TIMEOUT" "$@" > "$log" 2>&1
  rc=$?
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  worst=$(awk -v a="$worst" -v b="$secs" 'BEGIN { print (b > a ? b : a) }')
  if [[ $rc -eq 0 ]]; then
    passed=$((passed + 1))
    echo "run $run: ${secs}s ok"
    rm -f "$log"
  else
    what="exit $rc"; [[ $rc -eq 124 || $rc -eq 137 ]] && what="timed out after ${TIMEOUT}s"
    echo "run $run: ${secs}s FAILED ($what), log: $log"
    tail -n 40 "$log"
    break
  fi
done
echo "stress: $passed of $RUNS runs passed in $(( $(date +%s) - start ))s (slowest run ${worst}s, $BUSY busy loops): $*"
[[ $passed -eq $RUNS ]]
