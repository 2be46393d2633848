"""The memory tier (memory_tier_bytes; daemon/tier/memory_tier.h,
docs/restore.md "Memory tier") on a real daemon with Debian's torch 1.13: a
trainer killed right after its commit restores, from a new process, the
exact values from the daemon's memory (the daemon reads next to nothing
from the data files: /proc/PID/io rchar); a data file changed after the
commit is never served from memory; eviction keeps each job's newest;
retention and overwrites drop what they replace; `ckptctl list` and the
metrics show it; with memory_tier_dir (a tmpfs directory), what the tier
held outlives a daemon restart (SIGTERM or SIGKILL) unless its checkpoint
changed meanwhile."""
import json
import os
import shutil
import tempfile
import subprocess
import sys

import pytest

import daemon_util as du
import pyclient_util

pyclient_util.setup_import()
torch = pytest.importorskip("torch") if os.environ.get("CKPTD_REQUIRE_TORCH") != "1" else \
    __import__("torch")
pytestmark = pytest.mark.skipif(pyclient_util.asan_build(), reason=pyclient_util.ASAN_SKIP_REASON)
import ckptd  # noqa: E402

# The state a trainer saves: N floats in two tensors, a bytes item, a step.
TRAINER = r"""
import os, sys, torch, ckptd
sock, ckdir, job, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
g = torch.Generator().manual_seed(n)
sd = {"w": torch.randn(n, generator=g), "b": torch.arange(n // 4, dtype=torch.int64),
      "step": n, "name": "run"}
st = ckptd.save(sd, ckdir, socket=sock, job=job)
print(st.state, flush=True)
os.kill(os.getpid(), 9)   # dies right after the commit, like a crashed trainer
"""


def expected(n):
    g = torch.Generator().manual_seed(n)
    return {"w": torch.randn(n, generator=g), "b": torch.arange(n // 4, dtype=torch.int64),
            "step": n, "name": "run"}


def dests(n):
    return {"w": torch.zeros(n), "b": torch.zeros(n // 4, dtype=torch.int64), "step": None,
            "name": None}


def crashed_trainer_saves(d, ckdir, job, n):
    p = subprocess.run([sys.executable, "-c", TRAINER, str(d.socket), str(ckdir), job, str(n)],
                       env=pyclient_util.env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == -9, (p.returncode, p.stdout, p.stderr)
    assert p.stdout.strip() == "COMMITTED", p.stdout


def rchar(pid):
    with open(f"/proc/{pid}/io") as f:
        return int(next(ln for ln in f if ln.startswith("rchar:")).split()[1])


def listed(d, *flags):
    out = d.ckptctl("list", "--json", *flags).stdout
    return {c["checkpoint_id"]: c.get("memory_tier_bytes", 0) for c in json.loads(out)}


def memory_served(port):
    samples = du.parse_prometheus_text(du.http_get(port, "/metrics")[2])
    return samples.get(("ckptd_restore_bytes_total", frozenset({("source", "memory")})), 0)


def memory_lent(port):
    samples = du.parse_prometheus_text(du.http_get(port, "/metrics")[2])
    return samples.get(("ckptd_restore_bytes_total", frozenset({("source", "lent")})), 0)


def restore_exact_from_memory(d, port, ckdir, n):
    """Restores `ckdir` (a TRAINER state of `n`) through the daemon, checks
    every value, and returns what the daemon read of the checkpoint's files
    for it: its rchar less what the tier served. The daemon reads held bytes
    from its held files with pread (the ends of records for the CRC-32
    check), which rchar counts too; the tier counts as served every byte it
    read or checked from memory, at least that."""
    served = memory_served(port)
    before = rchar(d.proc.pid)
    sd = dests(n)
    ckptd.load(sd, str(ckdir), socket=str(d.socket), via_daemon=True)
    read = rchar(d.proc.pid) - before - (memory_served(port) - served)
    want = expected(n)
    assert torch.equal(sd["w"], want["w"]) and torch.equal(sd["b"], want["b"])
    assert sd["step"] == n and sd["name"] == "run"
    return read


def test_a_trainer_killed_after_its_commit_restores_from_memory(make_daemon, monkeypatch):
    d = make_daemon(memory_tier_bytes="64M", http_listen="127.0.0.1:0")
    port = du.http_port(d)
    n = 2 << 20                                       # 8 MiB + 4 MiB of tensors
    ckdir = d.root / "run" / "step_100"
    crashed_trainer_saves(d, ckdir, "run", n)
    stored = sum(p.stat().st_size for p in ckdir.glob("*.distcp"))
    held = listed(d)
    assert held.get(str(ckdir), 0) >= stored, held
    assert "IN MEMORY" in d.ckptctl("list").stdout
    # The restarted trainer (this process) restores through the daemon.
    read = restore_exact_from_memory(d, port, ckdir, n)
    want = expected(n)
    # What the daemon read of the checkpoint's files: .metadata, not the data.
    assert read < stored // 20, (read, stored)
    assert memory_served(port) >= 3 * n, memory_served(port)
    # The index says the checkpoint is held (the client then cuts smaller
    # batches: whole records need no arena room).
    index, _ = ckptd.client(str(d.socket)).restore_index(str(ckdir))
    assert index.get("memory_tier_bytes", 0) >= stored, index.get("memory_tier_bytes")
    # Whole records are lent: the trainer copied w (4n bytes) and b (2n)
    # straight out of the daemon's held file.
    assert memory_lent(port) == 6 * n, memory_lent(port)
    # Smaller batches: w is cut into parts along its dimension; each part is
    # one range of w's record and is lent too, as is b, whole.
    monkeypatch.setenv(ckptd._restore.BATCH_ENV, str(3 * n // 2))
    sd = dests(n)
    ckptd.load(sd, str(ckdir), socket=str(d.socket), via_daemon=True)
    assert torch.equal(sd["w"], want["w"]) and torch.equal(sd["b"], want["b"])
    assert ckptd._restore.last_stats().batches >= 4
    assert memory_lent(port) == 12 * n, memory_lent(port)
    ckptd.close_clients()


def test_a_data_file_changed_after_the_commit_is_not_served_from_memory(make_daemon):
    d = make_daemon(memory_tier_bytes="64M", http_listen="127.0.0.1:0")
    port = du.http_port(d)
    n = 1 << 18
    ckdir = d.root / "run" / "step_1"
    crashed_trainer_saves(d, ckdir, "run", n)
    assert listed(d)[str(ckdir)] > 0
    data = next(ckdir.glob("*.distcp"))
    du.flip_bytes(data, data.stat().st_size // 3)    # inside the payload
    with pytest.raises(ckptd.DataLoss) as e:
        ckptd.load(dests(n), str(ckdir), socket=str(d.socket), via_daemon=True)
    assert data.name in e.value.message
    assert memory_served(port) == 0
    assert "changed since its commit; reading it from storage" in d.log_since_start()
    ckptd.close_clients()


def test_eviction_keeps_each_jobs_newest_and_retention_drops(make_daemon):
    # Room for two checkpoints of 3 * 64 KiB blocks (a file of ~300 KB).
    d = make_daemon(memory_tier_bytes=str(2 * 448 * 1024))
    n = 1 << 16                                       # 256 KiB + 64 KiB
    a1, b1, a2 = d.root / "A" / "s1", d.root / "B" / "s1", d.root / "A" / "s2"
    crashed_trainer_saves(d, a1, "A", n)
    crashed_trainer_saves(d, b1, "B", n)
    assert listed(d)[str(a1)] > 0 and listed(d)[str(b1)] > 0
    crashed_trainer_saves(d, a2, "A", n)
    held = listed(d)
    assert held[str(a1)] == 0 and held[str(b1)] > 0 and held[str(a2)] > 0, held
    assert "memory tier: evicted " + str(a1) in d.log_since_start()
    # a1 (evicted) still restores, from storage.
    sd = dests(n)
    ckptd.load(sd, str(a1), socket=str(d.socket), via_daemon=True)
    assert torch.equal(sd["w"], expected(n)["w"])
    # Retention deletes a2: the tier lets it go with it.
    st = ckptd.save(expected(n), str(d.root / "A" / "s3"), socket=str(d.socket), job="A",
                    keep_last_n=1)
    assert st.checkpoint_id == str(d.root / "A" / "s3")
    du.poll(lambda: not a2.exists(), 20, f"retention to delete {a2}")
    held = listed(d)
    assert held.get(str(a2), 0) == 0 and held[str(d.root / "A" / "s3")] > 0, held
    # An overwrite replaces what was held of the directory.
    s3 = d.root / "A" / "s3"
    other = {"w": torch.ones(n), "b": torch.zeros(n // 4, dtype=torch.int64), "step": 0,
             "name": "x"}
    ckptd.save(other, str(s3), socket=str(d.socket), job="A", overwrite=True)
    sd = dests(n)
    ckptd.load(sd, str(s3), socket=str(d.socket), via_daemon=True)
    assert torch.equal(sd["w"], torch.ones(n)) and sd["name"] == "x"
    ckptd.close_clients()


@pytest.fixture
def tier_dir():
    """A memory_tier_dir on tmpfs (/dev/shm), removed at teardown."""
    base = tempfile.mkdtemp(prefix="ckptd-tier-", dir="/dev/shm")
    yield os.path.join(base, "tier")
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_held_checkpoints_outlive_a_daemon_restart(make_daemon, tier_dir, how):
    d = make_daemon(memory_tier_bytes="64M", memory_tier_dir=tier_dir,
                    http_listen="127.0.0.1:0")
    n = 2 << 20                                       # 8 MiB + 4 MiB of tensors
    kept, changed = d.root / "run" / "step_1", d.root / "other" / "step_1"
    crashed_trainer_saves(d, kept, "run", n)
    crashed_trainer_saves(d, changed, "other", n)
    stored = sum(p.stat().st_size for p in kept.glob("*.distcp"))
    assert listed(d)[str(kept)] >= stored and listed(d)[str(changed)] > 0
    if how == "sigterm":
        d.stop()
    else:
        d.kill()
    # While the daemon is down, one of `changed`'s data files is replaced by
    # a copy of itself: the same bytes in another file, which the new daemon
    # must not take for the one it held.
    f = next(changed.glob("*.distcp"))
    copy = f.with_name(f.name + ".copy")
    shutil.copyfile(f, copy)
    os.replace(copy, f)
    d.start()
    log = d.log_since_start()
    assert "memory tier: adopted 1 of 2 entries of memory_tier_dir" in log, log
    assert f"{f} changed since the commit" in log, log
    # Only `kept` is held: `ckptctl list --include-disk` (the jobs' recorded
    # checkpoints: the daemon's own list starts empty) says so, and the tier
    # uses its blocks, a little more than its files.
    held = listed(d, "--include-disk")
    assert held.get(str(kept), 0) >= stored and held.get(str(changed), -1) == 0, held
    port = du.http_port(d)
    samples = du.parse_prometheus_text(du.http_get(port, "/metrics")[2])
    used = samples[("ckptd_memory_tier_bytes", frozenset({("kind", "used")}))]
    assert stored <= used < stored + (8 << 20), (used, stored)
    # The next restore of `kept` reads next to nothing of its data files.
    read = restore_exact_from_memory(d, port, kept, n)
    assert read < stored // 20, (read, stored)
    assert memory_served(port) + memory_lent(port) >= 3 * n
    # `changed` restores from storage, exact.
    want = expected(n)
    sd = dests(n)
    ckptd.load(sd, str(changed), socket=str(d.socket), via_daemon=True)
    assert torch.equal(sd["w"], want["w"]) and torch.equal(sd["b"], want["b"])
    ckptd.close_clients()
    # The store holds one entry (kept's) and the lock.
    assert len([e for e in os.listdir(tier_dir) if e != ".lock"]) == 1

