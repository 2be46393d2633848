"""Multi-node checkpoints with real daemon processes: 3 `ckptd` processes on
this machine (separate sockets, peer ports, shm and state directories), each
serving 2 `ckptd_trainer` ranks of one 6-rank job, all writing one shared
checkpoint root. The daemons talk over TCP with a shared token.

The contract checked in every failure case: either a complete
checkpoint that verifies and loads (torch 1.13 loads every payload), or no
`.metadata` and a clear error on every node within the configured timeout —
and the next checkpoint succeeds.
"""
import os
import signal
import time

import pytest

import daemon_util as du
from daemon_util import TrainerSpec, state_name, verify_checkpoint

# Release pass only: 8 multi-process scenarios (~1 min) whose daemon code
# the ASan pass also runs through multinode_test (ctest) and the
# single-node suites.
pytestmark = pytest.mark.once

NODES, PER_NODE = 3, 2
WORLD = NODES * PER_NODE
TOKEN = "pytest-multinode-shared-token-6f1c"
PEER = dict(peer_timeout="2s", peer_heartbeat="200ms", stage_timeout="6s",
            commit_timeout="5s")
MB = 0.25  # per rank


class Cluster:
    """NODES daemons; node n serves ranks [n*PER_NODE, (n+1)*PER_NODE)."""

    def __init__(self, make_daemon, tmp_path, tokens=None, flags=None):
        self.shared = tmp_path / "shared"
        self.shared.mkdir()
        self.daemons = []
        for n in range(NODES):
            token = tmp_path / f"token{n}"
            token.write_text((tokens or {}).get(n, TOKEN) + "\n")
            os.chmod(token, 0o600)
            d = make_daemon(f"node{n}", start=False, peer_listen="127.0.0.1:0",
                            peer_advertise="127.0.0.1:0", peer_token_file=token,
                            **PEER, **(flags or {}).get(n, {}))
            d.root = self.shared
            self.daemons.append(d)
        for d in self.daemons:
            d.start()

    def node_of(self, rank):
        return rank // PER_NODE

    def ranks(self, n):
        return list(range(n * PER_NODE, (n + 1) * PER_NODE))

    def start_save(self, ckpt, nodes=range(NODES), **flags):
        """Starts the trainer ranks of `nodes`; returns them."""
        out = []
        for n in nodes:
            for r in self.ranks(n):
                out.append(self.daemons[n].trainer(
                    ckpt, r, WORLD, mb=MB, coordinator=self.daemons[0].address,
                    local_ranks=",".join(map(str, self.ranks(n))), num_nodes=NODES,
                    timeout=60, **flags))
        return out

    def wait_trainers(self, trainers, timeout=90):
        for t in trainers:
            t.wait(timeout)
        return [t.result() for t in trainers]

    def dir(self, ckpt):
        return self.shared / ckpt

    def save(self, ckpt, **flags):
        return self.wait_trainers(self.start_save(ckpt, **flags))


@pytest.fixture
def cluster(make_daemon, tmp_path):
    return lambda **kw: Cluster(make_daemon, tmp_path, **kw)


def wait_writing(c, ckpt, n):
    """Node n has its plan and writes: its first rank's data file exists."""
    f = c.dir(ckpt) / f"__{c.ranks(n)[0]}_0.distcp"
    du.poll(lambda: f.exists(), 30, f"{f} being written",
            on_timeout=c.daemons[n].log_tail)


def assert_all_committed(results):
    for r in results:
        assert r["rc"] == 0 and r["last"].get("state") == "COMMITTED", (
            f"rank {r['rank']} exited {r['rc']}: last line {r['last']}\n"
            f"stderr: {r['stderr'][-3000:]}")


def assert_aborted_everywhere(c, ckpt, daemons, within, started, words=()):
    """No .metadata; every listed daemon reports FAILED/CANCELLED with an
    error, within `within` seconds of `started`."""
    for d in daemons:
        st = d.wait_final(c.dir(ckpt), timeout=within + 10)
        assert state_name(st.state) in ("FAILED", "CANCELLED"), (st, d.log_tail())
        assert st.error, st
        for w in words:
            assert w in st.error, (w, st.error)
    elapsed = time.monotonic() - started
    assert elapsed < within, f"aborted after {elapsed:.1f}s, configured bound {within}s"
    assert not (c.dir(ckpt) / ".metadata").exists()


def data_files(directory):
    """The .distcp files in `directory`; none once cleanup has removed the
    directory itself (a failed or cancelled checkpoint's directory goes
    too when the daemon created it: globbing a vanished directory raises)."""
    try:
        return [p for p in directory.iterdir() if p.name.endswith(".distcp")]
    except FileNotFoundError:
        return []


def assert_next_save_commits(c, torch, ckpt="job/next"):
    results = c.save(ckpt)
    assert_all_committed(results)
    verify_checkpoint(c.dir(ckpt), TrainerSpec.of(WORLD, mb=MB), torch)


def test_three_nodes_commit_one_checkpoint(cluster, torch):
    c = cluster()
    results = c.save("job/step1")
    assert_all_committed(results)
    items = verify_checkpoint(c.dir("job/step1"), TrainerSpec.of(WORLD, mb=MB), torch)
    # "embed" is replicated on all 6 ranks of 3 nodes: stored once.
    assert len(items["embed"]["chunks"]) == 1
    # Every node reports the global view; a participant names its coordinator.
    for n, d in enumerate(c.daemons):
        st = d.status(c.dir("job/step1"))
        assert state_name(st.state) == "COMMITTED"
        assert (st.num_nodes, st.nodes_prepared, st.local_ranks) == (NODES, NODES, PER_NODE)
        assert st.is_coordinator == (n == 0)
        assert st.ranks_staged == WORLD and st.total_bytes > st.local_total_bytes, st
    out = c.daemons[2].ckptctl("status", str(c.dir("job/step1"))).stdout
    assert "nodes" in out and c.daemons[0].address in out, out
    # The same items again: the plan comes from the coordinator's cache.
    assert_all_committed(c.save("job/step2"))
    assert "plan cache" in c.daemons[0].log()
    verify_checkpoint(c.dir("job/step2"), TrainerSpec.of(WORLD, mb=MB), torch)


def test_peer_killed_during_write(cluster, torch):
    c = cluster(flags={2: {"write_rate_limit": "64K"}})
    trainers = c.start_save("job/kw")
    wait_writing(c, "job/kw", 2)
    started = time.monotonic()
    c.daemons[2].kill()
    assert_aborted_everywhere(c, "job/kw", c.daemons[:2], within=10, started=started,
                              words=("node 4",))
    for r in c.wait_trainers(trainers[:4]):
        assert r["rc"] != 0, r
    c.daemons[2].flags.pop("write_rate_limit")
    c.daemons[2].start()  # recovery removes node 2's files
    assert "recovery" in c.daemons[2].log_since_start()
    assert_next_save_commits(c, torch)


def test_peer_killed_after_prepare_still_commits(cluster, torch):
    # Node 1 writes slowly; node 2 prepares (its files are durable), then dies.
    c = cluster(flags={1: {"write_rate_limit": "256K"}})
    trainers = c.start_save("job/kp")
    c.daemons[2].wait_state(c.dir("job/kp"), "COMMITTING", timeout=30)
    du.poll(lambda: c.daemons[0].status(c.dir("job/kp")).nodes_prepared >= 1
            if c.daemons[0].try_status(c.dir("job/kp")) else False, 10, "node 2 prepared")
    c.daemons[2].kill()
    st = c.daemons[0].wait_final(c.dir("job/kp"), timeout=60)
    assert state_name(st.state) == "COMMITTED", (st, c.daemons[0].log_tail())
    assert state_name(c.daemons[1].wait_final(c.dir("job/kp")).state) == "COMMITTED"
    for r in c.wait_trainers(trainers[:4]):
        assert r["rc"] == 0, r
    verify_checkpoint(c.dir("job/kp"), TrainerSpec.of(WORLD, mb=MB), torch)
    # Node 2 restarts: its journal entry finds .metadata, its files stay.
    c.daemons[2].start()
    assert "was committed before the daemon stopped" in c.daemons[2].log_since_start()
    verify_checkpoint(c.dir("job/kp"), TrainerSpec.of(WORLD, mb=MB), torch)


def test_peer_killed_around_prepare_is_all_or_nothing(cluster, torch):
    # Killed the moment its files are durable: its Prepare may or may not
    # have reached the coordinator. Either outcome is allowed, nothing else.
    c = cluster(flags={1: {"write_rate_limit": "256K"}})
    c.start_save("job/ka")
    d2 = c.daemons[2]
    du.poll(lambda: (s := d2.try_status(c.dir("job/ka"))) is not None and
            state_name(s.state) in ("COMMITTING", "COMMITTED"), 30, "node 2 durable",
            interval=0.001)
    d2.kill()
    st = c.daemons[0].wait_final(c.dir("job/ka"), timeout=60)
    if state_name(st.state) == "COMMITTED":
        verify_checkpoint(c.dir("job/ka"), TrainerSpec.of(WORLD, mb=MB), torch)
    else:
        assert not (c.dir("job/ka") / ".metadata").exists()
        assert state_name(c.daemons[1].wait_final(c.dir("job/ka")).state) == "FAILED"
    d2.start()
    assert_next_save_commits(c, torch)


def test_peer_hung_with_sigstop(cluster, torch):
    c = cluster(flags={2: {"write_rate_limit": "64K"}})
    c.start_save("job/hung")
    d2 = c.daemons[2]
    wait_writing(c, "job/hung", 2)
    started = time.monotonic()
    os.kill(d2.proc.pid, signal.SIGSTOP)
    try:
        assert_aborted_everywhere(c, "job/hung", c.daemons[:2], within=10, started=started,
                                  words=("not heard from",))
    finally:
        os.kill(d2.proc.pid, signal.SIGCONT)
    # Woken up, node 2 learns the abort and removes its files.
    st = d2.wait_final(c.dir("job/hung"), timeout=20)
    assert state_name(st.state) == "FAILED", st
    du.poll(lambda: not any(p.name.startswith(("__4_", "__5_"))
                            for p in data_files(c.dir("job/hung"))), 20,
            "node 2's files removed")
    assert not (c.dir("job/hung") / ".metadata").exists()
    d2.stop()
    d2.flags.pop("write_rate_limit")
    d2.start()
    assert_next_save_commits(c, torch)


def test_coordinator_killed(cluster, torch):
    c = cluster(flags={0: {"write_rate_limit": "64K"}})
    c.start_save("job/ck")
    wait_writing(c, "job/ck", 0)
    started = time.monotonic()
    c.daemons[0].kill()
    # A node that had prepared waits until the coordinator can no longer
    # commit: commit_timeout (5s) + peer_timeout (2s) after its prepare.
    assert_aborted_everywhere(c, "job/ck", c.daemons[1:], within=12, started=started,
                              words=(c.daemons[0].address,))
    c.daemons[0].flags.pop("write_rate_limit")
    c.daemons[0].start()
    assert "recovery" in c.daemons[0].log_since_start()
    # (Each node removes its files once its last call to the dead
    # coordinator has returned.)
    du.poll(lambda: not data_files(c.dir("job/ck")), 20, "the data files removed",
            on_timeout=lambda: str(data_files(c.dir("job/ck"))))
    assert_next_save_commits(c, torch)


def test_bad_token(cluster, torch):
    c = cluster(tokens={2: "a-different-token-of-node-two"})
    started = time.monotonic()
    results = c.save("job/tok")
    for r in results:
        assert r["rc"] != 0, r
    bad = [r for r in results if r["rank"] in c.ranks(2)]
    assert all("UNAUTHENTICATED" in str(r["last"]) or "token" in str(r["last"]) for r in bad), bad
    assert_aborted_everywhere(c, "job/tok", c.daemons, within=6 + 10, started=started)
    assert "wrong token" in c.daemons[0].log()
    # Fixed token: node 2 restarts, the next checkpoint commits.
    (c.daemons[2].base.parent / "token2").write_text(TOKEN + "\n")
    c.daemons[2].restart()
    assert_next_save_commits(c, torch)


def test_cancel_from_the_cli_on_any_node(cluster, torch):
    c = cluster(flags={n: {"write_rate_limit": "16K"} for n in range(NODES)})
    c.start_save("job/cx")
    for n in range(NODES):
        wait_writing(c, "job/cx", n)
    out = c.daemons[1].ckptctl("cancel", str(c.dir("job/cx")), "--reason", "operator on node 1",
                               check=False)
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr, c.daemons[1].log_tail())
    for d in c.daemons:
        st = d.wait_final(c.dir("job/cx"), timeout=15)
        assert state_name(st.state) == "CANCELLED", (st, d.log_tail())
        assert "operator on node 1" in st.error
    du.poll(lambda: not data_files(c.dir("job/cx")), 20, "data files removed")
    assert not (c.dir("job/cx") / ".metadata").exists()
