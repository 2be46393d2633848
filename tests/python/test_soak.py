"""Bounded soak against the real daemon: 8 long-lived trainer
processes (build/tools/ckptd_trainer, one client each) × 20 saves through a
128 MiB staging budget, with failing saves interleaved in every round:

  * bad paths: outside the checkpoint roots, `..` escaping them, a control
    character in the checkpoint id, a control character in the job name
    (INVALID_ARGUMENT / PERMISSION_DENIED);
  * a cancel mid-save (rank 0 of 2 staged, rank 1 not yet there), by
    `ckptctl cancel` on even rounds and by the Python client's
    `ckptd.cancel` on odd rounds, then a retry of the same directory right
    after (what ckptd.CheckpointManager does), which must commit;
  * an overwrite refusal: a save into the previous round's committed
    directory without overwrite (FAILED_PRECONDITION), leaving it intact.

Asserted: every save reaches a final state within SAVE_BOUND_S; every
committed checkpoint passes `ckptctl verify` and loads byte-exact with
torch 1.13 (daemon_util.verify_checkpoint); the daemon's RSS
(/proc/PID/status VmRSS, sampled after each round) stays flat (the last
round within RSS_SLACK of round 2's); and SIGTERM, with a half-staged
checkpoint and its client still connected, makes the daemon exit 0 within
its drain time (60 s, fixed in daemon/daemon_main.cc) plus a small slack.
The figures are printed (pytest -s shows them).
"""
import os
import pathlib
import signal
import subprocess
import threading
import time

import pytest

import daemon_util as du
import pyclient_util
from daemon_util import TrainerSpec, state_name, verify_checkpoint

# Long and multi-process: the release pass only (scripts/test.sh).
pytestmark = pytest.mark.once

TRAINERS = 8          # processes; two 4-rank checkpoints per round
RANKS_PER_CKPT = 4
ROUNDS = 20
MB_PER_RANK = 8       # MiB of sharded tensors per rank
SAVE_BOUND_S = 60     # every save reaches a final state within this
RSS_SLACK = 64 << 20
DRAIN_S = 60          # daemon_main.cc: grace for checkpoints whose ranks are all staged
SIGTERM_SLACK_S = 10


def vmrss(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.tried = 0
        self.committed = 0
        self.failed_as_expected = 0
        self.unexpected = []
        self.by_kind = {}  # expected failures by kind

    def add(self, committed=0, expected_fail=0, unexpected=None, kind=None):
        """Counts checkpoints: committed ones, and failed saves (one per
        checkpoint attempt, whatever its number of ranks)."""
        with self.lock:
            self.tried += committed + expected_fail + (1 if unexpected else 0)
            self.committed += committed
            self.failed_as_expected += expected_fail
            if expected_fail:
                self.by_kind[kind] = self.by_kind.get(kind, 0) + expected_fail
            if unexpected:
                self.unexpected.append(unexpected)


def final_line(t, what):
    """The trainer's line after its save's final state (or its save_error)."""
    t0 = time.monotonic()
    doc = t.next_json(timeout=SAVE_BOUND_S)
    if "save_error" in doc or "state" in doc or "wait_error" in doc:
        return doc, time.monotonic() - t0
    doc = t.next_json(timeout=SAVE_BOUND_S - (time.monotonic() - t0))
    return doc, time.monotonic() - t0


def expect_refused(d, tally, what, checkpoint, codes, job=None, world=1, ranks=(0,)):
    """Runs ranks of a save that must fail with one of `codes` (names)."""
    flags = dict(mb=0.25, timeout=SAVE_BOUND_S)
    if job is not None:
        flags["job"] = job
    trainers = [d.trainer(checkpoint, r, world, **flags) for r in ranks]
    refused = 0
    for t in trainers:
        try:
            rc = t.wait(SAVE_BOUND_S)
        except AssertionError as e:
            tally.add(unexpected=f"{what}: no final state within {SAVE_BOUND_S}s: {e}")
            continue
        last = t.result()["last"]
        code = last.get("code", last.get("error_code"))
        want = [du.CODE[c] for c in codes]
        if rc == 1 and code in want:
            refused += 1
        else:
            tally.add(unexpected=f"{what} ({checkpoint!r}): rc {rc}, want {codes}: {last} "
                                 f"{t.stderr}")
    if refused == len(trainers):
        tally.add(expected_fail=1, kind=what)


def cancel_and_retry(d, tally, rnd, torch, tmp_path, committed_dirs):
    """Rank 0 of 2 staged; cancel; both ranks save the same directory again."""
    ck = f"soak/c/r{rnd}"
    ckdir = d.root / "soak" / "c" / f"r{rnd}"
    flags = dict(mb=0.5, timeout=SAVE_BOUND_S, step=rnd)
    r0 = d.trainer(ck, 0, 2, **flags)
    try:
        staged = r0.next_json(timeout=SAVE_BOUND_S)
        assert "checkpoint" in staged and "state" not in staged, staged
        d.poll_status(ckdir, lambda st: st.ranks_staged == 1, SAVE_BOUND_S, "rank 0 staged")
        if rnd % 2 == 0:
            d.ckptctl("cancel", str(ckdir))
        else:
            pyclient_util.setup_import()
            import ckptd
            ckptd.cancel(str(ckdir), reason="soak: client cancel", socket=str(d.socket))
        rc = r0.wait(SAVE_BOUND_S)
        last = r0.result()["last"]
        if rc == 1 and last.get("state") == "CANCELLED":
            tally.add(expected_fail=1,
                      kind="cancel (ckptctl)" if rnd % 2 == 0 else "cancel (client)")
        else:
            tally.add(unexpected=f"cancel {ck}: rc {rc}, {last}, {r0.stderr}")
    except AssertionError as e:
        tally.add(unexpected=f"cancel {ck}: {e}")
        r0.kill()
    # The retry, right away, into the same directory.
    retry = [d.trainer(ck, r, 2, **flags) for r in range(2)]
    for t in retry:
        try:
            t.wait(SAVE_BOUND_S)
        except AssertionError as e:
            tally.add(unexpected=f"retry after cancel {ck}: {e}")
            return
    results = [t.result() for t in retry]
    if all(r["rc"] == 0 and r["last"].get("state") == "COMMITTED" for r in results):
        tally.add(committed=1)
        committed_dirs.append((ckdir, TrainerSpec.of(2, **flags)))
    else:
        tally.add(unexpected=f"retry after cancel {ck}: {[r['last'] for r in results]} "
                             f"{[r['stderr'] for r in results]}")


def test_soak(make_daemon, torch, tmp_path):
    d = make_daemon(staging_budget="128M", stage_timeout="30s")
    outside = tmp_path / "outside"
    outside.mkdir()
    tally = Tally()
    lost = []
    rss = []
    t_start = time.monotonic()

    flags = dict(mb=MB_PER_RANK, saves=ROUNDS, pause_between=True, timeout=SAVE_BOUND_S)
    jobs = ["a", "b"]
    trainers = []
    for k in range(TRAINERS):
        job = jobs[k // RANKS_PER_CKPT]
        trainers.append(d.trainer(f"soak/{job}/step{{i}}", k % RANKS_PER_CKPT, RANKS_PER_CKPT,
                                  stdin=True, job=f"soak-{job}", **flags))
    spec = TrainerSpec.of(RANKS_PER_CKPT, mb=MB_PER_RANK)
    prev_committed = None
    for rnd in range(ROUNDS):
        if rnd > 0:
            for t in trainers:
                doc = t.next_json(timeout=SAVE_BOUND_S)
                assert doc.get("paused") == rnd, doc
            for t in trainers:
                t.send_line()
        side = []
        committed_dirs = []
        # Failing saves, concurrently with the round's good ones.
        bad = [
            ("outside the roots", str(outside / f"r{rnd}"), ["PERMISSION_DENIED", "INVALID_ARGUMENT"],
             None),
            ("'..' escape", f"soak/../../escape{rnd}", ["PERMISSION_DENIED", "INVALID_ARGUMENT"],
             None),
            ("control character in the id", f"soak/bad\x01id{rnd}", ["INVALID_ARGUMENT"], None),
            ("control character in the job", f"soak/badjob{rnd}", ["INVALID_ARGUMENT"],
             f"job\x07{rnd}"),
        ]
        for what, ck, codes, job in bad:
            side.append(threading.Thread(target=expect_refused,
                                         args=(d, tally, what, ck, codes, job)))
        if prev_committed is not None:
            side.append(threading.Thread(
                target=expect_refused,
                args=(d, tally, "overwrite refusal", f"soak/c/r{rnd - 1}", ["FAILED_PRECONDITION"]),
                kwargs=dict(world=2, ranks=(0, 1))))
        for th in side:
            th.start()
        cancel_and_retry(d, tally, rnd, torch, tmp_path, committed_dirs)
        for t in trainers:
            try:
                doc, _ = final_line(t, f"round {rnd}")
            except AssertionError as e:
                tally.add(unexpected=f"round {rnd} rank {t.rank}: {e}")
                continue
            if doc.get("state") != "COMMITTED":
                tally.add(unexpected=f"round {rnd} trainer rank {t.rank}: {doc} {t.stderr}")
        for job in jobs:
            ckdir = d.root / "soak" / job / f"step{rnd}"
            st = d.try_status(ckdir)
            if st is not None and state_name(st.state) == "COMMITTED":
                tally.add(committed=1)
                committed_dirs.append((ckdir, spec))
            else:
                tally.add(unexpected=f"{ckdir}: {st}")
        for th in side:
            th.join(SAVE_BOUND_S * 3)
            assert not th.is_alive(), f"round {rnd}: a failing save did not finish"
        # The overwrite refusal left the previous round's retry intact.
        if prev_committed is not None:
            committed_dirs.append(prev_committed)
        for ckdir, s in committed_dirs:
            try:
                verify_checkpoint(ckdir, s, torch, convert=False)
            except AssertionError as e:
                lost.append(f"{ckdir}: {e}")
        prev_committed = next(((c, s) for c, s in committed_dirs if "/c/" in str(c)), None)
        rss.append(vmrss(d.proc.pid))
        # Nothing of a refused save is left behind.
        assert not (outside / f"r{rnd}").exists()
    for t in trainers:
        assert t.wait(SAVE_BOUND_S) == 0, t.result()
    soak_s = time.monotonic() - t_start

    # SIGTERM with a half-staged checkpoint (rank 0 of 2) and its client
    # still connected, and a fully staged 4-rank one (96 MiB) being written:
    # the daemon aborts the first, finishes the second and exits 0 within
    # its drain.
    r0 = d.trainer("soak/term", 0, 2, mb=0.5, timeout=SAVE_BOUND_S)
    r0.next_json(timeout=SAVE_BOUND_S)
    d.poll_status(d.root / "soak" / "term", lambda st: st.ranks_staged == 1, 30, "rank 0 staged")
    drain_flags = dict(mb=24, wait=False, step=99)
    drain = [d.trainer("soak/drain", r, RANKS_PER_CKPT, **drain_flags)
             for r in range(RANKS_PER_CKPT)]
    for t in drain:
        assert t.wait(SAVE_BOUND_S) == 0, t.result()  # --no-wait: exits once staged
    at_term = state_name(d.status(d.root / "soak" / "drain").state)
    d._close_channel()
    t0 = time.monotonic()
    d.proc.send_signal(signal.SIGTERM)
    try:
        rc = d.proc.wait(timeout=DRAIN_S + SIGTERM_SLACK_S)
    except subprocess.TimeoutExpired:
        rc = None
    term_s = time.monotonic() - t0
    r0.wait(SAVE_BOUND_S)
    term_last = r0.result()["last"]
    drain_state = "COMMITTED" if (d.root / "soak" / "drain" / ".metadata").exists() else "lost"

    mib = [round(x / (1 << 20), 1) for x in rss]
    print(f"\nsoak: {TRAINERS} trainers x {ROUNDS} saves, {MB_PER_RANK} MiB/rank, 128 MiB budget, "
          f"{soak_s:.1f} s")
    print(f"checkpoint saves tried {tally.tried}: committed {tally.committed} ({TRAINERS} "
          f"trainers' {2 * ROUNDS} + {ROUNDS} retries after a cancel), failed as expected "
          f"{tally.failed_as_expected} {tally.by_kind}, unexpected failures "
          f"{len(tally.unexpected)}, data lost {len(lost)}")
    print(f"daemon VmRSS after each round (MiB): {mib}")
    print(f"SIGTERM -> exit {rc} in {term_s:.2f} s (drain {DRAIN_S} s); fully staged "
          f"checkpoint: {at_term} at SIGTERM, {drain_state} after; half-staged one's rank 0: {term_last}")
    assert not tally.unexpected, "\n".join(tally.unexpected[:20]) + "\n" + d.log_tail()
    assert not lost, "\n".join(lost[:10])
    assert rss[-1] <= rss[1] + RSS_SLACK, f"daemon RSS grew: {mib} MiB"
    assert rc == 0, (f"ckptd did not exit 0 within {DRAIN_S + SIGTERM_SLACK_S}s of SIGTERM "
                     f"(rc {rc}, {term_s:.1f}s)\n{d.log_tail()}")
    assert term_s <= DRAIN_S + SIGTERM_SLACK_S
    # The half-staged checkpoint was aborted (its rank told so, not left
    # hanging); the fully staged one was finished during the drain.
    assert term_last.get("state") in ("FAILED", "CANCELLED") or "wait_error" in term_last, \
        term_last
    assert drain_state == "COMMITTED", d.log_tail()
    verify_checkpoint(d.root / "soak" / "drain", TrainerSpec.of(RANKS_PER_CKPT, **drain_flags),
                      torch, convert=False)
