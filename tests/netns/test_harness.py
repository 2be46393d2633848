"""The namespace harness itself: nodes reach each other only through the
bridge, link_down cuts a node off and link_up heals it, every daemon serves
on its own address, and close() leaves no namespace, link or process."""
import json
import os
import signal
import subprocess
import sys

import pytest

import netns_cluster as nc


def _left(cid):
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    out += subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return [w for w in out.split() if cid in w]


def _skip_unless_netns():
    reason = nc.skip_reason()
    if reason:
        pytest.skip(reason)


def test_network_partition_and_cleanup(tmp_path):
    _skip_unless_netns()
    seen = nc.self_check(tmp_path / "check")
    assert seen["tcp_0_to_1"] and seen["tcp_1_to_0"] and not seen["tcp_after_link_down"]
    assert seen["tcp_after_link_up"] and seen["left_after_close"] == []


def test_daemons_peer_across_namespaces(make_cluster):
    c = make_cluster(2)
    for i in range(2):
        c.start_daemon(i)
    # Each daemon's peer service listens on its own node's address only.
    for i in range(2):
        log = c.log(i)
        assert c.peer_address(i) in log, c.log_tail(i)
    # Node 1's peer port is reachable from node 0 and not once node 1 is cut.
    probe = [sys.executable, "-c",
             "import socket,sys\n"
             f"try: socket.create_connection(('{c.node_ip(1)}',{nc.PEER_PORT}),1.0)\n"
             "except OSError as e: print(e); sys.exit(1)\n"]
    assert c.popen(0, probe).wait(20) == 0
    c.link_down(1)
    assert c.popen(0, probe).wait(20) != 0
    c.link_up(1)
    assert c.popen(0, probe).wait(20) == 0
    assert c.metric(0, "ckptd_serving") == 1.0, c.metrics(0)[:2000]  # /metrics answers
    c.sigstop(1)
    c.sigcont(1)
    c.wait_healthy(1, 10)
    assert c.stop_daemon(1) == 0, c.log_tail(1)
    pid = c.daemon_pid(0)
    assert c.kill(0) == -signal.SIGKILL
    assert c.daemon_pid(0) is None and not os.path.exists(f"/proc/{pid}/status")
    cid = c.id
    c.close()
    assert _left(cid) == []


def test_cli_up_and_down(tmp_path):
    _skip_unless_netns()
    cli = [sys.executable, nc.__file__]
    up = json.loads(subprocess.run(cli + ["up", "2", "--workdir", str(tmp_path / "w")],
                                   check=True, capture_output=True, text=True).stdout)
    state = str(tmp_path / "w" / "cluster.json")
    try:
        assert up["nodes"][1]["ip"].endswith(".2") and _left(up["id"])
        r = subprocess.run(cli + ["exec", "--state", state, "1", "--", "ip", "-o", "addr"],
                           capture_output=True, text=True, check=True)
        assert up["nodes"][1]["ip"] in r.stdout and up["nodes"][0]["ip"] not in r.stdout
    finally:
        subprocess.run(cli + ["down", "--state", state], check=True, capture_output=True)
    assert _left(up["id"]) == []
