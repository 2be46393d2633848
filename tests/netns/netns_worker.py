"""One rank of a gloo job whose ranks run in separate network namespaces
(tests/netns/, tests/testing/netns_cluster.py): the process group meets at
MASTER_ADDR:MASTER_PORT (node 0's address), gloo runs over eth0, and every
rank talks to its own node's daemon through $CKPTD_SOCKET — no cluster or
socket argument anywhere, as a user would write it.

    netns_worker.py save|load --rank R --world N --kind fsdp2|shard|big
        --dir BASE --refs DIR --modes M1,M2,... [--local-rank L --local-world W]

kinds: fsdp2 and shard are pyclient_dist_worker.py's (a small Net + Adam, 2
steps; FSDP2 fully_shard on a CPU mesh, or ckptd.Shard pieces, torch 1.13);
big: row shards (ckptd.Shard) of a few MiB-size tensors, one replicated
tensor and a value, for the restore byte counts.

save modes (each into BASE/<mode>): manager (CheckpointManager(cluster=
"auto").save), save (ckptd.save with cluster=ckptd.discover_cluster()),
save-zstd (the same, compression="zstd"), writer-save (dcp.save with
ckptd.StorageWriter(dir)), writer-async (dcp.async_save, thread executor),
writer-process (dcp.async_save, AsyncCheckpointerType.PROCESS), writer-zstd
(dcp.save, StorageWriter(compression="zstd")).

load modes: dcp (stock dcp.load / FileSystemReader of BASE/<mode> into a
fresh model of this world size, every value bit-exact against the saving
ranks' own pieces in REFS), ckptd (ckptd.load through the node's daemon,
via_daemon=True, local rank / local world given: a restore group per node;
prints the RestoreStats), reader (dcp.load with ckptd.StorageReader).
A load mode is written MODE@SAVED (e.g. dcp@writer-save).

Every wait is bounded: each rank dumps its stacks and exits after
$CKPTD_NETNS_RANK_TIMEOUT seconds (default 150); StorageWriter / ckptd.save
calls get timeout=60. Prints "OK <cmd> rank r/N" at the end; exit 77 with
"SKIP: reason" where this torch cannot do what a mode needs.
"""
import argparse
import datetime
import faulthandler
import json
import os
import pathlib
import sys
import time
import warnings

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "interop"))

import torch  # noqa: E402

import pyclient_dist_worker as pw  # noqa: E402

SKIP_EXIT = pw.SKIP_EXIT
CALL_TIMEOUT = 60
BIG_ROWS, BIG_COLS = 3072, 2048  # 24 MiB of float32 per tensor, 4 MiB records
BIG_TENSORS = ("w0", "w1")
BIG_REPLICATED = (1024, 1024)  # 4 MiB, saved by every rank, stored once


def rows_of(world, rank, n=BIG_ROWS):
    """[start, stop) of rank's rows of n, as even as possible."""
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def big_full(name):
    k = BIG_TENSORS.index(name) + 1
    return (torch.arange(BIG_ROWS * BIG_COLS, dtype=torch.float32)
            .mul_(0.25 * k).remainder_(1000.0).reshape(BIG_ROWS, BIG_COLS))


def big_replicated():
    return torch.arange(BIG_REPLICATED[0] * BIG_REPLICATED[1], dtype=torch.float32) \
        .reshape(BIG_REPLICATED).mul_(-0.5)


def big_state(world, rank, fill=None):
    """The big state of `rank` of `world`: its rows of every BIG_TENSORS
    tensor (fill: garbage of that value instead), the replicated one, a value."""
    import ckptd
    a, b = rows_of(world, rank)
    sd = {}
    for name in BIG_TENSORS:
        t = big_full(name)[a:b].clone() if fill is None else \
            torch.full((b - a, BIG_COLS), float(fill))
        sd[name] = ckptd.Shard(t, (a, 0), (BIG_ROWS, BIG_COLS))
    sd["rep"] = big_replicated() if fill is None else torch.full(BIG_REPLICATED, float(fill))
    meta = {"epoch": 7, "tag": "netns"}
    sd["meta"] = meta if fill is None else pw.placeholders(meta)
    return sd


def big_need(world, rank):
    """The payload bytes rank's box of every tensor covers (the request)."""
    a, b = rows_of(world, rank)
    return {"rows": [a, b], "shard_bytes": len(BIG_TENSORS) * (b - a) * BIG_COLS * 4,
            "replicated_bytes": BIG_REPLICATED[0] * BIG_REPLICATED[1] * 4}


def check_big(sd, world, rank, what):
    a, b = rows_of(world, rank)
    for name in BIG_TENSORS:
        pw.same(sd[name].tensor, big_full(name)[a:b], f"{what}: rank {rank} {name} rows {a}:{b}")
    pw.same(sd["rep"], big_replicated(), f"{what}: rank {rank} rep")
    assert sd["meta"] == {"epoch": 7, "tag": "netns"}, (what, sd["meta"])


# ---------------------------------------------------------------------------
# save

def _state(a, world, rank):
    if a.kind == "big":
        return big_state(world, rank)
    model, optim = pw.build_dist(a.kind, world, rank, seed=0, lr=pw.LR, betas=pw.BETAS)
    pw.train_dist(a.kind, model, optim, world, rank)
    pw.dump_refs(a.kind, model, optim, world, rank, a.refs)
    return {"app": pw.make_app(a.kind, model, optim, world, rank), "extra": pw.EXTRA,
            "step": pw.DIST_STEPS}


def _writer_save(mode, state, path):
    import ckptd
    import torch.distributed.checkpoint as dcp
    kw = {"compression": "zstd"} if mode == "writer-zstd" else {}
    w = ckptd.StorageWriter(path, timeout=CALL_TIMEOUT, **kw)
    if mode == "writer-async":
        dcp.async_save(state, storage_writer=w).result(timeout=CALL_TIMEOUT * 2)
    elif mode == "writer-process":
        from torch.distributed.checkpoint import state_dict_saver as sds
        kind = getattr(getattr(sds, "AsyncCheckpointerType", None), "PROCESS", None)
        if kind is None:
            raise pw.Unsupported(f"torch {torch.__version__} has no AsyncCheckpointerType.PROCESS")
        os.environ.setdefault("USE_LIBUV", "0")  # Debian's torch has no libuv TCPStore
        pw.port_for_dcp_process()
        dcp.async_save(state, storage_writer=w,
                       async_checkpointer_type=kind).result(timeout=CALL_TIMEOUT * 2)
    else:
        dcp.save(state, storage_writer=w)


def do_save(a, world, rank):
    import ckptd
    import torch.distributed as dist
    state = _state(a, world, rank)
    for mode in a.modes:
        path = str(pathlib.Path(a.dir) / mode)
        t0 = time.monotonic()
        if mode == "manager":
            m = ckptd.CheckpointManager(path, save_interval_steps=1)  # cluster="auto"
            assert m.cluster is not None and m.cluster.num_nodes > 1, m.cluster
            assert m.save(1, state, force=True)
            nodes = m.cluster.num_nodes
        elif mode in ("save", "save-zstd"):
            cluster = ckptd.discover_cluster()
            assert cluster is not None and cluster.num_nodes > 1, cluster
            st = ckptd.save(state, path, cluster=cluster, timeout=CALL_TIMEOUT,
                            **({"compression": "zstd"} if mode == "save-zstd" else {}))
            assert st.state == "COMMITTED" and st.world_size == world, st
            nodes = cluster.num_nodes
        elif mode.startswith("writer-"):
            _writer_save(mode, state, path)
            nodes = "?"
        else:
            raise ValueError(f"unknown save mode {mode}")
        dist.barrier()
        print(f"RESULT save {mode} rank {rank}/{world} nodes {nodes} "
              f"{time.monotonic() - t0:.2f}s", flush=True)


# ---------------------------------------------------------------------------
# load

def _saved_dir(a, mode):
    p = pathlib.Path(a.dir) / mode
    if mode == "manager":  # CheckpointManager's step directory
        steps = sorted(p.glob("step_*"))
        assert steps, f"no step directory under {p}"
        p = steps[-1]
    return str(p)


def _load_big(a, how, src, world, rank):
    import ckptd
    if how != "ckptd":
        raise ValueError(f"kind big loads with ckptd only, not {how}")
    sd = big_state(world, rank, fill=-7)
    ckptd.load(sd, src, via_daemon=True, local_rank=a.local_rank,
               local_world_size=a.local_world)
    st = ckptd._restore.last_stats()
    print("RESTORE " + json.dumps({"rank": rank, "stats": str(st),
                                   "need": big_need(world, rank)}), flush=True)
    check_big(sd, world, rank, f"ckptd.load of {src}")


def _load_model(a, how, src, world, rank, expect):
    import ckptd
    import torch.distributed.checkpoint as dcp
    model, optim = pw.build_dist(a.kind, world, rank, seed=1000, lr=pw.FRESH_LR,
                                 betas=pw.FRESH_BETAS)
    sd = {"app": pw.make_app(a.kind, model, optim, world, rank),
          "extra": pw.placeholders(pw.EXTRA), "step": pw.PLACEHOLDER}
    if how == "dcp":
        dcp.load(sd, checkpoint_id=src)  # stock FileSystemReader
    elif how == "reader":
        dcp.load(sd, storage_reader=ckptd.StorageReader(src))
    elif how == "ckptd":
        ckptd.load(sd, src, via_daemon=True, local_rank=a.local_rank,
                   local_world_size=a.local_world)
        assert sd["step"] == pw.DIST_STEPS, sd["step"]
    else:
        raise ValueError(how)
    pw.check_model(a.kind, model, optim, expect, world, rank, f"{how} load of {src}")


def check_zstd(src):
    """Every payload of src's .metadata is zstd-compressed, as stock DCP
    records it (_StorageInfo.transform_descriptors)."""
    import pickle
    with open(pathlib.Path(src) / ".metadata", "rb") as f:
        md = pickle.load(f)
    infos = list(md.storage_data.values())
    assert infos and all(getattr(i, "transform_descriptors", None) == ["stream.zstd/1"]
                         for i in infos), infos[:3]


def do_load(a, world, rank):
    import torch.distributed as dist
    expect = None if a.kind == "big" else pw.assemble_refs(a.refs)
    for spec in a.modes:
        how, _, saved = spec.partition("@")
        src = _saved_dir(a, saved)
        t0 = time.monotonic()
        if saved.endswith("zstd") and rank == 0:
            check_zstd(src)
        if a.kind == "big":
            _load_big(a, how, src, world, rank)
        else:
            _load_model(a, how, src, world, rank, expect)
        dist.barrier()
        print(f"RESULT load {spec} rank {rank}/{world} {time.monotonic() - t0:.2f}s",
              flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cmd", choices=["save", "load"])
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--kind", choices=["fsdp2", "shard", "big"], required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--refs", required=True)
    p.add_argument("--modes", required=True)
    p.add_argument("--local-rank", type=int, default=0)
    p.add_argument("--local-world", type=int, default=1)
    a = p.parse_args(argv)
    a.modes = [m for m in a.modes.split(",") if m]
    t0 = time.monotonic()
    faulthandler.dump_traceback_later(float(os.environ.get("CKPTD_NETNS_RANK_TIMEOUT", "150")),
                                      exit=True)
    warnings.filterwarnings("ignore")
    pw.setup_ckptd_import()
    pathlib.Path(a.refs).mkdir(parents=True, exist_ok=True)
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", rank=a.rank, world_size=a.world,
                            timeout=datetime.timedelta(seconds=90))
    rc = 0
    try:
        {"save": do_save, "load": do_load}[a.cmd](a, a.world, a.rank)
        print(f"OK {a.cmd} rank {a.rank}/{a.world} ({time.monotonic() - t0:.1f} s)", flush=True)
    except pw.Unsupported as e:
        print(f"SKIP: {e}", flush=True)
        rc = SKIP_EXIT
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass
    return rc


if __name__ == "__main__":
    sys.exit(main())
