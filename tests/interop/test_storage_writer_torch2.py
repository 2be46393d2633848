"""ckptd.StorageWriter under stock dcp.save / dcp.async_save (torch >= 2.4):

  * no process group: dcp.save and dcp.async_save of a model, AdamW and
    extra values through a real daemon load equal with stock
    FileSystemReader and with ckptd.StorageReader; the `.metadata` is the
    one DCP built (planner_data, storage_meta of this save) with
    storage_data where the daemon wrote; async_save returns once the
    daemon holds the bytes (the tensors may change at once);
  * 4 gloo ranks (DTensor, FSDP2) + Adam through get_state_dict save with
    dcp.save and dcp.async_save through ckptd.StorageWriter and load
    resharded into 2 and 3 ranks with stock FileSystemReader and with
    ckptd.StorageReader (pyclient_dist_worker.py); also dcp.async_save
    with DCP's process-based executor (AsyncCheckpointerType.PROCESS,
    torch >= 2.7), loaded resharded into 3;
  * a save of another user's / an unknown checkpoint, a save whose finish
    never comes: precise errors, nothing committed.
  * across nodes: two daemons with peer services and one shared root,
    ranks 0-1 on daemon A and 2-3 on daemon B (each rank's CKPTD_SOCKET),
    ckptd.StorageWriter / StorageReader with no cluster and no socket:
    dcp.save, dcp.async_save (thread and process executors, background
    staging) and zstd commit one checkpoint, loaded bit-exact resharded
    into 3 ranks (A, A, B) by stock dcp.load, and by ckptd.StorageReader in
    each node's restore group.

Skipped with the reason where torch >= 2.4 is not importable.
"""
import os
import pathlib
import pickle
import re
import time
import warnings

import pytest

import interop_common as ic

torch, _REASON = ic.torch_status()
pytestmark = pytest.mark.skipif(torch is None, reason=_REASON or "")
if torch is not None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    import pyclient_dist_worker as pw
    pw.setup_ckptd_import()
    import ckptd
    from test_storage_reader_torch2 import assert_same, load_with, state, trained


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = pw.start_daemon(tmp_path_factory.mktemp("writer-daemon"))
    yield d
    log = d.log_tail()
    alive = pw.stop_daemon(d)
    assert alive, f"the daemon died during the tests\n{log}"


def writer(d, path, **kw):
    return ckptd.StorageWriter(path, socket=str(d.socket), **kw)


def check_loads(path, want):
    assert_same(want, load_with(FileSystemReader(str(path))))
    assert_same(want, load_with(ckptd.StorageReader(path)))


def test_dcp_save_through_the_daemon(daemon):
    ck = pathlib.Path(daemon.root) / "save"
    model, optim = trained(1)
    want = state(model, optim, 41)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(want, storage_writer=writer(daemon, ck))
    check_loads(ck, want)
    st = ckptd.status(ck, socket=str(daemon.socket))
    assert st.state == "COMMITTED", st
    # DCP's own metadata, as given: planner_data and this save's storage_meta.
    with open(ck / ".metadata", "rb") as f:
        md = pickle.load(f)
    assert md.planner_data["model.0.weight"] == ("model", "0.weight")
    if hasattr(md, "storage_meta") and md.storage_meta is not None:
        assert str(md.storage_meta.checkpoint_id) == str(ck) and md.storage_meta.save_id
    names = sorted(p.name for p in ck.iterdir())
    assert names == [".metadata", "__0_0.distcp"], names
    # Saving again replaces it (overwrite=True, as FileSystemWriter).
    model2, optim2 = trained(2)
    want2 = state(model2, optim2, 42)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(want2, storage_writer=writer(daemon, ck))
    check_loads(ck, want2)


def test_dcp_async_save_returns_once_the_daemon_holds_the_bytes(daemon):
    ck = pathlib.Path(daemon.root) / "async"
    model, optim = trained(3)
    live = state(model, optim, 7)
    want = state(*trained(3), 7)  # the same values, kept aside
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fut = dcp.async_save(live, storage_writer=writer(daemon, ck))
        # The trainer goes on at once: the checkpoint keeps the old values.
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1000.0)
        live["extra"]["table"].zero_()
        fut.result(timeout=120)
    check_loads(ck, want)


def test_background_staging_returns_at_once(daemon):
    """background_staging=True (torch >= 2.9): async_save returns an
    AsyncSaveResponse before the bytes are staged; once staging_completion
    resolves the tensors may change, and the checkpoint holds the old ones.
    Older torch refuses it at construction."""
    from ckptd._writer import _stage_may_return_a_future
    ck = pathlib.Path(daemon.root) / "background"
    if not _stage_may_return_a_future():
        with pytest.raises(ckptd.InvalidArgument, match="torch >= 2.9"):
            writer(daemon, ck, background_staging=True)
        return
    model, optim = trained(4)
    live = state(model, optim, 9)
    want = state(*trained(4), 9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resp = dcp.async_save(live, storage_writer=writer(daemon, ck, background_staging=True))
        resp.staging_completion.result(timeout=120)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(-3.0)
        resp.upload_completion.result(timeout=120)
    check_loads(ck, want)


def test_zstd_compressed_through_the_writer(daemon):
    """StorageWriter(compression="zstd") and ckptd.save(compression=...):
    the daemon compresses every payload; stock FileSystemReader of torch >=
    2.7 (which knows the "stream.zstd/1" transform) and ckptd.StorageReader
    load both equal. Without the zstandard or pyzstd module (the GPU
    machine's torch 2.11) stock cannot decode them: it must refuse with the
    module's name, and ckptd.StorageReader, which needs neither, loads equal.
    Older torch cannot describe them: the writer refuses at once."""
    from ckptd._writer import _describes_transforms
    ck = pathlib.Path(daemon.root) / "zstd"
    if not _describes_transforms():
        with pytest.raises(ckptd.InvalidArgument, match="torch >= 2.7"):
            writer(daemon, ck, compression="zstd")
        return
    model, optim = trained(6)
    want = state(model, optim, 11)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(want, storage_writer=writer(daemon, ck, compression="zstd"))
    with open(ck / ".metadata", "rb") as f:
        md = pickle.load(f)
    infos = list(md.storage_data.values())
    assert infos and all(i.transform_descriptors == ["stream.zstd/1"] for i in infos), infos[:3]
    # ckptd.save's own .metadata names the transform the same way.
    ours = pathlib.Path(daemon.root) / "zstd-ckptd"
    st = ckptd.save(want, ours, socket=str(daemon.socket), compression="zstd:1")
    assert st.state == "COMMITTED", st
    stock_decodes = ic.stock_zstd()[0] is not None
    for path in (ck, ours):
        if stock_decodes:
            check_loads(path, want)
            continue
        with pytest.raises(BaseException, match="zstandard"):  # DCP wraps it
            load_with(FileSystemReader(str(path)))
        assert_same(want, load_with(ckptd.StorageReader(path)))


def test_another_checkpoint_id_after_the_stage(daemon):
    """async_save stages for the writer's path. torch 2.7+ stages before it
    resets the writer to async_save's checkpoint_id: the bytes cannot move,
    and the save fails saying so (the staged attempt is cancelled); older
    torch resets first and saves there."""
    ck = pathlib.Path(daemon.root) / "staged-here"
    other = pathlib.Path(str(ck) + "-other")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            dcp.async_save({"w": torch.ones(4)}, checkpoint_id=str(other),
                           storage_writer=writer(daemon, ck)).result(timeout=120)
            refused = None
        except BaseException as e:  # DCP's CheckpointException is one
            refused = f"{e!r} {e}"
    if refused is None:
        assert (other / ".metadata").exists() and not (ck / ".metadata").exists()
        return
    assert "staged for" in refused and "give the path" in refused, refused
    assert not (other / ".metadata").exists() and not (ck / ".metadata").exists()
    st = ckptd.client(str(daemon.socket)).wait(str(ck), 60)
    assert st["state"] == "CANCELLED", st


def test_finish_that_never_comes_fails_the_checkpoint(daemon):
    """A save whose DCP coordinator never calls finish: the daemon gives up
    after metadata_timeout, with the reason, and removes the files."""
    ck = pathlib.Path(daemon.root) / "orphan"
    w = writer(daemon, ck, metadata_timeout=1.0)
    w.reset()
    w.stage({"w": torch.arange(10.0)})
    st = ckptd.client(str(daemon.socket)).wait(str(ck), 60)
    assert st["state"] == "FAILED" and "metadata_timeout" in st["error"], st
    assert "finish" in st["error"], st
    # The failed attempt's files go in its cleanup task, after the state
    # (the directory too, possibly while we look).
    def left():
        try:
            return sorted(p.name for p in ck.iterdir())
        except FileNotFoundError:
            return []

    deadline = time.monotonic() + 30
    while left() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left() == [], left()


def test_the_writer_pickles_without_its_process_group(daemon):
    """DCP's process-based executor pickles the writer into its checkpoint
    process; a process group (given for stage, which runs before) cannot be
    pickled and stays behind."""
    import threading
    w = writer(daemon, "/some/ck", job="j", keep_last_n=2, process_group=threading.Lock())
    w2 = pickle.loads(pickle.dumps(w))
    assert (w2.path, w2.job, w2.keep_last_n, w2.socket) == ("/some/ck", "j", 2, str(daemon.socket))
    assert w2._group is None and w._group is not None
    # A cluster (found in the trainer by stage) travels with it.
    c = ckptd.Cluster("127.0.0.1:7070", [0, 1], 2)
    w3 = pickle.loads(pickle.dumps(writer(daemon, "/some/ck", cluster=c)))
    assert w3._cluster == c and w3._save_kwargs()["cluster"] == c
    # No process group: "auto" finds no cluster (one daemon).
    w4 = writer(daemon, "/some/ck")
    assert w4._find_cluster() is None and w4._save_kwargs()["cluster"] is None
    with pytest.raises(ValueError, match="cluster must be"):
        writer(daemon, "/some/ck", cluster="everywhere")


@pytest.mark.parametrize("mode", ["save", "async", "process"])
def test_fsdp2_4_ranks_reshard_into_2_and_3(daemon, tmp_path, mode):
    base = pathlib.Path(daemon.root) / f"dist-{mode}"
    paths = dict(socket=daemon.socket, ckptd_dir=base / "ckptd", stock_dir=base / "stock",
                 refs=tmp_path / "refs", workdir=tmp_path / "work")
    kind = "fsdp2"
    outs, skip = pw.run_job("save", 4, kind, save_with=f"dcp-writer-{mode}", **paths)
    if skip:
        pytest.skip(skip)
    if mode == "process":
        # The worker has DCP's checkpoint processes meet on a port below the
        # ephemeral range (pw.port_for_dcp_process), where no other socket
        # is given one: DCP's own pick could be taken before it was bound.
        low = pw.ephemeral_port_low()
        ports = re.findall(r"checkpoint background process on port (\d+)", outs[0])
        assert ports and all(int(p) < low for p in ports), (ports, low, outs[0][-2000:])
    # "process": DCP's process-based executor (torch >= 2.7) pickles the
    # writer into its checkpoint processes, which plan, write and finish;
    # one resharded load shows the result (the others cover resharding).
    loads = ((3, "dtensor"),) if mode == "process" else ((2, "fsdp2"), (3, "dtensor"))
    for world, load_kind in loads:
        outs, skip = pw.run_job("load", world, load_kind, storage_reader=True, **paths)
        assert skip is None, skip
        for r, o in enumerate(outs):
            assert "ckptd.StorageReader" in o, o


# ---------------------------------------------------------------------------
# Across nodes: two daemons with peer services and one shared root; ranks
# 0-1 talk to daemon A, 2-3 to daemon B (each rank's CKPTD_SOCKET), and
# ckptd.StorageWriter / StorageReader get no cluster and no socket: they
# find the cluster from the process group by themselves.

NODES_TOKEN = "interop-writer-nodes-token-51c2e"


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    base = tmp_path_factory.mktemp("writer-nodes")
    shared = base / "shared"
    shared.mkdir()
    token = base / "token"
    token.write_text(NODES_TOKEN + "\n")
    os.chmod(token, 0o600)
    ds = []
    try:
        for n in range(2):
            ds.append(pw.start_daemon(
                base / f"node{n}", root=shared, peer_listen="127.0.0.1:0",
                peer_advertise="127.0.0.1:0", peer_token_file=str(token),
                peer_timeout="10s", peer_heartbeat="200ms"))
        yield ds
    finally:
        logs = [d.log_tail() for d in ds]
        alive = [pw.stop_daemon(d) for d in ds]
        assert all(alive), "a daemon died during the tests\n" + "\n".join(logs)


def _node_paths(ds, tmp_path, name):
    base = pathlib.Path(ds[0].root) / name
    return dict(ckptd_dir=base / "ckptd", stock_dir=base / "stock", refs=tmp_path / "refs",
                workdir=tmp_path / "work")


def _check_committed_on_both(ds, ck):
    for d in ds:
        st = ckptd.status(ck, socket=str(d.socket))
        assert st.state == "COMMITTED", (d.socket, st)
    assert (pathlib.Path(ck) / ".metadata").exists()


def _load_3_ranks_across_nodes(ds, paths, storage_reader):
    """Stock dcp.load (and ckptd.StorageReader) resharded into 3 ranks:
    ranks 0-1 on daemon A, rank 2 on daemon B."""
    sockets = [ds[0].socket, ds[0].socket, ds[1].socket]
    outs, skip = pw.run_job("load", 3, "dtensor", storage_reader=storage_reader,
                            sockets=sockets, lean=True, **paths)
    assert skip is None, skip
    if storage_reader:
        # Each rank read through its own node's daemon, in its node's
        # restore group (from the discovered cluster).
        for r, want in ((0, "local_rank=0 local_world_size=2"),
                        (1, "local_rank=1 local_world_size=2"),
                        (2, "local_rank=0 local_world_size=1")):
            assert want in outs[r], outs[r][-3000:]
    return outs


@pytest.mark.parametrize("mode", ["save", "async", "process", "background"])
def test_storage_writer_across_two_daemons(nodes, tmp_path, mode):
    """dcp.save / dcp.async_save (thread and process executors, background
    staging) of FSDP2 + Adam with 4 gloo ranks over two daemons commit one
    checkpoint with DCP's .metadata, loaded bit-exact resharded into 3
    ranks by stock dcp.load (FileSystemReader) and ckptd.StorageReader."""
    from ckptd._writer import _stage_may_return_a_future
    if mode == "background" and not _stage_may_return_a_future():
        pytest.skip(f"background_staging needs torch >= 2.9; this is {torch.__version__}")
    paths = _node_paths(nodes, tmp_path, f"nodes-{mode}")
    sockets = [nodes[0].socket] * 2 + [nodes[1].socket] * 2
    outs, skip = pw.run_job("save", 4, "fsdp2", save_with=f"dcp-writer-{mode}",
                            sockets=sockets, lean=True, **paths)
    if skip:
        pytest.skip(skip)
    _check_committed_on_both(nodes, paths["ckptd_dir"])
    st = ckptd.status(paths["ckptd_dir"], socket=str(nodes[1].socket))
    assert st.num_nodes == 2 and st.world_size == 4, st
    with open(pathlib.Path(paths["ckptd_dir"]) / ".metadata", "rb") as f:
        md = pickle.load(f)
    files = {i.relative_path for i in md.storage_data.values()}
    assert files == {f"__{r}_0.distcp" for r in range(4)}, files
    _load_3_ranks_across_nodes(nodes, paths, storage_reader=mode == "save")


def test_zstd_storage_writer_across_two_daemons(nodes, tmp_path):
    """compression="zstd" across two daemons: every item of the global
    .metadata names "stream.zstd/1", and stock FileSystemReader (torch's
    ZStandard extension) loads it bit-exact resharded into 3 ranks."""
    from ckptd._writer import _describes_transforms
    if not _describes_transforms() or ic.stock_zstd()[0] is None:
        pytest.skip("stock DCP cannot read zstd payloads here: "
                    + (ic.stock_zstd()[1] or "torch < 2.7"))
    paths = _node_paths(nodes, tmp_path, "nodes-zstd")
    sockets = [nodes[0].socket] * 2 + [nodes[1].socket] * 2
    outs, skip = pw.run_job("save", 4, "fsdp2", save_with="dcp-writer-save",
                            compression="zstd", sockets=sockets, lean=True, **paths)
    if skip:
        pytest.skip(skip)
    _check_committed_on_both(nodes, paths["ckptd_dir"])
    with open(pathlib.Path(paths["ckptd_dir"]) / ".metadata", "rb") as f:
        md = pickle.load(f)
    infos = list(md.storage_data.values())
    assert infos and all(i.transform_descriptors == ["stream.zstd/1"] for i in infos), infos[:3]
    _load_3_ranks_across_nodes(nodes, paths, storage_reader=True)


def test_ckptd_save_zstd_across_two_daemons(nodes, tmp_path):
    """ckptd.save(compression="zstd", cluster=discover_cluster()) across two
    daemons: the coordinator's own global .metadata names the transform of
    every item, and stock dcp.load reads it resharded into 3 ranks."""
    if ic.stock_zstd()[0] is None:
        pytest.skip(ic.stock_zstd()[1])
    paths = _node_paths(nodes, tmp_path, "nodes-ckptd-zstd")
    sockets = [nodes[0].socket] * 2 + [nodes[1].socket] * 2
    outs, skip = pw.run_job("save", 4, "fsdp2", save_with="ckptd-cluster", compression="zstd:2",
                            sockets=sockets, lean=True, **paths)
    if skip:
        pytest.skip(skip)
    assert "num_nodes=2" in outs[3], outs[3][-2000:]
    _check_committed_on_both(nodes, paths["ckptd_dir"])
    with open(pathlib.Path(paths["ckptd_dir"]) / ".metadata", "rb") as f:
        md = pickle.load(f)
    infos = list(md.storage_data.values())
    assert infos and all(i.transform_descriptors == ["stream.zstd/1"] for i in infos), infos[:3]
    _load_3_ranks_across_nodes(nodes, paths, storage_reader=False)
