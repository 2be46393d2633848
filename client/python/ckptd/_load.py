"""load: reading a checkpoint into a state dict.

The index (.metadata without chunk lists) → the caller's flattened state
dict → one read request per destination chunk → bytes items decoded
(restricted unpickler by default) and put in place →
Stateful.load_state_dict. The requests are filled either through the
node's daemon (_restore.py: it reads each byte range once for all local
ranks of the load) or by the direct reader (resharding in the C++ reader,
multi-threaded, straight into the tensors' memory when layouts allow; CUDA
destinations through pinned bounce buffers, _bounce.py). The planning is
the same for both.
"""
import io
import os

import torch

from . import _bounce, _native, _restore, _safe_pickle
from ._connection import resolve_checkpoint_dir
from ._flatten import flatten, is_stateful
from ._tensors import chunks_of, dtype_from_name, dtype_name, is_cuda
from .errors import InvalidArgument, NotFound


class _Pending:
    """Read requests and the work to do after the native read."""

    def __init__(self, bounce=False):
        self.requests = []
        self.keep = []
        self.copies = []   # (destination chunk, temporary filled by the read)
        self.bounce = bounce
        self.device_pieces = []  # CUDA destinations restored through pinned buffers

    def add(self, fqn, entry, ch):
        saved_dtype = dtype_from_name(entry["dtype"])
        dest = ch.local
        if self.bounce and is_cuda(dest):
            self.device_pieces.extend(_bounce.bounce_pieces(
                fqn, dest, tuple(ch.offsets), saved_dtype, _bounce.bounce_half_bytes()))
            return
        direct = (dest.device.type == "cpu" and dest.layout == torch.strided
                  and dest.dtype == saved_dtype and not dest.is_conj() and not dest.is_neg())
        if direct:
            target = dest.detach()
        else:
            target = torch.empty(tuple(dest.shape), dtype=saved_dtype)
            self.copies.append((dest, target))
        name = fqn.encode()
        dt = dtype_name(saved_dtype).encode()
        offs = _native.int64_array(ch.offsets)
        sizes = _native.int64_array(target.shape)
        strides = _native.int64_array(target.stride())
        self.keep += [name, dt, offs, sizes, strides, target]
        self.requests.append(_native.ReadRequest(
            fqn=name, dtype=dt, ndim=target.dim(), offsets=offs, sizes=sizes, strides=strides,
            data=target.data_ptr() if target.numel() else None))


def _torch_load_bytes(raw, fqn=None, weights_only=True):
    """A bytes item's object. weights_only (the default): through the
    restricted unpickler (_safe_pickle: allowlisted globals only, else
    UnsafeCheckpointError); False: full unpickling, as stock DCP does."""
    if weights_only:
        return _safe_pickle.torch_load_restricted(raw, fqn)
    bio = io.BytesIO(raw)
    try:
        return torch.load(bio, map_location="cpu", weights_only=False)
    except TypeError:  # torch without weights_only
        bio.seek(0)
        return torch.load(bio, map_location="cpu")


def _add_missing_optimizer_state(key, sub, entries, planner_data):
    """A freshly built optimizer has no per-parameter state yet, so its
    state_dict() offers nothing for the checkpoint's `state` entries to load
    into. Add placeholders for them (tensors of the saved shape and dtype,
    None for objects) keyed by the integer parameter index, so that
    load_state_dict receives the complete saved state."""
    state = sub.get("state") if isinstance(sub, dict) else None
    if not isinstance(state, dict):
        return
    for fqn, entry in entries.items():
        path = planner_data.get(fqn)
        if not path or len(path) < 4 or path[0] != key or path[1] != "state":
            continue
        pid = int(path[2]) if isinstance(path[2], str) and path[2].isdigit() else path[2]
        node = state.setdefault(pid, {})
        for part in path[3:-1]:
            if not isinstance(node, dict):
                break
            node = node.setdefault(part, {})
        else:
            if isinstance(node, dict) and path[-1] not in node:
                if entry["type"] == "tensor":
                    node[path[-1]] = torch.empty(tuple(entry["size"]),
                                                 dtype=dtype_from_name(entry["dtype"]))
                else:
                    node[path[-1]] = None


def _plan_reads(leaves, entries, strict, directory, bounce):
    """The reads that fill the flattened `leaves` from the checkpoint's
    `entries` ({fqn: metadata entry}): a _Pending of tensor reads, and the
    leaves whose values are bytes items. Raises NotFound for a leaf the
    checkpoint lacks (strict), InvalidArgument for a kind or global shape
    that differs from the saved one."""
    pending = _Pending(bounce=bounce)
    objects = []
    for leaf in leaves:
        entry = entries.get(leaf.fqn)
        if entry is None:
            if strict:
                raise NotFound(f"Missing key in checkpoint state_dict: {leaf.fqn} "
                               f"(checkpoint {directory})")
            continue
        if entry["type"] == "bytes":
            objects.append(leaf)
            continue
        chunks = chunks_of(leaf.value)
        if chunks is None:
            raise InvalidArgument(f"{leaf.fqn}: the checkpoint holds a tensor but the state "
                                  f"dict has a {type(leaf.value).__name__}")
        for ch in chunks:
            if tuple(ch.global_shape) != tuple(entry["size"]):
                raise InvalidArgument(f"Size mismatch between saved {list(entry['size'])} and "
                                      f"current: {list(ch.global_shape)} for {leaf.fqn}")
            pending.add(leaf.fqn, entry, ch)
    return pending, objects


def _plan(state_dict, md, strict, directory, bounce):
    """(work, pending, objects, entries) for loading `state_dict` from the
    index `md`: `work` holds each value or its Stateful's state dict (a
    fresh optimizer's missing state added), `pending` the tensor reads
    (_plan_reads), `objects` the leaves whose values are bytes items,
    `entries` the index by fqn. The one planning of both load paths."""
    entries = {e["fqn"]: e for e in md["entries"]}
    planner_data = md.get("planner_data") or {}
    work = {}
    for k, v in state_dict.items():
        work[k] = v.state_dict() if is_stateful(v) else v
        if isinstance(v, torch.optim.Optimizer):
            _add_missing_optimizer_state(str(k), work[k], entries, planner_data)
    pending, objects = _plan_reads(flatten(work), entries, strict, directory, bounce)
    return work, pending, objects, entries


def _read_direct(state_dict, directory, strict, threads, verify_crc):
    """The direct reader path: (work, pending, objects, bytes read,
    payloads of `objects`)."""
    if threads is None:
        threads = max(1, min(8, os.cpu_count() or 1))
    with _native.Reader(directory, threads, verify_crc=verify_crc) as reader:
        md = reader.metadata(chunks=False)   # no per-chunk objects: the reader plans
        work, pending, objects, _ = _plan(state_dict, md, strict, directory,
                                          _bounce.use_bounce())
        nread = reader.read(pending.requests)
        _copy_back(pending)
        if pending.device_pieces:
            nread += _bounce.restore_device_pieces(reader, pending.device_pieces)
        raws = []
        for leaf in objects:
            raws.append(reader.read_bytes(leaf.fqn))
            nread += len(raws[-1])
    return work, pending, objects, nread, raws


def _copy_back(pending):
    for dest, tmp in pending.copies:
        with torch.no_grad():
            dest.copy_(tmp)


def load(state_dict, checkpoint_id, *, strict=True, threads=None, socket=None,
         process_group=None, weights_only=True, verify_crc=True, via_daemon=None,
         local_rank=None, local_world_size=None):
    """Loads checkpoint `checkpoint_id` into `state_dict` in place, like
    torch.distributed.checkpoint.load: tensors (plain, ckptd.Shard, DTensor,
    ShardedTensor; CPU or CUDA) are filled with the values of their box of
    the saved global tensor, whatever sharding saved it; other values are
    replaced by the saved ones; Stateful values get load_state_dict() with
    the loaded state. A fresh optimizer's missing per-parameter state is
    materialised from the checkpoint. strict=False skips keys the
    checkpoint lacks (else NotFound). Returns the number of bytes read
    (through the daemon: delivered into the state dict). No daemon is
    needed unless checkpoint_id is relative.

    weights_only=True (the default) decodes bytes items (optimizer
    param_groups, scheduler and data-loader state) with a restricted
    unpickler that admits only allowlisted globals (tensors, containers,
    numbers, strings, numpy values; README "Security model") and raises
    UnsafeCheckpointError naming any other global before importing it;
    weights_only=False unpickles them fully, like stock DCP (only for
    checkpoints you trust: a pickle can run code). verify_crc=True (the
    default) checks the CRC-32 of every payload record values come from
    (DataLoss naming the file, item and offset on a mismatch); False skips
    the check.

    via_daemon=None (the default) loads through the node's daemon (at
    `socket`) when one answers and serves restores (and the native library
    speaks C API 5), else reads the files directly, logging the reason once;
    True: through the daemon or raise; False: directly. Through the daemon,
    the n-th loads of the node's ranks form one restore group, in which
    each byte range is read once; local_rank / local_world_size (default
    $LOCAL_RANK / $LOCAL_WORLD_SIZE, else 0 / 1) place this process in it.
    ckptd._restore.last_stats() describes the last such load."""
    directory = resolve_checkpoint_dir(checkpoint_id, socket)
    seq = _restore.next_load_number()
    daemon = _restore.open_restore(directory, socket, via_daemon, process_group)
    if daemon is None:
        work, pending, objects, nread, raws = _read_direct(state_dict, directory, strict,
                                                           threads, verify_crc)
    else:
        try:
            work, pending, objects, entries = _plan(state_dict, daemon.index, strict,
                                                    daemon.directory, bounce=False)
        except Exception:
            daemon.leave(seq, local_rank, local_world_size)
            raise
        nread, raws = daemon.run(pending.requests,
                                 [(leaf.fqn, entries[leaf.fqn].get("nbytes", 0))
                                  for leaf in objects],
                                 seq, verify_crc, local_rank, local_world_size)
        _copy_back(pending)
    for leaf, raw in zip(objects, raws):
        leaf.container[leaf.key] = _torch_load_bytes(raw, leaf.fqn, weights_only)
    for k, v in state_dict.items():
        if is_stateful(v):
            v.load_state_dict(work[k])
        else:
            state_dict[k] = work[k]
    return nread
