"""The rank's shared-memory arena, seen from Python: how many bytes a save
needs there, and reserving it before the first save (ckptd.reserve,
CheckpointManager's background reservation).

The native client (client/client.cc) keeps one arena per connection and
sizes it exactly for the save at hand: the sum of the host items' sizes,
each padded to ITEM_ALIGNMENT, capped at the daemon's max_batch_bytes and
staging budget, rounded up to ARENA_GRANULE. A save that finds no arena, or
one too small, creates a new one on its critical path (memfd, fallocate,
pre-fault, register: about 1 s per GiB); ckptd_reserve does the same ahead
of time and keeps an arena that is large enough. Nothing here talks to the
daemon except through the callable a Reservation runs.
"""
import io
import logging
import threading
import time
import weakref

import torch

from ._tensors import chunks_of, is_cuda
from .errors import DeadlineExceeded

log = logging.getLogger("ckptd")

ITEM_ALIGNMENT = 64        # internal::kItemAlignment (client/batching.h)
ARENA_GRANULE = 2 << 20    # internal::kArenaGranule


def padded(n):
    """n bytes rounded up to ITEM_ALIGNMENT (0 stays 0: empty items take
    no arena space)."""
    return -(-int(n) // ITEM_ALIGNMENT) * ITEM_ALIGNMENT


def spans(leaves):
    """(host bytes, CUDA bytes) that a save of the flattened leaves puts in
    the arena, each item padded as the native client pads it: tensor chunks
    by their bytes (CUDA ones apart: the daemon stages them through CUDA
    IPC when it can, without the arena), other values by the length of
    their torch.save bytes (pickled here, as the save will)."""
    host = cuda = 0
    for leaf in leaves:
        chunks = chunks_of(leaf.value)
        if chunks is None:
            buf = io.BytesIO()
            torch.save(leaf.value, buf)
            host += padded(buf.getbuffer().nbytes)
            continue
        for ch in chunks:
            n = padded(ch.local.numel() * ch.local.element_size())
            if is_cuda(ch.local):
                cuda += n
            else:
                host += n
    return host, cuda


def arena_size_for(span, info):
    """The arena the native client makes for `span` host bytes, given the
    daemon's info (internal::ArenaSizeFor)."""
    want = int(span)
    for cap in (info.get("max_batch_bytes"), info.get("staging_budget_bytes")):
        if cap:
            want = min(want, int(cap))
    want = max(want, ARENA_GRANULE)
    return -(-want // ARENA_GRANULE) * ARENA_GRANULE


class Reservation:
    """The background reservations of one rank's connection, one at a time.
    start(nbytes, reserve) runs `reserve()` (which reserves about `nbytes`
    and returns the bytes it reserved) on a daemon thread, unless that much
    was asked for already; asked while one runs, it runs next on the same
    thread. wait() blocks a save until they are done, for at most `timeout`
    seconds. A failed reservation is logged once and stops further ones:
    the save then creates the arena as it would have without any."""

    def __init__(self, timeout):
        self.timeout = float(timeout)
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._done.set()
        self._asked = 0       # bytes of the largest reservation asked for
        self._next = None     # (nbytes, reserve) to run after the current one
        self.reserved = 0     # bytes reserved (0: none yet)
        self.error = None     # the failure that stopped background reservations
        self.seconds = 0.0    # how long the last reservation took

    def start(self, nbytes, reserve):
        """Reserves in the background; False when there is nothing to do
        (that much asked for already, or a reservation failed)."""
        nbytes = int(nbytes)
        with self._lock:
            if self.error is not None or nbytes <= self._asked:
                return False
            self._asked = nbytes
            if not self._done.is_set():
                self._next = (nbytes, reserve)
                return True
            self._done.clear()
        threading.Thread(target=self._run, args=((nbytes, reserve),), name="ckptd-reserve",
                         daemon=True).start()
        return True

    def _run(self, job):
        while job is not None:
            self._run_one(*job)
            with self._lock:
                job, self._next = (self._next if self.error is None else None), None
                if job is None:
                    self._done.set()

    def _run_one(self, nbytes, reserve):
        t0 = time.perf_counter()
        try:
            got = int(reserve())
        except Exception as e:  # noqa: BLE001  (never the trainer's problem)
            self.error = e
            log.warning("ckptd: reserving the shared-memory arena (about %d bytes) in the "
                        "background failed; the first save creates it instead, on its "
                        "critical path: %s", nbytes, e)
        else:
            self.reserved = max(self.reserved, got)
            log.info("ckptd: shared-memory arena for %d bytes reserved in %.3f s (background)",
                     got, time.perf_counter() - t0)
        finally:
            self.seconds = time.perf_counter() - t0

    def wait(self, timeout=None):
        """Waits for the reservation in progress, if any, for at most
        `timeout` (None: self.timeout) seconds; returns the bytes reserved.
        DeadlineExceeded when it has not finished by then."""
        limit = self.timeout if timeout is None else float(timeout)
        if not self._done.wait(limit):
            raise DeadlineExceeded(
                f"ckptd: the background reservation of the shared-memory arena "
                f"({self._asked} bytes) has not finished after {limit:g} s; no save was "
                f"started (is the daemon hung? see its log; reserve_timeout sets this limit)")
        return self.reserved


_held = weakref.WeakKeyDictionary()  # native client -> arena bytes it is known to hold
_held_lock = threading.Lock()


def note(cl, span):
    """Records that connection `cl` holds an arena for `span` host bytes
    (a save or a reservation through it made sure of that). Returns
    (bytes before, bytes after): equal when the arena known to be there
    fit, before 0 when there was none. Only this process's saves and
    reservations are seen (not a restore's arena, nor one the daemon
    dropped after arena_idle_timeout): the figures are for hints."""
    with _held_lock:
        before = _held.get(cl, 0)
    if span <= before:
        return before, before
    size = arena_size_for(span, cl.info())
    with _held_lock:
        before = _held.get(cl, 0)
        if size > before:
            _held[cl] = size
        return before, max(size, before)
