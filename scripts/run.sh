#!/usr/bin/env bash
# The main job: set up (Debian packages), build, start a local ckptd daemon
# with its defaults under ./demo/, have 4 trainer processes save a sample
# ~1 GiB state through it (they resume as soon as it is staged), wait for the
# commit, restore the checkpoint resharded into 3 ranks, check it with
# ckptctl (verify, inspect, list/status against the daemon) and load it with
# PyTorch itself; then a 2-process training job checkpoints with
# ckptd.CheckpointManager and a second run resumes it (scripts/train_demo.py);
# then stop the daemon.
#
#   scripts/run.sh [--size-mb N] [--dir DIR]
#
# Printed: each rank's stall, the durable time and throughput, the restore;
# the training job's first-checkpoint and steady-state stalls, each as a
# ratio to a memcpy of the same bytes timed in the same process.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE_MB=1024
DEMO=demo
while (($#)); do
  case $1 in
    --size-mb) SIZE_MB=$2; shift 2 ;;
    --dir) DEMO=$2; shift 2 ;;
    *) echo "usage: $0 [--size-mb N] [--dir DIR]" >&2; exit 2 ;;
  esac
done

bash scripts/setup.sh
bash scripts/build.sh build >/dev/null

DEMO=$(realpath -m "$DEMO")
SOCK="$DEMO/ckptd.sock"
SHM=/dev/shm/ckptd-demo-$$
CKPT="$DEMO/checkpoints/step_1000"
rm -rf "$DEMO/checkpoints" "$DEMO/state"
mkdir -p "$DEMO"
echo "=== start ckptd (socket $SOCK, log $DEMO/ckptd.log) ==="
./build/bin/ckptd --socket="$SOCK" --checkpoint_roots="$DEMO/checkpoints" \
  --state_dir="$DEMO/state" --shm_dir="$SHM" >"$DEMO/ckptd.log" 2>&1 &
DAEMON=$!
cleanup() {
  kill -TERM "$DAEMON" 2>/dev/null && wait "$DAEMON" || true
  rm -rf "$SHM"
}
trap cleanup EXIT
for _ in $(seq 100); do [[ -S "$SOCK" ]] && break; sleep 0.05; done
[[ -S "$SOCK" ]] || { cat "$DEMO/ckptd.log"; echo "ckptd did not start" >&2; exit 1; }
export CKPTD_SOCKET="$SOCK"

echo "=== save through the daemon (4 ranks) and resharded restore (3 ranks) ==="
./build/bin/ckptd_demo --socket "$SOCK" --dir step_1000 --size-mb "$SIZE_MB" \
  --save-ranks 4 --load-ranks 3
echo "=== ckptctl list / status (from the daemon) ==="
./build/bin/ckptctl list
./build/bin/ckptctl status "$CKPT"
echo "=== ckptctl verify ==="
./build/bin/ckptctl verify "$CKPT"
echo "=== ckptctl inspect ==="
./build/bin/ckptctl inspect "$CKPT" | head -n 12
echo "=== ckptctl convert → torch.load (Debian torch 1.13) ==="
./build/bin/ckptctl convert "$CKPT" "$DEMO/step_1000.pt"
/usr/bin/python3 - "$DEMO/step_1000.pt" <<'PY'
import sys, torch
sd = torch.load(sys.argv[1])
w = sd["model"]["layers.0.weight"]
print(f"torch.load: {len(sd['model'])} model tensors, layers.0.weight {tuple(w.shape)} {w.dtype}, "
      f"step={sd['step']}, optim={sd['optim']['param_groups'][0]}")
PY
rm -f "$DEMO/step_1000.pt"
echo "=== Python: a 2-process training job with ckptd.CheckpointManager (first vs steady-state stall), then a resumed run ==="
CKPTD_CLIENT_LIB="$PWD/build/client/libckptd_client.so" PYTHONPATH="$PWD/client/python" \
  /usr/bin/python3 scripts/train_demo.py "$DEMO/checkpoints/train" 2
./build/bin/ckptctl list --job "$DEMO/checkpoints/train"
echo "=== done: checkpoints in $DEMO/checkpoints ==="
