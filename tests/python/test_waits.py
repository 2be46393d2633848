"""Waits with an end (docs/waits.md): a wait that has no limit
of its own must still end, with a message naming what it waited for, when
the daemon it waits on stops answering (SIGSTOP: the socket still accepts
connections, nothing answers), and must not end early while the daemon
answers.

  * `ckptctl wait ID` (no --timeout): Wait calls in slices of --rpc-timeout
    with a GetStatus in between; a daemon that does not answer ends it
    with exit 3 naming the checkpoint and the socket.
  * `AsyncSaveHandle.wait()` / `.result()` with no timeout (what
    ckptd.save and CheckpointManager use): Wait calls in slices of
    checkpoint._WAIT_SLICE_S; a call not answered by its end + the native
    client's slack raises DeadlineExceeded naming the checkpoint.
  * the C++ client's `Client::Wait` with no timeout (`ckptd_wait(.., -1)`
    in the C ABI): a call whose own deadline passes without an answer ends
    it, DEADLINE_EXCEEDED naming the socket and the checkpoint.
"""
import os
import signal
import subprocess
import time

import pytest

import daemon_util as du
import pyclient_util

pyclient_util.setup_import()
pytestmark = [pytest.mark.skipif(pyclient_util.asan_build(), reason=pyclient_util.ASAN_SKIP_REASON),
              pytest.mark.once]

NATIVE_SLACK_S = 10  # client/client.cc Client::Wait: kSlack beyond each call's timeout


def half_staged(d, ck):
    """Rank 0 of a 2-rank checkpoint, staged: it stays STAGING until rank 1
    comes (stage_timeout is 120 s)."""
    r0 = d.trainer(ck, 0, 2, mb=0.25, timeout=300)
    r0.next_json(timeout=60)
    ckdir = d.root / ck
    d.poll_status(ckdir, lambda st: st.ranks_staged == 1, 30, "rank 0 staged")
    return r0, ckdir


def ckptctl_wait(d, ckdir, *args):
    return du.spawn([du.need(du.bin_path("ckptctl")), "wait", str(ckdir), "--socket",
                     str(d.socket), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    text=True)


def test_ckptctl_wait_ends_when_the_daemon_stops_answering(make_daemon):
    d = make_daemon()
    r0, ckdir = half_staged(d, "w/stopped")
    rpc = 2
    p = ckptctl_wait(d, ckdir, "--rpc-timeout", str(rpc))
    # Let it connect and go through a slice or so of a live wait (Connect's
    # GetInfo takes milliseconds; a daemon stopped during it would fail the
    # Connect instead, which is not what this test is about).
    t_start = time.monotonic()
    du.poll(lambda: p.poll() is not None or time.monotonic() - t_start > 1.5 * rpc, 10,
            "ckptctl wait to be under way")
    assert p.poll() is None, p.communicate()
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        bound = rpc + NATIVE_SLACK_S + rpc + 10
        try:
            out, err = p.communicate(timeout=bound)
        except subprocess.TimeoutExpired:
            p.kill()
            raise AssertionError(f"ckptctl wait did not end within {bound}s of the daemon "
                                 "stopping")
        took = time.monotonic() - t0
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    print(f"ckptctl wait ended {took:.1f}s after SIGSTOP: exit {p.returncode}: {err.strip()}")
    assert p.returncode == 3, (p.returncode, out, err)
    assert "stopped answering while waiting for checkpoint" in err and str(ckdir) in err, err
    assert str(d.socket) in err and "rpc-timeout" in err, err
    # The daemon, continued, serves on; the checkpoint completes.
    r1 = d.trainer("w/stopped", 1, 2, mb=0.25)
    assert r1.wait(60) == 0 and r0.wait(60) == 0, (r0.result(), r1.result())


def test_ckptctl_wait_sliced_still_waits_for_the_end(make_daemon):
    """Slices of --rpc-timeout 1 s against a live daemon: the wait goes on
    past many slices and reports the commit (exit 0)."""
    d = make_daemon()
    r0, ckdir = half_staged(d, "w/live")
    p = ckptctl_wait(d, ckdir, "--rpc-timeout", "1")
    t0 = time.monotonic()
    du.poll(lambda: p.poll() is not None or time.monotonic() - t0 > 3.5, 10,
            "a few slices of ckptctl wait")
    assert p.poll() is None, p.communicate()
    r1 = d.trainer("w/live", 1, 2, mb=0.25)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, (out, err)
    assert "COMMITTED" in out, out
    assert r1.wait(60) == 0 and r0.wait(60) == 0


def test_python_wait_without_timeout_ends_when_the_daemon_stops_answering(make_daemon,
                                                                            monkeypatch):
    import ckptd
    import torch
    from ckptd import _handle
    monkeypatch.setattr(_handle, "_WAIT_SLICE_S", 1.0)
    d = make_daemon()
    try:
        h = ckptd.async_save({"w": torch.arange(1000, dtype=torch.float32)}, "py/stopped",
                             rank=0, world_size=2, socket=str(d.socket))
        ckdir = h.checkpoint_id
        os.kill(d.proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            with pytest.raises(ckptd.DeadlineExceeded) as e:
                h.result()
        finally:
            os.kill(d.proc.pid, signal.SIGCONT)
        took = time.monotonic() - t0
        print(f"handle.result() raised {took:.1f}s after SIGSTOP: {e.value}")
        assert took < 1.0 + NATIVE_SLACK_S + 10, took
        msg = str(e.value)
        assert "stopped answering while waiting for checkpoint" in msg and ckdir in msg, msg
    finally:
        ckptd.close_clients()


def test_python_wait_without_timeout_sliced_still_waits(make_daemon, monkeypatch):
    import ckptd
    import torch
    from ckptd import _handle
    monkeypatch.setattr(_handle, "_WAIT_SLICE_S", 0.5)
    d = make_daemon()
    try:
        h = ckptd.async_save({"w": torch.arange(1000, dtype=torch.float32)}, "py/live",
                             rank=0, world_size=2, socket=str(d.socket))
        # Rank 1 comes after a few slices.
        timer = __import__("threading").Timer(2.0, lambda: ckptd.async_save(
            {"w": torch.arange(1000, dtype=torch.float32)}, "py/live", rank=1, world_size=2,
            socket=str(d.socket)))
        timer.start()
        st = h.result()
        timer.join()
        assert st.state == "COMMITTED", st
    finally:
        ckptd.close_clients()


def test_native_wait_without_timeout_ends_when_the_daemon_stops_answering(make_daemon):
    """The C++ client's own Wait with no timeout (client.cc Client::Wait,
    through the C ABI's ckptd_wait_json(.., -1), which C callers use
    directly), rpc_timeout 1 s: against a live daemon it waits across slices
    for the end; against a SIGSTOPped one it ends once a call's own deadline
    (1 s + the 10 s slack) passes without an answer, with DEADLINE_EXCEEDED
    naming the socket and the checkpoint (it called again for ever)."""
    import threading

    import ckptd
    from ckptd import _native
    d = make_daemon()
    client = _native.Client(str(d.socket), rpc_timeout=1.0)
    try:
        r0, live = half_staged(d, "w/native-live")
        result = {}
        waiter = threading.Thread(target=lambda: result.update(client.wait(str(live))))
        waiter.start()
        t_start = time.monotonic()
        du.poll(lambda: not waiter.is_alive() or time.monotonic() - t_start > 3.5, 10,
                "a few 1 s slices of the wait")
        assert waiter.is_alive(), result
        r1 = d.trainer("w/native-live", 1, 2, mb=0.25)
        waiter.join(60)
        assert result.get("state") == "COMMITTED", result
        assert r1.wait(60) == 0 and r0.wait(60) == 0

        r0, ckdir = half_staged(d, "w/native-stopped")
        os.kill(d.proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            with pytest.raises(ckptd.DeadlineExceeded) as e:
                client.wait(str(ckdir))
        finally:
            os.kill(d.proc.pid, signal.SIGCONT)
        took = time.monotonic() - t0
        print(f"Client::Wait ended {took:.1f}s after SIGSTOP: {e.value}")
        assert took < 1 + NATIVE_SLACK_S + 10, took
        msg = str(e.value)
        assert (f"the daemon at {d.socket} did not answer a Wait for checkpoint {ckdir} "
                f"within 11s") in msg, msg
        # The daemon, continued, serves on; the checkpoint completes.
        r1 = d.trainer("w/native-stopped", 1, 2, mb=0.25)
        assert r1.wait(60) == 0 and r0.wait(60) == 0
        assert client.wait(str(ckdir))["state"] == "COMMITTED"
    finally:
        client.close()


def test_demo_wait_for_the_commit_has_a_deadline(make_daemon):
    """ckptd_demo --socket waits for the commit at most --wait-timeout
    (default 600 s), then exits 1 naming the checkpoint. Here the writer is
    held back (write_rate_limit 1 MiB/s, 16 MiB to write)."""
    d = make_daemon(write_rate_limit="1M")
    t0 = time.monotonic()
    p = subprocess.run([du.need(du.bin_path("ckptd_demo")), "--socket", str(d.socket), "--dir",
                        "demo/slow", "--size-mb", "16", "--save-ranks", "2", "--wait-timeout",
                        "1"], capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    print(f"ckptd_demo exited {p.returncode} after {took:.1f}s: {p.stderr.strip()}")
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "checkpoint demo/slow not final within 1s" in p.stderr and "--wait-timeout" in \
        p.stderr, p.stderr
    assert took < 30, took


def test_wait_arena_idle_expires_with_the_arena_named(make_daemon):
    """WaitArenaIdle on an arena a half-staged checkpoint still holds ends at
    its timeout_ms with DEADLINE_EXCEEDED naming the arena; the Wait RPC
    likewise names the checkpoint."""
    d = make_daemon()
    raw = du.RawClient(d)
    try:
        req = raw.tensor_rank("w/arena", "w", [64, 8], [0, 0], [32, 8], rank=0, world=2)
        assert du.state_name(raw.save(req).state) == "STAGED"
        pb2 = du.pb()[0]
        t0 = time.monotonic()
        code, msg = du.rpc_error(raw.stub.WaitArenaIdle,
                                 pb2.WaitArenaIdleRequest(arena_id=req.arena_id, timeout_ms=300),
                                 timeout=30)
        took = time.monotonic() - t0
        assert code == "DEADLINE_EXCEEDED", (code, msg)
        assert f"arena {req.arena_id} is still in use by a checkpoint" in msg, msg
        assert 0.3 <= took < 5, took
        code, msg = du.rpc_error(raw.stub.Wait, pb2.WaitRequest(checkpoint_id="w/arena",
                                                                timeout_ms=300), timeout=30)
        assert code == "DEADLINE_EXCEEDED" and "w/arena did not finish in time" in msg, (code, msg)
    finally:
        raw.close()
