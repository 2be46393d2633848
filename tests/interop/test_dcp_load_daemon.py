"""Stock torch.distributed.checkpoint (torch >= 2.4) reads a checkpoint that
a running ckptd daemon wrote from real trainer processes: sharded (rows
and columns) and replicated tensors of several dtypes, per-rank and
replicated bytes items, 1, 2 and 4 ranks, and a rank streamed through a
small staging budget.

  * dcp.load without a process group into preallocated tensors (filled with
    garbage first), values compared with the trainer's formula;
  * _load_state_dict (every 2.x version fills the dict it is given) for the
    bytes items' values.

Skips with the reason where torch >= 2.4 is not importable (Debian's torch
1.13); tests/interop/run_on_gpu_machine.sh runs it on the GPU machine.
"""
import pathlib
import sys

import pytest

import interop_common as ic

torch, _REASON = ic.torch_status()
pytestmark = pytest.mark.skipif(torch is None, reason=_REASON or "")
if torch is not None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
import daemon_util as du  # noqa: E402


@pytest.fixture
def daemon(tmp_path):
    d = du.Daemon(tmp_path / "d", staging_budget="8M")
    d.start()
    yield d
    d.close()


def request(spec):
    sd = {}
    for t in spec.tensor_specs():
        sd[t.fqn] = torch.full(t.shape, 7, dtype=getattr(torch, t.dtype))
    for o in spec.object_specs():
        sd[o.fqn] = "<placeholder>"
    return sd


@pytest.mark.parametrize("world,flags", [
    (1, dict(mb=1)),
    (2, dict(mb=1, dtype="bfloat16,float16,int64", layout="cols")),
    (4, dict(mb=2, dtype="float32,bfloat16")),   # 8 MiB: streams through the 8 MiB budget
])
def test_stock_dcp_load_reads_a_daemon_checkpoint(daemon, world, flags):
    du.assert_committed(du.run_ranks(daemon, world, "interop/ck", **flags), daemon)
    ckdir = daemon.root / "interop" / "ck"
    spec = du.TrainerSpec.of(world, **flags)

    sd = request(spec)
    dcp.load(sd, checkpoint_id=str(ckdir))
    for t in spec.tensor_specs():
        want = du.expected_box(torch, t.dtype, t.shape, t.seed)
        assert torch.equal(sd[t.fqn], want), t.fqn

    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
    sd = request(spec)
    _load_state_dict(sd, storage_reader=FileSystemReader(str(ckdir)), no_dist=True)
    for o in spec.object_specs():
        assert sd[o.fqn] == o.value, o.fqn


def test_stock_dcp_load_reads_a_multinode_checkpoint(tmp_path):
    # A multi-node save: 2 daemons ("nodes", peer services on loopback with
    # a token) write one checkpoint of 4 ranks into a shared root; the first
    # coordinates and writes .metadata. Stock dcp.load reads it.
    import os
    shared = tmp_path / "shared"
    daemons = []
    try:
        for n in range(2):
            token = tmp_path / f"token{n}"
            token.write_text("interop-multinode-token-0123456\n")
            os.chmod(token, 0o600)
            d = du.Daemon(tmp_path / f"node{n}", peer_listen="127.0.0.1:0",
                          peer_advertise="127.0.0.1:0", peer_token_file=token)
            d.root = shared
            d.start()
            daemons.append(d)
        flags = dict(mb=1, dtype="float32,bfloat16")
        trainers = [daemons[r // 2].trainer(
            "interop/mn", r, 4, coordinator=daemons[0].address,
            local_ranks=f"{r // 2 * 2},{r // 2 * 2 + 1}", num_nodes=2, **flags)
            for r in range(4)]
        for t in trainers:
            t.wait(120)
        du.assert_committed([t.result() for t in trainers], daemons[0])
        spec = du.TrainerSpec.of(4, **flags)
        sd = request(spec)
        dcp.load(sd, checkpoint_id=str(shared / "interop" / "mn"))
        for t in spec.tensor_specs():
            assert torch.equal(sd[t.fqn], du.expected_box(torch, t.dtype, t.shape, t.seed)), t.fqn
    finally:
        for d in daemons:
            d.close()
