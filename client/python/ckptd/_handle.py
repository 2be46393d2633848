"""AsyncSaveHandle: what async_save returns, and its waits.

A handle watches one checkpoint of one rank: staging (done when async_save
returns, or later with background_staging / device_snapshot), then the
daemon's write and commit, asked of the daemon by Status and Wait calls.
Every wait has a deadline, or ends once the daemon stops answering
(docs/waits.md).
"""
import logging
import threading
import time

from ._types import CheckpointStatus, SaveStats
from .errors import UNAVAILABLE, CheckpointFailed, DeadlineExceeded

log = logging.getLogger("ckptd")

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
                    f"the ckptd daemon stopped answering while waiting for checkpoint "
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
            raise DeadlineExceeded(f"rank {self.rank} not staged within {timeout}s")
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
            raise CheckpointFailed(f"checkpoint {st.checkpoint_id} {st.state}: {st.error}",
                                   status=st, code=st.error_code or None)
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
                                             state="FAILED", error=str(e),
                                             error_code=getattr(e, "code", UNAVAILABLE)))

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
