"""ckptd.StorageReader: torch.distributed.checkpoint's StorageReader
interface over ckptd's reader, for trainers that keep their dcp.load calls:

    dcp.load(state_dict, storage_reader=ckptd.StorageReader(path))

What changes against stock FileSystemReader:
  * `.metadata` is decoded by ckptd's C++ decoder, never unpickled: a
    checkpoint's metadata cannot run code (stock pickle.loads it), and a
    multi-million-chunk `.metadata` is decoded in seconds;
  * tensor reads are planned and resharded in C++ (only the byte ranges a
    destination needs, straight into its memory, CRC-32s checked; CUDA
    destinations through pinned bounce buffers);
  * bytes items are checked by the restricted unpickler first (the planner
    then torch.loads them, as stock does): a bytes item naming a global
    outside the allowlist raises UnsafeCheckpointError before anything is
    imported, unless weights_only=False;
  * the formats ckptd reads: zstd-compressed payloads and SAFETENSORS-format
    data files among them.
  * through the node's daemon when one answers (as ckptd.load): the
    node's ranks form one restore group and each byte range is read once.
Works with a process group and without one (no_dist), torch >= 2.4.
"""
import io
import os
from types import SimpleNamespace

import torch
from torch.distributed.checkpoint import StorageReader as _DcpStorageReader
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata,
                                                   Metadata, TensorProperties,
                                                   TensorStorageMetadata)
from torch.distributed.checkpoint.planner import LoadItemType

from . import _bounce, _native, _restore, _safe_pickle
from ._load import _copy_back, _Pending
from ._tensors import dtype_from_name, dtype_name
from .errors import CkptdError


def _metadata_from_json(md):
    """torch's Metadata for ckptd's metadata dict (chunk lists included)."""
    sdm = {}
    for e in md["entries"]:
        if e["type"] == "bytes":
            sdm[e["fqn"]] = BytesStorageMetadata()
            continue
        chunks = [ChunkStorageMetadata(offsets=torch.Size(c["offsets"]),
                                       sizes=torch.Size(c["sizes"])) for c in e["chunks"]]
        sdm[e["fqn"]] = TensorStorageMetadata(
            properties=TensorProperties(dtype=dtype_from_name(e["dtype"])),
            size=torch.Size(e["size"]), chunks=chunks)
    planner_data = {fqn: tuple(path) for fqn, path in (md.get("planner_data") or {}).items()}
    return Metadata(state_dict_metadata=sdm, planner_data=planner_data or None,
                    storage_data={})


class StorageReader(_DcpStorageReader):
    """A DCP StorageReader reading a checkpoint directory with ckptd's
    reader. threads: reader threads per read_data call (default 8).
    verify_crc: check payload CRC-32s (default). weights_only: bytes items
    must pass the restricted unpickler (default; False trusts them, as
    stock DCP does). via_daemon, socket, local_rank, local_world_size: as
    for ckptd.load (None: through the node's daemon when one answers and
    serves restores, each byte range read once for the node's ranks; else
    directly). Ranks on several nodes, each talking to its own node's
    daemon, need nothing more: when local_rank / local_world_size are not
    given, the reader finds the cluster from the process group
    (`process_group`, default: the default group; ckptd.discover_cluster
    once per group and socket, in set_up_storage_reader, which every rank
    of dcp.load runs in the same order) and its node's restore group is the
    ranks sharing its daemon (this rank's index in Cluster.local_ranks,
    their count)."""

    def __init__(self, path, *, threads=None, verify_crc=True, weights_only=True,
                 via_daemon=None, socket=None, local_rank=None, local_world_size=None,
                 process_group=None):
        super().__init__()
        self.path = str(path)
        self.threads = threads
        self.verify_crc = verify_crc
        self.weights_only = weights_only
        self.via_daemon = via_daemon
        self.socket = socket
        self.local_rank = local_rank
        self.local_world_size = local_world_size
        self._group = process_group
        self._metadata = None

    # -- the StorageReader interface ------------------------------------------

    def reset(self, checkpoint_id=None):
        if checkpoint_id is not None:
            self.path = str(checkpoint_id)
        self._metadata = None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        try:
            return os.path.isfile(os.path.join(str(checkpoint_id), ".metadata"))
        except (TypeError, ValueError):
            return False

    def read_metadata(self, *args, **kwargs):
        with _native.Reader(self._dir(), 1, verify_crc=self.verify_crc) as reader:
            md = reader.metadata(chunks=True)
        self._metadata = _metadata_from_json(md)
        return self._metadata

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        self._metadata = metadata
        if self.local_rank is None and self.local_world_size is None and \
                self.via_daemon is not False and kwargs.get("use_collectives", True):
            self._node_group_from_cluster()

    def _node_group_from_cluster(self):
        """local_rank / local_world_size from the discovered cluster (a
        multi-node job): the ranks sharing this rank's daemon."""
        import torch.distributed as dist
        from .cluster import cached_cluster
        try:
            cluster = cached_cluster(self._group, self.socket)
        except CkptdError:
            # Some rank's daemon did not answer (discover_cluster raises on
            # every rank alike, so all take this path): with via_daemon
            # None the ranks read as without a cluster, as documented;
            # via_daemon=True asked for the daemons.
            if self.via_daemon:
                raise
            return
        if cluster is None:
            return
        rank = dist.get_rank(self._group)
        self.local_rank = cluster.local_ranks.index(rank)
        self.local_world_size = len(cluster.local_ranks)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_group"] = None  # a process group cannot be pickled
        return state

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def read_data(self, plan, planner):
        directory = self._dir()
        seq = _restore.next_load_number()
        daemon = _restore.open_restore(directory, self.socket, self.via_daemon)
        try:
            pending, tensors, objects = self._plan(plan, planner, bounce=daemon is None)
        except BaseException:
            if daemon is not None:
                daemon.leave(seq, self.local_rank, self.local_world_size)
            raise
        if daemon is None:
            with _native.Reader(directory, self.threads or 8,
                                verify_crc=self.verify_crc) as reader:
                reader.read(pending.requests)
                _copy_back(pending)
                if pending.device_pieces:
                    _bounce.restore_device_pieces(reader, pending.device_pieces)
                raws = [reader.read_bytes(req.storage_index.fqn) for req in objects]
        else:
            # Through the node's daemon: the n-th loads of the node's ranks
            # form one restore group, each byte range read once for all.
            nbytes = {e["fqn"]: e.get("nbytes", 0) for e in daemon.index["entries"]}
            _, raws = daemon.run(pending.requests,
                                 [(req.storage_index.fqn, nbytes.get(req.storage_index.fqn, 0))
                                  for req in objects],
                                 seq, self.verify_crc, self.local_rank, self.local_world_size)
            _copy_back(pending)
        for req, dest in tensors:
            planner.commit_tensor(req, dest)
        for req, raw in zip(objects, raws):
            if self.weights_only:
                # Every global the pickle names is checked before the planner
                # unpickles it (UnsafeCheckpointError names the first other).
                _safe_pickle.torch_load_restricted(raw, req.storage_index.fqn)
            planner.load_bytes(req, io.BytesIO(raw))
        fut = torch.futures.Future()
        fut.set_result(None)
        return fut

    def _plan(self, plan, planner, bounce):
        """(read requests, [(ReadItem, destination)], [bytes ReadItem])."""
        pending = _Pending(bounce=bounce and _bounce.use_bounce())
        tensors, objects = [], []
        for req in plan.items:
            fqn = req.storage_index.fqn
            if req.type == LoadItemType.BYTE_IO:
                objects.append(req)
                continue
            saved = self._metadata.state_dict_metadata[fqn]
            dest = planner.resolve_tensor(req).detach()
            # The box in global coordinates: the saved chunk's offsets plus
            # the request's offsets inside it.
            chunk = req.storage_index.offset or ()
            offsets = [int(c) + int(o) for c, o in zip(chunk, req.storage_offsets)]
            pending.add(fqn, {"dtype": dtype_name(saved.properties.dtype)},
                        SimpleNamespace(local=dest, offsets=offsets))
            tensors.append((req, dest))
        return pending, tensors, objects

    # -- internals -------------------------------------------------------------

    def _dir(self):
        # Relative paths are relative to the working directory, as for
        # FileSystemReader (not to the daemon's roots).
        return os.path.abspath(self.path)
