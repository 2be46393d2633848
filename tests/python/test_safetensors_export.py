"""ckptctl convert --format safetensors: a checkpoint's tensors as a Hugging
Face safetensors model directory, checked with Debian's torch 1.13.

The safetensors files are parsed here by a few lines of Python (the
container is an 8-byte length, a JSON header and raw little-endian data);
the `safetensors` library itself reads the export in the torch 2.x roots
(tests/interop/test_safetensors_export_torch2.py). Expected values come
from `ckptctl convert` to torch.save (checked against torch's own payloads
in test_ckptctl.py), and converted dtypes from torch's Tensor.to.
"""
import json
import os
import pathlib
import struct
import subprocess

import pytest

BUILD_DIR = pathlib.Path(os.environ.get("CKPTD_BUILD_DIR",
                                        pathlib.Path(__file__).resolve().parents[2] / "build"))
DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
          "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
          "BOOL": "bool"}


def read_safetensors(torch, path):
    """{name: tensor} and __metadata__ of one safetensors file."""
    data = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    assert n % 8 == 0, "header padded to 8 bytes as the safetensors library writes it"
    meta = header.pop("__metadata__", {})
    body = data[8 + n:]
    out, end = {}, 0
    for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, e_ = e["data_offsets"]
        assert b == end, f"{name}: data not contiguous ({b} after {end})"
        end = e_
        dtype = getattr(torch, DTYPES[e["dtype"]])
        t = torch.frombuffer(bytearray(body[b:e_]), dtype=dtype) if e_ > b else \
            torch.empty(0, dtype=dtype)
        out[name] = t.reshape(e["shape"])
    assert end == len(body), "no bytes after the last tensor"
    return out, meta


def read_export(torch, out):
    """Every tensor of an export directory, through its index when sharded."""
    out = pathlib.Path(out)
    index = out / "model.safetensors.index.json"
    if not index.exists():
        tensors, meta = read_safetensors(torch, out / "model.safetensors")
        assert meta == {"format": "pt"}
        return tensors, None
    idx = json.loads(index.read_text())
    tensors = {}
    for f in sorted(set(idx["weight_map"].values())):
        part, meta = read_safetensors(torch, out / f)
        assert meta == {"format": "pt"}
        for name in part:
            assert idx["weight_map"][name] == f, name
        tensors.update(part)
    assert set(tensors) == set(idx["weight_map"])
    return tensors, idx


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """A 4-rank demo checkpoint (row-sharded weights, replicated biases, 0-d
    scales, bytes items) and its full state dict via torch.save convert."""
    root = tmp_path_factory.mktemp("st")
    ckpt = root / "step_1000"
    subprocess.run([str(BUILD_DIR / "bin" / "ckptd_demo"), "--dir", str(ckpt), "--size-mb", "4",
                    "--save-ranks", "4", "--load-ranks", "3"], check=True, capture_output=True)
    return ckpt


def full_state(torch, ckptctl, ckpt, tmp_path):
    ckptctl("convert", ckpt, tmp_path / "full.pt")
    return torch.load(tmp_path / "full.pt")


def test_default_export_is_one_file_of_every_tensor(torch, ckptctl, demo, tmp_path):
    sd = full_state(torch, ckptctl, demo, tmp_path)
    proc = ckptctl("convert", demo, tmp_path / "hf", "--format", "safetensors")
    assert "skipped step: bytes item" in proc.stdout
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["model.safetensors"]
    tensors, idx = read_export(torch, tmp_path / "hf")
    assert idx is None
    want = {f"model.{k}": v for k, v in sd["model"].items()}
    assert set(tensors) == set(want)
    for name, t in tensors.items():
        assert t.dtype == want[name].dtype and t.shape == want[name].shape, name
        assert torch.equal(t, want[name]), name


@pytest.mark.parametrize("dtype,torch_dtype", [("bf16", "bfloat16"), ("fp16", "float16")])
def test_sharded_converted_filtered_export(torch, ckptctl, demo, tmp_path, dtype, torch_dtype):
    sd = full_state(torch, ckptctl, demo, tmp_path)
    out = tmp_path / "hf"
    ckptctl("convert", demo, out, "--format", "safetensors", "--dtype", dtype,
            "--only", "model.", "--strip", "model.", "--max-shard-size", "300KB")
    tensors, idx = read_export(torch, out)
    files = sorted(p.name for p in out.iterdir())
    n = len(files) - 1
    assert n >= 3, files
    assert files[:-1] == [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]
    assert set(tensors) == set(sd["model"])
    total = 0
    for name, t in tensors.items():
        ref = sd["model"][name].to(getattr(torch, torch_dtype))
        assert t.dtype == ref.dtype and t.shape == ref.shape, name
        # Bit for bit what torch's Tensor.to rounds to.
        assert torch.equal(t.view(torch.int16), ref.view(torch.int16)), name
        total += t.numel() * t.element_size()
    assert idx["metadata"]["total_size"] == total
    for f in files[:-1]:  # each shard within the limit (none holds one big tensor alone)
        assert (out / f).stat().st_size <= 300_000 + 8 + 4096, f


def test_existing_export_overwrite_and_bad_arguments(torch, ckptctl, demo, tmp_path):
    out = tmp_path / "hf"
    ckptctl("convert", demo, out, "--format", "safetensors", "--max-shard-size", "1MB")
    before = sorted(p.name for p in out.iterdir())
    assert "model.safetensors.index.json" in before
    (out / "config.json").write_text("{}")  # an HF model directory's other files stay
    proc = ckptctl("convert", demo, out, "--format", "safetensors", check=False)
    assert proc.returncode == 1 and "already holds" in proc.stderr, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(before + ["config.json"])
    # --overwrite replaces the sharded export with a single file.
    ckptctl("convert", demo, out, "--format", "safetensors", "--overwrite")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    cases = [
        (["--dtype", "int8"], 2, "use bf16"),
        (["--max-shard-size", "big"], 2, "is not a size"),
        (["--format", "onnx"], 2, "use torch_save or safetensors"),
        (["--only", "nothing."], 1, "no tensor to export"),
        (["--strip", "model.layers.0.bias"], 1, "no name left"),
    ]
    for args, rc, msg in cases:
        fmt = [] if "--format" in args else ["--format", "safetensors"]
        proc = ckptctl("convert", demo, tmp_path / "x", *fmt, *args, check=False)
        assert proc.returncode == rc and msg in proc.stderr, (args, proc.returncode, proc.stderr)
    proc = ckptctl("convert", demo, tmp_path / "y.pt", "--dtype", "bf16", check=False)
    assert proc.returncode == 2 and "apply to --format safetensors" in proc.stderr


@pytest.mark.once
def test_memory_is_bounded_by_the_block_not_the_checkpoint(torch, tmp_path):
    """A 512 MiB checkpoint exported to bf16: the converter's peak RSS stays
    near its 64 MiB read block (+ the converted slab), far below the
    checkpoint."""
    ckpt = tmp_path / "big"
    subprocess.run([str(BUILD_DIR / "bin" / "ckptd_demo"), "--dir", str(ckpt), "--size-mb", "512",
                    "--save-ranks", "4", "--load-ranks", "1"], check=True, capture_output=True)
    size = sum(p.stat().st_size for p in ckpt.iterdir())
    assert size > 500 << 20
    # ckptctl is started by a small Python that reports its child's peak RSS:
    # Linux carries the forking process's own peak into a child's ru_maxrss
    # across exec, and this pytest process (torch loaded) is large.
    measure = ("import os, subprocess, sys\n"
               "p = subprocess.Popen(sys.argv[1:])\n"
               "_, status, usage = os.wait4(p.pid, 0)\n"
               "print(usage.ru_maxrss, os.waitstatus_to_exitcode(status))\n")
    proc = subprocess.run(["/usr/bin/python3", "-c", measure, str(BUILD_DIR / "bin" / "ckptctl"),
                           "convert", str(ckpt), str(tmp_path / "hf"), "--format", "safetensors",
                           "--dtype", "bf16"], capture_output=True, text=True, check=True)
    maxrss_kib, rc = map(int, proc.stdout.split()[-2:])
    assert rc == 0, proc.stdout + proc.stderr
    peak = maxrss_kib << 10
    exported = (tmp_path / "hf" / "model.safetensors").stat().st_size
    assert exported > 250 << 20
    assert peak < 200 << 20, f"peak RSS {peak >> 20} MiB exporting {size >> 20} MiB"
