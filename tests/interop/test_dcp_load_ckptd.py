"""Stock torch.distributed.checkpoint (torch >= 2.4) reads checkpoints that
ckptd wrote: interop_tool's 4-rank sample (tests/interop/sample_spec.py) and
ckptd_demo's checkpoint.

  * dcp.load without a process group (no_dist) into preallocated plain
    tensors and bytes-item placeholders, nested as planner_data says;
  * dcp.load into DTensors on 2 and 3 CPU gloo processes, sharded so every
    rank's box cuts across the saved chunks (dist_worker.py load-sample);
  * format_utils.dcp_to_torch_save -> torch.load == the expected nested
    state dict; ckptctl convert gives the same;
  * the .metadata unpickles into the real 2.x classes with the right fields,
    and every payload loads with torch.load(weights_only=True) as stock
    FileSystemReader does.
"""
import io
import pathlib
import subprocess
import sys

import pytest

import interop_common as ic
from sample_spec import (SAMPLE_BY_FQN, SAMPLE_OBJECTS, SAMPLE_TENSORS, expected_nested, set_path,
                         strict_equal, torch_bytes, torch_full)

# Without torch>=2.4 every test here is reported SKIPPED with the reason
# (and `pytest tests/interop` alone still exits 0, not 5).
torch, _REASON = ic.torch_status()
pytestmark = pytest.mark.skipif(torch is None, reason=_REASON or "")
if torch is not None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader


HERE = pathlib.Path(__file__).resolve().parent
PLACEHOLDER = "<ckptd-placeholder>"


def garbage(t):
    """A preallocated destination that a missed read would leave visible."""
    dtype = getattr(torch, t.dtype)
    if t.dtype == "bool":
        return torch.ones(t.shape, dtype=dtype)
    return torch.full(t.shape, 7, dtype=dtype)


def request_dict(fqns=None):
    sd = {}
    for t in SAMPLE_TENSORS:
        if fqns is None or t.fqn in fqns:
            set_path(sd, t.path, garbage(t))
    for b in SAMPLE_OBJECTS:
        if fqns is None or b.fqn in fqns:
            set_path(sd, b.path, PLACEHOLDER)
    return sd


def get(sd, path):
    for p in path:
        sd = sd[p]
    return sd


def check_loaded(sd, fqns=None, bytes_may_stay=False):
    """Tensors must hold the formula's values. Bytes items must hold their
    values, or with bytes_may_stay also the untouched placeholder (see
    test_load_plain_tensors). Returns the number of bytes items delivered."""
    delivered = 0
    for t in SAMPLE_TENSORS:
        if fqns is None or t.fqn in fqns:
            diff = strict_equal(get(sd, t.path), torch_full(t.dtype, t.shape, t.seed), t.fqn)
            assert diff is None, diff
    for b in SAMPLE_OBJECTS:
        if fqns is None or b.fqn in fqns:
            got = get(sd, b.path)
            if bytes_may_stay and isinstance(got, str) and got == PLACEHOLDER:
                continue
            diff = strict_equal(got, b.value, b.fqn)
            assert diff is None, diff
            delivered += 1
    return delivered


def test_load_plain_tensors(sample_dir):
    """(a) dcp.load, no process group, every key requested.

    Tensors are filled in place in every version. Non-tensor values are
    set into dcp.load's internal copy of the top-level dict (and, in some
    versions, into copies of nested containers made by _init_state_dict);
    whether they reach the caller's dict depends on the version (later
    load()s copy the top level back). So bytes items may keep their
    placeholder here; test_load_plain_tensors_private_loader checks every
    value through _load_state_dict, which fills the dict it is given."""
    sd = request_dict()
    dcp.load(sd, checkpoint_id=str(sample_dir))
    delivered = check_loaded(sd, bytes_may_stay=True)
    print(f"torch {torch.__version__}: dcp.load delivered {delivered}/{len(SAMPLE_OBJECTS)} "
          f"bytes items into the caller's dict")


def test_load_plain_tensors_private_loader(sample_dir):
    """The same through _load_state_dict (what format_utils uses): every
    tensor and every bytes item, in every 2.x version."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
    sd = request_dict()
    _load_state_dict(sd, storage_reader=FileSystemReader(str(sample_dir)), no_dist=True)
    assert check_loaded(sd) == len(SAMPLE_OBJECTS)


def test_load_subset_of_keys(sample_dir):
    # (Only param group 0: a request holding param_groups[1] alone would put
    # a None leaf at param_groups.0, which is not in the checkpoint.)
    want = {"model.layers.1.weight", "model.buffers.bool", "optim.param_groups.0.betas",
            "extra.config", "model.num_batches_tracked"}
    sd = request_dict(want)
    dcp.load(sd, storage_reader=FileSystemReader(str(sample_dir)))
    check_loaded(sd, want, bytes_may_stay=True)
    sd = request_dict(want)
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
    _load_state_dict(sd, storage_reader=FileSystemReader(str(sample_dir)), no_dist=True)
    assert check_loaded(sd, want) == 2


def test_load_missing_key_is_an_error(sample_dir):
    sd = request_dict({"model.layers.0.weight"})
    sd["model"]["not.in.checkpoint"] = torch.zeros(3)
    # DCP wraps the planner's error in CheckpointException, a BaseException
    # (not an Exception) in the 2.x releases.
    with pytest.raises(BaseException, match="not.in.checkpoint"):
        dcp.load(sd, checkpoint_id=str(sample_dir))


def test_dcp_to_torch_save(sample_dir, tmp_path):
    """dcp_to_torch_save rebuilds the nesting from planner_data: model.*
    under "model" with dotted module names as keys, optimizer param_groups
    as a list (int path elements), bytes items as their values."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    out = tmp_path / "sample.pt"
    dcp_to_torch_save(str(sample_dir), str(out))
    got = torch.load(out, map_location="cpu", weights_only=False)
    diff = strict_equal(got, expected_nested())
    assert diff is None, diff
    assert isinstance(got["optim"]["param_groups"], list)
    assert "layers.0.weight" in got["model"]


def test_ckptctl_convert_matches_dcp_to_torch_save(sample_dir, tmp_path):
    if not ic.have_ckptctl():
        pytest.skip(f"{ic.bin_path('ckptctl')} not built yet")
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    ours, stock = tmp_path / "ours.pt", tmp_path / "stock.pt"
    ic.ckptctl("convert", sample_dir, ours)
    dcp_to_torch_save(str(sample_dir), str(stock))
    a = torch.load(ours, map_location="cpu", weights_only=False)
    b = torch.load(stock, map_location="cpu", weights_only=False)
    diff = strict_equal(a, b)
    assert diff is None, diff
    # torch.load(weights_only=True) also accepts ckptctl's file (plain
    # containers, tensors and primitives only).
    torch.load(ours, map_location="cpu", weights_only=True)


def test_metadata_unpickles_into_torch_classes(sample_dir):
    from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, Metadata, MetadataIndex,
                                                       TensorStorageMetadata)
    md = FileSystemReader(str(sample_dir)).read_metadata()
    assert isinstance(md, Metadata)
    assert set(md.state_dict_metadata) == set(SAMPLE_BY_FQN)
    for t in SAMPLE_TENSORS:
        m = md.state_dict_metadata[t.fqn]
        assert isinstance(m, TensorStorageMetadata), t
        assert isinstance(m.size, torch.Size) and list(m.size) == t.shape, (t, m.size)
        assert m.properties.dtype == getattr(torch, t.dtype), t
        want = sorted({(tuple(o), tuple(s)) for _, o, s in t.chunks()})
        got = sorted((tuple(c.offsets), tuple(c.sizes)) for c in m.chunks)
        assert got == want, t
        for i, c in enumerate(m.chunks):
            assert isinstance(c.offsets, torch.Size) and isinstance(c.sizes, torch.Size)
            info = md.storage_data[MetadataIndex(t.fqn, c.offsets)]
            assert info.relative_path.endswith(".distcp") and info.length > 0
        # The index hints equal the chunk positions (DefaultSavePlanner's
        # rewrite_index_hints).
        hints = {k.offset: k.index for k in md.storage_data if k.fqn == t.fqn}
        for i, c in enumerate(m.chunks):
            assert hints[c.offsets] in (i, None), (t.fqn, hints)
    for b in SAMPLE_OBJECTS:
        assert isinstance(md.state_dict_metadata[b.fqn], BytesStorageMetadata), b
        assert MetadataIndex(b.fqn) in md.storage_data, b
    assert md.planner_data == {x.fqn: x.path for x in SAMPLE_TENSORS + SAMPLE_OBJECTS}
    assert len(md.storage_data) == sum(len(md.state_dict_metadata[t.fqn].chunks) for t in SAMPLE_TENSORS) \
        + len(SAMPLE_OBJECTS)


def test_payloads_load_weights_only(sample_dir):
    """What FileSystemReader does per item: torch.load of the
    [offset, offset+length) view, weights_only=True for tensors (bytes items
    are loaded with weights_only=False by stock load_bytes)."""
    md = FileSystemReader(str(sample_dir)).read_metadata()
    for key, info in md.storage_data.items():
        with open(sample_dir / info.relative_path, "rb") as f:
            f.seek(info.offset)
            data = f.read(info.length)
        entry = SAMPLE_BY_FQN[key.fqn]
        if key.offset is None:  # bytes item
            got = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
            diff = strict_equal(got, entry.value, key.fqn)
            assert diff is None, diff
        else:
            got = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
            chunk = next(c for c in md.state_dict_metadata[key.fqn].chunks if c.offsets == key.offset)
            full = torch_full(entry.dtype, entry.shape, entry.seed)
            want = full[tuple(slice(o, o + s) for o, s in zip(chunk.offsets, chunk.sizes))] \
                if entry.shape else full
            assert list(got.shape) == list(chunk.sizes)
            assert torch_bytes(got) == torch_bytes(want), key


@pytest.mark.parametrize("world", [2, 3])
def test_dtensor_reshard_load(sample_dir, world):
    """(b) 2 and 3 gloo processes load the 4-rank sample into DTensors."""
    proc = subprocess.run([sys.executable, str(HERE / "dist_worker.py"), "load-sample",
                           "--world", str(world), "--dir", str(sample_dir)],
                          capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    for r in range(world):
        assert f"rank {r}/{world}: sample loaded and checked" in proc.stdout, proc.stdout


# ---------------------------------------------------------------------------
# ckptd_demo (cli/demo_main.cc): 4 ranks, row-sharded float32 weights,
# replicated biases and 0-d norm scales, bytes items "step" and
# "optim.param_groups.0.{lr,betas,weight_decay}" (one leaf per key, as DCP
# flattens a list of dicts).

@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("demo") / "ckpt"
    exe = ic.bin_path("ckptd_demo")
    proc = subprocess.run([str(exe), "--dir", str(d), "--save-ranks", "4", "--load-ranks", "3",
                           "--size-mb", "1"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return d


def test_demo_tensors_load(demo_dir):
    items = ic.list_items(demo_dir)
    md = FileSystemReader(str(demo_dir)).read_metadata()
    sd = {}
    for fqn, it in items.items():
        if it["kind"] == "tensor":
            set_path(sd, tuple(it["path"]) if it["path"] else (fqn,),
                     torch.full(it["shape"], 7, dtype=getattr(torch, it["dtype"])))
    assert sd, "no tensors in the demo checkpoint"
    dcp.load(sd, checkpoint_id=str(demo_dir))
    for fqn, it in items.items():
        if it["kind"] != "tensor":
            continue
        got = get(sd, tuple(it["path"]) if it["path"] else (fqn,))
        ours = ic.read_box(demo_dir, fqn, [0] * len(it["shape"]), it["shape"])
        assert torch_bytes(got) == ours, fqn
        assert md.state_dict_metadata[fqn].properties.dtype == got.dtype


def test_demo_dcp_to_torch_save(demo_dir, tmp_path):
    """Every item of the demo, bytes items included, through the stock
    converter. Fails if an item's fqn/planner_data path is one that stock
    loaders cannot request (e.g. a bytes item at a list position whose list
    holds nothing else: the request flattens the list as a leaf)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    out = tmp_path / "demo.pt"
    dcp_to_torch_save(str(demo_dir), str(out))
    got = torch.load(out, map_location="cpu", weights_only=False)
    for fqn, it in ic.list_items(demo_dir).items():
        v = get(got, tuple(it["path"]) if it["path"] else (fqn,))
        if it["kind"] == "tensor":
            assert torch_bytes(v) == ic.read_box(demo_dir, fqn, [0] * len(it["shape"]), it["shape"])
        else:
            ours, text = ic.read_object(demo_dir, fqn)
            diff = strict_equal(v, ours, fqn)
            assert diff is None, diff
