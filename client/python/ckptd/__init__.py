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
"""
from ._flatten import flatten, flatten_state_dict
from ._native import library_path
from ._tensors import Shard
from .checkpoint import (AsyncSaveHandle, CheckpointStatus, SaveStats, async_save, cancel,
                         client, close_clients, default_socket, is_stateful, list_checkpoints,
                         load, resolve_checkpoint_dir, save, status)
from .cluster import Cluster, cluster_from_env, discover_cluster
from .errors import (CheckpointFailed, CkptdError, DaemonUnavailable, DataLoss, DeadlineExceeded,
                     InvalidArgument, NotFound, PermissionDenied, UnsafeCheckpointError)
from .manager import CheckpointManager

__version__ = "0.4.0"

__all__ = [
    "AsyncSaveHandle", "CheckpointFailed", "CheckpointManager", "CheckpointStatus",
    "CkptdError", "Cluster", "DaemonUnavailable", "DataLoss", "DeadlineExceeded", "InvalidArgument", "NotFound",
    "PermissionDenied", "SaveStats", "Shard", "async_save", "cancel", "client", "close_clients",
    "cluster_from_env", "default_socket", "discover_cluster", "flatten", "flatten_state_dict", "is_stateful", "library_path", "list_checkpoints", "load",
    "reserve", "resolve_checkpoint_dir", "save", "status", "UnsafeCheckpointError",
]


def reserve(nbytes, socket=None):
    """Creates this process's shared-memory arena for saves of up to `nbytes`
    now, so that the first save does not pay for it (about 1 s per GiB)."""
    client(socket).reserve(nbytes)
