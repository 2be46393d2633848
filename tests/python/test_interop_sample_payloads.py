"""The parts of the torch>=2.4 interop suite that Debian's torch 1.13 can
check: interop_tool's sample checkpoint (tests/interop/sample_spec.py) is
sliced payload by payload using the offsets in `interop_tool list --json`,
and every slice must torch.load (as stock FileSystemReader does with its
_ReaderView) into exactly the value the formula defines. ckptd's own reader
(interop_tool read / read-object) must return the same values for full and
resharded boxes, and ckptctl (when built) must verify and convert the sample.

The full dcp.load / dcp.save / DTensor round trips need torch>=2.4 and live
in tests/interop.
"""
import inspect
import io
import pathlib
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "interop"))

import interop_common as ic  # noqa: E402
from sample_spec import (SAMPLE_BY_FQN, SAMPLE_OBJECTS, SAMPLE_TENSORS, box_bytes, reshard_boxes,  # noqa: E402
                         expected_nested, strict_equal, torch_bytes)


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    d = tmp_path_factory.mktemp("sample") / "ckpt"
    exe = ic.tool_path("interop_tool")
    if not exe.exists():
        pytest.fail(f"helper tool {exe} not built (build the project first)")
    ic.write_sample(d)
    return d


@pytest.fixture(scope="module")
def items(sample):
    return ic.list_items(sample)


def torch_load_slice(torch, data, weights_only=True):
    """torch.load of one payload. Tensors: weights_only where this torch has
    it (the 2.x FileSystemReader loads tensor payloads with
    weights_only=True). Bytes items: weights_only=False, as stock load_bytes
    does (torch 1.13's weights-only unpickler lacks BINFLOAT anyway)."""
    kwargs = {"map_location": "cpu"}
    if "weights_only" in inspect.signature(torch.load).parameters:
        kwargs["weights_only"] = weights_only
    return torch.load(io.BytesIO(data), **kwargs)


def test_list_matches_spec(items):
    assert set(items) == set(SAMPLE_BY_FQN)
    for t in SAMPLE_TENSORS:
        it = items[t.fqn]
        assert it["kind"] == "tensor", t
        assert (it["dtype"], it["shape"]) == (t.dtype, t.shape), t
        assert tuple(it["path"]) == t.path, t
        want = sorted({(tuple(o), tuple(s)) for _, o, s in t.chunks()})
        got = sorted((tuple(c["offsets"]), tuple(c["sizes"])) for c in it["chunks"])
        assert got == want, t
    for b in SAMPLE_OBJECTS:
        it = items[b.fqn]
        assert it["kind"] == "bytes", b
        assert tuple(it["path"]) == b.path, b


def test_replicated_items_are_deduplicated(items):
    # Replicated tensors and the bytes items were given by all 4 ranks.
    assert len(items["model.norm.scale"]["chunks"]) == 1
    assert len(items["model.num_batches_tracked"]["chunks"]) == 1
    files = {items[b.fqn]["storage"]["file"] for b in SAMPLE_OBJECTS}
    assert files <= {f"__{r}_0.distcp" for r in range(4)}


def test_tensor_payloads_torch_load(torch, sample, items):
    for t in SAMPLE_TENSORS:
        for c in items[t.fqn]["chunks"]:
            data = ic.payload_slice(sample, c["storage"])
            assert data[:4] == b"PK\x03\x04", (t.fqn, c)
            v = torch_load_slice(torch, data)
            assert isinstance(v, torch.Tensor), (t.fqn, type(v))
            assert str(v.dtype) == f"torch.{t.dtype}", (t.fqn, v.dtype)
            assert list(v.shape) == c["sizes"], (t.fqn, v.shape, c)
            assert not v.requires_grad
            assert torch_bytes(v) == box_bytes(t.dtype, t.shape, t.seed, c["offsets"], c["sizes"]), \
                (t.fqn, c, v)


def test_bytes_payloads_torch_load(torch, sample, items):
    for b in SAMPLE_OBJECTS:
        data = ic.payload_slice(sample, items[b.fqn]["storage"])
        assert data[:4] == b"PK\x03\x04", b.fqn
        got = torch_load_slice(torch, data, weights_only=False)
        diff = strict_equal(got, b.value, b.fqn)
        assert diff is None, diff


def test_payloads_tile_the_files(sample, items):
    """Payloads are back to back, each a whole archive, inside their file."""
    spans = {}
    for it in items.values():
        for st in ([c["storage"] for c in it["chunks"]] if it["kind"] == "tensor" else [it["storage"]]):
            spans.setdefault(st["file"], []).append((st["offset"], st["length"]))
    for name, ss in spans.items():
        size = (sample / name).stat().st_size
        ss.sort()
        pos = 0
        for off, length in ss:
            assert off == pos, (name, ss)
            pos = off + length
        assert pos == size, (name, pos, size)


def test_read_full_and_resharded_boxes(sample):
    # Every box of every tensor, with the saved dtype ("-") and with the
    # explicit one, which gives the same bytes: one interop_tool process.
    cases = [(t, o, s) for t in SAMPLE_TENSORS
             for o, s in [([0] * len(t.shape), t.shape)] + reshard_boxes(t.shape)]
    got = ic.read_boxes(sample, [box for t, o, s in cases
                                 for box in ((t.fqn, o, s), (t.fqn, o, s, t.dtype))])
    for k, (t, o, s) in enumerate(cases):
        expected = box_bytes(t.dtype, t.shape, t.seed, o, s)
        assert got[2 * k] == expected, (t.fqn, o, s)
        assert got[2 * k + 1] == expected, (t.fqn, o, s, t.dtype)


def test_read_rejects_bad_requests(sample):
    t = SAMPLE_BY_FQN["model.layers.0.weight"]
    bad = [
        ("model.layers.0.weight", "0,0", "10,7", "float64"),   # dtype differs from the saved one
        ("model.layers.0.weight", "8,0", "3,7", "-"),          # box outside the tensor
        ("model.layers.0.weight", "0", "10", "-"),             # rank mismatch
        ("no.such.tensor", "0", "1", "float32"),
        ("step", "-", "-", "int64"),                           # a bytes item
    ]
    for fqn, offs, sizes, dtype in bad:
        proc = ic.interop_tool("read", sample, fqn, offs, sizes, dtype, sample.parent / "x.bin",
                               check=False)
        assert proc.returncode == 1, (fqn, offs, sizes, dtype, proc.stdout, proc.stderr)
        assert proc.stderr.strip(), (fqn, "error without a message")
    assert t.dtype == "float32"


def test_read_object_values(sample):
    got_all = ic.read_objects(sample, [b.fqn for b in SAMPLE_OBJECTS])
    for b, (got, text) in zip(SAMPLE_OBJECTS, got_all):
        diff = strict_equal(got, b.value, b.fqn)
        assert diff is None, f"{diff} (Repr: {text})"


def test_read_object_of_tensor_fails(sample):
    proc = ic.interop_tool("read-object", sample, "model.layers.0.weight", check=False)
    assert proc.returncode == 1, proc.stdout


def test_list_text_output(sample):
    lines = ic.interop_tool("list", sample).stdout.splitlines()
    assert len(lines) == len(SAMPLE_BY_FQN)
    by_fqn = {ln.split("\t")[0]: ln.split("\t") for ln in lines}
    assert by_fqn["model.layers.0.weight"][1:5] == [
        "tensor", "float32", "(10, 7)", "('model', 'layers.0.weight')"]
    assert by_fqn["optim.param_groups.1.lr"][1] == "bytes"
    assert by_fqn["optim.param_groups.1.lr"][4] == "('optim', 'param_groups', 1, 'lr')"


def test_write_sample_refuses_to_overwrite(sample):
    proc = ic.interop_tool("write-sample", sample, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip()


# ---------------------------------------------------------------------------
# ckptctl (another engineer's tool; skipped until it is built).

def need_ckptctl():
    if not ic.have_ckptctl():
        pytest.skip(f"{ic.bin_path('ckptctl')} not built yet")


def test_ckptctl_verify_sample(sample):
    need_ckptctl()
    proc = ic.ckptctl("verify", sample, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ckptctl_inspect_json_sample(sample):
    need_ckptctl()
    import json
    doc = json.loads(ic.ckptctl("inspect", sample, "--json").stdout)
    text = json.dumps(doc)
    for fqn in SAMPLE_BY_FQN:
        assert json.dumps(fqn) in text, fqn


def test_ckptctl_convert_sample_loads_in_torch(torch, sample, tmp_path):
    """ckptctl convert = ckptd's dcp_to_torch_save: the nested state dict
    rebuilt from planner_data (lists for int path elements)."""
    need_ckptctl()
    out = tmp_path / "sample.pt"
    ic.ckptctl("convert", sample, out)
    got = torch.load(out, map_location="cpu")
    diff = strict_equal(got, expected_nested())
    assert diff is None, diff


# ---------------------------------------------------------------------------
# ckptd_demo's checkpoint: every payload loads in torch 1.13 and agrees with
# ckptd's reader.

def test_demo_payloads_agree_with_reader(torch, tmp_path):
    demo = ic.bin_path("ckptd_demo")
    if not demo.exists():
        pytest.fail(f"{demo} not built")
    d = tmp_path / "demo"
    proc = subprocess.run([str(demo), "--dir", str(d), "--save-ranks", "4", "--load-ranks", "3",
                           "--size-mb", "1"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    items = ic.list_items(d)
    assert items, "demo checkpoint is empty"
    # Every saved chunk as torch.load decodes its payload, against ckptd's
    # reader (one interop_tool process for all of them).
    chunks = [(fqn, c) for fqn, it in items.items() if it["kind"] == "tensor"
              for c in it["chunks"]]
    got = ic.read_boxes(d, [(fqn, c["offsets"], c["sizes"]) for fqn, c in chunks])
    for (fqn, c), read in zip(chunks, got):
        v = torch_load_slice(torch, ic.payload_slice(d, c["storage"]))
        assert list(v.shape) == c["sizes"], fqn
        assert torch_bytes(v) == read, fqn
    objects = [fqn for fqn, it in items.items() if it["kind"] != "tensor"]
    for fqn, (got, text) in zip(objects, ic.read_objects(d, objects)):
        v = torch_load_slice(torch, ic.payload_slice(d, items[fqn]["storage"]),
                             weights_only=False)
        diff = strict_equal(got, v, fqn)
        assert diff is None, diff
