"""ckptd.StorageReader under stock dcp.load (torch >= 2.4):

  * no process group: a stock dcp.save of a model, Adam and extra values
    loads equal to what stock FileSystemReader loads, in place and through
    get_state_dict / set_state_dict, directly and through the node's
    daemon;
  * 3 gloo ranks load ckptd's 4-rank sample resharded into DTensors
    whose boxes cut across the saved chunks (dist_worker.py);
  * checkpoints stock FileSystemReader writes but cannot read back
    (SAFETENSORS format) or writes compressed (zstd) load too;
  * a bytes item whose pickle would run code is refused with
    UnsafeCheckpointError and nothing runs; .metadata is never unpickled.

Skipped with the reason where torch >= 2.4 is not importable.
"""
import os
import pathlib
import subprocess
import sys
import warnings

import pytest

import interop_common as ic

torch, _REASON = ic.torch_status()
pytestmark = pytest.mark.skipif(torch is None, reason=_REASON or "")
if torch is not None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

    import pyclient_dist_worker as pw
    pw.setup_ckptd_import()
    import ckptd

HERE = pathlib.Path(__file__).resolve().parent


def trained(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.GELU(), torch.nn.Linear(5, 3))
    optim = torch.optim.AdamW(model.parameters(), lr=0.02)
    for _ in range(2):
        optim.zero_grad()
        model(torch.randn(6, 7)).square().sum().backward()
        optim.step()
    return model, optim


def state(model, optim, step):
    return {"model": model.state_dict(), "optim": optim.state_dict(), "step": step,
            "extra": {"name": "run", "sched": [0.1, 0.01], "table": torch.arange(10)}}


def load_with(reader, seed=99):
    model, optim = trained(seed)
    sd = state(model, optim, 0)
    sd["extra"]["table"] = torch.zeros(10, dtype=torch.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(sd, storage_reader=reader)  # no process group: no_dist
    return sd


def assert_same(a, b, where="sd"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert set(a) == set(b), (where, set(a) ^ set(b))
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def save_stock(path, writer=None):
    model, optim = trained(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if writer is None:
            dcp.save(state(model, optim, 41), checkpoint_id=str(path))
        else:
            dcp.save(state(model, optim, 41), storage_writer=writer)
    return state(model, optim, 41)


def test_loads_what_file_system_reader_loads(tmp_path):
    want = save_stock(tmp_path / "ck")
    got = load_with(ckptd.StorageReader(tmp_path / "ck"))
    stock = load_with(FileSystemReader(str(tmp_path / "ck")))
    assert_same(stock, got)
    assert_same(want, got)
    assert ckptd.StorageReader.validate_checkpoint_id(tmp_path / "ck")
    assert not ckptd.StorageReader.validate_checkpoint_id(tmp_path / "nothing")
    md = ckptd.StorageReader(tmp_path / "ck").read_metadata()
    smd = FileSystemReader(str(tmp_path / "ck")).read_metadata()
    assert set(md.state_dict_metadata) == set(smd.state_dict_metadata)
    assert md.planner_data == smd.planner_data


def test_through_the_daemon(tmp_path):
    """via_daemon=True: the read goes through the node's daemon's restore."""
    d = pw.start_daemon(tmp_path / "daemon")
    try:
        ck = pathlib.Path(d.root) / "ck"
        want = save_stock(ck)
        got = load_with(ckptd.StorageReader(ck, via_daemon=True, socket=str(d.socket)))
        assert_same(want, got)
        st = ckptd._restore.last_stats()
        assert st is not None and st.checkpoint_id == str(ck) and st.bytes > 0, st
        # Default (None) with a daemon that answers: also through it.
        got = load_with(ckptd.StorageReader(ck, socket=str(d.socket)))
        assert_same(want, got)
    finally:
        log = d.log_tail()
        alive = pw.stop_daemon(d)
    assert alive, f"the daemon died during the test\n{log}"


def test_get_and_set_state_dict(tmp_path):
    try:
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    except ImportError:
        pytest.skip("no torch.distributed.checkpoint.state_dict")
    model, optim = trained(1)
    msd, osd = get_state_dict(model, optim)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp_path / "ck"))
        model2, optim2 = trained(5)
        msd2, osd2 = get_state_dict(model2, optim2)
        sd = {"model": msd2, "optim": osd2}
        dcp.load(sd, storage_reader=ckptd.StorageReader(tmp_path / "ck"))
        set_state_dict(model2, optim2, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    assert_same(model.state_dict(), model2.state_dict(), "model")
    assert_same(optim.state_dict()["state"], optim2.state_dict()["state"], "optim")


@pytest.mark.parametrize("kind", ["zstd", "safetensors"])
def test_formats_stock_writes(tmp_path, kind):
    from test_pyclient_torch2 import _writer_for
    writer = _writer_for(kind, tmp_path / kind)
    want = save_stock(tmp_path / kind, writer)
    assert_same(want, load_with(ckptd.StorageReader(tmp_path / kind)))


# 3 ranks: every box cuts across the 4 saved chunks (2 ranks: see
# test_dcp_load_ckptd.py's stock reader, which plans the same).
@pytest.mark.parametrize("world", [3])
def test_dtensor_reshard_into_gloo_ranks(tmp_path, world):
    sample = tmp_path / "sample"
    ic.write_sample(sample)
    proc = subprocess.run([sys.executable, str(HERE / "dist_worker.py"),
                           "load-sample-ckptd-reader", "--world", str(world), "--dir", str(sample)],
                          capture_output=True, text=True, timeout=420, env=pw.child_env())
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    for r in range(world):
        assert f"rank {r}/{world}: sample loaded and checked" in proc.stdout, proc.stdout


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_bytes_item_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "ran"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": torch.ones(3), "evil": _Evil(marker)}, checkpoint_id=str(tmp_path / "ck"))
        sd = {"w": torch.zeros(3), "evil": None}
        # DCP may wrap the reader's exception in its CheckpointException.
        with pytest.raises(BaseException) as e:  # CheckpointException is one
            dcp.load(sd, storage_reader=ckptd.StorageReader(tmp_path / "ck"))
    text = f"{e.value!r} {e.value}"
    assert "UnsafeCheckpointError" in text and "evil" in text and "system" in text, text
    assert not marker.exists()
