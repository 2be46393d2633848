"""save / async_save: handing this rank's state dict to the node's daemon;
reserve / arena_bytes: its shared-memory arena ahead of the first save.

Nothing here plans, writes or talks to other ranks: state_dict → Stateful
values replaced by their state_dict() (top level, as DCP does) → flattened
the DCP 2.4+ way (_flatten.py) → one ckptd_item per tensor chunk (pointing
at the tensor's memory, or named by a CUDA IPC handle: _cuda.py) or per
other value (its torch.save bytes) → ckptd_save (the C++ client copies into
the daemon's shared memory and returns once the daemon has staged the rank)
→ an AsyncSaveHandle (_handle.py) that waits for the commit.
"""
import ctypes
import functools
import io
import json
import logging
import math
import os
import time
import weakref

import torch

from . import _arena, _cuda, _native
from ._connection import client
from ._flatten import flatten, is_stateful
from ._handle import AsyncSaveHandle
from ._tensors import check_savable, chunks_of, dtype_from_name, dtype_name, host_view, is_cuda
from ._types import SaveStats
from .cluster import Cluster
from .errors import InvalidArgument

log = logging.getLogger("ckptd")


def _rank_and_world(rank, world_size, process_group):
    if rank is not None and world_size is not None:
        return int(rank), int(world_size)
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        r = dist.get_rank(process_group) if rank is None else rank
        w = dist.get_world_size(process_group) if world_size is None else world_size
        if r < 0:
            raise InvalidArgument("this process is not a member of the process group")
        return int(r), int(w)
    return (0 if rank is None else int(rank)), (1 if world_size is None else int(world_size))


def _shallow_state(state_dict):
    if not hasattr(state_dict, "items"):
        raise TypeError(f"state_dict must be a mapping, not {type(state_dict).__name__}")
    return {k: (v.state_dict() if is_stateful(v) else v) for k, v in state_dict.items()}


def _cuda_plan(cl):
    """The CUDA IPC plan of one save (None when this torch has no CUDA)."""
    if not torch.cuda.is_available():
        return None
    return _cuda.SavePlan(_native, _native.library_api_version(), cl.info())


def _snapshot_copy(t):
    """A contiguous, conj/neg-resolved copy of t on its own device."""
    out = torch.empty(tuple(t.shape), dtype=t.dtype, device=t.device)
    with torch.no_grad():
        out.copy_(t.detach())
    return out


class Pickled:
    """A value already torch.save'd (DCP's BytesIO from resolve_data): its
    bytes are the item, as they are."""
    __slots__ = ("data",)

    def __init__(self, data):
        self.data = bytes(data)


def _items_for(leaves, plan=None, transform=None):
    """ckptd_items for the flattened leaves, the objects that must stay
    alive until the native call returns, and the CUDA sources parallel to
    the items (None: a host item). CUDA chunks go through `plan` (an
    _cuda.SavePlan) when it can describe them, else the host path.
    `transform(t)` (device_snapshot) replaces each chunk's tensor first."""
    items, keep, sources = [], [], []
    for leaf in leaves:
        fqn = leaf.fqn.encode()
        path = json.dumps(list(leaf.path)).encode()
        keep += [fqn, path]
        chunks = chunks_of(leaf.value)
        if chunks is None:
            if isinstance(leaf.value, Pickled):
                data = leaf.value.data
            else:
                buf = io.BytesIO()
                torch.save(leaf.value, buf)
                data = buf.getvalue()
            keep.append(data)
            items.append(_native.Item(fqn=fqn, is_bytes=1, data=ctypes.cast(
                ctypes.c_char_p(data), ctypes.c_void_p), nbytes=len(data), path_json=path))
            sources.append(None)
            continue
        for ch in chunks:
            check_savable(ch.local, leaf.fqn)
            local = transform(ch.local) if transform is not None else ch.local
            described = None
            if plan is not None and is_cuda(local):
                described = plan.describe(local.detach(), leaf.fqn)
            shape = _native.int64_array(ch.global_shape)
            offs = _native.int64_array(ch.offsets)
            if described is not None:
                t, src = described
                keep += [t, src]
                sizes = _native.int64_array(t.shape)
                dt = dtype_name(t.dtype).encode()
                keep += [shape, offs, sizes, dt]
                # A CUDA item: data and strides are ignored (C-contiguous in
                # device memory); nbytes is checked against the shape.
                items.append(_native.Item(
                    fqn=fqn, is_bytes=0, ndim=t.dim(), dtype=dt, global_shape=shape,
                    chunk_offsets=offs, chunk_sizes=sizes, strides=None, data=None,
                    nbytes=t.numel() * t.element_size(), path_json=path))
                sources.append(src)
                continue
            t, _ = host_view(local, leaf.fqn, quiet=plan is not None and is_cuda(local))
            keep.append(t)
            nd = t.dim()
            sizes = _native.int64_array(t.shape)
            strides = _native.int64_array(t.stride())
            dt = dtype_name(t.dtype).encode()
            keep += [shape, offs, sizes, strides, dt]
            items.append(_native.Item(
                fqn=fqn, is_bytes=0, ndim=nd, dtype=dt, global_shape=shape,
                chunk_offsets=offs, chunk_sizes=sizes, strides=strides,
                data=t.data_ptr() if t.numel() else None, nbytes=0, path_json=path))
            sources.append(None)
    return items, keep, sources


@functools.lru_cache(maxsize=None)
def _element_size(name):
    return torch.empty((), dtype=dtype_from_name(name.decode())).element_size()


def _host_span(items, sources):
    """The arena bytes of a save's host items (_arena.spans of the items)."""
    total = 0
    for it, src in zip(items, sources):
        if src is not None:
            continue
        n = it.nbytes if it.is_bytes else \
            _element_size(it.dtype) * math.prod(it.chunk_sizes[k] for k in range(it.ndim))
        total += _arena.padded(n)
    return total


_hinted = weakref.WeakKeyDictionary()  # native client -> the hints it gave


def _note_arena(cl, rank, items, sources):
    """Logs (at INFO, once per connection for creating and once for
    growing) that this save makes the rank's arena on its critical path,
    and what avoids that."""
    try:
        before, after = _arena.note(cl, _host_span(items, sources))
    except Exception:  # noqa: BLE001  (a hint; the save reports its own errors)
        return
    kind = "creates" if before == 0 else "grows"
    given = _hinted.setdefault(cl, set())
    if after == before or kind in given:
        return
    given.add(kind)
    log.info("ckptd: this save of rank %d %s its shared-memory arena (%.0f MiB) on its "
             "critical path, about 1 s per GiB; ckptd.reserve(state_dict) before it avoids "
             "that (CheckpointManager reserves in the background by itself)",
             rank, kind, after / (1 << 20))


def _cuda_bytes_by_device(leaves):
    """{device ordinal: bytes} of the CUDA chunks of the leaves."""
    out = {}
    for leaf in leaves:
        for ch in chunks_of(leaf.value) or ():
            t = ch.local
            if is_cuda(t):
                idx = t.device.index if t.device.index is not None else \
                    torch.cuda.current_device()
                out[idx] = out.get(idx, 0) + t.numel() * t.element_size()
    return out


def snapshot_decision(plan, need_by_device, free_by_device):
    """(take the device snapshot?, reason if not) for device_snapshot=True:
    the CUDA IPC path must be usable (the clones are handed over through
    it) on every GPU involved, and the clones must fit in each GPU's free
    memory with a margin (_cuda.snapshot_fits). Pure given its inputs:
    free_by_device maps ordinal -> bytes available for the clones."""
    if plan is None:
        return False, "device_snapshot needs CUDA (torch.cuda.is_available() is False)"
    if not need_by_device:
        return False, "device_snapshot: the state dict has no CUDA tensors"
    if not plan.usable:
        return False, f"device_snapshot needs the CUDA IPC path: {plan.reason}"
    for dev, need in sorted(need_by_device.items()):
        why = plan.device_ok(dev)
        if why is not None:
            return False, f"device_snapshot needs the CUDA IPC path: {why}"
        ok, why = _cuda.snapshot_fits(free_by_device.get(dev, 0), need)
        if not ok:
            return False, f"GPU {dev}: {why}"
    return True, None


def _free_for_snapshot(devices):
    """{ordinal: bytes the clones may use}: the GPU's free memory plus what
    torch's caching allocator holds reserved but unused."""
    out = {}
    for dev in devices:
        free, _ = torch.cuda.mem_get_info(dev)
        cached = torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
        out[dev] = int(free) + max(0, int(cached))
    return out


def _snapshot_transform(plan, leaves):
    """(_snapshot_copy, None) when device_snapshot can be taken for the
    leaves, else (None, why) with the reason logged."""
    need = _cuda_bytes_by_device(leaves) if plan is not None else {}
    free = _free_for_snapshot(need) if need and plan.usable else {}
    take, why = snapshot_decision(plan, need, free)
    if take:
        return _snapshot_copy, None
    log.warning("ckptd: device_snapshot falls back to the normal mode: %s", why)
    return None, why


def async_save(state_dict, checkpoint_id, *, job=None, process_group=None, rank=None,
               world_size=None, overwrite=False, dedup_save_to_lowest_rank=False,
               keep_last_n=0, socket=None, background_staging=False, cluster=None,
               device_snapshot=False, external_metadata=False, metadata_timeout=None,
               leaves=None, keep_every=0, compression=None):
    """Hands this rank's part of `state_dict` to the node's daemon and
    returns once the daemon has staged it: the tensors may be modified as
    soon as this returns.

    CUDA tensors: when the daemon offers the GPU path (its info's
    cuda_ipc, listing the tensor's GPU) they are handed over as CUDA IPC
    handles and the daemon copies them device-to-host itself on its own
    streams into its pinned pool; "staged" then means those copies are
    done. Before the call the current stream of each GPU involved is
    synchronized (tensors written on other streams must be synchronized by
    the caller). Non-contiguous, conjugate or negative-bit tensors are made
    contiguous on the device first (a temporary GPU copy, freed once
    staged). Otherwise (allocations legacy IPC cannot share, such as
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; a daemon without a
    GPU; CKPTD_CUDA_IPC=0) they are copied to host memory by the client, the
    reason logged once. stats.ipc_items / cuda_host_items tell which.

    device_snapshot=True (fast stall): the CUDA tensors are first cloned on
    their GPU (device-to-device into spare GPU memory; CPU tensors are
    cloned in host memory), the clones are synchronized, and async_save
    returns at once: the stall is the D2D copy time, and the tensors may be
    modified right away. The clones are handed to the daemon through CUDA
    IPC on a background thread and freed once the daemon has staged them
    (handle.wait_staged() / staged() tell when; staging errors surface
    there and in result()). It needs free GPU memory for the clones
    (torch.cuda.mem_get_info plus torch's unused cache, with a margin of
    max(512 MiB, 5%)) and the CUDA IPC path; without either it falls back to
    the normal mode, logging why (stats.device_snapshot is then False and
    stats.cuda_fallback holds the reason).

    background_staging=True returns at once instead (non-tensor values are
    already pickled then) and copies the tensors into shared memory on a
    native thread while training goes on: the caller must not modify them
    until handle.staged() / handle.wait_staged() — e.g. call async_save after
    optimizer.step() and wait_staged() before the next one, so the copy
    overlaps forward and backward (DCP 2.9's async staging contract). Returns an AsyncSaveHandle (result() waits for the
    commit). No collective is used; every rank of the checkpoint (rank and
    world size from `process_group` / the default group when initialised)
    must call it with the same checkpoint_id.

    checkpoint_id: a directory, absolute or relative to the daemon's first
    checkpoint root. keep_last_n > 0: after this checkpoint commits the
    daemon deletes all but the newest keep_last_n committed checkpoints of
    the same `job` (default job: the checkpoint's parent directory);
    keep_every > 0 also keeps those whose directory name ends with a step
    that is a multiple of it ("step_1200"; Orbax's keep_period).
    compression: None, "zstd" or "zstd:N" (N in 1..19): each payload is
    zstd-compressed by the daemon, as FileSystemWriter(_extensions=
    [ZStandard()]) writes them (stock dcp.load of torch >= 2.7 and every
    ckptd reader read them); across nodes too (every node the same).

    cluster: for a checkpoint whose ranks save through the daemons of
    several nodes, this node's ckptd.Cluster (see ckptd.discover_cluster,
    which CheckpointManager calls by itself); None: every rank saves
    through one daemon. Checked before anything is sent (the rank must be
    in cluster.local_ranks, all in [0, world_size)).

    external_metadata, metadata_timeout and leaves are ckptd.StorageWriter's
    (DCP's coordinator hands the daemon the .metadata; `leaves`: the items,
    already flattened, instead of state_dict's)."""
    t0 = time.perf_counter()
    if cluster is not None and not isinstance(cluster, Cluster):
        raise TypeError(f"cluster must be a ckptd.Cluster or None, not {type(cluster).__name__}")
    r, w = _rank_and_world(rank, world_size, process_group)
    if leaves is None:
        leaves = flatten(_shallow_state(state_dict))
    cl = client(socket, r)
    plan = _cuda_plan(cl)
    extra = {}
    transform = None
    snap_seconds = 0.0
    if device_snapshot:
        transform, why = _snapshot_transform(plan, leaves)
        if transform is None:
            extra["cuda_fallback"] = why
    ts = time.perf_counter()
    items, keep, sources = _items_for(leaves, plan, transform)
    if transform is not None:
        # The clones (and any contiguous copies) are complete before the
        # caller may touch its tensors again.
        for dev in sorted(_cuda_bytes_by_device(leaves)):
            torch.cuda.current_stream(dev).synchronize()
        snap_seconds = time.perf_counter() - ts
    elif plan is not None:
        plan.synchronize()
    _note_arena(cl, r, items, sources)
    if (keep_every or compression) and \
            _native.library_api_version() < _native.WRITER_API_VERSION:
        raise InvalidArgument(f"keep_every and compression need libckptd_client.so of C API "
                              f"version {_native.WRITER_API_VERSION} or newer")
    opts = _native.save_options(overwrite, dedup_save_to_lowest_rank, keep_last_n, cluster,
                                external_metadata, metadata_timeout, keep_every, compression)
    if any(src is not None for src in sources):
        opts.cuda_sources = _native.cuda_sources_array(sources)
    if plan is not None:
        reasons = "; ".join(plan.fallback_reasons)
        extra.update(ipc_items=plan.ipc_items, ipc_bytes=plan.ipc_bytes,
                     ipc_allocations=plan.allocations, cuda_host_items=plan.host_items,
                     cuda_fallback="; ".join(x for x in (extra.get("cuda_fallback"), reasons)
                                             if x))
    extra.update(device_snapshot=transform is not None, snapshot_seconds=snap_seconds)
    cid = os.fspath(checkpoint_id)
    if background_staging or transform is not None:
        handle = AsyncSaveHandle(cl, None, r, w, None)
        # `keep` (tensor references, GPU clones, pickled bytes, CUDA
        # sources) lives in the closure until the native save returns, i.e.
        # until the daemon has staged the rank; then the clones are freed.
        handle._stage_in_background(
            lambda keep=keep, opts=opts: cl.save(cid, job, r, w, items, opts), t0,
            time.perf_counter() - t0, len(items), extra)
        del keep
        return handle
    resolved, st = cl.save(cid, job, r, w, items, opts)
    del keep
    elapsed = time.perf_counter() - t0
    stats = SaveStats(stall_seconds=elapsed, copy_seconds=st.copy_seconds, bytes=st.bytes,
                      batches=st.batches, items=len(items), staging_seconds=elapsed, **extra)
    return AsyncSaveHandle(cl, resolved, r, w, stats)


def save(state_dict, checkpoint_id, *, timeout=None, **kwargs):
    """async_save, then waits for the commit; returns the final
    CheckpointStatus or raises CheckpointFailed with the daemon's error.
    Takes the same keyword arguments as async_save."""
    return async_save(state_dict, checkpoint_id, **kwargs).result(timeout)


def rank_of(rank, process_group):
    """This process's rank as save sees it (see async_save)."""
    return _rank_and_world(rank, None, process_group)[0]


def arena_spans(state_dict):
    """(host, CUDA) arena bytes of a save of state_dict (_arena.spans)."""
    return _arena.spans(flatten(_shallow_state(state_dict)))


def client_span(cl, spans):
    """The host bytes of (host, CUDA) spans on connection `cl`: CUDA bytes
    count when the daemon takes no CUDA IPC (the client copies them to host
    memory, into the arena)."""
    host, cuda = spans
    if cuda and not (torch.cuda.is_available() and cl.info()["cuda_ipc"]):
        host += cuda
    return host


def arena_bytes(state_dict, socket=None, *, rank=None, process_group=None):
    """The bytes a save of `state_dict` by this rank puts in its shared-memory
    arena: every CPU tensor chunk and pickled value, each padded as the
    native client pads it, and the CUDA chunks unless the daemon stages them
    through CUDA IPC (then asked of the daemon; nothing else is). What
    ckptd.reserve(state_dict) reserves."""
    spans = arena_spans(state_dict)
    if not spans[1]:
        return spans[0]
    return client_span(client(socket, rank_of(rank, process_group)), spans)


def reserve(nbytes, socket=None, *, rank=None, process_group=None):
    """Creates this rank's shared-memory arena now, for saves of up to
    `nbytes` bytes (an int, or a state dict: its ckptd.arena_bytes), so
    that the first save does not pay for it (about 1 s per GiB: memfd,
    fallocate, pre-fault, register with the daemon; the connection too if
    this process has none yet). Call it before the training loop, or after
    the first step once the optimizer state exists (Adam's is created by
    its first step); a save larger than the arena still replaces it with a
    large enough one, on its critical path. An arena at least that large
    is kept. The arena belongs to the connection of `rank` (default: the
    process group's rank, as save uses), so reserve from the process that
    saves, with the same socket. Returns the bytes reserved for."""
    state = nbytes if hasattr(nbytes, "items") else None
    if state is None and int(nbytes) < 0:
        raise InvalidArgument(f"reserve: nbytes must be >= 0, not {nbytes}")
    cl = client(socket, rank_of(rank, process_group))
    nbytes = client_span(cl, arena_spans(state)) if state is not None else int(nbytes)
    if nbytes > 0:
        cl.reserve(nbytes)
        _arena.note(cl, nbytes)
    return nbytes
