"""ckptd reads checkpoints written by stock torch.distributed.checkpoint.save
(torch >= 2.4): plain tensors of every legacy dtype and the newer ones, a
transposed (non-contiguous) view saved with its strides, a narrowed view,
0-d tensors, bytes items of many kinds, nested dicts and lists, several
files per rank, and DTensors sharded by 2 and 4 gloo processes (1-D and 2x2
meshes, an uneven split with an empty shard, Replicate).

Each checkpoint is checked by fixture_check.check_fixture (the same checker
CI runs on the committed fixtures): interop_tool list/read/read-object give
the formula's values for full and resharded boxes, and `ckptctl verify`
passes when ckptctl is built. ckptctl convert must match dcp_to_torch_save.
"""
import io
import json
import pathlib
import subprocess
import sys

import pytest

import fixture_check
import interop_common as ic
import make_fixtures
import stock_spec
from sample_spec import strict_equal

# Without torch>=2.4 every test here is reported SKIPPED with the reason
# (and `pytest tests/interop` alone still exits 0, not 5).
torch, _REASON = ic.torch_status()
pytestmark = pytest.mark.skipif(torch is None, reason=_REASON or "")
if torch is not None:
    from torch.distributed.checkpoint import FileSystemReader

HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> checkpoint dir, saved on first use."""
    root = tmp_path_factory.mktemp("stock")
    cache = {}

    def get(name):
        if name not in cache:
            rec = make_fixtures.save_fixture(name, root / name)
            if rec is None:
                if name == "zstd":
                    pytest.skip(f"torch {torch.__version__}: {ic.stock_zstd()[1]}")
                if name == "safetensors":
                    pytest.skip(f"torch {torch.__version__}: {make_fixtures.safetensors_format()[1]}")
                pytest.skip(f"torch {torch.__version__} has none of {stock_spec.NEWER_DTYPES}")
            cache[name] = root / name
        return cache[name]

    return get


@pytest.mark.parametrize("name", ["plain", "newer_dtypes", "multi_file", "per_item_files"])
def test_single_process_saves(saved, name):
    fixture_check.check_fixture(saved(name))


def test_zstd_save(saved):
    """FileSystemWriter(_extensions=[ZStandard()]) (torch >= 2.7): every
    payload a zstd stream; ckptd's reader, verify and convert decode them."""
    d = saved("zstd")
    md = FileSystemReader(str(d)).read_metadata()
    descriptors = {tuple(info.transform_descriptors or ()) for info in md.storage_data.values()}
    assert descriptors == {("stream.zstd/1",)}, descriptors
    fixture_check.check_fixture(d)


def test_safetensors_format_save(saved):
    """FileSystemWriter(serialization_format=SAFETENSORS) (torch >= 2.8):
    tensors in one safetensors blob per data file, which stock
    FileSystemReader cannot read; ckptd's reader, verify and convert can."""
    d = saved("safetensors")
    md = FileSystemReader(str(d)).read_metadata()
    offsets = {info.offset for idx, info in md.storage_data.items()
               if idx.offset is not None}
    assert len(offsets) == 1, offsets  # every tensor at the blob's offset
    fixture_check.check_fixture(d)


def test_multi_file_layouts_have_several_files(saved):
    """Guards the test itself: these writers really made several files per
    rank (3 buckets for thread_count=3; one file per item otherwise)."""
    files = sorted(p.name for p in saved("multi_file").glob("__0_*.distcp"))
    assert len(files) >= 2, files
    files = sorted(p.name for p in saved("per_item_files").glob("__0_*.distcp"))
    assert len(files) >= 2, files


@pytest.mark.parametrize("world", [2, 4])
def test_dtensor_saves(saved, world):
    d = saved(f"dtensor_{world}ranks")
    fixture_check.check_fixture(d)
    # Every rank wrote its own file.
    assert {p.name for p in d.glob("*.distcp")} >= {f"__{r}_0.distcp" for r in range(world)}


def test_transposed_view_was_saved_with_its_strides(saved):
    """Guards the test itself: stock DCP keeps a transposed view's strides
    (no clone when the storage is exactly numel), so ckptd's strided path
    is exercised."""
    d = saved("plain")
    md = FileSystemReader(str(d)).read_metadata()
    (key, info), = [(k, v) for k, v in md.storage_data.items() if k.fqn == "views.transposed"]
    with open(d / info.relative_path, "rb") as f:
        f.seek(info.offset)
        t = torch.load(io.BytesIO(f.read(info.length)), weights_only=True)
    assert list(t.shape) == [3, 5]
    assert not t.is_contiguous(), t.stride()


def test_bytes_items_are_separate_leaves(saved):
    """Nested dicts are flattened to one item per leaf; lists of primitives
    and tuples are single items; a list of dicts is descended."""
    items = ic.list_items(saved("plain"))
    assert items["objects.nested.level2.leaf"]["path"] == ["objects", "nested", "level2", "leaf"]
    assert items["objects.dict_in_list.1.b"]["path"] == ["objects", "dict_in_list", 1, "b"]
    assert items["objects.tuple"]["kind"] == "bytes"
    assert items["objects.list"]["kind"] == "bytes"
    assert items["step"]["path"] == ["step"]


@pytest.mark.parametrize("name", ["plain", "dtensor_4ranks"])
def test_ckptctl_convert_matches_dcp_to_torch_save(saved, name, tmp_path):
    if not ic.have_ckptctl():
        pytest.skip(f"{ic.bin_path('ckptctl')} not built yet")
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    d = saved(name)
    ours, stock = tmp_path / "ours.pt", tmp_path / "stock.pt"
    ic.ckptctl("convert", d, ours)
    dcp_to_torch_save(str(d), str(stock))
    a = torch.load(ours, map_location="cpu", weights_only=False)
    b = torch.load(stock, map_location="cpu", weights_only=False)
    diff = strict_equal(a, b)
    assert diff is None, diff


def test_ckptctl_inspect_json(saved):
    if not ic.have_ckptctl():
        pytest.skip(f"{ic.bin_path('ckptctl')} not built yet")
    d = saved("dtensor_4ranks")
    text = json.dumps(json.loads(ic.ckptctl("inspect", d, "--json").stdout))
    for fqn in stock_spec.dcp_flatten(stock_spec.dtensor_spec(4)):
        assert json.dumps(fqn) in text, fqn


def test_make_fixtures_script(tmp_path):
    """The script the GPU session runs: all fixtures, under the size limit,
    and each passes the checker CI will run."""
    proc = subprocess.run([sys.executable, str(HERE / "make_fixtures.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (root,) = list(tmp_path.iterdir())
    assert root.name == make_fixtures.version_dir_name(torch.__version__)
    manifest = json.loads((root / "MANIFEST.json").read_text())
    assert manifest["torch_version"] == torch.__version__
    dirs = sorted(p for p in root.iterdir() if p.is_dir())
    assert {p.name for p in dirs} >= {"plain", "multi_file", "per_item_files", "dtensor_2ranks",
                                      "dtensor_4ranks"}
    for d in dirs:
        fixture_check.check_fixture(d)
