#!/usr/bin/env bash
# Sets up (Debian packages), builds and runs the format-library benchmark.
# Every argument is passed to the benchmark binary:
#
#   scripts/bench.sh                          all workloads, full size (~1 min)
#   scripts/bench.sh --quick                  CI-sized run (a few seconds)
#   scripts/bench.sh --workloads=serialize_64mib,durable_write --json
#   scripts/bench.sh --help                   the benchmark's own options
#
# Build directory: $CKPTD_BUILD_DIR (default: build). A directory that is not
# configured yet is configured as a Release build; an existing one is used
# with the build type it already has (the type is printed). Only the
# format_bench target (and the libraries it needs) is built.
#
# Exit status: the benchmark's (0 all targets met, 1 a target missed, 2 error).
# Figures on the 2-core VMs are noisy when something else runs: the script
# warns when the load average is above 1.5 (see docs/benchmarks.md).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${CKPTD_BUILD_DIR:-build}

bash scripts/setup.sh >&2

if [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
  cmake -S . -B "$BUILD" -G Ninja -DPython3_EXECUTABLE=/usr/bin/python3 \
    -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
echo "bench: build dir $BUILD, build type ${build_type:-RelWithDebInfo (default)}" >&2
ninja -C "$BUILD" format_bench >&2

load=$(cut -d' ' -f1 /proc/loadavg)
if awk -v l="$load" 'BEGIN { exit !(l > 1.5) }'; then
  echo "bench: warning: load average $load > 1.5; figures will be noisy" >&2
fi

exec "$BUILD/bin/format_bench" "$@"
