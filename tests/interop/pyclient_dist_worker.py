"""Helpers and the multi-process worker of test_pyclient_torch2.py: the ckptd
Python package (client/python/ckptd) against stock
torch.distributed.checkpoint.

As a module (imported by the test, only where torch is importable; nothing
here imports a torch>=2.4 API at import time, so the single-process helpers
and the `shard` kind below also run under Debian's torch 1.13):

  setup_ckptd_import()   `import ckptd` from the tree, with
                         $CKPTD_CLIENT_LIB (default
                         $CKPTD_BUILD_DIR/client/libckptd_client.so)
  start_daemon(base)     a real $CKPTD_BUILD_DIR/bin/ckptd
                         (tests/python/daemon_util.Daemon) whose readiness
                         check goes through ckptd's own client, so the
                         torch 2.x Python needs no grpcio; stop_daemon(d)
  Net, fresh_net, train_local, snapshot, assert_training_state,
  init_optim_state       a small model + Adam, trained in one process
  AppState               DCP's Stateful recipe around get_state_dict /
                         set_state_dict (torch >= 2.2; called lazily)
  run_job(cmd, world, kind, ...)   runs this file as `world` rank processes

As a script, one rank of a gloo job on CPU (file:// rendezvous,
GLOO_SOCKET_IFNAME=lo):

  pyclient_dist_worker.py save|load --rank R --world N --kind K --init FILE
      [--socket SOCK] --ckptd-dir A --stock-dir B --refs DIR
      [--save-with ckptd|dcp-writer-save|dcp-writer-async|dcp-writer-process|
                   dcp-writer-background] [--compression zstd[:N]] [--storage-reader]

  Without --socket each rank talks to the daemon $CKPTD_SOCKET names (the
  default socket without it), and --ckptd-dir / --stock-dir / --refs default
  to $CKPTD_WORKER_CKPTD_DIR / _STOCK_DIR / _REFS: ranks of one job may use several daemons
  (nodes), and ckptd.StorageWriter / StorageReader, given no socket and no
  cluster, find which ranks share which daemon by themselves
  (run_job(sockets=[...]): one socket per rank).

kinds (how the model's parameters are distributed):
  dtensor  torch>=2.4: every parameter replaced by
           distribute_tensor(param, cpu_mesh, placements): Shard(0) rows,
           Shard(1) columns, Replicate (PLACEMENTS); uneven splits
  fsdp2    FSDP2 fully_shard(model, mesh=cpu_mesh) (Shard(0) everywhere);
           a failing fully_shard() call exits SKIP_EXIT with the reason
  shard    plain local tensors put in the state dict as ckptd.Shard (no
           torch>=2.4 API; DCP steps are left out): checks this harness
           and ckptd's resharding under torch 1.13

save: every rank builds the same Net (seed 0), runs 2 Adam steps on
  deterministic gradients (no forward: FSDP2's collectives stay out of it),
  writes its local pieces and their boxes to REFS/ref_rank<r>.pt (the
  expectation, independent of any checkpoint code), then
  ckptd.save({"app": AppState(model, optim), "extra": EXTRA, "step": 2}, A)
  (rank and world size from the process group) — or, --save-with
  dcp-writer-*, dcp.save / dcp.async_save with ckptd.StorageWriter(A) —
  and, except kind shard, stock dcp.save of the same state dict into B.
load: rebuilds the full tensors from every REFS/ref_rank*.pt, then (kinds
  dtensor / fsdp2) stock dcp.load of A into a fresh model of this world
  size and into plain full tensors; then ckptd.load of B (kind shard: A)
  into a fresh model, and into ckptd.Shard boxes cut across the saved ones
  plus plain full tensors; --storage-reader: also dcp.load with
  ckptd.StorageReader of A and of B. Every rank compares every local value
  bit-for-bit with its box of the full tensors, the optimizer's step / lr /
  betas, the buffer and (ckptd.load) the non-tensor values.

Exit status: 0 OK ("OK <cmd> <kind> rank r/N" printed), SKIP_EXIT (77)
with "SKIP: <reason>" when fully_shard is unusable here, else failure.
"""
import argparse
import copy
import datetime
import os
import pathlib
import signal
import subprocess
import sys
import time
import uuid
import warnings

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import torch  # noqa: E402

import interop_common as ic  # noqa: E402
from sample_spec import chunk_split, strict_equal, torch_bytes  # noqa: E402

SKIP_EXIT = 77
PLACEHOLDER = "<ckptd-placeholder>"

# The saving optimizer's hyper-parameters, and different ones for the fresh
# optimizers that a load must overwrite.
LR, BETAS = 0.05, (0.9, 0.95)
FRESH_LR, FRESH_BETAS = 0.5, (0.8, 0.9)
DIST_STEPS = 2

# Non-tensor values (bytes items), nested under "extra".
EXTRA = {
    "tokens_seen": 123456789012,
    "tag": "ckptd-\u00fc",
    "shape": (3, 4),
    "none": None,
    "ratio": 0.125,
    "flag": True,
    "cfg": {"depth": 2, "names": ["a", "b"]},
}

# Net's parameters: global shapes, and their placement for kinds dtensor and
# shard (fsdp2 shards every parameter on dim 0). No split below leaves a
# rank an empty box for 2, 3 or 4 ranks (fsdp2: 2 and 4).
SHAPES = {
    "emb.weight": (37, 8),
    "proj.weight": (12, 8),
    "proj.bias": (12,),
    "norm.weight": (12,),
    "norm.bias": (12,),
    "head.weight": (4, 12),
}
PLACEMENTS = {
    "emb.weight": ("S", 0),     # 37 rows: 10,10,10,7 / 13,13,11 / 19,18
    "proj.weight": ("S", 1),    # 8 columns
    "proj.bias": ("S", 0),
    "norm.weight": ("S", 0),
    "norm.bias": ("S", 0),
    "head.weight": ("R",),
}


class Unsupported(Exception):
    """This torch cannot run the requested kind here (reported as a skip)."""


# ---------------------------------------------------------------------------
# ckptd and its daemon

def native_lib():
    return pathlib.Path(os.environ.get("CKPTD_CLIENT_LIB")
                        or ic.build_dir() / "client" / "libckptd_client.so")


def package_dir():
    return REPO / "client" / "python"


def setup_ckptd_import():
    """`import ckptd` from client/python with the built native library
    ($CKPTD_CLIENT_LIB if set). Raises nothing: a missing library fails at
    first use (start_daemon checks it with a clear message)."""
    os.environ.setdefault("CKPTD_CLIENT_LIB", str(native_lib()))
    p = str(package_dir())
    if p not in sys.path:
        sys.path.insert(0, p)


def child_env():
    """The environment of a worker process."""
    env = dict(os.environ)
    env["CKPTD_CLIENT_LIB"] = str(native_lib())
    env["PYTHONPATH"] = os.pathsep.join(
        [str(package_dir()), str(HERE)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def start_daemon(base, root=None, **flags):
    """Starts a ckptd daemon with its socket, checkpoint root (d.root; `root`
    when given, e.g. one shared by several daemons), shm and state
    directories under `base`; returns the daemon_util.Daemon."""
    setup_ckptd_import()
    lib = native_lib()
    if not lib.exists():
        raise AssertionError(f"{lib} is not built (build the project, or set CKPTD_BUILD_DIR / "
                             "CKPTD_CLIENT_LIB)")
    tests_python = str(REPO / "tests" / "python")
    if tests_python not in sys.path:
        sys.path.append(tests_python)
    import daemon_util as du

    import ckptd

    class Daemon(du.Daemon):
        def info(self, timeout=10):
            # GetInfo through libckptd_client.so instead of grpcio stubs.
            return ckptd.client(str(self.socket)).info()

    d = Daemon(base, **flags)
    if root is not None:
        d.root = pathlib.Path(root)
    try:
        d.start()
    except BaseException:
        d.close()
        raise
    return d


def stop_daemon(d):
    """Closes this process's ckptd connections, then kills the daemon.
    Returns whether it was still running (it must not have crashed)."""
    import ckptd
    ckptd.close_clients()
    alive = d.running()
    d.close()
    return alive


# ---------------------------------------------------------------------------
# The model, single process

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(37, 8)
        self.proj = torch.nn.Linear(8, 12)
        self.norm = torch.nn.LayerNorm(12)
        self.head = torch.nn.Linear(12, 4, bias=False)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, idx):
        with torch.no_grad():
            self.calls.add_(1)
        return self.head(torch.relu(self.norm(self.proj(self.emb(idx).mean(1)))))


def fresh_net(seed, device="cpu", lr=LR, betas=BETAS, **adam_kwargs):
    torch.manual_seed(seed)
    model = Net().to(device)
    return model, torch.optim.Adam(model.parameters(), lr=lr, betas=betas, **adam_kwargs)


def train_local(model, optim, steps, seed):
    g = torch.Generator().manual_seed(seed)
    dev = next(model.parameters()).device
    for _ in range(steps):
        idx = torch.randint(0, 37, (8, 5), generator=g).to(dev)
        y = torch.randint(0, 4, (8,), generator=g).to(dev)
        optim.zero_grad()
        torch.nn.functional.cross_entropy(model(idx), y).backward()
        optim.step()


def to_cpu(obj):
    """A deep copy with every tensor cloned to the CPU."""
    if torch.is_tensor(obj):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_cpu(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(to_cpu(v) for v in obj)
    return copy.deepcopy(obj)


def snapshot(model, optim):
    """(model state dict, optimizer state dict) copied to the CPU: the
    expectation of a round trip, taken from the live objects."""
    return to_cpu(dict(model.state_dict())), to_cpu(optim.state_dict())


def assert_training_state(model, optim, ref_model, ref_optim, what):
    """model / optim hold exactly (dtype, shape, bytes; value types) the
    snapshot()ed state. Devices may differ (compared on the CPU)."""
    diff = strict_equal(to_cpu(dict(model.state_dict())), ref_model, f"{what}: model")
    assert diff is None, diff
    got = to_cpu(optim.state_dict())
    assert set(got["state"]) == set(ref_optim["state"]), \
        f"{what}: optimizer state keys {sorted(got['state'])} != {sorted(ref_optim['state'])}"
    diff = strict_equal(got, ref_optim, f"{what}: optim")
    assert diff is None, diff


def init_optim_state(optim):
    """Materialises a fresh optimizer's state (what DCP users do before a
    stock load into optim.state_dict()): one step with zero gradients and
    lr 0, which leaves the parameters unchanged."""
    for g in optim.param_groups:
        for p in g["params"]:
            p.grad = torch.zeros_like(p)
    lrs = [g["lr"] for g in optim.param_groups]
    for g in optim.param_groups:
        g["lr"] = 0.0
    optim.step()
    for g, lr in zip(optim.param_groups, lrs):
        g["lr"] = lr
    optim.zero_grad(set_to_none=True)


def placeholders(value):
    """value's nesting of dicts with every leaf replaced by PLACEHOLDER: a
    load request with the same flat keys."""
    if isinstance(value, dict):
        return {k: placeholders(v) for k, v in value.items()}
    return PLACEHOLDER


class AppState:
    """DCP's recommended Stateful (torch/distributed/checkpoint docs): the
    model and optimizer state dicts from get_state_dict (canonical FQN keys,
    DTensors for sharded parameters), loaded back with set_state_dict. Both
    ckptd (ckptd.is_stateful) and DCP (the runtime-checkable Stateful
    protocol) call state_dict() / load_state_dict()."""

    def __init__(self, model, optim):
        self.model = model
        self.optim = optim

    def state_dict(self):
        from torch.distributed.checkpoint.state_dict import get_state_dict
        model_sd, optim_sd = get_state_dict(self.model, self.optim)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state_dict):
        from torch.distributed.checkpoint.state_dict import set_state_dict
        set_state_dict(self.model, self.optim, model_state_dict=state_dict["model"],
                       optim_state_dict=state_dict["optim"])


# ---------------------------------------------------------------------------
# Distributed layouts

def box(shape, placement, world, rank):
    """(offsets, sizes) of `rank`'s box: torch.chunk split (DTensor's Shard
    and FSDP2 split the same way) on the placement's dimension."""
    offs, sizes = [0] * len(shape), list(shape)
    if placement[0] == "S":
        d = placement[1]
        offs[d], sizes[d] = chunk_split(shape[d], world)[rank]
    return offs, sizes


def slices(offs, sizes):
    return tuple(slice(o, o + s) for o, s in zip(offs, sizes))


def placement_of(kind, fqn):
    return ("S", 0) if kind == "fsdp2" else PLACEMENTS[fqn]


def local_of(t):
    """The rank's local tensor of a DTensor (FSDP2 parameters included);
    the tensor itself otherwise."""
    return t.to_local() if hasattr(t, "to_local") else t


def check_chunk(t, offs, sizes, what):
    """The DTensor's own idea of its box (what DCP reads and writes) must
    be ours."""
    if not hasattr(t, "__create_chunk_list__"):
        return
    chunks = t.__create_chunk_list__()
    assert len(chunks) == 1, (what, chunks)
    got = ([int(o) for o in chunks[0].offsets], [int(s) for s in chunks[0].sizes])
    assert got == (list(offs), list(sizes)), f"{what}: DTensor chunk {got} != expected " \
                                             f"{(list(offs), list(sizes))}"


def grad_full(fqn, step):
    """A deterministic full gradient (identical on every rank)."""
    shape = SHAPES[fqn]
    n = 1
    for s in shape:
        n *= s
    phase = (sum(map(ord, fqn)) % 89) / 89.0
    x = torch.arange(n, dtype=torch.float64) * (0.37 + 0.11 * step) + phase
    return (torch.sin(x) * (step + 1) / 8).float().reshape(shape)


def _distribute_tensor():
    try:
        from torch.distributed.tensor import distribute_tensor
    except ImportError:  # torch 2.4
        from torch.distributed._tensor import distribute_tensor
    return distribute_tensor


def _fully_shard():
    try:
        from torch.distributed.fsdp import fully_shard  # public from 2.6
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import fully_shard  # 2.4, 2.5
        except ImportError as e:
            raise Unsupported(f"torch {torch.__version__} has no FSDP2 fully_shard: {e}")
    return fully_shard


def build_dist(kind, world, rank, seed, lr, betas):
    """Net distributed as `kind` on this world size, and Adam over its
    (distributed) parameters."""
    torch.manual_seed(seed)  # the same full values on every rank
    model = Net()
    params = {}
    for mname, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            params[f"{mname}.{pname}" if mname else pname] = (mod, pname, p)
    assert {k: tuple(v[2].shape) for k, v in params.items()} == SHAPES, params
    if kind == "dtensor":
        _, Shard, Replicate, init_device_mesh = ic.dtensor_api()
        distribute_tensor = _distribute_tensor()
        mesh = init_device_mesh("cpu", (world,))
        for fqn, (mod, pname, p) in params.items():
            pl = PLACEMENTS[fqn]
            placements = [Shard(pl[1])] if pl[0] == "S" else [Replicate()]
            setattr(mod, pname, torch.nn.Parameter(distribute_tensor(p.detach(), mesh, placements)))
    elif kind == "fsdp2":
        fully_shard = _fully_shard()
        _, _, _, init_device_mesh = ic.dtensor_api()
        mesh = init_device_mesh("cpu", (world,))
        try:
            fully_shard(model, mesh=mesh)
        except Exception as e:  # e.g. no CPU support in this version
            raise Unsupported(f"fully_shard(model, mesh=<cpu mesh>) failed with torch "
                              f"{torch.__version__}: {type(e).__name__}: {e}")
    elif kind == "shard":
        for fqn, (mod, pname, p) in params.items():
            offs, sizes = box(SHAPES[fqn], PLACEMENTS[fqn], world, rank)
            setattr(mod, pname, torch.nn.Parameter(p.detach()[slices(offs, sizes)].clone()))
    else:
        raise ValueError(f"unknown kind {kind}")
    for fqn, p in model.named_parameters():
        assert tuple(p.shape) == SHAPES[fqn] or kind == "shard", (fqn, p.shape)
        check_chunk(p, *box(SHAPES[fqn], placement_of(kind, fqn), world, rank), f"{kind} {fqn}")
    optim = torch.optim.Adam(model.parameters(), lr=lr, betas=betas, foreach=False)
    return model, optim


def train_dist(kind, model, optim, world, rank, steps=DIST_STEPS):
    """Adam steps on grad_full() gradients, set directly on the (sharded)
    parameters."""
    for step in range(steps):
        for fqn, p in model.named_parameters():
            g = grad_full(fqn, step)
            if kind == "shard":
                p.grad = g[slices(*box(SHAPES[fqn], PLACEMENTS[fqn], world, rank))].clone()
            else:
                p.grad = _distribute_tensor()(g, p.device_mesh, list(p.placements))
        optim.step()
        optim.zero_grad(set_to_none=True)
        with torch.no_grad():
            model.calls.add_(1)


class ShardAppState:
    """For kind shard: the state dict get_state_dict would give (same flat
    keys: model.<fqn>, optim.state.<fqn>.<name>, optim.param_groups.0.*),
    with the local pieces as ckptd.Shard. ckptd.load fills them in place;
    load_state_dict() copies the hyper-parameters back."""

    def __init__(self, model, optim, world, rank):
        self.model, self.optim, self.world, self.rank = model, optim, world, rank

    def _wrap(self, fqn, t):
        import ckptd
        pl = PLACEMENTS[fqn]
        if pl[0] == "R":
            return t
        offs, _ = box(SHAPES[fqn], pl, self.world, self.rank)
        return ckptd.Shard(t, offs, SHAPES[fqn])

    def state_dict(self):
        if not self.optim.state:
            init_optim_state(self.optim)
        names = {}
        model_sd = {}
        for name, b in self.model.named_buffers():
            model_sd[name] = b
        for fqn, p in self.model.named_parameters():
            names[p] = fqn
            model_sd[fqn] = self._wrap(fqn, p.detach())
        state = {}
        for fqn, p in self.model.named_parameters():
            s = self.optim.state[p]
            state[fqn] = {"step": s["step"], "exp_avg": self._wrap(fqn, s["exp_avg"]),
                          "exp_avg_sq": self._wrap(fqn, s["exp_avg_sq"])}
        groups = []
        for g in self.optim.param_groups:
            d = {k: v for k, v in g.items() if k != "params"}
            d["params"] = [names[p] for p in g["params"]]
            groups.append(d)
        return {"model": model_sd, "optim": {"state": state, "param_groups": groups}}

    def load_state_dict(self, state_dict):
        for g, loaded in zip(self.optim.param_groups, state_dict["optim"]["param_groups"]):
            for k, v in loaded.items():
                if k != "params":
                    g[k] = v


def make_app(kind, model, optim, world, rank):
    return ShardAppState(model, optim, world, rank) if kind == "shard" else AppState(model, optim)


# ---------------------------------------------------------------------------
# The expectation: every rank's local pieces after training

def dump_refs(kind, model, optim, world, rank, refs_dir):
    ref = {"world": world, "boxes": {}, "tensors": {}, "steps": {}, "calls": int(model.calls)}
    for fqn, p in model.named_parameters():
        offs, sizes = box(SHAPES[fqn], placement_of(kind, fqn), world, rank)
        check_chunk(p, offs, sizes, f"saved {fqn}")
        ref["boxes"][fqn] = offs
        s = optim.state[p]
        for key, t in ((f"model.{fqn}", p), (f"optim.{fqn}.exp_avg", s["exp_avg"]),
                       (f"optim.{fqn}.exp_avg_sq", s["exp_avg_sq"])):
            local = local_of(t).detach().clone()
            assert list(local.shape) == sizes, (key, local.shape, sizes)
            ref["tensors"][key] = local
        ref["steps"][fqn] = float(s["step"])
    torch.save(ref, pathlib.Path(refs_dir) / f"ref_rank{rank}.pt")


def assemble_refs(refs_dir):
    """(full tensors by key, optimizer steps by fqn, buffer value) from
    every saved rank's ref file."""
    files = sorted(pathlib.Path(refs_dir).glob("ref_rank*.pt"))
    # (Our own files; torch 1.13's weights_only unpickler has no floats.)
    refs = [torch.load(f, map_location="cpu", weights_only=False) for f in files]
    assert refs and len(refs) == refs[0]["world"], f"ref files {files}"
    full = {}
    for fqn, shape in SHAPES.items():
        for key in (f"model.{fqn}", f"optim.{fqn}.exp_avg", f"optim.{fqn}.exp_avg_sq"):
            t = torch.full(shape, float("nan"))
            for r in refs:
                local = r["tensors"][key]
                t[slices(r["boxes"][fqn], local.shape)] = local
            assert not torch.isnan(t).any(), f"{key}: the saved ranks do not cover it"
            full[key] = t
    steps = refs[0]["steps"]
    assert all(r["steps"] == steps and r["calls"] == refs[0]["calls"] for r in refs), \
        [(r["steps"], r["calls"]) for r in refs]
    assert all(v == float(DIST_STEPS) for v in steps.values()), steps
    return full, steps, refs[0]["calls"]


def same(got, want, what):
    got = got.detach()
    assert got.dtype == want.dtype and list(got.shape) == list(want.shape), \
        f"{what}: {got.dtype}{list(got.shape)} != {want.dtype}{list(want.shape)}"
    assert torch_bytes(got) == torch_bytes(want), f"{what} differs:\n{got}\n!=\n{want}"


def check_model(kind, model, optim, expect, world, rank, what):
    full, steps, calls = expect
    n = 0
    for fqn, p in model.named_parameters():
        offs, sizes = box(SHAPES[fqn], placement_of(kind, fqn), world, rank)
        check_chunk(p, offs, sizes, f"{what}: {fqn}")
        sl = slices(offs, sizes)
        same(local_of(p), full[f"model.{fqn}"][sl], f"{what}: rank {rank} model.{fqn}")
        s = optim.state[p]
        for name in ("exp_avg", "exp_avg_sq"):
            same(local_of(s[name]), full[f"optim.{fqn}.{name}"][sl],
                 f"{what}: rank {rank} optim.state.{fqn}.{name}")
        assert float(s["step"]) == steps[fqn], (what, fqn, s["step"])
        n += 1
    assert n == len(SHAPES), (what, n)
    g = optim.param_groups[0]
    assert g["lr"] == LR and tuple(g["betas"]) == BETAS, f"{what}: param group {g}"
    assert int(model.calls) == calls, (what, model.calls)


def plain_request():
    """Full-size plain tensors (garbage) for every tensor of the checkpoint:
    (request, {key: tensor})."""
    model = {"calls": torch.full((), -1, dtype=torch.int64)}
    state = {}
    flat = {"calls": model["calls"]}
    for fqn, shape in SHAPES.items():
        model[fqn] = flat[f"model.{fqn}"] = torch.full(shape, 7.0)
        st = {"step": torch.full((), -1.0)}
        flat[f"step.{fqn}"] = st["step"]
        for name in ("exp_avg", "exp_avg_sq"):
            st[name] = flat[f"optim.{fqn}.{name}"] = torch.full(shape, 7.0)
        state[fqn] = st
    return {"app": {"model": model, "optim": {"state": state}}}, flat


def check_plain(flat, expect, what):
    full, steps, calls = expect
    for key, t in flat.items():
        if key == "calls":
            assert int(t) == calls, (what, t)
        elif key.startswith("step."):
            assert float(t) == steps[key[5:]], (what, key, t)
        else:
            same(t, full[key], f"{what}: {key}")


def alt_box(shape, world, rank):
    """Boxes that cut across every saved layout: columns for matrices,
    rows in reverse rank order for vectors."""
    if len(shape) == 2:
        return box(shape, ("S", 1), world, rank)
    return box(shape, ("S", 0), world, world - 1 - rank)


def alt_request(world, rank):
    """ckptd.Shard boxes (alt_box) for parameters and exp_avg_sq, plain full
    tensors for exp_avg: (request, [(key, tensor, offsets, sizes)])."""
    import ckptd
    checks = []
    model, state = {}, {}
    for fqn, shape in SHAPES.items():
        offs, sizes = alt_box(shape, world, rank)
        model[fqn] = ckptd.Shard(torch.full(sizes, 7.0), offs, shape)
        checks.append((f"model.{fqn}", model[fqn].tensor, offs, sizes))
        sq = ckptd.Shard(torch.full(sizes, 7.0), offs, shape)
        avg = torch.full(shape, 7.0)
        state[fqn] = {"exp_avg": avg, "exp_avg_sq": sq}
        checks.append((f"optim.{fqn}.exp_avg", avg, [0] * len(shape), list(shape)))
        checks.append((f"optim.{fqn}.exp_avg_sq", sq.tensor, offs, sizes))
    return {"app": {"model": model, "optim": {"state": state}}}, checks


def check_alt(checks, expect, what):
    full = expect[0]
    for key, t, offs, sizes in checks:
        same(t, full[key][slices(offs, sizes)], f"{what}: {key} box {offs}+{sizes}")


# ---------------------------------------------------------------------------
# The jobs

def do_save(a, world, rank):
    import ckptd
    model, optim = build_dist(a.kind, world, rank, seed=0, lr=LR, betas=BETAS)
    train_dist(a.kind, model, optim, world, rank)
    dump_refs(a.kind, model, optim, world, rank, a.refs)
    state = {"app": make_app(a.kind, model, optim, world, rank), "extra": EXTRA,
             "step": DIST_STEPS}
    if a.save_with.startswith("dcp-writer-"):
        save_with_storage_writer(a, state, world, rank)
        return
    # ckptd-cluster: the ranks' daemons found by discover_cluster (several
    # nodes when the ranks' sockets name several daemons).
    cluster = ckptd.discover_cluster(socket=a.socket) if a.save_with == "ckptd-cluster" else None
    st = ckptd.save(state, a.ckptd_dir, socket=a.socket, timeout=120, cluster=cluster,
                    compression=a.compression)
    if a.lean:
        assert st.state == "COMMITTED", st
        print(f"rank {rank}/{world}: ckptd.save with cluster {cluster} committed", flush=True)
        return
    assert st.state == "COMMITTED" and st.world_size == world, st
    print(f"rank {rank}/{world}: ckptd.save of {a.kind} state committed "
          f"({st.file_bytes} bytes in {st.files} files)", flush=True)
    if a.kind != "shard":
        import torch.distributed.checkpoint as dcp
        dcp.save(state, checkpoint_id=a.stock_dir)
        print(f"rank {rank}/{world}: stock dcp.save done", flush=True)


def ephemeral_port_low():
    """The lowest port the kernel hands out to a socket bound to port 0."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        return int(f.read().split()[0])


def port_for_dcp_process():
    """Make DCP's process-based executor pick its rendezvous port where no
    other process is handed one. DCP's rank 0 takes a port with
    get_free_port() (bind to port 0, close, let the checkpoint process bind
    it later), and between the two the kernel can give the same port to any
    process's socket: CI saw "Address already in use" on it. Here the port
    comes from below the kernel's ephemeral range, which the kernel never
    hands out by itself. (DCP_USE_PREFIX_STORE=1 would avoid the pick, but
    its checkpoint process then makes a libuv TCPStore, which Debian's torch
    lacks.)"""
    import random
    import socket
    from torch.distributed.checkpoint import _async_process_executor as ape
    if not hasattr(ape, "get_free_port"):
        return  # a torch whose executor picks its port another way
    low = ephemeral_port_low()

    def get_free_port():
        for port in random.sample(range(max(1024, low - 8192), low), 256):
            with socket.socket() as s:
                try:
                    s.bind(("", port))
                except OSError:
                    continue
                return port
        raise RuntimeError(f"no free TCP port below the ephemeral range (from {low})")

    ape.get_free_port = get_free_port


def save_with_storage_writer(a, state, world, rank):
    """dcp.save / dcp.async_save through ckptd.StorageWriter into A, stock
    dcp.save into B."""
    import ckptd
    import torch.distributed.checkpoint as dcp
    # No cluster argument: across several daemons the writer finds it.
    w = ckptd.StorageWriter(a.ckptd_dir, socket=a.socket, timeout=120,
                            compression=a.compression,
                            background_staging=a.save_with == "dcp-writer-background")
    if a.save_with == "dcp-writer-async":
        dcp.async_save(state, storage_writer=w).result(timeout=120)
    elif a.save_with == "dcp-writer-background":
        resp = dcp.async_save(state, storage_writer=w)
        resp.staging_completion.result(timeout=120)
        resp.upload_completion.result(timeout=120)
    elif a.save_with == "dcp-writer-process":
        # DCP's process-based executor (torch >= 2.7): the writer is pickled
        # into DCP's checkpoint process, which plans, writes and finishes.
        from torch.distributed.checkpoint import state_dict_saver as sds
        kind = getattr(getattr(sds, "AsyncCheckpointerType", None), "PROCESS", None)
        if kind is None:
            import torch
            raise Unsupported(f"torch {torch.__version__} has no AsyncCheckpointerType.PROCESS")
        # Its processes meet over TCP at MASTER_ADDR (torchrun sets it; here
        # the group came from a file).
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("USE_LIBUV", "0")  # Debian's torch has no libuv TCPStore
        port_for_dcp_process()
        dcp.async_save(state, storage_writer=w, async_checkpointer_type=kind).result(timeout=120)
    else:
        dcp.save(state, storage_writer=w)
    print(f"rank {rank}/{world}: {a.save_with} through ckptd.StorageWriter done", flush=True)
    if a.lean:
        return
    dcp.save(state, checkpoint_id=a.stock_dir)
    print(f"rank {rank}/{world}: stock dcp.save done", flush=True)


def load_with_storage_reader(a, world, rank, expect, done):
    """dcp.load with ckptd.StorageReader of A (ours) and of B (stock's;
    --lean: A only)."""
    import ckptd
    import torch.distributed.checkpoint as dcp
    sources = ((a.ckptd_dir, "ckptd"), (a.stock_dir, "stock dcp.save"))
    for src, name in sources[:1] if a.lean else sources:
        what = f"dcp.load with ckptd.StorageReader of the {name} checkpoint into {a.kind}"
        model, optim = build_dist(a.kind, world, rank, seed=1000, lr=FRESH_LR, betas=FRESH_BETAS)
        sd = {"app": make_app(a.kind, model, optim, world, rank), "extra": placeholders(EXTRA),
              "step": PLACEHOLDER}
        reader = ckptd.StorageReader(src, socket=a.socket)
        dcp.load(sd, storage_reader=reader)
        print(f"rank {rank}/{world}: ckptd.StorageReader of {name}: restore group "
              f"local_rank={reader.local_rank} local_world_size={reader.local_world_size}",
              flush=True)
        check_model(a.kind, model, optim, expect, world, rank, what)
        diff = strict_equal(sd["extra"], EXTRA, f"{what}: extra")
        assert diff is None, diff
        done.append(what)


def do_load(a, world, rank):
    import ckptd
    expect = assemble_refs(a.refs)
    done = []

    def fresh():
        model, optim = build_dist(a.kind, world, rank, seed=1000, lr=FRESH_LR, betas=FRESH_BETAS)
        sd = {"app": make_app(a.kind, model, optim, world, rank), "extra": placeholders(EXTRA),
              "step": PLACEHOLDER}
        return model, optim, sd

    if a.kind != "shard":
        import torch.distributed.checkpoint as dcp
        what = f"stock dcp.load of the ckptd checkpoint into {a.kind}"
        model, optim, sd = fresh()
        dcp.load(sd, checkpoint_id=a.ckptd_dir)
        check_model(a.kind, model, optim, expect, world, rank, what)
        done.append(what)
        if a.lean:
            if a.storage_reader:
                load_with_storage_reader(a, world, rank, expect, done)
            print(f"rank {rank}/{world}: checked: " + "; ".join(done), flush=True)
            return
        what = "stock dcp.load of the ckptd checkpoint into full plain tensors"
        req, flat = plain_request()
        dcp.load(req, checkpoint_id=a.ckptd_dir)
        check_plain(flat, expect, what)
        done.append(what)

    src = a.ckptd_dir if a.kind == "shard" else a.stock_dir
    src_name = "ckptd" if a.kind == "shard" else "stock dcp.save"
    what = f"ckptd.load of the {src_name} checkpoint into {a.kind}"
    model, optim, sd = fresh()
    nread = ckptd.load(sd, src)
    assert nread > 0, nread
    check_model(a.kind, model, optim, expect, world, rank, what)
    diff = strict_equal(sd["extra"], EXTRA, f"{what}: extra")
    assert diff is None, diff
    assert sd["step"] == DIST_STEPS and type(sd["step"]) is int, (what, sd["step"])
    done.append(what)

    what = f"ckptd.load of the {src_name} checkpoint into ckptd.Shard + full tensors"
    req, checks = alt_request(world, rank)
    ckptd.load(req, src)
    check_alt(checks, expect, what)
    done.append(what)
    if a.storage_reader:
        load_with_storage_reader(a, world, rank, expect, done)
    print(f"rank {rank}/{world}: checked: " + "; ".join(done), flush=True)


COMMANDS = {"save": do_save, "load": do_load}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cmd", choices=sorted(COMMANDS))
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--kind", choices=["dtensor", "fsdp2", "shard"], required=True)
    p.add_argument("--init", required=True, help="file:// rendezvous file (must not exist)")
    p.add_argument("--socket", default=None,
                   help="the daemon's socket (default: $CKPTD_SOCKET, else the default one)")
    # The directories may come from the environment (CKPTD_WORKER_CKPTD_DIR,
    # CKPTD_WORKER_STOCK_DIR, CKPTD_WORKER_REFS), as the socket does
    # (CKPTD_SOCKET): a launcher that starts each rank elsewhere (another
    # network namespace, another host) need not rebuild the command line.
    env = os.environ.get
    p.add_argument("--ckptd-dir", default=env("CKPTD_WORKER_CKPTD_DIR"),
                   required=env("CKPTD_WORKER_CKPTD_DIR") is None)
    p.add_argument("--stock-dir", default=env("CKPTD_WORKER_STOCK_DIR"),
                   required=env("CKPTD_WORKER_STOCK_DIR") is None)
    p.add_argument("--refs", default=env("CKPTD_WORKER_REFS"),
                   required=env("CKPTD_WORKER_REFS") is None)
    p.add_argument("--save-with", default="ckptd",
                   choices=["ckptd", "ckptd-cluster", "dcp-writer-save", "dcp-writer-async",
                            "dcp-writer-process", "dcp-writer-background"],
                   help="save: ckptd.save, or dcp.save / dcp.async_save through "
                        "ckptd.StorageWriter")
    p.add_argument("--compression", default=None,
                   help="dcp-writer-*: StorageWriter(compression=...), e.g. zstd")
    p.add_argument("--lean", action="store_true",
                   help="save: no stock dcp.save into B; load: only stock dcp.load of A "
                        "(and, --storage-reader, ckptd.StorageReader of A)")
    p.add_argument("--storage-reader", action="store_true",
                   help="load: also dcp.load with ckptd.StorageReader of A and B")
    a = p.parse_args(argv)
    t0 = time.monotonic()
    # run_job sends SIGUSR1 to a rank it is about to kill: its stacks go to
    # its log, so that a hang names where it waited.
    import faulthandler
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    setup_ckptd_import()
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{a.init}", rank=a.rank,
                            world_size=a.world, timeout=datetime.timedelta(seconds=120))
    t_init = time.monotonic() - t0
    rc = 0
    try:
        assert dist.get_rank() == a.rank and dist.get_world_size() == a.world
        COMMANDS[a.cmd](a, a.world, a.rank)
        dist.barrier()
        print(f"OK {a.cmd} {a.kind} rank {a.rank}/{a.world} (process group after {t_init:.1f} s, "
              f"done after {time.monotonic() - t0:.1f} s)", flush=True)
    except Unsupported as e:
        print(f"SKIP: {e}", flush=True)
        rc = SKIP_EXIT
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass
    return rc


# ---------------------------------------------------------------------------
# Running a job (from the test process)

def run_job(cmd, world, kind, *, socket=None, ckptd_dir, stock_dir, refs, workdir, timeout=None,
            save_with="ckptd", storage_reader=False, sockets=None, compression=None,
            lean=False):
    """Runs `world` worker processes of `cmd` and waits for them. Returns
    (outputs, skip_reason): skip_reason is set when a rank reported SKIP and
    no rank failed on its own. Raises AssertionError with every rank's
    output when one fails (the others are killed 20 s later, so that a rank
    blocked in a collective does not wait for the gloo timeout). A rank
    still running at the end is asked for its stacks (SIGUSR1) first.
    timeout: seconds, default $CKPTD_DIST_JOB_TIMEOUT or 300. sockets: one
    daemon socket per rank, given as its $CKPTD_SOCKET (no --socket): the
    ranks of several nodes' daemons."""
    if timeout is None:
        timeout = float(os.environ.get("CKPTD_DIST_JOB_TIMEOUT", "300"))
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    pathlib.Path(refs).mkdir(parents=True, exist_ok=True)
    tag = f"{cmd}-{kind}-w{world}-{uuid.uuid4().hex[:8]}"
    init = workdir / f"init-{tag}"
    env = child_env()
    procs, logs = [], []
    for r in range(world):
        log = workdir / f"{tag}-rank{r}.log"
        logs.append(log)
        rank_env = dict(env)
        sock_args = ["--socket", str(socket)] if socket is not None else []
        if sockets is not None:
            rank_env["CKPTD_SOCKET"] = str(sockets[r])
            sock_args = []
        with open(log, "wb") as f:
            procs.append(subprocess.Popen(
                [sys.executable, str(pathlib.Path(__file__).resolve()), cmd, "--rank", str(r),
                 "--world", str(world), "--kind", kind, "--init", str(init)] + sock_args +
                ["--ckptd-dir", str(ckptd_dir), "--stock-dir", str(stock_dir), "--refs", str(refs),
                 "--save-with", save_with] + (["--storage-reader"] if storage_reader else []) +
                (["--compression", compression] if compression else []) +
                (["--lean"] if lean else []),
                env=rank_env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
    deadline = time.monotonic() + timeout
    first_exit = None
    killed = set()
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if first_exit is None and any(p.poll() not in (None, 0) for p in procs):
            first_exit = now
        if now > deadline or (first_exit is not None and now - first_exit > 20):
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGUSR1)
            time.sleep(1)
            for i, p in enumerate(procs):
                if p.poll() is None:
                    p.kill()
                    killed.add(i)
            for p in procs:
                p.wait()
            break
        time.sleep(0.05)
    outs = [log.read_text(errors="replace") for log in logs]
    codes = [p.returncode for p in procs]
    skipped = [i for i, c in enumerate(codes) if c == SKIP_EXIT]
    failed = [i for i, c in enumerate(codes) if c not in (0, SKIP_EXIT) and i not in killed]
    if skipped and not failed:
        reason = next(ln[len("SKIP: "):] for ln in outs[skipped[0]].splitlines()
                      if ln.startswith("SKIP: "))
        return outs, reason
    if failed or killed:
        report = "\n".join(f"--- rank {i} (exit {c}{', killed' if i in killed else ''}) ---\n{o}"
                           for i, (c, o) in enumerate(zip(codes, outs)))
        raise AssertionError(f"{cmd} {kind} on {world} ranks failed:\n{report}")
    for r, o in enumerate(outs):
        assert f"OK {cmd} {kind} rank {r}/{world}" in o, o
    return outs, None


if __name__ == "__main__":
    sys.exit(main())
