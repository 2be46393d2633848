"""The value formula and the layout of `interop_tool write-sample`, rebuilt in
Python independently of the C++ code (tests/tools/interop_tool.cc documents
the same thing in its file comment; keep the two in sync).

Pure Python: importable without torch and without numpy. Helpers that build
torch tensors import torch lazily.

Formula: element i (flat C-order index in the FULL tensor) of the tensor with
seed k has v = (i * 31 + k) mod 251, converted by dtype with element_value().
"""
import math
import struct

SAMPLE_RANKS = 4

# dtype name -> struct format of one element (little-endian); bfloat16 and
# the float8 types are packed by hand.
_STRUCT = {
    "float64": "<d", "float32": "<f", "float16": "<e",
    "complex128": "<dd", "complex64": "<ff",
    "int64": "<q", "int32": "<i", "int16": "<h", "int8": "<b",
    "uint8": "<B", "bool": "<?",
    "uint16": "<H", "uint32": "<I", "uint64": "<Q",
}

ELEMENT_SIZE = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "complex128": 16, "complex64": 8,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
    "uint16": 2, "uint32": 4, "uint64": 8,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
}

LEGACY_DTYPES = ["float64", "float32", "float16", "bfloat16", "complex128",
                 "complex64", "int64", "int32", "int16", "int8", "uint8",
                 "bool"]


def raw_value(i, seed):
    return (i * 31 + seed) % 251


def element_value(dtype, v):
    """The Python value of element v (0..250) for `dtype`."""
    if dtype in ("float64", "float32", "float16", "bfloat16"):
        return (v - 125) / 4
    if dtype in ("complex128", "complex64"):
        return complex((v - 125) / 4, (125 - v) / 8)
    if dtype == "int64":
        return (v - 125) * 68719476767
    if dtype == "int32":
        return (v - 125) * 16777259
    if dtype == "int16":
        return (v - 125) * 257
    if dtype == "int8":
        return v - 125
    if dtype == "uint8":
        return v
    if dtype == "bool":
        return v % 2 == 1
    # Newer dtypes (only in stock-saved fixtures, never in the C++ sample).
    if dtype in ("float8_e4m3fn", "float8_e5m2"):
        return (v % 16 - 8) / 2
    if dtype == "uint16":
        return v * 257
    if dtype == "uint32":
        return v * 16777259
    if dtype == "uint64":
        return v * 68719476767
    raise ValueError(f"no formula for dtype {dtype}")


def _float8_e4m3fn_bits(x):
    if x == 0:
        return 0x80 if math.copysign(1.0, x) < 0 else 0
    sign = 0x80 if x < 0 else 0
    a = abs(x)
    e = math.floor(math.log2(a))
    m = a / 2.0 ** e - 1.0
    field = e + 7
    assert 1 <= field <= 15, x
    mant = m * 8
    assert mant == int(mant), x
    return sign | (field << 3) | int(mant)


def pack_element(dtype, value):
    if dtype == "bfloat16":
        return struct.pack("<f", value)[2:4]  # exact: values have <= 8 bits
    if dtype == "float8_e5m2":
        return struct.pack("<e", value)[1:2]  # exact: top byte of float16
    if dtype == "float8_e4m3fn":
        return bytes([_float8_e4m3fn_bits(value)])
    fmt = _STRUCT[dtype]
    if dtype.startswith("complex"):
        return struct.pack(fmt, value.real, value.imag)
    return struct.pack(fmt, value)


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def c_strides(shape):
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return list(reversed(strides))


def box_indices(shape, offsets, sizes):
    """Flat indices (into the full tensor of `shape`) of the box, C order."""
    strides = c_strides(shape)
    if not shape:
        yield 0
        return
    if any(s == 0 for s in sizes):
        return
    idx = list(offsets)
    while True:
        yield sum(i * st for i, st in zip(idx, strides))
        d = len(shape) - 1
        while d >= 0:
            idx[d] += 1
            if idx[d] < offsets[d] + sizes[d]:
                break
            idx[d] = offsets[d]
            d -= 1
        if d < 0:
            return


def box_values(dtype, shape, seed, offsets=None, sizes=None):
    """Python values of the box (default: the whole tensor), C order."""
    offsets = list(offsets) if offsets is not None else [0] * len(shape)
    sizes = list(sizes) if sizes is not None else list(shape)
    return [element_value(dtype, raw_value(i, seed))
            for i in box_indices(shape, offsets, sizes)]


def box_bytes(dtype, shape, seed, offsets=None, sizes=None):
    """Raw little-endian C-order bytes of the box (what `interop_tool read`
    must produce), computed without torch."""
    return b"".join(pack_element(dtype, x)
                    for x in box_values(dtype, shape, seed, offsets, sizes))


def torch_full(dtype, shape, seed):
    """The full tensor as a torch tensor (torch imported lazily)."""
    import torch
    vals = box_values(dtype, shape, seed)
    tdt = getattr(torch, dtype)
    if dtype in ("float8_e4m3fn", "float8_e5m2"):
        t = torch.tensor(vals, dtype=torch.float32).to(tdt)
    elif dtype in ("uint16", "uint32", "uint64"):
        # torch.tensor() of these dtypes is not supported everywhere; go
        # through int64 (values fit) and convert.
        t = torch.tensor(vals, dtype=torch.int64).to(tdt)
    else:
        t = torch.tensor(vals, dtype=tdt)
    return t.reshape(shape)


def torch_bytes(t):
    """Raw C-order bytes of a CPU torch tensor of any dtype."""
    import torch
    t = t.detach().cpu().contiguous()
    if t.numel() == 0:
        return b""
    flat = t.reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    u8 = flat.view(torch.uint8)
    try:
        return u8.numpy().tobytes()
    except (RuntimeError, ImportError, TypeError):  # a torch built without numpy
        return bytes(u8.tolist())


# ---------------------------------------------------------------------------
# The sample's layout (mirrors SampleTensors() / SampleObjects() in
# interop_tool.cc).

def chunk_split(n, parts):
    """torch.chunk split of n into `parts`: [(offset, size)], size 0 past
    the end. DTensor's Shard placement splits the same way."""
    per = -(-n // parts) if parts else 0
    out = []
    for p in range(parts):
        off = min(n, p * per)
        out.append((off, min(n, off + per) - off))
    return out


def reshard_boxes(shape):
    """Boxes of a tensor that cross saved-chunk boundaries: the torch.chunk
    split of each dimension into 2 and 3 pieces, plus an interior box. A 0-d
    tensor gets its single (empty) box."""
    if not shape:
        return [([], [])]
    boxes = []
    for dim in range(len(shape)):
        for n in (2, 3):
            for off, size in chunk_split(shape[dim], n):
                if size == 0:
                    continue
                o, s = [0] * len(shape), list(shape)
                o[dim], s[dim] = off, size
                boxes.append((o, s))
    if all(x >= 3 for x in shape):
        boxes.append(([1] * len(shape), [x - 2 for x in shape]))
    return boxes


def sample_chunks(shape, layout):
    """[(rank, offsets, sizes)] of a sample tensor."""
    zeros = [0] * len(shape)
    out = []

    def split(dim, ranks):
        for r, (off, size) in zip(ranks, chunk_split(shape[dim], len(ranks))):
            if size == 0:
                continue
            o, s = list(zeros), list(shape)
            o[dim], s[dim] = off, size
            out.append((r, o, s))

    if layout == "rows":
        split(0, [0, 1, 2, 3])
    elif layout == "cols":
        split(1, [0, 1, 2, 3])
    elif layout == "rows01":
        split(0, [0, 1])
    elif layout == "cols23":
        split(1, [2, 3])
    elif layout == "grid":
        rows, cols = chunk_split(shape[0], 2), chunk_split(shape[1], 2)
        for r in range(4):
            out.append((r, [rows[r // 2][0], cols[r % 2][0]],
                        [rows[r // 2][1], cols[r % 2][1]]))
    elif layout == "replicated":
        out = [(r, list(zeros), list(shape)) for r in range(SAMPLE_RANKS)]
    elif layout.startswith("rank"):
        out = [(int(layout[4:]), list(zeros), list(shape))]
    else:
        raise ValueError(layout)
    return out


class T:
    """A sample tensor."""

    def __init__(self, fqn, path, dtype, shape, seed, layout):
        self.fqn, self.path, self.dtype = fqn, tuple(path), dtype
        self.shape, self.seed, self.layout = list(shape), seed, layout

    def chunks(self):
        return sample_chunks(self.shape, self.layout)

    def __repr__(self):
        return f"T({self.fqn}, {self.dtype}, {self.shape}, seed={self.seed})"


class B:
    """A sample bytes item."""

    def __init__(self, fqn, path, value):
        self.fqn, self.path, self.value = fqn, tuple(path), value

    def __repr__(self):
        return f"B({self.fqn}={self.value!r})"


SAMPLE_TENSORS = [
    T("model.layers.0.weight", ("model", "layers.0.weight"), "float32", [10, 7], 1, "rows"),
    T("model.layers.0.proj.weight", ("model", "layers.0.proj.weight"), "bfloat16", [6, 12], 2, "cols"),
    T("model.layers.1.weight", ("model", "layers.1.weight"), "float64", [6, 8], 3, "grid"),
    T("model.norm.scale", ("model", "norm.scale"), "float16", [16], 4, "replicated"),
    T("model.num_batches_tracked", ("model", "num_batches_tracked"), "int64", [], 5, "replicated"),
    T("model.empty", ("model", "empty"), "float32", [0, 5], 6, "rank0"),
    T("model.buffers.complex128", ("model", "buffers.complex128"), "complex128", [5], 7, "rank1"),
    T("model.buffers.complex64", ("model", "buffers.complex64"), "complex64", [2, 3], 8, "rank2"),
    T("model.buffers.int32", ("model", "buffers.int32"), "int32", [7], 9, "rank3"),
    T("model.buffers.int16", ("model", "buffers.int16"), "int16", [4, 2], 10, "rows01"),
    T("model.buffers.int8", ("model", "buffers.int8"), "int8", [9], 11, "rank0"),
    T("model.buffers.uint8", ("model", "buffers.uint8"), "uint8", [11], 12, "rank1"),
    T("model.buffers.bool", ("model", "buffers.bool"), "bool", [13], 13, "rank2"),
    T("model.buffers.int64", ("model", "buffers.int64"), "int64", [3, 4], 14, "cols23"),
    T("optim.state.layers.0.weight.exp_avg", ("optim", "state", "layers.0.weight", "exp_avg"),
      "float32", [10, 7], 15, "rows"),
    T("optim.state.layers.0.weight.step", ("optim", "state", "layers.0.weight", "step"),
      "float32", [], 16, "replicated"),
]

SAMPLE_OBJECTS = [
    B("step", ("step",), 1000),
    B("optim.param_groups.0.lr", ("optim", "param_groups", 0, "lr"), 3e-4),
    B("optim.param_groups.0.betas", ("optim", "param_groups", 0, "betas"), (0.9, 0.95)),
    B("optim.param_groups.0.eps", ("optim", "param_groups", 0, "eps"), 1e-8),
    B("optim.param_groups.0.weight_decay", ("optim", "param_groups", 0, "weight_decay"), 0.1),
    B("optim.param_groups.0.amsgrad", ("optim", "param_groups", 0, "amsgrad"), False),
    B("optim.param_groups.0.params", ("optim", "param_groups", 0, "params"),
      ["layers.0.weight", "layers.0.proj.weight"]),
    B("optim.param_groups.1.lr", ("optim", "param_groups", 1, "lr"), 1e-3),
    B("optim.param_groups.1.params", ("optim", "param_groups", 1, "params"), ["norm.scale"]),
    B("extra.note", ("extra", "note"), "ckptd interop sample \u2014 \u00fcnic\u00f6de \u2713"),
    B("extra.config", ("extra", "config"),
      {"name": "tiny", "layers": 2, "dims": [10, 7], "ratio": 0.5, "tags": None}),
    B("extra.nothing", ("extra", "nothing"), None),
    B("extra.flag", ("extra", "flag"), True),
    B("extra.big_int", ("extra", "big_int"), 2**40 + 3),
    B("extra.neg_int", ("extra", "neg_int"), -(2**62)),
    B("extra.neg_float", ("extra", "neg_float"), -2.5e-10),
    B("extra.mixed_list", ("extra", "mixed_list"), [1, "two", 3.0, None, True]),
]

SAMPLE_BY_FQN = {x.fqn: x for x in SAMPLE_TENSORS + SAMPLE_OBJECTS}


# ---------------------------------------------------------------------------
# Nesting and strict comparison.

def set_path(root, path, value):
    """Places value at path in nested dicts/lists (what DCP's set_element
    does): an int path element indexes a list, created and extended as
    needed."""
    cur = root
    for k, (elem, nxt) in enumerate(zip(path, path[1:])):
        empty = [] if isinstance(nxt, int) else {}
        if isinstance(cur, list):
            while len(cur) <= elem:
                cur.append(None)
            if cur[elem] is None:
                cur[elem] = empty
            cur = cur[elem]
        else:
            cur = cur.setdefault(elem, empty)
    last = path[-1]
    if isinstance(cur, list):
        while len(cur) <= last:
            cur.append(None)
    cur[last] = value


def expected_nested(tensor_factory=None, object_factory=None):
    """The sample as the nested state dict that dcp_to_torch_save rebuilds
    from planner_data. tensor_factory(T) gives each tensor's value (default:
    the full torch tensor); object_factory(B) each bytes item's."""
    tensor_factory = tensor_factory or (lambda t: torch_full(t.dtype, t.shape, t.seed))
    object_factory = object_factory or (lambda b: b.value)
    root = {}
    for t in SAMPLE_TENSORS:
        set_path(root, t.path, tensor_factory(t))
    for b in SAMPLE_OBJECTS:
        set_path(root, b.path, object_factory(b))
    return root


def strict_equal(a, b, path="root"):
    """Recursive equality that also compares types (1 != 1.0 != True) and
    tensors by dtype, shape and bytes. Returns None or a description of the
    first difference."""
    ta, tb = type(a), type(b)
    if hasattr(a, "dtype") and hasattr(a, "shape") and hasattr(b, "dtype"):
        if a.dtype != b.dtype:
            return f"{path}: dtype {a.dtype} != {b.dtype}"
        if tuple(a.shape) != tuple(b.shape):
            return f"{path}: shape {tuple(a.shape)} != {tuple(b.shape)}"
        if torch_bytes(a) != torch_bytes(b):
            return f"{path}: tensor values differ:\n{a}\n!=\n{b}"
        return None
    if ta is not tb:
        # OrderedDict vs dict is fine.
        if not (isinstance(a, dict) and isinstance(b, dict)):
            return f"{path}: type {ta.__name__} != {tb.__name__} ({a!r} vs {b!r})"
    if isinstance(a, dict):
        if list(a.keys()) != list(b.keys()) and set(a.keys()) != set(b.keys()):
            return f"{path}: keys {sorted(map(str, a))} != {sorted(map(str, b))}"
        for k in a:
            d = strict_equal(a[k], b[k], f"{path}[{k!r}]")
            if d:
                return d
        return None
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{path}: length {len(a)} != {len(b)} ({a!r} vs {b!r})"
        for k, (x, y) in enumerate(zip(a, b)):
            d = strict_equal(x, y, f"{path}[{k}]")
            if d:
                return d
        return None
    if isinstance(a, float) and math.isnan(a) and math.isnan(b):
        return None
    if a != b:
        return f"{path}: {a!r} != {b!r}"
    return None
