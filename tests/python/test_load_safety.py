"""ckptd.load checks payload CRC-32s and decodes
bytes items with a restricted unpickler (weights_only=True by default)."""
import collections
import io
import os
import pickle

import numpy as np
import pytest

import pyclient_util

pyclient_util.setup_import()
torch = pytest.importorskip("torch") if os.environ.get("CKPTD_REQUIRE_TORCH") != "1" else \
    __import__("torch")
pytestmark = pytest.mark.skipif(pyclient_util.asan_build(), reason=pyclient_util.ASAN_SKIP_REASON)

import ckptd  # noqa: E402
import dcp_shim  # noqa: E402

dcp = dcp_shim.install()


class _Saved:
    def __init__(self, checkpoint_id):
        self.checkpoint_id = str(checkpoint_id)
        self.state = "COMMITTED"


def dcp_save(state_dict, directory):
    """What stock dcp.save writes for one rank, without a daemon: the state
    dict flattened as DCP does (ckptd.flatten, Stateful objects replaced by
    their state_dict()), every item a torch.save archive in __0_0.distcp,
    and a pickled .metadata with planner_data."""
    directory.mkdir(parents=True)
    work = {k: v.state_dict() if ckptd.is_stateful(v) else v for k, v in state_dict.items()}
    sdm, storage, planner = {}, {}, {}
    with open(directory / "__0_0.distcp", "wb") as f:
        for leaf in ckptd.flatten(work):
            bio = io.BytesIO()
            value = leaf.value
            if torch.is_tensor(value):
                value = value.detach().clone()
                props = dcp.TensorProperties(dtype=value.dtype, layout=torch.strided,
                                             requires_grad=False,
                                             memory_format=torch.contiguous_format,
                                             pin_memory=False)
                size = torch.Size(value.shape)
                sdm[leaf.fqn] = dcp.TensorStorageMetadata(
                    props, size, [dcp.ChunkStorageMetadata(torch.Size([0] * len(size)), size)])
                index = dcp.MetadataIndex(leaf.fqn, torch.Size([0] * len(size)), 0)
            else:
                sdm[leaf.fqn] = dcp.BytesStorageMetadata()
                index = dcp.MetadataIndex(leaf.fqn)
            torch.save(value, bio)
            storage[index] = dcp._StorageInfo("__0_0.distcp", f.tell(), len(bio.getvalue()))
            f.write(bio.getvalue())
            planner[leaf.fqn] = leaf.path
    md = dcp.Metadata(sdm, planner_data=planner, storage_data=storage)
    with open(directory / ".metadata", "wb") as f:
        pickle.dump(md, f)
    return _Saved(directory)


class OpenFile:
    """Unpickling it creates `path` (open(path, 'w'))."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


class System:
    """Unpickling it runs `touch path` (os.system)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


@pytest.mark.parametrize("payload", [OpenFile, System])
def test_malicious_bytes_item_is_refused_and_runs_nothing(tmp_path, ckptctl, payload):
    marker = tmp_path / "pwned"
    st = dcp_save({"w": torch.ones(4), "loader": {"state": payload(marker)}}, tmp_path / "evil")
    assert st.state == "COMMITTED" and not marker.exists()
    dest = {"w": torch.zeros(4), "loader": {"state": None}}
    with pytest.raises(ckptd.UnsafeCheckpointError) as e:
        ckptd.load(dest, st.checkpoint_id)
    msg = str(e.value)
    assert "weights_only=False" in msg and "loader.state" in msg, msg
    assert e.value.global_name in ("io.open", "builtins.open", "posix.system", "os.system")
    assert e.value.global_name in msg
    assert e.value.code_name == "FAILED_PRECONDITION"
    assert not marker.exists()
    # ckptctl verify flags it (exit 1), naming the item and the global;
    # --allow-unsafe-globals makes it a note.
    proc = ckptctl("verify", st.checkpoint_id, check=False)
    assert proc.returncode == 1, proc.stderr
    assert "'loader.state'" in proc.stderr and e.value.global_name in proc.stderr, proc.stderr
    assert ckptctl("verify", st.checkpoint_id, "--allow-unsafe-globals").returncode == 0
    assert not marker.exists()
    # Explicit opt-in: the full unpickler runs it (which proves the refusal
    # above mattered).
    ckptd.load(dest, st.checkpoint_id, weights_only=False)
    assert marker.exists()
    if hasattr(dest["loader"]["state"], "close"):
        dest["loader"]["state"].close()


def _flip(path, pos, bit):
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([b ^ (1 << bit)]))


def test_flipped_bits_are_data_loss_not_values(tmp_path, ckptctl):
    ref = torch.arange(4096.0)
    st = dcp_save({"w": ref, "step": 7}, tmp_path / "flip")
    name = next(p for p in os.listdir(st.checkpoint_id) if p.endswith(".distcp"))
    path = os.path.join(st.checkpoint_id, name)
    start = open(path, "rb").read().find(ref.numpy().tobytes())
    assert start > 0
    for pos in (0, 1001, 4 * 4096 - 1):
        _flip(path, start + pos, pos % 8)
        dest = {"w": torch.zeros(4096), "step": 0}
        with pytest.raises(ckptd.DataLoss) as e:
            ckptd.load(dest, st.checkpoint_id)
        assert e.value.code_name == "DATA_LOSS"
        assert name in e.value.message and "'w'" in e.value.message
        assert f"file offset {start}" in e.value.message, e.value.message
        # The opt-out returns the damaged values.
        ckptd.load(dest, st.checkpoint_id, verify_crc=False)
        assert not torch.equal(dest["w"], ref)
        # convert refuses too, and leaves nothing behind; --no-verify-crc converts.
        out = tmp_path / "out.pt"
        proc = ckptctl("convert", st.checkpoint_id, out, check=False)
        assert proc.returncode == 1 and "CRC-32 mismatch" in proc.stderr, proc.stderr
        assert name in proc.stderr and not out.exists()
        ckptctl("convert", st.checkpoint_id, out, "--no-verify-crc", "--overwrite")
        out.unlink()
        _flip(path, start + pos, pos % 8)
    dest = {"w": torch.zeros(4096), "step": 0}
    ckptd.load(dest, st.checkpoint_id)
    assert torch.equal(dest["w"], ref) and dest["step"] == 7


def test_optimizer_scheduler_and_loader_state_round_trip_restricted(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    optim = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.8, 0.9), amsgrad=True)
    sched = torch.optim.lr_scheduler.StepLR(optim, step_size=2, gamma=0.5)
    for _ in range(3):
        model(torch.randn(5, 8)).sum().backward()
        optim.step()
        sched.step()
    rng = np.random.RandomState(3)
    loader = {"epoch": 2, "seen": {1, 5, 9}, "frozen": frozenset({"a"}), "z": 1 + 2j,
              "order": collections.OrderedDict(b=1, a=2), "np_state": rng.get_state(),
              "np_scalar": np.float32(0.25), "np_array": np.arange(6, dtype=np.int64),
              "blob": b"\x00\x01", "dtype": torch.bfloat16, "size": torch.Size([2, 3]),
              "gen": torch.Generator().manual_seed(5).get_state(),
              "counts": collections.Counter("abca"),
              "dd": collections.defaultdict(list, {1: [2]})}
    # A tuple is stored whole (one bytes item), so the containers keep their types.
    state = {"model": model, "optim": optim, "sched": sched, "loader": (loader,)}
    st = dcp_save(state, tmp_path / "opt")

    model2 = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    optim2 = torch.optim.Adam(model2.parameters(), lr=1.0)
    sched2 = torch.optim.lr_scheduler.StepLR(optim2, step_size=7, gamma=0.1)
    state2 = {"model": model2, "optim": optim2, "sched": sched2, "loader": None}
    ckptd.load(state2, st.checkpoint_id)  # weights_only=True, verify_crc=True
    assert optim2.state_dict()["param_groups"] == optim.state_dict()["param_groups"]
    for pid, s in optim.state_dict()["state"].items():
        for k, v in s.items():
            w = optim2.state_dict()["state"][pid][k]
            assert torch.equal(v, w) if torch.is_tensor(v) else v == w, (pid, k)
    assert sched2.state_dict() == sched.state_dict()
    got = state2["loader"][0]
    for k, v in loader.items():
        g = got[k]
        if k == "np_state":
            assert g[0] == v[0] and np.array_equal(g[1], v[1]) and g[2:] == v[2:]
        elif k == "np_array":
            assert np.array_equal(g, v) and g.dtype == v.dtype
        elif torch.is_tensor(v):
            assert torch.equal(g, v)
        else:
            assert g == v and type(g) is type(v), k
