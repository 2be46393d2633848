"""The CUDA IPC handoff of the ckptd Python package through a real daemon
(needs torch >= 2.4 with a GPU; see conftest.py for the skips):

  * save / restore through IPC for float32, bfloat16 and float16 CUDA
    tensors, contiguous and not (transpose, narrow, stride-2 slice), several
    tensors sharing one storage (views of one buffer, a tensor and a view
    of it), 0-d and empty tensors; the client's stats prove the IPC path
    (every non-empty CUDA chunk an IPC item, none copied by the client);
    values checked after ckptd.load into CUDA destinations (non-contiguous
    too) and after stock torch.distributed.checkpoint.load;
  * "staged" means copied: sources modified right after async_save returns
    do not change the checkpoint;
  * writes still in flight on the current stream are waited for;
  * PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (a subprocess): the
    fallback logs its reason and the checkpoint is still right;
  * device_snapshot: fast return, sources modified at once, checkpoint
    holds the old values; the fallback when the clones do not fit;
  * a daemon with CUDA hidden (CUDA_VISIBLE_DEVICES=""): cuda_ipc false,
    the client falls back; CKPTD_CUDA_IPC=0 forces the host path;
  * restore H2D through small pinned bounce buffers (many batches);
  * no GPU memory stuck after IPC saves (what torch's _share_cuda_ would
    leave behind)."""
import gc
import json
import logging
import os
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import gpu_util  # noqa: E402
import ckptd  # noqa: E402
from ckptd import _bounce, _save  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def sock(d):
    return str(d.socket)


def make_state(dtype, seed=0):
    """CUDA tensors of `dtype` in every layout the IPC path must handle, a
    CPU tensor and a non-tensor value. Returns (state, expected CPU copies)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    base = torch.randn(64, 48, generator=g, device=dev).to(dtype)
    shared = torch.randn(4096, generator=g, device=dev).to(dtype)
    state = {
        "contig": torch.randn(33, 17, generator=g, device=dev).to(dtype),
        "big": torch.randn(1024, 1024, generator=g, device=dev).to(dtype),   # 2-4 MiB
        "transposed": base.t(),
        "narrowed": base.narrow(1, 5, 20),
        "strided": base[::2, 1::3],
        "shared": {"whole": shared, "head": shared[:1000], "tail": shared[3000:],
                   "rows": shared.view(64, 64)[10:20]},
        "scalar": torch.tensor(1.5, device=dev).to(dtype),
        "empty": torch.zeros(0, 7, device=dev, dtype=dtype),
        "cpu": torch.arange(10, dtype=torch.float32),
        "step": 42,
    }
    assert not state["transposed"].is_contiguous() and not state["strided"].is_contiguous()
    return state, to_cpu(state)


def to_cpu(obj):
    if torch.is_tensor(obj):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    return obj


def cuda_destinations(expected):
    """Fresh CUDA destinations (non-contiguous where the source was),
    filled with a sentinel."""
    def dest(k, v):
        if not torch.is_tensor(v):
            return -1
        if v.device.type == "cpu" and k == "cpu":
            return torch.full_like(v, 7)
        if v.dim() == 2 and k in ("transposed", "strided"):
            return torch.full((v.shape[1], v.shape[0]), 7, dtype=v.dtype, device="cuda").t()
        return torch.full(v.shape, 7, dtype=v.dtype, device="cuda")
    out = {}
    for k, v in expected.items():
        out[k] = {kk: dest(kk, vv) for kk, vv in v.items()} if isinstance(v, dict) else dest(k, v)
    return out


def assert_same(got, expected, what):
    if isinstance(expected, dict):
        assert set(got) == set(expected), what
        for k in expected:
            assert_same(got[k], expected[k], f"{what}.{k}")
    elif torch.is_tensor(expected):
        assert torch.is_tensor(got), (what, type(got))
        assert got.dtype == expected.dtype and tuple(got.shape) == tuple(expected.shape), what
        assert torch.equal(got.detach().cpu(), expected), what
    else:
        assert got == expected, what


def cuda_chunks(state):
    """Non-empty CUDA tensors of a state (the expected IPC items)."""
    n, nbytes = 0, 0
    for v in ckptd.flatten_state_dict(state)[0].values():
        if torch.is_tensor(v) and v.is_cuda and v.numel():
            n += 1
            nbytes += v.numel() * v.element_size()
    return n, nbytes


def assert_ipc_used(stats, state):
    n, nbytes = cuda_chunks(state)
    assert stats.cuda_host_items == 0, stats
    assert stats.ipc_items == n and stats.ipc_bytes == nbytes, stats
    assert 1 <= stats.ipc_allocations <= n, stats
    assert stats.cuda_fallback == "", stats


def stock_load(expected, directory):
    import torch.distributed.checkpoint as dcp
    dest = cuda_destinations(expected)
    dcp.load(dest, checkpoint_id=str(directory))   # no process group: no_dist by itself
    return dest


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[1])
def test_ipc_round_trip(gpu_daemon, dtype):
    state, expected = make_state(dtype)
    h = ckptd.async_save(state, f"rt/{dtype}", socket=sock(gpu_daemon))
    stats = h.stats
    assert_ipc_used(stats, state)
    # Staged means copied: the trainer may change its tensors at once.
    with torch.no_grad():
        state["big"].add_(1)
        state["shared"]["whole"].mul_(-2)
        state["transposed"].zero_()
    st = h.result(120)
    assert st.state == "COMMITTED", st
    # ckptd.load into CUDA destinations (non-contiguous ones too)
    dest = cuda_destinations(expected)
    ckptd.load(dest, st.checkpoint_id)
    assert dest["big"].is_cuda and not dest["transposed"].is_contiguous()
    assert_same(dest, expected, "ckptd.load")
    # stock DCP reads the same
    assert_same(stock_load(expected, st.checkpoint_id), expected, "dcp.load")
    ctl = pathlib.Path(os.environ.get("CKPTD_BUILD_DIR", gpu_util.REPO / "build")) / "bin/ckptctl"
    if ctl.exists():
        proc = subprocess.run([str(ctl), "verify", st.checkpoint_id], capture_output=True,
                              text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_one_handle_for_views_of_one_storage(gpu_daemon):
    buf = torch.arange(1 << 20, dtype=torch.float32, device="cuda")   # 4 MiB: its own segment
    state = {"t": buf, "v1": buf[:1000], "v2": buf[5000:9000], "m": buf.view(1024, 1024)[3]}
    h = ckptd.async_save(state, "views", socket=sock(gpu_daemon))
    assert h.stats.ipc_items == 4 and h.stats.ipc_allocations == 1, h.stats
    h.result(60)
    dest = {k: torch.zeros_like(v) for k, v in state.items()}
    ckptd.load(dest, h.checkpoint_id)
    for k, v in state.items():
        assert torch.equal(dest[k], v), k


def test_pending_writes_on_the_current_stream_are_waited_for(gpu_daemon):
    x = torch.empty(64 << 20, dtype=torch.float32, device="cuda")   # 256 MiB
    y = torch.empty_like(x)
    for _ in range(3):
        x.fill_(1.0)
        y.copy_(x)
        y.mul_(3.0)          # still running on the current stream when save starts
        h = ckptd.async_save({"y": y}, "stream", socket=sock(gpu_daemon), overwrite=True)
        assert h.stats.ipc_items == 1
        h.result(120)
        dest = {"y": torch.zeros(64 << 20, dtype=torch.float32)}
        ckptd.load(dest, h.checkpoint_id)
        assert bool((dest["y"] == 3.0).all())


def test_expandable_segments_fall_back_with_the_reason(gpu_daemon, tmp_path):
    env = dict(os.environ)
    env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, str(HERE / "gpu_worker.py"), "save-and-load",
                           "--socket", sock(gpu_daemon), "--id", "expandable", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    assert res["equal"], res
    assert res["ipc_items"] == 0 and res["cuda_host_items"] > 0, res
    assert "expandable_segments" in res["cuda_fallback"], res
    warnings = [ln for ln in proc.stderr.splitlines()
                if "ckptd" in ln and "expandable_segments" in ln]
    assert len(warnings) == 1, proc.stderr   # logged once, for several tensors


def test_device_snapshot(gpu_daemon):
    state, expected = make_state(torch.bfloat16, seed=3)
    h = ckptd.async_save(state, "snap", socket=sock(gpu_daemon), device_snapshot=True)
    # returned after the device-to-device clone: modify at once
    with torch.no_grad():
        state["big"].fill_(9)
        state["shared"]["whole"].zero_()
        state["cpu"].fill_(-1)
    h.wait_staged(120)
    stats = h.stats
    assert stats.device_snapshot is True and stats.snapshot_seconds > 0, stats
    n, nbytes = cuda_chunks(state)
    assert stats.ipc_items == n and stats.cuda_host_items == 0, stats
    assert stats.stall_seconds <= stats.staging_seconds, stats
    st = h.result(120)
    dest = cuda_destinations(expected)
    ckptd.load(dest, st.checkpoint_id)
    assert_same(dest, expected, "device_snapshot")


def test_device_snapshot_falls_back_when_it_does_not_fit(gpu_daemon, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="ckptd")
    monkeypatch.setattr(_save, "_free_for_snapshot", lambda devs: {d: 1 << 20 for d in devs})
    state, expected = make_state(torch.float32, seed=4)
    h = ckptd.async_save(state, "snap_full", socket=sock(gpu_daemon), device_snapshot=True)
    assert h.stats.device_snapshot is False and "margin" in h.stats.cuda_fallback
    assert any("device_snapshot falls back" in r.getMessage() for r in caplog.records)
    assert h.stats.ipc_items == cuda_chunks(state)[0]   # the normal IPC mode instead
    h.result(120)
    dest = cuda_destinations(expected)
    ckptd.load(dest, h.checkpoint_id)
    assert_same(dest, expected, "fallback")


def test_manager_device_snapshot(gpu_daemon):
    state, expected = make_state(torch.float16, seed=5)
    mgr = ckptd.CheckpointManager(gpu_daemon.root / "mgr", 1, socket=sock(gpu_daemon),
                                  cluster=None, device_snapshot=True)
    assert mgr.save_async(1, state)
    mgr.join()
    dest = cuda_destinations(expected)
    mgr.restore(1, dest)
    assert_same(dest, expected, "manager")


def test_daemon_with_cuda_hidden_reports_no_ipc_and_client_falls_back(tmp_path):
    import pyclient_dist_worker as pw
    d = gpu_util.start_daemon(tmp_path / "nogpu", env={"CUDA_VISIBLE_DEVICES": ""})
    try:
        info = ckptd.client(sock(d)).info()
        assert info["cuda_ipc"] is False and info["cuda_unavailable"], info
        state, expected = make_state(torch.float32, seed=6)
        h = ckptd.async_save(state, "nogpu", socket=sock(d))
        assert h.stats.ipc_items == 0 and h.stats.cuda_host_items == cuda_chunks(state)[0]
        assert "no CUDA IPC path" in h.stats.cuda_fallback
        h.result(120)
        dest = cuda_destinations(expected)
        ckptd.load(dest, h.checkpoint_id)
        assert_same(dest, expected, "host path")
    finally:
        pw.stop_daemon(d)


def test_env_switch_forces_the_host_path(gpu_daemon, monkeypatch):
    monkeypatch.setenv("CKPTD_CUDA_IPC", "0")
    state, expected = make_state(torch.float32, seed=7)
    h = ckptd.async_save(state, "env0", socket=sock(gpu_daemon))
    assert h.stats.ipc_items == 0 and "CKPTD_CUDA_IPC=0" in h.stats.cuda_fallback
    h.result(120)
    dest = cuda_destinations(expected)
    ckptd.load(dest, h.checkpoint_id)
    assert_same(dest, expected, "env switch")


def test_restore_through_small_pinned_buffers(gpu_daemon, monkeypatch):
    state = {"a": torch.randn(3000, 700, device="cuda"),              # 8 MiB
             "b": torch.randn(513, 1025, device="cuda").to(torch.bfloat16),
             "row": torch.randn(2, 300000, device="cuda")}            # rows > a buffer
    expected = to_cpu(state)
    h = ckptd.async_save(state, "bounce", socket=sock(gpu_daemon))
    h.result(120)
    monkeypatch.setenv(_bounce.BOUNCE_ENV, str(2 << 20))              # 2 x 1 MiB
    dest = {"a": torch.zeros(700, 3000, device="cuda").t(),
            "b": torch.zeros(513, 1025, device="cuda"),               # converted to float32
            "row": torch.zeros(2, 300000, device="cuda")}
    ckptd.load(dest, h.checkpoint_id)
    assert torch.equal(dest["a"].cpu(), expected["a"])
    assert torch.equal(dest["b"].cpu(), expected["b"].float())
    assert torch.equal(dest["row"].cpu(), expected["row"])


def test_no_gpu_memory_left_in_limbo(gpu_daemon):
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()
    base_reserved = torch.cuda.memory_reserved()
    for i in range(3):
        t = torch.ones(64 << 20, dtype=torch.float32, device="cuda")    # 256 MiB
        h = ckptd.async_save({"t": t, "v": t[10:]}, f"limbo/{i}", socket=sock(gpu_daemon))
        assert h.stats.ipc_items == 2
        h.result(120)
        del t, h
        gc.collect()
        torch.cuda.empty_cache()
        assert torch.cuda.memory_reserved() <= base_reserved + (2 << 20), \
            (torch.cuda.memory_reserved(), base_reserved)
