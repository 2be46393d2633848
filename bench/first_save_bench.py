#!/usr/bin/python3
"""The first checkpoint's stall: CheckpointManager with
its background arena reservation vs the steady state, vs today's first
save (no reservation), each against a memcpy of the same bytes measured in
the same run.

    /usr/bin/python3 bench/first_save_bench.py [--mib 256] [--interval 20] [--repeat 3]
                                               [--json FILE]

One process is one rank: a state dict of --mib MiB of float32 tensors (32
"parameters" plus a small non-tensor entry), pre-faulted; a "training step"
updates every tensor in place (as an optimizer step touches every byte).
Each round opens a new connection to the daemon (ckptd.close_clients()), so
the first save is really the first of its process:
  first_save          CheckpointManager (defaults: the arena is reserved in
                      the background at the first save_async call that takes
                      no checkpoint), save_interval_steps = --interval: the
                      save_async call of the first checkpoint (waiting for the
                      reservation if it were still running, included)
                      vs memcpy                              target <= 1.5x
  steady_save         the next two checkpoints of the same run vs memcpy
  first_vs_steady     first_save vs steady_save
  first_unreserved    the same first checkpoint with reserve_bytes=0 (the
                      save creates the arena, and the connection, as it did
                      before the reservation) vs memcpy       (reported)
memcpy: ctypes.memmove of every tensor into pre-faulted buffers, one
thread, median of 5. Each figure is the median over --repeat rounds. The
daemon runs with a 4 GiB staging budget and a tmpfs shm directory. Exit
status: 0 target met, 1 missed, 2 error.
"""
import argparse
import ctypes
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

MIB = 1 << 20


def make_state(mib, tensors=32):
    per = mib * MIB // tensors // 4
    model = {f"layer.{i}.weight": torch.full((per,), float(i)) for i in range(tensors)}
    return {"model": model, "meta": {"step": 0, "lr": 1e-3}}


def memcpy_seconds(state, repeat=5):
    """Median time of a single-threaded memcpy of the state's tensors into
    pre-faulted buffers."""
    src = list(state["model"].values())
    dst = [torch.empty_like(t) for t in src]
    for t in dst:
        t.fill_(1.0)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for s, d in zip(src, dst):
            ctypes.memmove(d.data_ptr(), s.data_ptr(), s.numel() * s.element_size())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def train_step(state, step):
    for t in state["model"].values():
        t.mul_(0.999)
    state["meta"]["step"] = step


def run_manager(state, root, sock, interval, saves, **kw):
    """Trains until `saves` checkpoints were taken; returns the save_async
    call durations of the checkpoint steps, those of the other steps (the
    first sizes the state dict) and the manager's reservation."""
    stalls, other = [], []
    with ckptd.CheckpointManager(root, save_interval_steps=interval, keep_last_n=1,
                                 socket=sock, cluster=None, **kw) as mgr:
        step = 0
        while len(stalls) < saves:
            step += 1
            train_step(state, step)
            t0 = time.perf_counter()
            taken = mgr.save_async(step, state)
            (stalls if taken else other).append(time.perf_counter() - t0)
            if taken:
                mgr.join()  # the write is not what this measures
        reservation = mgr._reservation
    return stalls, other, reservation


def one_round(state, d, k, interval):
    sock = str(d.socket)
    ckptd.close_clients()  # a new connection: this process's first save again
    stalls, other, res = run_manager(state, d.ckpt / f"reserved_{k}", sock, interval, 3)
    print(f"round {k}: sizing call (step 1) {other[0] * 1e3:.1f} ms; reserved "
          f"{res.reserved / MIB:.0f} MiB in the background in {res.seconds:.3f} s; saves "
          f"{', '.join(f'{s * 1e3:.1f}' for s in stalls)} ms", flush=True)
    ckptd.close_clients()
    cold, _, _ = run_manager(state, d.ckpt / f"unreserved_{k}", sock, interval, 1, reserve_bytes=0)
    print(f"round {k}: unreserved first save {cold[0] * 1e3:.1f} ms", flush=True)
    for p in d.ckpt.iterdir():
        shutil.rmtree(p, ignore_errors=True)
    return stalls[0], statistics.median(stalls[1:]), cold[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=256, help="the rank's state dict, MiB")
    ap.add_argument("--interval", type=int, default=20, help="save_interval_steps")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="first_save_bench-", dir=BUILD))
    report = Report(name_width=18, ref_width=22)
    d = None
    try:
        state = make_state(args.mib)
        nbytes = sum(t.numel() * t.element_size() for t in state["model"].values())
        print(f"state dict: {len(state['model'])} float32 tensors, {nbytes / MIB:.0f} MiB; "
              f"{os.cpu_count()} CPUs; torch {torch.__version__}; save every "
              f"{args.interval} steps", flush=True)
        d = Daemon(work / "d", "--staging_budget=4G")
        t0 = time.perf_counter()
        train_step(state, 0)
        print(f"training step: {(time.perf_counter() - t0) * 1e3:.1f} ms", flush=True)
        rounds, copies = [], []
        for k in range(args.repeat):
            copies.append(memcpy_seconds(state))
            rounds.append(one_round(state, d, k, args.interval))
        memcpy = statistics.median(copies)
        first, steady, cold = (statistics.median(r[i] for r in rounds) for i in range(3))
        report("first_save", first, "memcpy, same bytes", memcpy, 1.5)
        report("steady_save", steady, "memcpy, same bytes", memcpy)
        report("first_vs_steady", first, "steady_save", steady)
        report("first_unreserved", cold, "memcpy, same bytes", memcpy)
    except Exception as e:  # noqa: BLE001
        print(f"error: {e!r}", file=sys.stderr)
        return 2
    finally:
        ckptd.close_clients()
        if d is not None:
            d.stop()
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps(report.results, indent=2))
        shutil.rmtree(work, ignore_errors=True)
    if report.missed:
        print(f"MISSED: {', '.join(report.missed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
