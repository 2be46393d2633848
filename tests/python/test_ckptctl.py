"""ckptctl inspect / verify / convert against real checkpoints, checked with
Debian's torch 1.13.

The checkpoint comes from ckptd_demo (4 ranks, row-sharded weights,
replicated biases and 0-d scales, bytes items with planner_data paths).
The expected state dict is assembled independently in Python: every payload
slice listed by `ckptctl inspect --json` is loaded with torch.load and placed
at its chunk offsets.

The daemon commands' live progress (`status --follow`, on a pipe, as JSON
Lines and on a pseudo-terminal), their exit codes, and `cancel` on a node
that forwards it to the multi-node coordinator run against real daemons
(tests/python/daemon_util.py) and real trainer ranks.
"""
import io
import json
import os
import pathlib
import shutil
import signal
import subprocess

import pytest

BUILD_DIR = pathlib.Path(os.environ.get("CKPTD_BUILD_DIR",
                                        pathlib.Path(__file__).resolve().parents[2] / "build"))


def bin_path(name):
    return BUILD_DIR / "bin" / name


@pytest.fixture(scope="module")
def demo_ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckptctl")
    ckpt = root / "step_1000"
    exe = bin_path("ckptd_demo")
    if not exe.exists():
        pytest.fail(f"{exe} not built")
    subprocess.run([str(exe), "--dir", str(ckpt), "--size-mb", "4", "--save-ranks", "4",
                    "--load-ranks", "3"], check=True, capture_output=True)
    return ckpt


def copy_ckpt(src, dst):
    shutil.copytree(src, dst)
    return dst


def inspect_json(ckptctl, path):
    return json.loads(ckptctl("inspect", path, "--json").stdout)


def assemble_from_payloads(torch, ckpt, info):
    """The full state (flat fqn → tensor / object) from individual payloads."""
    out = {}
    for t in info["tensors"]:
        dtype = getattr(torch, t["dtype"])
        full = torch.empty(t["shape"], dtype=dtype)
        for c in t["chunks"]:
            with open(ckpt / c["file"], "rb") as f:
                f.seek(c["offset"])
                blob = f.read(c["length"])
            piece = torch.load(io.BytesIO(blob))
            assert list(piece.shape) == c["sizes"]
            assert piece.dtype == dtype
            view = full
            for d, (o, s) in enumerate(zip(c["offsets"], c["sizes"])):
                view = view.narrow(d, o, s)
            view.copy_(piece)
        out[t["fqn"]] = full
    for b in info["bytes_items"]:
        with open(ckpt / b["file"], "rb") as f:
            f.seek(b["offset"])
            blob = f.read(b["length"])
        out[b["fqn"]] = torch.load(io.BytesIO(blob))
    return out


def test_verify_ok(ckptctl, demo_ckpt):
    proc = ckptctl("verify", demo_ckpt)
    assert proc.stdout.startswith("OK ")
    assert "CRC-32 verified" in proc.stdout
    rep = json.loads(ckptctl("verify", demo_ckpt, "--json").stdout)
    assert rep["ok"] is True
    assert rep["tensors"] == 24 and rep["bytes_items"] == 4 and rep["files"] == 4
    assert rep["crc_bytes"] >= 4 << 20


def test_inspect_json_structure(ckptctl, demo_ckpt):
    info = inspect_json(ckptctl, demo_ckpt)
    tensors = {t["fqn"]: t for t in info["tensors"]}
    w = tensors["model.layers.0.weight"]
    assert w["dtype"] == "float32" and len(w["chunks"]) == 4
    # Row-sharded over 4 ranks, each chunk in its rank's file.
    rows = w["shape"][0] // 4
    for r, c in enumerate(sorted(w["chunks"], key=lambda c: c["offsets"][0])):
        assert c["offsets"] == [r * rows, 0]
        assert c["file"] == f"__{r}_0.distcp"
    # Replicated tensors were saved once (deduplicated).
    assert len(tensors["model.layers.0.bias"]["chunks"]) == 1
    assert tensors["model.layers.0.norm.scale"]["shape"] == []
    assert info["planner_data"]["optim.param_groups.0.lr"] == ["optim", "param_groups", 0, "lr"]
    assert info["planner_data"]["model.layers.0.weight"] == ["model", "layers.0.weight"]
    human = ckptctl("inspect", demo_ckpt, "--chunks").stdout
    assert "model.layers.0.weight" in human and "__3_0.distcp @" in human
    assert "optim.param_groups.0.betas" in human and "(0.9, 0.95)" in human


def test_convert_equals_payloads_loaded_by_torch(torch, ckptctl, demo_ckpt, tmp_path):
    info = inspect_json(ckptctl, demo_ckpt)
    expected = assemble_from_payloads(torch, demo_ckpt, info)
    out = tmp_path / "full.pt"
    ckptctl("convert", demo_ckpt, out)
    sd = torch.load(out)
    # Nested as planner_data says: {"model": {...}, "optim": {"param_groups": [..]}, "step": n}
    assert set(sd) == {"model", "optim", "step"}
    assert sd["step"] == 1000 == expected["step"]
    assert sd["optim"]["param_groups"] == [{"lr": 3e-4, "betas": (0.9, 0.95), "weight_decay": 0.1}]
    assert sd["optim"]["param_groups"][0]["lr"] == expected["optim.param_groups.0.lr"]
    assert len(sd["model"]) == 24
    for name, t in sd["model"].items():
        ref = expected["model." + name]
        assert t.dtype == ref.dtype and t.shape == ref.shape
        assert torch.equal(t, ref), name
    # Refuses to clobber without --overwrite; replaces with it.
    proc = ckptctl("convert", demo_ckpt, out, check=False)
    assert proc.returncode == 1 and "exists" in proc.stderr
    ckptctl("convert", demo_ckpt, out, "--overwrite")


def test_verify_detects_flipped_payload_byte(ckptctl, demo_ckpt, tmp_path):
    ckpt = copy_ckpt(demo_ckpt, tmp_path / "c")
    info = inspect_json(ckptctl, ckpt)
    c = info["tensors"][0]["chunks"][0]
    path = ckpt / c["file"]
    data = bytearray(path.read_bytes())
    pos = c["offset"] + c["length"] // 2  # inside the tensor data record
    data[pos] ^= 0xFF
    path.write_bytes(bytes(data))
    proc = ckptctl("verify", ckpt, check=False)
    assert proc.returncode == 1
    assert "CRC-32" in proc.stderr and c["file"] in proc.stderr, proc.stderr
    assert proc.stderr.strip().endswith("1 problem")
    # --no-crc checks structure only and passes.
    assert ckptctl("verify", ckpt, "--no-crc", check=False).returncode == 0


def test_verify_detects_truncated_file(ckptctl, demo_ckpt, tmp_path):
    ckpt = copy_ckpt(demo_ckpt, tmp_path / "c")
    path = ckpt / "__2_0.distcp"
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 100)
    proc = ckptctl("verify", ckpt, check=False)
    assert proc.returncode == 1
    assert "__2_0.distcp" in proc.stderr and "past the end of the file" in proc.stderr, proc.stderr


def test_verify_detects_missing_file(ckptctl, demo_ckpt, tmp_path):
    ckpt = copy_ckpt(demo_ckpt, tmp_path / "c")
    (ckpt / "__1_0.distcp").unlink()
    proc = ckptctl("verify", ckpt, check=False)
    assert proc.returncode == 1
    assert "__1_0.distcp" in proc.stderr, proc.stderr


@pytest.mark.parametrize("cut", [0, 1, 10, 100, -1])
def test_verify_detects_corrupt_metadata(ckptctl, demo_ckpt, tmp_path, cut):
    ckpt = copy_ckpt(demo_ckpt, tmp_path / "c")
    md = ckpt / ".metadata"
    data = md.read_bytes()
    md.write_bytes(data[:cut] if cut >= 0 else data[:-1])
    proc = ckptctl("verify", ckpt, check=False)
    assert proc.returncode == 1
    assert ".metadata" in proc.stderr, proc.stderr


def test_not_a_checkpoint(ckptctl, tmp_path):
    proc = ckptctl("verify", tmp_path / "missing", check=False)
    assert proc.returncode == 3
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = ckptctl("verify", empty, check=False)
    assert proc.returncode == 1 and "no .metadata" in proc.stderr
    proc = ckptctl("inspect", empty, check=False)
    assert proc.returncode == 3 and "no .metadata" in proc.stderr
    assert ckptctl("bogus", check=False).returncode == 2


# ---------------------------------------------------------------------------
# `ckptctl status --follow / --json` and `ckptctl cancel` against a real
# daemon (tests/python/daemon_util.py) saving through real trainer ranks.

import errno  # noqa: E402
import fcntl  # noqa: E402
import pty  # noqa: E402
import re  # noqa: E402
import select  # noqa: E402
import struct  # noqa: E402
import termios  # noqa: E402
import time  # noqa: E402

import daemon_util as du  # noqa: E402

# Fields every `status --json` object carries (one-shot and per poll).
PROGRESS_FIELDS = ("checkpoint_id", "state", "phase", "bytes", "bytes_total", "progress",
                   "rate", "eta_seconds", "final", "time_unix_ms", "ranks_staged",
                   "world_size", "num_nodes", "nodes_planned", "nodes_prepared",
                   "staged_bytes", "written_bytes", "total_bytes")
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")  # anything but \n


def ckptctl_argv(d, *args):
    return [du.need(du.bin_path("ckptctl")), *map(str, args), "--socket", str(d.socket)]


def start_slow_save(d, name, world=2, mb=2):
    """Trainer ranks saving `name` (world x mb MiB) through `d`; returns the
    checkpoint id once the daemon knows it."""
    ckdir, last = start_save_but_the_last_rank(d, name, world, mb)
    last()
    return ckdir


def start_save_but_the_last_rank(d, name, world=2, mb=2):
    """As start_slow_save, without the last rank: the checkpoint waits for
    it (STAGING) until the returned function starts it. A test that must see
    the save before it ends holds it so, whatever the machine's speed."""
    ckdir = d.root / name
    for r in range(world - 1):
        d.trainer(name, r, world, mb=mb)
    d.poll_status(ckdir, lambda st: True, timeout=30, what=f"{ckdir} to be known")
    return ckdir, lambda: d.trainer(name, world - 1, world, mb=mb)


def test_status_follow_plain_until_committed(make_daemon):
    # 2 x 2 MiB written at 4 MiB/s: about a second of progress to follow.
    d = make_daemon(write_rate_limit="4M")
    ckdir = start_slow_save(d, "fo/plain")
    t0 = time.monotonic()
    proc = subprocess.run(ckptctl_argv(d, "status", ckdir, "--follow", "--interval", "0.1"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert time.monotonic() - t0 < 30
    lines = proc.stdout.splitlines()
    assert lines and lines[-1].startswith("COMMITTED 100.0% "), proc.stdout
    assert "ranks 2/2 staged" in lines[-1], lines[-1]
    # Not a terminal: plain lines, no carriage returns or escapes.
    assert not CONTROL.search(proc.stdout), repr(proc.stdout)
    assert all(re.match(r"^(PENDING|STAGING|STAGED|WRITING|COMMITTING|COMMITTED) ", ln)
               for ln in lines), lines
    # A line per change only: no two identical lines in a row.
    assert all(a != b for a, b in zip(lines, lines[1:])), lines
    # Following a finished checkpoint prints its final line and exits 0.
    again = d.ckptctl("status", ckdir, "-f")
    assert again.stdout.splitlines() == [lines[-1]], (again.stdout, lines[-1])


def test_status_json_one_shot_and_follow_json_lines(make_daemon):
    d = make_daemon(write_rate_limit="4M")
    ckdir, last_rank = start_save_but_the_last_rank(d, "fo/json")
    # One-shot while it runs: one (pretty-printed) object.
    one = json.loads(d.ckptctl("status", ckdir, "--json").stdout)
    for f in PROGRESS_FIELDS:
        assert f in one, (f, one)
    assert one["checkpoint_id"] == str(ckdir) and one["world_size"] == 2
    # --follow --json: one object per line (JSON Lines), one per poll. The
    # last rank starts once the first line is out, so some lines show the
    # save running.
    proc = subprocess.Popen(ckptctl_argv(d, "status", ckdir, "--follow", "--json",
                                         "--interval", "0.1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready, "ckptctl status --follow --json printed nothing in 60 s"
        first_line = proc.stdout.readline()
        last_rank()
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (first_line, rest, err)
    docs = [json.loads(ln) for ln in (first_line + rest).splitlines()]
    assert len(docs) >= 2, first_line + rest
    for doc in docs:
        for f in PROGRESS_FIELDS:
            assert f in doc, (f, doc)
        assert doc["phase"] in ("staging", "writing", "committing", "done"), doc
        assert doc["rate"] is None or doc["rate"] >= 0
        assert doc["eta_seconds"] is None or doc["eta_seconds"] >= 0
    assert all(not doc["final"] for doc in docs[:-1])
    last = docs[-1]
    assert last["state"] == "COMMITTED" and last["final"] is True and last["phase"] == "done"
    assert last["bytes"] == last["bytes_total"] == last["file_bytes"] > 0
    assert last["progress"] == 1.0 and last["rate"] is None and last["eta_seconds"] is None
    times = [doc["time_unix_ms"] for doc in docs]
    assert times == sorted(times)
    # Some poll while writing saw a rate (the 5 s window, or the average).
    writing = [doc for doc in docs if doc["phase"] == "writing" and doc["bytes"] > 0]
    assert any(doc["rate"] for doc in writing) or not writing, docs
    # One-shot of the committed checkpoint.
    one = json.loads(d.ckptctl("status", ckdir, "--json").stdout)
    assert one["state"] == "COMMITTED" and one["progress"] == 1.0 and one["final"] is True


def read_pty(master, proc, timeout, until=None):
    """Everything the child writes to its pseudo-terminal until it exits
    (or, with `until`, until the output holds that string)."""
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if until is not None and until.encode() in out:
            break
        r, _, _ = select.select([master], [], [], 0.1)
        if r:
            try:
                chunk = os.read(master, 65536)
            except OSError as e:  # EIO: the child closed its side
                if e.errno != errno.EIO:
                    raise
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    return out.decode(errors="replace")


def test_status_follow_on_a_terminal_redraws_a_bar(make_daemon):
    d = make_daemon(write_rate_limit="2M")
    ckdir, last_rank = start_save_but_the_last_rank(d, "fo/tty", mb=1)
    master, slave = pty.openpty()
    # A 100-column terminal (TIOCGWINSZ); $COLUMNS must not win over it.
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    env = dict(os.environ, COLUMNS="40")
    proc = subprocess.Popen(ckptctl_argv(d, "status", ckdir, "--follow", "--interval", "0.1"),
                            stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    try:
        # The first frame shows the save waiting for its last rank.
        out = read_pty(master, proc, 60, until="\x1b[K")
        last_rank()
        out += read_pty(master, proc, 60)
        assert proc.wait(30) == 0, out
    finally:
        os.close(master)
    # Redrawn in place: carriage return, the line, clear to end of line.
    frames = [f for f in out.split("\r") if f.strip()]
    assert out.count("\x1b[K") >= 2, repr(out)
    assert len(frames) >= 2, repr(out)
    bars = [f for f in frames if re.search(r" \[[#.]{8,}\] ", f)]
    assert bars, repr(out)
    for f in frames:
        line = f.replace("\x1b[K", "").rstrip("\n")
        assert len(line) <= 99, (len(line), line)  # fits the 100 columns
    final = frames[-1].replace("\x1b[K", "")
    assert final.startswith("COMMITTED [") and "100.0%" in final, repr(final)
    assert re.search(r"\[#+\]", final), repr(final)  # a full bar
    assert out.endswith("\n"), repr(out[-40:])  # the line is ended at exit


def test_status_follow_exit_codes_on_cancel_and_timeout(make_daemon):
    d = make_daemon(write_rate_limit="1M")
    ckdir = start_slow_save(d, "fo/cancel", mb=4)
    # --timeout: still running after it, exit 5.
    proc = d.ckptctl("status", ckdir, "--follow", "--timeout", "0.3", "--interval", "0.1",
                     check=False)
    assert proc.returncode == 5 and "--timeout" in proc.stderr, proc
    # --interval / --timeout need --follow (usage: 2).
    assert d.ckptctl("status", ckdir, "--interval", "1", check=False).returncode == 2
    assert d.ckptctl("status", ckdir, "-f", "--interval", "0", check=False).returncode == 2
    follower = subprocess.Popen(ckptctl_argv(d, "status", ckdir, "--follow", "--json",
                                             "--interval", "0.1"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.3)
        d.ckptctl("cancel", ckdir, "--reason", "pytest follow")
        out, err = follower.communicate(timeout=30)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 6, (follower.returncode, out, err)
    last = json.loads(out.splitlines()[-1])
    assert last["state"] == "CANCELLED" and "pytest follow" in last["error"], last
    assert "was cancelled" in err and "pytest follow" in err, err
    # Human --follow of the cancelled checkpoint: 6 as well.
    proc = d.ckptctl("status", ckdir, "--follow", check=False)
    assert proc.returncode == 6 and proc.stdout.startswith("CANCELLED"), proc
    # Unknown checkpoint and no daemon keep their codes under --follow.
    assert d.ckptctl("status", "nope", "-f", check=False).returncode == 4
    gone = du.run(du.bin_path("ckptctl"), "status", ckdir, "-f", "--socket",
                  d.base / "none.sock", check=False)
    assert gone.returncode == 3, gone


def test_status_follow_ctrl_c_ends_the_line(make_daemon):
    d = make_daemon(write_rate_limit="512K")
    ckdir = start_slow_save(d, "fo/int", mb=2)
    master, slave = pty.openpty()
    proc = subprocess.Popen(ckptctl_argv(d, "status", ckdir, "--follow", "--interval", "0.1"),
                            stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    try:
        out = b""
        deadline = time.monotonic() + 20
        while b"\x1b[K" not in out and time.monotonic() < deadline:
            if select.select([master], [], [], 0.1)[0]:
                out += os.read(master, 65536)
        assert b"\x1b[K" in out, out
        proc.send_signal(signal.SIGINT)
        out = (out.decode(errors="replace") + read_pty(master, proc, 10))
        assert proc.wait(10) == 130, out
    finally:
        os.close(master)
    assert out.endswith("\n"), repr(out[-60:])  # the progress line was ended


# -- cancel on a node that forwards it to the coordinator --------------------

TOKEN = "pytest-ckptctl-shared-token-3b9e"


def test_cancel_forwarded_to_the_coordinator_says_so(make_daemon, tmp_path):
    """Node 1 has written and prepared its part and waits for the
    coordinator (node 0, writing slowly): its daemon only forwards a cancel.
    ckptctl says so and reports the state the coordinator decided."""
    shared = tmp_path / "shared"
    shared.mkdir()
    daemons = []
    for n, rate in enumerate(["16K", "0"]):
        token = tmp_path / f"token{n}"
        token.write_text(TOKEN + "\n")
        os.chmod(token, 0o600)
        d = make_daemon(f"node{n}", start=False, peer_listen="127.0.0.1:0",
                        peer_advertise="127.0.0.1:0", peer_token_file=token,
                        peer_timeout="5s", peer_heartbeat="200ms", stage_timeout="20s",
                        commit_timeout="60s", write_rate_limit=rate)
        d.root = shared
        daemons.append(d)
    for d in daemons:
        d.start()
    world = 4
    for n, d in enumerate(daemons):
        local = [2 * n, 2 * n + 1]
        for r in local:
            d.trainer("job/fwd", r, world, mb=0.25, coordinator=daemons[0].address,
                      local_ranks=",".join(map(str, local)), num_nodes=2, timeout=60)
    ckdir = shared / "job" / "fwd"
    du.poll(lambda: "prepared, waiting for the coordinator's decision" in daemons[1].log(),
            30, "node 1 to prepare", on_timeout=daemons[1].log_tail)
    assert du.state_name(daemons[0].status(ckdir).state) not in du.FINAL_STATES

    proc = daemons[1].ckptctl("cancel", ckdir, "--reason", "operator on node 1", check=False)
    assert proc.returncode == 0, (proc.stdout, proc.stderr, daemons[1].log_tail())
    assert f"forwarded to the coordinator {daemons[0].address}" in proc.stdout, proc.stdout
    assert proc.stdout.splitlines()[-1] == (
        f"cancelled {ckdir} (by the coordinator {daemons[0].address})"), proc.stdout
    for d in daemons:
        st = d.wait_final(ckdir, timeout=15)
        assert du.state_name(st.state) == "CANCELLED", (st, d.log_tail())
        assert "operator on node 1" in st.error
    # Asking again: refused (already final), exit 1.
    again = daemons[1].ckptctl("cancel", ckdir, "--json", check=False)
    assert again.returncode == 1 and json.loads(again.stdout)["ok"] is False, again
    assert not (ckdir / ".metadata").exists()
