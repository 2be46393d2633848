"""The ckptd Python package in multi-process jobs: real gloo process groups
(rank and world size from torch.distributed), one real daemon, Debian's
torch 1.13. Each rank is a pyclient_worker.py process."""
import json
import os
import re

import pytest

import pyclient_util

torch = pytest.importorskip("torch") if os.environ.get("CKPTD_REQUIRE_TORCH") != "1" else \
    __import__("torch")
pytestmark = pytest.mark.skipif(pyclient_util.asan_build(), reason=pyclient_util.ASAN_SKIP_REASON)


def job(scenario, phase, world, daemon, ckpt, out, tmp_path, extra=""):
    init = tmp_path / f"init-{scenario}-{phase}-{world}-{os.urandom(4).hex()}"
    return pyclient_util.run_workers(
        [[scenario, phase, r, world, init, daemon.socket, ckpt, out] + ([extra] if extra else [])
         for r in range(world)])


def test_replicated_model_and_adam_4_ranks(make_daemon, tmp_path, ckptctl):
    d = make_daemon()
    out = tmp_path / "out"
    out.mkdir()
    ckpt = str(d.root / "ddp" / "step_3")
    job("replicated", "save", 4, d, ckpt, out, tmp_path)
    # Replicated items are written once (DCP dedup), not once per rank.
    info = json.loads(ckptctl("status", ckpt, "--json", f"--socket={d.socket}").stdout)
    assert info["state"] == "COMMITTED"
    # (Without dedup the files would hold at least total_bytes; one copy is
    # total_bytes / 4 plus the zip framing of each small item.)
    assert info["file_bytes"] < info["total_bytes"] / 2, info
    ckptctl("verify", ckpt)
    job("replicated", "load", 4, d, ckpt, out, tmp_path)


def test_reshard_4_to_2_to_3_ranks(make_daemon, tmp_path):
    d = make_daemon()
    out = tmp_path / "out"
    out.mkdir()
    c4, c2 = str(d.root / "sh" / "w4"), str(d.root / "sh" / "w2")
    job("sharded", "save", 4, d, c4, out, tmp_path)
    job("sharded", "load", 2, d, c4, out, tmp_path, extra=c2)   # load 4 → 2, save as 2 ranks
    job("sharded", "load", 3, d, c2, out, tmp_path)             # load 2 → 3
    job("sharded", "load", 1, d, c4, out, tmp_path)             # and 4 → 1


def test_async_save_overlaps_training_without_tearing(make_daemon, tmp_path):
    # The daemon writes at 64 KiB/s, so writing the ~25 KiB of model and
    # Adam state lasts well past the staging: training steps run meanwhile.
    d = make_daemon(write_rate_limit="64K")
    out = tmp_path / "out"
    out.mkdir()
    outs = job("async", "save", 4, d, str(d.root / "async"), out, tmp_path)
    overlaps = [int(re.search(r"OVERLAP (\d+)", o).group(1)) for o in outs]
    assert max(overlaps) >= 2, outs


def test_preemption_signal_on_one_rank_saves_the_same_step_everywhere(make_daemon, tmp_path):
    d = make_daemon()
    out = tmp_path / "out"
    out.mkdir()
    outs = job("preempt", "save", 3, d, str(d.root / "pre"), out, tmp_path)
    steps = {int(re.search(r"PREEMPTED_AT (\d+)", o).group(1)) for o in outs}
    assert steps == {3}, outs
    assert (d.root / "pre" / "step_3" / ".metadata").exists()


def test_multinode_save_through_two_daemons_then_reshard(make_daemon, tmp_path):
    # Two daemons ("nodes") with peer services sharing one checkpoint root;
    # ranks 0-1 save through the first, 2-3 through the second. The ranks
    # find their cluster with ckptd.discover_cluster (one gloo all_gather);
    # the first daemon coordinates. The checkpoint is then loaded by 3 ranks.
    import socket as so
    shared = tmp_path / "shared"
    daemons = []
    for n in range(2):
        token = tmp_path / f"token{n}"
        token.write_text("pyclient-multinode-token-0123\n")
        os.chmod(token, 0o600)
        d = make_daemon(f"node{n}", start=False, peer_listen="127.0.0.1:0",
                        peer_advertise="127.0.0.1:0", peer_token_file=token,
                        peer_timeout="5s", peer_heartbeat="200ms")
        d.root = shared
        d.start()
        daemons.append(d)
    out = tmp_path / "out"
    out.mkdir()
    ckpt = str(shared / "mn" / "step_3")
    init = tmp_path / f"init-mn-{os.urandom(4).hex()}"
    outs = pyclient_util.run_workers(
        [["multinode", "save", r, 4, init, daemons[r // 2].socket, ckpt, out] for r in range(4)])
    assert "coordinator='127.0.0.1" in outs[2] and "num_nodes=2" in outs[2], outs[2]
    for d in daemons:
        for c in (ckpt, str(shared / "mn" / "mgr" / "step_4")):
            st = d.status(c)
            assert daemon_state(st) == "COMMITTED" and st.num_nodes == 2, st
    assert "coordinator: checkpoint" in daemons[0].log()
    job("sharded", "load", 3, daemons[0], ckpt, out, tmp_path)


def daemon_state(st):
    import daemon_util
    return daemon_util.state_name(st.state)
