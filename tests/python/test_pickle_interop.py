"""Cross-checks the C++ pickle reader/writer (format/pickle*.cc) against
CPython's pickle module, through tests/tools/pickle_tool.cc.

Python -> C++: objects pickled with protocols 0-5 are parsed by
`pickle_tool render`, whose canonical rendering must equal render() below,
computed from the original Python object.

C++ -> Python: `pickle_tool write CASE` emits protocol-2 pickles made with
pickle::Writer; pickle.loads must rebuild the expected values.
"""
import collections
import dataclasses
import io
import math
import os
import pickle
import random
import struct

import pytest

PROTOCOLS = [0, 1, 2, 3, 4, 5]


# ---------------------------------------------------------------------------
# Canonical rendering (mirrors Renderer in tests/tools/pickle_tool.cc).

def _int_bytes(n):
    """Minimal little-endian two's complement, as pickle's LONG1 writes it."""
    b = n.to_bytes((n.bit_length() >> 3) + 1, "little", signed=True)
    while len(b) > 1 and ((b[-1] == 0 and b[-2] < 0x80) or
                          (b[-1] == 0xFF and b[-2] >= 0x80)):
        b = b[:-1]
    return b


def render(obj):
    labels = {}
    out = []

    def label(o):
        k = id(o)
        if k in labels:
            out.append(f"@{labels[k]}")
            return True
        labels[k] = len(labels)
        out.append(f"#{labels[k]}=")
        return False

    def seq(items, sep=","):
        for n, x in enumerate(items):
            if n:
                out.append(sep)
            visit(x)

    def entries(d):
        for n, (k, v) in enumerate(d.items()):
            if n:
                out.append(",")
            visit(k)
            out.append(":")
            visit(v)

    def visit(o):
        t = type(o)
        if o is None:
            out.append("N")
        elif o is True:
            out.append("T")
        elif o is False:
            out.append("F")
        elif t is int:
            if -2**63 <= o < 2**63:
                out.append(f"i:{o}")
            else:
                out.append("I:" + _int_bytes(o).hex())
        elif t is float:
            out.append("f:%016x" % struct.unpack("<Q", struct.pack("<d", o))[0])
        elif t is str:
            out.append("s:" + o.encode("utf-8", "surrogatepass").hex())
        elif t in (bytes, bytearray):
            out.append("b:" + bytes(o).hex())
        elif t is tuple:
            out.append("(")
            seq(o)
            out.append(")")
        elif t is list:
            if not label(o):
                out.append("[")
                seq(o)
                out.append("]")
        elif t is collections.OrderedDict:
            if not label(o):
                out.append("odict{")
                entries(o)
                out.append("}")
        elif t is dict:
            if not label(o):
                out.append("{")
                entries(o)
                out.append("}")
        elif t in (set, frozenset):
            if not label(o):
                out.append("<")
                seq(o)
                out.append(">")
        elif hasattr(o, "__dict__"):
            if not label(o):
                out.append(f"obj:{t.__module__}.{t.__qualname__}(")
                if o.__dict__:
                    visit(o.__dict__)
                else:
                    out.append("N")
                out.append(")")
        else:
            raise TypeError(f"render: unsupported {t}")

    visit(obj)
    return "".join(out)


# ---------------------------------------------------------------------------
# Objects to pickle.

@dataclasses.dataclass
class Point:
    x: int
    y: object
    tags: list


@dataclasses.dataclass
class Chunk:
    offsets: tuple
    sizes: tuple


INT_EDGES = [0, 1, -1, 127, 128, 255, 256, -128, -129, -256, -257, 65535, 65536,
             2**31 - 1, -2**31, 2**31, -2**31 - 1, 2**32, 2**40, -2**40,
             2**63 - 1, -2**63, 2**63, -2**63 - 1, 2**64, -2**64, 10**40,
             -10**40, 2**1000 + 1, -(2**2100), 2**(8 * 300)]


def _shared():
    a = [1, 2]
    d = {"k": a}
    t = (a, "x")
    return [a, a, d, d, t, t, {"again": d}]


def _recursive_list():
    x = [1]
    x.append(x)
    return x


def _recursive_dict():
    d = {"name": "root"}
    d["self"] = d
    d["children"] = [d, {"parent": d}]
    return d


def _many():
    # More than the pickler's batch size (1000) of APPENDS / SETITEMS.
    return {"list": list(range(2500)),
            "dict": {f"k{i}": i * 1.5 for i in range(1200)},
            "set": set(range(1100))}


def _metadata_like():
    chunks = [Chunk((i * 2, 0), (2, 6)) for i in range(4)]
    return collections.OrderedDict(
        state={f"layer{i}.w": [chunks[i % 4], chunks[(i + 1) % 4]] for i in range(5)},
        storage={("layer0.w", (0, 0)): ("__0_0.distcp", 0, 96)},
        version="1.0.0")


CASES = {
    "none_bools": lambda: [None, True, False],
    "ints": lambda: INT_EDGES,
    "floats": lambda: [0.0, -0.0, 1.5, -2.25, 1e300, -1e-300, 5e-324,
                       float("inf"), float("-inf"), float("nan"), math.pi],
    "strings": lambda: ["", "a", "h\u00e9llo", "\u65e5\u672c\u8a9e", "\U0001F600",
                        "\ud800 lone surrogate", "a\nb\\c\r\x1a\x00",
                        "x" * 300, "y" * 70000],
    "bytes": lambda: [b"", b"\x00\xff", bytes(range(256)), b"z" * 300],
    "bytearray": lambda: [bytearray(b"abc"), bytearray(), bytearray(range(256))],
    "tuples": lambda: [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), ((1,), ((2,),))],
    "containers": lambda: {"list": [[], [[]], [1, [2, [3]]]],
                           "dict": {1: "one", (2, 3): {}, None: [None], "s": "t"},
                           "set": {1, 2, 3}, "empty_set": set(),
                           "frozen": frozenset({"a", "b"})},
    "empty_frozenset": lambda: frozenset(),
    "shared": _shared,
    "recursive_list": _recursive_list,
    "recursive_dict": _recursive_dict,
    "ordered_dict": lambda: collections.OrderedDict([("b", 1), ("a", [2]),
                                                     ("c", collections.OrderedDict())]),
    "dataclass": lambda: [Point(1, "s", [1, 2]), Point(2, Point(3, None, []), ["t"])],
    "metadata_like": _metadata_like,
    "many": _many,
    "scalar_root": lambda: 7,
}


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_reader_matches_python(tool, tmp_path, case, protocol):
    obj = CASES[case]()
    path = tmp_path / f"{case}.p{protocol}.pkl"
    path.write_bytes(pickle.dumps(obj, protocol=protocol))
    got = tool("pickle_tool", "render", path).stdout.strip()
    assert got == render(obj)


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_random_structures(tool, tmp_path, protocol):
    seed = int(os.environ.get("CKPTD_TEST_SEED", random.randrange(2**32)))
    print(f"CKPTD_TEST_SEED={seed}")
    rng = random.Random(seed)

    def gen(depth):
        r = rng.random()
        if depth > 4 or r < 0.4:
            return rng.choice([
                None, True, False, rng.randrange(-2**70, 2**70),
                rng.randrange(-300, 300), rng.uniform(-1e10, 1e10),
                "".join(chr(rng.choice([0x41, 0xe9, 0x65e5, 0x1F600, 0x5c]))
                        for _ in range(rng.randrange(6))),
                bytes(rng.randrange(256) for _ in range(rng.randrange(6)))])
        n = rng.randrange(5)
        kind = rng.randrange(4)
        if kind == 0:
            return [gen(depth + 1) for _ in range(n)]
        if kind == 1:
            return tuple(gen(depth + 1) for _ in range(n))
        if kind == 2:
            return {f"k{i}": gen(depth + 1) for i in range(n)}
        return Point(n, gen(depth + 1), [gen(depth + 1)])

    for i in range(10):
        obj = gen(0)
        path = tmp_path / f"r{i}.pkl"
        path.write_bytes(pickle.dumps(obj, protocol=protocol))
        assert tool("pickle_tool", "render", path).stdout.strip() == render(obj), seed


def test_every_truncation_is_an_error(tool, tmp_path):
    data = pickle.dumps(
        [_metadata_like(), INT_EDGES[-5:], b"\x00\x01", "\u00e9", 1.5], protocol=4)
    path = tmp_path / "t.pkl"
    path.write_bytes(data)
    # Every proper prefix, parsed in one process (test_malformed checks the
    # exit status and message of `check` itself, one process per case).
    lines = tool("pickle_tool", "check-prefixes", path).stdout.splitlines()
    assert len(lines) == len(data)
    for n, line in enumerate(lines):
        got_n, _, result = line.partition("\t")
        assert int(got_n) == n, line
        assert result != "ok" and "offset" in result, (n, result)
    assert tool("pickle_tool", "check", path).stdout.strip() == "ok"


@pytest.mark.parametrize("data,message", [
    (b"", "no STOP"),
    (b"\x80\x02K\x01", "no STOP"),
    (b"\x80\x02\xff.", "opcode 0xff (unknown): unknown opcode"),
    (b"\x80\x02\x82\x01.", "(EXT1): unsupported opcode"),
    (b"\x80\x05\x97.", "(NEXT_BUFFER): unsupported opcode"),
    (b"\x80\x06N.", "unsupported pickle protocol 6"),
    (b"\x80\x02a.", "'a' (APPEND): stack underflow"),
    (b"\x80\x02.", "'.' (STOP): stack underflow"),
    (b"\x80\x02K\x01t.", "'t' (TUPLE): no MARK"),
    (b"\x80\x02(e.", "'e' (APPENDS): stack underflow"),
    (b"\x80\x02]K\x01(K\x02e.", "cannot append to a int"),
    (b"\x80\x02X\xff\xff\xff\xff.", "(BINUNICODE): truncated"),
    (b"\x80\x02h\x05.", "(BINGET): memo key 5 not found"),
    (b"\x80\x02K\x01K\x02R.", "(REDUCE): arguments must be a tuple"),
    (b"\x80\x02K\x01K\x02b.", "(BUILD): cannot BUILD a int"),
    (b"\x80\x02X\x02\x00\x00\x00\xc3(.", "not valid UTF-8"),
    (b"cos\nsystem", "(GLOBAL): truncated"),
])
def test_malformed(tool, tmp_path, data, message):
    path = tmp_path / "bad.pkl"
    path.write_bytes(data)
    proc = tool("pickle_tool", "check", path, check=False)
    assert proc.returncode == 1, proc.stdout
    assert message in proc.stderr
    assert str(path) in proc.stderr
    with pytest.raises(Exception):
        pickle.loads(data)


def test_debug_string_of_cycles(tool, tmp_path):
    path = tmp_path / "cyc.pkl"
    path.write_bytes(pickle.dumps(_recursive_dict(), protocol=2))
    out = tool("pickle_tool", "debug", path).stdout
    assert out.startswith("{'name': 'root', 'self': ...")


# ---------------------------------------------------------------------------
# C++ Writer -> Python.

class Thing:
    pass


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module == "ckptd_test":
            if name == "Thing":
                return Thing
            if name == "Size":
                return lambda dims: ("Size", dims)
        return super().find_class(module, name)

    def persistent_load(self, pid):
        return ("persid", pid)


def _load_written(tool, tmp_path, case):
    path = tmp_path / f"{case}.pkl"
    tool("pickle_tool", "write", case, path)
    data = path.read_bytes()
    assert data[:2] == b"\x80\x02" and data[-1:] == b"."
    # The C++ reader must read its own writer's output, too.
    rendered = tool("pickle_tool", "render", path).stdout.strip()
    obj = _Unpickler(io.BytesIO(data)).load()
    return obj, rendered


def test_writer_ints(tool, tmp_path):
    obj, rendered = _load_written(tool, tmp_path, "ints")
    expected = [0, 1, 127, 128, 255, 256, 65535, 65536, -1, -128, -129, -256, -257,
                2**31 - 1, -2**31, 2**31, -2**31 - 1, 2**40, -2**40, 2**63 - 1,
                -2**63, 2**63 - 2, -2**63 + 1]
    assert obj == expected
    assert rendered == render(expected)


def test_writer_scalars(tool, tmp_path):
    obj, rendered = _load_written(tool, tmp_path, "scalars")
    expected = (None, True, False, 1.5, -0.0, 1e300, float("inf"), 5e-324, "",
                "h\u00e9llo \U0001F600", "nul\0byte")
    assert obj == expected
    assert math.copysign(1, obj[4]) == -1
    assert rendered == render(expected)


def test_writer_bytes(tool, tmp_path):
    obj, rendered = _load_written(tool, tmp_path, "bytes")
    expected = [b"", b"\x00\xff\x80\x7f", bytes(range(256))]
    assert obj == expected
    assert all(type(b) is bytes for b in obj)
    assert rendered == render(expected)


def test_writer_nested(tool, tmp_path):
    obj, rendered = _load_written(tool, tmp_path, "nested")
    expected = {"t": ((), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)),
                "l": [[], [None]], "d": {1: "one", (2,): {}}}
    assert obj == expected
    assert list(obj) == ["t", "l", "d"]
    assert rendered == render(expected)


def test_writer_memo(tool, tmp_path):
    obj, rendered = _load_written(tool, tmp_path, "memo")
    assert obj[:5] == [collections.OrderedDict(), collections.OrderedDict(), "fqn", "fqn",
                       "other"]
    assert type(obj[0]) is collections.OrderedDict and obj[0] is not obj[1]
    assert obj[2] is obj[3]
    assert obj[5] == [7] and obj[5] is obj[6]
    assert rendered == render(obj)


def test_writer_objects(tool, tmp_path):
    obj, rendered = _load_written(tool, tmp_path, "objects")
    od, s, thing, size, pid = obj
    assert type(od) is collections.OrderedDict and list(od.items()) == [("a", 1), ("b", 2)]
    assert s == {1, 2} and type(s) is set
    assert type(thing) is Thing and thing.__dict__ == {"x": 1, "y": "s"}
    assert size == ("Size", (4, 6))
    assert pid == ("persid", ("storage", "k"))
    assert rendered.startswith("#0=[#1=odict{s:61:i:1,s:62:i:2},#2=<i:1,i:2>,"
                               "#3=obj:ckptd_test.Thing(#4={s:78:i:1,s:79:s:73}),"
                               "#5=call(g:ckptd_test.Size,((i:4,i:6)))[]{},")
    assert rendered.endswith("pid((s:" + b"storage".hex() + ",s:6b))]")
