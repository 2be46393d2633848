#!/usr/bin/env python3
"""Makes a large DCP `.metadata` pickled by stock PyTorch, and times stock `FileSystemReader.read_metadata()` on a `.metadata`.

    # inside a torch 2.x root (scripts/torch2_chroot.sh):
    bash scripts/torch2_chroot.sh run python3 bench/make_big_metadata.py \\
        make --ranks 1000 --tensors 2000 --out /tmp/big_stock
    CKPTD_TORCH2_SUITE=sid CKPTD_TORCH2_ROOT=/var/cache/ckptd/torch2-sid \\
      bash scripts/torch2_chroot.sh run python3 bench/make_big_metadata.py make ...
    bash scripts/torch2_chroot.sh run python3 bench/make_big_metadata.py \\
        read /tmp/big_stock            # one JSON line: seconds, peak RSS

`make` builds the objects a 1,000-rank FSDP save of 2,000 tensors gathers on
its coordinator (one ChunkStorageMetadata per rank and tensor, row-sharded
on dim 0; one WriteResult per chunk, MetadataIndex + _StorageInfo, as each
rank's write_data returns them) and hands them to stock
`FileSystemWriter.finish(metadata, results)`, which sets `version`,
`storage_data` and `storage_meta` and calls `pickle.dump` exactly as
`dcp.save` does (default protocol of this Python: 4 on 3.13, 5 on 3.14).
The model is bench/format_bench.cc's `plan_metadata` mix (embedding, head,
per layer 4 attention projections, 3 MLP projections, 2 norms; bf16 with
fp32 norms; global shape [ranks*k, d]), with the same fqns, so the file
describes the same checkpoint as the 131 MiB `.metadata` ckptd writes for
`plan_metadata_1000x2000`. No data files are written.

`read` times `FileSystemReader(dir).read_metadata()` (pickle.load of the
file) and prints {"seconds", "peak_rss_bytes", "baseline_rss_bytes",
"chunks", "storage_entries", "torch", "python"}: peak RSS is ru_maxrss of
this process (torch imported before the clock), baseline the RSS before the
read.
"""
import argparse
import json
import os
import pathlib
import platform
import resource
import sys
import time

LAYER = [
    ("self_attn.q_proj.weight", 4, 4096, "bfloat16"),
    ("self_attn.k_proj.weight", 1, 4096, "bfloat16"),
    ("self_attn.v_proj.weight", 1, 4096, "bfloat16"),
    ("self_attn.o_proj.weight", 4, 4096, "bfloat16"),
    ("mlp.gate_proj.weight", 11, 4096, "bfloat16"),
    ("mlp.up_proj.weight", 11, 4096, "bfloat16"),
    ("mlp.down_proj.weight", 4, 11008, "bfloat16"),
    ("input_layernorm.weight", 1, 4, "float32"),
    ("post_attention_layernorm.weight", 1, 4, "float32"),
]
ELEMENT_SIZE = {"bfloat16": 2, "float32": 4}


def model(n_tensors):
    """(fqn, k, d, dtype) of format_bench's MakeModel(n_tensors)."""
    out = []
    if n_tensors > 0:
        out.append(("model.embed_tokens.weight", 32, 4096, "bfloat16"))
    layer = 0
    while len(out) + 1 < n_tensors:
        for name, k, d, dtype in LAYER:
            if len(out) + 1 >= n_tensors:
                break
            out.append((f"model.layers.{layer}.{name}", k, d, dtype))
        layer += 1
    if n_tensors > 1:
        out.append(("lm_head.weight", 32, 4096, "bfloat16"))
    return out


def make(args):
    import torch
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata, Metadata, MetadataIndex, TensorProperties,
        TensorStorageMetadata)
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.storage import WriteResult

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = model(args.tensors)
    ranks = args.ranks
    t0 = time.perf_counter()
    sdm = {}
    planner_data = {}
    for fqn, k, d, dtype in tensors:
        # Each chunk's torch.Size objects are its own (the coordinator
        # unpickles every rank's plan separately).
        chunks = [ChunkStorageMetadata(offsets=torch.Size([r * k, 0]),
                                       sizes=torch.Size([k, d]))
                  for r in range(ranks)]
        sdm[fqn] = TensorStorageMetadata(
            properties=TensorProperties(dtype=getattr(torch, dtype)),
            size=torch.Size([ranks * k, d]), chunks=chunks)
        planner_data[fqn] = tuple(fqn.split(".", 1)) if "." in fqn else (fqn,)
    results = []
    for r in range(ranks):
        rel = f"__{r}_0.distcp"
        offset = 0
        wr = []
        for idx, (fqn, k, d, dtype) in enumerate(tensors):
            length = k * d * ELEMENT_SIZE[dtype] + 1088
            wr.append(WriteResult(
                index=MetadataIndex(fqn=fqn, offset=torch.Size([r * k, 0]), index=r),
                size_in_bytes=length,
                storage_data=_StorageInfo(relative_path=rel, offset=offset, length=length)))
            offset += length
        results.append(wr)
    built = time.perf_counter() - t0
    writer = FileSystemWriter(str(out), sync_files=True)
    writer.set_up_storage_writer(is_coordinator=True)
    md = Metadata(state_dict_metadata=sdm, planner_data=planner_data)
    t0 = time.perf_counter()
    writer.finish(md, results)
    wrote = time.perf_counter() - t0
    size = (out / ".metadata").stat().st_size
    print(json.dumps({"path": str(out / ".metadata"), "bytes": size,
                      "chunks": ranks * len(tensors), "ranks": ranks,
                      "tensors": len(tensors), "build_s": round(built, 2),
                      "finish_s": round(wrote, 2), "torch": torch.__version__,
                      "python": platform.python_version()}))


def rss_now():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def read(args):
    import torch
    from torch.distributed.checkpoint import FileSystemReader
    baseline = rss_now()
    t0 = time.perf_counter()
    md = FileSystemReader(args.dir).read_metadata()
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    chunks = sum(len(v.chunks) for v in md.state_dict_metadata.values()
                 if hasattr(v, "chunks"))
    print(json.dumps({"seconds": seconds, "peak_rss_bytes": peak,
                      "baseline_rss_bytes": baseline, "chunks": chunks,
                      "storage_entries": len(md.storage_data),
                      "torch": torch.__version__,
                      "python": platform.python_version()}), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--ranks", type=int, default=1000)
    m.add_argument("--tensors", type=int, default=2000)
    m.add_argument("--out", required=True)
    r = sub.add_parser("read")
    r.add_argument("dir")
    args = p.parse_args()
    make(args) if args.cmd == "make" else read(args)


if __name__ == "__main__":
    sys.exit(main())
