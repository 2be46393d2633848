"""The Python package (client/python/ckptd) in one process against a real
daemon, with Debian's torch 1.13 as the reference: DCP 2.4+ flattening,
save → load into freshly built modules and optimizers, every payload
torch.load-able, dtypes and layouts, resharding through ckptd.Shard,
async_save without tearing, CheckpointManager, and errors carrying the
daemon's message. Multi-process (gloo) runs are in test_pyclient_dist.py."""
import ctypes
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import daemon_util as du
import pyclient_util

pyclient_util.setup_import()
torch = pytest.importorskip("torch") if os.environ.get("CKPTD_REQUIRE_TORCH") != "1" else \
    __import__("torch")
pytestmark = pytest.mark.skipif(pyclient_util.asan_build(), reason=pyclient_util.ASAN_SKIP_REASON)
import ckptd  # noqa: E402


@pytest.fixture
def daemon(make_daemon):
    d = make_daemon()
    yield d
    ckptd.close_clients()


def sock(d):
    return str(d.socket)


# -- flattening ---------------------------------------------------------------

def test_flatten_matches_dcp_2_4_rules():
    t = torch.zeros(2)
    sd = {
        "model": {"w": t, "layers": [{"a": t}, {"a": t}]},
        "ints": [1, 2, 3],                  # list without tensors: a leaf
        "tensors": [t, t],                  # list with tensors: descended
        "tup": (t, 1),                      # tuples are always leaves
        "nested": [[1, 2], [t]],            # descended because of the inner list with a tensor
        "empty": {},                        # vanishes
        "opt": {"lr": 0.1, "state": {0: {"step": t}}},
        7: "seven",
    }
    flat, mappings = ckptd.flatten_state_dict(sd)
    assert list(flat) == ["model.w", "model.layers.0.a", "model.layers.1.a", "ints",
                          "tensors.0", "tensors.1", "tup", "nested.0", "nested.1.0", "opt.lr",
                          "opt.state.0.step", "7"]
    assert mappings["model.layers.1.a"] == ("model", "layers", 1, "a")
    assert mappings["nested.1.0"] == ("nested", 1, 0)
    assert mappings["opt.state.0.step"] == ("opt", "state", "0", "step")
    assert mappings["7"] == ("7",)
    assert flat["tup"] == (t, 1) and flat["ints"] == [1, 2, 3]
    with pytest.raises(ValueError, match="duplicated flatten key a.b"):
        ckptd.flatten_state_dict({"a": {"b": 1}, "a.b": 2})


# -- save and load ------------------------------------------------------------

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.fc1 = torch.nn.Linear(16, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.norm(self.fc1(self.emb(x).mean(1)))))


def train(model, optim, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randint(0, 50, (8, 5), generator=g)
        y = torch.randint(0, 4, (8,), generator=g)
        optim.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optim.step()


def fresh(seed):
    torch.manual_seed(seed)
    m = Net()
    return m, torch.optim.Adam(m.parameters(), lr=1e-2, weight_decay=0.01)


def assert_same_training_state(m1, o1, m2, o2):
    for (k, a), (_, b) in zip(m1.state_dict().items(), m2.state_dict().items()):
        assert torch.equal(a, b), k
    s1, s2 = o1.state_dict(), o2.state_dict()
    assert s1["param_groups"] == s2["param_groups"]
    assert s1["state"].keys() == s2["state"].keys()
    for pid in s1["state"]:
        for name, v in s1["state"][pid].items():
            w = s2["state"][pid][name]
            assert torch.equal(v, w) if torch.is_tensor(v) else v == w, (pid, name)


def test_model_and_adam_round_trip_into_fresh_objects(daemon, tmp_path, ckptctl):
    model, optim = fresh(0)
    sched = torch.optim.lr_scheduler.StepLR(optim, step_size=2, gamma=0.5)
    for _ in range(3):
        train(model, optim, 2, seed=1)
        sched.step()
    state = {"model": model, "optim": optim, "sched": sched, "step": 6,
             "extra": {"tokens_seen": 12345, "name": "run1", "tags": ("a", "b"), "none": None}}
    st = ckptd.save(state, "run/step_6", socket=sock(daemon))
    assert st.state == "COMMITTED" and st.progress == 1.0
    assert st.checkpoint_id == str(daemon.root / "run" / "step_6")

    model2, optim2 = fresh(99)                    # different init, empty Adam state
    sched2 = torch.optim.lr_scheduler.StepLR(optim2, step_size=2, gamma=0.5)
    assert not optim2.state_dict()["state"]
    state2 = {"model": model2, "optim": optim2, "sched": sched2, "step": 0,
              "extra": {"tokens_seen": 0, "name": "", "tags": (), "none": 1}}
    ckptd.load(state2, st.checkpoint_id)
    assert_same_training_state(model, optim, model2, optim2)
    assert sched2.state_dict() == sched.state_dict()
    assert state2["step"] == 6
    assert state2["extra"] == {"tokens_seen": 12345, "name": "run1", "tags": ("a", "b"),
                               "none": None}
    # Identical from here on: the same next steps give the same parameters.
    train(model, optim, 2, seed=7)
    train(model2, optim2, 2, seed=7)
    assert_same_training_state(model, optim, model2, optim2)
    # Relative ids resolve against the daemon's root, as for save.
    model3, optim3 = fresh(5)
    ckptd.load({"model": model3, "optim": optim3}, "run/step_6", socket=sock(daemon))
    # Every payload is a torch.save archive torch 1.13 loads, and the whole
    # checkpoint converts to one torch.save file with the nested structure.
    ckptctl("verify", st.checkpoint_id)
    out = tmp_path / "all.pt"
    ckptctl("convert", st.checkpoint_id, out)
    whole = torch.load(out)
    assert whole["step"] == 6
    assert torch.equal(whole["model"]["fc1.weight"], model3.state_dict()["fc1.weight"])
    assert whole["optim"]["param_groups"][0]["lr"] == optim3.param_groups[0]["lr"]


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]


def values(dtype, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-100 if dtype != torch.uint8 else 0, 100, shape, generator=g).to(dtype)


def test_dtypes_layouts_and_payloads(daemon, tmp_path, ckptctl):
    src = {f"t_{str(dt)[6:]}": values(dt, (5, 7), i) for i, dt in enumerate(DTYPES)}
    base = values(torch.float32, (6, 8), 50)
    src.update({
        "scalar": torch.tensor(3.5), "empty": torch.zeros(0, 4), "transposed": base.t(),
        "sliced": base[1:5, ::2], "conj": values(torch.complex64, (3,), 9).conj(),
        "expanded": torch.arange(4.0).expand(3, 4),
    })
    expected = {k: v.resolve_conj().clone() for k, v in src.items()}
    st = ckptd.save({"m": src}, str(daemon.root / "dtypes"), socket=sock(daemon))
    dest = {"m": {k: torch.full_like(v.resolve_conj(), 0) if v.numel() else torch.empty_like(v)
                  for k, v in expected.items()}}
    ckptd.load(dest, st.checkpoint_id)
    for k, v in expected.items():
        assert dest["m"][k].dtype == v.dtype and torch.equal(dest["m"][k], v), k
    # A destination of another dtype or layout is converted like dcp.load does.
    d2 = {"m": {"t_float32": torch.zeros(7, 5, dtype=torch.float64).t(),
                "t_int64": torch.zeros(5, 7, dtype=torch.float32)}}
    ckptd.load(d2, st.checkpoint_id, strict=False)
    assert torch.equal(d2["m"]["t_float32"], expected["t_float32"].double())
    assert torch.equal(d2["m"]["t_int64"], expected["t_int64"].float())
    out = tmp_path / "all.pt"
    ckptctl("convert", st.checkpoint_id, out)
    whole = torch.load(out)["m"]
    for k, v in expected.items():
        assert torch.equal(whole[k], v), k


def test_shards_saved_by_four_ranks_load_as_any_sharding(daemon):
    full = values(torch.float32, (10, 6), 3)
    bias = values(torch.bfloat16, (6,), 4)
    bounds = [0, 3, 5, 8, 10]
    handles = []
    for r in range(4):  # four ranks of one checkpoint, from one process
        a, b = bounds[r], bounds[r + 1]
        sd = {"w": ckptd.Shard(full[a:b].clone(), (a, 0), (10, 6)), "bias": bias.clone(),
              "rank_note": f"rank {r}"}
        handles.append(ckptd.async_save(sd, "sharded", rank=r, world_size=4,
                                        socket=sock(daemon)))
    st = handles[-1].result(timeout=60)
    assert all(h.result().state == "COMMITTED" for h in handles)
    # Into 3 column shards, a plain full tensor, and a single odd box.
    cols = [0, 2, 3, 6]
    for r in range(3):
        a, b = cols[r], cols[r + 1]
        dest = {"w": ckptd.Shard(torch.zeros(10, b - a), (0, a), (10, 6)),
                "bias": torch.zeros(6, dtype=torch.bfloat16)}
        ckptd.load(dest, st.checkpoint_id, strict=False)
        assert torch.equal(dest["w"].tensor, full[:, a:b]) and torch.equal(dest["bias"], bias)
    dest = {"w": torch.zeros(10, 6), "rank_note": None}
    ckptd.load(dest, st.checkpoint_id, strict=False)
    assert torch.equal(dest["w"], full) and dest["rank_note"] in {f"rank {r}" for r in range(4)}
    dest = {"w": ckptd.Shard(torch.zeros(4, 3), (2, 1), (10, 6))}
    ckptd.load(dest, st.checkpoint_id, strict=False)
    assert torch.equal(dest["w"].tensor, full[2:6, 1:4])


def test_reader_index_without_per_chunk_objects(daemon, monkeypatch):
    # load asks the native reader for the metadata without chunk lists (a
    # 2 M-chunk checkpoint stays a small dict) and the reader answers "which
    # chunks overlap this box" from its index.
    from ckptd import _native
    full = values(torch.float32, (10, 6), 5)
    bounds = [0, 3, 5, 8, 10]
    handles = [ckptd.async_save({"w": ckptd.Shard(full[a:b].clone(), (a, 0), (10, 6)),
                                 "step": 7},
                                "indexed", rank=r, world_size=4, socket=sock(daemon))
               for r, (a, b) in enumerate(zip(bounds, bounds[1:]))]
    st = handles[-1].result(timeout=60)
    with _native.Reader(st.checkpoint_id) as reader:
        whole = {e["fqn"]: e for e in reader.metadata()["entries"]}
        small = {e["fqn"]: e for e in reader.metadata(chunks=False)["entries"]}
        assert set(whole) == set(small) == {"w", "step"}
        assert "chunks" not in small["w"] and small["w"]["num_chunks"] == 4
        assert small["w"]["size"] == [10, 6] and small["w"]["dtype"] == "float32"
        assert [c["offsets"] for c in whole["w"]["chunks"]] == [[a, 0] for a in bounds[:-1]]
        every = reader.chunks("w")
        assert [(c["offsets"], c["sizes"]) for c in every] == \
            [(c["offsets"], c["sizes"]) for c in whole["w"]["chunks"]]
        assert all(c["file"].endswith(".distcp") and c["length"] > 0 for c in every)
        # rows [4, 6) overlap the chunks at rows 3 and 5; row 9 only the last
        assert [c["offsets"] for c in reader.chunks("w", [4, 0], [2, 6])] == [[3, 0], [5, 0]]
        assert [c["offsets"] for c in reader.chunks("w", [9, 2], [1, 1])] == [[8, 0]]
        assert reader.chunks("w", [0, 0], [0, 6]) == []
        with pytest.raises(ckptd.NotFound):
            reader.chunks("nope")
        with pytest.raises(ckptd.InvalidArgument):
            reader.chunks("step")                 # a bytes item has no chunks
        with pytest.raises(ckptd.InvalidArgument):
            reader.chunks("w", [0], [1])          # wrong rank
        with pytest.raises(ckptd.InvalidArgument):
            reader.chunks("w", [0, 0], None)
    asked = []
    real = _native.Reader.metadata
    monkeypatch.setattr(_native.Reader, "metadata",
                        lambda self, chunks=True: asked.append(chunks) or real(self, chunks))
    dest = {"w": ckptd.Shard(torch.zeros(2, 6), (4, 0), (10, 6)), "step": None}
    ckptd.load(dest, st.checkpoint_id)
    assert asked == [False]
    assert torch.equal(dest["w"].tensor, full[4:6]) and dest["step"] == 7


def test_async_save_holds_values_of_the_save_step(make_daemon):
    # A slow writer (8 MB/s) keeps the checkpoint WRITING while training goes
    # on and changes every tensor in place.
    d = make_daemon(write_rate_limit="8M")
    try:
        model, optim = fresh(1)
        train(model, optim, 1, seed=2)
        big = {"buf": torch.randn(2 << 20)}  # 8 MiB
        state = {"model": model, "optim": optim, "big": big}
        snapshot_model = {k: v.clone() for k, v in model.state_dict().items()}
        snapshot_big = big["buf"].clone()
        h = ckptd.async_save(state, "async/step_1", socket=sock(d))
        assert h.staged() and h.stats.bytes > 8 << 20 and h.stats.stall_seconds > 0
        seen_states = set()
        steps = 0
        while not h.done():
            seen_states.add(h.status().state)
            train(model, optim, 1, seed=3 + steps)
            big["buf"].add_(1.0)
            steps += 1
        st = h.result()
        assert steps >= 3, "training did not overlap the write"
        assert seen_states & {"STAGED", "WRITING", "COMMITTING"}, seen_states
        assert 0.0 <= h.progress() <= 1.0
        m2, o2 = fresh(8)
        dest = {"model": m2, "optim": o2, "big": {"buf": torch.zeros(2 << 20)}}
        ckptd.load(dest, st.checkpoint_id)
        for k, v in m2.state_dict().items():
            assert torch.equal(v, snapshot_model[k]), k
            assert not torch.equal(v, model.state_dict()[k]) or k.endswith("num_batches_tracked")
        assert torch.equal(dest["big"]["buf"], snapshot_big)
        assert int(o2.state_dict()["state"][0]["step"]) == 1
    finally:
        ckptd.close_clients()


def test_checkpoint_manager(daemon):
    root = daemon.root / "mgr"
    model, optim = fresh(2)
    state = {"model": model, "optim": optim}
    with ckptd.CheckpointManager(root, save_interval_steps=2, keep_last_n=2,
                                 socket=sock(daemon), max_pending=2) as mgr:
        assert mgr.all_steps() == [] and mgr.latest_step() is None
        taken = []
        for step in range(1, 9):
            train(model, optim, 1, seed=step)
            if mgr.save_async(step, state):
                taken.append(step)
            if step == 4:
                after4 = {k: v.clone() for k, v in model.state_dict().items()}
        assert taken == [2, 4, 6, 8]
        assert not mgr.should_save(3) and mgr.should_save(10)
        mgr.join()
        # Retention is the daemon's, right after each commit.
        du.poll(lambda: mgr.all_steps() == [6, 8], 30, "retention to keep steps 6 and 8")
        assert mgr.save(9, state, force=True)
        du.poll(lambda: mgr.all_steps() == [8, 9], 30, "retention to keep steps 8 and 9")
        assert mgr.latest_step() == 9
        m2, o2 = fresh(3)
        mgr.restore(9, {"model": m2, "optim": o2})
        assert_same_training_state(model, optim, m2, o2)
        with pytest.raises(FileNotFoundError, match="step 4"):
            mgr.restore(4, {"model": m2})
    assert not any(torch.equal(v, after4[k]) for k, v in m2.state_dict().items()
                   if v.is_floating_point())


def test_checkpoint_manager_keep_every(daemon):
    """keep_every (Orbax's keep_period): beyond the newest keep_last_n, the
    daemon keeps every step that is a multiple of it."""
    root = daemon.root / "mgr_every"
    model, optim = fresh(5)
    state = {"model": model, "optim": optim}
    with ckptd.CheckpointManager(root, save_interval_steps=1, keep_last_n=2, keep_every=3,
                                 socket=sock(daemon)) as mgr:
        for step in range(1, 9):
            assert mgr.save(step, state)
        du.poll(lambda: mgr.all_steps() == [3, 6, 7, 8], 30,
                "retention to keep steps 3 and 6 (keep_every) and 7, 8 (keep_last_n)",
                on_timeout=lambda: f"steps {mgr.all_steps()}")
    with pytest.raises(ValueError, match="keep_every"):
        ckptd.CheckpointManager(root, 1, keep_every=-1)


def test_zstd_compressed_save(daemon):
    """compression="zstd": the daemon writes every payload as one zstd frame
    with the "stream.zstd/1" transform in storage_data (what
    FileSystemWriter(_extensions=[ZStandard()]) writes; the interop suite
    loads it with stock torch 2.14); ckptd reads it back, ckptctl verify
    checks it, and bad options are refused precisely."""
    ck = daemon.root / "zstd"
    state = {"zeros": torch.zeros(1 << 18), "rand": torch.randn(1000, dtype=torch.float64),
             "half": torch.arange(64, dtype=torch.bfloat16), "empty": torch.zeros(0, 3),
             "meta": {"step": 7, "name": "run"}}
    st = ckptd.save(state, ck, socket=sock(daemon), compression="zstd")
    assert st.state == "COMMITTED", st
    data = sum(p.stat().st_size for p in ck.glob("*.distcp"))
    assert data < (1 << 20) // 4, data  # 1 MiB of zeros compresses
    assert (ck / ".metadata").read_bytes().count(b"stream.zstd/1") >= 5
    dest = {"zeros": torch.ones(1 << 18), "rand": torch.zeros(1000, dtype=torch.float64),
            "half": torch.zeros(64, dtype=torch.bfloat16), "empty": torch.ones(0, 3),
            "meta": {"step": None, "name": None}}
    ckptd.load(dest, ck)
    for k in ("zeros", "rand", "half"):
        assert torch.equal(dest[k], state[k]), k
    assert dest["meta"] == {"step": 7, "name": "run"}
    proc = subprocess.run([str(du.bin_path("ckptctl")), "verify", str(ck)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    st = ckptd.save(state, daemon.root / "zstd9", socket=sock(daemon), compression="zstd:9")
    assert st.state == "COMMITTED", st
    for bad in ("gzip", "zstd:0", "zstd:20", "zstd:"):
        with pytest.raises(ckptd.InvalidArgument, match="compression"):
            ckptd.save(state, daemon.root / "zbad", socket=sock(daemon), compression=bad)


def test_checkpoint_manager_preemption(daemon):
    model, optim = fresh(4)
    state = {"model": model, "optim": optim}
    mgr = ckptd.CheckpointManager(daemon.root / "pre", save_interval_steps=1000,
                                  socket=sock(daemon), save_on_preemption=True)
    try:
        for step in range(1, 100):
            train(model, optim, 1, seed=step)
            if step == 5:
                os.kill(os.getpid(), signal.SIGTERM)   # the handler only sets a flag
            mgr.save_async(step, state)
            if mgr.reached_preemption(step):
                break
        assert step == 5 or step == 6
        mgr.join()
        assert mgr.all_steps() == [step]
        # A second SIGTERM would get the previous disposition again.
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        mgr.close()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


# -- errors -------------------------------------------------------------------

def test_errors_carry_the_daemon_message(daemon, tmp_path):
    sd = {"w": torch.ones(4)}
    with pytest.raises(ckptd.DaemonUnavailable, match="nothing.sock"):
        ckptd.save(sd, "x", socket=str(tmp_path / "nothing.sock"))
    with pytest.raises(ckptd.PermissionDenied, match=r"'\.\./escape' contains '\.\.'"):
        ckptd.save(sd, "../escape", socket=sock(daemon))
    with pytest.raises(ckptd.InvalidArgument, match="rank 5 is not in"):
        ckptd.save(sd, "r", rank=5, world_size=2, socket=sock(daemon))
    ckptd.save(sd, "once", socket=sock(daemon))
    with pytest.raises(ckptd.CkptdError) as e:
        ckptd.save(sd, "once", socket=sock(daemon))
    assert e.value.code_name == "FAILED_PRECONDITION" and "overwrite" in e.value.message
    ckptd.save({"w": torch.full((4,), 2.0)}, "once", socket=sock(daemon), overwrite=True)
    # A refused save followed at once by an overwrite of the same directory:
    # the second one waits for the first one's cleanup (this once livelocked
    # the daemon: the waiter spun holding the lock the cleanup needed).
    for i in range(10):
        with pytest.raises(ckptd.CheckpointFailed, match="overwrite"):
            ckptd.save(sd, "once", socket=sock(daemon), timeout=30)
        ckptd.save({"w": torch.full((4,), 2.0)}, "once", socket=sock(daemon), overwrite=True,
                   timeout=30)
    got = {"w": torch.zeros(4)}
    ckptd.load(got, "once", socket=sock(daemon))
    assert torch.equal(got["w"], torch.full((4,), 2.0))
    # Load errors: missing directory, missing key, size mismatch, type mismatch.
    with pytest.raises(ckptd.NotFound):
        ckptd.load(got, str(tmp_path / "absent"))
    with pytest.raises(ckptd.NotFound, match="Missing key in checkpoint state_dict: v"):
        ckptd.load({"v": torch.zeros(1)}, "once", socket=sock(daemon))
    with pytest.raises(ckptd.InvalidArgument, match="Size mismatch"):
        ckptd.load({"w": torch.zeros(5)}, "once", socket=sock(daemon))
    with pytest.raises(ckptd.InvalidArgument, match="holds a tensor"):
        ckptd.load({"w": "text"}, "once", socket=sock(daemon))
    # A cancelled checkpoint: result() raises with the state and the reason;
    # the daemon keeps serving.
    w = ckptd.async_save({"a": torch.ones(8)}, "cancelled", rank=0, world_size=2,
                         socket=sock(daemon))
    w.cancel("test says stop")
    with pytest.raises(ckptd.CheckpointFailed, match="CANCELLED.*test says stop") as e:
        w.result(timeout=30)
    assert e.value.status.state == "CANCELLED"
    assert ckptd.status(w.checkpoint_id, socket=sock(daemon)).state == "CANCELLED"
    assert ckptd.save(sd, "after", socket=sock(daemon)).state == "COMMITTED"
    # Unsupported values are refused before anything is sent.
    with pytest.raises(ValueError, match="sparse"):
        ckptd.save({"s": torch.eye(3).to_sparse()}, "sparse", socket=sock(daemon))
    assert [c.state for c in ckptd.list_checkpoints(socket=sock(daemon))].count("COMMITTED") >= 2


def test_corrupt_checkpoint_is_reported_not_loaded(daemon):
    st = ckptd.save({"w": torch.arange(1000.0)}, "corrupt", socket=sock(daemon))
    data = next(p for p in os.listdir(st.checkpoint_id) if p.endswith(".distcp"))
    path = os.path.join(st.checkpoint_id, data)
    with open(path, "r+b") as f:
        f.truncate(100)
    with pytest.raises(ckptd.CkptdError) as e:
        ckptd.load({"w": torch.zeros(1000)}, st.checkpoint_id)
    assert data in e.value.message


def test_pip_install_into_a_venv(tmp_path, daemon):
    """`pip install ./client/python` works offline (in-tree build backend)
    and bundles the native library; the installed package saves and loads."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, capture_output=True)
    env = dict(os.environ, CKPTD_CLIENT_LIB=str(pyclient_util.NATIVE_LIB),
               PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-index",
                           str(pyclient_util.PACKAGE_DIR)], env=env, capture_output=True,
                          text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    env.pop("CKPTD_CLIENT_LIB")
    code = (
        "import ckptd, torch, sys\n"
        "p = ckptd.library_path()\n"
        "assert p.startswith(sys.prefix), p\n"
        "st = ckptd.save({'w': torch.arange(6.0)}, 'venv_ck', socket=sys.argv[1])\n"
        "d = {'w': torch.zeros(6)}\n"
        "ckptd.load(d, st.checkpoint_id)\n"
        "assert torch.equal(d['w'], torch.arange(6.0))\n"
        "print('ok', p)\n")
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", code, sock(daemon)], env=env,
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout + proc.stderr


def test_background_staging(daemon):
    """background_staging returns before the copy; after wait_staged() the
    tensors may change and the checkpoint still holds the values of the
    call; a staging failure surfaces from wait_staged() and result()."""
    src = {"a": torch.arange(1 << 20, dtype=torch.float32), "meta": {"step": 3}}
    expected = src["a"].clone()
    h = ckptd.async_save(src, "bg", socket=sock(daemon), background_staging=True)
    src["meta"]["step"] = 4        # objects were pickled by the call itself
    h.wait_staged(timeout=60)
    assert h.staged() and h.stats.staging_seconds >= h.stats.stall_seconds
    src["a"].add_(1)
    st = h.result(timeout=60)
    dest = {"a": torch.zeros(1 << 20), "meta": {"step": 0}}
    ckptd.load(dest, st.checkpoint_id)
    assert torch.equal(dest["a"], expected) and dest["meta"]["step"] == 3
    bad = ckptd.async_save(src, "../bad", socket=sock(daemon), background_staging=True)
    with pytest.raises(ckptd.PermissionDenied):
        bad.wait_staged(timeout=60)
    assert not bad.staged()
    with pytest.raises(ckptd.PermissionDenied):
        bad.result()


# -- multi-node: Cluster and discover_cluster -----------------------------------

def test_cluster_argument_validation():
    c = ckptd.Cluster(coordinator="node0:7070", local_ranks=[3, 1, 2], num_nodes=2)
    assert c.local_ranks == (1, 2, 3) and c.num_nodes == 2 and c.coordinator == "node0:7070"
    assert ckptd.Cluster("", [], 1).local_ranks == ()     # single node: nothing required
    assert ckptd.Cluster("", (0, 1), 1).local_ranks == (0, 1)
    bad = [
        (dict(coordinator="n:1", local_ranks=[0], num_nodes=0), "num_nodes 0 must be >= 1"),
        (dict(coordinator="", local_ranks=[0], num_nodes=2), "coordinator is empty"),
        (dict(coordinator="n:1", local_ranks=[], num_nodes=2), "local_ranks is empty"),
        (dict(coordinator="n:1", local_ranks=[0, 2, 2], num_nodes=2),
         "local rank 2 appears more than once"),
        (dict(coordinator="n:1", local_ranks=[-1, 0], num_nodes=2), "local rank -1 is negative"),
        (dict(coordinator="n:1", local_ranks=[2**31], num_nodes=2), "too large"),
    ]
    for kwargs, msg in bad:
        with pytest.raises(ckptd.InvalidArgument, match=msg):
            ckptd.Cluster(**kwargs)
    with pytest.raises(ValueError):                       # InvalidArgument is a ValueError
        ckptd.Cluster("n:1", [0], -1)
    for kwargs in [dict(coordinator=None, local_ranks=[0], num_nodes=1),
                   dict(coordinator="n:1", local_ranks="01", num_nodes=2),
                   dict(coordinator="n:1", local_ranks=5, num_nodes=2),
                   dict(coordinator="n:1", local_ranks=[0, 1.5], num_nodes=2),
                   dict(coordinator="n:1", local_ranks=[True], num_nodes=2),
                   dict(coordinator="n:1", local_ranks=[0], num_nodes="2")]:
        with pytest.raises(TypeError):
            ckptd.Cluster(**kwargs)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.num_nodes = 3
    # save / async_save / CheckpointManager take a Cluster or None.
    with pytest.raises(TypeError, match="ckptd.Cluster or None"):
        ckptd.async_save({"w": torch.ones(1)}, "x", cluster={"num_nodes": 2})
    with pytest.raises(ValueError, match='"auto"'):
        ckptd.CheckpointManager("/tmp/mgr", 1, cluster="automatic")
    with pytest.raises(TypeError, match="ckptd.Cluster"):
        ckptd.CheckpointManager("/tmp/mgr", 1, cluster=("n:1", [0], 2))
    assert ckptd.CheckpointManager("/tmp/mgr", 1, cluster=c).cluster is c
    assert ckptd.CheckpointManager("/tmp/mgr", 1, cluster=None).cluster is None
    # "auto" without torch.distributed: a single-node job, no collective.
    assert ckptd.CheckpointManager("/tmp/mgr", 1).cluster is None
    assert ckptd.discover_cluster() is None


def test_save_options_struct_carries_the_cluster():
    from ckptd import _native
    assert _native.API_VERSION == 6 and _native.lib().ckptd_api_version() >= 3
    opts = _native.save_options(True, False, 3, None)
    assert (opts.overwrite, opts.keep_last_n, opts.coordinator, opts.num_local_ranks,
            opts.num_nodes) == (1, 3, None, 0, 0)
    assert not opts.local_ranks
    opts = _native.save_options(cluster=ckptd.Cluster("node0:7070", [5, 4], 3))
    assert opts.coordinator == b"node0:7070" and opts.num_nodes == 3
    assert [opts.local_ranks[i] for i in range(opts.num_local_ranks)] == [4, 5]
    # The C struct of API version 6 (external_metadata appended); version 3's
    # was 40 bytes, 4's and 5's 48.
    assert ctypes.sizeof(_native.SaveOptions) == 72 and _native.options_size(3) == 40
    assert _native.options_size(5) == 48
    opts = _native.save_options(external_metadata=True, metadata_timeout=2.5, keep_every=50)
    assert (opts.external_metadata, opts.metadata_timeout_ms, opts.keep_every) == (1, 2500, 50)


def entry(rank, identity, peer="", host="h", error=None):
    return {"identity": identity, "rank": rank, "peer_address": peer, "host": host,
            "socket": "/run/ckptd/ckptd.sock", "error": error}


def test_group_ranks_and_cluster_for():
    from ckptd.cluster import _cluster_for, _group_ranks
    # Two nodes, ranks interleaved: grouped by daemon identity, rank 0's first.
    entries = [entry(0, "a:1", "a:1", "na"), entry(1, "b:1", "b:1", "nb"),
               entry(2, "a:1", "a:1", "na"), entry(3, "b:1", "b:1", "nb")]
    groups = _group_ranks(entries)
    assert [(g.identity, g.ranks) for g in groups] == [("a:1", [0, 2]), ("b:1", [1, 3])]
    assert _cluster_for(entries, 0) == ckptd.Cluster("a:1", [0, 2], 2)
    assert _cluster_for(entries, 3) == ckptd.Cluster("a:1", (1, 3), 2)
    # Gathered out of order (rank 0 last): the coordinator is still rank 0's daemon.
    shuffled = [entry(2, "c:9", "c:9"), entry(1, "b:1", "b:1"), entry(0, "b:1", "b:1")]
    assert _cluster_for(shuffled, 2) == ckptd.Cluster("b:1", [2], 2)
    assert _cluster_for(shuffled, 0) == ckptd.Cluster("b:1", [0, 1], 2)
    # One daemon (with or without peer service): a single-node job.
    assert _cluster_for([entry(r, "a:1", "a:1") for r in range(4)], 1) is None
    local = [entry(r, "host:/run/ckptd/ckptd.sock:42") for r in range(4)]
    assert len(_group_ranks(local)) == 1 and _cluster_for(local, 3) is None
    # Several daemons, one without peer service: a clear error on every rank.
    mixed = [entry(0, "a:1", "a:1", "na"), entry(1, "nb:/run/ckptd/ckptd.sock:7", "", "nb")]
    with pytest.raises(ckptd.CkptdError, match="daemon on nb has no peer service; set "
                                               "peer_listen in its config") as e:
        _cluster_for(mixed, 0)
    assert e.value.code_name == "FAILED_PRECONDITION"
    # Two daemons without peer service on different hosts, same socket path and pid.
    with pytest.raises(ckptd.CkptdError, match="no peer service"):
        _cluster_for([entry(0, "na:/s:7", "", "na"), entry(1, "nb:/s:7", "", "nb")], 1)
    # A rank that could not ask its daemon fails the discovery everywhere.
    with pytest.raises(ckptd.CkptdError, match="rank 1 on nb could not ask its daemon"):
        _group_ranks([entry(0, "a:1", "a:1"), entry(1, "", host="nb", error="UNAVAILABLE: x")])


def test_discover_cluster_gathers_daemon_identities(monkeypatch):
    """discover_cluster against a faked torch.distributed and faked daemons:
    four ranks on two nodes, rank 2 the caller."""
    import torch.distributed as dist
    from ckptd import cluster as cl

    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 4)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 2)
    asked = []

    class FakeClient:
        def __init__(self, info):
            self._info = info

        def info(self):
            return self._info

    def fake_client(socket=None, rank=0):
        asked.append((socket, rank))
        return FakeClient({"peer_address": "node0:7070", "pid": 11})

    others = {0: ("node0:7070", "n0"), 1: ("node1:7070", "n1"), 3: ("node1:7070", "n1")}

    def fake_gather(mine, group):
        assert group == "pg"
        out = [cl._entry(r, {"peer_address": p, "pid": 1}, "/s") for r, (p, _) in others.items()]
        return sorted(out + [mine], key=lambda e: e["rank"])

    monkeypatch.setattr(cl, "client", fake_client)
    monkeypatch.setattr(cl, "_gather", fake_gather)
    got = ckptd.discover_cluster(process_group="pg", socket="/tmp/d.sock")
    assert got == ckptd.Cluster("node0:7070", [0, 2], 2)
    assert asked == [("/tmp/d.sock", 2)]

    # Every rank on one daemon without peer service: None (identity host:socket:pid).
    monkeypatch.setattr(cl, "client", lambda socket=None, rank=0: FakeClient(
        {"peer_address": "", "pid": 11}))
    monkeypatch.setattr(cl, "_gather", lambda mine, group: [dict(mine, rank=r) for r in range(4)])
    assert ckptd.discover_cluster(socket="/tmp/d.sock") is None

    # The daemon cannot be reached: the error goes through the gather and is
    # raised (on every rank) after it, so no rank hangs.
    def unreachable(socket=None, rank=0):
        raise ckptd.DaemonUnavailable(14, "cannot reach ckptd at /tmp/d.sock")

    monkeypatch.setattr(cl, "client", unreachable)
    monkeypatch.setattr(cl, "_gather", lambda mine, group: [
        cl._entry(0, {"peer_address": "node0:7070"}, "/s"), cl._entry(1, {}, "/s"), mine,
        cl._entry(3, {}, "/s")])
    with pytest.raises(ckptd.CkptdError, match="rank 2 on .* could not ask its daemon .*"
                                               "cannot reach ckptd"):
        ckptd.discover_cluster(socket="/tmp/d.sock")

    # A group this process is not in; a world of one.
    monkeypatch.setattr(dist, "get_rank", lambda group=None: -1)
    with pytest.raises(ckptd.InvalidArgument, match="not a member"):
        ckptd.discover_cluster("pg")
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 1)
    assert ckptd.discover_cluster() is None


def test_cluster_is_checked_before_anything_is_sent(daemon):
    sd = {"w": torch.ones(4)}
    cluster = ckptd.Cluster("node0.example:7070", [2, 3], 2)
    with pytest.raises(ckptd.InvalidArgument, match=r"local_ranks \[2, 3\] does not hold this "
                                                    r"rank \(1\)"):
        ckptd.save(sd, "mn", rank=1, world_size=4, cluster=cluster, socket=sock(daemon))
    with pytest.raises(ckptd.InvalidArgument, match="num_nodes 2 exceeds world_size 1"):
        ckptd.async_save(sd, "mn", cluster=cluster, rank=0, world_size=1, socket=sock(daemon))
    with pytest.raises(ckptd.InvalidArgument, match="local rank 3 is not in"):
        ckptd.async_save(sd, "mn", cluster=cluster, rank=2, world_size=3, socket=sock(daemon))
    assert ckptd.list_checkpoints(socket=sock(daemon)) == []
    # The daemon's info and a single-node status carry the new fields.
    info = ckptd.client(sock(daemon)).info()
    assert "peer_address" in info
    st = ckptd.save(sd, "single", socket=sock(daemon))
    assert st.state == "COMMITTED" and st.num_nodes <= 1 and st.coordinator == ""


def test_cluster_from_the_launchers_environment():
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "node0"}
    assert ckptd.cluster_from_env(env) == ckptd.Cluster("node0:7070", (4, 5, 6, 7), 2)
    env["CKPTD_COORDINATOR"] = "10.0.0.1:7171"
    assert ckptd.cluster_from_env(env).coordinator == "10.0.0.1:7171"
    assert ckptd.cluster_from_env({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}) is None
    with pytest.raises(ckptd.InvalidArgument, match="LOCAL_WORLD_SIZE is not set"):
        ckptd.cluster_from_env({"RANK": "0", "WORLD_SIZE": "4"})
    with pytest.raises(ckptd.InvalidArgument, match="equal nodes"):
        ckptd.cluster_from_env({"RANK": "0", "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "4"})
    with pytest.raises(ckptd.InvalidArgument, match="CKPTD_COORDINATOR"):
        ckptd.cluster_from_env({"RANK": "0", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"})
