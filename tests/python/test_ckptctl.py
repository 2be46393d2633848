"""ckptctl inspect / verify / convert against real checkpoints, checked with
Debian's torch 1.13.

The checkpoint comes from ckptd_demo (4 ranks, row-sharded weights,
replicated biases and 0-d scales, bytes items with planner_data paths).
The expected state dict is assembled independently in Python: every payload
slice listed by `ckptctl inspect --json` is loaded with torch.load and placed
at its chunk offsets.
"""
import io
import json
import os
import pathlib
import shutil
import subprocess

import pytest

BUILD_DIR = pathlib.Path(os.environ.get("CKPTD_BUILD_DIR",
                                        pathlib.Path(__file__).resolve().parents[2] / "build"))


def bin_path(name):
    return BUILD_DIR / "bin" / name


@pytest.fixture(scope="module")
def demo_ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckptctl")
    ckpt = root / "step_1000"
    exe = bin_path("ckptd_demo")
    if not exe.exists():
        pytest.fail(f"{exe} not built")
    subprocess.run([str(exe), "--dir", str(ckpt), "--size-mb", "4", "--save-ranks", "4",
                    "--load-ranks", "3"], check=True, capture_output=True)
    return ckpt


def copy_ckpt(src, dst):
    shutil.copytree(src, dst)
    return dst


def inspect_json(ckptctl, path):
    return json.loads(ckptctl("inspect", path, "--json").stdout)


def assemble_from_payloads(torch, ckpt, info):
    """The full state (flat fqn → tensor / object) from individual payloads."""
    out = {}
    for t in info["tensors"]:
        dtype = getattr(torch, t["dtype"])
        full = torch.empty(t["shape"], dtype=dtype)
        for c in t["chunks"]:
            with open(ckpt / c["file"], "rb") as f:
                f.seek(c["offset"])
                blob = f.read(c["length"])
            piece = torch.load(io.BytesIO(blob))
            assert list(piece.shape) == c["sizes"]
            assert piece.dtype == dtype
            view = full
            for d, (o, s) in enumerate(zip(c["offsets"], c["sizes"])):
                view = view.narrow(d, o, s)
            view.copy_(piece)
        out[t["fqn"]] = full
    for b in info["bytes_items"]:
        with open(ckpt / b["file"], "rb") as f:
            f.seek(b["offset"])
            blob = f.read(b["length"])
        out[b["fqn"]] = torch.load(io.BytesIO(blob))
    return out


def test_verify_ok(ckptctl, demo_ckpt):
    proc = ckptctl("verify", demo_ckpt)
    assert proc.stdout.startswith("OK ")
    assert "CRC-32 verified" in proc.stdout
    rep = json.loads(ckptctl("verify", demo_ckpt, "--json").stdout)
    assert rep["ok"] is True
    assert rep["tensors"] == 24 and rep["bytes_items"] == 4 and rep["files"] == 4
    assert rep["crc_bytes"] >= 4 << 20


def test_inspect_json_structure(ckptctl, demo_ckpt):
    info = inspect_json(ckptctl, demo_ckpt)
    tensors = {t["fqn"]: t for t in info["tensors"]}
    w = tensors["model.layers.0.weight"]
    assert w["dtype"] == "float32" and len(w["chunks"]) == 4
    # Row-sharded over 4 ranks, each chunk in its rank's file.
    rows = w["shape"][0] // 4
    for r, c in enumerate(sorted(w["chunks"], key=lambda c: c["offsets"][0])):
        assert c["offsets"] == [r * rows, 0]
        assert c["file"] == f"__{r}_0.distcp"
    # Replicated tensors were saved once (deduplicated).
    assert len(tensors["model.layers.0.bias"]["chunks"]) == 1
    assert tensors["model.layers.0.norm.scale"]["shape"] == []
    assert info["planner_data"]["optim.param_groups.0.lr"] == ["optim", "param_groups", 0, "lr"]
    assert info["planner_data"]["model.layers.0.weight"] == ["model", "layers.0.weight"]
    human = ckptctl("inspect", demo_ckpt, "--chunks").stdout
    assert "model.layers.0.weight" in human and "__3_0.distcp @" in human
    assert "optim.param_groups.0.betas" in human and "(0.9, 0.95)" in human


def test_convert_equals_payloads_loaded_by_torch(torch, ckptctl, demo_ckpt, tmp_path):
    info = inspect_json(ckptctl, demo_ckpt)
    expected = assemble_from_payloads(torch, demo_ckpt, info)
    out = tmp_path / "full.pt"
    ckptctl("convert", demo_ckpt, out)
    sd = torch.load(out)
    # Nested as planner_data says: {"model": {...}, "optim": {"param_groups": [..]}, "step": n}
    assert set(sd) == {"model", "optim", "step"}
    assert sd["step"] == 1000 == expected["step"]
    assert sd["optim"]["param_groups"] == [{"lr": 3e-4, "betas": (0.9, 0.95), "weight_decay": 0.1}]
    assert sd["optim"]["param_groups"][0]["lr"] == expected["optim.param_groups.0.lr"]
    assert len(sd["model"]) == 24
    for name, t in sd["model"].items():
        ref = expected["model." + name]
        assert t.dtype == ref.dtype and t.shape == ref.shape
        assert torch.equal(t, ref), name
    # Refuses to clobber without --overwrite; replaces with it.
    proc = ckptctl("convert", demo_ckpt, out, check=False)
    assert proc.returncode == 1 and "exists" in proc.stderr
    ckptctl("convert", demo_ckpt, out, "--overwrite")


def test_verify_detects_flipped_payload_byte(ckptctl, demo_ckpt, tmp_path):
    ckpt = copy_ckpt(demo_ckpt, tmp_path / "c")
    info = inspect_json(ckptctl, ckpt)
    c = info["tensors"][0]["chunks"][0]
    path = ckpt / c["file"]
    data = bytearray(path.read_bytes())
    pos = c["offset"] + c["length"] // 2  # inside the tensor data record
    data[pos] ^= 0xFF
    path.write_bytes(bytes(data))
    proc = ckptctl("verify", ckpt, check=False)
    assert proc.returncode == 1
    assert "CRC-32" in proc.stderr and c["file"] in proc.stderr, proc.stderr
    assert proc.stderr.strip().endswith("1 problem")
    # --no-crc checks structure only and passes.
    assert ckptctl("verify", ckpt, "--no-crc", check=False).returncode == 0


def test_verify_detects_truncated_file(ckptctl, demo_ckpt, tmp_path):
    ckpt = copy_ckpt(demo_ckpt, tmp_path / "c")
    path = ckpt / "__2_0.distcp"
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 100)
    proc = ckptctl("verify", ckpt, check=False)
    assert proc.returncode == 1
    assert "__2_0.distcp" in proc.stderr and "past the end of the file" in proc.stderr, proc.stderr


def test_verify_detects_missing_file(ckptctl, demo_ckpt, tmp_path):
    ckpt = copy_ckpt(demo_ckpt, tmp_path / "c")
    (ckpt / "__1_0.distcp").unlink()
    proc = ckptctl("verify", ckpt, check=False)
    assert proc.returncode == 1
    assert "__1_0.distcp" in proc.stderr, proc.stderr


@pytest.mark.parametrize("cut", [0, 1, 10, 100, -1])
def test_verify_detects_corrupt_metadata(ckptctl, demo_ckpt, tmp_path, cut):
    ckpt = copy_ckpt(demo_ckpt, tmp_path / "c")
    md = ckpt / ".metadata"
    data = md.read_bytes()
    md.write_bytes(data[:cut] if cut >= 0 else data[:-1])
    proc = ckptctl("verify", ckpt, check=False)
    assert proc.returncode == 1
    assert ".metadata" in proc.stderr, proc.stderr


def test_not_a_checkpoint(ckptctl, tmp_path):
    proc = ckptctl("verify", tmp_path / "missing", check=False)
    assert proc.returncode == 3
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = ckptctl("verify", empty, check=False)
    assert proc.returncode == 1 and "no .metadata" in proc.stderr
    proc = ckptctl("inspect", empty, check=False)
    assert proc.returncode == 3 and "no .metadata" in proc.stderr
    assert ckptctl("bogus", check=False).returncode == 2
