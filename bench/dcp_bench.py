#!/usr/bin/env python3
"""ckptd against stock torch.distributed.checkpoint (torch >= 2.4) on host
tensors, every reference measured in the same run, on the same file system:

  memcpy        copy of the state into preallocated, pre-faulted tensors:
                the floor of any consistent snapshot             (reported)
  stall         ckptd.async_save (returns when the daemon has staged the
                bytes) against stock dcp.async_save (returns when DCP has
                staged its CPU copy. The bench checks that it did: torch
                2.4-2.6 take no copy of CPU tensors, so a tensor modified
                after the call returns is saved modified; then the stall is
                compared with the memcpy floor instead, target <= 1.3; FileSystemWriter with
                cache_staged_state_dict=True where the torch has it, so the
                staging buffers are reused as in a training loop; it pins
                them, so only where CUDA is available), steady state (one
                warm-up each)                                 target <= 0.5
  durable       ckptd save until COMMITTED (data, .metadata and directory
                fsynced) against stock dcp.save (FileSystemWriter,
                sync_files=True)                              target <= 1.0
  async_durable dcp.async_save until its future resolves      (reported)
  writer_stall  dcp.async_save with ckptd.StorageWriter (the same DCP call
                through the daemon: it returns once the daemon holds the
                bytes) against the same call with stock FileSystemWriter
                                                              target <= 0.3
  writer_durable  the same until its future resolves (.metadata committed
                by the daemon)                                target <= 1.0
  writer_stall_bg  (torch >= 2.9) the same call with
                StorageWriter(background_staging=True): returns before the
                bytes are staged (the trainer waits for staging_completion
                before changing its tensors); against FileSystemWriter and
                against stock's own background staging (DefaultStager with
                use_async_staging)                             (reported)
  zstd_durable  (torch >= 2.7) dcp.async_save until done with
                StorageWriter(compression="zstd") against FileSystemWriter
                with _extensions=[ZStandard()] (stock's compression)
                                                              (reported)
  load          ckptd.load against stock dcp.load, both into preallocated
                tensors from the page cache                   (reported)

Interop, checked in the same run: stock dcp.load of ckptd's checkpoint and
ckptd.load of stock dcp.save's checkpoint both equal the state.

No GPU and no process group needed (DCP runs without one). Where torch >= 2.4
is not importable (Debian 12's torch is 1.13) it exits 0 with "skipped". On
the build machine it runs with Debian 13's torch through
scripts/torch2_chroot.sh:

  bash scripts/torch2_chroot.sh run python3 bench/dcp_bench.py --gib 2 --reps 3

State: --gib GiB in --tensors tensors, alternately float32 and bfloat16.
Each figure is the median of --reps runs. Exit status: 0 targets met, 1 a
target missed, 2 error.
"""
import argparse
import inspect
import json
import os
import pathlib
import re
import shutil
import statistics
import sys
import tempfile
import time
import traceback

REPO = pathlib.Path(__file__).resolve().parents[1]
BUILD = pathlib.Path(os.environ.get("CKPTD_BUILD_DIR", REPO / "build"))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "client" / "python"))
os.environ.setdefault("CKPTD_CLIENT_LIB", str(BUILD / "client" / "libckptd_client.so"))

import torch  # noqa: E402

from bench_report import Report  # noqa: E402

GIB = 1 << 30


def torch_version():
    m = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return (int(m[1]), int(m[2]))


def median(xs):
    return statistics.median(xs)


def make_state(gib, tensors):
    per = int(gib * GIB) // tensors
    state = {}
    for i in range(tensors):
        dtype = torch.float32 if i % 2 == 0 else torch.bfloat16
        n = per // (4 if dtype == torch.float32 else 2)
        g = torch.Generator().manual_seed(i)
        state[f"model.layers.{i}.weight"] = torch.randn(n, generator=g).to(dtype)
    return state


def nbytes_of(state):
    return sum(t.numel() * t.element_size() for t in state.values())


def empty_like_state(state):
    out = {k: torch.empty_like(v) for k, v in state.items()}
    for v in out.values():
        v.zero_()  # pre-fault, as a model's parameters are
    return out


def same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


def drop_tree(path):
    shutil.rmtree(path, ignore_errors=True)


def stall_and_durable(reps, root, prefix, save):
    """(stalls, durables) of `reps` saves after one warm-up: seconds until
    save(root / f"{prefix}_{k}") returns and until its .result() does. The
    last checkpoint is kept, the others removed."""
    stalls, durables = [], []
    for k in range(reps + 1):
        path = root / f"{prefix}_{k}"
        t0 = time.perf_counter()
        pending = save(path)
        stall = time.perf_counter() - t0
        pending.result()
        if k > 0:
            stalls.append(stall)
            durables.append(time.perf_counter() - t0)
        if k < reps:
            drop_tree(path)
    return stalls, durables


def zstd_figures(dcp, ckptd, state, root, sock, reps):
    """(ours, stock): seconds until dcp.async_save's future resolves with
    StorageWriter(compression="zstd") and with FileSystemWriter +
    ZStandard; None before torch 2.7 and where neither the zstandard nor
    the pyzstd module is installed (stock cannot compress then)."""
    try:
        from torch.distributed.checkpoint._extension import ZStandard
    except ImportError:
        return None
    if not ZStandard.is_available():
        print("zstd figures skipped: neither the zstandard nor the pyzstd module is "
              "installed", flush=True)
        return None
    _, ours = stall_and_durable(
        reps, root, "zstd_ours",
        lambda p: dcp.async_save(state, storage_writer=ckptd.StorageWriter(
            p, socket=sock, compression="zstd")))
    _, stock = stall_and_durable(
        reps, root, "zstd_stock",
        lambda p: dcp.async_save(state, storage_writer=dcp.FileSystemWriter(
            str(p), _extensions=[ZStandard()])))
    drop_tree(root / f"zstd_ours_{reps}")
    drop_tree(root / f"zstd_stock_{reps}")
    return ours, stock


def background_staging_figures(dcp, ckptd, state, root, sock, reps):
    """{ours, ours_staged, stock, stock_staged}: seconds until dcp.async_save
    returns and until its staging_completion resolves, through
    StorageWriter(background_staging=True) and through stock's
    DefaultStager(use_async_staging=True); None before torch 2.9."""
    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
        from ckptd._writer import _stage_may_return_a_future
    except ImportError:
        return None
    if not _stage_may_return_a_future():
        return None
    out = {"ours": [], "ours_staged": [], "stock": [], "stock_staged": []}
    for k in range(reps + 1):  # the first is the warm-up
        for name in ("ours", "stock"):
            path = root / f"bg_{name}_{k}"
            kw = {}
            if name == "ours":
                kw["storage_writer"] = ckptd.StorageWriter(path, socket=sock,
                                                           background_staging=True)
            else:
                kw["checkpoint_id"] = str(path)
                kw["async_stager"] = DefaultStager(StagingOptions(False, False, True, False))
            try:
                t0 = time.perf_counter()
                resp = dcp.async_save(state, **kw)
                stall = time.perf_counter() - t0
                resp.staging_completion.result()
                staged = time.perf_counter() - t0
                resp.upload_completion.result()
            except Exception as e:  # noqa: BLE001
                if name == "ours":
                    raise
                print(f"stock background staging unusable here: {type(e).__name__}: {e}",
                      flush=True)
                return {**out, "stock": [float("nan")], "stock_staged": [float("nan")]}
            if k > 0:
                out[name].append(stall)
                out[name + "_staged"].append(staged)
            drop_tree(path)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--tensors", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--dir", help="work directory (default: a temp dir under the build dir)")
    ap.add_argument("--daemon-flag", action="append", default=[],
                    help="extra ckptd flag, e.g. --daemon-flag=--direct_io=false (repeatable)")
    args = ap.parse_args()
    if torch_version() < (2, 4):
        print(f"skipped: needs torch>=2.4 (found {torch.__version__}); "
              "run it through scripts/torch2_chroot.sh or on the GPU machine")
        return 0
    import torch.distributed.checkpoint as dcp  # noqa: E402

    import ckptd  # noqa: E402
    from daemon_bench import Daemon  # noqa: E402

    work = pathlib.Path(args.dir or tempfile.mkdtemp(prefix="dcp_bench-", dir=BUILD))
    work.mkdir(parents=True, exist_ok=True)
    report = Report(name_width=14, ref_width=34)
    results, missed = report.results, report.missed

    d = None
    try:
        state = make_state(args.gib, args.tensors)
        total = nbytes_of(state)
        print(f"state: {args.tensors} tensors (float32/bfloat16), {total / GIB:.2f} GiB; "
              f"{os.cpu_count()} CPUs; torch {torch.__version__}", flush=True)
        # One batch for the whole state (max_batch defaults to half the
        # budget); a smaller budget streams it, and the stall waits for writes.
        d = Daemon(work / "d", f"--staging_budget={int(total * 2.2 / GIB) + 1}G",
                   *args.daemon_flag)
        if args.daemon_flag:
            print(f"ckptd flags: {' '.join(args.daemon_flag)}", flush=True)
        sock = str(d.socket)
        root = d.ckpt  # ckptd and stock DCP write into the same file system

        # -- memcpy reference --------------------------------------------------
        dst = empty_like_state(state)
        copies = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            for k, v in state.items():
                dst[k].copy_(v)
            copies.append(time.perf_counter() - t0)
        del dst

        # -- stock DCP: async_save (stall, then until durable) and save ---------
        writer_kwargs = {}
        # The cached staging buffers are pinned (torch 2.4-2.8 pins them
        # unconditionally), which needs an accelerator: without one, stock
        # DCP makes a fresh CPU copy per async_save.
        if "cache_staged_state_dict" in inspect.signature(
                dcp.FileSystemWriter.__init__).parameters and torch.cuda.is_available():
            writer_kwargs["cache_staged_state_dict"] = True
        print(f"dcp.async_save staging: "
              f"{'cached (reused) buffers' if writer_kwargs else 'a fresh CPU copy per call'}",
              flush=True)
        writer = dcp.FileSystemWriter(str(root / "stock_async_0"), **writer_kwargs)
        t_stall, t_async = [], []
        for k in range(args.reps + 1):  # the first is the warm-up
            path = root / f"stock_async_{k}"
            t0 = time.perf_counter()
            fut = dcp.async_save(state, checkpoint_id=str(path), storage_writer=writer)
            stall = time.perf_counter() - t0
            fut.result()
            durable = time.perf_counter() - t0
            if k > 0:
                t_stall.append(stall)
                t_async.append(durable)
            drop_tree(path)
        # Is stock async_save's return a consistent snapshot? Modify a tensor
        # right after it returns (as the next training step would), then
        # read back what was saved.
        first = next(iter(state))
        before = state[first].clone()
        path = root / "stock_async_consistency"
        fut = dcp.async_save(state, checkpoint_id=str(path), storage_writer=writer)
        state[first].add_(1)
        fut.result()
        check = {first: torch.empty_like(before)}
        dcp.load(check, checkpoint_id=str(path))
        state[first].copy_(before)
        stock_consistent = torch.equal(check[first], before)
        drop_tree(path)
        print(f"stock dcp.async_save: a tensor modified after it returned is saved "
              f"{'as it was (snapshot)' if stock_consistent else 'MODIFIED (no snapshot)'}",
              flush=True)
        t_save = []
        for k in range(args.reps):
            path = root / f"stock_{k}"
            t0 = time.perf_counter()
            dcp.save(state, storage_writer=dcp.FileSystemWriter(str(path), sync_files=True))
            t_save.append(time.perf_counter() - t0)
            if k + 1 < args.reps:
                drop_tree(path)
        stock_dir = root / f"stock_{args.reps - 1}"

        # -- ckptd, and dcp.async_save through ckptd.StorageWriter ---------------
        # (The first ckptd run creates and pre-faults the arena.)
        c_stall, c_durable = stall_and_durable(
            args.reps, root, "ckptd", lambda p: ckptd.async_save(state, str(p), socket=sock))
        ckptd_dir = root / f"ckptd_{args.reps}"
        w_stall, w_durable = stall_and_durable(
            args.reps, root, "writer",
            lambda p: dcp.async_save(state, storage_writer=ckptd.StorageWriter(p, socket=sock)))
        writer_dir = root / f"writer_{args.reps}"
        bg = background_staging_figures(dcp, ckptd, state, root, sock, args.reps)
        zstd = zstd_figures(dcp, ckptd, state, root, sock, args.reps)

        report("memcpy", median(copies), "(the state's bytes, copied once)", median(copies))
        if stock_consistent:
            report("stall", median(c_stall), "dcp.async_save returns", median(t_stall), 0.5)
            report("stall_memcpy", median(c_stall), "memcpy of the state", median(copies))
        else:
            # Stock DCP took no copy: its return time is no snapshot's cost.
            # The honest reference is the copy any snapshot must make.
            report("stall", median(c_stall), "dcp.async_save returns (no copy)",
                   median(t_stall))
            report("stall_memcpy", median(c_stall), "memcpy of the state", median(copies), 1.3)
        results.append({"workload": "stock_async_save_snapshot", "consistent": stock_consistent})
        report("durable", median(c_durable), "dcp.save (sync_files=True)", median(t_save), 1.0)
        report("async_durable", median(c_durable), "dcp.async_save until done", median(t_async))
        report("writer_stall", median(w_stall), "dcp.async_save (FileSystemWriter)",
               median(t_stall), 0.3 if stock_consistent else None)
        report("writer_durable", median(w_durable), "the same until done", median(t_async), 1.0)
        if bg is not None:
            report("writer_stall_bg", median(bg["ours"]), "dcp.async_save (FileSystemWriter)",
                   median(t_stall))
            report("writer_stall_bg", median(bg["ours"]), "stock background staging",
                   median(bg["stock"]))
            report("writer_staged_bg", median(bg["ours_staged"]),
                   "stock background staging, staged", median(bg["stock_staged"]))
        if zstd is not None:
            report("zstd_durable", median(zstd[0]), "FileSystemWriter + ZStandard",
                   median(zstd[1]))

        # -- load, both ways (values checked) ------------------------------------
        dest = empty_like_state(state)
        t_dl, t_cl = [], []
        for _ in range(args.reps):
            for v in dest.values():
                v.zero_()
            t0 = time.perf_counter()
            dcp.load(dest, checkpoint_id=str(stock_dir))
            t_dl.append(time.perf_counter() - t0)
            for v in dest.values():
                v.zero_()
            t0 = time.perf_counter()
            ckptd.load(dest, str(ckptd_dir))
            t_cl.append(time.perf_counter() - t0)
        if not same(state, dest):
            raise RuntimeError("ckptd.load of ckptd's checkpoint differs from the state")
        report("load", median(t_cl), "dcp.load", median(t_dl))
        for v in dest.values():
            v.zero_()
        dcp.load(dest, checkpoint_id=str(ckptd_dir))
        if not same(state, dest):
            raise RuntimeError("stock dcp.load of ckptd's checkpoint differs from the state")
        for v in dest.values():
            v.zero_()
        dcp.load(dest, checkpoint_id=str(writer_dir))
        if not same(state, dest):
            raise RuntimeError("stock dcp.load of ckptd.StorageWriter's checkpoint differs "
                               "from the state")
        for v in dest.values():
            v.zero_()
        ckptd.load(dest, str(stock_dir))
        if not same(state, dest):
            raise RuntimeError("ckptd.load of stock dcp.save's checkpoint differs from the state")
        print("interop: stock dcp.load of ckptd's checkpoint == state; "
              "stock dcp.load of ckptd.StorageWriter's checkpoint == state; "
              "ckptd.load of dcp.save's checkpoint == state", flush=True)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    finally:
        ckptd.close_clients()
        if d is not None:
            d.stop()
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps(
                {"torch": torch.__version__, "cpus": os.cpu_count(), "gib": args.gib,
                 "results": results}, indent=2))
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    if missed:
        print(f"MISSED: {', '.join(missed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
