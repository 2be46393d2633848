"""Interop of ckptd's .metadata codec (format/metadata/metadata.cc) with CPython pickle
and faithful re-creations of the PyTorch 2.x DCP classes (dcp_shim).

1. Our encoding (metadata_tool encode) unpickles with plain pickle.load and
   every field has the value and the type stock DCP code expects.
2. Metadata objects pickled by CPython (protocols 2, 4, 5, both
   TensorProperties modules, the memory-format enum by getattr and by value,
   pathlib and pathlib._local checkpoint ids, transform descriptors, custom
   planner objects) decode with metadata_tool to what Python holds.

Run: CKPTD_BUILD_DIR=<build> /usr/bin/python3 -m pytest tests/python
"""
import copy
import copyreg
import io
import json
import os
import pathlib
import pickle
import pickletools
import random
import sys
import uuid

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dcp_shim  # noqa: E402

dcp = dcp_shim.install()

MEMORY_FORMATS = [torch.contiguous_format, torch.channels_last,
                  torch.preserve_format]

# ckptd's 19 dtypes; torch 1.13 lacks the float8 and uint16/32/64 ones, which
# only the C++ round-trip tests cover.
ALL_DTYPES = ["float64", "float32", "float16", "bfloat16", "complex128",
              "complex64", "int64", "int32", "int16", "int8", "uint8", "bool",
              "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
              "float8_e5m2fnuz", "uint16", "uint32", "uint64"]
DTYPES = [d for d in ALL_DTYPES if isinstance(getattr(torch, d, None), torch.dtype)]


# ---------------------------------------------------------------------------
# The canonical JSON form metadata_tool prints, computed on the Python side.
# ---------------------------------------------------------------------------

def _planner(pd):
    if not isinstance(pd, dict):
        return None
    out = []
    for k, v in pd.items():
        if not isinstance(k, str) or not isinstance(v, (tuple, list)):
            return None
        if not all(type(e) in (str, int) for e in v):
            return None
        out.append([k, list(v)])
    return out


def _path_like(x):
    if isinstance(x, (str, os.PathLike)):
        return os.fspath(x)
    return None


def canonical(md):
    sdm = []
    for fqn, item in md.state_dict_metadata.items():
        if isinstance(item, dcp.BytesStorageMetadata):
            sdm.append({"fqn": fqn, "type": "bytes"})
            continue
        p = item.properties
        sdm.append({
            "fqn": fqn, "type": "tensor",
            "dtype": str(p.dtype)[len("torch."):],
            "requires_grad": bool(p.requires_grad),
            "pin_memory": bool(p.pin_memory),
            "memory_format": MEMORY_FORMATS.index(p.memory_format),
            "size": list(item.size),
            "chunks": [{"offsets": list(c.offsets), "sizes": list(c.sizes)}
                       for c in item.chunks],
        })
    sd = []
    for k, v in md.storage_data.items():
        sd.append({
            "fqn": k.fqn,
            "offset": None if k.offset is None else list(k.offset),
            "relative_path": v.relative_path,
            "file_offset": v.offset,
            "length": v.length,
            "transform_descriptors": list(v.transform_descriptors or []),
        })
    sm = md.storage_meta
    if isinstance(sm, dcp.StorageMeta):
        sm_json = {
            "checkpoint_id": _path_like(sm.checkpoint_id),
            "save_id": sm.save_id if isinstance(sm.save_id, str) else None,
            "load_id": sm.load_id if isinstance(sm.load_id, str) else None,
            # 2.4–2.6 objects have no 'modules' attribute at all.
            "modules": list(sm.__dict__.get("modules", [])),
        }
    else:
        sm_json = None
    return {"state_dict_metadata": sdm, "planner_data": _planner(md.planner_data),
            "storage_data": sd, "storage_meta": sm_json, "version": md.version}


def decode(tool, path):
    return json.loads(tool("metadata_tool", "decode", path).stdout)


# ---------------------------------------------------------------------------
# 1. Our encoding, read by Python
# ---------------------------------------------------------------------------

def sample_description(seed, with_storage_meta=True, explicit_planner=True):
    """A JSON description (metadata_tool encode input) covering every
    feature the encoder has."""
    rng = random.Random(seed)
    sdm, storage, planner = [], [], []
    files = ["__0_0.distcp", "__1_0.distcp", "__7_2.distcp", "sub/файл.distcp"]

    def info(fqn, offset):
        e = {"fqn": fqn, "offset": offset, "relative_path": rng.choice(files),
             "file_offset": rng.choice([0, 4096, 2**32 + 17, 2**63 - 1, 2**64 - 1]),
             "length": rng.choice([1, 2**31, 2**40 + 3]),
             "transform_descriptors": []}
        if rng.random() < 0.25:
            e["transform_descriptors"] = ["stream.zstd/1"]
        return e

    for i, dtype in enumerate(DTYPES):
        fqn = rng.choice(["model.layers.{}.w", "модель.{}.вес", "层.{}", "e😀.{}"]).format(i)
        ndim = i % 4  # 0-d tensors included
        size = [rng.choice([1, 7, 4096, 2**33 + 5]) for _ in range(ndim)]
        chunks = []
        for c in range(1 if ndim == 0 else rng.randint(1, 4)):
            offsets = [c * 2**34 if d == 0 else rng.choice([0, 5, 2**32 + 1])
                       for d in range(ndim)]
            sizes = [rng.choice([1, 3, 2**33]) for _ in range(ndim)]
            chunks.append({"offsets": offsets, "sizes": sizes})
            storage.append(info(fqn, offsets))
        sdm.append({"fqn": fqn, "type": "tensor", "dtype": dtype,
                    "requires_grad": i % 5 == 1, "pin_memory": i % 7 == 2,
                    "memory_format": 0 if i % 3 else rng.randint(0, 2),
                    "size": size, "chunks": chunks})
        planner.append([fqn, fqn.split(".")[:2] + [i]])
    for fqn in ["step", "rng.state", "ключ"]:
        sdm.append({"fqn": fqn, "type": "bytes"})
        storage.append(info(fqn, None))
        planner.append([fqn, [fqn]])
    rng.shuffle(storage)  # not chunk order: index hints must still be right
    desc = {"state_dict_metadata": sdm,
            "planner_data": planner if explicit_planner else None,
            "storage_data": storage,
            "storage_meta": None, "version": None}
    if with_storage_meta:
        desc["storage_meta"] = {"checkpoint_id": "/ckpt/ран-1", "save_id": str(uuid.uuid4()),
                                "load_id": None, "modules": ["model", "optim"]}
        desc["version"] = "1.0.0"
    return desc


def expected_after_encode(desc):
    want = copy.deepcopy(desc)
    if want["planner_data"] is None:
        want["planner_data"] = [[e["fqn"], [e["fqn"]]] for e in desc["state_dict_metadata"]]
    return want


def encode(tool, tmp_path, desc):
    src = tmp_path / "desc.json"
    src.write_text(json.dumps(desc, ensure_ascii=False), encoding="utf-8")
    out = tmp_path / ".metadata"
    tool("metadata_tool", "encode", src, out)
    return out


@pytest.mark.parametrize("with_storage_meta,explicit_planner",
                         [(True, True), (False, False), (True, False)])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_our_encoding_unpickles_with_plain_pickle(tool, tmp_path, seed,
                                                 with_storage_meta, explicit_planner):
    desc = sample_description(seed, with_storage_meta, explicit_planner)
    path = encode(tool, tmp_path, desc)
    data = path.read_bytes()
    assert data[:2] == b"\x80\x02"
    # No memory-format enum, no layout (TensorProperties(dtype) form), and
    # nothing pathlib.
    assert b"_MEM_FORMAT_ENCODING" not in data and b"pathlib" not in data

    with open(path, "rb") as f:
        md = pickle.load(f)
    assert type(md) is dcp.Metadata
    assert canonical(md) == expected_after_encode(desc)

    for fqn, item in md.state_dict_metadata.items():
        if isinstance(item, dcp.BytesStorageMetadata):
            assert item.__dict__ == {}
            continue
        assert type(item) is dcp.TensorStorageMetadata
        assert type(item.size) is torch.Size
        assert type(item.chunks) is list
        p = item.properties
        assert type(p) is dcp.TensorProperties
        assert isinstance(p.dtype, torch.dtype)
        assert p.layout is torch.strided
        assert isinstance(p.memory_format, torch.memory_format)
        # What a stock save pickles back out must be a valid TensorProperties.
        assert pickle.loads(pickle.dumps(p, 4)) == p
        for i, chunk in enumerate(item.chunks):
            assert type(chunk) is dcp.ChunkStorageMetadata
            assert type(chunk.offsets) is torch.Size and type(chunk.sizes) is torch.Size
            # The lookup a loader does: equality/hash on (fqn, offset) only.
            key = dcp.MetadataIndex(fqn, chunk.offsets)
            assert key in md.storage_data
            assert dcp.MetadataIndex(fqn, list(chunk.offsets), index=12345) in md.storage_data
            stored = next(k for k in md.storage_data if k == key)
            assert stored.index == i  # index hint = position in chunks
            assert type(stored.offset) is torch.Size

    for key, info in md.storage_data.items():
        assert type(key) is dcp.MetadataIndex
        assert type(info) is dcp._StorageInfo
        assert isinstance(info.offset, int) and isinstance(info.length, int)
        if key.offset is None:
            assert "offset" not in key.__dict__  # MetadataIndex(fqn)
            assert key.index is None
            assert isinstance(md.state_dict_metadata[key.fqn], dcp.BytesStorageMetadata)
        # _StorageInfo(path, offset, length) runs __init__: the attribute is
        # None (as in a Python-built object), unless descriptors were given.
        assert info.transform_descriptors in (None, ["stream.zstd/1"])
    assert dcp.MetadataIndex("step") in md.storage_data

    assert all(type(v) is tuple for v in md.planner_data.values())
    if with_storage_meta:
        sm = md.storage_meta
        assert type(sm) is dcp.StorageMeta
        assert sm.checkpoint_id == "/ckpt/ран-1" and sm.modules == ["model", "optim"]
        assert md.version == "1.0.0"
    else:
        assert md.storage_meta is None and md.version is None

    # Python re-pickles it (as a stock tool would) and we read that back.
    for protocol in (2, 4, 5):
        again = tmp_path / f"again{protocol}"
        again.write_bytes(pickle.dumps(md, protocol=protocol))
        assert decode(tool, again) == canonical(md)
    # And our own bytes decode to the description.
    assert decode(tool, path) == expected_after_encode(desc)


def test_our_encoding_is_compact(tool, tmp_path):
    desc = sample_description(7)
    data = encode(tool, tmp_path, desc).read_bytes()
    ops = [op.name for op, _, _ in pickletools.genops(data)]
    # Globals and FQNs are memoized: every GLOBAL is distinct.
    globals_ = [arg for op, arg, _ in pickletools.genops(data) if op.name == "GLOBAL"]
    assert len(globals_) == len(set(globals_))
    assert "BINGET" in ops or "LONG_BINGET" in ops
    pickletools.dis(data, out=io.StringIO())  # well-formed per pickletools


# ---------------------------------------------------------------------------
# 2. Python's pickles, read by us
# ---------------------------------------------------------------------------

class CustomPlannerState:
    """A custom planner's object inside planner_data (unknown global)."""
    __module__ = "my_planner"

    def __init__(self, x):
        self.x = x


def _register_custom_module():
    import types
    mod = types.ModuleType("my_planner")
    mod.CustomPlannerState = CustomPlannerState
    sys.modules["my_planner"] = mod


_register_custom_module()


def python_metadata(props="new", transforms=False, storage_meta="path",
                    modules=True, version=True, planner="dict"):
    """A Metadata as 2.x's DefaultSavePlanner + FileSystemWriter build it
    (dcp-format.md §3.3, §4.4–4.5), 2 ranks."""
    TP = dcp.TensorProperties if props == "new" else dcp.ShardTensorProperties
    Size = torch.Size

    def tp(t, memory_format=torch.contiguous_format):
        return TP(dtype=t.dtype, layout=t.layout, requires_grad=t.requires_grad,
                  memory_format=memory_format, pin_memory=False)

    w = torch.nn.Parameter(torch.zeros(4, 6, dtype=torch.bfloat16))
    sdm = {
        "model.w": dcp.TensorStorageMetadata(
            tp(w), Size([4, 6]),
            [dcp.ChunkStorageMetadata(Size([0, 0]), Size([2, 6])),
             dcp.ChunkStorageMetadata(Size([2, 0]), Size([2, 6]))]),
        "model.b": dcp.TensorStorageMetadata(
            tp(torch.zeros(()), torch.channels_last), Size([]),
            [dcp.ChunkStorageMetadata(Size([]), Size([]))]),
        "optim.ф": dcp.TensorStorageMetadata(
            tp(torch.zeros(3, dtype=torch.int64), torch.preserve_format), Size([2**40]),
            [dcp.ChunkStorageMetadata(Size([0]), Size([2**40]))]),
        "step": dcp.BytesStorageMetadata(),
    }
    storage = {
        dcp.MetadataIndex("model.w", Size([0, 0]), 0):
            dcp._StorageInfo("__0_0.distcp", 0, 1234),
        dcp.MetadataIndex("model.b", Size([]), 0):
            dcp._StorageInfo("__0_0.distcp", 1234, 99,
                             ["stream.zstd/1"] if transforms else None),
        dcp.MetadataIndex("step"): dcp._StorageInfo("__0_0.distcp", 1333, 77),
        dcp.MetadataIndex("model.w", Size([2, 0]), 1):
            dcp._StorageInfo("__1_0.distcp", 0, 2**33 + 1,
                             ("stream.zstd/1",) if transforms else None),
        dcp.MetadataIndex("optim.ф", Size([0]), 0):
            dcp._StorageInfo("__1_0.distcp", 2**33 + 1, 2**63 + 5),
    }
    if planner == "dict":
        pd = {"model.w": ("model", "w"), "model.b": ("model", "b"),
              "optim.ф": ("optim", "ф"), "step": ("step",)}
    elif planner == "list-paths":
        pd = {"model.w": ["model", 0, "w"], "step": ("step",)}
    elif planner == "custom-in-dict":
        pd = {"model.w": ("model", CustomPlannerState(1))}
    elif planner == "custom":
        pd = CustomPlannerState({"a": [1, 2]})
    else:
        pd = None
    md = dcp.Metadata(sdm, planner_data=pd, storage_data=storage)
    if storage_meta == "path":
        md.storage_meta = dcp.StorageMeta(pathlib.PosixPath("/ckpt/run1"),
                                          save_id=str(uuid.uuid4()))
    elif storage_meta == "str":
        md.storage_meta = dcp.StorageMeta("s3://bucket/x", save_id="s", load_id="l",
                                          modules=["model"])
    elif storage_meta == "custom":
        md.storage_meta = CustomPlannerState(3)
    if isinstance(md.storage_meta, dcp.StorageMeta) and not modules:
        del md.storage_meta.__dict__["modules"]  # as pickled by 2.4–2.6
    if version:
        md.version = "1.0.0"
    return md


def dumps(obj, protocol, enum_by_value=False):
    """pickle.dumps, optionally with the enum written as Python ≤3.10 does
    (EnumClass(value) via REDUCE) instead of 3.11's getattr(EnumClass, name)."""
    buf = io.BytesIO()
    p = pickle.Pickler(buf, protocol=protocol)
    if enum_by_value:
        table = copyreg.dispatch_table.copy()
        for cls in (dcp._MEM_FORMAT_ENCODING, dcp.MEM_FORMAT_ENCODING):
            table[cls] = lambda e: (type(e), (e.value,))
        p.dispatch_table = table
    p.dump(obj)
    return buf.getvalue()


def globals_of(data):
    """(module, name) of every GLOBAL / STACK_GLOBAL in a pickle, following
    memoized strings (protocol 4 fetches repeated module names with BINGET)."""
    out, memo, pushed = [], {}, []
    for op, arg, _ in pickletools.genops(data):
        name = op.name
        if name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
            pushed.append(arg)
        elif name in ("BINGET", "LONG_BINGET", "GET"):
            pushed.append(memo.get(arg))
        elif name == "MEMOIZE":
            memo[len(memo)] = pushed[-1] if pushed else None
        elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
            memo[arg] = pushed[-1] if pushed else None
        elif name == "GLOBAL":
            out.append(tuple(arg.split(" ", 1)))
            pushed.append(None)
        elif name == "STACK_GLOBAL":
            out.append((pushed[-2], pushed[-1]))
            pushed.append(None)
        elif name not in ("FRAME", "PROTO"):
            pushed.append(None)
    return out


@pytest.mark.parametrize("protocol", [2, 4, 5])
@pytest.mark.parametrize("props", ["new", "shard"])
@pytest.mark.parametrize("enum_by_value", [False, True])
def test_python_pickles_decode(tool, tmp_path, protocol, props, enum_by_value):
    md = python_metadata(props=props, transforms=True)
    data = dumps(md, protocol, enum_by_value)
    g = globals_of(data)
    enum_name = "_MEM_FORMAT_ENCODING" if props == "new" else "MEM_FORMAT_ENCODING"
    enum_module = dcp_shim.METADATA if props == "new" else dcp_shim.SHARD
    assert (enum_module, "TensorProperties") in g
    assert (enum_module, enum_name) in g
    getattr_global = ("__builtin__" if protocol < 3 else "builtins", "getattr")
    assert (getattr_global in g) == (not enum_by_value)
    assert ("pathlib", "PosixPath") in g
    assert ("torch.serialization", "_get_layout") in g
    assert pickle.loads(data) == md  # the pickle is valid Python-side

    path = tmp_path / ".metadata"
    path.write_bytes(data)
    got = decode(tool, path)
    assert got == canonical(md)
    assert got["storage_meta"]["checkpoint_id"] == "/ckpt/run1"
    assert got["version"] == "1.0.0"
    tds = {(e["fqn"], tuple(e["offset"] or ())): e["transform_descriptors"]
           for e in got["storage_data"]}
    assert tds[("model.b", ())] == ["stream.zstd/1"]
    assert tds[("step", ())] == []
    w = got["state_dict_metadata"][0]
    assert (w["dtype"], w["requires_grad"], w["size"]) == ("bfloat16", True, [4, 6])
    assert got["state_dict_metadata"][1]["memory_format"] == 1
    assert got["state_dict_metadata"][2]["memory_format"] == 2


@pytest.mark.parametrize("variant", [
    dict(storage_meta="str"),
    dict(storage_meta="path", modules=False),       # 2.4–2.6 StorageMeta
    dict(storage_meta=None, version=False),         # 2.3-style file
    dict(storage_meta="custom"),                    # unknown object → null
    dict(planner="list-paths"),
    dict(planner="custom-in-dict"),                 # → planner_data null
    dict(planner="custom"),
    dict(planner=None),
])
def test_python_variants_decode(tool, tmp_path, variant):
    md = python_metadata(**variant)
    for protocol in (2, pickle.DEFAULT_PROTOCOL):
        path = tmp_path / f"p{protocol}.metadata"
        path.write_bytes(pickle.dumps(md, protocol=protocol))
        got = decode(tool, path)
        assert got == canonical(md)
    if variant.get("planner", "dict") in ("custom", "custom-in-dict", None):
        assert got["planner_data"] is None
    if variant.get("storage_meta") == "custom":
        assert got["storage_meta"] is None
    if variant.get("modules") is False:
        assert got["storage_meta"]["modules"] == []


def test_pathlib_local_checkpoint_id(tool, tmp_path):
    """Python 3.13 pickles PosixPath as `pathlib._local PosixPath`, which
    3.11 cannot import; craft such files by byte-patching (protocol 2) and
    through a stand-in pathlib._local module (protocol 4)."""
    md = python_metadata(storage_meta="path")
    want = canonical(md)

    p2 = pickle.dumps(md, protocol=2)
    old, new = b"cpathlib\nPosixPath\n", b"cpathlib._local\nPosixPath\n"
    assert p2.count(old) == 1
    patched = p2.replace(old, new)
    assert ("pathlib._local", "PosixPath") in globals_of(patched)
    path = tmp_path / "local2.metadata"
    path.write_bytes(patched)
    assert decode(tool, path) == want

    import types

    class PosixPath(pathlib.PurePosixPath):
        __module__ = "pathlib._local"
        __qualname__ = "PosixPath"

    local = types.ModuleType("pathlib._local")
    local.PosixPath = PosixPath
    sys.modules["pathlib._local"] = local
    try:
        md.storage_meta.checkpoint_id = PosixPath("/ckpt/run1")
        p4 = pickle.dumps(md, protocol=4)
    finally:
        del sys.modules["pathlib._local"]
    assert ("pathlib._local", "PosixPath") in globals_of(p4)
    path = tmp_path / "local4.metadata"
    path.write_bytes(p4)
    assert decode(tool, path) == want


def test_non_filesystem_storage_data_is_rejected(tool, tmp_path):
    md = python_metadata()
    md.storage_data = {"model.w": "s3://bucket/obj"}
    path = tmp_path / ".metadata"
    path.write_bytes(pickle.dumps(md, protocol=4))
    proc = tool("metadata_tool", "decode", path, check=False)
    assert proc.returncode == 1
    assert f"{path}: storage_data entry 0 (key): expected MetadataIndex" in proc.stderr

    md.storage_data = None
    path.write_bytes(pickle.dumps(md, protocol=4))
    proc = tool("metadata_tool", "decode", path, check=False)
    assert proc.returncode == 1
    assert "other StorageWriters are not supported" in proc.stderr


def test_corrupt_python_pickles_fail_cleanly(tool, tmp_path):
    data = pickle.dumps(python_metadata(), protocol=4)
    rng = random.Random(5)
    path = tmp_path / ".metadata"
    for n in [0, 1, 2, 10, len(data) // 2, len(data) - 1]:
        path.write_bytes(data[:n])
        proc = tool("metadata_tool", "decode", path, check=False)
        assert proc.returncode == 1, n
        assert str(path) in proc.stderr
    for _ in range(40):
        b = bytearray(data)
        for _ in range(3):
            b[rng.randrange(len(b))] = rng.randrange(256)
        path.write_bytes(bytes(b))
        proc = tool("metadata_tool", "decode", path, check=False)
        assert proc.returncode in (0, 1), proc.stderr  # never a crash
