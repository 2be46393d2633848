"""Faithful re-creations of the PyTorch 2.x DCP `.metadata` classes.

Debian's torch 1.13 has no `torch.distributed.checkpoint`, and its
`torch.distributed._shard.sharded_tensor.metadata` cannot be imported under
Python 3.11 (its ShardedTensorMetadata uses a dataclass instance as a
default, which 3.11 rejects as a mutable default; the 1.13 TensorProperties
itself has the 2.x shape). `install()` registers stand-ins under the exact
module paths that PyTorch 2.x pickles record (dcp-format.md §3.1–§3.2), so
that plain `pickle.load` / `pickle.dump` handle `.metadata` files as a real
torch 2.x would:

  torch.distributed.checkpoint                      (package, new)
  torch.distributed.checkpoint.metadata             Metadata, StorageMeta,
      TensorStorageMetadata, ChunkStorageMetadata, BytesStorageMetadata,
      TensorProperties, _MEM_FORMAT_ENCODING, MetadataIndex
  torch.distributed.checkpoint.filesystem           _StorageInfo (2.7+)
  torch.distributed._shard.sharded_tensor.metadata  TensorProperties,
      MEM_FORMAT_ENCODING (the real module when it imports and has that
      shape, else a stand-in registered for that name only)

Real torch types are used throughout (torch.Size, dtypes, torch.strided,
torch.contiguous_format). Nothing that already imports is replaced; parent
packages that exist are only given the new attribute.
"""
import dataclasses
import importlib
import os
import sys
import types
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional, Sequence, Union

import torch
import torch.distributed  # noqa: F401  (the parent package must exist)

CKPT = "torch.distributed.checkpoint"
METADATA = "torch.distributed.checkpoint.metadata"
FILESYSTEM = "torch.distributed.checkpoint.filesystem"
SHARD = "torch.distributed._shard.sharded_tensor.metadata"


def _memory_format_to_enum(enum_cls, memory_format):
    if memory_format == torch.contiguous_format:
        return enum_cls.TORCH_CONTIGUOUS_FORMAT
    if memory_format == torch.channels_last:
        return enum_cls.TORCH_CHANNELS_LAST
    if memory_format == torch.preserve_format:
        return enum_cls.TORCH_PRESERVE_FORMAT
    raise RuntimeError(f"Invalid torch.memory_format: {memory_format}")


def _enum_to_memory_format(enum_cls, encoding):
    if encoding == enum_cls.TORCH_CONTIGUOUS_FORMAT:
        return torch.contiguous_format
    if encoding == enum_cls.TORCH_CHANNELS_LAST:
        return torch.channels_last
    if encoding == enum_cls.TORCH_PRESERVE_FORMAT:
        return torch.preserve_format
    raise RuntimeError(f"Invalid torch.memory_format encoding: {encoding}")


# ---------------------------------------------------------------------------
# torch.distributed.checkpoint.metadata (PyTorch 2.4 – 2.11)
# ---------------------------------------------------------------------------


class _MEM_FORMAT_ENCODING(Enum):
    __module__ = METADATA
    TORCH_CONTIGUOUS_FORMAT = 0
    TORCH_CHANNELS_LAST = 1
    TORCH_PRESERVE_FORMAT = 2


@dataclass
class ChunkStorageMetadata:
    __module__ = METADATA
    offsets: torch.Size
    sizes: torch.Size


@dataclass
class TensorProperties:
    """Properties used to create a Tensor (2.3+ copy)."""
    __module__ = METADATA
    dtype: torch.dtype = field(default_factory=torch.get_default_dtype)
    # Deprecated fields (kept for BC).
    layout: torch.layout = field(default=torch.strided)
    requires_grad: bool = False
    memory_format: torch.memory_format = field(default=torch.contiguous_format)
    pin_memory: bool = False

    def __getstate__(self):
        # torch.memory_format cannot be pickled.
        return (
            self.dtype,
            self.layout,
            self.requires_grad,
            _memory_format_to_enum(_MEM_FORMAT_ENCODING, self.memory_format),
            self.pin_memory,
        )

    def __setstate__(self, state):
        (self.dtype, self.layout, self.requires_grad, mem_format_encoding,
         self.pin_memory) = state
        self.memory_format = _enum_to_memory_format(_MEM_FORMAT_ENCODING,
                                                    mem_format_encoding)

    @staticmethod
    def create_from_tensor(tensor: torch.Tensor) -> "TensorProperties":
        return TensorProperties(
            dtype=tensor.dtype,
            layout=tensor.layout,
            requires_grad=tensor.requires_grad,
            memory_format=torch.contiguous_format,
            pin_memory=tensor.is_pinned(),
        )


@dataclass
class TensorStorageMetadata:
    __module__ = METADATA
    properties: TensorProperties
    size: torch.Size
    chunks: List[ChunkStorageMetadata]


@dataclass
class BytesStorageMetadata:
    __module__ = METADATA


STORAGE_TYPES = Union[TensorStorageMetadata, BytesStorageMetadata]


@dataclass
class StorageMeta:
    __module__ = METADATA
    checkpoint_id: Union[str, os.PathLike, None] = None
    save_id: Optional[str] = None
    load_id: Optional[str] = None
    modules: List[str] = field(default_factory=list)  # 2.7+


@dataclass
class Metadata:
    """This class represents the metadata of the checkpoint."""
    __module__ = METADATA
    # Keys are the same from the `state_dict` used.
    state_dict_metadata: Dict[str, STORAGE_TYPES]
    # It is the responsibility of the planner and storage plugins to ensure
    # backward compatibility of the planner_data and storage_data.
    planner_data: Any = None
    storage_data: Any = None
    storage_meta: Optional[StorageMeta] = None
    version: Optional[str] = None  # 2.8/2.9+


@dataclass(frozen=True)
class MetadataIndex:
    """This class represents a lookup key for items in a state dict or
    Metadata."""
    __module__ = METADATA
    fqn: str
    """Fully Qualified Name of the object"""
    offset: Optional[torch.Size] = None
    """If the object is a tensor, offset into the tensor we're looking for"""
    index: Optional[int] = field(hash=False, compare=False, default=None)
    """Index hint when searching for tensor chunk to speedup lookups
    (optional)."""

    def __init__(self, fqn: str, offset: Optional[Sequence[int]] = None,
                 index: Optional[int] = None):
        # We must use object.__setattr__ due to frozen=True.
        object.__setattr__(self, "fqn", fqn)
        object.__setattr__(self, "index", index)
        if offset is not None:
            object.__setattr__(self, "offset", torch.Size(offset))


# ---------------------------------------------------------------------------
# torch.distributed.checkpoint.filesystem
# ---------------------------------------------------------------------------


@dataclass
class _StorageInfo:
    """This is the per entry storage info."""
    __module__ = FILESYSTEM
    relative_path: str
    offset: int
    length: int
    transform_descriptors: Optional[Sequence[str]] = None  # 2.7+

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if v is not None}


# ---------------------------------------------------------------------------
# torch.distributed._shard.sharded_tensor.metadata (pre-2.3 home of
# TensorProperties; still importable in 2.x). A copy of the 1.13 / 2.x code.
# ---------------------------------------------------------------------------


class MEM_FORMAT_ENCODING(Enum):
    __module__ = SHARD
    TORCH_CONTIGUOUS_FORMAT = 0
    TORCH_CHANNELS_LAST = 1
    TORCH_PRESERVE_FORMAT = 2


@dataclass
class ShardTensorProperties:
    """Properties used to create :class:`Tensor` (old _shard copy)."""
    __module__ = SHARD
    dtype: torch.dtype = field(default=torch.get_default_dtype())
    layout: torch.layout = field(default=torch.strided)
    requires_grad: bool = False
    memory_format: torch.memory_format = field(default=torch.contiguous_format)
    pin_memory: bool = False

    def __getstate__(self):
        return (
            self.dtype,
            self.layout,
            self.requires_grad,
            _memory_format_to_enum(MEM_FORMAT_ENCODING, self.memory_format),
            self.pin_memory,
        )

    def __setstate__(self, state):
        (self.dtype, self.layout, self.requires_grad, mem_format_encoding,
         self.pin_memory) = state
        self.memory_format = _enum_to_memory_format(MEM_FORMAT_ENCODING,
                                                    mem_format_encoding)


ShardTensorProperties.__name__ = "TensorProperties"
ShardTensorProperties.__qualname__ = "TensorProperties"


# ---------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------

_installed = None


def _has_tensor_properties_shape(mod) -> bool:
    tp = getattr(mod, "TensorProperties", None)
    enc = getattr(mod, "MEM_FORMAT_ENCODING", None)
    if tp is None or enc is None or not dataclasses.is_dataclass(tp):
        return False
    names = [f.name for f in dataclasses.fields(tp)]
    return (names == ["dtype", "layout", "requires_grad", "memory_format",
                      "pin_memory"]
            and "__getstate__" in vars(tp) and "__setstate__" in vars(tp)
            and [m.name for m in enc] == ["TORCH_CONTIGUOUS_FORMAT",
                                          "TORCH_CHANNELS_LAST",
                                          "TORCH_PRESERVE_FORMAT"])


def _module(name: str, doc: str, package: bool = False) -> types.ModuleType:
    mod = types.ModuleType(name, doc)
    mod.__file__ = __file__
    if package:
        mod.__path__ = []
    return mod


def install() -> types.SimpleNamespace:
    """Registers the modules (idempotent) and returns a namespace with the
    classes: Metadata, StorageMeta, TensorStorageMetadata,
    ChunkStorageMetadata, BytesStorageMetadata, TensorProperties,
    _MEM_FORMAT_ENCODING, MetadataIndex, _StorageInfo, ShardTensorProperties,
    MEM_FORMAT_ENCODING, and `shard_is_real` (whether the _shard module is
    torch's own)."""
    global _installed
    if _installed is not None:
        return _installed

    try:
        real = importlib.import_module(METADATA)
    except ImportError:
        real = None
    if real is not None and getattr(real, "__file__", None) != __file__:
        raise RuntimeError(
            f"{METADATA} is importable from torch itself ({real.__file__}); "
            "use the real classes instead of dcp_shim")

    ckpt = sys.modules.get(CKPT)
    if ckpt is None:
        ckpt = _module(CKPT, "dcp_shim stand-in for torch.distributed.checkpoint",
                       package=True)
        sys.modules[CKPT] = ckpt
        torch.distributed.checkpoint = ckpt

    meta = _module(METADATA, "dcp_shim: PyTorch 2.x DCP metadata classes")
    for obj in (_MEM_FORMAT_ENCODING, ChunkStorageMetadata, TensorProperties,
                TensorStorageMetadata, BytesStorageMetadata, StorageMeta,
                Metadata, MetadataIndex):
        setattr(meta, obj.__name__, obj)
    meta.STORAGE_TYPES = STORAGE_TYPES
    sys.modules[METADATA] = meta
    ckpt.metadata = meta

    fs = _module(FILESYSTEM, "dcp_shim: PyTorch 2.x FileSystemWriter types")
    fs._StorageInfo = _StorageInfo
    sys.modules[FILESYSTEM] = fs
    ckpt.filesystem = fs

    # The _shard module: reuse torch's own if it imports and has the shape.
    shard_is_real = False
    shard_tp, shard_enum = ShardTensorProperties, MEM_FORMAT_ENCODING
    try:
        shard = importlib.import_module(SHARD)
    except Exception:  # 1.13 on Python 3.11: ValueError at import
        shard = None
    if shard is not None and _has_tensor_properties_shape(shard):
        shard_is_real = True
        shard_tp, shard_enum = shard.TensorProperties, shard.MEM_FORMAT_ENCODING
    else:
        # Register the leaf only: parents keep failing (or working) exactly
        # as before; pickle's find_class needs sys.modules[SHARD] only.
        stand_in = _module(SHARD, "dcp_shim stand-in: old TensorProperties")
        stand_in.TensorProperties = ShardTensorProperties
        stand_in.MEM_FORMAT_ENCODING = MEM_FORMAT_ENCODING
        sys.modules[SHARD] = stand_in

    _installed = types.SimpleNamespace(
        Metadata=Metadata,
        StorageMeta=StorageMeta,
        TensorStorageMetadata=TensorStorageMetadata,
        ChunkStorageMetadata=ChunkStorageMetadata,
        BytesStorageMetadata=BytesStorageMetadata,
        TensorProperties=TensorProperties,
        _MEM_FORMAT_ENCODING=_MEM_FORMAT_ENCODING,
        MetadataIndex=MetadataIndex,
        _StorageInfo=_StorageInfo,
        ShardTensorProperties=shard_tp,
        MEM_FORMAT_ENCODING=shard_enum,
        shard_is_real=shard_is_real,
    )
    return _installed
