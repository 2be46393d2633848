"""torch.save interop of the C++ zip writer/reader (format/zip/zip.cc,
format/tensor/tensor_payload.cc) against Debian's torch 1.13, via payload_tool.

(1) Files we write load with torch.load (values, dtype, shape, stride), also
    through a byte slice of a bigger file and with forced zip64 fields, and
    pass Python's zipfile CRC checks.
(2) Files torch.save wrote parse with our reader, byte-exact.

Run: /usr/bin/python3 -m pytest tests/python/test_torch_payload.py
"""
import io
import json
import pickletools
import zipfile

import pytest

LEGACY_DTYPES = [
    "float64", "float32", "float16", "bfloat16", "complex128", "complex64",
    "int64", "int32", "int16", "int8", "uint8", "bool",
]
V3_DTYPES = [
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
    "uint16", "uint32", "uint64",
]
SHAPES = ["scalar", "0", "5", "3,0", "0,4", "2,3", "3,4,5", "2,3,2,3", "1,7,1"]
LAYOUTS = ["contiguous", "transpose", "strided"]


def parse_shape(s):
    return [] if s == "scalar" else [int(x) for x in s.split(",")]


def contiguous_strides(sizes):
    strides, s = [], 1
    for n in reversed(sizes):
        strides.insert(0, s)
        s *= max(n, 1)
    return strides


def tensor_bytes(torch, t):
    """The elements of t in C order, as raw bytes."""
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def write(tool, tmp_path, dtype, shape, *flags, name="t.pt"):
    path = tmp_path / name
    raw = tmp_path / (name + ".raw")
    base = tmp_path / (name + ".base")
    out = tool("payload_tool", "write", path, dtype, shape, "--raw", raw,
               "--base", base, *flags)
    info = json.loads(out.stdout)
    return path, raw.read_bytes(), base.read_bytes(), info


def check_loaded(torch, t, dtype, sizes, raw, base=None, info=None):
    assert t.dtype == getattr(torch, dtype)
    assert list(t.shape) == sizes
    assert list(t.stride()) == contiguous_strides(sizes)
    assert t.storage_offset() == 0
    assert tensor_bytes(torch, t) == raw
    if base is not None and len(base) > 0 and len(raw) > 0:
        # Independent check of the gather: torch's own strided view of the
        # source buffer.
        b = torch.frombuffer(bytearray(base), dtype=getattr(torch, dtype))
        expected = torch.as_strided(b, sizes, info["source_strides"],
                                    info["source_offset"])
        assert tensor_bytes(torch, expected) == raw


# ---------------------------------------------------------------------------
# (1) Our files load in torch 1.13.
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", LEGACY_DTYPES)
def test_torch_loads_our_file(tool, torch, tmp_path, dtype, shape, layout):
    sizes = parse_shape(shape)
    path, raw, base, info = write(tool, tmp_path, dtype, shape, "--layout",
                                  layout, "--seed", "7")
    t = torch.load(path)
    check_loaded(torch, t, dtype, sizes, raw, base, info)
    t2 = torch.load(path, weights_only=True)
    assert tensor_bytes(torch, t2) == raw
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None  # every CRC-32 checks out
        assert [i.filename for i in z.infolist()] == [
            "archive/data.pkl", "archive/byteorder", "archive/data/0",
            "archive/version"]
        assert all(i.compress_type == zipfile.ZIP_STORED for i in z.infolist())
        assert z.read("archive/data/0") == raw
        assert z.read("archive/version") == b"3\n"
        assert z.read("archive/byteorder") == b"little"


@pytest.mark.parametrize("dtype", LEGACY_DTYPES)
def test_data_is_64_byte_aligned(tool, torch, tmp_path, dtype):
    path, raw, _, _ = write(tool, tmp_path, dtype, "3,5")
    data = path.read_bytes()
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            off = info.header_offset
            assert data[off:off + 4] == b"PK\x03\x04"
            name_len = int.from_bytes(data[off + 26:off + 28], "little")
            extra_len = int.from_bytes(data[off + 28:off + 30], "little")
            start = off + 30 + name_len + extra_len
            assert start % 64 == 0
            assert data[start:start + info.file_size] == z.read(info)


@pytest.mark.parametrize("dtype", ["float32", "int64", "bool", "complex128"])
@pytest.mark.parametrize("zip64", [False, True])
def test_torch_load_through_offset_view(tool, torch, tmp_path, dtype, zip64):
    """A DCP item: the archive at [offset, offset + length) of a bigger file."""
    flags = ["--pad-before", "4097", "--pad-after", "333", "--layout",
             "transpose"] + (["--zip64"] if zip64 else [])
    path, raw, base, info = write(tool, tmp_path, dtype, "6,5", *flags)
    data = path.read_bytes()
    off, length = info["offset"], info["length"]
    assert off == 4097 and len(data) == off + length + 333
    view = io.BytesIO(data[off:off + length])
    t = torch.load(view)
    check_loaded(torch, t, dtype, [6, 5], raw, base, info)
    # Our reader through the same range.
    out = tool("payload_tool", "read", path, "--offset", off, "--length",
               length, "--raw", tmp_path / "back.raw")
    meta = json.loads(out.stdout)
    assert meta["sizes"] == [6, 5] and meta["dtype"] == dtype
    assert (tmp_path / "back.raw").read_bytes() == raw


@pytest.mark.parametrize("shape", ["scalar", "0", "2,3", "4,5,6"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "uint8"])
def test_forced_zip64_accepted_by_zipfile_and_torch(tool, torch, tmp_path,
                                                    dtype, shape):
    path, raw, base, info = write(tool, tmp_path, dtype, shape, "--zip64",
                                  "--layout", "strided")
    data = path.read_bytes()
    assert b"PK\x06\x06" in data and b"PK\x06\x07" in data
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None
        infos = z.infolist()
        assert len(infos) == 4
        for i in infos:
            # Central directory fields are 0xffffffff placeholders resolved
            # from the zip64 extra field.
            assert i.file_size == len(z.read(i))
        assert z.read("archive/data/0") == raw
    t = torch.load(path)
    check_loaded(torch, t, dtype, parse_shape(shape), raw, base, info)


def test_segments_equal_finish_into(tool, torch, tmp_path):
    a, raw_a, _, _ = write(tool, tmp_path, "float32", "7,9", "--layout",
                           "transpose", name="a.pt")
    b, raw_b, _, _ = write(tool, tmp_path, "float32", "7,9", "--layout",
                           "transpose", "--segments", name="b.pt")
    assert a.read_bytes() == b.read_bytes()
    assert raw_a == raw_b


@pytest.mark.parametrize("dtype", V3_DTYPES)
def test_v3_dtypes_are_valid_zip_and_pickle(tool, tmp_path, dtype):
    """torch 1.13 predates these dtypes: check the zip and the pickle."""
    path, raw, _, _ = write(tool, tmp_path, dtype, "2,3", "--layout",
                            "transpose")
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None
        assert z.read("archive/data/0") == raw
        pkl = z.read("archive/data.pkl")
    ops = [(op.name, arg) for op, arg, _ in pickletools.genops(pkl)]
    assert ("GLOBAL", "torch._utils _rebuild_tensor_v3") in ops
    # torch.save's spelling: torch 2.x's weights-only unpickler (dcp.load)
    # allow-lists "torch.storage.UntypedStorage" only.
    assert ("GLOBAL", "torch.storage UntypedStorage") in ops
    assert ("GLOBAL", "torch " + dtype) in ops
    out = json.loads(tool("payload_tool", "read", path).stdout)
    assert out["dtype"] == dtype
    assert out["storage_nbytes"] == len(raw)


def test_pickle_program_matches_torch(tool, torch, tmp_path):
    """Our data.pkl is torch 1.13's program minus the BINPUT memo stores."""
    path, _, _, _ = write(tool, tmp_path, "float32", "2,3")
    theirs = tmp_path / "theirs.pt"
    torch.save(torch.zeros(2, 3), theirs)

    def ops(p):
        with zipfile.ZipFile(p) as z:
            prefix = z.namelist()[0].split("/")[0]  # torch: the file stem
            pkl = z.read(prefix + "/data.pkl")
        return [(op.name, arg) for op, arg, _ in pickletools.genops(pkl)
                if op.name not in ("BINPUT", "LONG_BINPUT")]

    assert ops(path) == ops(theirs)


# ---------------------------------------------------------------------------
# (2) Files torch.save wrote parse with our reader.
# ---------------------------------------------------------------------------

def make_tensor(torch, dtype, sizes, seed=0):
    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, dtype)
    n = 1
    for s in sizes:
        n *= s
    if dtype == "bool":
        flat = torch.randint(0, 2, (n,), generator=g).bool()
    elif dt.is_floating_point or dt.is_complex:
        flat = (torch.randn(n, generator=g, dtype=torch.float64) * 100).to(dt)
        if dt.is_complex:
            flat = flat + 1j * flat.flip(0).to(dt)
    else:
        info = torch.iinfo(dt)
        flat = torch.randint(max(info.min, -1000), min(info.max, 1000) + 1,
                             (n,), generator=g).to(dt)
    return flat.reshape(sizes)


def read_ours(tool, tmp_path, path, *flags):
    raw = tmp_path / "ours.raw"
    out = tool("payload_tool", "read", path, "--raw", raw, *flags)
    return json.loads(out.stdout), raw.read_bytes()


def check_parsed(torch, meta, raw, t):
    dtype = str(t.dtype).replace("torch.", "")
    assert meta["dtype"] == dtype
    assert meta["sizes"] == list(t.shape)
    assert meta["strides"] == list(t.stride())
    assert meta["storage_offset"] == t.storage_offset()
    assert meta["storage_nbytes"] == t.storage().nbytes()
    assert meta["big_endian"] is False
    assert raw == tensor_bytes(torch, t)


@pytest.mark.parametrize("shape", ["scalar", "0", "5", "3,0", "2,3", "3,4,5",
                                   "2,3,2,3"])
@pytest.mark.parametrize("dtype", LEGACY_DTYPES)
def test_we_parse_torch_save(tool, torch, tmp_path, dtype, shape):
    t = make_tensor(torch, dtype, parse_shape(shape), seed=len(shape))
    path = tmp_path / "theirs.pt"
    torch.save(t, path)
    meta, raw = read_ours(tool, tmp_path, path)
    check_parsed(torch, meta, raw, t)


@pytest.mark.parametrize("dtype", LEGACY_DTYPES)
@pytest.mark.parametrize("view", ["t", "offset", "columns", "permute", "big"])
def test_we_parse_torch_save_views(tool, torch, tmp_path, dtype, view):
    x = make_tensor(torch, dtype, [6, 8], seed=3)
    if view == "t":
        t = x.t()
    elif view == "offset":
        t = x[2:]
    elif view == "columns":
        t = x[1:, 1::3]
    elif view == "permute":
        t = make_tensor(torch, dtype, [3, 4, 5], seed=4).permute(2, 0, 1)
    else:  # BININT/LONG-sized numbers in the pickle
        t = make_tensor(torch, dtype, [70000], seed=5)[66000:]
    path = tmp_path / "theirs.pt"
    torch.save(t, path)
    meta, raw = read_ours(tool, tmp_path, path)
    check_parsed(torch, meta, raw, t)


def test_we_parse_torch_save_inside_bigger_file(tool, torch, tmp_path):
    t = make_tensor(torch, "float32", [5, 7], seed=9).t()
    buf = io.BytesIO()
    torch.save(t, buf)
    blob = buf.getvalue()
    path = tmp_path / "item.distcp"
    path.write_bytes(b"\x00" * 1234 + blob + b"\xff" * 99)
    meta, raw = read_ours(tool, tmp_path, path, "--offset", 1234, "--length",
                          len(blob))
    check_parsed(torch, meta, raw, t)


def zip_listing(path):
    """(name, data offset, size, crc) per entry, as Python's zipfile sees it."""
    data = path.read_bytes()
    out = []
    with zipfile.ZipFile(path) as z:
        for i in z.infolist():
            off = i.header_offset
            name_len = int.from_bytes(data[off + 26:off + 28], "little")
            extra_len = int.from_bytes(data[off + 28:off + 30], "little")
            out.append((i.filename, off + 30 + name_len + extra_len,
                        i.file_size, i.CRC))
    return out


def check_records(tool, path):
    out = json.loads(tool("payload_tool", "records", path).stdout)
    ours = [(e["name"], e["data_offset"], e["size"], e["crc32"])
            for e in out["entries"]]
    assert ours == zip_listing(path)
    assert all(e["crc_ok"] for e in out["entries"])
    assert out["prefix"] == path.stem  # torch.save(obj, path) uses the stem
    assert out["pickle"] == "ok", out["pickle"]
    return out


def test_records_of_shared_storage_container(tool, torch, tmp_path):
    x = make_tensor(torch, "float32", [4, 4], seed=1)
    y = make_tensor(torch, "int64", [3], seed=2)
    path = tmp_path / "container.pt"
    torch.save({"a": x, "b": x[1:], "c": y, "d": [x.t(), 3]}, path)
    out = check_records(tool, path)
    names = [e["name"] for e in out["entries"]]
    assert "container/data/0" in names and "container/data/1" in names
    assert "container/data/2" not in names  # x's views share one storage
    assert "_rebuild_tensor_v2" in out["pickle_debug"]
    # Not a single tensor: the payload parser says so precisely.
    proc = tool("payload_tool", "read", path, check=False)
    assert proc.returncode == 1
    assert "expected a call to torch._utils._rebuild_tensor_v2/v3" in proc.stderr
    assert str(path) + " @ 0" in proc.stderr


@pytest.mark.parametrize("obj", [
    5,
    "text",
    None,
    {"a": [1, 2.5, "x", None, (True, False)], "b": {"c": 3, "d": b"bytes"}},
    [[[[1]]], {"k": (1, (2, (3,)))}],
    {"lr": 0.001, "betas": (0.9, 0.999), "step": 2 ** 40},
])
def test_records_of_primitive_containers(tool, torch, tmp_path, obj):
    path = tmp_path / "obj.pt"
    torch.save(obj, path)
    out = check_records(tool, path)
    assert [e["name"] for e in out["entries"]] == ["obj/data.pkl",
                                                   "obj/version"]
