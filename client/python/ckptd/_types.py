"""The plain records the API hands back: CheckpointStatus (a checkpoint as
the daemon reports it) and SaveStats (what a save cost the calling rank).
No behaviour beyond reading them; no dependency on the rest of the package."""
import dataclasses

FINAL_STATES = ("COMMITTED", "FAILED", "CANCELLED")


@dataclasses.dataclass
class CheckpointStatus:
    """A checkpoint as the daemon reports it."""
    checkpoint_id: str = ""
    job: str = ""
    state: str = ""
    world_size: int = 0
    ranks_staged: int = 0
    total_bytes: int = 0
    staged_bytes: int = 0
    written_bytes: int = 0
    file_bytes: int = 0
    items: int = 0
    files: int = 0
    error: str = ""
    error_code: int = 0
    created_unix_ms: int = 0
    staged_unix_ms: int = 0
    finished_unix_ms: int = 0
    # Multi-node checkpoints (num_nodes > 1): the byte counts and
    # ranks_staged above are then global (as of this node's last contact with
    # the coordinator), local_* this node's.
    num_nodes: int = 1             # 1 (or 0 from an older daemon): single node
    coordinator: str = ""          # peer address; empty on the coordinator
    is_coordinator: bool = False
    nodes_planned: int = 0
    nodes_prepared: int = 0        # data durable on their node
    local_ranks: int = 0           # ranks of the checkpoint on this node (a count)
    local_total_bytes: int = 0
    local_written_bytes: int = 0
    awaiting_metadata: bool = False  # ckptd.StorageWriter: data durable, .metadata awaited
    # Bytes of the checkpoint this node's memory tier holds (memory_tier_bytes).
    memory_tier_bytes: int = 0

    @classmethod
    def from_json(cls, d):
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @property
    def final(self):
        return self.state in FINAL_STATES

    @property
    def progress(self):
        """Fraction of the data files written, 0.0 .. 1.0."""
        if self.state == "COMMITTED":
            return 1.0
        total = self.file_bytes or self.total_bytes
        return min(1.0, self.written_bytes / total) if total else 0.0


@dataclasses.dataclass
class SaveStats:
    """What a save cost the calling rank."""
    stall_seconds: float   # the async_save call: flatten (+ copy + staging unless background)
    copy_seconds: float    # copying into shared memory (native, GIL released)
    bytes: int             # data bytes of this rank
    batches: int           # Save RPCs (> 1: streamed through the arena)
    items: int
    staging_seconds: float = 0.0  # async_save start -> the daemon staged the rank
    # The GPU path (see docs/gpu.md): CUDA chunks handed to the daemon
    # through CUDA IPC (the daemon copied them D2H itself), their bytes and
    # the distinct allocations (IPC handles) named; CUDA chunks that took the
    # client's host path instead, and why.
    ipc_items: int = 0
    ipc_bytes: int = 0
    ipc_allocations: int = 0
    cuda_host_items: int = 0
    cuda_fallback: str = ""
    # device_snapshot=True: whether the snapshot was taken (False: fell back
    # to the normal mode, reason in cuda_fallback) and its GPU clone time.
    device_snapshot: bool = False
    snapshot_seconds: float = 0.0
