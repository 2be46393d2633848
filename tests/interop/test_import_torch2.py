"""ckptctl import FILE.pt DIR against stock torch 2.x: the checkpoint has
the items, chunks and planner_data stock torch_save_to_dcp writes for the
same file, and stock DCP (dcp_to_torch_save, i.e. dcp.load of everything)
reads back exactly the state dict that was torch.saved. Also dcp.load into
a live model and Adam.

Skipped with the reason where torch >= 2.4 is not importable.
"""
import warnings

import pytest

import interop_common as ic

torch, _REASON = ic.torch_status()
pytestmark = pytest.mark.skipif(torch is None, reason=_REASON or "")
if torch is not None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save, torch_save_to_dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata


def trained():
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    optim = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(2):
        optim.zero_grad()
        model(torch.randn(4, 6)).pow(2).sum().backward()
        optim.step()
    return model, optim


def state():
    model, optim = trained()
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    return {
        "model": model.state_dict(),
        "optim": optim.state_dict(),
        "step": 12,
        "extra": {
            "name": "run-7", "ratio": 0.25, "flags": [True, None], "pair": (1, "two"),
            "bf16": torch.randn(3, 3).to(torch.bfloat16),
            "view": base[1:3, ::2],                 # a strided view of a larger storage
            "param": torch.nn.Parameter(base.t()),  # nn.Parameter, transposed
            "scalar": torch.tensor(7, dtype=torch.int64),
            "empty": torch.zeros(0, 3),
            "mixed": [torch.ones(2), 5, {"deep": torch.full((2,), 3.0)}],
        },
    }


def same(a, b, where="sd"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a.detach(), b.detach()), where
        return
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (where, set(a) ^ set(b))
        for k in a:
            same(a[k], b[k], f"{where}.{k}")
        return
    if isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
        return
    assert type(a) is type(b) and a == b, (where, a, b)


@pytest.fixture
def files(tmp_path):
    pt = tmp_path / "sd.pt"
    torch.save(state(), pt)
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ic.ckptctl("import", pt, ours)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch_save_to_dcp(str(pt), str(theirs))
    return pt, ours, theirs


def test_import_has_the_items_of_torch_save_to_dcp(files):
    _, ours, theirs = files
    a = FileSystemReader(str(ours)).read_metadata()
    b = FileSystemReader(str(theirs)).read_metadata()
    assert set(a.state_dict_metadata) == set(b.state_dict_metadata)
    for fqn, ma in a.state_dict_metadata.items():
        mb = b.state_dict_metadata[fqn]
        assert type(ma) is type(mb), fqn
        if isinstance(ma, TensorStorageMetadata):
            assert ma.size == mb.size and ma.properties.dtype == mb.properties.dtype, fqn
            assert [(c.offsets, c.sizes) for c in ma.chunks] == \
                [(c.offsets, c.sizes) for c in mb.chunks], fqn
    assert a.planner_data == b.planner_data


def str_keys(v):
    """The state dict as DCP gives it back: every dict key a str (DCP's
    flattening makes path elements of dict keys with str(key))."""
    if isinstance(v, dict):
        return {str(k): str_keys(x) for k, x in v.items()}
    if isinstance(v, list):
        return [str_keys(x) for x in v]
    return v


def test_stock_dcp_reads_back_the_saved_state(files, tmp_path):
    pt, ours, theirs = files
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_to_torch_save(str(ours), str(tmp_path / "back.pt"))
        dcp_to_torch_save(str(theirs), str(tmp_path / "stock_back.pt"))
    back = torch.load(tmp_path / "back.pt", weights_only=False)
    # Exactly what stock torch_save_to_dcp + dcp_to_torch_save gives back ...
    same(torch.load(tmp_path / "stock_back.pt", weights_only=False), back)
    # ... which is the saved state with DCP's str keys.
    same(str_keys(torch.load(pt, weights_only=False)), back)


def test_stock_dcp_load_into_a_live_model_and_adam(files):
    _, ours, _ = files
    want = state()
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    optim = torch.optim.Adam(model.parameters(), lr=0.5)
    trained_model, trained_optim = trained()
    sd = {"model": model.state_dict(), "optim": trained_optim.state_dict(), "step": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(sd, checkpoint_id=str(ours))
    model.load_state_dict(sd["model"])
    optim.load_state_dict(sd["optim"])
    same(want["model"], model.state_dict(), "model")
    assert sd["step"] == 12
    assert optim.param_groups[0]["lr"] == 0.01


def test_bad_input_is_refused_and_nothing_runs(tmp_path):
    class Boom:
        def __reduce__(self):
            return (print, ("imported code ran",))
    pt = tmp_path / "evil.pt"
    torch.save({"w": torch.ones(2), "boom": Boom()}, pt)
    proc = ic.ckptctl("import", pt, tmp_path / "out", check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "boom: ckptd cannot re-encode" in proc.stderr and "ran" not in proc.stdout
    assert not (tmp_path / "out" / ".metadata").exists()
    torch.save([torch.ones(2)], tmp_path / "list.pt")
    proc = ic.ckptctl("import", tmp_path / "list.pt", tmp_path / "out2", check=False)
    assert proc.returncode == 1 and "not a state dict" in proc.stderr
    (tmp_path / "junk.pt").write_bytes(b"not a zip at all")
    proc = ic.ckptctl("import", tmp_path / "junk.pt", tmp_path / "out3", check=False)
    assert proc.returncode == 1 and "is not a torch.save file" in proc.stderr
    proc = ic.ckptctl("import", tmp_path / "missing.pt", tmp_path / "out4", check=False)
    assert proc.returncode == 3, proc.stderr
