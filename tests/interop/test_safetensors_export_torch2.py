"""ckptctl convert --format safetensors, read back by the `safetensors`
library (python3-safetensors in the Debian roots) from a stock torch 2.x
dcp.save: every tensor equal, bf16/fp16 exports bit-equal to torch's
Tensor.to (NaN, infinities, float16 overflow and subnormals included), a
sharded export's index and shards as transformers reads them, and a
DTensor checkpoint saved by 2 gloo ranks exported whole.

Skipped with the reason where torch >= 2.4 or safetensors is missing.
"""
import json
import pathlib
import subprocess
import sys
import warnings

import pytest

import interop_common as ic

torch, _REASON = ic.torch_status()
if torch is not None:
    try:
        import safetensors  # noqa: F401
        from safetensors import safe_open
        from safetensors.torch import load_file
    except ImportError as e:
        torch, _REASON = None, f"needs the safetensors module ({e})"
pytestmark = pytest.mark.skipif(torch is None, reason=_REASON or "")
if torch is not None:
    import torch.distributed.checkpoint as dcp

HERE = pathlib.Path(__file__).resolve().parent


def special_values():
    """float32 values where rounding to bf16/fp16 is delicate."""
    return torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, 1e-40, 6e-8, 3e-8,
                         65504.0, 65519.0, 65520.0, 1e6, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -9,
                         -2.5e-5, 3.14159265], dtype=torch.float32)


def state():
    g = torch.Generator().manual_seed(5)
    w = torch.randn(257, 33, generator=g)
    w.view(-1)[:15] = special_values()
    return {
        "model": {
            "w": w,
            "b": torch.randn(40, generator=g).to(torch.bfloat16),
            "h": torch.randn(3, 5, generator=g).to(torch.float16),
            "d": torch.randn(6, generator=g, dtype=torch.float64),
            "i": torch.arange(12, dtype=torch.int64).reshape(3, 4),
            "s": torch.tensor(2.5),
            "e": torch.zeros(0, 4),
        },
        "head": {"proj": torch.randn(8, 8, generator=g)},
        "step": 3,
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("st") / "ckpt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state(), checkpoint_id=str(d))
    return d


def test_export_loads_in_safetensors_equal(saved, tmp_path):
    out = tmp_path / "hf"
    ic.ckptctl("convert", saved, out, "--format", "safetensors")
    got = load_file(str(out / "model.safetensors"))
    want = state()
    flat = {f"model.{k}": v for k, v in want["model"].items()}
    flat["head.proj"] = want["head"]["proj"]
    assert set(got) == set(flat)
    for name, t in flat.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert torch.equal(got[name].view(-1).view(torch.uint8),
                           t.contiguous().view(-1).view(torch.uint8)), name
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}


def same_bits_nan_aware(a, b):
    """Bit-equal, except that NaNs only need to be NaNs (torch's vectorized
    bf16 conversion writes 0xffff for a NaN, its scalar one 0x7fc0)."""
    a, b = a.contiguous().view(-1), b.contiguous().view(-1)
    if not b.is_floating_point():
        return torch.equal(a, b)
    nan = torch.isnan(b.float())
    if not torch.equal(torch.isnan(a.float()), nan):
        return False
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[b.element_size()]
    return torch.equal(a.view(bits)[~nan], b.view(bits)[~nan])


@pytest.mark.parametrize("dtype,torch_dtype", [("bf16", "bfloat16"), ("fp16", "float16")])
def test_converted_sharded_export_matches_tensor_to(saved, tmp_path, dtype, torch_dtype):
    out = tmp_path / "hf"
    ic.ckptctl("convert", saved, out, "--format", "safetensors", "--dtype", dtype,
               "--only", "model.", "--strip", "model.", "--max-shard-size", "10KB")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    got = {}
    for f in shards:
        part = load_file(str(out / f))
        assert all(index["weight_map"][k] == f for k in part)
        got.update(part)
    want = state()["model"]
    assert set(got) == set(want)
    target = getattr(torch, torch_dtype)
    total = 0
    for name, t in want.items():
        ref = t.to(target) if t.is_floating_point() else t
        assert got[name].dtype == ref.dtype and got[name].shape == ref.shape, name
        assert same_bits_nan_aware(got[name], ref), name
        total += ref.numel() * ref.element_size()
    assert index["metadata"]["total_size"] == total


def test_dtensor_checkpoint_of_two_ranks_exports_whole(tmp_path):
    d = tmp_path / "dt"
    proc = subprocess.run([sys.executable, str(HERE / "dist_worker.py"), "save-dtensor",
                           "--world", "2", "--dir", str(d)], capture_output=True, text=True,
                          timeout=420)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ic.ckptctl("convert", d, tmp_path / "full.pt")
    full = torch.load(tmp_path / "full.pt", weights_only=False)
    ic.ckptctl("convert", d, tmp_path / "hf", "--format", "safetensors")
    got = load_file(str(tmp_path / "hf" / "model.safetensors"))
    flat = {f"model.{k}": v for k, v in full["model"].items() if isinstance(v, torch.Tensor)}
    assert flat and set(flat) <= set(got)
    for name, t in flat.items():
        assert torch.equal(got[name], t), name
