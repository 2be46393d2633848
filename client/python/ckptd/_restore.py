"""load through the daemon: the node's daemon decodes the checkpoint's
index once and reads each byte range once for all local ranks of one load
(the restore group), copying the values into each rank's shared-memory
arena; the native library copies them on into the tensors.

This module holds what is particular to that path: which path a load takes
(`open_restore`: the daemon when one answers, serves restores and the
native library speaks C API 5; else the direct reader, with the reason
logged once), the group name, and the native restore call. What to fill
from the index is planned by _load, one implementation for both paths.
"""
import dataclasses
import hashlib
import logging
import os
import threading

from . import _native
from ._connection import client, default_socket
from .errors import FAILED_PRECONDITION, CkptdError, DaemonUnavailable, InvalidArgument

log = logging.getLogger("ckptd")

BATCH_ENV = "CKPTD_RESTORE_BATCH_BYTES"
# The batch limit for a checkpoint the daemon's memory tier holds
# (RestoreIndex "memory_tier_bytes"), unless BATCH_ENV says otherwise.
HELD_BATCH_BYTES = 64 << 20
_MAX_GROUP_BYTES = 1024

# GetRestoreIndex failures after which load(via_daemon=None) reads the
# checkpoint directly: the daemon cannot (or may not) see the directory,
# or stopped answering. The direct reader then reports what it finds.
_FALLBACK_CODES = {"PERMISSION_DENIED", "NOT_FOUND", "FAILED_PRECONDITION", "UNIMPLEMENTED",
                   "UNAVAILABLE"}


@dataclasses.dataclass
class RestoreStats:
    """What the last load through the daemon in this process did
    (last_stats())."""
    checkpoint_id: str
    group: str           # the restore group ("" for a rank alone)
    storage_bytes: int   # read from storage by this rank's batches (a group's reads once)
    copied_bytes: int    # written by the daemon into this rank's arena
    bytes: int           # delivered into the state dict's tensors and bytes items
    batches: int
    group_ranks: int     # most ranks served together in one batch
    seconds: float


_lock = threading.Lock()
_loads = 0
_last_stats = None
_logged = set()


def next_load_number():
    """The number of this load among the process's loads, from 0 (every
    rank calls load the same number of times, so the n-th loads of the
    node's ranks form one group)."""
    global _loads
    with _lock:
        n = _loads
        _loads += 1
        return n


def last_stats():
    """RestoreStats of the process's last load through the daemon, or
    None."""
    return _last_stats


def group_name(directory, seq):
    """"<checkpoint dir>#<n>" for the process's n-th load, or a digest of
    the directory where that would exceed the protocol's 1024 bytes. After
    torchrun restarted the job k > 0 times (TORCHELASTIC_RESTART_COUNT, the
    same on all its ranks) "#<k>.<n>": a restarted job never meets the
    groups of its crashed incarnation, which the daemon may still hold.
    (Without it the daemon starts a group anew when a rank sends its first
    batch again; docs/restore.md, "Restarts".)"""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "")
    tag = f"{int(restart)}.{seq}" if restart.isdigit() and int(restart) > 0 else f"{seq}"
    name = f"{directory}#{tag}"
    if len(name.encode()) <= _MAX_GROUP_BYTES:
        return name
    return f"sha256:{hashlib.sha256(os.fsencode(directory)).hexdigest()}#{tag}"


def local_ranks(local_rank=None, local_world_size=None):
    """(local_rank, local_world_size): the arguments, else $LOCAL_RANK /
    $LOCAL_WORLD_SIZE (torchrun), else 0 / 1."""
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK") or 0)
    if local_world_size is None:
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE") or 1)
    local_rank, local_world_size = int(local_rank), int(local_world_size)
    if local_world_size < 1 or not 0 <= local_rank < local_world_size:
        raise InvalidArgument(f"local_rank {local_rank} is not in [0, local_world_size) with "
                              f"local_world_size {local_world_size}")
    return local_rank, local_world_size


def _direct(strict, key, reason, code=FAILED_PRECONDITION):
    """None (read directly) after logging `reason` once per kind, or the
    error when the caller asked for the daemon (via_daemon=True)."""
    if strict:
        raise CkptdError(f"cannot load through the daemon: {reason}", code=code)
    with _lock:
        first = key not in _logged
        _logged.add(key)
    if first:
        log.info("ckptd.load reads checkpoints directly: %s", reason)
    return None


def _rank(process_group):
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(process_group)
    except Exception:  # noqa: BLE001  (no torch.distributed: rank 0)
        pass
    return 0


class DaemonRestore:
    """One load through the daemon: its index (the metadata the planning
    reads, with "nbytes" on bytes entries) and the restore call."""

    def __init__(self, native_client, directory, index, identity):
        self.client = native_client
        self.directory = index.get("dir") or directory
        self.index = index
        self.identity = identity

    def leave(self, seq, local_rank, local_world_size):
        """After this rank failed before its restore (planning): its one
        batch, empty and last, so that the other local ranks of its group
        do not wait for it at each of their batches. Best effort."""
        try:
            lr, lws = local_ranks(local_rank, local_world_size)
            if lws > 1:
                opts = _native.restore_options(group_name(self.directory, seq), lr, lws)
                self.client.restore(self.directory, opts, [], [], [])
        except CkptdError:
            pass

    def run(self, requests, bytes_items, seq, verify_crc, local_rank, local_world_size):
        """Fills the ReadRequests; `bytes_items` is [(fqn, nbytes)]. Returns
        (bytes delivered, [payload of each bytes item])."""
        global _last_stats
        lr, lws = local_ranks(local_rank, local_world_size)
        # Alone (local_world_size 1): no group, so that processes that all
        # think they are local rank 0 (no $LOCAL_RANK) never meet in one.
        group = group_name(self.directory, seq) if lws > 1 else ""
        batch = int(os.environ.get(BATCH_ENV) or 0)
        if not batch and self.index.get("memory_tier_bytes"):
            # Held in the daemon's memory: boxes that are whole saved records
            # are lent, not copied into the arena, so a small arena will do
            # (a fresh process pays a page clear for every arena byte).
            batch = HELD_BATCH_BYTES
        opts = _native.restore_options(group, lr, lws, verify_crc, self.identity, batch)
        raws, st = self.client.restore(self.directory, opts, requests,
                                       [f for f, _ in bytes_items],
                                       [max(0, int(n)) for _, n in bytes_items])
        _last_stats = RestoreStats(self.directory, group, st.storage_bytes, st.copied_bytes,
                                   st.bytes, st.batches, st.group_ranks, st.seconds)
        return st.bytes, raws


def open_restore(directory, socket, via_daemon, process_group=None):
    """A DaemonRestore for loading `directory` through the daemon at
    `socket`, or None to read it directly. via_daemon False: None; True:
    the daemon or the error saying why not; None: the daemon when one
    answers, serves restores and this library speaks C API 5, else None
    (the reason logged once per kind)."""
    if via_daemon is False:
        return None
    strict = via_daemon is True
    version = _native.library_api_version()
    if version < _native.RESTORE_API_VERSION:
        return _direct(strict, "library", f"{_native.library_path()} has C API version "
                       f"{version} (restoring through the daemon needs "
                       f"{_native.RESTORE_API_VERSION})")
    path = os.fspath(socket) if socket is not None else default_socket()
    try:
        native = client(path, _rank(process_group))
        info = native.info()
    except DaemonUnavailable as e:
        if strict:
            raise
        return _direct(False, "no daemon", f"no daemon answers at {path} ({e.message})")
    if not info.get("restore"):
        return _direct(strict, "old daemon", f"the daemon at {path} (version "
                       f"{info.get('version')}) does not serve restores")
    try:
        index, identity = native.restore_index(directory)
    except CkptdError as e:
        if strict or e.code_name not in _FALLBACK_CODES:
            raise
        return _direct(False, ("index", e.code_name), f"the daemon at {path} cannot serve "
                       f"{directory}: {e}")
    return DaemonRestore(native, directory, index, identity)
