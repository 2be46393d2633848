"""The ckptd Python package (client/python/ckptd) against stock
torch.distributed.checkpoint (torch >= 2.4), in both directions, through a
real daemon (build/bin/ckptd) started by each test:

  1. ckptd.save / async_save of a small model + Adam (after a few steps) and
     non-tensor values, single process, no process group -> stock dcp.load
     into fresh objects: through DCP's Stateful recipe (get_state_dict /
     set_state_dict) and through the plain module / optimizer Stateful;
     the checkpoint's keys and planner_data are DCP's own flattening of
     get_state_dict's output; non-tensor values via _load_state_dict;
     format_utils.dcp_to_torch_save of the ckptd checkpoint == the expected
     nested state dict.
  2. stock dcp.save -> ckptd.load into fresh objects (a fresh Adam's missing
     state is materialised from the checkpoint), both recipes, non-tensor
     values included.
  3. gloo on CPU (pyclient_dist_worker.py): a model whose parameters are
     DTensors (distribute_tensor: Shard(0) rows, Shard(1) columns,
     Replicate; uneven splits) trained by 4 ranks, saved with ckptd.save
     (rank and world from the group) and with stock dcp.save; 2 and 3 ranks
     then load with stock dcp.load (ckptd's checkpoint) and with ckptd.load
     (the stock one) into DTensors, and into ckptd.Shard boxes / plain full
     tensors. The same with FSDP2 fully_shard (4 -> 2 ranks) where it works
     on a CPU mesh (torch >= 2.6), else skipped with the reason.
  4. CUDA tensors (skipped without CUDA): ckptd.save copies them to the host
     (the client's D2H path); ckptd.load and stock dcp.load fill CUDA
     destinations (contiguous and not), a CUDA model and its Adam state.

Every expectation is taken from the live objects before saving (or from the
saving ranks' own local pieces) and compared bit for bit. Skipped with the
reason where torch >= 2.4 is not importable (Debian's torch 1.13).
"""
import io
import pathlib

import pytest

import interop_common as ic
from sample_spec import strict_equal, torch_bytes
from stock_spec import dcp_flatten

torch, _REASON = ic.torch_status()
pytestmark = pytest.mark.skipif(torch is None, reason=_REASON or "")
if torch is not None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    import pyclient_dist_worker as pw
    pw.setup_ckptd_import()
    import ckptd


@pytest.fixture
def daemon(tmp_path):
    d = pw.start_daemon(tmp_path / "daemon")
    try:
        yield d
    finally:
        log = d.log_tail()
        alive = pw.stop_daemon(d)
    assert alive, f"the daemon died during the test\n{log}"


def sock(d):
    return str(d.socket)


def trained(seed=0, steps=3, device="cpu"):
    model, optim = pw.fresh_net(seed, device=device)
    pw.train_local(model, optim, steps, seed=seed + 1)
    return model, optim


def fresh(device="cpu"):
    """A differently initialised model and a fresh (empty-state) Adam with
    other hyper-parameters: everything a load must overwrite."""
    model, optim = pw.fresh_net(99, device=device, lr=pw.FRESH_LR, betas=pw.FRESH_BETAS)
    assert not optim.state
    return model, optim


def load_objects(directory, request):
    """_load_state_dict (what dcp_to_torch_save uses; fills the dict it is
    given in every 2.x version) for non-tensor values."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
    _load_state_dict(request, storage_reader=FileSystemReader(str(directory)), no_dist=True)
    return request


def check_objects(directory, step):
    got = load_objects(directory, {"extra": pw.placeholders(pw.EXTRA), "step": pw.PLACEHOLDER})
    diff = strict_equal(got["extra"], pw.EXTRA, "extra")
    assert diff is None, diff
    assert got["step"] == step and type(got["step"]) is int, got["step"]


# -- 1. ckptd.save -> stock dcp.load ------------------------------------------

def test_ckptd_save_stock_load_get_state_dict(daemon):
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model, optim = trained()
    ref_model, ref_optim = pw.snapshot(model, optim)
    ckdir = daemon.root / "t1" / "app"
    handle = ckptd.async_save({"app": pw.AppState(model, optim), "extra": pw.EXTRA, "step": 3},
                              str(ckdir), socket=sock(daemon))
    st = handle.result(timeout=120)
    assert st.state == "COMMITTED" and st.world_size == 1, st
    assert st.checkpoint_id == str(ckdir)

    # Keys and planner_data: DCP's flattening of what get_state_dict gives.
    model_sd, optim_sd = get_state_dict(model, optim)
    want = dcp_flatten({"app": {"model": model_sd, "optim": optim_sd}, "extra": pw.EXTRA,
                        "step": 3}, is_tensor=torch.is_tensor)
    md = FileSystemReader(str(ckdir)).read_metadata()
    assert set(md.state_dict_metadata) == set(want)
    assert md.planner_data == {fqn: path for fqn, (path, _) in want.items()}
    assert "app.optim.state.emb.weight.exp_avg" in want and "app.optim.param_groups.0.lr" in want

    model2, optim2 = fresh()
    sd = {"app": pw.AppState(model2, optim2), "extra": pw.placeholders(pw.EXTRA),
          "step": pw.PLACEHOLDER}
    dcp.load(sd, checkpoint_id=str(ckdir))
    pw.assert_training_state(model2, optim2, ref_model, ref_optim,
                             "stock dcp.load(AppState) of ckptd.async_save")
    check_objects(ckdir, 3)
    # And training goes on from the restored state.
    pw.train_local(model2, optim2, 1, seed=5)


def _every_dtype():
    """Each dtype this torch can save, legacy and newer (float8, uint16/32/64:
    written as torch.storage.UntypedStorage + dtype, _rebuild_tensor_v3)."""
    names = ["float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8",
             "uint8", "bool", "complex64", "complex128", "uint16", "uint32", "uint64",
             "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"]
    return [getattr(torch, n) for n in names if hasattr(torch, n)]


def test_ckptd_save_every_dtype_stock_load(daemon):
    """Stock dcp.load reads tensors in every dtype from ckptd (its payloads go
    through torch.load(weights_only=True), which allow-lists the exact
    storage class names torch.save writes)."""
    state = {}
    for k, dt in enumerate(_every_dtype()):
        raw = torch.arange(k * 7, k * 7 + 12).to(torch.uint8).reshape(3, 4)
        if dt.is_floating_point or dt.is_complex:
            t = (torch.arange(12, dtype=torch.float32).reshape(3, 4) / 4 - k).to(dt)
        elif dt == torch.bool:
            t = raw % 2 == 1
        else:
            t = raw.to(dt)
        state[f"t.{str(dt).split('.')[-1]}"] = t

    def same_bytes(a, b):
        return a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))

    ckdir = daemon.root / "dtypes"
    st = ckptd.save(state, str(ckdir), socket=sock(daemon), timeout=120)
    assert st.state == "COMMITTED", st
    dest = {k: torch.empty_like(v) for k, v in state.items()}
    for d in dest.values():
        d.view(torch.uint8).zero_()  # float8 has no zero_ of its own
    dcp.load(dest, checkpoint_id=str(ckdir))
    for k, v in state.items():
        assert same_bytes(dest[k], v), k
    # And each payload alone, as torch.load(weights_only=True) sees it.
    md = FileSystemReader(str(ckdir)).read_metadata()
    for fqn in state:
        assert fqn in md.state_dict_metadata, fqn
    for index, info in md.storage_data.items():
        with open(ckdir / info.relative_path, "rb") as f:
            f.seek(info.offset)
            payload = f.read(info.length)
        t = torch.load(io.BytesIO(payload), weights_only=True)
        assert same_bytes(t, state[index.fqn]), index.fqn


def test_ckptd_save_stock_load_plain_stateful_and_dcp_to_torch_save(daemon, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    model, optim = trained(seed=3)
    ref_model, ref_optim = pw.snapshot(model, optim)
    ckdir = daemon.root / "t1" / "plain"
    st = ckptd.save({"model": model, "optim": optim, "extra": pw.EXTRA, "step": 3}, str(ckdir),
                    socket=sock(daemon))
    assert st.state == "COMMITTED", st

    # The plain Stateful module / optimizer: the optimizer's state must
    # exist before a stock load (DCP loads into optim.state_dict()).
    model2, optim2 = fresh()
    pw.init_optim_state(optim2)
    dcp.load({"model": model2, "optim": optim2}, checkpoint_id=str(ckdir))
    pw.assert_training_state(model2, optim2, ref_model, ref_optim,
                             "stock dcp.load(module, optimizer) of ckptd.save")
    check_objects(ckdir, 3)

    # The stock converter rebuilds the nesting from ckptd's planner_data:
    # optimizer state under str(param index), param_groups a list.
    out = tmp_path / "plain.pt"
    dcp_to_torch_save(str(ckdir), str(out))
    got = torch.load(out, map_location="cpu", weights_only=False)
    expected = {
        "model": ref_model,
        "optim": {"state": {str(k): v for k, v in ref_optim["state"].items()},
                  "param_groups": ref_optim["param_groups"]},
        "extra": pw.EXTRA,
        "step": 3,
    }
    diff = strict_equal(got, expected)
    assert diff is None, diff
    assert isinstance(got["optim"]["param_groups"], list) and "0" in got["optim"]["state"]


# -- 2. stock dcp.save -> ckptd.load ------------------------------------------

def test_stock_save_ckptd_load_fresh_optimizer(daemon, tmp_path):
    model, optim = trained(seed=7)
    ref_model, ref_optim = pw.snapshot(model, optim)
    ckdir = tmp_path / "stock_plain"
    dcp.save({"model": model, "optim": optim, "extra": pw.EXTRA, "step": 3},
             checkpoint_id=str(ckdir))

    model2, optim2 = fresh()      # Adam without any state: ckptd.load adds it
    sd = {"model": model2, "optim": optim2, "extra": pw.placeholders(pw.EXTRA),
          "step": pw.PLACEHOLDER}
    nread = ckptd.load(sd, str(ckdir))
    assert nread > 0
    pw.assert_training_state(model2, optim2, ref_model, ref_optim,
                             "ckptd.load(module, fresh optimizer) of stock dcp.save")
    diff = strict_equal(sd["extra"], pw.EXTRA, "extra")
    assert diff is None, diff
    assert sd["step"] == 3 and type(sd["step"]) is int
    pw.train_local(model2, optim2, 1, seed=5)


def _writer_for(kind, path):
    """Stock FileSystemWriter writing zstd payloads (torch >= 2.7) or
    SAFETENSORS-format data files (torch >= 2.8); skips where this torch
    or its modules cannot."""
    from torch.distributed.checkpoint import FileSystemWriter
    if kind == "zstd":
        ZStandard, why_not = ic.stock_zstd()
        if ZStandard is None:
            pytest.skip(f"torch {torch.__version__}: {why_not}")
        return FileSystemWriter(str(path), _extensions=[ZStandard()])
    try:
        from torch.distributed.checkpoint.filesystem import SerializationFormat
        import safetensors  # noqa: F401
    except ImportError as e:
        pytest.skip(f"torch {torch.__version__}: no SAFETENSORS serialization ({e})")
    return FileSystemWriter(str(path), serialization_format=SerializationFormat.SAFETENSORS)


@pytest.mark.parametrize("via_daemon", [True, False], ids=["daemon", "direct"])
@pytest.mark.parametrize("kind", ["zstd", "safetensors"])
def test_stock_compressed_or_safetensors_save_ckptd_load(daemon, tmp_path, kind, via_daemon):
    """Stock dcp.save with zstd-compressed payloads or SAFETENSORS-format
    data files: ckptd.load reads them, through the daemon's restore and
    through the direct reader."""
    ckdir = pathlib.Path(daemon.root) / f"stock_{kind}"  # the daemon reads below its roots
    writer = _writer_for(kind, ckdir)
    model, optim = trained(seed=13)
    ref_model, ref_optim = pw.snapshot(model, optim)
    dcp.save({"model": model, "optim": optim, "extra": pw.EXTRA, "step": 6},
             storage_writer=writer)
    md = FileSystemReader(str(ckdir)).read_metadata()
    if kind == "zstd":
        assert all(info.transform_descriptors == ["stream.zstd/1"]
                   for info in md.storage_data.values())
    model2, optim2 = fresh()
    sd = {"model": model2, "optim": optim2, "extra": pw.placeholders(pw.EXTRA),
          "step": pw.PLACEHOLDER}
    assert ckptd.load(sd, str(ckdir), via_daemon=via_daemon, socket=sock(daemon)) > 0
    pw.assert_training_state(model2, optim2, ref_model, ref_optim,
                             f"ckptd.load(via_daemon={via_daemon}) of a {kind} dcp.save")
    diff = strict_equal(sd["extra"], pw.EXTRA, "extra")
    assert diff is None, diff
    assert sd["step"] == 6


def test_stock_save_ckptd_load_get_state_dict(daemon, tmp_path):
    model, optim = trained(seed=11)
    ref_model, ref_optim = pw.snapshot(model, optim)
    ckdir = tmp_path / "stock_app"
    dcp.save({"app": pw.AppState(model, optim), "extra": pw.EXTRA, "step": 4},
             checkpoint_id=str(ckdir))

    model2, optim2 = fresh()
    sd = {"app": pw.AppState(model2, optim2), "extra": pw.placeholders(pw.EXTRA),
          "step": pw.PLACEHOLDER}
    ckptd.load(sd, str(ckdir))
    pw.assert_training_state(model2, optim2, ref_model, ref_optim,
                             "ckptd.load(AppState) of stock dcp.save")
    diff = strict_equal(sd["extra"], pw.EXTRA, "extra")
    assert diff is None, diff
    assert sd["step"] == 4
    # A key the checkpoint lacks is an error (strict), skipped with strict=False.
    model3, optim3 = fresh()
    extra = {"app": pw.AppState(model3, optim3), "not_saved": torch.zeros(3)}
    with pytest.raises(ckptd.NotFound, match="not_saved"):
        ckptd.load(extra, str(ckdir))
    ckptd.load(extra, str(ckdir), strict=False)
    pw.assert_training_state(model3, optim3, ref_model, ref_optim, "ckptd.load(strict=False)")


# -- 3. several gloo processes, DTensor / FSDP2 -------------------------------

def dist_round_trip(daemon, tmp_path, kind, load_world):
    paths = dict(socket=daemon.socket, ckptd_dir=daemon.root / "dist" / f"{kind}_w4",
                 stock_dir=tmp_path / f"stock_{kind}_w4", refs=tmp_path / "refs",
                 workdir=tmp_path / "work")
    _, skip = pw.run_job("save", 4, kind, **paths)
    if skip:
        pytest.skip(skip)
    assert (paths["ckptd_dir"] / ".metadata").exists()
    st = ckptd.status(str(paths["ckptd_dir"]), socket=sock(daemon))
    assert st.state == "COMMITTED" and st.world_size == 4, st
    outs, skip = pw.run_job("load", load_world, kind, **paths)
    if skip:
        pytest.skip(skip)
    for out in outs:
        assert "stock dcp.load of the ckptd checkpoint into" in out, out
        assert "ckptd.load of the stock dcp.save checkpoint into ckptd.Shard" in out, out


@pytest.mark.parametrize("load_world", [2, 3])
def test_dtensor_4_ranks_reshard(daemon, tmp_path, load_world):
    dist_round_trip(daemon, tmp_path, "dtensor", load_world)


def test_fsdp2_4_to_2_ranks(daemon, tmp_path):
    if ic.parse_version(torch.__version__) < (2, 6):
        pytest.skip(f"FSDP2 fully_shard on a CPU DeviceMesh needs torch>=2.6 "
                    f"(found {torch.__version__})")
    dist_round_trip(daemon, tmp_path, "fsdp2", 2)


# -- 4. CUDA ------------------------------------------------------------------

def cuda_reason():
    if torch is None:
        return _REASON or "no torch"
    if not torch.cuda.is_available():
        return f"needs CUDA (torch {torch.__version__}: torch.cuda.is_available() is False)"
    return None


def cpu_values():
    g = torch.Generator().manual_seed(42)
    base = torch.randn(17, 33, generator=g)
    return {
        "f32": torch.randn(33, 17, generator=g),
        "bf16": torch.randn(8, 40, generator=g).to(torch.bfloat16),
        "f16": torch.randn(5, 7, generator=g).to(torch.float16),
        "i64": torch.arange(-50, 50, dtype=torch.int64) * 68719476767,
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "transposed": base.t(),             # [33, 17], not contiguous
        "narrowed": base[:, 3:9],           # [17, 6], not contiguous
    }


def cuda_destinations(values):
    out = {}
    for k, v in values.items():
        if k == "transposed":   # a non-contiguous CUDA destination
            out[k] = torch.full((v.shape[1], v.shape[0]), 7, dtype=v.dtype, device="cuda").t()
        else:
            out[k] = torch.full(v.shape, 7, dtype=v.dtype, device="cuda")
    return out


def check_cuda_values(got, values, what):
    for k, want in values.items():
        assert got[k].is_cuda, f"{what}: {k} is on {got[k].device}"
        assert got[k].dtype == want.dtype and got[k].shape == want.shape, (what, k)
        assert torch_bytes(got[k].cpu()) == torch_bytes(want), f"{what}: {k} differs"


@pytest.mark.skipif(cuda_reason() is not None, reason=cuda_reason() or "")
def test_cuda_tensors(daemon):
    values = cpu_values()
    base_cuda = values["transposed"].t().contiguous().to("cuda")
    on_cuda = {k: v.to("cuda") for k, v in values.items()}
    on_cuda["transposed"] = base_cuda.t()
    on_cuda["narrowed"] = base_cuda[:, 3:9]
    assert not on_cuda["transposed"].is_contiguous() and not on_cuda["narrowed"].is_contiguous()
    model, optim = trained(seed=5, device="cuda")
    assert optim.state[next(model.parameters())]["exp_avg"].is_cuda
    ref_model, ref_optim = pw.snapshot(model, optim)

    ckdir = daemon.root / "cuda" / "ck"
    st = ckptd.save({"tensors": on_cuda, "app": pw.AppState(model, optim),
                     "model": model, "optim": optim, "step": 3}, str(ckdir), socket=sock(daemon))
    assert st.state == "COMMITTED", st

    # ckptd.load into CUDA tensors, a CUDA model and Adam (AppState), and a
    # CUDA model with a fresh Adam (its state materialised, then moved to
    # the parameters' device by Optimizer.load_state_dict).
    dest = cuda_destinations(values)
    m2, o2 = fresh("cuda")
    m3, o3 = fresh("cuda")
    ckptd.load({"tensors": dest, "app": pw.AppState(m2, o2), "model": m3, "optim": o3},
               str(ckdir))
    check_cuda_values(dest, values, "ckptd.load")
    pw.assert_training_state(m2, o2, ref_model, ref_optim, "ckptd.load(AppState) on CUDA")
    pw.assert_training_state(m3, o3, ref_model, ref_optim, "ckptd.load(fresh Adam) on CUDA")
    assert o3.state[next(m3.parameters())]["exp_avg"].is_cuda

    # Stock dcp.load of the same checkpoint into CUDA destinations.
    dest = cuda_destinations(values)
    m4, o4 = fresh("cuda")
    dcp.load({"tensors": dest, "app": pw.AppState(m4, o4)}, checkpoint_id=str(ckdir))
    check_cuda_values(dest, values, "stock dcp.load")
    pw.assert_training_state(m4, o4, ref_model, ref_optim, "stock dcp.load(AppState) on CUDA")
