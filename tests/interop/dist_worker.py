"""Multi-process DCP runs on CPU for the interop suite (torch >= 2.4).

    python3 tests/interop/dist_worker.py load-sample  --world N --dir CKPT
    python3 tests/interop/dist_worker.py load-sample-ckptd-reader --world N --dir CKPT
    python3 tests/interop/dist_worker.py save-dtensor --world N --dir CKPT
    python3 tests/interop/dist_worker.py ping         --world N --dir ANY

Spawns N processes with torch.multiprocessing.spawn; each joins a gloo
process group through a FileStore (no network: GLOO_SOCKET_IFNAME defaults
to the loopback interface), builds DTensors on a CPU DeviceMesh and runs
stock dcp.load / dcp.save. Exit status 0 when every rank succeeded; a
failing rank's traceback is printed.

load-sample: loads interop_tool's 4-rank sample (sample_spec.py) into N
ranks, the sharded tensors as DTensors with placements that cut across the
saved chunks (Shard(0)/Shard(1), Replicate), the rest as plain tensors and
bytes-item placeholders, and checks every rank's local data against the
formula. load-sample-ckptd-reader: the same through
dcp.load(storage_reader=ckptd.StorageReader(CKPT)).

save-dtensor: saves stock_spec.dtensor_spec(N) (DTensors sharded over a 1-D
mesh, a 2x2 mesh when N == 4, an uneven split with an empty shard, a
replicated DTensor, a plain replicated tensor and bytes items); the caller
then reads it with ckptd.
"""
import argparse
import datetime
import os
import pathlib
import sys
import tempfile
import traceback
import warnings

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

PLACEHOLDER = "<ckptd-placeholder>"


def _init(rank, world, store_path):
    import torch.distributed as dist
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=240))


def _local_box(shape, placements, mesh_shape, coord):
    """(offsets, sizes) of this rank's shard: torch.chunk split per Shard."""
    from sample_spec import chunk_split
    offs, sizes = [0] * len(shape), list(shape)
    for mdim, p in enumerate(placements):
        if p[0] == "S":
            d = p[1]
            off, size = chunk_split(sizes[d], mesh_shape[mdim])[coord[mdim]]
            offs[d] += off
            sizes[d] = size
    return offs, sizes


def _make_dtensor(local, mesh, placements, global_shape):
    """DTensor.from_local without any communication (shape/stride given)."""
    import torch
    from interop_common import dtensor_api
    from sample_spec import c_strides
    DTensor, Shard, Replicate, _ = dtensor_api()
    pl = [Shard(p[1]) if p[0] == "S" else Replicate() for p in placements]
    return DTensor.from_local(local, mesh, pl, run_check=False,
                              shape=torch.Size(global_shape), stride=tuple(c_strides(global_shape)))


def _check_chunk_list(dt, offs, sizes, what):
    """Our idea of the local box must be DTensor's (it is what DCP reads
    and writes)."""
    if not hasattr(dt, "__create_chunk_list__"):
        return
    chunks = dt.__create_chunk_list__()
    assert len(chunks) == 1, (what, chunks)
    got = (list(chunks[0].offsets), list(chunks[0].sizes))
    if all(s > 0 for s in sizes):
        assert got == (offs, sizes), f"{what}: DTensor chunk {got} != expected {(offs, sizes)}"


def _slices(offs, sizes):
    return tuple(slice(o, o + s) for o, s in zip(offs, sizes))


# ---------------------------------------------------------------------------

# Placements used to load the sample, per world size: (mesh dim 0) only.
def _sample_load_placements(world):
    return {
        "model.layers.0.weight": [("S", 0)],
        "model.layers.0.proj.weight": [("S", 1)],
        "model.layers.1.weight": [("S", 1)] if world == 3 else [("S", 0)],
        "optim.state.layers.0.weight.exp_avg": [("S", 1)],
        "model.norm.scale": [("R",)],
    }


def load_sample(rank, world, ckpt, reader="stock"):
    import torch
    import torch.distributed.checkpoint as dcp
    from interop_common import dtensor_api
    from sample_spec import SAMPLE_OBJECTS, SAMPLE_TENSORS, set_path, strict_equal, torch_bytes, torch_full
    _, _, _, init_device_mesh = dtensor_api()
    mesh = init_device_mesh("cpu", (world,))
    placements = _sample_load_placements(world)
    sd, local_boxes = {}, {}
    for t in SAMPLE_TENSORS:
        dtype = getattr(torch, t.dtype)
        if t.fqn in placements:
            offs, sizes = _local_box(t.shape, placements[t.fqn], (world,), (rank,))
            # Garbage that the load must overwrite (not zeros: a missing
            # read must show).
            local = torch.full(sizes, 7, dtype=dtype) if t.dtype != "bool" else torch.ones(sizes, dtype=dtype)
            value = _make_dtensor(local, mesh, placements[t.fqn], t.shape)
            _check_chunk_list(value, offs, sizes, t.fqn)
            local_boxes[t.fqn] = (offs, sizes)
        else:
            value = torch.full(t.shape, 7, dtype=dtype) if t.dtype != "bool" else torch.ones(t.shape, dtype=dtype)
        set_path(sd, t.path, value)
    for b in SAMPLE_OBJECTS:
        set_path(sd, b.path, PLACEHOLDER)

    if reader == "ckptd":
        import pyclient_dist_worker
        pyclient_dist_worker.setup_ckptd_import()
        import ckptd
        dcp.load(sd, storage_reader=ckptd.StorageReader(ckpt))
    else:
        dcp.load(sd, checkpoint_id=str(ckpt))

    def get(path):
        cur = sd
        for p in path:
            cur = cur[p]
        return cur

    for t in SAMPLE_TENSORS:
        full = torch_full(t.dtype, t.shape, t.seed)
        got = get(t.path)
        if t.fqn in local_boxes:
            offs, sizes = local_boxes[t.fqn]
            want = full[_slices(offs, sizes)] if t.shape else full
            got = got.to_local()
        else:
            want = full
        assert got.dtype == want.dtype and list(got.shape) == list(want.shape), (t.fqn, got.shape)
        assert torch_bytes(got) == torch_bytes(want), f"rank {rank}: {t.fqn} differs:\n{got}\n!=\n{want}"
    delivered = 0
    for b in SAMPLE_OBJECTS:
        got = get(b.path)
        if isinstance(got, str) and got == PLACEHOLDER:
            # Non-tensor values may not reach the caller's dict in some 2.x
            # versions (see test_dcp_load_ckptd.py::test_load_plain_tensors).
            continue
        diff = strict_equal(got, b.value, b.fqn)
        assert diff is None, f"rank {rank}: {diff}"
        delivered += 1
    print(f"rank {rank}/{world}: sample loaded and checked ({len(local_boxes)} DTensors: "
          f"{local_boxes}; {delivered}/{len(SAMPLE_OBJECTS)} bytes items delivered)", flush=True)


def save_dtensor(rank, world, ckpt):
    import torch.distributed.checkpoint as dcp
    from interop_common import dtensor_api
    from stock_spec import TS, dtensor_spec, mesh_shape
    _, _, _, init_device_mesh = dtensor_api()
    meshes = {"1d": init_device_mesh("cpu", (world,))}
    if world == 4:
        meshes["2d"] = init_device_mesh("cpu", (2, 2))

    def leaf(ts: TS):
        full = ts.torch_value()
        if ts.dist is None:
            return full
        mesh_name, placements = ts.dist
        mesh = meshes[mesh_name]
        coord = tuple(mesh.get_coordinate())
        offs, sizes = _local_box(ts.shape, placements, mesh_shape(mesh_name, world), coord)
        local = full[_slices(offs, sizes)].clone()
        dt = _make_dtensor(local, mesh, placements, ts.shape)
        _check_chunk_list(dt, offs, sizes, repr(ts))
        return dt

    from stock_spec import materialize
    sd = materialize(dtensor_spec(world), leaf)
    dcp.save(sd, checkpoint_id=str(ckpt))
    print(f"rank {rank}/{world}: saved", flush=True)


def ping(rank, world, ckpt):
    """Process-group smoke test (no DCP): an all_reduce over gloo."""
    import torch
    import torch.distributed as dist
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    assert t.item() == world * (world + 1) / 2, t
    print(f"rank {rank}/{world}: ping ok", flush=True)


def load_sample_ckptd_reader(rank, world, ckpt):
    load_sample(rank, world, ckpt, reader="ckptd")


COMMANDS = {"load-sample": load_sample, "load-sample-ckptd-reader": load_sample_ckptd_reader,
            "save-dtensor": save_dtensor, "ping": ping}


def _worker(rank, world, cmd, ckpt, store_path):
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    _init(rank, world, store_path)
    try:
        COMMANDS[cmd](rank, world, ckpt)
        dist.barrier()
    except BaseException:
        # Print here too: the parent's ProcessRaisedException may be terse.
        traceback.print_exc()
        sys.stderr.flush()
        raise
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass


def run(cmd, world, ckpt, timeout=None):
    """Runs cmd on `world` processes; returns normally or raises."""
    import torch.multiprocessing as mp
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with tempfile.TemporaryDirectory(prefix="ckptd_store_") as tmp:
        store_path = os.path.join(tmp, "filestore")  # must not exist yet
        mp.spawn(_worker, args=(world, cmd, str(ckpt), store_path), nprocs=world, join=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cmd", choices=sorted(COMMANDS))
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--dir", required=True, help="checkpoint directory")
    a = p.parse_args(argv)
    run(a.cmd, a.world, pathlib.Path(a.dir).resolve())
    print(f"dist_worker {a.cmd} world={a.world}: ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
