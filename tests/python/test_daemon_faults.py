"""Failures around a real daemon: cancel during the write, trainers killed
after and before "staged", a rank that never shows up, the daemon SIGKILLed
at random points of many saves (restart recovery), and SIGTERM draining.

The durability contract checked throughout (../shared/docs/design.md, "Durability and
failure model"): `.metadata` present <=> the checkpoint is complete and
verifies; an aborted checkpoint leaves no data files behind; the daemon
keeps serving, and the next save to the same path succeeds.
"""
import collections
import os
import random
import re
import time

import pytest

import daemon_util as du
from daemon_util import TrainerSpec, assert_committed, data_files, run_ranks, state_name, \
    verify_checkpoint


def test_cancel_during_write_removes_files_and_releases_staging(make_daemon, torch, tmp_path):
    # 4 ranks x 16 MiB, all staged at once (budget 66M), written at 8 MiB/s.
    # max_batch = staging_budget makes the budget check exact: a batch of
    # the whole budget is only adopted when no byte of it is held.
    d = make_daemon(write_rate_limit="8M", staging_budget="66M", max_batch="66M")
    ckdir = d.root / "cx" / "ck"
    trainers = [d.trainer("cx/ck", r, 4, mb=16) for r in range(4)]
    st = d.wait_state(ckdir, "WRITING")
    assert st.ranks_staged == 4, st
    # (written_bytes moves in big steps; the data files show the write.)
    du.poll(lambda: du.data_bytes(ckdir) > 0, 30, "data in the files")
    assert du.data_bytes(ckdir) < st.total_bytes // 2

    out = d.ckptctl("cancel", str(ckdir), "--reason", "pytest cancel", "--json")
    assert '"CANCELLED"' in out.stdout
    st = d.status(ckdir)
    assert state_name(st.state) == "CANCELLED"
    assert st.error_code == du.CODE["CANCELLED"] and "pytest cancel" in st.error, st
    for t in trainers:
        assert t.wait(60) == 1
        assert t.lines[-1]["state"] == "CANCELLED" and "pytest cancel" in t.lines[-1]["error"]
    # Cancelling again: refused, the checkpoint is final.
    again = d.ckptctl("cancel", str(ckdir), check=False)
    assert again.returncode == 1 and "already CANCELLED" in again.stderr, again
    # The files go once the writers have stopped (they stop between pieces).
    cleaned = re.compile(rf"checkpoint {re.escape(str(ckdir))}: cleaned up \(\d+ data files")
    du.poll(lambda: cleaned.search(d.log()), 30, "the cancelled checkpoint's clean-up",
            on_timeout=d.log_tail)
    assert data_files(ckdir) == [] and not ckdir.exists()  # the daemon had created it

    # Staging memory is back to 0: a probe whose first batch is the whole
    # budget gets adopted (staged_bytes == 66M) — impossible if a byte leaked.
    probe_dir = d.root / "cx" / "probe"
    probe = d.trainer("cx/probe", 0, 1, mb=70)
    d.poll_status(probe_dir, lambda s: s.staged_bytes >= 66 << 20, timeout=60,
                  what="the probe's 66M batch to be adopted")
    d.cancel(probe_dir, "probe done")
    assert probe.wait(60) == 1 and probe.lines[-1]["code"] == du.CODE["CANCELLED"], probe.lines

    # The daemon still serves, and the next save to the same path succeeds.
    assert d.info().pid == d.proc.pid
    assert_committed(run_ranks(d, 4, "cx/ck", mb=1), d)
    verify_checkpoint(ckdir, TrainerSpec.of(4, mb=1), torch, workdir=tmp_path)


@pytest.mark.parametrize("how", ["sigkill", "exit"])
def test_trainer_gone_after_staged_still_commits(make_daemon, torch, tmp_path, how):
    """The trainers vanish right after their "staged" line: SIGKILL (arena
    still mapped by the dead process) or _exit without releasing the arena.
    The daemon finishes the checkpoint on its own."""
    d = make_daemon(write_rate_limit="8M")
    ckdir = d.root / "ka" / "ck"
    flag = {"sigkill": dict(hold_after_staged=True), "exit": dict(exit_after_staged=True)}[how]
    trainers = [d.trainer("ka/ck", r, 4, mb=2, **flag) for r in range(4)]
    for t in trainers:
        assert t.next_json(60)["checkpoint"] == str(ckdir)
        if how == "sigkill":
            t.kill()
    for t in trainers:
        t.wait(30)
    # 8 MiB at 8 MiB/s: still being written when the last trainer is gone.
    assert state_name(d.status(ckdir).state) not in du.FINAL_STATES
    st = d.wait_final(ckdir)
    assert state_name(st.state) == "COMMITTED", st
    verify_checkpoint(ckdir, TrainerSpec.of(4, mb=2), torch, workdir=tmp_path)


def test_trainer_killed_mid_stream_fails_the_checkpoint(make_daemon, torch, tmp_path):
    """Two ranks of 8 MiB stream through a 2 MiB budget at 4 MiB/s; rank 1 is
    SIGKILLed mid-stream, while its Save call is in flight."""
    d = make_daemon(staging_budget="2M", write_rate_limit="4M", stage_timeout="60s")
    ckdir = d.root / "kb" / "ck"
    t0 = d.trainer("kb/ck", 0, 2, mb=8)
    t1 = d.trainer("kb/ck", 1, 2, mb=8)
    d.poll_status(ckdir, lambda s: s.staged_bytes >= 3 << 20 and s.written_bytes > 0, timeout=60,
                  what="a few streamed batches")
    t1.kill()
    st = d.poll_status(ckdir, lambda s: state_name(s.state) in du.FINAL_STATES, timeout=20,
                       what="the checkpoint to fail")
    assert state_name(st.state) == "FAILED", st
    assert st.error_code == du.CODE["ABORTED"], st
    assert "rank 1 went away before its data was staged" in st.error, st
    # Rank 0's Save call in flight gets the error (or, had it just been
    # between two batches, its next batch is refused).
    assert t0.wait(60) == 1
    assert t0.lines[-1]["code"] in (du.CODE["ABORTED"], du.CODE["FAILED_PRECONDITION"]), t0.lines
    du.poll(lambda: data_files(ckdir) == [], 30, "the failed checkpoint's files to go",
            on_timeout=lambda: f"{data_files(ckdir)}\n{d.log_tail()}")

    assert_committed(run_ranks(d, 2, "kb/ck", mb=1), d)
    verify_checkpoint(ckdir, TrainerSpec.of(2, mb=1), torch, workdir=tmp_path)


def test_client_gone_between_batches_fails_the_checkpoint(make_daemon):
    """The lease between two batches of a streaming rank: batch_gap_timeout."""
    d = make_daemon(staging_budget="2M", stage_timeout="60s", batch_gap_timeout="1s")
    raw = du.RawClient(d, own_channel=True)
    n = 1 << 20  # two batches of 512 KiB of a 1 MiB tensor
    arena_id = raw.arena(b"\x01" * n)
    item = raw.tensor("w", [n], dtype="uint8")
    resp = raw.save(raw.request("gap/ck", items=[item], extents=[raw.extent(0, 0, 0, n // 2)],
                                arena_id=arena_id, last=False))
    assert state_name(resp.state) == "STAGING"
    raw.close()  # the client's connection goes away; no second batch
    st = d.poll_status(resp.checkpoint_id, lambda s: True)
    assert state_name(st.state) == "STAGING"
    try:
        st = d.poll_status(resp.checkpoint_id, lambda s: state_name(s.state) != "STAGING",
                           timeout=5, what="the abandoned checkpoint to fail")
    except AssertionError:
        raise AssertionError("still STAGING 5 s after its client went away") from None
    assert state_name(st.state) == "FAILED" and st.error_code == du.CODE["ABORTED"], st
    assert "rank 0" in st.error and "batch_gap_timeout" in st.error, st.error


def test_rank_that_never_shows_up_times_out(make_daemon, torch, tmp_path):
    d = make_daemon(stage_timeout="2s")
    ckdir = d.root / "mt" / "ck"
    results = run_ranks(d, 3, "mt/ck", ranks=[0, 1], mb=0.25)
    for r in results:
        assert r["rc"] == 1 and r["last"]["state"] == "FAILED", r
        assert r["last"]["error_code"] == du.CODE["DEADLINE_EXCEEDED"], r
    st = d.status(ckdir)
    assert state_name(st.state) == "FAILED" and st.error_code == du.CODE["DEADLINE_EXCEEDED"]
    assert "ranks [2] of 3 made no progress" in st.error and "stage_timeout" in st.error, st.error
    assert (st.ranks_staged, st.world_size) == (2, 3)
    assert data_files(ckdir) == []
    assert_committed(run_ranks(d, 3, "mt/ck", mb=0.25), d)
    verify_checkpoint(ckdir, TrainerSpec.of(3, mb=0.25), torch, workdir=tmp_path)


RECOVERY_RE = re.compile(r"recovery: (\d+) unfinished checkpoints removed, (\d+) found committed, "
                         r"(\d+) errors")


def test_daemon_killed_at_random_points_recovers(make_daemon, torch, tmp_path):
    """22 saves (2 ranks x ~1 MiB, written at 8 MiB/s), each interrupted by
    SIGKILL of the daemon — at a random delay from a logged seed, plus one
    deterministic kill mid-write and one right after the commit — and a
    restart. After every restart: each directory with .metadata verifies;
    every other one has no data files left, and the log reports what
    recovery removed."""
    seed = int(os.environ.get("CKPTD_KILL_SEED", time.time_ns() % (1 << 32)))
    print(f"CKPTD_KILL_SEED={seed}")
    rng = random.Random(seed)
    d = make_daemon(write_rate_limit="8M")
    flags = dict(mb=1, job="kill")
    start = time.monotonic()
    assert_committed(run_ranks(d, 2, "kill/calibrate", **flags), d)
    typical = time.monotonic() - start  # one whole save, trainers' start included

    outcomes = collections.Counter()
    for i in range(22):
        ckdir = d.root / "kill" / f"s{i:02d}"
        trainers = [d.trainer(f"kill/s{i:02d}", r, 2, **flags) for r in range(2)]
        if i == 0:  # data files created (their bytes may still sit in write buffers)
            du.poll(lambda: any(n.startswith("__") for n in data_files(ckdir)) and
                    not (ckdir / ".metadata").exists(), 60, "a write in progress")
        elif i == 1:
            d.wait_state(ckdir, "COMMITTED")
        else:
            time.sleep(rng.uniform(0, 1.5 * typical))  # a random kill point, not a wait
        d.kill()
        for t in trainers:
            t.kill()
        left = data_files(ckdir)
        d.start()

        log = d.log_since_start()
        m = RECOVERY_RE.search(log)
        assert m and m.group(3) == "0", log
        assert not list((d.state / "journal").iterdir()), "journal entries left after recovery"
        if (ckdir / ".metadata").exists():
            outcomes["committed"] += 1
            assert ".metadata" in left
            verify_checkpoint(ckdir, TrainerSpec.of(2, **flags), torch, convert=False)
        else:
            assert data_files(ckdir) == [], (i, data_files(ckdir), log)
            if any(n.startswith("__") for n in left):
                outcomes["removed by recovery"] += 1
                assert f"recovery: removed the unfinished checkpoint {ckdir} (no .metadata)" in log
                assert int(m.group(1)) >= 1, log
            else:
                outcomes["nothing written"] += 1
    print(dict(outcomes))
    assert outcomes["committed"] >= 1 and outcomes["removed by recovery"] >= 1, outcomes
    # Every directory of the run: complete and verified, or without data.
    for ckdir in sorted((d.root / "kill").iterdir()):
        if (ckdir / ".metadata").exists():
            assert du.run(du.bin_path("ckptctl"), "verify", ckdir, check=False).returncode == 0
        else:
            assert not any(n.startswith("__") for n in data_files(ckdir)), ckdir
    assert_committed(run_ranks(d, 2, "kill/after", **flags), d)
    d.stop()


def test_sigterm_drains_staged_checkpoints_and_aborts_the_rest(make_daemon, torch, tmp_path):
    """Also: the Wait calls in flight at SIGTERM are answered with their
    checkpoint's outcome (COMMITTED after the drain; the shutdown's reason
    for the aborted one), not cancelled with gRPC's 'Cancelling all
    calls'."""
    import grpc
    d = make_daemon(write_rate_limit="8M", log_level="debug")
    a, b = d.root / "gs" / "a", d.root / "gs" / "b"
    # a: every rank staged, 8 MiB being written at 8 MiB/s.
    ta = [d.trainer("gs/a", r, 2, mb=4, hold_after_staged=True) for r in range(2)]
    for t in ta:
        t.next_json(60)
    # b: rank 0 of 2 staged, rank 1 never comes.
    d.trainer("gs/b", 0, 2, mb=0.25, hold_after_staged=True).next_json(60)
    assert state_name(d.status(a).state) == "WRITING"
    assert state_name(d.status(b).state) == "PENDING"
    pb2, pb2_grpc = du.pb()
    channel = grpc.insecure_channel(f"unix:{d.socket}")
    stub = pb2_grpc.CheckpointDaemonStub(channel)
    waits = {name: stub.Wait.future(pb2.WaitRequest(checkpoint_id=str(path), timeout_ms=120_000),
                                    timeout=150)
             for name, path in (("a", a), ("b", b))}
    for path in (a, b):
        du.poll(lambda: f"Wait on {path}: 1 waiter(s)" in d.log_since_start(), 30,
                f"the Wait on {path} to reach the daemon", on_timeout=d.log_tail)
    d.stop()  # asserts exit status 0
    log = d.log_since_start()
    assert "signal 15: shutting down" in log and "ckptd stopped" in log
    assert f"checkpoint {b} failed: UNAVAILABLE: the daemon is shutting down (signal 15)" in log, log
    assert state_name(waits["a"].result(timeout=30).state) == "COMMITTED"
    st = waits["b"].result(timeout=30)
    assert state_name(st.state) == "FAILED" and st.error_code == du.CODE["UNAVAILABLE"], st
    assert st.error.startswith(
        "the daemon is shutting down (signal 15); unfinished checkpoints had shutdown_grace"), st
    channel.close()
    verify_checkpoint(a, TrainerSpec.of(2, mb=4), torch, workdir=tmp_path)
    assert data_files(b) == []
    assert not d.socket.exists()


@pytest.mark.parametrize("how", ["arena_idle_timeout", "daemon_restart"])
def test_long_lived_client_saves_again_after_its_arena_was_dropped(make_daemon, torch, tmp_path,
                                                                   how):
    """One client, two saves; between them the daemon drops the client's
    arena (idle timeout, or a restart). The client must notice (WaitArenaIdle:
    NOT_FOUND) and register a new arena. (Once broken: the daemon answered
    INVALID_ARGUMENT, and every later Save of the client failed.)"""
    d = make_daemon(arena_idle_timeout="1s")
    t = d.trainer("arena/step{i}", 0, 1, mb=0.25, saves=2, pause_between=True, stdin=True,
                  retries=50)
    assert t.next_json()["save"] == 0
    assert t.next_json()["state"] == "COMMITTED"
    assert t.next_json()["paused"] == 1
    if how == "arena_idle_timeout":
        du.poll(lambda: re.search(r"arena \d+ unmapped after", d.log()), 30,
                "the idle arena to be unmapped", on_timeout=d.log_tail)
    else:
        d.restart()
    t.send_line()
    rc = t.wait(60)
    last = t.lines[-1]
    assert rc == 0 and last["state"] == "COMMITTED", (t.lines, t.stderr, d.log_tail())
    verify_checkpoint(d.root / "arena" / "step1", TrainerSpec.of(1, mb=0.25), torch,
                      workdir=tmp_path)


def test_arena_ids_of_a_restarted_daemon_do_not_alias_old_ones(make_daemon, torch, tmp_path):
    d = make_daemon()
    a = d.trainer("alias/a{i}", 0, 1, mb=0.25, saves=2, pause_between=True, stdin=True,
                  retries=50)
    assert a.next_json()["save"] == 0
    assert a.next_json()["state"] == "COMMITTED"
    assert a.next_json()["paused"] == 1
    d.restart()
    # Another job's rank registers the first arena of the new daemon and
    # stays alive holding it.
    b = d.trainer("alias/b", 0, 1, mb=0.25, dtype="int16", step=99, hold_after_staged=True)
    b.next_json()
    assert state_name(d.wait_final(d.root / "alias" / "b").state) == "COMMITTED"
    a.send_line()
    rc = a.wait(60)
    if rc == 0 and a.lines[-1].get("state") == "COMMITTED":
        try:
            verify_checkpoint(d.root / "alias" / "a1", TrainerSpec.of(1, mb=0.25), torch,
                              workdir=tmp_path)
        except AssertionError as e:
            raise AssertionError(f"alias/a1 committed with wrong contents: {e}") from None
    else:
        # Refusing the stale arena cleanly would be acceptable too.
        assert rc != 0 and "save_error" in a.lines[-1], a.lines
