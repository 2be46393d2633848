"""StorageWriter: DCP's StorageWriter (and AsyncStager) through the node's
daemon, for dcp.save / dcp.async_save (torch >= 2.4).

    dcp.save(sd, storage_writer=ckptd.StorageWriter(path))
    dcp.async_save(sd, storage_writer=ckptd.StorageWriter(path))

What goes where (docs/storage-writer.md):
  stage (async_save)  the rank's whole state dict is handed to the daemon
                      as ckptd.async_save does (shared memory, CUDA IPC):
                      async_save returns once the daemon holds the bytes
  write_data          dcp.save: the items of DCP's (deduplicated) plan,
                      resolved by the planner, are handed over the same way;
                      after a stage: nothing left to send
  finish              (DCP's coordinator) waits until the daemon has the
                      data durable, fills DCP's Metadata.storage_data with
                      where the daemon wrote each item, and hands the pickle
                      to the daemon, which checks that it describes exactly
                      what was written and publishes it with its durability
                      steps; returns once committed
The files are FileSystemWriter's format (__{rank}_{k}.distcp, .metadata):
stock FileSystemReader reads them. Values are written as they are in the
state dict; a planner whose resolve_data changes tensors (not only picks
them) must not be combined with async_save's staging.
"""
import logging
import os
import pickle
import threading
import uuid
from concurrent.futures import Future

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import StorageWriter as _DcpStorageWriter
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import WriteItemType
from torch.distributed.checkpoint.storage import WriteResult

from . import _native
from ._connection import client
from ._flatten import Leaf
from ._save import Pickled, _shallow_state, async_save
from ._tensors import Shard
from .cluster import Cluster, cached_cluster
from .errors import CheckpointFailed, InvalidArgument

try:  # torch >= 2.4
    from torch.distributed.checkpoint.staging import AsyncStager as _AsyncStager
except ImportError:  # pragma: no cover
    _AsyncStager = object

try:  # torch >= 2.4
    from torch.distributed.checkpoint.metadata import StorageMeta as _StorageMeta
except ImportError:  # pragma: no cover
    _StorageMeta = None


def _stage_may_return_a_future():
    """Whether this torch's dcp.async_save takes a Future from stage() and
    returns an AsyncSaveResponse (staging_completion, upload_completion):
    torch >= 2.9."""
    try:
        from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse  # noqa: F401
    except ImportError:
        return False
    return True

log = logging.getLogger("ckptd")


def _describes_transforms():
    """Whether this torch's _StorageInfo names payload transforms (torch >=
    2.7): compressed payloads can be described, and read back by stock."""
    return "transform_descriptors" in getattr(_StorageInfo, "__dataclass_fields__", {})


def _storage_info(entry):
    """The _StorageInfo of one GetLayout entry (a compressed payload names
    its transform)."""
    transforms = entry.get("transforms") or []
    kw = dict(relative_path=entry["path"], offset=entry["offset"], length=entry["length"])
    if transforms:
        kw["transform_descriptors"] = list(transforms)
    return _StorageInfo(**kw)


class _RankInfo:
    """What prepare_global_plan tells each rank in its plan's storage_data:
    its rank and the world size as DCP's coordinator saw them."""
    __slots__ = ("rank", "world_size")

    def __init__(self, rank, world_size):
        self.rank, self.world_size = rank, world_size


def _done_future(value):
    """A completed torch.futures.Future (what DCP's write_data returns)."""
    fut = torch.futures.Future()
    fut.set_result(value)
    return fut


def _item_bytes(item):
    if item.type == WriteItemType.BYTE_IO or item.tensor_data is None:
        return 0
    n = 1
    for size in item.tensor_data.chunk.sizes:
        n *= int(size)
    return n * item.tensor_data.properties.dtype.itemsize


def _structural_copy(value):
    """The containers of a state dict copied, the values shared: what DCP
    plans from after a stage (it reads shapes and specs, never the data)."""
    if isinstance(value, dict):
        return {k: _structural_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_structural_copy(v) for v in value]
    return value


class StorageWriter(_DcpStorageWriter, _AsyncStager):
    """torch.distributed.checkpoint's StorageWriter that saves through the
    node's ckptd daemon (module docstring).

    path: the checkpoint directory (absolute, or relative to the daemon's
    first checkpoint root); dcp.save's checkpoint_id replaces it, except
    after an async_save stage (the bytes are already on their way there:
    pass the path here instead). overwrite (default True, as
    FileSystemWriter): replace a committed checkpoint at the same path.
    job / keep_last_n / keep_every: the daemon's retention; compression:
    None or "zstd[:N]" (ckptd.async_save).
    metadata_timeout: how long the daemon keeps the durable data waiting for
    DCP's finish before it fails the checkpoint and removes its files.
    timeout: for each wait of finish (None: until the daemon answers; the
    daemon's own timeouts end every checkpoint). rank / world_size / process_group:
    how a stage (async_save) names this rank before DCP plans (default: the
    process group's, or 0 of 1 without one; pass rank=0, world_size=1 for
    async_save(..., no_dist=True) under an initialised group).

    background_staging=True (torch >= 2.9): dcp.async_save returns at once
    with an AsyncSaveResponse; the bytes go to the daemon on a background
    thread, and the trainer must not modify its tensors before
    response.staging_completion resolves (DCP's async staging contract).

    cluster ("auto", default): ranks on several nodes, each talking to its
    own node's daemon, need nothing more: the writer finds which ranks
    share which daemon from the process group (ckptd.discover_cluster, once
    per process group and socket, at the first stage() for async_save or
    set_up_storage_writer for dcp.save, points every rank passes in the same
    order), and DCP's coordinator (rank 0) hands the .metadata to its node's
    daemon, which checks it against every node's layout before publishing.
    Pass a ckptd.Cluster to skip the discovery, or None for one daemon.
    The process group is `process_group` (default: the default group): it
    must be the one DCP saves over."""

    def __init__(self, path=None, *, job=None, overwrite=True, keep_last_n=0, keep_every=0,
                 compression=None, socket=None,
                 metadata_timeout=600.0, timeout=None, rank=None, world_size=None,
                 process_group=None, background_staging=False, cluster="auto"):
        super().__init__()
        version = _native.library_api_version()
        if version < _native.WRITER_API_VERSION:
            raise InvalidArgument(
                f"ckptd.StorageWriter needs libckptd_client.so of C API version "
                f"{_native.WRITER_API_VERSION} or newer; this one has {version}")
        self.path = os.fspath(path) if path is not None else None
        self.job = job
        self.overwrite = bool(overwrite)
        self.keep_last_n = int(keep_last_n or 0)
        self.keep_every = int(keep_every or 0)
        if compression and not _describes_transforms():
            raise InvalidArgument(f"compression needs torch >= 2.7 (_StorageInfo"
                                  f".transform_descriptors); this is {torch.__version__}")
        self.compression = compression
        self.socket = socket
        self.metadata_timeout = float(metadata_timeout)
        self.timeout = timeout
        self._rank, self._world = rank, world_size
        self._group = process_group
        if background_staging and not _stage_may_return_a_future():
            raise InvalidArgument(f"background_staging needs torch >= 2.9 (dcp.async_save's "
                                  f"staging futures); this is {torch.__version__}")
        self.background_staging = bool(background_staging)
        self._staged = None  # (path, rank, world_size) of the last stage
        self._save_id = None
        if isinstance(cluster, str) and cluster != "auto":
            raise ValueError(f'cluster must be a ckptd.Cluster, None or "auto", not {cluster!r}')
        if cluster is not None and not isinstance(cluster, (str, Cluster)):
            raise TypeError(f'cluster must be a ckptd.Cluster, None or "auto", not '
                            f'{type(cluster).__name__}')
        # "auto" until found; then the Cluster (or None), which travels in
        # the pickle to the process executor's checkpoint process.
        self._cluster = cluster

    def __getstate__(self):
        """DCP's process-based executor (AsyncCheckpointerType.PROCESS)
        pickles the writer into its checkpoint process. The process group,
        used only by stage (in the trainer, before), stays behind: it cannot
        be pickled."""
        state = self.__dict__.copy()
        state["_group"] = None
        return state

    # -- AsyncStager ---------------------------------------------------------
    @property
    def should_synchronize_after_execute(self):
        return False

    def stage(self, state_dict):
        """Hands this rank's state dict to the daemon (async_save: the
        trainer may change its tensors once this returns) and gives DCP a
        copy of its structure to plan from."""
        if self.path is None:
            raise InvalidArgument("ckptd.StorageWriter: no path (give it to the constructor "
                                  "for async_save)")
        r, w = self._stage_rank()
        self._find_cluster()  # in the trainer, every rank: before any hand-over
        handle = async_save(state_dict, self.path, rank=r, world_size=w,
                            background_staging=self.background_staging,
                            **self._save_kwargs())
        self._staged = (self.path, r, w)
        plan_from = _structural_copy(_shallow_state(state_dict))
        if not self.background_staging:
            return plan_from
        fut = Future()

        def staged():
            try:
                handle.wait_staged()
                fut.set_result(plan_from)
            except BaseException as e:  # noqa: BLE001  (DCP's save raises it)
                fut.set_exception(e)

        threading.Thread(target=staged, name="ckptd-writer-stage", daemon=True).start()
        return fut

    def synchronize_staging(self):
        pass

    def close(self):
        pass

    def _stage_rank(self):
        if self._rank is not None or self._world is not None:
            return int(self._rank or 0), int(self._world or 1)
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(self._group), dist.get_world_size(self._group)
        return 0, 1

    # -- StorageWriter -------------------------------------------------------
    def reset(self, checkpoint_id=None):
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)
        self._save_id = uuid.uuid4().hex

    def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
        # Every rank of DCP's save runs this first, in the same order (its
        # plan step): the one collective, if the cluster is not known yet
        # (after a stage it is; without collectives there is none).
        if kwargs.get("use_collectives", True) and not self._no_dist_rank(kwargs.get("rank")):
            self._find_cluster()

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        from dataclasses import replace
        return [replace(p, storage_data=_RankInfo(i, len(plans))) for i, p in enumerate(plans)]

    def write_data(self, plan, planner):
        info = plan.storage_data
        if not isinstance(info, _RankInfo):
            raise InvalidArgument("ckptd.StorageWriter: the plan lacks the rank its "
                                  "prepare_global_plan assigns (a custom planner dropped "
                                  "SavePlan.storage_data?)")
        results = [WriteResult(index=item.index, size_in_bytes=_item_bytes(item),
                               storage_data=None) for item in plan.items]
        staged, self._staged = self._staged, None
        if staged is not None:
            path, r, w = staged
            if (path, r, w) != (self.path, info.rank, info.world_size):
                self._cancel(path, r, "DCP saves another checkpoint than was staged")
                raise InvalidArgument(
                    f"ckptd.StorageWriter: staged for {path} as rank {r} of {w}, but DCP "
                    f"saves {self.path} as rank {info.rank} of {info.world_size}: give the "
                    f"path (and, with no_dist, rank=0, world_size=1) to ckptd.StorageWriter")
            return _done_future(results)
        leaves = []
        for item in plan.items:
            value = planner.resolve_data(item)
            fqn = item.index.fqn
            if item.type == WriteItemType.BYTE_IO:
                value.seek(0)
                leaves.append(Leaf(fqn, (fqn,), Pickled(value.read()), None, None))
                continue
            chunk = item.tensor_data.chunk
            leaves.append(Leaf(fqn, (fqn,), Shard(value.detach(), tuple(chunk.offsets),
                                                  tuple(item.tensor_data.size)), None, None))
        try:
            async_save(None, self.path, rank=info.rank, world_size=info.world_size,
                       leaves=leaves, **self._save_kwargs())
        except BaseException:
            self._cancel(self.path, info.rank, "a rank's write_data failed")
            raise
        return _done_future(results)

    def finish(self, metadata, results):
        """DCP's coordinator: the daemon's layout into storage_data, the
        pickled Metadata handed to the daemon; returns once committed."""
        rank = 0
        cl = client(self.socket, rank)
        path = self.path
        st = cl.wait_data_durable(path, self.timeout)
        if not st.get("awaiting_metadata"):
            self._raise_final(st)
        layout = cl.layout(path)
        storage = {}
        for e in layout["entries"]:
            offset = None if e["bytes"] else torch.Size(e["offsets"])
            storage[MetadataIndex(e["fqn"], offset)] = _storage_info(e)
        metadata.storage_data = storage
        try:
            cl.commit_metadata(path, pickle.dumps(metadata))
        except BaseException:
            self._cancel(path, rank, "the coordinator's finish failed")
            raise
        st = cl.wait(path, self.timeout)
        if st.get("state") != "COMMITTED":
            self._raise_final(st)

    def storage_meta(self):
        if _StorageMeta is None:  # pragma: no cover
            return None
        return _StorageMeta(checkpoint_id=self.path, save_id=self._save_id or uuid.uuid4().hex)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return isinstance(checkpoint_id, (str, os.PathLike))

    # -- helpers ---------------------------------------------------------------
    def _no_dist_rank(self, dcp_rank):
        """Whether DCP saves this rank alone (no_dist) under an initialised
        process group: its rank differs from the group's (rank 0 cannot be
        told apart: pass cluster=None for a no_dist save there)."""
        if dcp_rank is None or not (dist.is_available() and dist.is_initialized()):
            return False
        return int(dcp_rank) != dist.get_rank(self._group)

    def _find_cluster(self):
        """The cluster of this rank's daemon (module docstring): found once
        ("auto": ckptd.cluster.cached_cluster over the process group);
        None for one daemon, and for a stage naming its own rank/world."""
        if isinstance(self._cluster, str):
            explicit = self._rank is not None or self._world is not None
            self._cluster = None if explicit else cached_cluster(self._group, self.socket)
        return self._cluster

    def _save_kwargs(self):
        """ckptd.async_save's options of every hand-over (stage, write_data)."""
        cluster = self._cluster if isinstance(self._cluster, Cluster) else None
        return dict(job=self.job, overwrite=self.overwrite, keep_last_n=self.keep_last_n,
                    keep_every=self.keep_every, compression=self.compression,
                    socket=self.socket, external_metadata=True,
                    metadata_timeout=self.metadata_timeout, cluster=cluster)

    def _cancel(self, path, rank, reason):
        try:
            client(self.socket, rank).cancel(path, reason)
        except Exception as e:  # noqa: BLE001  (the error at hand matters more)
            log.warning("ckptd.StorageWriter: could not cancel %s (%s): %s", path, reason, e)

    def _raise_final(self, st):
        raise CheckpointFailed(
            f"checkpoint {st.get('checkpoint_id', self.path)} {st.get('state')}: "
            f"{st.get('error')}", code=st.get("error_code") or None)
