#!/usr/bin/env bash
# The GPU path's checks in ONE command on the GPU machine (torch 2.11, one
# H100, no network, at most 10 minutes a command):
#
#   bash scripts/gpu_check.sh                      # $OUT (default /tmp) gets the results
#
#   1. finds the Python with torch >= 2.4 and CUDA ($PYTHON, python3, ...);
#   2. the build: $CKPTD_BUILD_DIR (default build-gpu) if its bin/ckptd and
#      client/libckptd_client.so are there (a carried bundle, see below, or a
#      build dir), else configures and builds it with cmake (needs cmake, a
#      compiler and the Debian dev packages, which the GPU machine normally
#      lacks: carry a bundle instead);
#   3. C++ GPU tests: `ctest -L gpu` in the build dir when its CTest files
#      and executables are there, else the bundle's gpu_tests/manifest.json
#      (the same commands, paths rewritten);
#   4. pytest tests/gpu with CKPTD_REQUIRE_GPU=1 (no GPU or no cuda_ipc in
#      the daemon is a failure there, not a skip);
#   5. bench/gpu_bench.py --gib $BENCH_GIB (default 10) --reps 3 with a
#      deadline from the time left, --json $OUT/gpu_bench.json;
#   6. tests/interop (tests/interop/run_on_gpu_machine.sh, SKIP_FIXTURES=1,
#      SKIP_BUILD=1) with torch 2.11, if the time left holds it.
#
# One command may run 10 minutes there, and the whole check does not fit in
# one: steps 1-5 take about 5.5 minutes on the H200 (10 GiB bench), the
# interop suite about 7 (INTEROP_NEED_S). So run it as two calls, the
# second with SKIP_CTEST=1 SKIP_PYTEST=1 SKIP_BENCH=1; a single call
# reports the suite as not run, with that command.
#
# Results (refreshed after every step, so a run cut off still returns them):
# $OUT/gpu_check_summary.txt, $OUT/gpu_bench.json, $OUT/pytest_gpu.log,
# $OUT/gpu_logs.tar.gz (every log). Exit status 0 only if every test step
# passed (the bench's targets are reported, not enforced).
#
# Knobs: PYTHON, CKPTD_BUILD_DIR, BUDGET_S (570: the whole run),
# INTEROP_NEED_S (420), BENCH_MIN_S (270), BENCH_GIB,
# BENCH_REPS, SKIP_CTEST=1, SKIP_PYTEST=1, SKIP_INTEROP=1, SKIP_BENCH=1,
# PYTEST_ARGS, CKPTD_GPU_DAEMON_FLAGS ("key=value,..." for the daemons).
#
# The bundle (made HERE, on the build machine, which has the toolchain and
# the Debian packages; the GPU machine runs Debian 12's binaries fine):
#   bash scripts/gpu_check.sh --make-bundle build build-gpu
# = tests/interop/run_on_gpu_machine.sh --make-bundle (daemon, ckptctl,
# client library, tools, shared libraries) plus the executables of the
# `gpu`-labeled ctest tests and gpu_tests/manifest.json. Carry build-gpu
# (an ignored path, well under the 64 MiB limit) and run this script there.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
START=$(date +%s)

if [[ "${1:-}" == "--make-bundle" ]]; then
  src=$(cd "${2:?usage: $0 --make-bundle BUILD_DIR OUT_DIR}" && pwd) || exit 1
  dst=${3:?usage: $0 --make-bundle BUILD_DIR OUT_DIR}
  bash tests/interop/run_on_gpu_machine.sh --make-bundle "$src" "$dst" || exit 1
  mkdir -p "$dst/gpu_tests" || exit 1
  dst=$(cd "$dst" && pwd)
  (cd "$src" && ctest --show-only=json-v1 -L gpu) > "$dst/gpu_tests/ctest.json" || {
    echo "ctest -L gpu --show-only failed in $src" >&2; exit 1; }
  python3 - "$src" "$dst" "$ROOT" <<'EOF' || exit 1
import json, os, shutil, subprocess, sys
src, dst, root = sys.argv[1:]
doc = json.load(open(os.path.join(dst, "gpu_tests", "ctest.json")))
tests, exes = [], {}
for t in doc.get("tests", []):
    cmd = t.get("command") or []
    if not cmd:
        continue
    exe = cmd[0]
    name = os.path.basename(exe)
    if name not in exes:
        shutil.copy2(exe, os.path.join(dst, "gpu_tests", name))
        subprocess.run(["strip", "--strip-debug", os.path.join(dst, "gpu_tests", name)])
        exes[name] = exe
    props = {p["name"]: p["value"] for p in t.get("properties", [])}
    tests.append({"name": t["name"], "exe": name, "args": cmd[1:],
                  "env": props.get("ENVIRONMENT", []), "cwd": props.get("WORKING_DIRECTORY", ""),
                  "labels": props.get("LABELS", [])})
json.dump({"source_dir": root, "build_dir": src, "tests": tests},
          open(os.path.join(dst, "gpu_tests", "manifest.json"), "w"), indent=1)
print(f"gpu_tests: {len(tests)} tests in {len(exes)} executables")
EOF
  # The libraries the test executables need beyond the bundle's, by RPATH.
  # shellcheck source=bundle_lib.sh
  source "$ROOT/scripts/bundle_lib.sh"
  gpu_exes=()
  for f in "$dst"/gpu_tests/*; do [[ -f "$f" && -x "$f" ]] && gpu_exes+=("$f"); done
  if ((${#gpu_exes[@]})); then bundle_add_binaries "$dst" "${gpu_exes[@]}" || exit 1; fi
  du -sh "$dst"
  exit 0
fi

OUT=${OUT:-/tmp}
mkdir -p "$OUT"
LOGS=$(mktemp -d /tmp/ckptd_gpu_check.XXXXXX)
BUDGET_S=${BUDGET_S:-570}
INTEROP_NEED_S=${INTEROP_NEED_S:-420}  # tests/interop on the H200 (torch 2.11, 85 tests)
BENCH_MIN_S=${BENCH_MIN_S:-270}        # the bench's 10 GiB figures, durable included
SUMMARY=()
FAILED=0
export PYTHONUNBUFFERED=1 GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo}
BUILD=${CKPTD_BUILD_DIR:-$ROOT/build-gpu}
[[ "$BUILD" = /* ]] || BUILD="$ROOT/$BUILD"

elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( BUDGET_S - $(elapsed) )); }
publish() {
  {
    echo "ckptd gpu_check on $(hostname) at $(date -u +%FT%TZ) ($(elapsed) s so far)"
    echo "python: ${PY:-none}; torch: ${TORCH_VERSION:-none}; build: $BUILD"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
    printf '%s\n' "${SUMMARY[@]}"
  } > "$OUT/gpu_check_summary.txt"
  [[ -f "$LOGS/pytest_gpu.log" ]] && cp -f "$LOGS/pytest_gpu.log" "$OUT/pytest_gpu.log"
  tar -czf "$OUT/gpu_logs.tar.gz" -C "$LOGS" . 2>/dev/null || true
}
note() { echo "== $*"; SUMMARY+=("$*"); publish; }
fail() { echo "!! $*" >&2; SUMMARY+=("FAILED: $*"); FAILED=1; publish; }
finish() {
  publish
  echo; cat "$OUT/gpu_check_summary.txt"; echo "(results in $OUT)"
  exit $FAILED
}

# --- 1. Python with torch >= 2.4 and CUDA -------------------------------------
PY=""; TORCH_VERSION=""
for cand in ${PYTHON:-} python3 python /usr/bin/python3 /usr/local/bin/python3; do
  command -v "$cand" >/dev/null 2>&1 || continue
  v=$("$cand" -c 'import torch, re; m = re.match(r"(\d+)\.(\d+)", torch.__version__); print(torch.__version__ if (int(m[1]), int(m[2])) >= (2, 4) else "")' 2>/dev/null) || continue
  if [[ -n "$v" ]]; then PY=$(command -v "$cand"); TORCH_VERSION=$v; break; fi
done
[[ -n "$PY" ]] || { fail "no Python with torch>=2.4"; finish; }
CUDA_OK=$("$PY" -c 'import torch; print(torch.cuda.is_available())' 2>&1 | tail -n 1)
note "python $PY, torch $TORCH_VERSION, cuda available: $CUDA_OK"
[[ "$CUDA_OK" == True ]] || fail "torch.cuda.is_available() is not True: every GPU check below will fail"

# --- 2. build ----------------------------------------------------------------
have_build() { [[ -x "$BUILD/bin/ckptd" && -f "$BUILD/client/libckptd_client.so" ]]; }
if have_build; then
  note "using $BUILD (bin/ckptd $("$BUILD/bin/ckptd" --version 2>/dev/null | head -n 1))"
elif command -v cmake >/dev/null 2>&1; then
  gen=(); command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
  echo "== building into $BUILD"
  if cmake -S "$ROOT" -B "$BUILD" "${gen[@]}" -DPython3_EXECUTABLE="$PY" -DCKPTD_BUILD_BENCH=OFF \
        > "$LOGS/cmake.log" 2>&1 \
     && cmake --build "$BUILD" -j "$(nproc)" > "$LOGS/build.log" 2>&1; then
    note "built $BUILD ($(elapsed) s)"
  else
    tail -n 30 "$LOGS/cmake.log" "$LOGS/build.log" 2>/dev/null
    fail "cannot build in $BUILD (see cmake.log / build.log); carry a bundle: bash scripts/gpu_check.sh --make-bundle build build-gpu"
    finish
  fi
else
  fail "no usable $BUILD (bin/ckptd, client/libckptd_client.so) and no cmake: carry a bundle (scripts/gpu_check.sh --make-bundle)"
  finish
fi
export CKPTD_BUILD_DIR=$BUILD CKPTD_CLIENT_LIB=$BUILD/client/libckptd_client.so
export PYTHONPATH="$ROOT/client/python${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c 'import ckptd, ckptd._native as n; print("libckptd_client C API", n.library_api_version())' \
  > "$LOGS/lib_version.txt" 2>&1
note "$(tail -n 1 "$LOGS/lib_version.txt")"
"$BUILD/bin/ckptd" --help > "$LOGS/ckptd_help.txt" 2>&1 || true

# --- 3. C++ GPU tests ----------------------------------------------------------
if [[ "${SKIP_CTEST:-0}" != 1 ]]; then
  if [[ -f "$BUILD/CTestTestfile.cmake" ]] && command -v ctest >/dev/null 2>&1 \
     && (cd "$BUILD" && ctest --show-only=json-v1 -L gpu 2>/dev/null) | "$PY" -c '
import json, os, sys
t = json.load(sys.stdin)["tests"]
sys.exit(0 if t and all(os.path.exists(x["command"][0]) for x in t) else 1)'; then
    echo "== ctest -L gpu"
    (cd "$BUILD" && timeout 300 ctest -L gpu --output-on-failure) > "$LOGS/ctest_gpu.log" 2>&1
    rc=$?
    line=$(grep -E "tests passed|tests failed" "$LOGS/ctest_gpu.log" | tail -n 1)
    skipped=$(grep -c "Skipped\|SKIPPED" "$LOGS/ctest_gpu.log")
    if [[ $rc -eq 0 ]]; then note "ctest -L gpu: $line ($skipped skip lines)"
    else fail "ctest -L gpu exited $rc: $line"; tail -n 40 "$LOGS/ctest_gpu.log"; fi
  elif [[ -f "$BUILD/gpu_tests/manifest.json" ]]; then
    echo "== C++ GPU tests from $BUILD/gpu_tests/manifest.json"
    "$PY" - "$BUILD" "$ROOT" > "$LOGS/ctest_gpu.log" 2>&1 <<'EOF'
import json, os, subprocess, sys
build, root = sys.argv[1:]
m = json.load(open(os.path.join(build, "gpu_tests", "manifest.json")))
def fix(s):
    return s.replace(m["build_dir"], build).replace(m["source_dir"], root)
passed, failed, skipped = [], [], []
for t in m["tests"]:
    env = dict(os.environ)
    for kv in t["env"]:
        k, _, v = fix(kv).partition("=")
        env[k] = v
    cwd = fix(t["cwd"]) if t["cwd"] else build
    if not os.path.isdir(cwd):
        cwd = build
    cmd = [os.path.join(build, "gpu_tests", t["exe"])] + [fix(a) for a in t["args"]]
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
        out, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = f"timeout: {e}", 124
    print(f"----- {t['name']}: exit {rc}\n{out[-4000:]}")
    if rc != 0:
        failed.append(t["name"])
    elif "[  SKIPPED ]" in out:
        skipped.append(t["name"])
    else:
        passed.append(t["name"])
print(f"SUMMARY: {len(passed)} passed, {len(failed)} failed, {len(skipped)} skipped")
for n in failed: print(f"FAILED {n}")
for n in skipped: print(f"SKIPPED {n}")
sys.exit(1 if failed or not m["tests"] else 0)
EOF
    rc=$?
    line=$(grep "^SUMMARY" "$LOGS/ctest_gpu.log" | tail -n 1)
    if [[ $rc -eq 0 ]]; then note "C++ GPU tests (manifest): $line"
    else fail "C++ GPU tests (manifest): ${line:-exit $rc}"; grep -E "^(FAILED|SKIPPED)" "$LOGS/ctest_gpu.log"; fi
  else
    fail "no way to run the C++ GPU tests: $BUILD has neither runnable CTest files nor gpu_tests/manifest.json"
  fi
fi

# --- 4. pytest tests/gpu -----------------------------------------------------------
if [[ "${SKIP_PYTEST:-0}" != 1 ]]; then
  echo "== pytest tests/gpu"
  # shellcheck disable=SC2086
  CKPTD_REQUIRE_GPU=1 timeout $(( $(left) > 360 ? 300 : 200 )) "$PY" -m pytest -v -rs \
    -p no:cacheprovider tests/gpu ${PYTEST_ARGS:-} 2>&1 | tee "$LOGS/pytest_gpu.log"
  rc=${PIPESTATUS[0]}
  if [[ $rc -eq 0 ]]; then note "pytest tests/gpu: $(tail -n 1 "$LOGS/pytest_gpu.log")"
  else fail "pytest tests/gpu exited $rc: $(tail -n 1 "$LOGS/pytest_gpu.log")"; fi
fi

# --- 5. the bench (before the interop suite: the GPU figures are what only this machine gives) ---------------------------------------------------------------------
if [[ "${SKIP_BENCH:-0}" != 1 ]]; then
  d=$(( $(left) - 10 ))
  # Leave the interop suite its time when it is to run and there is room
  # for both; otherwise the bench takes what is left.
  if [[ "${SKIP_INTEROP:-0}" != 1 ]] && (( d - INTEROP_NEED_S >= BENCH_MIN_S )); then
    d=$(( d - INTEROP_NEED_S ))
  fi
  if (( d < 60 )); then
    fail "bench not run: only $(left) s left (run again with SKIP_CTEST=1 SKIP_PYTEST=1 SKIP_INTEROP=1)"
  else
    echo "== bench/gpu_bench.py (deadline ${d}s)"
    timeout $(( d + 5 )) "$PY" bench/gpu_bench.py --gib "${BENCH_GIB:-10}" --reps "${BENCH_REPS:-3}" \
      --deadline "$d" --json "$OUT/gpu_bench.json" 2>&1 | tee "$LOGS/gpu_bench.log"
    rc=${PIPESTATUS[0]}
    if [[ $rc -eq 0 ]]; then
      note "bench: $(grep -c 'OK$' "$LOGS/gpu_bench.log") targets met, $(grep -c 'MISS$' "$LOGS/gpu_bench.log") missed (table in gpu_bench.log / gpu_bench.json)"
      SUMMARY+=("$(grep -E '^\((a|b|c|d|e)\)|^skipped|^NOTE' "$LOGS/gpu_bench.log")")
    else
      SUMMARY+=("bench exited $rc (not a test failure; see gpu_bench.log)")
    fi
    publish
  fi
fi

# --- 6. tests/interop with torch 2.11, in the time left ------------------------------------------------
if [[ "${SKIP_INTEROP:-0}" != 1 ]]; then
  t=$(( $(left) - 5 ))
  if (( t < INTEROP_NEED_S )); then
    fail "tests/interop not run: it needs about ${INTEROP_NEED_S} s, $(left) s are left; run it alone: SKIP_CTEST=1 SKIP_PYTEST=1 SKIP_BENCH=1 bash scripts/gpu_check.sh"
  else
    echo "== tests/interop (timeout ${t}s)"
    (unset OUT; SKIP_FIXTURES=1 SKIP_BUILD=1 PYTHON="$PY" CKPTD_BUILD_DIR="$BUILD" \
       timeout "$t" bash tests/interop/run_on_gpu_machine.sh) > "$LOGS/interop.log" 2>&1
    rc=$?
    if [[ $rc -eq 0 ]]; then note "tests/interop: $(grep -E '^== pytest tests/interop: ' "$LOGS/interop.log" | tail -n 1)"
    elif [[ $rc -eq 124 ]]; then
      fail "tests/interop ran out of its ${t}s share (not a hang by itself: on the H200 the suite had run 78% of its tests after 296 s); run it alone: SKIP_CTEST=1 SKIP_PYTEST=1 SKIP_BENCH=1 bash scripts/gpu_check.sh"
    else fail "tests/interop exited $rc: $(grep -E 'pytest tests/interop' "$LOGS/interop.log" | tail -n 1)"; fi
  fi
fi

finish
