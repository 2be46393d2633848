"""CheckpointManager: periodic, retained, optionally asynchronous checkpoints
of a training loop under one root directory (the feature set of torch_xla's
CheckpointManager), on top of ckptd.save / async_save / load.

  mgr = ckptd.CheckpointManager("/ckpt/run1", save_interval_steps=100,
                                keep_last_n=3, save_on_preemption=True)
  start = mgr.latest_step()
  if start is not None:
      mgr.restore(start, state)
  for step in range((start or 0) + 1, steps):
      train_step()
      mgr.save_async(step, state)          # only every 100 steps (or on SIGTERM)
      if mgr.reached_preemption(step):
          mgr.join()                        # optional: the daemon commits anyway
          break

Checkpoints are directories <root>/step_<N>; a step counts once its
`.metadata` exists (committed). Retention is done by the daemon (it owns the
files), per job; the manager's job is its root directory.

The first checkpoint stalls no longer than the others: the rank's
shared-memory arena is reserved on a background thread, sized from the
state dict at the first save / save_async call that takes no checkpoint
(or at once from reserve_bytes=), so that the first save finds it ready.
"""
import collections
import logging
import os
import re
import signal
import threading

from . import _arena, _load, _save
from ._connection import client
from .cluster import Cluster, discover_cluster
from .errors import DeadlineExceeded

log = logging.getLogger("ckptd")
_STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointManager:
    def __init__(self, root, save_interval_steps, keep_last_n=0, *, job=None, socket=None,
                 process_group=None, max_pending=1, save_on_preemption=False,
                 preemption_signals=(signal.SIGTERM,), dedup_save_to_lowest_rank=False,
                 background_staging=False, cluster="auto", device_snapshot=False,
                 reserve_bytes=None, reserve_timeout=300.0, keep_every=0, compression=None):
        """root: the checkpoint directory (under one of the daemon's
        checkpoint roots; made absolute). save_interval_steps: should_save is
        true every that many steps. keep_last_n: committed checkpoints kept
        (0: the daemon's setting). keep_every: also keep every checkpoint
        whose step is a multiple of it, beyond the newest keep_last_n
        (Orbax's keep_period; 0: none). compression: None or "zstd[:N]"
        (see ckptd.async_save). max_pending: async saves in flight before
        save_async waits for the oldest. save_on_preemption: install a
        handler for `preemption_signals` (main thread only) that makes the
        next should_save() true on every rank, and reached_preemption()
        true from then on. background_staging: save_async returns before
        the copy into shared memory is done (see ckptd.async_save); call
        wait_staged() before modifying the state. device_snapshot:
        save_async clones the CUDA tensors on their GPU and returns after
        that device-to-device copy; the daemon takes the clones through CUDA
        IPC in the background (see ckptd.async_save; falls back to the
        normal mode, logged, without the GPU memory or the IPC path).
        cluster: the ckptd.Cluster
        of this rank's node for multi-node jobs; "auto" (default) calls
        ckptd.discover_cluster(process_group, socket) here when
        torch.distributed is initialised with more than one rank — a
        collective, so every rank must build its manager — and None skips
        it (a single-node job). reserve_bytes: the rank's shared-memory
        arena is reserved on a background thread so that the first save
        does not create it (about 1 s per GiB) — None (default): sized from
        the state dict at the first save / save_async call that takes no
        checkpoint; N > 0: N bytes at once (from this constructor), and
        grown at that call if the state dict needs more; 0: never (the
        first save creates it). A save waits for a reservation still
        running, at most reserve_timeout seconds (then DeadlineExceeded);
        a failed reservation is logged once and the save creates the arena
        itself."""
        if save_interval_steps < 1:
            raise ValueError("save_interval_steps must be >= 1")
        if keep_last_n < 0:
            raise ValueError("keep_last_n must be >= 0")
        if keep_every < 0:
            raise ValueError("keep_every must be >= 0")
        self.root = os.path.abspath(os.fspath(root))
        self.save_interval_steps = int(save_interval_steps)
        self.keep_last_n = int(keep_last_n)
        self.keep_every = int(keep_every)
        self.compression = compression
        self.job = job or self.root
        self.socket = socket
        self.process_group = process_group
        self.max_pending = max(1, int(max_pending))
        self.dedup_save_to_lowest_rank = dedup_save_to_lowest_rank
        self.background_staging = background_staging
        self.device_snapshot = bool(device_snapshot)
        self.cluster = self._resolve_cluster(cluster)
        self._pending = collections.deque()
        self._lock = threading.Lock()
        self._signal_seen = False
        self._preempted_at = None  # the step of the preemption checkpoint
        self._old_handlers = {}
        self._sync = False        # agree on the preemption step with the other ranks
        self._sync_group = None   # the group for that (None: the default group)
        if save_on_preemption:
            self._install_preemption_handler(preemption_signals)
        self._init_reservation(reserve_bytes, reserve_timeout)

    def _resolve_cluster(self, cluster):
        if isinstance(cluster, str):
            if cluster != "auto":
                raise ValueError(f'cluster must be a ckptd.Cluster, None or "auto", not '
                                 f'{cluster!r}')
            import torch.distributed as dist
            if not (dist.is_available() and dist.is_initialized()) or \
                    dist.get_world_size(self.process_group) <= 1:
                return None
            return discover_cluster(self.process_group, self.socket)
        if cluster is not None and not isinstance(cluster, Cluster):
            raise TypeError(f'cluster must be a ckptd.Cluster, None or "auto", not '
                            f'{type(cluster).__name__}')
        return cluster

    # -- the arena reservation ------------------------------------------------

    def _init_reservation(self, reserve_bytes, timeout):
        if reserve_bytes is not None and (isinstance(reserve_bytes, bool) or
                                          int(reserve_bytes) < 0):
            raise ValueError(f"reserve_bytes must be None or an int >= 0, not {reserve_bytes!r}")
        if not timeout or timeout <= 0:
            raise ValueError("reserve_timeout must be > 0")
        self._reservation = _arena.Reservation(timeout)
        self._sized = reserve_bytes == 0  # the state dict was sized (or never is)
        if reserve_bytes:
            self._reserve_in_background(int(reserve_bytes))

    def _reserve_in_background(self, request):
        """Reserves `request` (bytes, or the (host, CUDA) spans of
        _arena.spans) on the connection of this rank, in the background."""
        rank = _save.rank_of(None, self.process_group)
        socket = self.socket

        def run():
            nbytes = request
            if isinstance(request, tuple):
                nbytes = _save.client_span(client(socket, rank), request)
            return _save.reserve(nbytes, socket, rank=rank)

        self._reservation.start(sum(request) if isinstance(request, tuple) else request, run)

    def _size_once(self, state_dict):
        """At the first save / save_async call without a checkpoint (the
        optimizer state exists by then): sizes the state dict (tensor
        metadata; other values pickled once) and reserves that much."""
        if self._sized:
            return
        self._sized = True
        try:
            self._reserve_in_background(_save.arena_spans(state_dict))
        except Exception as e:  # noqa: BLE001  (the save will report a bad state dict)
            log.warning("ckptd: cannot size the state dict to reserve its arena: %s", e)

    def wait_reserved(self, timeout=None):
        """Waits for a background reservation still running (at most
        `timeout`, default reserve_timeout, seconds; then DeadlineExceeded)
        and returns the bytes reserved so far (0: none, or it failed)."""
        return self._reservation.wait(timeout)

    # -- paths and listing ----------------------------------------------------

    def step_dir(self, step):
        return os.path.join(self.root, f"step_{int(step)}")

    def all_steps(self):
        """Steps with a committed checkpoint under root, ascending."""
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        steps = []
        for name in names:
            m = _STEP_DIR.match(name)
            if m and os.path.exists(os.path.join(self.root, name, ".metadata")):
                steps.append(int(m.group(1)))
        return sorted(steps)

    def latest_step(self):
        steps = self.all_steps()
        return steps[-1] if steps else None

    # -- saving ---------------------------------------------------------------

    def should_save(self, step):
        """True every save_interval_steps steps, and at the first step
        checked after a preemption signal (agreed by all ranks)."""
        if self._preempted_at is None and self._old_handlers:
            self._check_preemption(step)
        if self._preempted_at is not None and step == self._preempted_at:
            return True
        return step % self.save_interval_steps == 0

    def reached_preemption(self, step):
        """True once a preemption checkpoint was due at or before `step`."""
        return self._preempted_at is not None and step >= self._preempted_at

    def _kwargs(self):
        return dict(job=self.job, socket=self.socket, process_group=self.process_group,
                    overwrite=True, keep_last_n=self.keep_last_n, keep_every=self.keep_every,
                    compression=self.compression,
                    dedup_save_to_lowest_rank=self.dedup_save_to_lowest_rank,
                    cluster=self.cluster)

    def save(self, step, state_dict, force=False):
        """Saves and waits for the commit if should_save(step) or force.
        Returns whether a checkpoint was taken; raises CheckpointFailed."""
        if not (force or self.should_save(step)):
            self._size_once(state_dict)
            return False
        self.join()  # keep commits in step order
        self._reservation.wait()
        _save.save(state_dict, self.step_dir(step), **self._kwargs())
        return True

    def save_async(self, step, state_dict, force=False):
        """Stages a checkpoint if should_save(step) or force and returns
        once it is staged (training may go on; the daemon writes it).
        With max_pending saves already in flight, first waits for the
        oldest. Returns whether a checkpoint was taken."""
        if not (force or self.should_save(step)):
            self._size_once(state_dict)
            return False
        while True:
            with self._lock:
                if len(self._pending) < self.max_pending:
                    break
                oldest = self._pending.popleft()
            self._finish(oldest)
        self._reservation.wait()
        handle = _save.async_save(state_dict, self.step_dir(step),
                               background_staging=self.background_staging,
                               device_snapshot=self.device_snapshot, **self._kwargs())
        with self._lock:
            self._pending.append(handle)
        return True

    def wait_staged(self, timeout=None):
        """Waits until every pending save is staged (its tensors may be
        modified again); raises a staging error."""
        for h in self.pending():
            h.wait_staged(timeout)

    def pending(self):
        with self._lock:
            return list(self._pending)

    def join(self, timeout=None):
        """Waits for every async save in flight; raises the first failure."""
        first_error = None
        while True:
            with self._lock:
                if not self._pending:
                    break
                handle = self._pending.popleft()
            try:
                self._finish(handle, timeout)
            except Exception as e:  # keep draining, raise the first
                first_error = first_error or e
        if first_error is not None:
            raise first_error

    def _finish(self, handle, timeout=None):
        st = handle.result(timeout)
        log.info("ckptd: checkpoint %s committed (%d bytes)", st.checkpoint_id, st.file_bytes)

    # -- restoring ------------------------------------------------------------

    def restore(self, step, state_dict, strict=True):
        """Loads the checkpoint of `step` into state_dict in place (see
        ckptd.load), resharding to this job's world size if needed."""
        d = self.step_dir(step)
        if not os.path.exists(os.path.join(d, ".metadata")):
            raise FileNotFoundError(f"no committed checkpoint for step {step} under "
                                    f"{self.root} (have {self.all_steps()})")
        return _load.load(state_dict, d, strict=strict, socket=self.socket)

    # -- preemption -----------------------------------------------------------

    def _install_preemption_handler(self, signals):
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("save_on_preemption needs the manager to be built in the "
                               "main thread (Python signal handlers live there)")
        for sig in signals:
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized() and \
                dist.get_world_size(self.process_group) > 1:
            # A CPU group for the one-int agreement below, whatever backend
            # the training group uses.
            self._sync = True
            self._sync_group = dist.new_group(backend="gloo") if \
                dist.get_backend(self.process_group) != "gloo" else self.process_group

    def _on_signal(self, signum, frame):
        log.warning("ckptd: signal %d: a checkpoint will be taken at the next step", signum)
        self._signal_seen = True
        # A second signal gets the previous disposition (normally: exit).
        signal.signal(signum, self._old_handlers.get(signum, signal.SIG_DFL))

    def _check_preemption(self, step):
        """Makes `step` the preemption checkpoint if a signal came. Ranks
        receive the signal at slightly different steps, so with a process
        group they agree with a one-int all_reduce (MAX) at every
        should_save() call once the handler is installed (every rank must
        call should_save / save / save_async the same number of times per
        step) — the only collective the manager uses, and not on the save
        path."""
        seen = self._signal_seen
        if self._sync:
            import torch
            import torch.distributed as dist
            flag = torch.tensor([1 if seen else 0], dtype=torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._sync_group)
            seen = bool(flag.item())
        if seen:
            self._preempted_at = step

    def close(self):
        """Waits for pending saves and a background reservation, and
        restores the previous signal handlers."""
        try:
            self.join()
        finally:
            try:  # before the caller may close the connection it uses
                self._reservation.wait()
            except DeadlineExceeded as e:
                log.warning("%s", e)
            for sig, old in self._old_handlers.items():
                if signal.getsignal(sig) == self._on_signal:
                    signal.signal(sig, old)
            self._old_handlers.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
