"""Restoring into CUDA tensors through pinned bounce buffers.

The load path (_load.py) hands over the CUDA destinations as Pieces (rows
of a destination, each read as a C-contiguous box of the saved dtype); the
native reader fills one of two alternating pinned host buffers while the
other's host-to-device copies run on a side stream per device, so reads and
H2D copies overlap. Where pinned memory cannot be had the same loop runs
through pageable buffers. The packing (split_rows, pack_batches) is pure and
the copy backend is an object, so the loop is tested on CPU.
"""
import dataclasses
import logging
import os

import torch

from . import _native
from ._tensors import dtype_name

log = logging.getLogger("ckptd")

BOUNCE_ENV = "CKPTD_LOAD_BOUNCE_BYTES"
DEFAULT_BOUNCE_HALF = 256 << 20
_ALIGN = 256


def bounce_half_bytes():
    """Bytes of each of the two pinned bounce buffers of a CUDA restore
    ($CKPTD_LOAD_BOUNCE_BYTES is their sum; default 512 MiB)."""
    env = os.environ.get(BOUNCE_ENV)
    total = int(env) if env else 2 * DEFAULT_BOUNCE_HALF
    return max(_ALIGN, total // 2)


@dataclasses.dataclass
class Piece:
    """Rows [r0, r1) of dim 0 of a destination (the whole of a 0-d one)
    read as a C-contiguous box of the saved dtype, then copied H2D."""
    fqn: str
    dest: object            # the destination view (dest.narrow(0, r0, r1 - r0))
    offsets: tuple          # global offsets of the box
    shape: tuple            # the box's sizes
    dtype: object           # saved dtype
    nbytes: int


def split_rows(shape, elsize, limit):
    """[(r0, r1)] covering dim 0 of `shape` in runs of at most `limit`
    bytes (at least one row each, so a run may exceed `limit` when one row
    does); [(0, 0)] for 0-d and empty tensors (one piece, nothing split)."""
    if len(shape) == 0:
        return [(0, 0)]
    rows = shape[0]
    row_bytes = elsize
    for d in shape[1:]:
        row_bytes *= d
    if rows == 0 or row_bytes == 0:
        return [(0, rows)]
    per = max(1, limit // row_bytes)
    return [(r, min(rows, r + per)) for r in range(0, rows, per)]


def bounce_pieces(fqn, dest, offsets, saved_dtype, half):
    elsize = torch.empty((), dtype=saved_dtype).element_size()
    shape = tuple(dest.shape)
    out = []
    for r0, r1 in split_rows(shape, elsize, half):
        if not shape:
            view, box, offs = dest, (), offsets
        else:
            view = dest.narrow(0, r0, r1 - r0)
            box = (r1 - r0,) + shape[1:]
            offs = (offsets[0] + r0,) + tuple(offsets[1:])
        n = elsize
        for d in box:
            n *= d
        out.append(Piece(fqn, view, offs, box, saved_dtype, n))
    return out


def pack_batches(sizes, half, align=_ALIGN):
    """Greedy packing of pieces (byte sizes, in order) into batches that
    fill one bounce buffer of `half` bytes: [[(index, offset)], ...]. A
    piece larger than `half` is a batch of its own at offset 0 (it gets a
    buffer of its own)."""
    batches, cur, used = [], [], 0
    for i, n in enumerate(sizes):
        if n > half:
            if cur:
                batches.append(cur)
                cur, used = [], 0
            batches.append([(i, 0)])
            continue
        off = (used + align - 1) // align * align
        if cur and off + n > half:
            batches.append(cur)
            cur, off = [], 0
        cur.append((i, off))
        used = off + n
    if cur:
        batches.append(cur)
    return batches


class CudaBounce:
    """H2D through pinned host memory: copies on a side stream per device
    (non_blocking), fenced by events."""

    def __init__(self):
        self.streams = {}

    def alloc(self, nbytes):
        return torch.empty(int(nbytes), dtype=torch.uint8, pin_memory=True)

    def _stream(self, device):
        s = self.streams.get(device)
        if s is None:
            s = torch.cuda.Stream(device=device)
            # Earlier work on the destinations (their initialisation) first.
            s.wait_stream(torch.cuda.current_stream(device))
            self.streams[device] = s
        return s

    def copy(self, dest, src):
        with torch.cuda.stream(self._stream(dest.device)):
            dest.copy_(src, non_blocking=True)

    def fence(self):
        return [s.record_event() for s in self.streams.values()]

    def wait(self, fence):
        for e in fence:
            e.synchronize()

    def finish(self):
        for dev, s in self.streams.items():
            torch.cuda.current_stream(dev).wait_stream(s)
            s.synchronize()


class PageableBounce(CudaBounce):
    """H2D through pageable host memory (synchronous copies): the fallback
    when pinned memory cannot be had."""

    def alloc(self, nbytes):
        return torch.empty(int(nbytes), dtype=torch.uint8)

    def copy(self, dest, src):
        dest.copy_(src)

    def fence(self):
        return []


def restore_through_bounce(reader, pieces, backend, half):
    """Reads `pieces` (see Piece) into two alternating bounce buffers of
    `half` bytes (backend.alloc) and copies each batch to its destinations
    (backend.copy, asynchronous); before a buffer is refilled, the copies
    out of it are waited for (backend.fence / wait), so that the reads of
    batch i + 1 overlap the H2D copies of batch i. Returns the bytes read."""
    if not pieces:
        return 0
    batches = pack_batches([p.nbytes for p in pieces], half)
    need = max(max(off + pieces[i].nbytes for i, off in b) for b in batches)
    size = min(half, need)
    bufs, fences = [None, None], [None, None]
    nread = 0
    with torch.no_grad():
        for bi, batch in enumerate(batches):
            k = bi % 2
            if fences[k] is not None:
                backend.wait(fences[k])
                fences[k] = None
            first = pieces[batch[0][0]]
            if len(batch) == 1 and first.nbytes > size:
                buf = backend.alloc(first.nbytes)  # an oversized piece: its own buffer
            else:
                if bufs[k] is None:
                    bufs[k] = backend.alloc(size)
                buf = bufs[k]
            requests, keep, views = [], [], []
            for i, off in batch:
                p = pieces[i]
                staging = buf[off:off + p.nbytes].view(p.dtype).view(p.shape)
                name, dt = p.fqn.encode(), dtype_name(p.dtype).encode()
                offs, sizes = _native.int64_array(p.offsets), _native.int64_array(p.shape)
                keep += [name, dt, offs, sizes]
                requests.append(_native.ReadRequest(
                    fqn=name, dtype=dt, ndim=len(p.shape), offsets=offs, sizes=sizes,
                    strides=None, data=staging.data_ptr() if p.nbytes else None))
                views.append((p.dest, staging))
            nread += reader.read(requests)
            for dest, staging in views:
                backend.copy(dest, staging)
            fences[k] = backend.fence()
            if buf is not bufs[k]:
                backend.wait(fences[k])  # the oversized buffer is dropped now
                fences[k] = None
    backend.finish()
    return nread


def use_bounce():
    """Whether CUDA destinations of a load take the bounce path
    ($CKPTD_LOAD_PINNED=0 turns it off)."""
    return torch.cuda.is_available() and os.environ.get("CKPTD_LOAD_PINNED", "1") != "0"


def restore_device_pieces(reader, pieces):
    """CUDA destinations through pinned bounce buffers; if pinned memory
    cannot be had, through pageable temporaries (the old path)."""
    half = bounce_half_bytes()
    try:
        return restore_through_bounce(reader, pieces, CudaBounce(), half)
    except RuntimeError as e:  # pinned allocation failed (e.g. RLIMIT_MEMLOCK)
        if "pin" not in str(e).lower() and "host" not in str(e).lower():
            raise
        log.warning("ckptd: pinned bounce buffers unavailable (%s); restoring CUDA tensors "
                    "through pageable memory", e)
    return restore_through_bounce(reader, pieces, PageableBounce(), half)

