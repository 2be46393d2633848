"""ckptctl import FILE.pt DIR with Debian's torch 1.13: a torch.save'd
model + Adam state becomes a DCP checkpoint that ckptd.load restores into
a fresh model and optimizer, and that ckptctl convert turns back into the
same state dict (dict keys as DCP gives them back: str). Stock torch 2.x
reads it in tests/interop/test_import_torch2.py."""
import os

import pytest

import pyclient_util

pyclient_util.setup_import()
torch = pytest.importorskip("torch") if os.environ.get("CKPTD_REQUIRE_TORCH") != "1" else \
    __import__("torch")
pytestmark = pytest.mark.skipif(pyclient_util.asan_build(), reason=pyclient_util.ASAN_SKIP_REASON)

import ckptd  # noqa: E402


def net(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))


def str_keys(v):
    if isinstance(v, dict):
        return {str(k): str_keys(x) for k, x in v.items()}
    if isinstance(v, list):
        return [str_keys(x) for x in v]
    return v


def assert_same(a, b, where="sd"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (where, set(a) ^ set(b))
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert type(a) is type(b) and a == b, (where, a, b)


def test_torch_save_import_then_ckptd_load_and_convert_back(ckptctl, tmp_path):
    model = net(1)
    optim = torch.optim.Adam(model.parameters(), lr=0.003)
    for _ in range(2):
        optim.zero_grad()
        model(torch.randn(5, 8)).square().mean().backward()
        optim.step()
    saved = {"model": model.state_dict(), "optim": optim.state_dict(), "epoch": 4,
             "tag": "run-a", "view": torch.arange(20.0).reshape(4, 5)[:, 1:4]}
    torch.save(saved, tmp_path / "sd.pt")
    proc = ckptctl("import", tmp_path / "sd.pt", tmp_path / "ck")
    assert "wrote" in proc.stdout and "tensors" in proc.stdout
    assert ckptctl("verify", tmp_path / "ck").stdout.startswith("OK ")

    model2 = net(2)
    optim2 = torch.optim.Adam(model2.parameters(), lr=0.5)
    sd = {"model": model2, "optim": optim2, "epoch": None, "tag": None,
          "view": torch.zeros(4, 3)}
    ckptd.load(sd, str(tmp_path / "ck"), via_daemon=False)
    assert_same(model.state_dict(), model2.state_dict(), "model")
    assert optim2.param_groups[0]["lr"] == 0.003
    for p, p2 in zip(model.parameters(), model2.parameters()):
        assert_same(optim.state[p], optim2.state[p2], "adam state")
    assert sd["epoch"] == 4 and sd["tag"] == "run-a"
    assert torch.equal(sd["view"], saved["view"])

    ckptctl("convert", tmp_path / "ck", tmp_path / "back.pt")
    assert_same(str_keys(saved), torch.load(tmp_path / "back.pt"))


def test_import_refuses_what_it_cannot_encode_without_running_it(ckptctl, tmp_path):
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"w": torch.ones(3), "evil": Evil()}, tmp_path / "evil.pt")
    proc = ckptctl("import", tmp_path / "evil.pt", tmp_path / "ck", check=False)
    assert proc.returncode == 1
    assert "evil: ckptd cannot re-encode" in proc.stderr, proc.stderr
    assert not marker.exists() and not (tmp_path / "ck" / ".metadata").exists()
    # An existing checkpoint stays unless --overwrite.
    torch.save({"w": torch.ones(3)}, tmp_path / "ok.pt")
    ckptctl("import", tmp_path / "ok.pt", tmp_path / "ck2")
    proc = ckptctl("import", tmp_path / "ok.pt", tmp_path / "ck2", check=False)
    assert proc.returncode == 1 and "already holds a committed checkpoint" in proc.stderr, proc.stderr
    ckptctl("import", tmp_path / "ok.pt", tmp_path / "ck2", "--overwrite")
