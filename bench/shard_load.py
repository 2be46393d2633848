#!/usr/bin/env python3
"""One rank's shard out of a huge checkpoint: `ckptd.load` beside
stock `dcp.load` of the same boxes, time and peak RSS, in the same run.

    # a 2 M-chunk checkpoint (1,000 ranks x 2,000 tensors, 2 x 3 float32 per
    # chunk, ~131 MiB .metadata) made by ckptd's writer:
    build/bin/metadata_bench --make-ckptd-data=/tmp/big_data
    # rank 0 of 1,000 (its 2,000 boxes of 2 rows), 3 alternating repetitions:
    CKPTD_CLIENT_LIB=build/client/libckptd_client.so /usr/bin/python3 \\
        bench/shard_load.py compare /tmp/big_data --rank 0 --world 1000 \\
        --stock-cmd 'bash scripts/torch2_chroot.sh run python3'

`compare` lists the checkpoint's tensors (through ckptd's reader, without
chunk lists), cuts every tensor along dim 0 into --world row ranges and asks
for range --rank of each; writes that request list to a JSON file; then runs
each side in a process of its own (so that each peak RSS is that side's),
alternately, --reps times, and prints the medians with their range and the
ratios. Both sides load into the same preallocated, pre-faulted CPU tensors
(made before the clock) and print a checksum of what they loaded, which must
agree. The clock covers the whole load call: opening the checkpoint, its
.metadata, planning and reading.

  ckptd   ckptd.load(state_dict of ckptd.Shard, dir)   (this tree's client)
  stock   dcp.load(planner=a DefaultLoadPlanner whose local plan holds
          exactly these boxes, no process group): the public extension
          point a sharded trainer's planner uses; the metadata is read and
          unpickled by stock FileSystemReader as in any dcp.load.

Child modes (one JSON line on stdout: seconds, peak_rss_bytes — VmHWM,
reset to the current RSS just before the load so that a transient peak of
importing torch does not hide the load's —, baseline_rss_bytes — the RSS
then —, bytes, checksum, torch):
    shard_load.py ckptd REQUESTS.json DIR
    shard_load.py stock REQUESTS.json DIR
"""
import argparse
import json
import os
import pathlib
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]


def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def peak_rss_bytes():
    """VmHWM: the peak since the process started, or since reset_peak_rss()."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss(pid="self"):
    """Sets VmHWM back to the current RSS (Linux: clear_refs 5), so that the
    peak measured next is the load's, not an earlier transient one such as
    importing torch."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5\n")
    except OSError:
        pass


def destinations(requests):
    import torch
    out = {}
    for r in requests:
        t = torch.empty(tuple(r["box_sizes"]), dtype=getattr(torch, r["dtype"]))
        if t.numel():
            t.view(-1).view(torch.uint8).fill_(0)   # pre-fault
        out[r["fqn"]] = (t, tuple(r["offsets"]), tuple(r["size"]))
    return out


def report(seconds, baseline, dests):
    import torch
    nbytes = sum(t.numel() * t.element_size() for t, _, _ in dests.values())
    checksum = float(sum(t.double().sum().item() for t, _, _ in dests.values()))
    print(json.dumps({"seconds": seconds, "peak_rss_bytes": peak_rss_bytes(),
                      "baseline_rss_bytes": baseline, "bytes": nbytes, "checksum": checksum,
                      "torch": torch.__version__}))


def child_ckptd(requests, directory, socket=None, via_daemon=False, local_rank=0,
                local_world_size=1):
    sys.path.insert(0, str(REPO / "client" / "python"))
    import ckptd
    dests = destinations(requests)
    sd = {fqn: ckptd.Shard(t, offs, size) for fqn, (t, offs, size) in dests.items()}
    reset_peak_rss()
    baseline = rss_bytes()
    t0 = time.perf_counter()
    ckptd.load(sd, directory, socket=socket, via_daemon=via_daemon, local_rank=local_rank,
               local_world_size=local_world_size)
    report(time.perf_counter() - t0, baseline, dests)


def node(a):
    """--ranks local ranks each loading its shard (rank r of --world) at
    once, through the daemon and then each reading directly: the node's
    total peak RSS (daemon + ranks) and the slowest rank's time."""
    sys.path.insert(0, str(REPO / "bench"))
    from daemon_bench import Daemon
    directory = os.path.abspath(a.dir)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="shard-node-"))
    files = []
    for r in range(a.ranks):
        f = tmp / f"requests_{r}.json"
        f.write_text(json.dumps(make_requests(directory, r, a.world)))
        files.append(f)
    env = dict(os.environ)
    env.setdefault("CKPTD_CLIENT_LIB", str(REPO / "build" / "client" / "libckptd_client.so"))
    results = {}
    for via in ("daemon", "direct"):
        d = Daemon(tmp / f"d_{via}", f"--checkpoint_roots={tmp / f'd_{via}' / 'ckpt'},"
                   f"{os.path.dirname(directory)}")
        try:
            reset_peak_rss(d.proc.pid)
            daemon_before = d.peak_rss_bytes()   # started, nothing loaded yet
            procs = [subprocess.Popen(
                [sys.executable, __file__, "ckptd", str(files[r]), directory, "--socket",
                 str(d.socket), "--via", via, "--local-rank", str(r), "--ranks", str(a.ranks)],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for r in range(a.ranks)]
            outs = []
            for p in procs:
                out, err = p.communicate(timeout=a.timeout)
                lines = [ln for ln in out.splitlines() if ln.startswith("{")]
                if p.returncode != 0 or not lines:
                    raise RuntimeError(f"a {via} rank exited {p.returncode}:\n{err[-3000:]}")
                outs.append(json.loads(lines[-1]))
            daemon_peak = d.peak_rss_bytes()
        finally:
            d.stop()
        ranks_peak = sum(o["peak_rss_bytes"] for o in outs)
        # What the load added: each process's peak over its RSS just before
        # the load (a rank: torch imported, destinations allocated; the
        # daemon: started). The metadata, the plans and the reading.
        load_rss = max(0, daemon_peak - daemon_before) + sum(
            max(0, o["peak_rss_bytes"] - o["baseline_rss_bytes"]) for o in outs)
        results[via] = {"daemon_peak_rss": daemon_peak, "ranks_peak_rss": ranks_peak,
                        "node_peak_rss": daemon_peak + ranks_peak,
                        "node_load_rss": load_rss,
                        "slowest_s": max(o["seconds"] for o in outs),
                        "checksums": [o["checksum"] for o in outs]}
        print(f"{via:>6}: node peak RSS {(daemon_peak + ranks_peak) / 1e6:8.0f} MB (daemon "
              f"{daemon_peak / 1e6:.0f} MB, ranks {ranks_peak / 1e6:.0f} MB); added by the "
              f"load {load_rss / 1e6:.0f} MB; slowest rank "
              f"{results[via]['slowest_s']:.2f} s", flush=True)
    if results["daemon"]["checksums"] != results["direct"]["checksums"]:
        print("CHECKSUMS DIFFER between the two paths", flush=True)
        return 2
    ratio = results["daemon"]["node_peak_rss"] / results["direct"]["node_peak_rss"]
    load_ratio = results["daemon"]["node_load_rss"] / max(1, results["direct"]["node_load_rss"])
    print(f"node peak RSS through the daemon / direct: {ratio:.3f}; RSS added by the load "
          f"through the daemon {results['daemon']['node_load_rss'] / 1e9:.2f} GB (target <= "
          f"1 GB), {load_ratio:.3f}x of the direct readers'")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(results, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0 if results["daemon"]["node_load_rss"] <= 1e9 else 1


def child_stock(requests, directory):
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed._shard._utils import narrow_tensor_by_index
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
    from torch.distributed.checkpoint.planner import LoadPlan
    from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

    dests = destinations(requests)

    class BoxPlanner(DefaultLoadPlanner):
        """The local plan reads exactly `dests`' boxes (what a sharded
        trainer's state dict asks for) and writes into their tensors."""

        def create_local_plan(self):
            items = []
            for fqn, (t, offs, _) in dests.items():
                chunk = ChunkStorageMetadata(offsets=torch.Size(offs), sizes=t.size())
                items += create_read_items_for_chunk_list(
                    fqn, self.metadata.state_dict_metadata[fqn], [chunk])
            return LoadPlan(items)

        def resolve_tensor(self, read_item):
            t = dests[read_item.dest_index.fqn][0]
            return narrow_tensor_by_index(t, read_item.dest_offsets, read_item.lengths)

    reset_peak_rss()
    baseline = rss_bytes()
    t0 = time.perf_counter()
    kwargs = {"no_dist": True} if "no_dist" in dcp.load.__code__.co_varnames else {}
    dcp.load({}, checkpoint_id=directory, planner=BoxPlanner(), **kwargs)
    report(time.perf_counter() - t0, baseline, dests)


def make_requests(directory, rank, world):
    sys.path.insert(0, str(REPO / "client" / "python"))
    from ckptd import _native
    with _native.Reader(directory) as reader:
        entries = reader.metadata(chunks=False)["entries"]
    reqs = []
    for e in entries:
        if e["type"] != "tensor" or not e["size"]:
            continue
        rows = e["size"][0]
        lo, hi = rows * rank // world, rows * (rank + 1) // world
        reqs.append({"fqn": e["fqn"], "dtype": e["dtype"], "size": e["size"],
                     "offsets": [lo] + [0] * (len(e["size"]) - 1),
                     "box_sizes": [hi - lo] + e["size"][1:]})
    return reqs


def run_child(cmd, timeout):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-2000:]}\n"
                           f"{p.stderr[-4000:]}")
    return json.loads(lines[-1])


def fmt_range(xs, scale=1.0, unit="", digits=3):
    xs = [x * scale for x in xs]
    return f"{statistics.median(xs):.{digits}f}{unit} ({min(xs):.{digits}f}-{max(xs):.{digits}f})"


def compare(a):
    directory = os.path.abspath(a.dir)
    reqs = make_requests(directory, a.rank, a.world)
    fd, req_path = tempfile.mkstemp(prefix="shard_load_", suffix=".json", dir="/tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(reqs, f)
    me = str(pathlib.Path(__file__).resolve())
    sides = {"ckptd": [sys.executable, me, "ckptd", req_path, directory]}
    if a.stock_cmd:
        sides["stock"] = shlex.split(a.stock_cmd) + [me, "stock", req_path, directory]
    runs = {k: [] for k in sides}
    try:
        for rep in range(a.reps):
            for name, cmd in sides.items():
                r = run_child(cmd, a.timeout)
                runs[name].append(r)
                print(f"[shard_load] rep {rep + 1} {name}: {r['seconds']:.3f} s, peak RSS "
                      f"{r['peak_rss_bytes'] / 1e6:.0f} MB", flush=True)
    finally:
        os.unlink(req_path)
    sums = {r["checksum"] for rs in runs.values() for r in rs}
    print(f"shard_load: rank {a.rank} of {a.world}: {len(reqs)} boxes, "
          f"{runs['ckptd'][0]['bytes']} bytes, from {directory}")
    for name, rs in runs.items():
        print(f"  {name:5s} (torch {rs[0]['torch']}): "
              f"{fmt_range([r['seconds'] for r in rs], unit=' s')}, peak RSS "
              f"{fmt_range([r['peak_rss_bytes'] for r in rs], 1e-6, ' MB', 0)}")
    result = {"rank": a.rank, "world": a.world, "boxes": len(reqs), "runs": runs,
              "checksums_agree": len(sums) == 1}
    if "stock" in runs:
        t = statistics.median(r["seconds"] for r in runs["ckptd"]) / \
            statistics.median(r["seconds"] for r in runs["stock"])
        m = statistics.median(r["peak_rss_bytes"] for r in runs["ckptd"]) / \
            statistics.median(r["peak_rss_bytes"] for r in runs["stock"])
        result.update(time_ratio=t, rss_ratio=m)
        print(f"  ratio ckptd/stock: time {t:.3f}x, peak RSS {m:.3f}x; checksums "
              f"{'agree' if len(sums) == 1 else 'DIFFER: ' + str(sums)}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if len(sums) == 1 else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    c = sub.add_parser("compare")
    c.add_argument("dir")
    c.add_argument("--rank", type=int, default=0)
    c.add_argument("--world", type=int, default=1000)
    c.add_argument("--reps", type=int, default=3)
    c.add_argument("--stock-cmd", default="", help="prefix that runs a torch 2.x python3")
    c.add_argument("--timeout", type=float, default=600)
    c.add_argument("--json", default="")
    n = sub.add_parser("node")
    n.add_argument("dir")
    n.add_argument("--ranks", type=int, default=8)
    n.add_argument("--world", type=int, default=1000)
    n.add_argument("--timeout", type=float, default=900)
    n.add_argument("--json", default="")
    for mode in ("ckptd", "stock"):
        s = sub.add_parser(mode)
        s.add_argument("requests")
        s.add_argument("dir")
        s.add_argument("--socket")
        s.add_argument("--via", default="auto", choices=("auto", "daemon", "direct"))
        s.add_argument("--local-rank", type=int, default=0)
        s.add_argument("--ranks", type=int, default=1)
    a = p.parse_args()
    if a.mode == "compare":
        return compare(a)
    if a.mode == "node":
        return node(a)
    with open(a.requests) as f:
        requests = json.load(f)
    if a.mode == "ckptd":
        child_ckptd(requests, a.dir, a.socket,
                    {"auto": None, "daemon": True, "direct": False}[a.via], a.local_rank,
                    a.ranks)
    else:
        child_stock(requests, a.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
