#!/usr/bin/env bash
# The main job: set up (Debian packages), build, then run a sample multi-rank
# save and a resharded restore, and check the result with ckptctl and with
# PyTorch itself.
#
#   scripts/run.sh [--size-mb N] [--dir DIR]
#
# Until the daemon lands (issue 3) this drives the format library directly:
# 4 simulated ranks save an FSDP-style sharded state (plus replicated
# parameters and optimizer hyper-parameters) as a standard DCP directory,
# 3 ranks restore it, ckptctl verifies/inspects/converts it, and torch 1.13
# loads the converted file and every payload.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE_MB=512
DIR=demo_ckpt/step_1000
while (($#)); do
  case $1 in
    --size-mb) SIZE_MB=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    *) echo "usage: $0 [--size-mb N] [--dir DIR]" >&2; exit 2 ;;
  esac
done

bash scripts/setup.sh
bash scripts/build.sh build >/dev/null
echo "=== save (4 ranks) and resharded restore (3 ranks) ==="
rm -rf "$DIR"
./build/bin/ckptd_demo --dir "$DIR" --size-mb "$SIZE_MB" --save-ranks 4 --load-ranks 3
echo "=== ckptctl verify ==="
./build/bin/ckptctl verify "$DIR"
echo "=== ckptctl inspect ==="
./build/bin/ckptctl inspect "$DIR" | head -n 20
echo "=== ckptctl convert → torch.load (Debian torch 1.13) ==="
./build/bin/ckptctl convert "$DIR" "$DIR.pt"
/usr/bin/python3 - "$DIR.pt" <<'PY'
import sys, torch
sd = torch.load(sys.argv[1])
w = sd["model"]["layers.0.weight"]
print(f"torch.load: {len(sd['model'])} model tensors, layers.0.weight {tuple(w.shape)} {w.dtype}, "
      f"step={sd['step']}, optim={sd['optim']['param_groups'][0]}")
PY
rm -f "$DIR.pt"
echo "=== done: checkpoint in $DIR ==="
