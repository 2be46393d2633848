"""Bad input to a real daemon through the raw protocol (Python gRPC stubs
generated from proto/ckptd/v1/daemon.proto): every request is refused with
the documented status code and a message naming what is wrong, and
afterwards the daemon is alive (GetInfo) and a normal save still commits.
Also: the socket's permissions, a second daemon on the same socket, limits
(max_items, max_active_checkpoints, max_batch) and floods of calls.
"""
import os
import re
import stat
import subprocess

import pytest

import daemon_util as du
from daemon_util import RawClient, rpc_error, state_name


def assert_alive_and_saving(d, checkpoint_id="ok/after"):
    """GetInfo answers (same process) and a normal save commits + verifies."""
    assert d.running(), d.log_tail()
    assert d.info().pid == d.proc.pid
    RawClient(d).save_valid(checkpoint_id)


def assert_failed(d, checkpoint_id, code, *substrings):
    st = d.wait_final(checkpoint_id, timeout=30)
    assert state_name(st.state) == "FAILED", st
    assert st.error_code == du.CODE[code], st
    for s in substrings:
        assert s in st.error, (s, st.error)


# ---------------------------------------------------------------------------
# One bad Save call each: (code, message substrings, checkpoint fails too).

def _unknown_arena(raw):
    return raw.request("bad/ck", items=[raw.tensor("w", [4])],
                       extents=[raw.extent(0, 0, 0, 16)], arena_id=12345)


def _extent(arena_offset, length=16):
    def make(raw):
        arena_id = raw.arena(b"\0" * 64)
        return raw.request("bad/ck", items=[raw.tensor("w", [length // 4])],
                           extents=[raw.extent(0, 0, arena_offset, length)], arena_id=arena_id)
    return make


def _item(**item_kw):
    def make(raw):
        kw = dict(fqn="w", shape=[4])
        kw.update(item_kw)
        return raw.request("bad/ck", items=[raw.tensor(**kw)])
    return make


def _with(fn, **req_kw):
    def make(raw):
        req = fn(raw)
        for k, v in req_kw.items():
            setattr(req, k, v)
        return req
    return make


def _untyped(raw):
    return raw.request("bad/ck", items=[raw.pb2.Item(fqn="w", dtype="float32", nbytes=0)])


def _two_items(extents):
    def make(raw):
        arena_id = raw.arena(b"\0" * 64)
        return raw.request("bad/ck", items=[raw.tensor("a", [4]), raw.tensor("b", [4])],
                           extents=[raw.extent(*e) for e in extents], arena_id=arena_id)
    return make


BAD_SAVES = {
    "unknown arena id": (_unknown_arena, "INVALID_ARGUMENT",
                         ["rank 0", "arena 12345 is not registered"], True),
    "extent past the arena end": (_extent(56), "INVALID_ARGUMENT",
                                  ["item 'w'", "[56, 56+16)", "outside shm segment"], True),
    "extent offset = arena size": (_extent(64), "INVALID_ARGUMENT",
                                   ["item 'w'", "outside shm segment"], True),
    "extent offset overflows uint64": (_extent(2**64 - 8), "INVALID_ARGUMENT",
                                       ["item 'w'", str(2**64 - 8), "outside shm segment"], True),
    "extent longer than the arena": (_extent(0, 128), "INVALID_ARGUMENT",
                                     ["item 'w'", "outside shm segment"], True),
    "nbytes disagrees with the shape": (_item(nbytes=12), "INVALID_ARGUMENT",
                                        ["item 'w'", "nbytes is 12", "holds 16 bytes"], True),
    "nbytes disagrees with the dtype": (_item(dtype="float64", nbytes=16), "INVALID_ARGUMENT",
                                        ["item 'w'", "nbytes is 16", "holds 32 bytes"], True),
    "chunk past the end": (_item(offsets=[2], sizes=[3]), "INVALID_ARGUMENT",
                           ["item 'w'", "out of bounds of the global shape"], True),
    "negative chunk offset": (_item(offsets=[-1], sizes=[2]), "INVALID_ARGUMENT",
                              ["item 'w'", "out of bounds"], True),
    "chunk rank differs from shape": (_item(offsets=[0, 0], sizes=[4, 1]), "INVALID_ARGUMENT",
                                      ["item 'w'", "dimensions"], True),
    "unknown dtype": (_item(dtype="float33"), "INVALID_ARGUMENT",
                      ["item 'w'", "unknown dtype 'float33'"], False),
    "item type unspecified": (_untyped, "INVALID_ARGUMENT", ["item 'w'", "not TENSOR or BYTES"],
                              False),
    "empty fqn": (_item(fqn=""), "INVALID_ARGUMENT", ["empty fqn"], True),
    "rank outside world": (_with(_item(), rank=3, world_size=2), "INVALID_ARGUMENT",
                           ["rank 3 is not in [0, 2)"], False),
    "world size 0": (_with(_item(), world_size=0), "INVALID_ARGUMENT", ["world_size 0"], False),
    "dotdot ('..') in checkpoint_id": (_with(_item(), checkpoint_id="a/../../etc"),
                                       "PERMISSION_DENIED", ["contains '..'"], False),
    "absolute path outside the roots": (_with(_item(), checkpoint_id="/tmp/ckptd-e2e-outside/ck"),
                                        "PERMISSION_DENIED", ["not below a checkpoint root"],
                                        False),
    "empty checkpoint_id": (_with(_item(), checkpoint_id=""), "INVALID_ARGUMENT",
                            ["checkpoint_id is empty"], False),
    "first batch with sequence 1": (_with(_item(), sequence=1), "FAILED_PRECONDITION",
                                    ["without sequence 0"], False),
    "extents out of item order": (_two_items([(1, 0, 0, 16), (0, 0, 16, 16)]), "INVALID_ARGUMENT",
                                  ["extent (item 1, offset 0) out of order",
                                   "expected item 0 at offset 0"], True),
    "extent skips bytes of an item": (_two_items([(0, 8, 0, 8)]), "INVALID_ARGUMENT",
                                      ["extent (item 0, offset 8) out of order"], True),
    "extent overruns its item": (_two_items([(0, 0, 0, 32)]), "INVALID_ARGUMENT",
                                 ["overruns item 'a'"], True),
    "extent of length 0": (_two_items([(0, 0, 0, 0)]), "INVALID_ARGUMENT", ["length 0"], True),
    "last batch with bytes missing": (_two_items([(0, 0, 0, 16)]), "INVALID_ARGUMENT",
                                      ["last batch but item 'b' has only 0 of 16 bytes"], True),
}


@pytest.mark.parametrize("case", list(BAD_SAVES),
                         ids=lambda c: re.sub(r"[^a-z0-9]+", "-", c.lower()).strip("-"))
def test_bad_save_is_refused(make_daemon, case):
    make, code, substrings, fails_checkpoint = BAD_SAVES[case]
    d = make_daemon()
    raw = RawClient(d)
    req = make(raw)
    got_code, msg = raw.save_error(req)
    assert got_code == code, (got_code, msg)
    for s in substrings:
        assert s in msg, (s, msg)
    assert "\n" not in msg
    if fails_checkpoint:
        # The checkpoint was created, and the bad call failed it.
        st = d.status(req.checkpoint_id)
        assert state_name(st.state) == "FAILED" and st.error == msg, st
        assert st.error_code == du.CODE[code]
    else:
        assert d.list() == []
    assert du.data_files(d.root / "bad" / "ck") == []
    assert_alive_and_saving(d, "bad/ck")  # the same path works afterwards



def test_requests_grpc_cannot_parse_are_invalid_argument(make_daemon):
    """A string field that is not UTF-8 (or bytes that are no protobuf) got
    gRPC's bare UNIMPLEMENTED; the daemon parses requests itself and names
    the field. Sent as raw bytes: Python's protobuf cannot
    even build such a message."""
    d = make_daemon()
    raw = RawClient(d)
    d.stub()
    channel = d._channel

    def call(method, payload):
        fn = channel.unary_unary(f"/ckptd.v1.CheckpointDaemon/{method}")
        return du.rpc_error(fn, payload, timeout=30)

    good = raw.request("bad/ck@@@", job="job@@", items=[raw.tensor("w", [4])])
    payload = good.SerializeToString().replace(b"job@@", b"job\xc3(").replace(
        b"ck@@@", b"ck\xed\xa0\x80")  # a lone surrogate is not UTF-8 either
    code, msg = call("Save", payload)
    assert code == "INVALID_ARGUMENT", (code, msg)
    assert "ckptd.v1.SaveRequest: checkpoint_id (at byte 6) is not valid UTF-8" in msg, msg
    code, msg = call("List", raw.pb2.ListRequest(job="j@@").SerializeToString()
                     .replace(b"j@@", b"j\xff@"))
    assert code == "INVALID_ARGUMENT" and msg.startswith(
        "ckptd.v1.ListRequest: job (at byte 1) is not valid UTF-8"), (code, msg)
    code, msg = call("Wait", b"\x0a\xff\xff\xff")
    assert code == "INVALID_ARGUMENT" and "not a valid ckptd.v1.WaitRequest" in msg, (code, msg)
    assert "not valid UTF-8" in d.log_since_start()
    assert d.list() == []
    assert_alive_and_saving(d, "bad/ck")

def test_overlapping_chunks_of_two_ranks_fail_the_checkpoint(make_daemon):
    d = make_daemon()
    raw = RawClient(d)
    fqn = "model.overlap.weight"
    r0 = raw.tensor_rank("ov/ck", fqn, [8, 3], [0, 0], [5, 3], rank=0, world=2)
    r1 = raw.tensor_rank("ov/ck", fqn, [8, 3], [4, 0], [4, 3], rank=1, world=2)
    for req in (r0, r1):
        try:
            raw.save(req)  # STAGED, or the plan's error if it was quicker
        except Exception as e:  # noqa: BLE001
            assert "overlaps" in str(e), e
    assert_failed(d, "ov/ck", "INVALID_ARGUMENT", fqn, "overlaps")
    # Nothing written, nothing left held: both arenas are idle again.
    assert du.data_files(d.root / "ov" / "ck") == []
    for req in (r0, r1):
        raw.stub.WaitArenaIdle(raw.pb2.WaitArenaIdleRequest(arena_id=req.arena_id,
                                                            timeout_ms=5000), timeout=10)
    assert_alive_and_saving(d, "ov/ck")


def test_ranks_that_disagree_fail_the_checkpoint(make_daemon):
    d = make_daemon()
    raw = RawClient(d)
    raw.save(raw.tensor_rank("dis/ws", "w", [4], [0], [2], rank=0, world=2))
    code, msg = raw.save_error(raw.tensor_rank("dis/ws", "w", [4], [2], [2], rank=1, world=3))
    assert code == "INVALID_ARGUMENT" and "rank 1 says world_size 3" in msg, msg
    assert_failed(d, "dis/ws", "INVALID_ARGUMENT", "world_size 3")

    raw.save(raw.tensor_rank("dis/opt", "w", [4], [0], [2], rank=0, world=2))
    code, msg = raw.save_error(raw.tensor_rank("dis/opt", "w", [4], [2], [2], rank=1, world=2,
                                               overwrite=True))
    assert code == "INVALID_ARGUMENT" and "save options differ" in msg, msg
    assert_failed(d, "dis/opt", "INVALID_ARGUMENT", "rank 1's save options")
    assert_alive_and_saving(d)


def test_batch_sequence_out_of_order_fails_the_checkpoint(make_daemon):
    d = make_daemon()
    raw = RawClient(d)
    n = 4096
    arena_id = raw.arena(du.sample_spec.box_bytes("uint8", [n], 1))
    item = raw.tensor("w", [n], dtype="uint8")
    # Batch 0 (half the bytes, not last) is accepted...
    raw.save(raw.request("seq/ck", items=[item], extents=[raw.extent(0, 0, 0, n // 2)],
                         arena_id=arena_id, last=False))
    # ... batch 2 instead of 1 is not.
    code, msg = raw.save_error(raw.request("seq/ck", sequence=2, arena_id=arena_id,
                                           extents=[raw.extent(0, n // 2, n // 2, n // 2)]))
    assert code == "INVALID_ARGUMENT", msg
    assert "rank 0 sent batch 2" in msg and "expected 1" in msg, msg
    assert_failed(d, "seq/ck", "INVALID_ARGUMENT", "sent batch 2")
    du.poll(lambda: du.data_files(d.root / "seq" / "ck") == [], 30, "clean-up")
    # A later batch may not carry items.
    raw.save(raw.request("seq/b", items=[item], extents=[raw.extent(0, 0, 0, n // 2)],
                         arena_id=arena_id, last=False))
    code, msg = raw.save_error(raw.request("seq/b", sequence=1, items=[item], arena_id=arena_id,
                                           extents=[raw.extent(0, n // 2, n // 2, n // 2)]))
    assert code == "INVALID_ARGUMENT" and "only sequence 0 may" in msg, msg
    assert_alive_and_saving(d, "seq/ck")


# ---------------------------------------------------------------------------
# Paths.

def test_symlink_escaping_the_root_is_refused(make_daemon, tmp_path):
    d = make_daemon()
    raw = RawClient(d)
    outside = tmp_path / "outside"
    outside.mkdir()
    d.root.mkdir(parents=True, exist_ok=True)
    (d.root / "escape").symlink_to(outside)
    for cid in ("escape/ck", "escape", str(d.root / "escape" / "deeper" / "ck")):
        req = raw.tensor_rank(cid, "w", [4], [0], [4])
        code, msg = raw.save_error(req)
        assert code == "PERMISSION_DENIED", (cid, code, msg)
        assert f"resolves to {outside}" in msg and "not below a checkpoint root" in msg, msg
    assert list(outside.iterdir()) == []
    # The root itself is not a checkpoint directory either.
    code, msg = raw.save_error(raw.tensor_rank(str(d.root), "w", [4], [0], [4]))
    assert code == "PERMISSION_DENIED", msg
    # A symlink that stays inside the root is fine; the id is the real path.
    (d.root / "real").mkdir()
    (d.root / "alias").symlink_to(d.root / "real")
    resp = raw.save(raw.tensor_rank("alias/ck", "w", [4], [0], [4]))
    assert resp.checkpoint_id == str(d.root / "real" / "ck")
    assert state_name(d.wait_final(resp.checkpoint_id).state) == "COMMITTED"
    assert_alive_and_saving(d)


# ---------------------------------------------------------------------------
# Arenas.

def test_bad_arenas_are_refused(make_daemon, tmp_path):
    # The name-based checks (legacy RegisterArena, on only with the unsafe
    # allow_named_arenas; test_arena_hostile.py covers the arena socket and
    # the default refusal).
    d = make_daemon(allow_named_arenas=True)
    raw = RawClient(d)
    d.shm.mkdir(parents=True, exist_ok=True)
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 8192)
    (d.shm / "link").symlink_to(secret)
    (d.shm / "adir").mkdir()
    os.mkfifo(d.shm / "fifo")
    small = raw.arena_file(b"x" * 100)
    cases = [
        (small, 4096, "INVALID_ARGUMENT", ["is 100 bytes, smaller than the claimed 4096"]),
        ("sub/x", 16, "INVALID_ARGUMENT", ["invalid shm segment name 'sub/x'"]),
        ("../secret", 16, "INVALID_ARGUMENT", ["invalid shm segment name"]),
        ("", 16, "INVALID_ARGUMENT", ["invalid shm segment name"]),
        ("x" * 201, 16, "INVALID_ARGUMENT", ["invalid shm segment name"]),
        ("link", 16, "PERMISSION_DENIED", ["'link'", "symbolic link"]),
        ("adir", 16, "INVALID_ARGUMENT", ["'adir'", "is a directory"]),
        ("fifo", 16, "INVALID_ARGUMENT", ["'fifo'", "FIFO"]),
        ("missing", 16, "NOT_FOUND", ["'missing'", "does not exist"]),
        (small, 0, "INVALID_ARGUMENT", ["claimed size must be positive"]),
    ]
    for name, size, code, substrings in cases:
        got, msg = rpc_error(raw.register, name, size)
        assert got == code, (name, got, msg)
        for s in substrings:
            assert s in msg, (name, s, msg)
    # Nothing outside the shm directory was touched; refused names stay.
    assert secret.read_bytes() == b"s" * 8192
    assert (d.shm / "link").is_symlink() and (d.shm / small).exists()
    # Arena ids that do not exist.
    got, msg = rpc_error(raw.stub.ReleaseArena, raw.pb2.ReleaseArenaRequest(arena_id=777),
                         timeout=10)
    assert got == "NOT_FOUND" and "arena 777" in msg, msg
    # A good one: registered, and its name unlinked by the daemon.
    name = raw.arena_file(b"\0" * 4096)
    assert raw.register(name, 4096) != 0
    assert not (d.shm / name).exists()
    assert_alive_and_saving(d)


# ---------------------------------------------------------------------------
# Limits and floods.

def test_too_many_items(make_daemon):
    d = make_daemon(max_items=10)
    assert d.info().max_items == 10
    raw = RawClient(d)
    items = [raw.tensor(f"t{i}", [1], nbytes=4) for i in range(11)]
    code, msg = raw.save_error(raw.request("many/ck", items=items))
    assert code == "RESOURCE_EXHAUSTED", msg
    assert "rank 0 sent 11 items" in msg and "max_items" in msg, msg
    # The client library refuses before calling (it knows the limit):
    # 4 extra items + the trainer's 7 = 11.
    t = d.trainer("many/trainer", extra_items=4)
    assert t.wait(60) == 1
    assert t.lines[-1]["code"] == du.CODE["RESOURCE_EXHAUSTED"], t.lines
    assert d.try_status("many/trainer") is None  # never reached the daemon
    # 10 items are fine.
    t = d.trainer("many/ten", extra_items=3)
    assert t.wait(60) == 0, (t.lines, t.stderr)
    assert_alive_and_saving(d)


def test_batch_larger_than_max_batch(make_daemon):
    d = make_daemon(staging_budget="1M")
    info = d.info()
    assert info.max_batch_bytes == 512 << 10
    raw = RawClient(d)
    n = 600 << 10
    arena_id = raw.arena(b"\0" * n)
    code, msg = raw.save_error(raw.request("big/ck", items=[raw.tensor("w", [n], dtype="uint8")],
                                           extents=[raw.extent(0, 0, 0, n)], arena_id=arena_id))
    assert code == "RESOURCE_EXHAUSTED" and "exceeds max_batch" in msg, msg
    assert_alive_and_saving(d)


def test_flood_of_checkpoints_and_save_calls(make_daemon):
    d = make_daemon(max_active_checkpoints=2)
    raw = RawClient(d)
    # Two checkpoints wait for their rank 1; a third is one too many.
    for i in range(2):
        resp = raw.save(raw.tensor_rank(f"flood/p{i}", "w", [4], [0], [2], rank=0, world=2))
        assert state_name(resp.state) == "STAGED"
    code, msg = raw.save_error(raw.tensor_rank("flood/p2", "w", [4], [0], [2], rank=0, world=2))
    assert code == "RESOURCE_EXHAUSTED" and "max_active_checkpoints" in msg, msg

    # 48 concurrent Save calls for new checkpoints: all refused, cleanly.
    reqs = [raw.tensor_rank(f"flood/c{i}", "w", [4], [0], [4]) for i in range(48)]
    futures = [raw.stub.Save.future(r, timeout=30) for r in reqs]
    for f in futures:
        assert f.code().name == "RESOURCE_EXHAUSTED", (f.code(), f.details())
    assert [c.checkpoint_id for c in d.list()] == [str(d.root / "flood" / f"p{i}")
                                                   for i in range(2)]
    assert not (d.root / "flood" / "c0").exists()

    # Freed slots are usable again.
    for i in range(2):
        assert state_name(d.cancel(f"flood/p{i}", "flood test").state) == "CANCELLED"
    assert_alive_and_saving(d, "flood/after")

    # 32 ranks of one checkpoint, all Save calls in flight at once.
    world = 32
    reqs = [raw.tensor_rank("flood/wide", "w", [world, 3], [r, 0], [1, 3], rank=r, world=world)
            for r in range(world)]
    futures = [raw.stub.Save.future(r, timeout=60) for r in reqs]
    for f in futures:
        assert state_name(f.result().state) == "STAGED"
    st = d.wait_final("flood/wide")
    assert state_name(st.state) == "COMMITTED" and st.world_size == world, st
    assert du.run(du.bin_path("ckptctl"), "verify", st.checkpoint_id, check=False).returncode == 0
    assert_alive_and_saving(d)


def test_unknown_and_finished_checkpoints(make_daemon):
    d = make_daemon()
    raw = RawClient(d)
    pb2 = raw.pb2
    for call, req in [(raw.stub.GetStatus, pb2.GetStatusRequest(checkpoint_id="nope")),
                      (raw.stub.Wait, pb2.WaitRequest(checkpoint_id="nope")),
                      (raw.stub.Cancel, pb2.CancelRequest(checkpoint_id="nope"))]:
        code, msg = rpc_error(call, req, timeout=10)
        assert code == "NOT_FOUND" and "no checkpoint 'nope'" in msg, msg
    proc = d.ckptctl("status", "nope", check=False)
    assert proc.returncode == 4 and "no checkpoint 'nope'" in proc.stderr, proc
    # A Wait that times out on an unfinished checkpoint.
    raw.save(raw.tensor_rank("fin/pending", "w", [4], [0], [2], rank=0, world=2))
    code, msg = rpc_error(raw.stub.Wait, pb2.WaitRequest(checkpoint_id="fin/pending",
                                                         timeout_ms=300), timeout=10)
    assert code == "DEADLINE_EXCEEDED" and "did not finish in time" in msg, msg
    proc = d.ckptctl("wait", "fin/pending", "--timeout", "0.3", check=False)
    assert proc.returncode == 5, proc
    # Cancelling a committed checkpoint is refused.
    done = RawClient(d).save_valid("fin/done")
    code, msg = rpc_error(raw.stub.Cancel, pb2.CancelRequest(checkpoint_id=str(done)), timeout=10)
    assert code == "FAILED_PRECONDITION" and "already COMMITTED" in msg, msg
    assert (done / ".metadata").exists()
    assert_alive_and_saving(d)


# ---------------------------------------------------------------------------
# The socket.

def test_socket_permissions(make_daemon):
    d = make_daemon()
    assert stat.S_ISSOCK(os.stat(d.socket).st_mode)
    assert stat.S_IMODE(os.stat(d.socket).st_mode) == 0o660
    assert "(mode 660)" in d.log()
    d2 = make_daemon("strict", socket_mode="0600")
    assert stat.S_IMODE(os.stat(d2.socket).st_mode) == 0o600


def test_second_daemon_on_the_same_socket_refuses_to_start(make_daemon):
    d = make_daemon("first")
    other = make_daemon("second", start=False)
    other.socket = d.socket
    proc = subprocess.run(other.argv(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc
    assert f"another daemon is serving on {d.socket}" in proc.stderr, proc.stderr
    # The first one still serves on its socket.
    assert d.socket.exists()
    assert_alive_and_saving(d)

    # A file that is not a socket is not replaced either.
    not_socket = d.base / "plain-file"
    not_socket.write_text("keep me")
    other.socket = not_socket
    proc = subprocess.run(other.argv(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "is not a socket; refusing to replace it" in proc.stderr, proc
    assert not_socket.read_text() == "keep me"


def test_bad_configuration_exits_2(make_daemon):
    d = make_daemon(start=False, staging_budget="100K")
    proc = subprocess.run(d.argv(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "staging_budget: must be at least 1M" in proc.stderr, proc
    d = make_daemon("x", start=False, no_such_option=1)
    proc = subprocess.run(d.argv(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown option 'no_such_option'" in proc.stderr, proc


def test_log_names_the_callers_credentials(make_daemon):
    d = make_daemon()
    t = d.trainer("cred/ck")
    assert t.wait(60) == 0
    line = next(ln for ln in d.log().splitlines() if re.search(r"arena \d+ registered", ln))
    if not re.search(rf"pid[ =:]{t.proc.pid}\b", line) or \
            not re.search(rf"uid[ =:]{os.getuid()}\b", line):
        raise AssertionError(f"no pid {t.proc.pid} / uid {os.getuid()} in: {line}")
