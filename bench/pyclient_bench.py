#!/usr/bin/python3
"""Benchmark of the Python client (client/python/ckptd) against torch 1.13's
own torch.save / torch.load, every ratio measured in the same run.

    /usr/bin/python3 bench/pyclient_bench.py [--gib 2] [--repeat 3] [--json FILE]

Workloads (one process; the state dict is 64 float32 tensors totalling
--gib GiB, built once and pre-faulted):
  async_save_stall   ckptd.async_save call duration (flatten + copy into the
                     daemon's shared memory + "staged"), steady state (the
                     arena exists: ckptd.reserve) vs torch.save of the same
                     dict to a file in the same directory    target <= 0.1x
  durable            async_save start -> commit (.metadata durable) vs
                     torch.save + fsync, and vs a raw sequential 4 MiB
                     write + fsync of the same bytes         (reported)
  bg_staging_*       async_save(background_staging=True): the call, and the
                     time until staged, vs torch.save        (reported)
  restore            ckptd.load into a preallocated state dict vs
                     torch.load of the torch.save file, both from the page
                     cache                                   target <= 1.0x
  restore_cold       the same after dropping the page cache (only when
                     /proc/sys/vm/drop_caches is writable)    (reported)
The first (cold) save, which also creates and pre-faults the arena, is
printed too. The daemon runs with a 4 GiB staging budget and a tmpfs shm
directory, as in production. Exit status: 0 targets met, 1 missed, 2 error.
"""
import argparse
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
BUILD = pathlib.Path(os.environ.get("CKPTD_BUILD_DIR", REPO / "build"))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "client" / "python"))
os.environ.setdefault("CKPTD_CLIENT_LIB", str(BUILD / "client" / "libckptd_client.so"))

import torch  # noqa: E402

from bench_report import Report  # noqa: E402

import ckptd  # noqa: E402
from daemon_bench import Daemon  # noqa: E402

GIB = 1 << 30


def median(xs):
    return statistics.median(xs)


def drop_caches():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--tensors", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--dir", help="work directory (default: a temp dir under the build dir)")
    args = ap.parse_args()
    nbytes = int(args.gib * GIB)
    per = nbytes // args.tensors // 4
    work = pathlib.Path(args.dir or tempfile.mkdtemp(prefix="pyclient_bench-", dir=BUILD))
    work.mkdir(parents=True, exist_ok=True)
    report = Report()
    results, missed = report.results, report.missed

    d = None
    try:
        sd = {f"layer.{i}.weight": torch.full((per,), float(i)) for i in range(args.tensors)}
        total = sum(t.numel() * 4 for t in sd.values())
        print(f"state dict: {args.tensors} float32 tensors, {total / GIB:.2f} GiB; "
              f"{os.cpu_count()} CPUs; torch {torch.__version__}", flush=True)
        d = Daemon(work / "d", "--staging_budget=4G")
        ref_file = d.ckpt / "torch_save.pt"

        # -- torch.save, with and without fsync -------------------------------
        ts, tsf = [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            torch.save(sd, ref_file)
            ts.append(time.perf_counter() - t0)
            os.unlink(ref_file)
            t0 = time.perf_counter()
            with open(ref_file, "wb") as f:
                torch.save(sd, f)
                f.flush()
                os.fsync(f.fileno())
            tsf.append(time.perf_counter() - t0)
            os.unlink(ref_file)

        # -- raw sequential write + fsync of the same bytes (disk reference) ----
        raw = []
        block = memoryview(bytearray(4 << 20))
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            fd = os.open(d.ckpt / "raw.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            for _ in range(total // len(block)):
                os.write(fd, block)
            os.fsync(fd)
            os.close(fd)
            raw.append(time.perf_counter() - t0)
            os.unlink(d.ckpt / "raw.bin")

        # -- ckptd.async_save --------------------------------------------------
        sock = str(d.socket)
        t0 = time.perf_counter()
        h = ckptd.async_save(sd, "cold", socket=sock)
        cold_stall = time.perf_counter() - t0
        h.result()
        print(f"first save (creates and pre-faults the arena): stall {cold_stall:.3f} s",
              flush=True)
        shutil.rmtree(h.checkpoint_id)
        stalls, durables = [], []
        for k in range(args.repeat):
            t0 = time.perf_counter()
            h = ckptd.async_save(sd, f"warm_{k}", socket=sock)
            stalls.append(time.perf_counter() - t0)
            h.result()
            durables.append(time.perf_counter() - t0)
            # Deleting is not timed (this VM's ext4 is mounted with `discard`:
            # unlinking 2 GiB takes seconds).
            shutil.rmtree(h.checkpoint_id)
        ckpt_dir = h.checkpoint_id
        report("async_save_stall", median(stalls), "torch.save", median(ts), 0.1)
        print(f"{'':<20} stalls {', '.join(f'{s:.3f}' for s in stalls)}; "
              f"torch.save {', '.join(f'{s:.3f}' for s in ts)}; "
              f"copy {h.stats.copy_seconds:.3f} s", flush=True)
        report("durable", median(durables), "torch.save + fsync", median(tsf))
        report("durable_vs_disk", median(durables), "raw 4 MiB write + fsync", median(raw))
        bg = []
        for k in range(args.repeat):
            t0 = time.perf_counter()
            h = ckptd.async_save(sd, f"bg_{k}", socket=sock, background_staging=True)
            call = time.perf_counter() - t0
            h.wait_staged()
            bg.append((call, time.perf_counter() - t0))
            h.result()
            if k + 1 < args.repeat:
                shutil.rmtree(h.checkpoint_id)
        ckpt_dir = h.checkpoint_id
        report("bg_staging_call", median(c for c, _ in bg), "torch.save", median(ts))
        report("bg_staging_staged", median(s for _, s in bg), "torch.save", median(ts))

        # -- restore -----------------------------------------------------------
        torch.save(sd, ref_file)
        dest = {k: torch.empty_like(v) for k, v in sd.items()}
        for v in dest.values():
            v.zero_()  # pre-fault, as a real model's parameters are
        tl, cl = [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            loaded = torch.load(ref_file)
            tl.append(time.perf_counter() - t0)
            del loaded
            t0 = time.perf_counter()
            ckptd.load(dest, ckpt_dir)
            cl.append(time.perf_counter() - t0)
        assert all(torch.equal(dest[k], sd[k]) for k in sd), "restore mismatch"
        report("restore", median(cl), "torch.load", median(tl), 1.0)
        if drop_caches():
            t0 = time.perf_counter()
            loaded = torch.load(ref_file)
            tcold = time.perf_counter() - t0
            del loaded
            drop_caches()
            t0 = time.perf_counter()
            ckptd.load(dest, ckpt_dir)
            ccold = time.perf_counter() - t0
            report("restore_cold", ccold, "torch.load (cold)", tcold)
        else:
            print("restore_cold: skipped (/proc/sys/vm/drop_caches not writable)")
    except Exception as e:  # noqa: BLE001
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        ckptd.close_clients()
        if d is not None:
            d.stop()
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps(results, indent=2))
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    if missed:
        print(f"MISSED: {', '.join(missed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
