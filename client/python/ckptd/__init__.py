"""ckptd: save, async_save and load PyTorch state dicts through the node's
ckptd checkpoint daemon, in the torch.distributed.checkpoint (DCP) format.

  import ckptd
  h = ckptd.async_save({"model": model, "optim": optim}, "run1/step_100")
  ...                      # training goes on; the daemon writes and commits
  h.result()               # CheckpointStatus(state="COMMITTED", ...)
  ckptd.load({"model": model, "optim": optim}, "run1/step_100")

Stock torch.distributed.checkpoint.load reads what ckptd.save writes (same
keys, same planner_data, same .metadata), and ckptd.load reads dcp.save
output, resharding to any world size.

The modules, in data-flow order (none imports another in a cycle; tests/
python/test_package_structure.py checks it):
  errors        CkptdError and its subclasses, each with its status code;
                error_for, the one native status -> class mapping
  _native       ctypes binding of libckptd_client.so (the only user of it)
  _types        CheckpointStatus, SaveStats (plain records)
  _connection   the cached daemon connections; status, list, cancel,
                relative checkpoint ids
  cluster       multi-node Cluster and its discovery
  _flatten, _tensors, _cuda   state dict -> leaves -> chunks; the CUDA IPC plan
  _arena        the rank's shared-memory arena: the bytes a save needs
                there, the background reservation (CheckpointManager)
  _save         save / async_save; reserve, arena_bytes
  _handle       AsyncSaveHandle and its waits
  _restore      loading through the daemon (which path a load takes, the
                restore group, last_stats)
  _load         load (the planning of both paths, the direct reader);
                _bounce: CUDA restores through pinned bounce buffers;
                _safe_pickle: the restricted unpickler of bytes items
  manager       CheckpointManager
  _storage      StorageReader: DCP's StorageReader over ckptd's reader
                (imported on first use: it needs torch >= 2.4)
  _writer       StorageWriter: DCP's StorageWriter through the daemon
                (imported on first use: it needs torch >= 2.4)
"""
from ._connection import (cancel, client, close_clients, default_socket, list_checkpoints,
                          resolve_checkpoint_dir, status)
from ._flatten import flatten, flatten_state_dict, is_stateful
from ._handle import AsyncSaveHandle
from ._load import load
from ._native import library_path
from ._save import arena_bytes, async_save, reserve, save
from ._tensors import Shard
from ._types import CheckpointStatus, SaveStats
from .cluster import Cluster, cluster_from_env, discover_cluster
from .errors import (CheckpointFailed, CkptdError, DaemonUnavailable, DataLoss, DeadlineExceeded,
                     InvalidArgument, NotFound, PermissionDenied, UnsafeCheckpointError)
from .manager import CheckpointManager

__version__ = "0.4.0"


def __getattr__(name):
    # ckptd.StorageReader / StorageWriter subclass torch.distributed
    # .checkpoint's StorageReader / StorageWriter (torch >= 2.4): imported on
    # first use, so that `import ckptd` works with older torch.
    if name in ("StorageReader", "StorageWriter"):
        try:
            if name == "StorageReader":
                from ._storage import StorageReader as cls
            else:
                from ._writer import StorageWriter as cls
        except ImportError as e:
            raise ImportError(f"ckptd.{name} needs torch.distributed.checkpoint "
                              f"(torch >= 2.4): {e}") from e
        return cls
    raise AttributeError(f"module 'ckptd' has no attribute {name!r}")

__all__ = [
    "AsyncSaveHandle", "CheckpointFailed", "CheckpointManager", "CheckpointStatus",
    "CkptdError", "Cluster", "DaemonUnavailable", "DataLoss", "DeadlineExceeded", "InvalidArgument", "NotFound",
    "PermissionDenied", "SaveStats", "Shard", "arena_bytes", "async_save", "cancel", "client", "close_clients",
    "cluster_from_env", "default_socket", "discover_cluster", "flatten", "flatten_state_dict", "is_stateful", "library_path", "list_checkpoints", "load",
    "reserve", "resolve_checkpoint_dir", "save", "status", "StorageReader", "StorageWriter", "UnsafeCheckpointError",
]

