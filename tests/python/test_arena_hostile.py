"""Hostile clients against a real `ckptd` through the arena socket: arenas
are sealed memfds passed with SCM_RIGHTS; a client cannot shrink its
registered arena (so it cannot SIGBUS the daemon), cannot have an unsealed
or foreign file mapped, cannot register another user's
arena file by name over gRPC, cannot take every arena slot (per-uid quota),
and cannot wedge the listener by connecting and saying nothing. After each
case the daemon is alive and a normal save commits.
"""
import fcntl
import mmap
import os
import socket
import stat
import struct
import time

import pytest

import daemon_util as du
from daemon_util import (ArenaError, RawClient, arena_socket_request, encode_arena_request,
                         memfd_arena, rpc_error, state_name)


def assert_alive_and_saving(d, checkpoint_id="ok/after"):
    assert d.running(), d.log_tail()
    assert d.info().pid == d.proc.pid
    RawClient(d).save_valid(checkpoint_id)


def test_arena_socket_is_advertised_with_the_socket_mode(make_daemon):
    d = make_daemon()
    info = d.info()
    assert info.arena_socket == str(d.arena_socket)
    assert not info.named_arenas
    st = os.stat(d.arena_socket)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o660


def test_truncate_after_register_then_save(make_daemon):
    """A truncated arena: register, ftruncate(0) through the kept fd, Save.
    The seal refuses the shrink (EPERM); the save commits the real bytes
    and the daemon keeps serving."""
    d = make_daemon()
    raw = RawClient(d)
    req = raw.tensor_rank("hostile/trunc", "w", [64, 64], [0, 0], [64, 64])
    fd = raw.arena_fds[req.arena_id]
    with pytest.raises(PermissionError):
        os.ftruncate(fd, 0)
    with pytest.raises(PermissionError):
        os.truncate(f"/proc/self/fd/{fd}", 0)
    resp = raw.save(req)
    assert state_name(resp.state) == "STAGED", resp
    with pytest.raises(PermissionError):
        os.ftruncate(fd, 0)  # and between "staged" and the write
    st = d.wait_final(resp.checkpoint_id, 30)
    assert state_name(st.state) == "COMMITTED", (st, d.log_tail())
    proc = du.run(du.bin_path("ckptctl"), "verify", resp.checkpoint_id, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_alive_and_saving(d)


def test_unsealed_and_foreign_descriptors_are_refused(make_daemon, tmp_path):
    d = make_daemon()
    raw = RawClient(d)
    plain = tmp_path / "plain"
    plain.write_bytes(b"p" * 8192)
    cases = []
    cases.append(("unsealed memfd", memfd_arena(b"\0" * 8192, seal=False), 8192,
                  "not sealed against shrinking"))
    cases.append(("short memfd", memfd_arena(b"\0" * 4096), 8192, "smaller than the claimed 8192"))
    cases.append(("plain file", os.open(plain, os.O_RDONLY | os.O_CLOEXEC), 8192, "memfd"))
    r, w = os.pipe()
    os.close(w)
    cases.append(("pipe", r, 4096, "not a regular file"))
    for what, fd, size, needle in cases:
        try:
            with pytest.raises(ArenaError) as e:
                raw.register_fd(fd, size)
        finally:
            os.close(fd)
        assert e.value.code == "INVALID_ARGUMENT", (what, e.value)
        assert needle in e.value.message, (what, e.value.message)
    # The unsealed attack itself: had the daemon taken it, this truncate
    # would make its next read SIGBUS.
    fd = memfd_arena(b"\1" * 8192, seal=False)
    with pytest.raises(ArenaError):
        raw.register_fd(fd, 8192)
    os.ftruncate(fd, 0)
    os.close(fd)
    assert "refused" in d.log_since_start()
    assert_alive_and_saving(d)


def test_malformed_requests_are_refused(make_daemon):
    d = make_daemon()
    fd = memfd_arena(b"\0" * 4096)
    good = encode_arena_request(4096, "raw")
    try:
        cases = [
            ("no fd", good, [], "exactly one"),
            ("two fds", good, [fd, fd], "exactly one"),
            ("bad magic", b"XXXX" + good[4:], [fd], "magic"),
            ("short", b"CKA1", [fd], "header"),
            ("too long", good + b"x" * 4096, [fd], "longer than"),
            ("owner length lies", good[:12] + struct.pack("<I", 200) + good[16:], [fd],
             "header says"),
            ("size 0", encode_arena_request(0, "raw"), [fd], "size must be positive"),
        ]
        for what, message, fds, needle in cases:
            code, arena_id, msg = arena_socket_request(d.arena_socket, message, fds)
            assert code == "INVALID_ARGUMENT", (what, code, msg)
            assert arena_id == 0 and needle in msg, (what, msg)
        code, arena_id, msg = arena_socket_request(d.arena_socket, good, [fd])
        assert code == "OK" and arena_id != 0, msg
    finally:
        os.close(fd)
    assert_alive_and_saving(d)


def test_named_registration_over_grpc_is_refused(make_daemon):
    """The confused deputy: by name over gRPC, a client could have another
    user's 0600 arena file mapped into its checkpoint. Refused by default."""
    d = make_daemon()
    raw = RawClient(d)
    d.shm.mkdir(parents=True, exist_ok=True)
    victim = d.shm / "victim-arena"
    victim.write_bytes(b"secret" * 1000)
    os.chmod(victim, 0o600)
    if os.getuid() == 0:
        os.chown(victim, 65534, 65534)
    code, msg = rpc_error(raw.register, "victim-arena", 4096)
    assert code == "FAILED_PRECONDITION", msg
    assert "arena socket" in msg and str(d.arena_socket) in msg, msg
    assert victim.exists(), "untouched (a registration would have unlinked it)"
    assert_alive_and_saving(d)


def test_per_uid_arena_quota(make_daemon):
    d = make_daemon(max_arenas_per_client=2, max_arena_bytes_per_client="1M")
    raw = RawClient(d)
    raw.arena(b"\0" * 4096)
    raw.arena(b"\0" * 4096)
    with pytest.raises(ArenaError) as e:
        raw.arena(b"\0" * 4096)
    assert e.value.code == "RESOURCE_EXHAUSTED", e.value
    assert f"uid {os.getuid()}" in e.value.message, e.value.message
    assert "max_arenas_per_client = 2" in e.value.message, e.value.message
    if os.getuid() == 0:
        # A real second user still can: a child that becomes uid 65534.
        # (The child connects by a relative name from inside the socket's
        # directory, so the 0700 directories above it do not matter.)
        os.chmod(d.arena_socket, 0o666)
        os.chmod(d.arena_socket.parent, 0o711)
        pid = os.fork()
        if pid == 0:
            rc = 1
            try:
                os.chdir(d.arena_socket.parent)
                os.setgid(65534)
                os.setuid(65534)
                fd = memfd_arena(b"\0" * 4096)
                code, arena_id, _ = arena_socket_request(d.arena_socket.name,
                                                         encode_arena_request(4096, "other"),
                                                         [fd])
                rc = 0 if code == "OK" and arena_id else 2
            finally:
                os._exit(rc)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    # Releasing one frees a slot.
    first = next(iter(raw.arena_fds))
    raw.stub.ReleaseArena(raw.pb2.ReleaseArenaRequest(arena_id=first), timeout=10)
    raw.arena(b"\0" * 4096)


def test_silent_clients_do_not_block_registrations(make_daemon):
    d = make_daemon()
    silent = []
    for _ in range(8):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(str(d.arena_socket))
        silent.append(s)
    try:
        raw = RawClient(d)
        start = time.monotonic()
        raw.arena(b"\0" * 4096)
        assert time.monotonic() - start < 2, "served while 8 clients say nothing"
    finally:
        for s in silent:
            s.close()
    assert_alive_and_saving(d)


def test_trainer_uses_the_arena_socket(make_daemon):
    """The client library (ckptd_trainer) registers sealed memfds: nothing
    is created in shm_dir and the log shows the kernel-verified peer."""
    d = make_daemon()
    t = d.trainer("hostile/trainer")
    assert t.wait(60) == 0, (t.lines, t.stderr)
    assert "(SO_PEERCRED)" in d.log_since_start(), d.log_tail()
    assert not d.shm.exists() or not any(d.shm.iterdir())
