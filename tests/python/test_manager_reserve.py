"""The first save pays like the others: CheckpointManager reserves
the rank's shared-memory arena on a background thread before its first
checkpoint, a save racing that reservation waits for it (one arena, never
two), a failed reservation falls back to the save creating the arena, and
ckptd.reserve / ckptd.arena_bytes size the arena exactly as a save does.

Each test reads the daemon's own record of the arenas it registered (its
log: `arena N registered: 'memfd' BYTES bytes ... owner 'python pid P rank
R'`). No timing is asserted here: the stall figures are in
bench/first_save_bench.py."""
import logging
import os
import re
import threading
import time

import pytest

import daemon_util as du
import pyclient_util

pyclient_util.setup_import()
torch = pytest.importorskip("torch") if os.environ.get("CKPTD_REQUIRE_TORCH") != "1" else \
    __import__("torch")
pytestmark = pytest.mark.skipif(pyclient_util.asan_build(), reason=pyclient_util.ASAN_SKIP_REASON)
import ckptd  # noqa: E402
from ckptd import _arena, _flatten, _native, _save  # noqa: E402


@pytest.fixture
def daemon(make_daemon):
    d = make_daemon()
    yield d
    ckptd.close_clients()


def arenas(d, rank=0):
    """[bytes] of every arena the daemon registered for this process's
    connection of `rank`, in order."""
    owner = re.escape(f"python pid {os.getpid()} rank {rank}")
    return [int(n) for n in re.findall(
        rf"arena \d+ registered: '[^']*' (\d+) bytes.*owner '{owner}'", d.log())]


def model_state(seed=0):
    """A model, Adam with its state (one step taken), and odd extras: a
    non-tensor value and a tensor whose size is not a multiple of 64."""
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.ReLU(), torch.nn.Linear(300, 7))
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    step(m, opt, 0)
    return {"model": m, "optim": opt, "meta": {"step": 1, "name": "x" * 5000},
            "odd": torch.arange(13, dtype=torch.int16)}


def step(m, opt, i):
    g = torch.Generator().manual_seed(i)
    opt.zero_grad()
    m(torch.randn(4, 64, generator=g)).sum().backward()
    opt.step()


def manager(d, name, **kw):
    return ckptd.CheckpointManager(d.root / name, save_interval_steps=3, socket=str(d.socket),
                                   cluster=None, **kw)


def test_arena_bytes_match_what_a_save_puts_in_the_arena():
    state = model_state()
    leaves = _flatten.flatten(_save._shallow_state(state))
    items, _keep, sources = _save._items_for(leaves)
    # The size a save computes from its items == the one sized ahead of it.
    assert _save._host_span(items, sources) == ckptd.arena_bytes(state)
    host, cuda = _arena.spans(leaves)
    assert cuda == 0 and host % _arena.ITEM_ALIGNMENT == 0
    assert host >= sum(p.numel() * 4 for p in state["model"].parameters()) * 3


def test_manager_reserves_the_arena_before_the_first_save(daemon):
    state = model_state()
    with manager(daemon, "run") as mgr:
        assert arenas(daemon) == []
        for i in (1, 2):
            step(state["model"], state["optim"], i)
            assert not mgr.save_async(i, state)  # the first call sizes and reserves
        reserved = mgr.wait_reserved(60)
        assert reserved == ckptd.arena_bytes(state) > 0
        want = _arena.arena_size_for(reserved, ckptd.client(str(daemon.socket)).info())
        # The daemon has the arena before any checkpoint was started.
        du.poll(lambda: arenas(daemon) == [want], 30, "the reserved arena in the daemon's log",
                on_timeout=daemon.log_tail)
        assert mgr.all_steps() == [] and not mgr.pending()
        for i in range(3, 7):
            step(state["model"], state["optim"], i)
            mgr.save_async(i, state)
        mgr.join()
        assert mgr.all_steps() == [3, 6]
    # The saves used that arena: none of them registered another one.
    assert arenas(daemon) == [want]


def test_reserve_bytes_reserves_at_construction(daemon):
    state = model_state()
    need = ckptd.arena_bytes(state)
    mgr = manager(daemon, "hint", reserve_bytes=need)
    try:
        assert mgr.wait_reserved(60) == need
        assert len(arenas(daemon)) == 1
        assert mgr.save(3, state)
        assert not mgr.save_async(4, state)  # sizes the state: no more is needed
        assert mgr.wait_reserved(60) == need
    finally:
        mgr.close()
    assert len(arenas(daemon)) == 1


def test_a_larger_need_found_while_reserving_is_reserved_next(daemon, monkeypatch):
    """reserve_bytes= too small for the state: the constructor's reservation
    runs, the first call without a checkpoint finds more is needed while it
    runs, and that reservation follows it before the save."""
    gate, sizes = threading.Event(), []
    real_reserve = _native.Client.reserve

    def gated(self, nbytes):
        sizes.append(nbytes)
        gate.wait(60)
        real_reserve(self, nbytes)

    monkeypatch.setattr(_native.Client, "reserve", gated)
    state = model_state()
    state["big"] = torch.zeros(1 << 20)  # 4 MiB: more than the first arena
    need = ckptd.arena_bytes(state)
    mgr = manager(daemon, "grow", reserve_bytes=1 << 20)
    try:
        du.poll(lambda: sizes, 30, "the constructor's reservation to start")
        assert not mgr.save_async(1, state)  # sizes the state while that one runs
        gate.set()
        assert mgr.wait_reserved(60) == need
        assert sizes == [1 << 20, need]
        info = ckptd.client(str(daemon.socket)).info()
        grown = [_arena.arena_size_for(n, info) for n in sizes]
        assert arenas(daemon) == grown and grown[1] > grown[0]
        assert mgr.save_async(3, state)
        mgr.join()
    finally:
        gate.set()
        mgr.close()
    assert len(arenas(daemon)) == 2  # the save found the grown arena


def test_a_failed_background_reservation_falls_back_to_the_save(daemon, monkeypatch, caplog):
    def broken(self, nbytes):
        raise ckptd.DaemonUnavailable("injected reservation failure")

    monkeypatch.setattr(_native.Client, "reserve", broken)
    state = model_state()
    with caplog.at_level(logging.WARNING, logger="ckptd"):
        with manager(daemon, "fail", reserve_bytes=1 << 20) as mgr:
            assert not mgr.save_async(1, state)  # would grow it: refused after the failure
            assert mgr.wait_reserved(60) == 0
            assert not mgr.save_async(2, state)
            assert mgr.save_async(3, state)
            mgr.join()
            assert mgr.all_steps() == [3]
    failures = [r for r in caplog.records if "injected reservation failure" in r.getMessage()]
    assert len(failures) == 1, [r.getMessage() for r in caplog.records]
    assert "the first save creates it instead" in failures[0].getMessage()
    assert len(arenas(daemon)) == 1  # made by the save, as without a reservation


def test_a_save_racing_the_reservation_waits_for_it(daemon, monkeypatch):
    """The reservation is held inside the native call until the save has
    arrived; the save waits for it and finds the arena: one arena."""
    events, save_arrived = [], threading.Event()
    real_reserve, real_save = _native.Client.reserve, _native.Client.save

    def slow_reserve(self, nbytes):
        events.append("reserve start")
        save_arrived.wait(60)
        time.sleep(0.2)  # the save is now blocked on the reservation
        real_reserve(self, nbytes)
        events.append("reserve done")

    def save(self, *args):
        events.append("save")
        return real_save(self, *args)

    monkeypatch.setattr(_native.Client, "reserve", slow_reserve)
    monkeypatch.setattr(_native.Client, "save", save)
    state = model_state()
    with manager(daemon, "race") as mgr:
        assert not mgr.save_async(2, state)
        du.poll(lambda: events, 30, "the background reservation to start")
        wait = mgr._reservation.wait

        def arriving(timeout=None):
            save_arrived.set()
            return wait(timeout)

        monkeypatch.setattr(mgr._reservation, "wait", arriving)
        assert mgr.save_async(3, state)
        mgr.join()
    assert events == ["reserve start", "reserve done", "save"]
    assert len(arenas(daemon)) == 1


def test_a_reservation_that_does_not_finish_fails_the_save_with_a_clear_error(daemon,
                                                                              monkeypatch):
    release = threading.Event()
    real_reserve = _native.Client.reserve

    def stuck(self, nbytes):
        release.wait(60)
        real_reserve(self, nbytes)

    monkeypatch.setattr(_native.Client, "reserve", stuck)
    state = model_state()
    mgr = manager(daemon, "stuck", reserve_timeout=0.2)
    try:
        assert not mgr.save_async(1, state)
        with pytest.raises(ckptd.DeadlineExceeded, match=r"background reservation of the "
                                                         r"shared-memory arena .* 0.2 s"):
            mgr.save_async(3, state)
        assert mgr.pending() == []
        release.set()
        assert mgr.wait_reserved(60) > 0
        assert mgr.save_async(3, state)  # the same step again, now with the arena
        mgr.join()
        assert mgr.all_steps() == [3]
    finally:
        release.set()
        mgr.close()
    assert len(arenas(daemon)) == 1


def test_reserve_takes_a_state_dict_and_the_rank_of_the_save(daemon, caplog):
    state = model_state()
    s = str(daemon.socket)
    assert ckptd.reserve(state, socket=s, rank=2) == ckptd.arena_bytes(state)
    assert len(arenas(daemon, rank=2)) == 1 and arenas(daemon, rank=0) == []
    with caplog.at_level(logging.INFO, logger="ckptd"):
        h = ckptd.async_save(state, "r", socket=s, rank=2, world_size=3)
        assert not [r for r in caplog.records if "creates its shared-memory arena" in
                    r.getMessage()]
        h.cancel("test")
        # Without a reservation the save creates the arena, and says so.
        ckptd.save(state, "r0", socket=s, rank=0, world_size=1)
    assert len(arenas(daemon, rank=2)) == 1 and len(arenas(daemon, rank=0)) == 1
    hints = [r.getMessage() for r in caplog.records if "ckptd.reserve" in r.getMessage()]
    assert len(hints) == 1 and "rank 0 creates" in hints[0]
    with pytest.raises(ckptd.InvalidArgument, match=">= 0"):
        ckptd.reserve(-1, socket=s)
