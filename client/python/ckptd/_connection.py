"""The process's connections to the node's daemon, and the calls that only
ask it something: a checkpoint's status, the list, cancel, and where a
relative checkpoint id lives.

One native client (_native.Client) per (socket, rank), made on first use and
reused with its shared-memory arena; a forked child starts with none.
Nothing here saves or reads checkpoint data.
"""
import os
import threading

from . import _native
from ._types import CheckpointStatus
from .errors import DaemonUnavailable


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


def status(checkpoint_id, socket=None):
    return CheckpointStatus.from_json(client(socket).status(os.fspath(checkpoint_id)))


def list_checkpoints(job=None, include_disk=False, socket=None):
    return [CheckpointStatus.from_json(d)
            for d in client(socket).list(job, include_disk)]


def cancel(checkpoint_id, reason=None, socket=None):
    client(socket).cancel(os.fspath(checkpoint_id), reason)


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
