"""Node loss with peer replicas (peer_replicas=1, docs/restore.md "Peer
replicas"): 6 ranks on 3 namespaced nodes (2 each, own daemon, memory tier
on) save a checkpoint through CheckpointManager(cluster="auto"); each node's
share is then copied into the next node's memory (node 0 -> 1 -> 2 -> 0).

Node 1 is then lost as a node is: its daemon SIGKILLed, its state and shm
wiped (a new host), and its data files removed from the checkpoint
directory (its local disk gone with it). A fresh daemon starts there; the
6 ranks restore through their daemons and every value is checked. Node 1's
share comes from node 2's memory: its daemon counts it in
ckptd_restore_bytes_total{source="peer"}, `ckptctl restores` shows it,
and it read nothing of those files from storage (they are gone).

Then node 2 is lost too (k + 1 = 2 nodes): node 1's share is nowhere, and a
restore fails with an error naming the missing file; the others' data is
untouched (their files verify).

Host torch 1.13 (ckptd.Shard boxes), no Debian roots needed. Prints the
figures (pytest -s).
"""
import json
import pathlib
import shutil
import subprocess
import sys
import time

import pytest

import netns_jobs as nj

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import netns_worker as nw  # noqa: E402

SAVE_AT = [0, 0, 1, 1, 2, 2]
ROW_BYTES = nw.BIG_COLS * 4 * len(nw.BIG_TENSORS)


def ckptctl(c, i, *args):
    r = subprocess.run([str(c.build_dir / "bin" / "ckptctl"), "--socket", str(c.socket(i)),
                        *args], capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


def wait_log(c, i, text, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in c.log(i):
            return
        time.sleep(0.1)
    raise AssertionError(f"node {i} never logged {text!r}\n{c.log_tail(i, 60)}")


def test_a_lost_nodes_share_restores_from_a_peers_memory(make_cluster, tmp_path):
    c = make_cluster(3, daemon_options={"memory_tier_bytes": "256M", "peer_replicas": "1"})
    peers = ",".join(c.peer_address(i) for i in range(3))
    for i in range(3):
        c.set_option(i, "restore_peers", peers)
        c.start_daemon(i)
    kw = dict(kind="big", base=c.shared / "big", refs=tmp_path / "refs",
              logdir=tmp_path / "logs", client_lib=c.build_dir / "client" / "libckptd_client.so")
    outs, skip = nj.run_job(c, "save", SAVE_AT, modes=["manager"], timeout=150, **kw)
    assert skip is None, skip
    ids = [0, 2, 4]  # each node's lowest global rank
    for i in range(3):
        nxt = (i + 1) % 3
        wait_log(c, i, f"is held in the memory of node {ids[nxt]} ({c.peer_address(nxt)})")
    step = sorted((c.shared / "big" / "manager").glob("step_*"))[-1]
    rc, out = ckptctl(c, 1, "list")
    assert rc == 0, out
    assert f"at node 4 ({c.peer_address(2)}) held" in out, out
    assert f"holds node 0 ({c.peer_address(0)})" in out, out

    # Node 1 lost: the daemon killed, the host replaced (state, shm and its
    # files on storage gone).
    c.kill(1)
    for sub in ("state", "shm"):
        d = c.node_dir(1) / sub
        shutil.rmtree(d)
        d.mkdir()
    lost = [step / f"__{r}_0.distcp" for r in (2, 3)]
    lost_bytes = sum(p.stat().st_size for p in lost)
    for p in lost:
        p.unlink()
    c.start_daemon(1)
    before = [c.metric(i, "ckptd_restore_bytes_total", source="peer") for i in range(3)]
    files_before = c.metric(1, "ckptd_restore_bytes_total", source="files")
    t0 = time.monotonic()
    outs, skip = nj.run_job(c, "load", SAVE_AT, modes=["ckptd@manager"], timeout=150, **kw)
    took = time.monotonic() - t0
    assert skip is None, skip
    assert len(nj.results(outs, "RESULT load")) == 6, outs
    peer = [c.metric(i, "ckptd_restore_bytes_total", source="peer") - before[i]
            for i in range(3)]
    files = c.metric(1, "ckptd_restore_bytes_total", source="files") - files_before
    a, b = nw.rows_of(6, 2)[0], nw.rows_of(6, 3)[1]
    need = (b - a) * ROW_BYTES
    print(f"node 1 replaced: its ranks' {need} B of shards came from peers' memory: "
          f"{peer[1]:.0f} B fetched (files of its share on storage: 0, {lost_bytes} B lost); "
          f"read from other files {files:.0f} B; peer bytes at nodes 0, 2: {peer[0]:.0f}, "
          f"{peer[2]:.0f}; restore of 6 ranks {took:.1f} s")
    assert peer[1] >= need, (peer, need)
    wait_log(c, 1, "are held in the memory of")
    rc, out = ckptctl(c, 1, "restores")
    assert rc == 0 and "FROM PEERS" in out, out

    # Node 2 (the holder of node 1's share) lost as well: a clear error.
    c.kill(2)
    c.start_daemon(2)
    with pytest.raises(AssertionError) as e:
        nj.run_job(c, "load", SAVE_AT, modes=["ckptd@manager"], timeout=120, **kw)
    assert "__2_0.distcp" in str(e.value) or "__3_0.distcp" in str(e.value), str(e.value)[-3000:]
    # The files that are left are as written.
    for r in (0, 1, 4, 5):
        assert (step / f"__{r}_0.distcp").exists()
