#!/usr/bin/env python3
"""The GPU path of ckptd against its references, measured in one run on the
GPU machine (torch >= 2.4 with CUDA; stock DCP for the comparisons):

  (a) d2h_peak       torch copies of the state into one preallocated pinned
                     host buffer (non_blocking, then synchronize): the
                     pinned cudaMemcpy D2H bandwidth, the reference for (b)
  (b) ckptd_ipc      ckptd.async_save through CUDA IPC: the trainer's stall
                     (until the daemon has staged = copied D2H itself) and
                     bytes / stall as a fraction of (a)        target >= 0.8
      ckptd_snapshot the same with device_snapshot=True (stall = the D2D
                     clone); both stalls against (c)           target <= 0.5
  (c) torch_async    stock dcp.async_save with pinned staging (DefaultStager
                     + StagingOptions(use_pinned_memory=True), synchronous
                     staging; BlockingAsyncStager(cache_staged_state_dict=
                     True) where DefaultStager is missing): the stall is the
                     time until async_save returns, steady state (2nd+ call)
  (d) durable        ckptd save until COMMITTED (the daemon fsyncs) against
                     stock dcp.save (FileSystemWriter, sync_files=True) into
                     the same filesystem                       target <= 1.0
  (e) dcp_load       stock dcp.load of ckptd's checkpoint into CUDA tensors,
                     values compared with the state (and ckptd.load timed)

Each figure is the median of --reps (>= 3) runs after one warm-up run. The
state is --gib GiB of --tensor-mib MiB CUDA tensors, alternately bfloat16
and float32. A daemon is started (pinned_staging_bytes and staging_budget
sized for the state) unless --socket names a running one. A table goes to
stdout, everything to --json. --deadline (seconds) skips the sections that
no longer fit (recorded as skipped), so that a time-limited run still
reports what it measured; sections run in the order a, b, c, e, d.

  python3 bench/gpu_bench.py --gib 10 --reps 3 --json /tmp/gpu_bench.json
"""
import argparse
import json
import logging
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time
import traceback

REPO = pathlib.Path(__file__).resolve().parents[1]
for p in (REPO / "client" / "python", REPO / "tests" / "python", REPO / "tests" / "interop"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import torch  # noqa: E402

GB = 1e9
GiB = 1 << 30
MiB = 1 << 20


def log(msg):
    print(f"[gpu_bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def median(xs):
    return statistics.median(xs) if xs else None


def make_state(gib, tensor_mib):
    n = max(1, int(round(gib * 1024 / tensor_mib)))
    state = {}
    for i in range(n):
        dtype = torch.bfloat16 if i % 2 == 0 else torch.float32
        numel = tensor_mib * MiB // torch.empty((), dtype=dtype).element_size()
        rows = 4096
        t = torch.empty(rows, numel // rows, dtype=dtype, device="cuda")
        t.normal_(generator=None)
        state[f"layers.{i}.weight"] = t
    torch.cuda.synchronize()
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    return state, nbytes


class Deadline:
    def __init__(self, seconds):
        self.end = time.monotonic() + seconds if seconds else None

    def left(self):
        return float("inf") if self.end is None else self.end - time.monotonic()


def timed_runs(fn, reps, deadline, est=None, what=""):
    """One warm-up then `reps` timed calls of fn() -> seconds (fn measures
    itself); stops early if the deadline would be passed (est: seconds one
    call is expected to take, refined from the warm-up)."""
    t0 = time.perf_counter()
    fn()  # warm-up
    one = time.perf_counter() - t0
    out = []
    for _ in range(reps):
        if deadline.left() < max(one, est or 0) * 1.2:
            log(f"{what}: deadline reached after {len(out)} of {reps} timed runs")
            break
        out.append(fn())
    return out


# -- (a) pinned D2H peak -------------------------------------------------------

def bench_d2h(state, nbytes, reps, deadline):
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    views, off = [], 0
    for t in state.values():
        n = t.numel() * t.element_size()
        views.append((host[off:off + n].view(t.dtype).view(t.shape), t))
        off += n

    def run():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for h, t in views:
            h.copy_(t, non_blocking=True)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    secs = timed_runs(run, reps, deadline, what="d2h")
    del views, host
    return secs


# -- (b) ckptd ------------------------------------------------------------------

def bench_ckptd(state, nbytes, reps, deadline, socket, root, snapshot, stats_out):
    import ckptd
    counter = [0]

    def run():
        counter[0] += 1
        cid = os.path.join(root, f"{'snap' if snapshot else 'ipc'}_{counter[0]}")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        h = ckptd.async_save(state, cid, socket=socket, device_snapshot=snapshot)
        stall = time.perf_counter() - t0
        st = h.stats                 # (snapshot: waits for the background staging)
        h.result(1800)
        stats_out.append({"stall": stall, "ipc_items": st.ipc_items,
                          "cuda_host_items": st.cuda_host_items,
                          "device_snapshot": st.device_snapshot,
                          "staging_seconds": st.staging_seconds,
                          "cuda_fallback": st.cuda_fallback})
        shutil.rmtree(cid, ignore_errors=True)
        return stall

    return timed_runs(run, reps, deadline, what="ckptd snapshot" if snapshot else "ckptd ipc")


# -- (c) torch dcp.async_save with pinned staging --------------------------------

def _ensure_process_group(tmpdir):
    import torch.distributed as dist
    if dist.is_initialized():
        return
    store = dist.FileStore(os.path.join(tmpdir, "pg_store"), 1)
    dist.init_process_group("cpu:gloo,cuda:nccl", store=store, rank=0, world_size=1)


def make_torch_stager():
    """(stager, description): DefaultStager with pinned, synchronous staging
    where this torch has it (2.9+), else BlockingAsyncStager with a cached
    pinned copy. The stager is kept open across the runs (steady state, its
    pinned buffers reused): some torch versions close an async_stager they
    were given once its save is done, after which it cannot stage again
    (torch 2.11: KeyError: <class 'type'> from the cleared deepcopy table).
    Those close() calls are counted (stager.torch_closes) and deferred to
    stager.really_close()."""
    import dataclasses
    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
        base = DefaultStager
        wanted = {"use_pinned_memory": True, "use_shared_memory": False,
                  "use_async_staging": False, "use_non_blocking_copy": True}
        names = {f.name for f in dataclasses.fields(StagingOptions)}
        opts = StagingOptions(**{k: v for k, v in wanted.items() if k in names})
        args, desc = (opts,), f"DefaultStager({opts})"
    except ImportError:
        from torch.distributed.checkpoint.staging import BlockingAsyncStager
        base = BlockingAsyncStager
        args, desc = (), "BlockingAsyncStager(cache_staged_state_dict=True)"

    class KeptOpen(base):
        torch_closes = 0

        def close(self):
            KeptOpen.torch_closes += 1

        def really_close(self):
            closer = getattr(base, "close", None)
            if closer:
                closer(self)

    if base.__name__ == "BlockingAsyncStager":
        return KeptOpen(cache_staged_state_dict=True), desc
    return KeptOpen(*args), desc


def _wait_upload(resp):
    if hasattr(resp, "upload_completion"):     # AsyncSaveResponse (2.9+)
        resp.upload_completion.result()
    else:
        resp.result()


def _stager_was_closed(stager):
    """True where torch emptied the stager's deepcopy table (what
    StateDictStager.close() does): it cannot stage again."""
    inner = getattr(stager, "_state_dict_stager", None)
    return inner is not None and not getattr(inner, "_deepcopy_dispatch", True)


def bench_torch_async(state, reps, deadline, root, info):
    """Steady state of one stager kept across saves. Where this torch closes
    the stager's StateDictStager after a save (seen with torch 2.11: the
    next stage() failed with KeyError: <class 'type'>), a fresh stager is
    made for that save, as a trainer on that torch would have to, and
    counted in info["stager_rebuilds"] (its pinned buffers are then
    allocated again in the stall)."""
    import torch.distributed.checkpoint as dcp
    stager, desc = make_torch_stager()
    info["stager"] = desc
    info["stager_rebuilds"] = 0
    counter = [0]
    closes = [0]   # torch's close() calls on the stagers replaced so far
    tmp = tempfile.mkdtemp(prefix="pg_", dir=root)

    def call(cid):
        try:
            return dcp.async_save(state, checkpoint_id=cid, async_stager=stager)
        except (RuntimeError, ValueError, AssertionError) as e:
            if "process group" not in str(e).lower() and "initialize" not in str(e).lower():
                raise
            _ensure_process_group(tmp)
            info["process_group"] = "gloo world 1 (async_save needed one)"
            return dcp.async_save(state, checkpoint_id=cid, async_stager=stager)

    def run():
        nonlocal stager
        counter[0] += 1
        cid = os.path.join(root, f"torch_async_{counter[0]}")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if _stager_was_closed(stager):
            closes[0] += type(stager).torch_closes
            stager.really_close()
            stager, _ = make_torch_stager()
            info["stager_rebuilds"] += 1
        resp = call(cid)
        stall = time.perf_counter() - t0
        _wait_upload(resp)
        shutil.rmtree(cid, ignore_errors=True)
        return stall

    try:
        return timed_runs(run, reps, deadline, what="torch async_save")
    finally:
        info["torch_closed_the_stager"] = closes[0] + type(stager).torch_closes
        stager.really_close()
        log(f"torch: stager {desc}, rebuilt {info['stager_rebuilds']} times "
            f"(torch closed it), close() called {info['torch_closed_the_stager']} times")


# -- (d) durable ---------------------------------------------------------------------

def bench_durable(state, reps, deadline, socket, root):
    import ckptd
    import torch.distributed.checkpoint as dcp
    counter = [0]

    def ck_run():
        counter[0] += 1
        cid = os.path.join(root, f"durable_ckptd_{counter[0]}")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        st = ckptd.save(state, cid, socket=socket, timeout=1800)
        dt = time.perf_counter() - t0
        assert st.state == "COMMITTED", st
        shutil.rmtree(cid, ignore_errors=True)
        return dt

    def torch_run():
        counter[0] += 1
        cid = os.path.join(root, f"durable_torch_{counter[0]}")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dcp.save(state, storage_writer=dcp.FileSystemWriter(cid, sync_files=True))
        dt = time.perf_counter() - t0
        shutil.rmtree(cid, ignore_errors=True)
        return dt

    ck = timed_runs(ck_run, reps, deadline, what="durable ckptd")
    tt = timed_runs(torch_run, reps, deadline, what="durable torch")
    return ck, tt


# -- (e) stock dcp.load of ckptd's checkpoint -------------------------------------

def bench_load(state, socket, root):
    import ckptd
    import torch.distributed.checkpoint as dcp
    cid = os.path.join(root, "for_load")
    st = ckptd.save(state, cid, socket=socket, timeout=1800)
    dest = {k: torch.empty_like(v) for k, v in state.items()}
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    dcp.load(dest, checkpoint_id=st.checkpoint_id)
    torch.cuda.synchronize()
    t_dcp = time.perf_counter() - t0
    equal = all(torch.equal(dest[k], v) for k, v in state.items())
    for v in dest.values():
        v.zero_()
    t0 = time.perf_counter()
    ckptd.load(dest, st.checkpoint_id)
    torch.cuda.synchronize()
    t_ck = time.perf_counter() - t0
    equal_ck = all(torch.equal(dest[k], v) for k, v in state.items())
    del dest
    shutil.rmtree(cid, ignore_errors=True)
    return {"dcp_load_seconds": t_dcp, "dcp_load_equal": equal,
            "ckptd_load_seconds": t_ck, "ckptd_load_equal": equal_ck}


# -- the daemon ----------------------------------------------------------------------

def start_daemon(base, nbytes):
    import pyclient_dist_worker as pw
    pinned = (nbytes + GiB - 1) // GiB + 1
    flags = {"pinned_staging_bytes": f"{pinned}G", "staging_budget": f"{pinned + 2}G"}
    for kv in filter(None, os.environ.get("CKPTD_GPU_DAEMON_FLAGS", "").split(",")):
        k, _, v = kv.partition("=")
        flags[k.strip()] = v.strip()
    log(f"starting a daemon under {base} with {flags}")
    d = pw.start_daemon(base, **flags)
    return d, flags


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=10.0, help="state size (GiB)")
    ap.add_argument("--tensor-mib", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--dir", default=None, help="checkpoint filesystem (default: a temp dir "
                    "under /tmp); ckptd and torch write to the same one")
    ap.add_argument("--socket", default=None, help="a running daemon (default: start one)")
    ap.add_argument("--deadline", type=float, default=0, help="seconds for the whole run "
                    "(0: none); later sections are skipped when out of time")
    ap.add_argument("--skip", default="", help="comma-separated sections to skip: "
                    "d2h,ckptd,snapshot,torch,load,durable")
    a = ap.parse_args()
    if a.reps < 3:
        ap.error("--reps must be >= 3 (medians of at least 3)")
    logging.basicConfig(level=logging.WARNING)
    if not torch.cuda.is_available():
        print("gpu_bench: CUDA is not available", file=sys.stderr)
        return 2
    import ckptd
    skip = set(filter(None, a.skip.split(",")))
    deadline = Deadline(a.deadline)
    base = pathlib.Path(a.dir or tempfile.mkdtemp(prefix="ckptd_gpu_bench_"))
    base.mkdir(parents=True, exist_ok=True)
    result = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0),
              "gib": a.gib, "tensor_mib": a.tensor_mib, "reps": a.reps, "dir": str(base),
              "sections": {}, "skipped": {}}
    daemon = None
    try:
        state, nbytes = make_state(a.gib, a.tensor_mib)
        result.update(bytes=nbytes, tensors=len(state))
        log(f"state: {len(state)} tensors, {nbytes / GiB:.2f} GiB on {result['device']}")
        if a.socket:
            socket = a.socket
            root = str(base)
        else:
            daemon, flags = start_daemon(base / "daemon", nbytes)
            socket, root = str(daemon.socket), str(daemon.root)
            result["daemon_flags"] = flags
        info = ckptd.client(socket).info()
        result["daemon_info"] = {k: info.get(k) for k in (
            "version", "cuda_ipc", "cuda_unavailable", "pinned_staging_bytes", "cuda_devices",
            "staging_budget_bytes", "max_batch_bytes", "io_backend")}
        log(f"daemon: cuda_ipc={info.get('cuda_ipc')} {info.get('cuda_unavailable') or ''}")
        secs = result["sections"]

        def section(name, fn):
            if name in skip:
                result["skipped"][name] = "--skip"
                return None
            if deadline.left() < 20:
                result["skipped"][name] = "deadline"
                log(f"{name}: skipped (deadline)")
                return None
            log(f"{name} ...")
            try:
                return fn()
            except Exception as e:  # noqa: BLE001  (record, go on)
                result["skipped"][name] = f"error: {type(e).__name__}: {e}"
                result.setdefault("tracebacks", {})[name] = traceback.format_exc()
                log(f"{name}: FAILED {type(e).__name__}: {e}\n{traceback.format_exc()}")
                return None

        d2h = section("d2h", lambda: bench_d2h(state, nbytes, a.reps, deadline))
        if d2h:
            secs["d2h_peak"] = {"seconds": d2h, "median": median(d2h),
                                "gbps": nbytes / median(d2h) / GB}
        for snap, key in ((False, "ckptd"), (True, "snapshot")):
            stats = []
            r = section(key, lambda: bench_ckptd(state, nbytes, a.reps, deadline, socket, root,
                                                 snap, stats))
            if r:
                secs["ckptd_snapshot" if snap else "ckptd_ipc"] = {
                    "stall_seconds": r, "stall_median": median(r),
                    "gbps": nbytes / median(r) / GB, "runs": stats}
        tinfo = {}
        r = section("torch", lambda: bench_torch_async(state, a.reps, deadline, root, tinfo))
        if r:
            secs["torch_async"] = {"stall_seconds": r, "stall_median": median(r), **tinfo}
        r = section("load", lambda: bench_load(state, socket, root))
        if r:
            secs["dcp_load"] = r
        r = section("durable", lambda: bench_durable(state, a.reps, deadline, socket, root))
        if r:
            ck_s, t_s = r
            secs["durable"] = {"ckptd_seconds": ck_s, "ckptd_median": median(ck_s),
                               "torch_seconds": t_s, "torch_median": median(t_s)}
    finally:
        if daemon is not None:
            import pyclient_dist_worker as pw
            result["daemon_alive_at_end"] = pw.stop_daemon(daemon)
    result["table"] = table(result)
    print("\n".join(result["table"]))
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(result, indent=2, default=str))
        log(f"wrote {a.json}")
    if not a.dir:
        shutil.rmtree(base, ignore_errors=True)
    return 0


def ratio(x, y):
    return (x / y) if (x is not None and y) else None


def table(r):
    s = r["sections"]
    rows = []

    def row(name, value, unit, ref_name, ref, rat, target):
        fmt = (lambda v: "-" if v is None else f"{v:.3f}")
        ok = "" if rat is None or target is None else (
            "OK" if (target[0] == ">=" and rat >= target[1]) or
            (target[0] == "<=" and rat <= target[1]) else "MISS")
        rows.append(f"{name:<34} {fmt(value):>9} {unit:<4} | {ref_name:<30} {fmt(ref):>9} | "
                    f"ratio {fmt(rat):>7} {'' if not target else target[0] + str(target[1]):<6} "
                    f"{ok}")
        r.setdefault("ratios", {})[name] = {"value": value, "reference": ref, "ratio": rat,
                                           "target": target and f"{target[0]} {target[1]}",
                                           "met": ok == "OK" if ok else None}

    peak = s.get("d2h_peak", {}).get("gbps")
    ipc = s.get("ckptd_ipc", {})
    snap = s.get("ckptd_snapshot", {})
    tor = s.get("torch_async", {}).get("stall_median")
    rows.append(f"ckptd GPU bench: {r.get('tensors')} tensors, {r.get('bytes', 0) / GiB:.2f} GiB,"
                f" {r['device']}, torch {r['torch']}, median of {r['reps']}")
    row("(a) pinned D2H peak", peak, "GB/s", "-", None, None, None)
    row("(b) ckptd IPC staging bandwidth", ipc.get("gbps"), "GB/s", "(a) pinned D2H peak", peak,
        ratio(ipc.get("gbps"), peak), (">=", 0.8))
    row("(c) ckptd IPC stall", ipc.get("stall_median"), "s", "torch async_save stall", tor,
        ratio(ipc.get("stall_median"), tor), ("<=", 0.5))
    row("(c) ckptd device_snapshot stall", snap.get("stall_median"), "s",
        "torch async_save stall", tor, ratio(snap.get("stall_median"), tor), ("<=", 0.5))
    dur = s.get("durable", {})
    row("(d) ckptd durable (COMMITTED)", dur.get("ckptd_median"), "s", "dcp.save sync_files",
        dur.get("torch_median"), ratio(dur.get("ckptd_median"), dur.get("torch_median")),
        ("<=", 1.0))
    ld = s.get("dcp_load", {})
    if ld:
        rows.append(f"(e) stock dcp.load of ckptd's checkpoint: {ld['dcp_load_seconds']:.3f} s, "
                    f"values {'EQUAL' if ld['dcp_load_equal'] else 'DIFFER'}; ckptd.load "
                    f"{ld['ckptd_load_seconds']:.3f} s, values "
                    f"{'EQUAL' if ld['ckptd_load_equal'] else 'DIFFER'}")
    for name, why in r.get("skipped", {}).items():
        rows.append(f"skipped {name}: {why}")
    fb = {run.get("cuda_fallback") for sec in ("ckptd_ipc", "ckptd_snapshot")
          for run in s.get(sec, {}).get("runs", []) if run.get("cuda_fallback")}
    for f in fb:
        rows.append(f"NOTE: ckptd fell back: {f}")
    return rows


if __name__ == "__main__":
    sys.exit(main())
