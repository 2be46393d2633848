"""Multi-node checkpoints: which ranks save through which node's daemon.

A checkpoint whose ranks run on several nodes is saved by one daemon per
node; the daemons agree through the coordinator (the daemon of rank 0's
node, reached at its peer address). Every rank passes its node's Cluster to
save / async_save (CheckpointManager does it by itself):

  cluster = ckptd.discover_cluster()      # once, at start-up (a collective)
  ckptd.async_save(state, "run1/step_100", cluster=cluster)

discover_cluster is the only collective here and is never on the save path.
"""
import collections
import dataclasses
import numbers
import os
from socket import gethostname

from ._connection import client, default_socket
from .errors import FAILED_PRECONDITION, CkptdError, InvalidArgument


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The nodes of a multi-node checkpoint, as seen from one node.

    coordinator: peer address (host:port) of the daemon on rank 0's node
      (its GetInfo peer_address); required when num_nodes > 1.
    local_ranks: the ranks (of the checkpoint: the `rank` save uses) that
      save through this node's daemon, the same list on each of them; stored
      as a sorted tuple. Required when num_nodes > 1.
    num_nodes: daemons taking part, >= 1 (1: a single-node checkpoint).

    The ranks' membership and range (the caller's rank in local_ranks, all in
    [0, world_size)) are checked by save before anything is sent."""
    coordinator: str
    local_ranks: tuple
    num_nodes: int

    def __post_init__(self):
        if not isinstance(self.coordinator, str):
            raise TypeError(f"Cluster.coordinator must be a str (host:port), not "
                            f"{type(self.coordinator).__name__}")
        if isinstance(self.local_ranks, (str, bytes)):
            raise TypeError("Cluster.local_ranks must be a sequence of ints, not a string")
        try:
            ranks = list(self.local_ranks)
        except TypeError:
            raise TypeError(f"Cluster.local_ranks must be a sequence of ints, not "
                            f"{type(self.local_ranks).__name__}") from None
        for r in ranks:
            if isinstance(r, bool) or not isinstance(r, numbers.Integral):
                raise TypeError(f"Cluster.local_ranks must hold ints, got {r!r}")
        ranks = sorted(int(r) for r in ranks)
        if isinstance(self.num_nodes, bool) or not isinstance(self.num_nodes, numbers.Integral):
            raise TypeError(f"Cluster.num_nodes must be an int, not "
                            f"{type(self.num_nodes).__name__}")
        num_nodes = int(self.num_nodes)
        if num_nodes < 1:
            raise InvalidArgument(f"cluster: num_nodes {num_nodes} must be >= 1")
        if num_nodes > 1 and not self.coordinator:
            raise InvalidArgument(f"cluster: coordinator is empty with num_nodes {num_nodes} "
                                  "(the peer address of rank 0's daemon, host:port)")
        if num_nodes > 1 and not ranks:
            raise InvalidArgument(f"cluster: local_ranks is empty with num_nodes {num_nodes} "
                                  "(the ranks saving through this node's daemon)")
        if ranks and ranks[0] < 0:
            raise InvalidArgument(f"cluster: local rank {ranks[0]} is negative")
        if ranks and ranks[-1] >= 2**31:
            raise InvalidArgument(f"cluster: local rank {ranks[-1]} is too large")
        dups = sorted(r for r, n in collections.Counter(ranks).items() if n > 1)
        if dups:
            raise InvalidArgument(f"cluster: local rank {dups[0]} appears more than once in "
                                  "local_ranks")
        object.__setattr__(self, "local_ranks", tuple(ranks))
        object.__setattr__(self, "num_nodes", num_nodes)


# -- discovery ------------------------------------------------------------------

@dataclasses.dataclass
class _Group:
    """The ranks that reported the same daemon."""
    identity: str
    peer_address: str
    host: str
    socket: str
    ranks: list


def _entry(rank, info, socket_path, error=None):
    """What one rank contributes to the gather: its daemon's identity (the
    peer address, or host:socket:pid for a daemon without peer service),
    its rank, its daemon's peer address, and for messages its host, socket
    and the error that kept it from asking its daemon."""
    host = gethostname()
    peer = (info or {}).get("peer_address") or ""
    identity = peer or f"{host}:{socket_path}:{(info or {}).get('pid', 0)}"
    return {"identity": identity, "rank": int(rank), "peer_address": peer, "host": host,
            "socket": socket_path, "error": error}


def _group_ranks(entries):
    """Groups gathered entries (one per rank, see _entry) by daemon identity.
    Returns the groups ordered by their lowest rank (rank 0's group first),
    each with its ranks sorted. Raises CkptdError if a rank could not ask
    its daemon."""
    failed = [e for e in entries if e.get("error")]
    if failed:
        e = failed[0]
        raise CkptdError(f"discover_cluster: rank {e['rank']} on {e['host']} could not ask its "
                         f"daemon ({e['socket']}): {e['error']}"
                         + (f" (and {len(failed) - 1} more ranks)" if len(failed) > 1 else ""),
                         code=FAILED_PRECONDITION)
    groups = {}
    for e in entries:
        g = groups.get(e["identity"])
        if g is None:
            g = groups[e["identity"]] = _Group(e["identity"], e["peer_address"], e["host"],
                                               e["socket"], [])
        g.ranks.append(int(e["rank"]))
    out = sorted(groups.values(), key=lambda g: min(g.ranks))
    for g in out:
        g.ranks.sort()
    return out


def _cluster_for(entries, rank):
    """The Cluster of `rank` given every rank's entry: None when all ranks
    share one daemon, else the coordinator (rank 0's daemon), this rank's
    group and the number of groups. Raises CkptdError when a daemon of a
    multi-node job has no peer service."""
    groups = _group_ranks(entries)
    if len(groups) <= 1:
        return None
    for g in groups:
        if not g.peer_address:
            raise CkptdError(
                f"daemon on {g.host} has no peer service; set peer_listen in its config "
                f"(ranks {g.ranks} save through it at {g.socket}, and the job spans "
                f"{len(groups)} daemons, which must reach each other)", code=FAILED_PRECONDITION)
    coordinator = groups[0].peer_address  # the group of rank 0 (the lowest rank)
    mine = next((g for g in groups if rank in g.ranks), None)
    if mine is None:
        raise InvalidArgument(f"discover_cluster: rank {rank} is not among the gathered ranks")
    return Cluster(coordinator=coordinator, local_ranks=tuple(mine.ranks),
                   num_nodes=len(groups))


def _gather(entry, process_group):
    """all_gather_object of `entry` over `process_group` (None: the default
    group), on gloo: a default group of another backend (NCCL) gets a
    temporary gloo group for it, so no GPU is involved. Another group is
    used as it is (an NCCL one needs the rank's CUDA device set)."""
    import torch.distributed as dist
    group, temporary = process_group, None
    is_default = process_group is None or process_group == dist.group.WORLD
    if is_default and dist.get_backend(process_group) != "gloo":
        group = temporary = dist.new_group(backend="gloo")
    try:
        out = [None] * dist.get_world_size(group)
        dist.all_gather_object(out, entry, group=group)
        return out
    finally:
        if temporary is not None:
            dist.destroy_process_group(temporary)


def discover_cluster(process_group=None, socket=None):
    """Finds out which ranks of the job share a node's daemon — a one-time
    set-up collective (every rank of `process_group`, default: the default
    group, must call it; never needed on the save path).

    Each rank asks its daemon (`socket`, default $CKPTD_SOCKET, else
    /run/ckptd/ckptd.sock) for its peer address and pid and the ranks
    all_gather them. Returns None when torch.distributed is not initialised,
    the group has one rank, or every rank uses the same daemon (a
    single-node checkpoint); else this rank's Cluster(coordinator = peer
    address of rank 0's daemon, local_ranks = the ranks sharing this rank's
    daemon, num_nodes = the number of daemons). Ranks are those of
    `process_group`, as save uses them. Raises CkptdError on every rank when
    some rank could not reach its daemon, or when the job spans several
    daemons and one has no peer service (peer_listen unset)."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return None
    world = dist.get_world_size(process_group)
    rank = dist.get_rank(process_group)
    if rank < 0:
        raise InvalidArgument("discover_cluster: this process is not a member of the "
                              "process group")
    if world <= 1:
        return None
    path = os.fspath(socket) if socket is not None else default_socket()
    try:
        info, error = client(path, rank).info(), None
    except Exception as e:  # noqa: BLE001  (reported on every rank after the gather)
        info, error = None, str(e)
    entries = _gather(_entry(rank, info, os.path.realpath(path), error), process_group)
    return _cluster_for(entries, rank)


def cluster_from_env(environ=None):
    """The node's Cluster from the launcher's environment, without any
    collective: torchrun (or any launcher that sets the same variables) with
    the same number of ranks on every node, ranks numbered node by node.

      CKPTD_COORDINATOR   peer address of rank 0's daemon; default
                          MASTER_ADDR:CKPTD_PEER_PORT (port default 7070),
                          i.e. the daemon on the rendezvous host
      RANK, WORLD_SIZE, LOCAL_WORLD_SIZE   as torchrun sets them

    Returns None for a single-node job (LOCAL_WORLD_SIZE == WORLD_SIZE)."""
    env = os.environ if environ is None else environ

    def need_int(name):
        value = env.get(name)
        if value is None:
            raise InvalidArgument(f"cluster_from_env: {name} is not set (run under torchrun, "
                                  "or use ckptd.discover_cluster())")
        try:
            return int(value)
        except ValueError:
            raise InvalidArgument(f"cluster_from_env: {name}={value!r} is not an "
                                  "integer") from None

    rank, world, local = need_int("RANK"), need_int("WORLD_SIZE"), need_int("LOCAL_WORLD_SIZE")
    if local < 1 or world < 1 or world % local != 0 or not 0 <= rank < world:
        raise InvalidArgument(f"cluster_from_env: RANK={rank}, WORLD_SIZE={world}, "
                              f"LOCAL_WORLD_SIZE={local} do not describe equal nodes")
    num_nodes = world // local
    if num_nodes == 1:
        return None
    coordinator = env.get("CKPTD_COORDINATOR", "")
    if not coordinator:
        host = env.get("MASTER_ADDR", "")
        if not host:
            raise InvalidArgument("cluster_from_env: set CKPTD_COORDINATOR (host:port of "
                                  "rank 0's daemon) or MASTER_ADDR")
        coordinator = f"{host}:{env.get('CKPTD_PEER_PORT', '7070')}"
    first = rank // local * local
    return Cluster(coordinator, tuple(range(first, first + local)), num_nodes)


# -- discovery once per job -----------------------------------------------------

_discovered = {}  # (process group key, daemon socket) -> Cluster or None


def _group_key(process_group):
    import torch.distributed as dist
    if process_group is None or process_group == dist.group.WORLD:
        return ("default", id(dist.group.WORLD))
    return ("group", id(process_group))


def cached_cluster(process_group=None, socket=None):
    """This rank's Cluster over `process_group` (None: the default group),
    discovered once per process group and daemon socket (the first call is
    ckptd.discover_cluster, a collective every rank of the group must make
    at the same point; later calls return its result without one). None
    when torch.distributed is not initialised, the group has one rank, or
    every rank uses the same daemon. What ckptd.StorageWriter and
    StorageReader use to find the cluster by themselves."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return None
    if dist.get_world_size(process_group) <= 1:
        return None
    path = os.path.realpath(os.fspath(socket) if socket is not None else default_socket())
    key = (_group_key(process_group), path)
    if key not in _discovered:
        _discovered[key] = discover_cluster(process_group, path)
    return _discovered[key]
