"""torch 2.x gloo jobs across network namespaces: every node has its own
network stack, address and daemon (tests/testing/netns_cluster.py), every
rank runs in its node's namespace inside a Debian root (torch 2.14: sid,
2.6: trixie), the process group meets at node 0's address and gloo crosses
the bridge. Each rank reaches its own node's daemon through $CKPTD_SOCKET;
nothing names the cluster (CheckpointManager(cluster="auto"),
ckptd.discover_cluster(), ckptd.StorageWriter(path) with no argument).

FSDP2 (fully_shard on a CPU mesh) + Adam, 4 ranks, one save job and one
load job a case (the process start and FSDP2 set-up are most of the cost):
  * 3 nodes (2 + 1 + 1 ranks): saved by CheckpointManager(cluster="auto")
    and by ckptd.save(cluster=discover_cluster()); loaded resharded into 2
    ranks on 2 nodes by stock dcp.load (FileSystemReader) and by ckptd.load
    through the daemons, every value bit-exact against the saving ranks'
    own pieces;
  * ckptd.StorageWriter: dcp.save, dcp.async_save with the thread and the
    process executor, and dcp.save with compression="zstd" (read by stock
    FileSystemReader), across 2 (2 + 2) and 3 nodes, loaded by stock
    dcp.load into 2 ranks;
  * torch 2.6: CheckpointManager and StorageWriter's dcp.save over 3 nodes
    (the rest is the same ckptd code);
  * peer replicas: a node lost with its files after dcp.save through
    StorageWriter; dcp.load through ckptd.StorageReader and ckptd.load read
    its share from the other node's memory.

Skipped with the reason without root / `ip netns` or a root. Each job's
ranks are killed after a bounded time with their logs in the failure.
"""
import pytest

import netns_jobs as nj

JOB_TIMEOUT = 200
TWO, THREE = [0, 0, 1, 1], [0, 0, 1, 2]
LOAD_2 = [0, 1]  # 2 ranks, one on each of nodes 0 and 1


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    import netns_cluster
    if netns_cluster.skip_reason():
        pytest.skip(netns_cluster.skip_reason())
    import os
    import pathlib
    build = pathlib.Path(os.environ.get("CKPTD_BUILD_DIR") or nj.REPO / "build")
    if not (build / "tools" / "interop_tool").exists():
        pytest.fail(f"{build}/tools/interop_tool is not built (the bundle needs it)")
    return nj.make_bundle(build, build / "netns-bundle")


def torch_root(version):
    root, why = nj.root_status(version)
    if root is None:
        pytest.skip(why)
    return root


def save_and_load(make_cluster, tmp_path, bundle, root, save_at, saves, loads,
                  **cluster_kw):
    c = make_cluster(max(save_at) + 1, **cluster_kw)
    for i in range(c.n):
        c.start_daemon(i)
    kw = dict(kind="fsdp2", base=c.shared / "ck", refs=tmp_path / "refs",
              logdir=tmp_path / "logs", root=root,
              client_lib=bundle / "client" / "libckptd_client.so")
    outs, skip = nj.run_job(c, "save", save_at, modes=saves, timeout=JOB_TIMEOUT, **kw)
    if skip:
        pytest.skip(skip)
    for m in saves:
        assert len([ln for ln in nj.results(outs, f"RESULT save {m} ")]) == len(save_at), m
    outs, skip = nj.run_job(c, "load", LOAD_2, modes=loads, timeout=JOB_TIMEOUT, **kw)
    if skip:
        pytest.skip(skip)
    for m in loads:
        assert len(nj.results(outs, f"RESULT load {m} ")) == len(LOAD_2), m
    for ln in nj.results(outs, "RESULT"):
        print(ln)
    return c


def test_fsdp2_manager_and_save_three_nodes(make_cluster, tmp_path, bundle):
    """CheckpointManager(cluster="auto") and ckptd.save(cluster=
    discover_cluster()) over 3 namespaces (2 + 1 + 1 ranks), loaded into 2
    ranks by stock dcp.load and by ckptd.load through the daemons."""
    save_and_load(make_cluster, tmp_path, bundle, torch_root("2.14"), THREE,
                  ["manager", "save"], ["dcp@manager", "dcp@save", "ckptd@save"])


WRITER_SAVES = ["writer-save", "writer-async", "writer-process", "writer-zstd"]


@pytest.mark.parametrize("nodes", [2, 3])
def test_fsdp2_storage_writer_across_nodes(make_cluster, tmp_path, bundle, nodes):
    """dcp.save / dcp.async_save (thread, process) / dcp.save with zstd
    through ckptd.StorageWriter(path), no cluster argument, over 2 (2 + 2)
    and 3 (2 + 1 + 1) namespaces; stock dcp.load into 2 ranks."""
    save_and_load(make_cluster, tmp_path, bundle, torch_root("2.14"),
                  TWO if nodes == 2 else THREE, WRITER_SAVES,
                  [f"dcp@{m}" for m in WRITER_SAVES])


def test_torch26_three_nodes(make_cluster, tmp_path, bundle):
    """torch 2.6: CheckpointManager(cluster="auto") and dcp.save through
    ckptd.StorageWriter over 3 namespaces, stock dcp.load into 2 ranks."""
    save_and_load(make_cluster, tmp_path, bundle, torch_root("2.6"), THREE,
                  ["manager", "writer-save"], ["dcp@manager", "dcp@writer-save"])


def test_fsdp2_lost_node_restores_from_a_peers_memory(make_cluster, tmp_path, bundle):
    """torch 2.14, peer_replicas=1 over 2 namespaces (2 + 2 ranks): dcp.save
    through ckptd.StorageWriter; node 1 is then lost with its files (daemon
    SIGKILLed, state and shm wiped, __2_0/__3_0.distcp removed) and a fresh
    daemon starts there; 2 ranks (one per node) load resharded through the
    daemons with dcp.load(storage_reader=ckptd.StorageReader) and
    ckptd.load, bit-exact: the lost files come from node 0's memory (its
    replica of node 1's share), counted as source="peer" on node 1."""
    import shutil
    import time
    root = torch_root("2.14")
    c = make_cluster(2, daemon_options={"memory_tier_bytes": "256M", "peer_replicas": "1"})
    peers = ",".join(c.peer_address(i) for i in range(2))
    for i in range(2):
        c.set_option(i, "restore_peers", peers)
        c.start_daemon(i)
    kw = dict(kind="fsdp2", base=c.shared / "ck", refs=tmp_path / "refs",
              logdir=tmp_path / "logs", root=root,
              client_lib=bundle / "client" / "libckptd_client.so")
    outs, skip = nj.run_job(c, "save", TWO, modes=["writer-save"], timeout=JOB_TIMEOUT, **kw)
    if skip:
        pytest.skip(skip)
    deadline = time.monotonic() + 60
    while "is held in the memory of node 0" not in c.log(1):
        assert time.monotonic() < deadline, c.log_tail(1)
        time.sleep(0.1)
    c.kill(1)
    for sub in ("state", "shm"):
        shutil.rmtree(c.node_dir(1) / sub)
        (c.node_dir(1) / sub).mkdir()
    for r in (2, 3):
        (c.shared / "ck" / "writer-save" / f"__{r}_0.distcp").unlink()
    c.start_daemon(1)
    before = c.metric(1, "ckptd_restore_bytes_total", source="peer")
    loads = ["reader@writer-save", "ckptd@writer-save"]
    outs, skip = nj.run_job(c, "load", LOAD_2, modes=loads, timeout=JOB_TIMEOUT, **kw)
    if skip:
        pytest.skip(skip)
    for m in loads:
        assert len(nj.results(outs, f"RESULT load {m} ")) == len(LOAD_2), m
    assert c.metric(1, "ckptd_restore_bytes_total", source="peer") > before, c.log_tail(1)
