#!/usr/bin/env python3
"""Writes small checkpoints with stock torch.distributed.checkpoint.save
(torch >= 2.4) for ckptd's reader to be checked against in CI, where only
Debian's torch 1.13 (or no torch) is available.

    python3 tests/interop/make_fixtures.py [--out tests/fixtures] [--force]

Output: OUT/dcp_torch<X.Y.Z>/<name>/ holding the checkpoint (.metadata,
__*_*.distcp) and expected.json (stock_spec.expected_record): every tensor's
formula parameters (dtype, base shape, seed, view transform), the sha256 of
its C-order bytes and of a few resharded boxes, the chunk list torch wrote,
and every bytes item's value as tagged JSON. tests/python/
test_torch2_fixtures.py checks each fixture with interop_tool without torch.

Fixtures: plain (every legacy dtype, transposed and narrowed views, 0-d,
bytes items of many kinds, single process), newer_dtypes (float8, uint16/
32/64), multi_file (FileSystemWriter(thread_count=3)), per_item_files
(single_file_per_rank=False), dtensor_2ranks and dtensor_4ranks (DTensors
saved by 2 / 4 gloo processes, incl. a 2x2 mesh and an empty shard), zstd
(plain's state with FileSystemWriter(_extensions=[ZStandard()]): every
payload a zstd stream; torch >= 2.7 with the zstandard module), safetensors
(plain without complex dtypes and transposed views, written with
serialization_format=SAFETENSORS: each data file's tensors in one
safetensors blob; torch >= 2.8 with the safetensors module).
--only NAME... adds those sets to an existing version directory.
The total is kept under --max-kb (default 300).
"""
import argparse
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import warnings

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import interop_common as ic  # noqa: E402
import stock_spec  # noqa: E402

FIXTURES = ["plain", "newer_dtypes", "multi_file", "per_item_files", "dtensor_2ranks",
            "dtensor_4ranks", "zstd", "safetensors"]


def safetensors_format():
    """SerializationFormat.SAFETENSORS (torch >= 2.8, with the safetensors
    module), or None with the reason."""
    try:
        from torch.distributed.checkpoint.filesystem import SerializationFormat
    except ImportError as e:
        return None, f"this torch has no SerializationFormat ({e})"
    try:
        import safetensors  # noqa: F401
    except ImportError:
        return None, "the safetensors module is not installed"
    return SerializationFormat.SAFETENSORS, None


def version_dir_name(torch_version):
    return "dcp_torch" + torch_version.split("+")[0]


def _roundtrips(torch, ts):
    import io
    try:
        t = ts.torch_value()
        buf = io.BytesIO()
        torch.save(t, buf)
        buf.seek(0)
        back = torch.load(buf, weights_only=True)
        return back.dtype == t.dtype and stock_spec.torch_bytes(back) == stock_spec.torch_bytes(t)
    except Exception as e:  # an unsupported dtype path in this torch
        print(f"  {ts.dtype}: torch.save round trip failed ({type(e).__name__}: {e}); left out")
        return False


def save_fixture(name, dest):
    """Saves fixture `name` into `dest` (created; must not exist) with
    expected.json. Returns the expected record, or None when this torch
    cannot make it (newer_dtypes without any newer dtype)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

    dest = pathlib.Path(dest)
    if dest.exists():
        raise FileExistsError(dest)
    world, writer_desc = 1, "dcp.save(checkpoint_id=DIR), no process group"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if name == "plain":
            spec = stock_spec.plain_spec()
            dcp.save(stock_spec.materialize(spec), checkpoint_id=str(dest))
        elif name == "newer_dtypes":
            spec = stock_spec.newer_spec(torch)
            # Keep the dtypes this torch can torch.save / torch.load itself
            # (uint16/32/64 had only partial support in early 2.x).
            unsupported = [dt for dt, ts in spec["newer"].items() if not _roundtrips(torch, ts)]
            for dt in unsupported:
                del spec["newer"][dt]
            if not spec["newer"]:
                return None
            dcp.save(stock_spec.materialize(spec), checkpoint_id=str(dest))
            writer_desc += f"; dtypes torch.save could not round-trip: {unsupported or 'none'}"
        elif name == "multi_file":
            spec = stock_spec.multi_file_spec()
            dcp.save(stock_spec.materialize(spec),
                     storage_writer=FileSystemWriter(str(dest), thread_count=3))
            writer_desc = "FileSystemWriter(DIR, thread_count=3)"
        elif name == "per_item_files":
            spec = stock_spec.multi_file_spec()
            dcp.save(stock_spec.materialize(spec),
                     storage_writer=FileSystemWriter(str(dest), single_file_per_rank=False))
            writer_desc = "FileSystemWriter(DIR, single_file_per_rank=False)"
        elif name == "zstd":
            zstd, reason = ic.stock_zstd()
            if zstd is None:
                print(f"  zstd: {reason}")
                return None
            spec = stock_spec.plain_spec()
            dcp.save(stock_spec.materialize(spec),
                     storage_writer=FileSystemWriter(str(dest), _extensions=[zstd()]))
            writer_desc = "FileSystemWriter(DIR, _extensions=[ZStandard()])"
        elif name == "safetensors":
            fmt, reason = safetensors_format()
            if fmt is None:
                print(f"  safetensors: {reason}")
                return None
            spec = stock_spec.safetensors_spec()
            dcp.save(stock_spec.materialize(spec),
                     storage_writer=FileSystemWriter(str(dest), serialization_format=fmt))
            writer_desc = "FileSystemWriter(DIR, serialization_format=SerializationFormat.SAFETENSORS)"
        elif name.startswith("dtensor_"):
            world = int(name[len("dtensor_"):].split("ranks")[0])
            spec = stock_spec.dtensor_spec(world)
            proc = subprocess.run([sys.executable, str(HERE / "dist_worker.py"), "save-dtensor",
                                   "--world", str(world), "--dir", str(dest)],
                                  capture_output=True, text=True, timeout=420)
            if proc.returncode != 0:
                raise RuntimeError(f"dist_worker save-dtensor --world {world} failed:\n"
                                   f"{proc.stdout}\n{proc.stderr}")
            writer_desc = (f"dcp.save(checkpoint_id=DIR) on {world} gloo processes "
                           f"(tests/interop/dist_worker.py save-dtensor)")
        else:
            raise ValueError(f"unknown fixture {name}")
    md = FileSystemReader(str(dest)).read_metadata()
    rec = stock_spec.expected_record(spec, world=world, torch_module=torch, saved_metadata=md)
    rec.update({
        "fixture": name,
        "torch_version": torch.__version__,
        "writer": writer_desc,
        "metadata_version": getattr(md, "version", None),
        "files": {p.name: p.stat().st_size for p in sorted(dest.iterdir())},
        "created_by": "tests/interop/make_fixtures.py",
        "platform": platform.platform(),
    })
    (dest / "expected.json").write_text(stock_spec.dumps_record(rec), encoding="utf-8")
    return rec


def tree_size(d):
    return sum(p.stat().st_size for p in pathlib.Path(d).rglob("*") if p.is_file())


def main(argv=None):
    p = argparse.ArgumentParser(description="stock dcp.save fixtures for ckptd's reader")
    p.add_argument("--out", default=str(ic.REPO / "tests" / "fixtures"),
                   help="fixtures root (default: tests/fixtures)")
    p.add_argument("--force", action="store_true",
                   help="replace this torch version's fixture directory")
    p.add_argument("--max-kb", type=int, default=300, help="size limit of the whole set")
    p.add_argument("--only", nargs="*", choices=FIXTURES, help="make only these")
    a = p.parse_args(argv)

    torch, reason = ic.torch_status()
    if torch is None:
        print(f"make_fixtures: {reason}", file=sys.stderr)
        return 2
    root = pathlib.Path(a.out) / version_dir_name(torch.__version__)
    made = {}
    if root.exists() and a.only:
        # Adds (or replaces) the named sets; the others stay as committed.
        manifest_path = root / "MANIFEST.json"
        if manifest_path.exists():
            made = json.loads(manifest_path.read_text()).get("fixtures", {})
        for name in a.only:
            shutil.rmtree(root / name, ignore_errors=True)
            made.pop(name, None)
    elif root.exists():
        if not a.force:
            print(f"make_fixtures: {root} exists (use --force to replace it, or --only to "
                  f"add sets)", file=sys.stderr)
            return 1
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    for name in a.only or FIXTURES:
        rec = save_fixture(name, root / name)
        if rec is None:
            print(f"  {name}: skipped (not available in this torch)")
            continue
        made[name] = {"tensors": len(rec["tensors"]), "objects": len(rec["objects"]),
                      "bytes": tree_size(root / name)}
        print(f"  {name}: {made[name]['tensors']} tensors, {made[name]['objects']} bytes items, "
              f"{made[name]['bytes']} bytes")
    manifest = {
        "torch_version": torch.__version__,
        "python": sys.version.split()[0],
        "cuda_available": bool(torch.cuda.is_available()),
        "fixtures": made,
        "how": "python3 tests/interop/make_fixtures.py (see tests/interop/README.md)",
    }
    (root / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = tree_size(root)
    print(f"make_fixtures: wrote {root} ({total} bytes)")
    if total > a.max_kb * 1024:
        print(f"make_fixtures: {total} bytes exceeds --max-kb {a.max_kb}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    sys.exit(main())
