"""How state-dict values map to DCP chunks: plain tensors (one full chunk),
ckptd.Shard (a rank's box of a larger tensor, for any torch version),
DTensor (torch >= 2.4) and ShardedTensor local shards, each with their
global offsets. Used by both save (what to send) and load (what to fill)."""
import logging
from dataclasses import dataclass
from typing import Sequence

import torch

log = logging.getLogger("ckptd")


@dataclass
class Shard:
    """This rank's piece of a larger ("global") tensor: `tensor` holds the
    box [offsets, offsets + tensor.shape) of a tensor of shape
    `global_shape`. Put it in a state dict wherever the global tensor would
    be; the checkpoint stores the global tensor as chunks (like DTensor), so
    any other sharding — or a plain full tensor, with stock dcp.load too —
    can load it."""
    tensor: torch.Tensor
    offsets: Sequence[int]
    global_shape: Sequence[int]

    def __post_init__(self):
        self.offsets = tuple(int(o) for o in self.offsets)
        self.global_shape = tuple(int(s) for s in self.global_shape)
        shape = tuple(self.tensor.shape)
        if not (len(shape) == len(self.offsets) == len(self.global_shape)):
            raise ValueError(f"Shard: tensor shape {shape}, offsets {self.offsets} and "
                             f"global_shape {self.global_shape} differ in rank")
        for d, (o, s, g) in enumerate(zip(self.offsets, shape, self.global_shape)):
            if o < 0 or o + s > g:
                raise ValueError(f"Shard: dimension {d}: [{o}, {o + s}) is outside "
                                 f"[0, {g})")


@dataclass
class Chunk:
    local: torch.Tensor    # the chunk's elements
    offsets: tuple         # its global offsets
    global_shape: tuple


def _dtensor_type():
    for mod in ("torch.distributed.tensor", "torch.distributed._tensor"):
        try:
            m = __import__(mod, fromlist=["DTensor"])
            return m.DTensor
        except Exception:  # absent (torch 1.13) or broken import
            continue
    return None


_DTENSOR = _dtensor_type()


def is_dtensor(value):
    return _DTENSOR is not None and isinstance(value, _DTENSOR)


def is_sharded_tensor(value):
    # ShardedTensor cannot even be imported on torch 1.13 + Python 3.11, so
    # detect it by shape.
    return type(value).__name__ == "ShardedTensor" and hasattr(value, "local_shards")


def chunks_of(value):
    """The chunks of a tensor-like value, or None for anything else (saved
    as a torch.save object). A DTensor whose mesh excludes this rank gives
    []."""
    if isinstance(value, Shard):
        return [Chunk(value.tensor, value.offsets, value.global_shape)]
    if is_dtensor(value):
        if value.device_mesh.get_coordinate() is None:
            return []
        local = value.to_local()
        if hasattr(value, "__create_chunk_list__"):
            (chunk,) = value.__create_chunk_list__()
            offsets = tuple(int(o) for o in chunk.offsets)
        else:  # pragma: no cover - torch 2.4 has __create_chunk_list__
            from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
            _, offs = compute_local_shape_and_global_offset(value.shape, value.device_mesh,
                                                            value.placements)
            offsets = tuple(int(o) for o in offs)
        return [Chunk(local, offsets, tuple(value.shape))]
    if is_sharded_tensor(value):
        out = []
        for shard in value.local_shards():
            out.append(Chunk(shard.tensor, tuple(int(o) for o in shard.metadata.shard_offsets),
                             tuple(value.size())))
        return out
    if isinstance(value, torch.Tensor):
        return [Chunk(value, (0,) * value.dim(), tuple(value.shape))]
    return None


def is_cuda(t):
    return isinstance(t, torch.Tensor) and t.device.type == "cuda"


def dtype_name(dtype):
    return str(dtype).rsplit(".", 1)[-1]


def dtype_from_name(name):
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"the checkpoint holds dtype '{name}', which this torch "
                         f"({torch.__version__}) does not have")
    return dt


_logged = set()


def log_once(key, msg, *args):
    if key not in _logged:
        _logged.add(key)
        log.warning(msg, *args)


def check_savable(t, fqn):
    """Raises ValueError for tensors that have no savable strided data."""
    if t.layout != torch.strided:
        raise ValueError(f"{fqn}: {t.layout} tensors are not supported; densify first")
    if t.device.type == "meta":
        raise ValueError(f"{fqn}: a meta tensor has no data to save")


def host_view(t, fqn, quiet=False):
    """A CPU, strided, conj/neg-resolved tensor with t's values, and whether
    it is a copy. Device tensors are copied to host memory here (the
    client-side D2H path), logged once unless `quiet` (the CUDA IPC plan
    logs its own reason)."""
    check_savable(t, fqn)
    t = t.detach()
    copied = False
    if t.device.type != "cpu":
        if not quiet:
            log_once(("d2h", t.device.type),
                     "ckptd: %s tensors are copied to host memory by the client "
                     "(device-to-host, then into shared memory)", t.device.type)
        t = t.to("cpu")
        copied = True
    if t.is_conj():
        t, copied = t.resolve_conj(), True
    if t.is_neg():
        t, copied = t.resolve_neg(), True
    return t, copied
