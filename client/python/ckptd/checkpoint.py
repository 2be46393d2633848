"""save / async_save / load: the torch.distributed.checkpoint-like API.

Save path (nothing here plans, writes or talks to other ranks):
  state_dict → Stateful values replaced by their state_dict() (top level, as
  DCP does) → flattened the DCP 2.4+ way (_flatten.py) → one ckptd_item per
  tensor chunk (pointing at the tensor's memory) or per other value (its
  torch.save bytes) → ckptd_save (the C++ client copies into the daemon's
  shared memory and returns once the daemon has staged the rank).
Load path (no daemon needed): .metadata → the caller's flattened state dict
  → one read request per destination chunk (resharding in the C++ reader,
  multi-threaded, straight into the tensors' memory when layouts allow) →
  bytes items torch.load'ed and put in place → Stateful.load_state_dict.
"""
import ctypes
import dataclasses
import io
import json
import logging
import os
import threading
import time

import torch

from . import _cuda, _native, _safe_pickle
from ._flatten import flatten
from ._tensors import check_savable, chunks_of, dtype_from_name, dtype_name, host_view
from .cluster import Cluster
from .errors import (CheckpointFailed, DaemonUnavailable, DeadlineExceeded, InvalidArgument,
                     NotFound)

log = logging.getLogger("ckptd")

FINAL_STATES = ("COMMITTED", "FAILED", "CANCELLED")


# -- connection ---------------------------------------------------------------

def default_socket():
    return os.environ.get("CKPTD_SOCKET") or "/run/ckptd/ckptd.sock"


def _default_copy_threads():
    env = os.environ.get("CKPTD_COPY_THREADS")
    if env:
        return max(1, int(env))
    return max(1, min(4, os.cpu_count() or 1))


_clients = {}
_clients_lock = threading.Lock()


def _forget_clients_after_fork():
    # The child must not use (nor close) its parent's gRPC connection.
    _clients.clear()


os.register_at_fork(after_in_child=_forget_clients_after_fork)


def client(socket=None, rank=0):
    """The process's connection to the daemon at `socket` (default
    $CKPTD_SOCKET, else /run/ckptd/ckptd.sock) for `rank`, made on first use
    and reused (with its shared-memory arena) by later calls. A process
    normally saves one rank; one that saves several (tests, single-process
    emulation) gets a connection and arena per rank, since a staged rank's
    bytes stay in its arena until the daemon has written them."""
    path = os.fspath(socket) if socket is not None else default_socket()
    key = (path, int(rank))
    with _clients_lock:
        c = _clients.get(key)
        if c is None or c.pid != os.getpid():
            c = _native.Client(path, _default_copy_threads(),
                               owner=f"python pid {os.getpid()} rank {rank}")
            _clients[key] = c
        return c


def close_clients():
    """Closes every cached connection (releasing their arenas)."""
    with _clients_lock:
        for c in _clients.values():
            c.close()
        _clients.clear()


def _rank_and_world(rank, world_size, process_group):
    if rank is not None and world_size is not None:
        return int(rank), int(world_size)
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        r = dist.get_rank(process_group) if rank is None else rank
        w = dist.get_world_size(process_group) if world_size is None else world_size
        if r < 0:
            raise InvalidArgument(3, "this process is not a member of the process group")
        return int(r), int(w)
    return (0 if rank is None else int(rank)), (1 if world_size is None else int(world_size))


def is_stateful(value):
    """DCP's Stateful protocol: anything with state_dict and load_state_dict."""
    return (not isinstance(value, torch.Tensor) and callable(getattr(value, "state_dict", None))
            and callable(getattr(value, "load_state_dict", None)))


# -- status -------------------------------------------------------------------

@dataclasses.dataclass
class CheckpointStatus:
    """A checkpoint as the daemon reports it."""
    checkpoint_id: str = ""
    job: str = ""
    state: str = ""
    world_size: int = 0
    ranks_staged: int = 0
    total_bytes: int = 0
    staged_bytes: int = 0
    written_bytes: int = 0
    file_bytes: int = 0
    items: int = 0
    files: int = 0
    error: str = ""
    error_code: int = 0
    created_unix_ms: int = 0
    staged_unix_ms: int = 0
    finished_unix_ms: int = 0
    # Multi-node checkpoints (num_nodes > 1): the byte counts and
    # ranks_staged above are then global (as of this node's last contact with
    # the coordinator), local_* this node's.
    num_nodes: int = 1             # 1 (or 0 from an older daemon): single node
    coordinator: str = ""          # peer address; empty on the coordinator
    is_coordinator: bool = False
    nodes_planned: int = 0
    nodes_prepared: int = 0        # data durable on their node
    local_ranks: int = 0           # ranks of the checkpoint on this node (a count)
    local_total_bytes: int = 0
    local_written_bytes: int = 0

    @classmethod
    def from_json(cls, d):
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @property
    def final(self):
        return self.state in FINAL_STATES

    @property
    def progress(self):
        """Fraction of the data files written, 0.0 .. 1.0."""
        if self.state == "COMMITTED":
            return 1.0
        total = self.file_bytes or self.total_bytes
        return min(1.0, self.written_bytes / total) if total else 0.0


@dataclasses.dataclass
class SaveStats:
    """What a save cost the calling rank."""
    stall_seconds: float   # the async_save call: flatten (+ copy + staging unless background)
    copy_seconds: float    # copying into shared memory (native, GIL released)
    bytes: int             # data bytes of this rank
    batches: int           # Save RPCs (> 1: streamed through the arena)
    items: int
    staging_seconds: float = 0.0  # async_save start -> the daemon staged the rank
    # The GPU path (see docs/gpu.md): CUDA chunks handed to the daemon
    # through CUDA IPC (the daemon copied them D2H itself), their bytes and
    # the distinct allocations (IPC handles) named; CUDA chunks that took the
    # client's host path instead, and why.
    ipc_items: int = 0
    ipc_bytes: int = 0
    ipc_allocations: int = 0
    cuda_host_items: int = 0
    cuda_fallback: str = ""
    # device_snapshot=True: whether the snapshot was taken (False: fell back
    # to the normal mode, reason in cuda_fallback) and its GPU clone time.
    device_snapshot: bool = False
    snapshot_seconds: float = 0.0


def status(checkpoint_id, socket=None):
    return CheckpointStatus.from_json(client(socket).status(os.fspath(checkpoint_id)))


def list_checkpoints(job=None, include_disk=False, socket=None):
    return [CheckpointStatus.from_json(d)
            for d in client(socket).list(job, include_disk)]


def cancel(checkpoint_id, reason=None, socket=None):
    client(socket).cancel(os.fspath(checkpoint_id), reason)


# A wait without a timeout is made of Wait calls of this many seconds
# (docs/waits.md). The daemon answers each one when it ends (DEADLINE_EXCEEDED
# if the checkpoint is not final yet); the native client gives a call
# 10 s more before it gives up on its own, so a call that comes back
# _NO_ANSWER_S or more after its end got no answer: the daemon is hung or
# stopped, and the wait ends instead of issuing calls forever.
_WAIT_SLICE_S = 30.0
_NO_ANSWER_S = 5.0


def _wait_answered(cl, checkpoint_id, timeout):
    """cl.wait(checkpoint_id, timeout); with timeout None, in slices, raising
    DeadlineExceeded naming the checkpoint once the daemon stops answering."""
    if timeout is not None:
        return cl.wait(checkpoint_id, timeout)  # one deadline: timeout + the client's slack
    while True:
        t0 = time.monotonic()
        try:
            return cl.wait(checkpoint_id, _WAIT_SLICE_S)
        except DeadlineExceeded as e:
            took = time.monotonic() - t0
            if took >= _WAIT_SLICE_S + _NO_ANSWER_S:
                raise DeadlineExceeded(
                    4, f"the ckptd daemon stopped answering while waiting for checkpoint "
                       f"{checkpoint_id}: a {_WAIT_SLICE_S:g}s Wait call got no reply in "
                       f"{took:.0f}s (is the daemon hung or stopped?): {e}") from None


class AsyncSaveHandle:
    """The result of async_save. The rank's data is already staged (the
    caller may change its tensors); the daemon writes and commits in the
    background."""

    def __init__(self, cl, checkpoint_id, rank, world_size, stats):
        self._client = cl
        self._checkpoint_id = checkpoint_id
        self.rank = rank
        self.world_size = world_size
        self._stats = stats
        self._final = None
        self._lock = threading.Lock()
        self._callbacks = []
        self._watcher = None
        self._staged = threading.Event()
        self._staging_error = None
        if checkpoint_id is not None:
            self._staged.set()

    def _stage_in_background(self, save, t0, stall, nitems, extra=None):
        def run():
            try:
                resolved, st = save()
                self._checkpoint_id = resolved
                self._stats = SaveStats(stall_seconds=stall, copy_seconds=st.copy_seconds,
                                        bytes=st.bytes, batches=st.batches, items=nitems,
                                        staging_seconds=time.perf_counter() - t0,
                                        **(extra or {}))
            except BaseException as e:  # noqa: BLE001  (re-raised by wait_staged)
                self._staging_error = e
            finally:
                self._staged.set()

        threading.Thread(target=run, name="ckptd-stage", daemon=True).start()

    @property
    def checkpoint_id(self):
        """The absolute checkpoint directory (waits for background staging)."""
        self.wait_staged()
        return self._checkpoint_id

    @property
    def stats(self):
        self.wait_staged()
        return self._stats

    def staged(self):
        """Whether the daemon has staged this rank, i.e. the tensors may be
        modified. Always true unless background_staging was asked for."""
        return self._staged.is_set() and self._staging_error is None

    def wait_staged(self, timeout=None):
        """Blocks until this rank is staged; raises the staging error (the
        daemon's) if it failed, DeadlineExceeded after `timeout` seconds."""
        if not self._staged.wait(timeout):
            raise DeadlineExceeded(4, f"rank {self.rank} not staged within {timeout}s")
        if self._staging_error is not None:
            raise self._staging_error

    def status(self):
        if self._final is not None:
            return self._final
        st = CheckpointStatus.from_json(self._client.status(self.checkpoint_id))
        if st.final:
            self._set_final(st)
        return st

    def progress(self):
        return self.status().progress

    def done(self):
        return self.status().final

    def wait(self, timeout=None):
        """The final status (COMMITTED, FAILED or CANCELLED), without
        raising on failure. DeadlineExceeded when `timeout` seconds pass."""
        if self._final is None:
            st = CheckpointStatus.from_json(_wait_answered(self._client, self.checkpoint_id,
                                                           timeout))
            self._set_final(st)
        return self._final

    def result(self, timeout=None):
        """Blocks until the checkpoint is final; returns its status if it
        COMMITTED, else raises CheckpointFailed with the daemon's error."""
        st = self.wait(timeout)
        if st.state != "COMMITTED":
            raise CheckpointFailed(st.error_code or 2,
                                   f"checkpoint {st.checkpoint_id} {st.state}: {st.error}", st)
        return st

    def exception(self, timeout=None):
        try:
            self.result(timeout)
            return None
        except CheckpointFailed as e:
            return e

    def cancel(self, reason=None):
        self._client.cancel(self.checkpoint_id, reason)

    def add_done_callback(self, fn):
        """Calls fn(handle) once the checkpoint is final (from a helper
        thread, or at once if it already is)."""
        with self._lock:
            if self._final is None:
                self._callbacks.append(fn)
                if self._watcher is None:
                    self._watcher = threading.Thread(target=self._watch, daemon=True,
                                                     name="ckptd-watch")
                    self._watcher.start()
                return
        fn(self)

    def _watch(self):
        try:
            self.wait()
        except Exception as e:  # daemon gone: report it as the result
            log.error("ckptd: waiting for %s failed: %s", self._checkpoint_id, e)
            self._set_final(CheckpointStatus(checkpoint_id=self._checkpoint_id or "",
                                             state="FAILED",
                                             error=str(e), error_code=getattr(e, "code", 14)))

    def _set_final(self, st):
        with self._lock:
            if self._final is not None:
                return
            self._final = st
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            try:
                fn(self)
            except Exception:
                log.exception("ckptd: done callback failed")

    def __repr__(self):
        st = self._final.state if self._final else (
            "in progress" if self._staged.is_set() else "staging")
        return f"<AsyncSaveHandle {self._checkpoint_id} rank {self.rank}: {st}>"


# -- save ---------------------------------------------------------------------

def _shallow_state(state_dict):
    if not hasattr(state_dict, "items"):
        raise TypeError(f"state_dict must be a mapping, not {type(state_dict).__name__}")
    return {k: (v.state_dict() if is_stateful(v) else v) for k, v in state_dict.items()}


def _is_cuda(t):
    return isinstance(t, torch.Tensor) and t.device.type == "cuda"


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
            if plan is not None and _is_cuda(local):
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
            t, _ = host_view(local, leaf.fqn, quiet=plan is not None and _is_cuda(local))
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


def _cuda_bytes_by_device(leaves):
    """{device ordinal: bytes} of the CUDA chunks of the leaves."""
    out = {}
    for leaf in leaves:
        for ch in chunks_of(leaf.value) or ():
            t = ch.local
            if _is_cuda(t):
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


def async_save(state_dict, checkpoint_id, *, job=None, process_group=None, rank=None,
               world_size=None, overwrite=False, dedup_save_to_lowest_rank=False,
               keep_last_n=0, socket=None, background_staging=False, cluster=None,
               device_snapshot=False):
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
    the same `job` (default job: the checkpoint's parent directory).

    cluster: for a checkpoint whose ranks save through the daemons of
    several nodes, this node's ckptd.Cluster (see ckptd.discover_cluster,
    which CheckpointManager calls by itself); None: every rank saves
    through one daemon. Checked before anything is sent (the rank must be
    in cluster.local_ranks, all in [0, world_size))."""
    t0 = time.perf_counter()
    if cluster is not None and not isinstance(cluster, Cluster):
        raise TypeError(f"cluster must be a ckptd.Cluster or None, not {type(cluster).__name__}")
    r, w = _rank_and_world(rank, world_size, process_group)
    leaves = flatten(_shallow_state(state_dict))
    cl = client(socket, r)
    plan = _cuda_plan(cl)
    extra = {}
    transform = None
    snap_seconds = 0.0
    if device_snapshot:
        need = _cuda_bytes_by_device(leaves) if plan is not None else {}
        free = _free_for_snapshot(need) if need and plan.usable else {}
        take, why = snapshot_decision(plan, need, free)
        if take:
            transform = _snapshot_copy
        else:
            log.warning("ckptd: device_snapshot falls back to the normal mode: %s", why)
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
    opts = _native.save_options(overwrite, dedup_save_to_lowest_rank, keep_last_n, cluster)
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


# -- load ---------------------------------------------------------------------

def resolve_checkpoint_dir(checkpoint_id, socket=None):
    """An absolute checkpoint directory: absolute ids as they are; relative
    ones against the daemon's first checkpoint root (as save resolves them),
    or the current directory when no daemon answers."""
    p = os.fspath(checkpoint_id)
    if os.path.isabs(p):
        return p
    try:
        roots = client(socket).info().get("checkpoint_roots") or []
    except DaemonUnavailable:
        roots = []
    return os.path.join(roots[0], p) if roots else os.path.abspath(p)


class _Pending:
    """Read requests and the work to do after the native read."""

    def __init__(self, bounce=False):
        self.requests = []
        self.keep = []
        self.copies = []   # (destination chunk, temporary filled by the read)
        self.bounce = bounce
        self.device_pieces = []  # CUDA destinations restored through pinned buffers

    def add(self, fqn, entry, ch):
        saved_dtype = dtype_from_name(entry["dtype"])
        dest = ch.local
        if self.bounce and _is_cuda(dest):
            self.device_pieces.extend(_bounce_pieces(fqn, dest, tuple(ch.offsets), saved_dtype,
                                                     _bounce_half_bytes()))
            return
        direct = (dest.device.type == "cpu" and dest.layout == torch.strided
                  and dest.dtype == saved_dtype and not dest.is_conj() and not dest.is_neg())
        if direct:
            target = dest.detach()
        else:
            target = torch.empty(tuple(dest.shape), dtype=saved_dtype)
            self.copies.append((dest, target))
        name = fqn.encode()
        dt = dtype_name(saved_dtype).encode()
        offs = _native.int64_array(ch.offsets)
        sizes = _native.int64_array(target.shape)
        strides = _native.int64_array(target.stride())
        self.keep += [name, dt, offs, sizes, strides, target]
        self.requests.append(_native.ReadRequest(
            fqn=name, dtype=dt, ndim=target.dim(), offsets=offs, sizes=sizes, strides=strides,
            data=target.data_ptr() if target.numel() else None))


# -- restore H2D through pinned bounce buffers --------------------------------

BOUNCE_ENV = "CKPTD_LOAD_BOUNCE_BYTES"
DEFAULT_BOUNCE_HALF = 256 << 20
_ALIGN = 256


def _bounce_half_bytes():
    """Bytes of each of the two pinned bounce buffers of a CUDA restore
    ($CKPTD_LOAD_BOUNCE_BYTES is their sum; default 512 MiB)."""
    env = os.environ.get(BOUNCE_ENV)
    total = int(env) if env else 2 * DEFAULT_BOUNCE_HALF
    return max(_ALIGN, total // 2)


@dataclasses.dataclass
class _Piece:
    """Rows [r0, r1) of dim 0 of a destination (the whole of a 0-d one)
    read as a C-contiguous box of the saved dtype, then copied H2D."""
    fqn: str
    dest: object            # the destination view (dest.narrow(0, r0, r1 - r0))
    offsets: tuple          # global offsets of the box
    shape: tuple            # the box's sizes
    dtype: object           # saved dtype
    nbytes: int


def split_rows(shape, elsize, limit):
    """[(r0, r1)] covering dim 0 of `shape` in runs of at most `limit`
    bytes (at least one row each, so a run may exceed `limit` when one row
    does); [(0, 0)] for 0-d and empty tensors (one piece, nothing split)."""
    if len(shape) == 0:
        return [(0, 0)]
    rows = shape[0]
    row_bytes = elsize
    for d in shape[1:]:
        row_bytes *= d
    if rows == 0 or row_bytes == 0:
        return [(0, rows)]
    per = max(1, limit // row_bytes)
    return [(r, min(rows, r + per)) for r in range(0, rows, per)]


def _bounce_pieces(fqn, dest, offsets, saved_dtype, half):
    elsize = torch.empty((), dtype=saved_dtype).element_size()
    shape = tuple(dest.shape)
    out = []
    for r0, r1 in split_rows(shape, elsize, half):
        if not shape:
            view, box, offs = dest, (), offsets
        else:
            view = dest.narrow(0, r0, r1 - r0)
            box = (r1 - r0,) + shape[1:]
            offs = (offsets[0] + r0,) + tuple(offsets[1:])
        n = elsize
        for d in box:
            n *= d
        out.append(_Piece(fqn, view, offs, box, saved_dtype, n))
    return out


def pack_batches(sizes, half, align=_ALIGN):
    """Greedy packing of pieces (byte sizes, in order) into batches that
    fill one bounce buffer of `half` bytes: [[(index, offset)], ...]. A
    piece larger than `half` is a batch of its own at offset 0 (it gets a
    buffer of its own)."""
    batches, cur, used = [], [], 0
    for i, n in enumerate(sizes):
        if n > half:
            if cur:
                batches.append(cur)
                cur, used = [], 0
            batches.append([(i, 0)])
            continue
        off = (used + align - 1) // align * align
        if cur and off + n > half:
            batches.append(cur)
            cur, off = [], 0
        cur.append((i, off))
        used = off + n
    if cur:
        batches.append(cur)
    return batches


class _CudaBounce:
    """H2D through pinned host memory: copies on a side stream per device
    (non_blocking), fenced by events."""

    def __init__(self):
        self.streams = {}

    def alloc(self, nbytes):
        return torch.empty(int(nbytes), dtype=torch.uint8, pin_memory=True)

    def _stream(self, device):
        s = self.streams.get(device)
        if s is None:
            s = torch.cuda.Stream(device=device)
            # Earlier work on the destinations (their initialisation) first.
            s.wait_stream(torch.cuda.current_stream(device))
            self.streams[device] = s
        return s

    def copy(self, dest, src):
        with torch.cuda.stream(self._stream(dest.device)):
            dest.copy_(src, non_blocking=True)

    def fence(self):
        return [s.record_event() for s in self.streams.values()]

    def wait(self, fence):
        for e in fence:
            e.synchronize()

    def finish(self):
        for dev, s in self.streams.items():
            torch.cuda.current_stream(dev).wait_stream(s)
            s.synchronize()


def restore_through_bounce(reader, pieces, backend, half):
    """Reads `pieces` (see _Piece) into two alternating bounce buffers of
    `half` bytes (backend.alloc) and copies each batch to its destinations
    (backend.copy, asynchronous); before a buffer is refilled, the copies
    out of it are waited for (backend.fence / wait), so that the reads of
    batch i + 1 overlap the H2D copies of batch i. Returns the bytes read."""
    if not pieces:
        return 0
    batches = pack_batches([p.nbytes for p in pieces], half)
    need = max(max(off + pieces[i].nbytes for i, off in b) for b in batches)
    size = min(half, need)
    bufs, fences = [None, None], [None, None]
    nread = 0
    with torch.no_grad():
        for bi, batch in enumerate(batches):
            k = bi % 2
            if fences[k] is not None:
                backend.wait(fences[k])
                fences[k] = None
            first = pieces[batch[0][0]]
            if len(batch) == 1 and first.nbytes > size:
                buf = backend.alloc(first.nbytes)  # an oversized piece: its own buffer
            else:
                if bufs[k] is None:
                    bufs[k] = backend.alloc(size)
                buf = bufs[k]
            requests, keep, views = [], [], []
            for i, off in batch:
                p = pieces[i]
                staging = buf[off:off + p.nbytes].view(p.dtype).view(p.shape)
                name, dt = p.fqn.encode(), dtype_name(p.dtype).encode()
                offs, sizes = _native.int64_array(p.offsets), _native.int64_array(p.shape)
                keep += [name, dt, offs, sizes]
                requests.append(_native.ReadRequest(
                    fqn=name, dtype=dt, ndim=len(p.shape), offsets=offs, sizes=sizes,
                    strides=None, data=staging.data_ptr() if p.nbytes else None))
                views.append((p.dest, staging))
            nread += reader.read(requests)
            for dest, staging in views:
                backend.copy(dest, staging)
            fences[k] = backend.fence()
            if buf is not bufs[k]:
                backend.wait(fences[k])  # the oversized buffer is dropped now
                fences[k] = None
    backend.finish()
    return nread


def _use_bounce():
    return torch.cuda.is_available() and os.environ.get("CKPTD_LOAD_PINNED", "1") != "0"


def _torch_load_bytes(raw, fqn=None, weights_only=True):
    """A bytes item's object. weights_only (the default): through the
    restricted unpickler (_safe_pickle: allowlisted globals only, else
    UnsafeCheckpointError); False: full unpickling, as stock DCP does."""
    if weights_only:
        return _safe_pickle.torch_load_restricted(raw, fqn)
    bio = io.BytesIO(raw)
    try:
        return torch.load(bio, map_location="cpu", weights_only=False)
    except TypeError:  # torch without weights_only
        bio.seek(0)
        return torch.load(bio, map_location="cpu")


def _add_missing_optimizer_state(key, sub, entries, planner_data):
    """A freshly built optimizer has no per-parameter state yet, so its
    state_dict() offers nothing for the checkpoint's `state` entries to load
    into. Add placeholders for them (tensors of the saved shape and dtype,
    None for objects) keyed by the integer parameter index, so that
    load_state_dict receives the complete saved state."""
    state = sub.get("state") if isinstance(sub, dict) else None
    if not isinstance(state, dict):
        return
    for fqn, entry in entries.items():
        path = planner_data.get(fqn)
        if not path or len(path) < 4 or path[0] != key or path[1] != "state":
            continue
        pid = int(path[2]) if isinstance(path[2], str) and path[2].isdigit() else path[2]
        node = state.setdefault(pid, {})
        for part in path[3:-1]:
            if not isinstance(node, dict):
                break
            node = node.setdefault(part, {})
        else:
            if isinstance(node, dict) and path[-1] not in node:
                if entry["type"] == "tensor":
                    node[path[-1]] = torch.empty(tuple(entry["size"]),
                                                 dtype=dtype_from_name(entry["dtype"]))
                else:
                    node[path[-1]] = None


def _restore_device_pieces(reader, pieces):
    """CUDA destinations through pinned bounce buffers; if pinned memory
    cannot be had, through pageable temporaries (the old path)."""
    half = _bounce_half_bytes()
    try:
        return restore_through_bounce(reader, pieces, _CudaBounce(), half)
    except RuntimeError as e:  # pinned allocation failed (e.g. RLIMIT_MEMLOCK)
        if "pin" not in str(e).lower() and "host" not in str(e).lower():
            raise
        log.warning("ckptd: pinned bounce buffers unavailable (%s); restoring CUDA tensors "
                    "through pageable memory", e)
    return restore_through_bounce(reader, pieces, _PageableBounce(), half)


class _PageableBounce(_CudaBounce):
    def alloc(self, nbytes):
        return torch.empty(int(nbytes), dtype=torch.uint8)

    def copy(self, dest, src):
        dest.copy_(src)

    def fence(self):
        return []


def load(state_dict, checkpoint_id, *, strict=True, threads=None, socket=None,
         process_group=None, weights_only=True, verify_crc=True):
    """Loads checkpoint `checkpoint_id` into `state_dict` in place, like
    torch.distributed.checkpoint.load: tensors (plain, ckptd.Shard, DTensor,
    ShardedTensor; CPU or CUDA) are filled with the values of their box of
    the saved global tensor, whatever sharding saved it; other values are
    replaced by the saved ones; Stateful values get load_state_dict() with
    the loaded state. A fresh optimizer's missing per-parameter state is
    materialised from the checkpoint. strict=False skips keys the
    checkpoint lacks (else NotFound). Returns the number of bytes read.
    No daemon is needed unless checkpoint_id is relative.

    weights_only=True (the default) decodes bytes items (optimizer
    param_groups, scheduler and data-loader state) with a restricted
    unpickler that admits only allowlisted globals (tensors, containers,
    numbers, strings, numpy values; README "Security model") and raises
    UnsafeCheckpointError naming any other global before importing it;
    weights_only=False unpickles them fully, like stock DCP (only for
    checkpoints you trust: a pickle can run code). verify_crc=True (the
    default) checks the CRC-32 of every payload record values come from
    (DataLoss naming the file, item and offset on a mismatch); False skips
    the check."""
    del process_group  # resharding needs no collective: each rank reads its boxes
    directory = resolve_checkpoint_dir(checkpoint_id, socket)
    if threads is None:
        threads = max(1, min(8, os.cpu_count() or 1))
    with _native.Reader(directory, threads, verify_crc=verify_crc) as reader:
        md = reader.metadata()
        entries = {e["fqn"]: e for e in md["entries"]}
        planner_data = md.get("planner_data") or {}
        work = {}
        for k, v in state_dict.items():
            work[k] = v.state_dict() if is_stateful(v) else v
            if isinstance(v, torch.optim.Optimizer):
                _add_missing_optimizer_state(str(k), work[k], entries, planner_data)
        pending = _Pending(bounce=_use_bounce())
        objects = []
        for leaf in flatten(work):
            entry = entries.get(leaf.fqn)
            if entry is None:
                if strict:
                    raise NotFound(5, f"Missing key in checkpoint state_dict: {leaf.fqn} "
                                      f"(checkpoint {directory})")
                continue
            if entry["type"] == "bytes":
                objects.append(leaf)
                continue
            chunks = chunks_of(leaf.value)
            if chunks is None:
                raise InvalidArgument(3, f"{leaf.fqn}: the checkpoint holds a tensor but the "
                                         f"state dict has a {type(leaf.value).__name__}")
            for ch in chunks:
                if tuple(ch.global_shape) != tuple(entry["size"]):
                    raise InvalidArgument(3, f"Size mismatch between saved {list(entry['size'])} "
                                             f"and current: {list(ch.global_shape)} for "
                                             f"{leaf.fqn}")
                pending.add(leaf.fqn, entry, ch)
        nread = reader.read(pending.requests)
        for dest, tmp in pending.copies:
            with torch.no_grad():
                dest.copy_(tmp)
        if pending.device_pieces:
            nread += _restore_device_pieces(reader, pending.device_pieces)
        for leaf in objects:
            raw = reader.read_bytes(leaf.fqn)
            nread += len(raw)
            leaf.container[leaf.key] = _torch_load_bytes(raw, leaf.fqn, weights_only)
    for k, v in state_dict.items():
        if is_stateful(v):
            v.load_state_dict(work[k])
        else:
            state_dict[k] = work[k]
    return nread
