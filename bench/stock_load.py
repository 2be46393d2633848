#!/usr/bin/env python3
"""Times stock torch.distributed.checkpoint.load of a checkpoint directory
into preallocated CPU tensors, after dropping the page cache
(bench/read_bench.cc compares ckptd's reader with this in the same run).

    bash scripts/torch2_chroot.sh run python3 bench/stock_load.py DIR [--warm]

Every tensor of the checkpoint is loaded whole (no process group:
no_dist=True), into torch.empty tensors of its saved dtype and shape made
before the clock; bytes items are left out. Unless --warm, the page cache is
dropped first (sync; echo 3 > /proc/sys/vm/drop_caches: needs root, as the
torch2 root runs). Prints one JSON line: {"seconds", "tensor_bytes",
"cold", "torch", "python"}.
"""
import argparse
import inspect
import json
import os
import platform
import sys
import time


def run_many(args):
    import subprocess
    cmd = [sys.executable, os.path.abspath(__file__), args.dir, "--warm", "--times",
           "--wait-go"]
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(args.procs)]
    for p in procs:
        if p.stdout.readline().strip() != "ready":
            return 2
    if not args.warm:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    outs = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            return 2
        outs.append(json.loads(out.strip().splitlines()[-1]))
    print(json.dumps({"procs": args.procs, "cold": not args.warm,
                      "wall": max(o["t1"] for o in outs) - min(o["t0"] for o in outs),
                      "seconds": [o["seconds"] for o in outs], "torch": outs[0]["torch"]}),
          flush=True)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dir")
    p.add_argument("--warm", action="store_true")
    p.add_argument("--times", action="store_true",
                   help="also print the wall-clock start and end (t0, t1)")
    p.add_argument("--procs", type=int, default=0,
                   help="run N loads at once (N processes, each loading all "
                   "of DIR, started together once all have allocated their "
                   "tensors; the cache dropped before unless --warm) and "
                   "print {wall, seconds}")
    p.add_argument("--wait-go", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.procs > 0:
        return run_many(args)
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = dcp.FileSystemReader(args.dir)
    md = reader.read_metadata()
    sd = {}
    nbytes = 0
    for fqn, item in md.state_dict_metadata.items():
        if isinstance(item, TensorStorageMetadata):
            t = torch.empty(tuple(item.size), dtype=item.properties.dtype)
            t.view(torch.uint8).fill_(0) if t.numel() else None  # pre-fault
            sd[fqn] = t
            nbytes += t.numel() * t.element_size()
    cold = not args.warm
    if args.wait_go:
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            return 2
    if cold:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    t0 = time.perf_counter()
    wall0 = time.time()
    kwargs = {}
    if "no_dist" in inspect.signature(dcp.load).parameters:
        kwargs["no_dist"] = True  # 2.6 infers it: no process group
    dcp.load(sd, storage_reader=dcp.FileSystemReader(args.dir), **kwargs)
    seconds = time.perf_counter() - t0
    out = {"seconds": seconds, "tensor_bytes": nbytes, "cold": cold,
           "torch": torch.__version__, "python": platform.python_version()}
    if args.times:
        out.update(t0=wall0, t1=time.time())
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.exit(main())
