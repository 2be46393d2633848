"""Helpers shared by the torch>=2.4 interop tests, dist_worker.py and
make_fixtures.py: the torch version gate, where the C++ executables are, and
thin wrappers around `interop_tool` / `ckptctl`.

Importable without torch (the version gate is what decides whether torch is
usable).
"""
import json
import os
import pathlib
import re
import subprocess
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[2]
MIN_TORCH = (2, 4)


def build_dir():
    return pathlib.Path(os.environ.get("CKPTD_BUILD_DIR", REPO / "build"))


def tool_path(name):
    return build_dir() / "tools" / name


def bin_path(name):
    return build_dir() / "bin" / name


def sanitizer_build():
    """Whether the helper tools are an ASan/UBSan build (CKPTD_BUILD_DIR=
    build-asan). Such a pass thins the checks that start one tool process
    each (about 10x slower to start under ASan) where they only repeat the
    release pass; what they exercise still runs under ASan."""
    try:
        with open(tool_path("interop_tool"), "rb") as f:
            return b"__asan_init" in f.read()  # gcc and clang ASan builds
    except OSError:
        return False


def parse_version(v):
    """(major, minor) of a torch version string ("2.11.0+cu130" -> (2, 11))."""
    m = re.match(r"(\d+)\.(\d+)", v)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def torch_status():
    """(torch module or None, reason it is unusable or None)."""
    need = ".".join(map(str, MIN_TORCH))
    try:
        import torch
    except Exception as e:  # ImportError, or a broken install
        return None, f"needs torch>={need} (torch not importable: {type(e).__name__}: {e})"
    if parse_version(torch.__version__) < MIN_TORCH:
        return None, f"needs torch>={need} (found {torch.__version__})"
    try:
        import torch.distributed as dist
        if not dist.is_available():
            return None, f"needs torch>={need} with torch.distributed (found {torch.__version__} without it)"
        import torch.distributed.checkpoint  # noqa: F401
    except Exception as e:
        return None, (f"needs torch>={need} with torch.distributed.checkpoint "
                      f"(found {torch.__version__}: {type(e).__name__}: {e})")
    return torch, None


def stock_zstd():
    """(torch's ZStandard stream extension class, None), or (None, the reason
    this torch cannot write or read zstd payloads: before 2.7, or neither
    the zstandard nor the pyzstd module installed, as in the GPU machine's
    torch 2.11)."""
    try:
        from torch.distributed.checkpoint._extension import ZStandard
    except ImportError as e:
        return None, f"this torch has no ZStandard extension ({e})"
    if not ZStandard.is_available():
        return None, "neither the zstandard nor the pyzstd module is installed"
    return ZStandard, None


def dtensor_api():
    """(DTensor, Shard, Replicate, init_device_mesh): public module from 2.5,
    torch.distributed._tensor in 2.4."""
    from torch.distributed.device_mesh import init_device_mesh
    try:
        from torch.distributed.tensor import DTensor, Replicate, Shard
    except ImportError:
        from torch.distributed._tensor import DTensor, Replicate, Shard
    return DTensor, Shard, Replicate, init_device_mesh


# ---------------------------------------------------------------------------
# The C++ side.

class ToolError(AssertionError):
    pass


def run_exe(exe, *args, check=True, timeout=300):
    exe = pathlib.Path(exe)
    if not exe.exists():
        raise ToolError(f"{exe} not built (build the project first, or set CKPTD_BUILD_DIR)")
    proc = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise ToolError(f"{exe.name} {' '.join(map(str, args))} exited {proc.returncode}:\n"
                        f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def interop_tool(*args, check=True):
    return run_exe(tool_path("interop_tool"), *args, check=check)


def ckptctl(*args, check=True):
    return run_exe(bin_path("ckptctl"), *args, check=check)


def have_ckptctl():
    return bin_path("ckptctl").exists()


def write_sample(directory):
    interop_tool("write-sample", directory)


def list_items(directory):
    """`interop_tool list --json` as {fqn: item}."""
    doc = json.loads(interop_tool("list", directory, "--json").stdout)
    return {it["fqn"]: it for it in doc["items"]}


def _ints(xs):
    return ",".join(str(int(x)) for x in xs) if len(xs) else "-"


def read_box(directory, fqn, offsets, sizes, dtype="-"):
    """Raw C-order bytes of a box, read by ckptd's CheckpointReader."""
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "box.bin"
        interop_tool("read", directory, fqn, _ints(offsets), _ints(sizes), dtype, out)
        return out.read_bytes()


def read_boxes(directory, boxes):
    """read_box for each (fqn, offsets, sizes[, dtype]) of boxes, through one
    interop_tool process (`read-many`): a list of bytes, in order."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        lines, outs = [], []
        for k, (fqn, offsets, sizes, *dtype) in enumerate(boxes):
            out = tmp / f"box{k}.bin"
            outs.append(out)
            lines.append("\t".join([fqn, _ints(offsets), _ints(sizes),
                                    dtype[0] if dtype else "-", str(out)]))
        plan = tmp / "plan.tsv"
        plan.write_text("".join(line + "\n" for line in lines))
        interop_tool("read-many", directory, plan)
        return [out.read_bytes() for out in outs]


def read_object(directory, fqn):
    """The value of a bytes item as ckptd decodes it (PyValue::Repr parsed
    back with ast.literal_eval)."""
    return read_objects(directory, [fqn])[0]


def read_objects(directory, fqns):
    """read_object of each of fqns through one interop_tool process: a list
    of (value, text)."""
    import ast
    if not fqns:
        return []
    lines = interop_tool("read-object", directory, *fqns).stdout.splitlines()
    assert len(lines) == len(fqns), lines
    return [(ast.literal_eval(text), text) for text in lines]


def payload_slice(directory, storage):
    """The bytes [offset, offset+length) of a storage entry from list --json."""
    with open(pathlib.Path(directory) / storage["file"], "rb") as f:
        f.seek(storage["offset"])
        data = f.read(storage["length"])
    assert len(data) == storage["length"], storage
    return data

