#!/usr/bin/python3
"""Restore through the daemon vs every rank reading alone, every
figure beside a reference measured in the same run.

    /usr/bin/python3 bench/restore_bench.py [--gib 1] [--ranks 8] [--json FILE]
        [--stock-root /var/cache/ckptd/torch2-sid] [--skip-stock]

The workload: a checkpoint of --gib GiB (float32 tensors of 64 MiB, saved by
one rank through a daemon) that --ranks local ranks all restore in full —
the replicated case (DDP parameters, replicated optimizer state). Before
each measurement the ranks have started, imported torch, loaded ckptd's
native library (as a trainer has by the time it restores; with the page
cache dropped, a library load in the clock would read its shared libraries
from disk) and pre-faulted their tensors; then the page cache is dropped
and all of them load at once.

  storage bytes   rchar (/proc/PID/io: bytes read by read/pread, page cache
                  hits included, so the cache cannot hide a repeat) of the
                  daemon and of the ranks, summed, divided by the
                  checkpoint's stored bytes: through the daemon (target
                  <= 1.1x) vs ckptd.load's direct reader in every rank
                  (about --ranks x)
  wall time       first start to last finish of the ranks: through the
                  daemon vs --ranks concurrent stock dcp.load (no_dist) of
                  the same checkpoint in the torch 2.x root (target <= 0.3x),
                  and vs the direct reader
With --memory-tier the daemon runs with memory_tier_bytes (docs/restore.md
"Memory tier"): the checkpoint is held in its memory after the commit, and

  tier speed      --ranks ranks (new processes: restarted trainers) restore
                  it through the daemon, page cache dropped first, against
                  the same ranks copying the same bytes from a tensor of
                  their own into theirs (torch copy_, one memcpy): memcpy
                  wall / restore wall (target >= 0.5x); the daemon's rchar
                  is its pread of the held memfds (the ends of records the
                  CRC-32 check reads), no data file
                  (tests/python/test_memory_tier.py subtracts the tier's
                  served bytes to show it)
Every rank's checksum runs only after all ranks finished loading (a
checksum beside another rank's load would slow that load, and the memcpy
reference most: before 2026-11-29 it did, and the memory tier's speed read
2-5x too high on 2 cores).

Every rank checks its values (a checksum per tensor). Needs root (drop_caches,
the torch root). Exit status: 0 targets met, 1 missed, 2 error.
"""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
BUILD = pathlib.Path(os.environ.get("CKPTD_BUILD_DIR", REPO / "build"))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "client" / "python"))
os.environ.setdefault("CKPTD_CLIENT_LIB", str(BUILD / "client" / "libckptd_client.so"))

TENSOR_MIB = 64


def rchar(pid="self"):
    for line in open(f"/proc/{pid}/io"):
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def state(gib, fill):
    import torch
    n = max(1, int(gib * 1024 // TENSOR_MIB))
    numel = TENSOR_MIB * (1 << 20) // 4
    sd = {}
    for i in range(n):
        t = torch.empty(numel, dtype=torch.float32)
        if fill:  # in place: no temporaries (8 ranks x 2 states fill the VM)
            torch.arange(numel, dtype=torch.float32, out=t).mul_(1e-6).add_(i)
        else:
            t.zero_()  # pre-faulted
        sd[f"layer{i:03d}.weight"] = t
    return sd


def checksum(sd):
    return {k: float(v.double().sum()) for k, v in sd.items()}


def child(args):
    """One rank: pre-fault, say ready, wait for 'go', load (mode memcpy:
    copy the same bytes from a filled state of its own), report its times;
    only when told 'check' (every rank has finished) check its values, so
    that no rank's checksum runs beside another's load."""
    import ckptd
    from ckptd import _native
    if args.mode != "memcpy":
        _native.library_api_version()  # loads the library
    sd = state(args.gib, fill=False)
    src = state(args.gib, fill=True) if args.mode == "memcpy" else None
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 2
    r0 = rchar()
    t0 = time.time()
    if src is not None:
        for k, t in sd.items():
            t.copy_(src[k])
    else:
        ckptd.load(sd, args.child_dir, via_daemon=(args.mode == "daemon"),
                   local_rank=args.local_rank, local_world_size=args.ranks,
                   socket=args.socket)
    t1 = time.time()
    print(json.dumps({"t0": t0, "t1": t1, "rchar": rchar() - r0}), flush=True)
    if sys.stdin.readline().strip() != "check":
        return 2
    stats = None
    if args.mode == "daemon":
        from ckptd import _restore
        s = _restore.last_stats()
        stats = s if isinstance(s, dict) else getattr(s, "__dict__", str(s))
    result = {"sums": checksum(sd), "stats": stats, "again": None}
    if args.mode == "daemon" and args.memory_tier:
        # The same rank restores once more, all ranks together again: its
        # client, arena and mappings are then warm (what a fresh process
        # pays for first is left out).
        for t in sd.values():
            t.zero_()
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            return 2
        a0 = time.time()
        ckptd.load(sd, args.child_dir, via_daemon=True, local_rank=args.local_rank,
                   local_world_size=args.ranks, socket=args.socket)
        result["again"] = [a0, time.time()]
        if checksum(sd) != result["sums"]:
            result["sums"] = None  # the second restore differs from the first
    print(json.dumps(result), flush=True)
    return 0


def run_ranks(args, mode, directory, socket, daemon_pid):
    procs = []
    for i in range(args.ranks):
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--child", mode, "--child-dir", str(directory),
             "--local-rank", str(i), "--ranks", str(args.ranks), "--gib", str(args.gib),
             "--socket", str(socket)] + (["--memory-tier"] if args.memory_tier else []),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    for p in procs:
        if p.stdout.readline().strip() != "ready":
            raise RuntimeError(f"a {mode} rank did not start")
    drop_caches()
    d0 = rchar(daemon_pid)
    tell(procs, "go")
    outs = [json.loads(read_line(p, mode)) for p in procs]
    daemon_rchar = rchar(daemon_pid) - d0
    tell(procs, "check")   # only now: no checksum beside another rank's load
    if mode == "daemon" and args.memory_tier:
        for p in procs:
            if read_line(p, mode) != "ready":
                raise RuntimeError(f"a {mode} rank did not restore again")
        tell(procs, "go")
    for p, o in zip(procs, outs):
        o.update(json.loads(read_line(p, mode)))
        if p.wait(timeout=900) != 0:
            raise RuntimeError(f"a {mode} rank failed (exit {p.returncode})")
    wall = max(o["t1"] for o in outs) - min(o["t0"] for o in outs)
    return wall, daemon_rchar + sum(o["rchar"] for o in outs), outs


def tell(procs, word):
    for p in procs:
        p.stdin.write(word + "\n")
        p.stdin.flush()


def read_line(p, mode):
    line = p.stdout.readline().strip()
    if not line:
        raise RuntimeError(f"a {mode} rank failed (exit {p.wait(timeout=900)})")
    return line


def start_daemon(*flags):
    """(its directory, a Daemon) under /tmp (the torch root binds it at the
    same path)."""
    from daemon_bench import Daemon
    root = pathlib.Path(tempfile.mkdtemp(prefix="restore-bench-", dir="/tmp"))
    return root, Daemon(root, "--staging_budget=4G", *flags)


def save_checkpoint(args, daemon, name):
    """The --gib state saved by one rank through `daemon` into `name`:
    (directory, checksums, stored bytes of its data files)."""
    import ckptd
    directory = daemon.ckpt / name
    sd = state(args.gib, fill=True)
    expect = checksum(sd)
    ckptd.save(sd, str(directory), socket=str(daemon.socket))
    del sd
    return directory, expect, sum(f.stat().st_size for f in directory.glob("*.distcp"))


def run_stock(args, directory):
    """--ranks concurrent stock dcp.load in the torch 2.x root (one chroot,
    bench/stock_load.py --procs), started together, cache dropped first; with
    --stock-python that Python instead of the root (a machine whose own
    torch is 2.x, as the GPU machine's)."""
    load = ["bench/stock_load.py", str(directory), "--procs", str(args.ranks)]
    if args.stock_python:
        cmd, env = [args.stock_python] + load, None
    else:
        cmd = ["bash", str(REPO / "scripts" / "torch2_chroot.sh"), "run", "python3"] + load
        env = dict(os.environ, CKPTD_TORCH2_ROOT=args.stock_root,
                   CKPTD_TORCH2_SUITE=pathlib.Path(args.stock_root).name.split("-")[-1])
    out = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True,
                         timeout=3600, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    return res["wall"], res


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--json")
    p.add_argument("--stock-root", default="/var/cache/ckptd/torch2-sid")
    p.add_argument("--skip-stock", action="store_true")
    p.add_argument("--daemon-flag", action="append", default=[],
                   help="a flag for the daemon, e.g. --daemon-flag=--restore_direct_io=false "
                        "(repeatable)")
    p.add_argument("--stock-python",
                   help="run stock dcp.load with this Python (torch 2.x) instead of the root")
    p.add_argument("--memory-tier", action="store_true",
                   help="restore from the daemon's memory tier vs a same-run memcpy")
    p.add_argument("--child")
    p.add_argument("--child-dir")
    p.add_argument("--local-rank", type=int, default=0)
    p.add_argument("--socket")
    args = p.parse_args()
    if args.child:
        args.mode = args.child
        return child(args)

    if args.memory_tier:
        return memory_tier_main(args)
    import ckptd
    root, daemon = start_daemon(*args.daemon_flag)
    results, missed = [], []
    try:
        directory, expect, stored = save_checkpoint(args, daemon, "replicated")
        print(f"checkpoint: {stored / 2**30:.2f} GiB in {directory}; {args.ranks} ranks "
              f"restore all of it; page cache dropped before each run", flush=True)

        def check(outs, what):
            for o in outs:
                if o["sums"] != expect:
                    raise RuntimeError(f"{what}: a rank restored wrong values")

        wall_d, read_d, outs_d = run_ranks(args, "daemon", directory, daemon.socket,
                                           daemon.proc.pid)
        check(outs_d, "daemon")
        wall_x, read_x, outs_x = run_ranks(args, "direct", directory, daemon.socket,
                                           daemon.proc.pid)
        check(outs_x, "direct")
        rows = [("storage bytes / stored, daemon", read_d / stored, "direct reader",
                 read_x / stored, None, "x"),
                ("wall, daemon", wall_d, "direct reader", wall_x, None, "s")]
        if not args.skip_stock:
            wall_s, _ = run_stock(args, directory)
            rows.append(("wall, daemon", wall_d, f"{args.ranks} x stock dcp.load", wall_s,
                         0.3, "s"))
        print(f"{'figure':<34} {'value':>9} | {'reference':<22} {'ref':>9} | ratio")
        for name, v, ref_name, ref, target, unit in rows:
            ratio = v / ref
            ok = target is None or ratio <= target
            tgt = "" if target is None else f" (target <= {target}) {'ok' if ok else 'MISSED'}"
            print(f"{name:<34} {v:8.3f}{unit} | {ref_name:<22} {ref:8.3f}{unit} | {ratio:6.3f}{tgt}")
            results.append({"figure": name, "value": v, "reference": ref_name,
                            "reference_value": ref, "ratio": ratio, "target": target, "met": ok})
            if not ok:
                missed.append(name)
        amp = read_d / stored
        ok = amp <= 1.1
        print(f"storage amplification through the daemon {amp:.3f}x (target <= 1.1) "
              f"{'ok' if ok else 'MISSED'}; direct reader {read_x / stored:.2f}x")
        results.append({"figure": "storage amplification, daemon", "value": amp,
                        "target": 1.1, "met": ok})
        if not ok:
            missed.append("storage amplification")
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps(
                {"gib": args.gib, "ranks": args.ranks, "stored_bytes": stored,
                 "results": results, "daemon_rank_stats": [o["stats"] for o in outs_d]},
                indent=1))
    finally:
        daemon.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 1 if missed else 0


def meminfo_bytes(field):
    """A /proc/meminfo figure, in bytes."""
    for line in open("/proc/meminfo"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def memory_tier_main(args):
    import ckptd
    root, daemon = start_daemon(
        *args.daemon_flag, f"--memory_tier_bytes={int(args.gib * 1.25 * 2**30) + (64 << 20)}")
    try:
        directory, expect, stored = save_checkpoint(args, daemon, "held")
        held = ckptd.client(str(daemon.socket)).status(str(directory))["memory_tier_bytes"]
        if held < stored:
            raise RuntimeError(f"the tier holds {held} bytes of {stored}")
        huge = meminfo_bytes("ShmemHugePages")
        print(f"checkpoint: {stored / 2**30:.2f} GiB in {directory}, held in the daemon's "
              f"memory ({held / 2**30:.2f} GiB; shmem in huge pages on this machine: "
              f"{huge / 2**30:.2f} GiB); {args.ranks} new ranks restore all of it; "
              f"page cache dropped first", flush=True)
        wall_t, read_t, outs = run_ranks(args, "daemon", directory, daemon.socket,
                                         daemon.proc.pid)
        if any(o["sums"] != expect for o in outs):
            raise RuntimeError("a rank restored wrong values from the tier")
        wall_m, _, outs_m = run_ranks(args, "memcpy", directory, daemon.socket,
                                      daemon.proc.pid)
        if any(o["sums"] != expect for o in outs_m):
            raise RuntimeError("memcpy reference: wrong values")
        speed = wall_m / wall_t
        ok = speed >= 0.5
        wall_w = max(o["again"][1] for o in outs) - min(o["again"][0] for o in outs)
        ranks_read = sum(o["rchar"] for o in outs)
        daemon_read = read_t - ranks_read
        print(f"{'figure':<34} {'value':>9} | {'reference':<22} {'ref':>9} | ratio")
        print(f"{'wall, restore from the tier':<34} {wall_t:8.3f}s | "
              f"{'memcpy of the bytes':<22} {wall_m:8.3f}s | speed {speed:6.3f} "
              f"(target >= 0.5) {'ok' if ok else 'MISSED'}")
        print(f"{'wall, again (warm client)':<34} {wall_w:8.3f}s | "
              f"{'memcpy of the bytes':<22} {wall_m:8.3f}s | speed {wall_m / wall_w:6.3f}")
        print(f"daemon rchar during the restore: {daemon_read / 2**20:.1f} MiB "
              f"({daemon_read / stored:.4f} of the stored bytes; its pread of the held "
              f"memfds for the CRC-32 check included)")
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps(
                {"gib": args.gib, "ranks": args.ranks, "stored_bytes": stored,
                 "tier_wall": wall_t, "memcpy_wall": wall_m, "speed": speed,
                 "tier_wall_warm": wall_w,
                 "daemon_rchar": daemon_read}, indent=1))
    finally:
        daemon.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
