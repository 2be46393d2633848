"""State dicts that stock `torch.distributed.checkpoint.save` writes for the
ckptd-reads-stock tests (test_ckptd_reads_dcp_save.py), for the DTensor
saves of dist_worker.py, and for make_fixtures.py; plus the expected.json
records that let a reader without torch check ckptd against them.

Pure Python at import; torch is imported lazily by the builders.

A spec is a nested dict whose leaves are TS (a tensor defined by the
formula of sample_spec.py) or plain Python values (saved by DCP as bytes
items).
"""
import hashlib
import sys

from sample_spec import (box_indices, box_values, chunk_split, numel, pack_element, torch_bytes,
                         torch_full)

FIXTURE_FORMAT = "ckptd-torch2-fixture/1"


class TS:
    """A tensor leaf: the formula tensor of `base_shape` with `seed`, then
    `transform` applied (None; "t" = 2-D transpose, saved as a
    non-contiguous view; ("narrow0", a, b) = rows [a, b) of the base, a view
    whose storage is larger than the tensor). `dist` (DTensor saves only) is
    (mesh, placements): mesh "1d" (all ranks) or "2d" (2x2), placements a
    list of ("S", dim) / ("R",) per mesh dimension."""

    def __init__(self, dtype, base_shape, seed, transform=None, dist=None):
        self.dtype, self.base_shape, self.seed = dtype, list(base_shape), seed
        self.transform, self.dist = transform, dist

    @property
    def shape(self):
        if self.transform == "t":
            return [self.base_shape[1], self.base_shape[0]]
        if isinstance(self.transform, tuple) and self.transform[0] == "narrow0":
            _, a, b = self.transform
            return [b - a] + self.base_shape[1:]
        return list(self.base_shape)

    def values(self):
        """Python values of the saved tensor, C order."""
        base = box_values(self.dtype, self.base_shape, self.seed)
        if self.transform is None:
            return base
        if self.transform == "t":
            r, c = self.base_shape
            return [base[j * c + i] for i in range(c) for j in range(r)]
        _, a, b = self.transform
        row = numel(self.base_shape[1:])
        return base[a * row:b * row]

    def box_bytes(self, offsets=None, sizes=None):
        vals = self.values()
        shape = self.shape
        offsets = list(offsets) if offsets is not None else [0] * len(shape)
        sizes = list(sizes) if sizes is not None else shape
        return b"".join(pack_element(self.dtype, vals[i])
                        for i in box_indices(shape, offsets, sizes))

    def torch_value(self):
        """The tensor as it is put in the state dict (views kept as views)."""
        base = torch_full(self.dtype, self.base_shape, self.seed)
        if self.transform is None:
            return base
        if self.transform == "t":
            return base.t()
        _, a, b = self.transform
        return base[a:b]

    def to_json(self):
        return {"dtype": self.dtype, "base_shape": self.base_shape, "seed": self.seed,
                "transform": list(self.transform) if isinstance(self.transform, tuple)
                else self.transform}

    @staticmethod
    def from_json(j):
        tr = j.get("transform")
        return TS(j["dtype"], j["base_shape"], j["seed"],
                  tuple(tr) if isinstance(tr, list) else tr)

    def __repr__(self):
        return f"TS({self.dtype}, {self.base_shape}, seed={self.seed}, {self.transform})"


# ---------------------------------------------------------------------------
# Flattening exactly as DCP 2.4+ does it (torch/distributed/checkpoint/
# _traverse.py traverse_state_dict): mappings are always descended (keys
# str()-ed); a list is descended (int path items) only if some element is a
# tensor, or a mapping, or a non-terminal list; tuples and everything else
# are leaves; an empty dict produces nothing.

def _is_terminal(v, is_tensor):
    if isinstance(v, dict):
        return False
    if isinstance(v, list):
        for e in v:
            if isinstance(e, (dict, list)) and not _is_terminal(e, is_tensor):
                return False
            if is_tensor(e):
                return False
        return True
    return True


def dcp_flatten(sd, is_tensor=lambda x: isinstance(x, TS)):
    """{fqn: (path, leaf)} in traversal order."""
    out = {}

    def walk(path, v):
        if isinstance(v, dict):
            for k, x in v.items():
                walk(path + (str(k),), x)
        elif _is_terminal(v, is_tensor):
            fqn = ".".join(str(p) for p in path)
            assert fqn not in out, f"duplicated flatten key {fqn}"
            out[fqn] = (path, v)
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                walk(path + (i,), x)

    for k, v in sd.items():
        walk((str(k),), v)
    return out


def materialize(spec, leaf=lambda ts: ts.torch_value()):
    """The spec with every TS replaced by leaf(ts) (lists/dicts copied)."""
    if isinstance(spec, TS):
        return leaf(spec)
    if isinstance(spec, dict):
        return {k: materialize(v, leaf) for k, v in spec.items()}
    if isinstance(spec, list):
        return [materialize(v, leaf) for v in spec]
    return spec


# ---------------------------------------------------------------------------
# The specs.

OBJECTS = {
    "int": 42,
    "neg_int": -7,
    "big_int": 2**62 + 1,
    "float": 2.5,
    "small_float": 1e-300,
    "str": "h\u00e9llo \u2713",
    "none": None,
    "bool": True,
    "raw_bytes": b"\x00\x01\xff",
    "list": [1, 2.0, "three", None, False],
    "int_list": [3, 1, 2],
    "tuple": (1, "a", 2.5),
    "nested": {"level2": {"leaf": "deep", "n": 3}},
    # A list holding dicts is descended: objects.dict_in_list.0.a, ...1.b.
    "dict_in_list": [{"a": 1}, {"b": 2.0}],
}


def plain_spec():
    """Single-process save: every legacy dtype, views, 0-d, bytes items."""
    legacy = ["float64", "float32", "float16", "bfloat16", "complex128", "complex64",
              "int64", "int32", "int16", "int8", "uint8", "bool"]
    shapes = [[3, 5], [4, 6], [7], [2, 3, 4], [5], [2, 2], [3, 4], [9], [4, 2], [11], [3, 3], [13]]
    tensors = {dt: TS(dt, shp, 200 + k) for k, (dt, shp) in enumerate(zip(legacy, shapes))}
    return {
        "tensors": tensors,
        "views": {
            "transposed": TS("float32", [5, 3], 220, "t"),
            "transposed_bf16": TS("bfloat16", [4, 6], 223, "t"),
            "narrow": TS("float64", [8, 4], 221, ("narrow0", 2, 6)),
        },
        "scalar_f32": TS("float32", [], 222),
        "step": 123,
        "objects": dict(OBJECTS),
    }


def safetensors_spec():
    """plain for FileSystemWriter(serialization_format=SAFETENSORS): without
    the complex dtypes (safetensors has none) and the transposed views
    (safetensors saves only contiguous tensors, and DCP does not copy a view
    whose storage is its own size)."""
    spec = plain_spec()
    spec["tensors"] = {dt: ts for dt, ts in spec["tensors"].items()
                       if not dt.startswith("complex")}
    spec["views"] = {"narrow": spec["views"]["narrow"]}
    return spec


NEWER_DTYPES = ["float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"]


def newer_spec(torch_module):
    """Dtypes without a legacy storage class (torch.save writes them with
    _rebuild_tensor_v3 + UntypedStorage); only those this torch has."""
    out = {}
    for k, dt in enumerate(NEWER_DTYPES):
        if hasattr(torch_module, dt):
            out[dt] = TS(dt, [4, 4] if dt.startswith("float8") else [6], 230 + k)
    return {"newer": out}


def multi_file_spec():
    """A few items for FileSystemWriter(thread_count=3) /
    single_file_per_rank=False: several .distcp files per rank."""
    return {
        "a": TS("float32", [64, 8], 240),
        "b": TS("float16", [33], 241),
        "c": TS("int64", [5, 5], 242),
        "d": TS("bfloat16", [3, 7], 243),
        "hp": {"lr": 0.01, "name": "multi"},
    }


def dtensor_spec(world):
    """Saved by `world` gloo processes (dist_worker.py save-dtensor)."""
    two_d = world == 4
    return {
        "model": {
            "w_rows": TS("float32", [10, 7], 101, dist=("1d", [("S", 0)])),
            "w_cols": TS("bfloat16", [6, 12], 102, dist=("1d", [("S", 1)])),
            "scale": TS("float16", [16], 103, dist=("1d", [("R",)])),
            "grid": TS("float64", [6, 8], 104,
                       dist=("2d", [("S", 0), ("S", 1)]) if two_d else ("1d", [("S", 1)])),
            # 5 rows over 4 ranks split 2, 2, 1, 0: rank 3 has an empty shard.
            "uneven": TS("int32", [5, 3], 106, dist=("1d", [("S", 0)])),
            # A plain tensor on every rank: deduplicated by the planner.
            "plain_i64": TS("int64", [5], 105),
        },
        "meta": {"step": 7, "name": f"dtensor-{world}", "world": world},
    }


def mesh_shape(mesh, world):
    return (world,) if mesh == "1d" else (2, 2)


def expected_chunks(ts, world):
    """Non-empty saved boxes [(offsets, sizes)] of a DTensor leaf: one per
    mesh coordinate, deduplicated (Replicate saves the same box on every
    rank)."""
    mesh, placements = ts.dist
    mshape = mesh_shape(mesh, world)
    boxes = set()
    coords = [(r,) for r in range(world)] if len(mshape) == 1 else \
        [(r // mshape[1], r % mshape[1]) for r in range(world)]
    for coord in coords:
        offs, sizes = [0] * len(ts.shape), list(ts.shape)
        for mdim, p in enumerate(placements):
            if p[0] == "S":
                d = p[1]
                off, size = chunk_split(sizes[d], mshape[mdim])[coord[mdim]]
                offs[d] += off
                sizes[d] = size
        if all(s > 0 for s in sizes) or not sizes:
            boxes.add((tuple(offs), tuple(sizes)))
    return sorted(boxes)


# ---------------------------------------------------------------------------
# Tagged JSON for bytes-item values (tuples, bytes, None survive the trip).

def encode_value(v):
    if v is None:
        return {"t": "none"}
    if isinstance(v, bool):
        return {"t": "bool", "v": v}
    if isinstance(v, int):
        return {"t": "int", "v": str(v)}
    if isinstance(v, float):
        return {"t": "float", "v": v.hex()}
    if isinstance(v, str):
        return {"t": "str", "v": v}
    if isinstance(v, bytes):
        return {"t": "bytes", "v": v.hex()}
    if isinstance(v, tuple):
        return {"t": "tuple", "v": [encode_value(x) for x in v]}
    if isinstance(v, list):
        return {"t": "list", "v": [encode_value(x) for x in v]}
    if isinstance(v, dict):
        return {"t": "dict", "v": [[encode_value(k), encode_value(x)] for k, x in v.items()]}
    raise TypeError(f"cannot encode {type(v)}")


def decode_value(j):
    t = j["t"]
    if t == "none":
        return None
    if t == "bool":
        return bool(j["v"])
    if t == "int":
        return int(j["v"])
    if t == "float":
        return float.fromhex(j["v"])
    if t == "str":
        return j["v"]
    if t == "bytes":
        return bytes.fromhex(j["v"])
    if t == "tuple":
        return tuple(decode_value(x) for x in j["v"])
    if t == "list":
        return [decode_value(x) for x in j["v"]]
    if t == "dict":
        return {decode_value(k): decode_value(x) for k, x in j["v"]}
    raise ValueError(t)


def sha256(b):
    return hashlib.sha256(b).hexdigest()


def fixture_boxes(shape):
    """The resharded boxes recorded in expected.json (fewer than
    reshard_boxes, to keep the committed fixtures small): dim 0 split in 3,
    the last dim split in 2, and the interior box."""
    if not shape:
        return [([], [])]
    boxes = []
    for dim, n in ((0, 3), (len(shape) - 1, 2)):
        for off, size in chunk_split(shape[dim], n):
            if size == 0 or (n == 2 and dim == 0 and len(shape) == 1):
                continue
            o, s = [0] * len(shape), list(shape)
            o[dim], s[dim] = off, size
            if (o, s) not in boxes:
                boxes.append((o, s))
    if all(x >= 3 for x in shape):
        boxes.append(([1] * len(shape), [x - 2 for x in shape]))
    return boxes


def dumps_record(rec):
    """expected.json text: one line per tensor / bytes item (small, and
    still readable in a diff)."""
    import json

    def one(x):
        return json.dumps(x, ensure_ascii=False, separators=(",", ":"))

    lines = ["{"]
    keys = list(rec)
    for k, key in enumerate(keys):
        comma = "," if k + 1 < len(keys) else ""
        v = rec[key]
        if isinstance(v, list) and v and isinstance(v[0], dict):
            lines.append(f" {one(key)}:[")
            lines += [f"  {one(x)}" + ("," if i + 1 < len(v) else "") for i, x in enumerate(v)]
            lines.append(f" ]{comma}")
        else:
            lines.append(f" {one(key)}:{one(v)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def expected_record(spec, world=1, torch_module=None, saved_metadata=None):
    """The expected.json body for a checkpoint saved from `spec`.

    Tensor bytes are hashed from the torch tensors when torch is given (the
    ground truth of what was saved) and cross-checked against the pure-Python
    formula; saved_metadata (a real torch Metadata) adds the chunk lists
    torch wrote."""
    flat = dcp_flatten(spec)
    tensors, objects = [], []
    for fqn, (path, leaf) in flat.items():
        if isinstance(leaf, TS):
            full = leaf.box_bytes()
            if torch_module is not None:
                tb = torch_bytes(leaf.torch_value())
                assert tb == full, f"{fqn}: torch bytes differ from the formula"
            rec = {"fqn": fqn, "path": list(path), "shape": leaf.shape,
                   "sha256": sha256(full), "nbytes": len(full), **leaf.to_json()}
            rec["boxes"] = [{"offsets": o, "sizes": s, "sha256": sha256(leaf.box_bytes(o, s))}
                            for o, s in fixture_boxes(leaf.shape)]
            if leaf.dist is not None:
                rec["dist"] = {"mesh": leaf.dist[0], "placements": [list(p) for p in leaf.dist[1]]}
            if saved_metadata is not None:
                md = saved_metadata.state_dict_metadata[fqn]
                rec["saved_chunks"] = [[list(c.offsets), list(c.sizes)] for c in md.chunks]
            tensors.append(rec)
        else:
            objects.append({"fqn": fqn, "path": list(path), "value": encode_value(leaf),
                            "repr": repr(leaf)})
    return {"format": FIXTURE_FORMAT, "world": world, "tensors": tensors, "objects": objects,
            "formula": "element i (flat C-order index of the base tensor) with seed k: "
                       "v = (i*31 + k) % 251, converted per dtype by "
                       "tests/interop/sample_spec.py element_value(); transform 't' = "
                       "transpose of the 2-D base, ['narrow0', a, b] = base rows [a, b)",
            "python": sys.version.split()[0]}
