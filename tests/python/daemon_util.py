"""Helpers for the end-to-end tests of the daemon (test_daemon_*.py): a real
`ckptd` process with per-test directories, real `ckptd_trainer` rank
processes, raw gRPC calls through Python stubs generated from
proto/ckptd/v1/daemon.proto at first use, and `verify_checkpoint`, which
checks a committed checkpoint payload by payload with torch 1.13's
torch.load against the trainer's value formula.

Executables come from $CKPTD_BUILD_DIR (default <repo>/build): bin/ckptd,
bin/ckptctl, tools/ckptd_trainer, tools/interop_tool.

Nothing here sleeps to synchronize: every wait polls a condition (the
daemon's log for start-up, GetStatus, a trainer's output, the file system)
against a deadline, and fails with the daemon's log when the deadline passes.
"""
import atexit
import dataclasses
import importlib.util
import inspect
import io
import itertools
import json
import os
import pathlib
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD_DIR = pathlib.Path(os.environ.get("CKPTD_BUILD_DIR", REPO / "build"))

sys.path.insert(0, str(REPO / "tests" / "interop"))
import interop_common  # noqa: E402  (runs executables; no torch import)
import sample_spec  # noqa: E402  (the value formula, pure Python)

# gRPC status codes by number (google.rpc.Code == absl::StatusCode).
CODE = {
    "OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5, "ALREADY_EXISTS": 6, "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9, "ABORTED": 10, "OUT_OF_RANGE": 11, "UNIMPLEMENTED": 12,
    "INTERNAL": 13, "UNAVAILABLE": 14,
}
FINAL_STATES = ("COMMITTED", "FAILED", "CANCELLED")


def bin_path(name):
    return BUILD_DIR / "bin" / name


def tool_path(name):
    return BUILD_DIR / "tools" / name


def need(path):
    if not pathlib.Path(path).exists():
        raise AssertionError(f"{path} is not built (build the project first, or set "
                             "CKPTD_BUILD_DIR)")
    return str(path)


def run(exe, *args, check=True, timeout=120):
    """interop_common.run_exe with this suite's shorter default timeout."""
    return interop_common.run_exe(exe, *args, check=check, timeout=timeout)


def spawn(argv, **kwargs):
    """subprocess.Popen, retried for a while if the executable is being
    relinked right now (EACCES / ETXTBSY: the build directory is shared)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return subprocess.Popen(argv, **{"stdin": subprocess.DEVNULL, **kwargs})
        except (PermissionError, OSError) as e:
            if e.errno not in (13, 26) or time.monotonic() > deadline:  # EACCES, ETXTBSY
                raise
            time.sleep(0.2)


def poll(cond, timeout, what, interval=0.01, on_timeout=None):
    """Calls cond() until it returns a truthy value (returned) or `timeout`
    seconds pass (AssertionError naming `what`, plus on_timeout())."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() >= deadline:
            extra = on_timeout() if on_timeout else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{extra}")
        time.sleep(interval)


# ---------------------------------------------------------------------------
# Protocol stubs, generated once per process.

_PB = None
_PB_LOCK = threading.Lock()


def pb():
    """(daemon_pb2, daemon_pb2_grpc) for proto/ckptd/v1/daemon.proto, made
    with protoc + grpc_python_plugin into a temporary directory, or, where
    those are missing (the GPU machine), the stubs a bundle carries
    ($CKPTD_BUILD_DIR/python_pb, made by run_on_gpu_machine.sh
    --make-bundle). The modules are loaded under private names so that no
    `ckptd` package is shadowed."""
    global _PB
    with _PB_LOCK:
        if _PB is not None:
            return _PB
        import grpc  # noqa: F401  (python3-grpcio: fail early if it is missing)
        gen = pathlib.Path(tempfile.mkdtemp(prefix="ckptd-e2e-pb-"))
        atexit.register(shutil.rmtree, gen, True)
        plugin = "/usr/bin/grpc_python_plugin"
        carried = pathlib.Path(os.environ.get("CKPTD_BUILD_DIR", "/nonexistent")) / "python_pb"
        if (shutil.which("protoc") is None or not os.path.exists(plugin)) \
                and (carried / "ckptd" / "v1" / "daemon_pb2.py").exists():
            shutil.copytree(carried, gen, dirs_exist_ok=True)
        else:
            subprocess.run(["protoc", f"--python_out={gen}", f"--grpc_out={gen}",
                            f"--plugin=protoc-gen-grpc={plugin}",
                            "-I", str(REPO / "proto"),
                            str(REPO / "proto" / "ckptd" / "v1" / "daemon.proto")],
                           check=True, capture_output=True, text=True)
        name = "ckptd_e2e_daemon_pb2"

        def load(mod_name, path):
            spec = importlib.util.spec_from_file_location(mod_name, path)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[mod_name] = mod
            spec.loader.exec_module(mod)
            return mod

        pb2 = load(name, gen / "ckptd" / "v1" / "daemon_pb2.py")
        src = (gen / "ckptd" / "v1" / "daemon_pb2_grpc.py").read_text()
        src = src.replace("from ckptd.v1 import daemon_pb2 as", f"import {name} as")
        assert f"import {name} as" in src, "unexpected grpc_python_plugin output"
        (gen / f"{name}_grpc.py").write_text(src)
        pb2_grpc = load(f"{name}_grpc", gen / f"{name}_grpc.py")
        _PB = (pb2, pb2_grpc)
        return _PB


def state_name(state):
    return pb()[0].CheckpointState.Name(state)


def rpc_error(fn, *args, **kwargs):
    """Calls fn and returns (code name, details) of the grpc.RpcError it
    raises; AssertionError if it succeeds."""
    import grpc
    try:
        resp = fn(*args, **kwargs)
    except grpc.RpcError as e:
        return e.code().name, e.details() or ""
    raise AssertionError(f"expected an error, got {resp!r}")


# ---------------------------------------------------------------------------
# The daemon.

class Daemon:
    """A `ckptd` process with its own socket, checkpoint root, shm directory
    and state directory under `base`. The log (stdout + stderr, appended
    across restarts) is base/ckptd.log."""

    _counter = itertools.count()

    def __init__(self, base, **flags):
        self.base = pathlib.Path(base)
        self.base.mkdir(parents=True, exist_ok=True)
        self.root = self.base / "ck"
        self.shm = self.base / "shm"
        self.state = self.base / "state"
        self.socket = self.base / "ckptd.sock"
        self._short_dir = None
        if len(str(self.socket)) > 100:  # sun_path is 108 bytes (+ ".arena")
            self._short_dir = pathlib.Path(tempfile.mkdtemp(prefix="ckd-", dir="/tmp"))
            self.socket = self._short_dir / "s.sock"
        # The daemon's default arena socket (fd-passing registration).
        self.arena_socket = pathlib.Path(str(self.socket) + ".arena")
        self.log_path = self.base / "ckptd.log"
        self.flags = dict(flags)
        self.address = None  # the peer address, once a peer service runs
        self.proc = None
        self.trainers = []
        self._channel = None
        self._stub = None
        self._log_file = None
        self._log_start = 0

    # -- process control --------------------------------------------------

    def argv(self):
        args = [need(bin_path("ckptd")), f"--socket={self.socket}",
                f"--checkpoint_roots={self.root}", f"--shm_dir={self.shm}",
                f"--state_dir={self.state}"]
        for k, v in self.flags.items():
            if isinstance(v, bool):
                v = "true" if v else "false"
            args.append(f"--{k}={v}")
        return args

    def start(self, timeout=30):
        assert self.proc is None or self.proc.poll() is not None, "daemon already running"
        self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._log_file = open(self.log_path, "ab")
        self.proc = spawn(self.argv(), stdout=self._log_file, stderr=subprocess.STDOUT)
        poll(lambda: self.proc.poll() is not None or "serving ckptd.v1" in self.log_since_start(),
             timeout, "the daemon to serve", on_timeout=self.log_tail)
        if self.proc.poll() is not None:
            raise AssertionError(f"ckptd exited {self.proc.returncode} at start-up:\n"
                                 f"{self.log_since_start()}")
        self._pin_peer_port(self.info())  # it answers
        return self

    def _pin_peer_port(self, info):
        """A peer service asked for on port 0 ("127.0.0.1:0", so that no
        other process can take a port picked in advance): its address is
        the daemon's GetInfo.peer_address (the daemon puts the bound port
        into a peer_advertise ending in ":0"), and restarts keep that port,
        as a real node's would."""
        listen = str(self.flags.get("peer_listen", ""))
        if not listen.endswith(":0"):
            return
        # info: GetInfo's answer (a subclass's may be ckptd.client's dict).
        peer_address = info["peer_address"] if isinstance(info, dict) else info.peer_address
        port = peer_address.rsplit(":", 1)[1]
        assert port.isdigit() and port != "0", f"peer_address {peer_address!r}"
        self.flags["peer_listen"] = listen[:-1] + port
        if str(self.flags.get("peer_advertise", "")).endswith(":0"):
            self.flags["peer_advertise"] = self.flags["peer_advertise"][:-1] + port
        self.address = peer_address

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def _close_channel(self):
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None

    def _reap(self, timeout):
        rc = self.proc.wait(timeout=timeout)
        if self._log_file:
            self._log_file.close()
            self._log_file = None
        return rc

    def stop(self, timeout=90):
        """SIGTERM; asserts a clean exit (status 0). Returns the status."""
        self._close_channel()
        if not self.running():
            rc = self.proc.returncode if self.proc else None
            raise AssertionError(f"daemon is not running (exit status {rc}):\n{self.log_tail()}")
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self._reap(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self._reap(10)
            raise AssertionError(f"ckptd did not exit within {timeout}s of SIGTERM:\n"
                                 f"{self.log_tail()}")
        assert rc == 0, f"ckptd exited {rc} after SIGTERM:\n{self.log_tail()}"
        return rc

    def kill(self):
        """SIGKILL, no questions asked."""
        self._close_channel()
        if self.running():
            self.proc.kill()
        if self.proc is not None:
            self._reap(30)

    def restart(self, timeout=30):
        if self.running():
            self.stop()
        return self.start(timeout)

    def close(self):
        """Teardown: kills the trainers and the daemon if still running."""
        for t in self.trainers:
            t.kill()
        self._close_channel()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self._reap(30)
        if self._log_file:
            self._log_file.close()
        if self._short_dir is not None:
            shutil.rmtree(self._short_dir, ignore_errors=True)

    def sanitizer_reports(self):
        """ASan/UBSan/LSan reports in the daemon's log or its trainers'
        stderr (an ASan build: CKPTD_BUILD_DIR=build-asan)."""
        pat = ("runtime error:", "AddressSanitizer", "LeakSanitizer", "UndefinedBehaviorSanitizer")
        texts = [("ckptd", self.log())] + [(f"trainer rank {t.rank}", t.stderr)
                                           for t in self.trainers]
        return [f"{who}: {ln}" for who, text in texts for ln in text.splitlines()
                if any(p in ln for p in pat)]

    # -- log ----------------------------------------------------------------

    def log(self):
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_since_start(self):
        if not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(self._log_start)
            return f.read().decode(errors="replace")

    def log_tail(self, n=60):
        return "--- ckptd log (tail) ---\n" + "\n".join(self.log().splitlines()[-n:])

    # -- gRPC ---------------------------------------------------------------

    def stub(self):
        if self._stub is None:
            import grpc
            _, pb2_grpc = pb()
            self._channel = grpc.insecure_channel(
                f"unix:{self.socket}",
                options=[("grpc.max_receive_message_length", 64 << 20),
                         ("grpc.max_send_message_length", 64 << 20)])
            self._stub = pb2_grpc.CheckpointDaemonStub(self._channel)
        return self._stub

    def info(self, timeout=10):
        return self.stub().GetInfo(pb()[0].GetInfoRequest(), timeout=timeout)

    def status(self, checkpoint_id, timeout=10):
        return self.stub().GetStatus(pb()[0].GetStatusRequest(checkpoint_id=str(checkpoint_id)),
                                     timeout=timeout)

    def try_status(self, checkpoint_id):
        """GetStatus, or None if the daemon does not know the checkpoint."""
        import grpc
        try:
            return self.status(checkpoint_id)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise

    def poll_status(self, checkpoint_id, pred, timeout=60, what=None):
        """Polls GetStatus until pred(status) holds; returns that status."""
        last = [None]

        def check():
            st = self.try_status(checkpoint_id)
            last[0] = st
            return st if st is not None and pred(st) else None

        return poll(check, timeout, what or f"a status of {checkpoint_id}",
                    on_timeout=lambda: f"last status: {last[0]}\n{self.log_tail()}")

    def wait_state(self, checkpoint_id, *states, timeout=60):
        return self.poll_status(checkpoint_id, lambda st: state_name(st.state) in states, timeout,
                                f"{checkpoint_id} to reach {states}")

    def wait_final(self, checkpoint_id, timeout=60):
        """The Wait RPC: the final status (COMMITTED, FAILED or CANCELLED)."""
        req = pb()[0].WaitRequest(checkpoint_id=str(checkpoint_id), timeout_ms=int(timeout * 1000))
        try:
            return self.stub().Wait(req, timeout=timeout + 10)
        except Exception as e:
            raise AssertionError(f"Wait({checkpoint_id}) failed: {e}\n{self.log_tail()}") from e

    def list(self, job="", include_disk=False):
        return list(self.stub().List(pb()[0].ListRequest(job=job, include_disk=include_disk),
                                     timeout=10).checkpoints)

    def cancel(self, checkpoint_id, reason=""):
        return self.stub().Cancel(pb()[0].CancelRequest(checkpoint_id=str(checkpoint_id),
                                                        reason=reason), timeout=10)

    def ckptctl(self, command, *args, check=True):
        """`ckptctl COMMAND --socket S ARGS...` (a daemon command)."""
        return run(bin_path("ckptctl"), command, "--socket", self.socket, *args, check=check)

    # -- trainers -------------------------------------------------------------

    def trainer(self, checkpoint, rank=0, world=1, **flags):
        t = Trainer(self, checkpoint, rank, world, **flags)
        self.trainers.append(t)
        return t

    def checkpoint_dir(self, checkpoint_id):
        p = pathlib.Path(checkpoint_id)
        return p if p.is_absolute() else self.root / p


class Trainer:
    """One `ckptd_trainer` rank process. Its stdout JSON lines are read by a
    thread; next_json() waits for the next one."""

    def __init__(self, daemon, checkpoint, rank, world, stdin=False, **flags):
        """stdin: give the process a pipe on stdin (send_line())."""
        self.rank = rank
        args = [need(tool_path("ckptd_trainer")), "--socket", str(daemon.socket),
                "--checkpoint", str(checkpoint), "--rank", str(rank), "--world", str(world)]
        for k, v in flags.items():
            opt = "--" + k.replace("_", "-")
            if k == "wait":
                if not v:
                    args.append("--no-wait")
            elif v is True:
                args.append(opt)
            elif v is False or v is None:
                continue
            else:
                args += [opt, str(v)]
        self.argv = args
        self.proc = spawn(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          stdin=subprocess.PIPE if stdin else subprocess.DEVNULL)
        self.lines = []       # every JSON line, in order
        self._queue = queue.Queue()
        self._stderr = []
        self._threads = [threading.Thread(target=self._read_stdout, daemon=True),
                         threading.Thread(target=self._read_stderr, daemon=True)]
        for t in self._threads:
            t.start()

    def _read_stdout(self):
        for line in self.proc.stdout:
            line = line.strip()
            if not line:
                continue
            try:
                doc = json.loads(line)
            except ValueError:
                doc = {"unparsed": line}
            self.lines.append(doc)
            self._queue.put(doc)
        self._queue.put(None)  # EOF

    def _read_stderr(self):
        for line in self.proc.stderr:
            self._stderr.append(line)

    @property
    def stderr(self):
        return "".join(self._stderr)

    def next_json(self, timeout=60):
        try:
            doc = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"rank {self.rank}: no output line within {timeout}s "
                                 f"(stderr: {self.stderr})") from None
        if doc is None:
            raise AssertionError(f"rank {self.rank} exited (status {self.proc.wait()}) without "
                                 f"another line; stderr: {self.stderr}")
        return doc

    def send_line(self, text=""):
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def wait(self, timeout=120):
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"rank {self.rank} did not exit within {timeout}s; "
                                 f"lines {self.lines}, stderr: {self.stderr}") from None
        for t in self._threads:
            t.join(timeout=10)
        return rc

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)

    def result(self):
        return {"rank": self.rank, "rc": self.proc.returncode, "lines": list(self.lines),
                "last": self.lines[-1] if self.lines else {}, "stderr": self.stderr}


def run_ranks(daemon, world, checkpoint, ranks=None, timeout=120, **flags):
    """Runs ranks (default: all of `world`) of checkpoint concurrently, each a
    ckptd_trainer with `flags` (--key-name value; True: a bare flag;
    wait=False: --no-wait), and returns their results (rank order): dicts
    with rc, lines (the JSON lines), last, stderr."""
    ranks = range(world) if ranks is None else ranks
    trainers = [daemon.trainer(checkpoint, r, world, **flags) for r in ranks]
    for t in trainers:
        t.wait(timeout)
    return [t.result() for t in trainers]


def assert_committed(results, daemon=None):
    for r in results:
        ok = r["rc"] == 0 and r["last"].get("state") == "COMMITTED"
        assert ok, (f"rank {r['rank']} exited {r['rc']}: lines {r['lines']}\nstderr: {r['stderr']}"
                    + (f"\n{daemon.log_tail()}" if daemon else ""))


# ---------------------------------------------------------------------------
# The trainer's state dict (mirrors tests/tools/ckptd_trainer.cc).

FLOAT_DTYPES = ("float64", "float32", "float16", "bfloat16")


def expected_box(torch, dtype, shape, seed, offsets=None, sizes=None):
    """The box of the formula tensor (sample_spec's formula, vectorized in
    torch): element i of the full tensor has v = (i * 31 + seed) % 251."""
    offsets = list(offsets) if offsets is not None else [0] * len(shape)
    sizes = list(sizes) if sizes is not None else list(shape)
    idx = torch.zeros(sizes, dtype=torch.int64)
    for d, (o, s, st) in enumerate(zip(offsets, sizes, sample_spec.c_strides(shape))):
        view = [1] * len(sizes)
        view[d] = s
        idx = idx + (torch.arange(o, o + s, dtype=torch.int64) * st).reshape(view)
    v = (idx * 31 + seed) % 251
    if dtype in FLOAT_DTYPES:
        return ((v - 125).to(torch.float64) / 4).to(getattr(torch, dtype))
    if dtype == "int64":
        return (v - 125) * 68719476767
    if dtype == "int32":
        return ((v - 125) * 16777259).to(torch.int32)
    if dtype == "int16":
        return ((v - 125) * 257).to(torch.int16)
    if dtype == "int8":
        return (v - 125).to(torch.int8)
    if dtype == "uint8":
        return v.to(torch.uint8)
    if dtype == "bool":
        return v % 2 == 1
    raise ValueError(dtype)


@dataclasses.dataclass
class TensorSpec:
    fqn: str
    dtype: str
    shape: list
    seed: int
    chunks: list  # [(rank, offsets, sizes)], as the ranks give them


@dataclasses.dataclass
class ObjectSpec:
    fqn: str
    value: object
    ranks: list


@dataclasses.dataclass
class TrainerSpec:
    """The state dict that `world` ckptd_trainer ranks save with these
    flags (the same keyword names as for run_ranks)."""
    world: int
    mb: float = 1
    tensors: int = 4
    dtype: str = "float32"
    layout: str = "rows"
    extra_items: int = 0
    step: int = 7

    @classmethod
    def of(cls, world, **flags):
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(world, **{k: v for k, v in flags.items() if k in fields})

    @property
    def rows(self):
        return max(1, int(self.mb * (1 << 20) * self.world / (self.tensors * 256 * 4.0)))

    def tensor_specs(self):
        dtypes = [d for d in self.dtype.split(",") if d]
        out = []
        for k in range(self.tensors):
            shape = [self.rows, 256]
            dim = 0 if self.layout == "rows" else 1
            chunks = []
            for r, (off, size) in enumerate(sample_spec.chunk_split(shape[dim], self.world)):
                if size == 0:
                    continue
                o, s = [0, 0], list(shape)
                o[dim], s[dim] = off, size
                chunks.append((r, o, s))
            out.append(TensorSpec(f"layers.{k}.weight", dtypes[k % len(dtypes)], shape, k, chunks))
        out.append(TensorSpec("embed", "float32", [64, 64], 1000,
                              [(r, [0, 0], [64, 64]) for r in range(self.world)]))
        for r in range(self.world):
            for j in range(self.extra_items):
                out.append(TensorSpec(f"extra.{r}.{j}", "float32", [16], 2000 + j,
                                      [(r, [0], [16])]))
        return out

    def object_specs(self):
        out = [ObjectSpec("step", self.step, list(range(self.world)))]
        for r in range(self.world):
            out.append(ObjectSpec(f"rank_state.{r}", {"rank": r, "name": f"rank {r}"}, [r]))
        return out

    def items_per_rank(self, rank):
        n = sum(1 for t in self.tensor_specs() for c in t.chunks if c[0] == rank)
        return n + sum(1 for o in self.object_specs() if rank in o.ranks)

    def tensor_bytes(self):
        """Data bytes of the distinct chunks (after dedup of replicated ones)."""
        total = 0
        for t in self.tensor_specs():
            boxes = {(tuple(o), tuple(s)) for _, o, s in t.chunks}
            total += sum(sample_spec.numel(s) for _, s in boxes) * sample_spec.ELEMENT_SIZE[t.dtype]
        return total

    def expected_nested(self, torch):
        """What `ckptctl convert` must produce: {fqn: full tensor or value}."""
        out = {t.fqn: expected_box(torch, t.dtype, t.shape, t.seed) for t in self.tensor_specs()}
        out.update({o.fqn: o.value for o in self.object_specs()})
        return out


# ---------------------------------------------------------------------------
# Verification of a committed checkpoint.

def list_items(directory):
    """`interop_tool list DIR --json` as {fqn: item}."""
    doc = json.loads(run(tool_path("interop_tool"), "list", directory, "--json").stdout)
    return {it["fqn"]: it for it in doc["items"]}


payload_slice = interop_common.payload_slice


def torch_load_payload(torch, data, weights_only=True):
    """torch.load of one payload, as stock FileSystemReader does (tensors with
    weights_only where this torch has it; bytes items without)."""
    kwargs = {"map_location": "cpu"}
    if "weights_only" in inspect.signature(torch.load).parameters:
        kwargs["weights_only"] = weights_only
    return torch.load(io.BytesIO(data), **kwargs)


def storage_entries(items):
    """[(fqn, storage)] of every chunk and bytes item."""
    out = []
    for fqn, it in items.items():
        if it["kind"] == "tensor":
            out += [(fqn, c["storage"]) for c in it["chunks"]]
        else:
            out.append((fqn, it["storage"]))
    return out


def verify_checkpoint(directory, spec, torch, convert=True, workdir=None):
    """Checks a committed checkpoint written by ckptd_trainer ranks with
    `spec` (a TrainerSpec):
      * `ckptctl verify` accepts it (structure, coverage, CRC-32s);
      * `interop_tool list --json` lists exactly the spec's items, each tensor
        with the distinct chunk boxes of its ranks (replicated ones once);
      * EVERY storage entry, sliced out of its file, torch.loads (torch 1.13)
        into exactly the formula's box (tensors: dtype, shape, bytes) or the
        expected Python value (bytes items);
      * the payloads tile the data files, and no other data file exists;
      * `ckptctl convert` + torch.load gives the whole state dict.
    Returns the listed items."""
    directory = pathlib.Path(directory)
    proc = run(bin_path("ckptctl"), "verify", directory, check=False)
    assert proc.returncode == 0, f"ckptctl verify {directory}: {proc.stdout}{proc.stderr}"
    items = list_items(directory)
    tensors = {t.fqn: t for t in spec.tensor_specs()}
    objects = {o.fqn: o for o in spec.object_specs()}
    assert set(items) == set(tensors) | set(objects), \
        (sorted(set(items) ^ (set(tensors) | set(objects))))
    for fqn, t in tensors.items():
        it = items[fqn]
        assert it["kind"] == "tensor", (fqn, it["kind"])
        assert (it["dtype"], it["shape"]) == (t.dtype, t.shape), (fqn, it["dtype"], it["shape"])
        want = sorted({(tuple(o), tuple(s)) for _, o, s in t.chunks})
        got = [(tuple(c["offsets"]), tuple(c["sizes"])) for c in it["chunks"]]
        assert sorted(got) == want, (fqn, got, want)  # also: each box stored once
        for c in it["chunks"]:
            data = payload_slice(directory, c["storage"])
            assert data[:4] == b"PK\x03\x04", (fqn, c)
            v = torch_load_payload(torch, data)
            assert isinstance(v, torch.Tensor), (fqn, type(v))
            assert str(v.dtype) == f"torch.{t.dtype}", (fqn, v.dtype)
            assert list(v.shape) == c["sizes"], (fqn, list(v.shape), c)
            expect = expected_box(torch, t.dtype, t.shape, t.seed, c["offsets"], c["sizes"])
            assert sample_spec.torch_bytes(v) == sample_spec.torch_bytes(expect), \
                (fqn, c["offsets"], c["sizes"])
    for fqn, o in objects.items():
        it = items[fqn]
        assert it["kind"] == "bytes", (fqn, it["kind"])
        data = payload_slice(directory, it["storage"])
        assert data[:4] == b"PK\x03\x04", fqn
        diff = sample_spec.strict_equal(torch_load_payload(torch, data, weights_only=False),
                                        o.value, fqn)
        assert diff is None, diff
    # The payloads are back to back and fill their files; no stray data file.
    spans = {}
    for _, st in storage_entries(items):
        spans.setdefault(st["file"], []).append((st["offset"], st["length"]))
    on_disk = sorted(p.name for p in directory.glob("__*.distcp"))
    assert sorted(spans) == on_disk, (sorted(spans), on_disk)
    for name, ss in spans.items():
        pos = 0
        for off, length in sorted(ss):
            assert off == pos, (name, sorted(ss))
            pos = off + length
        assert pos == (directory / name).stat().st_size, (name, pos)
    if convert:
        work = pathlib.Path(workdir) if workdir else directory.parent
        out = work / f"{directory.name}.converted.pt"
        run(bin_path("ckptctl"), "convert", directory, out, "--overwrite")
        try:
            got = torch.load(out, map_location="cpu")
        finally:
            out.unlink(missing_ok=True)
        diff = sample_spec.strict_equal(dict(got), spec.expected_nested(torch), "converted")
        assert diff is None, diff
    return items


def data_files(directory):
    """The DCP files left in a checkpoint directory (data files, .metadata
    and its .tmp); [] if the directory does not exist. (One listdir: the
    daemon's cleanup may remove the directory at any moment, also between
    an exists() and a listing.)"""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith("__") or n.startswith(".metadata"))


def data_bytes(directory):
    """Bytes in the __*.distcp files of a directory (0 if none)."""
    total = 0
    for p in pathlib.Path(directory).glob("__*.distcp"):
        try:
            total += p.stat().st_size
        except FileNotFoundError:
            pass
    return total


# ---------------------------------------------------------------------------
# Raw protocol calls (bad input, precise fault injection).

class ArenaError(Exception):
    """A refusal from the daemon's arena socket: .code (gRPC code name) and
    .message."""

    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


CODE_NAME = {v: k for k, v in CODE.items()}
ARENA_MAGIC = b"CKA1"


def encode_arena_request(size, owner=""):
    """The arena socket's request (shm/fd_passing.h)."""
    import struct
    o = owner.encode()
    return ARENA_MAGIC + struct.pack("<QI", size, len(o)) + o


def arena_socket_request(path, message, fds=(), timeout=10):
    """Sends one raw message (with `fds` attached, SCM_RIGHTS) on a fresh
    connection to the arena socket at `path`; returns the reply as
    (code name, arena id, message). For malformed registrations."""
    import socket
    import struct
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        if fds:
            socket.send_fds(s, [message], list(fds))
        else:
            s.send(message)
        reply = s.recv(4096)
    assert len(reply) >= 20 and reply[:4] == ARENA_MAGIC, reply
    code, arena_id, n = struct.unpack("<IQI", reply[4:20])
    assert len(reply) == 20 + n, reply
    return CODE_NAME.get(code, str(code)), arena_id, reply[20:].decode(errors="replace")


def memfd_arena(data, seal=True, name="pytest-arena"):
    """A memfd holding `data`, sealed against shrinking and growing as
    libckptd_client seals its arenas (seal=False: unsealed). Returns the fd
    (the caller closes it)."""
    import fcntl
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, len(data))
        os.pwrite(fd, data, 0)
        if seal:
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


class RawClient:
    """Builds SaveRequests by hand. Arenas are sealed memfds passed over the
    daemon's arena socket (register_fd); the legacy name-based gRPC
    RegisterArena (arena_file + register) is only for daemons started with
    allow_named_arenas."""

    _names = itertools.count()

    def __init__(self, daemon, own_channel=False):
        """own_channel: a connection of its own (no subchannel shared with
        the daemon's other channels), which close() really closes."""
        self.daemon = daemon
        self.pb2 = pb()[0]
        self.channel = None
        # Arenas registered over the arena socket: id -> memfd, kept open so
        # that a test can act on its own arena later (closed by close()).
        self.arena_fds = {}
        if own_channel:
            import grpc
            self.channel = grpc.insecure_channel(
                f"unix:{daemon.socket}", options=[("grpc.use_local_subchannel_pool", 1)])
            self.stub = pb()[1].CheckpointDaemonStub(self.channel)
        else:
            self.stub = daemon.stub()

    def close(self):
        if self.channel is not None:
            self.channel.close()
        self.channel = self.stub = None
        for fd in self.arena_fds.values():
            os.close(fd)
        self.arena_fds = {}

    def register_fd(self, fd, size, owner="pytest raw client"):
        """Registers memfd `fd` of `size` bytes over the arena socket; the
        arena id, or ArenaError with the daemon's code and message."""
        code, arena_id, msg = arena_socket_request(
            self.daemon.arena_socket, encode_arena_request(size, owner), [fd])
        if code != "OK":
            raise ArenaError(code, msg)
        assert arena_id != 0
        return arena_id

    def arena(self, data, seal=True):
        """Puts `data` into a new sealed memfd and registers it; the id. The
        fd stays open in self.arena_fds[id]."""
        fd = memfd_arena(data, seal=seal)
        try:
            arena_id = self.register_fd(fd, len(data))
        except BaseException:
            os.close(fd)
            raise
        self.arena_fds[arena_id] = fd
        return arena_id

    # -- legacy: by name (daemons with allow_named_arenas only) --------------

    def arena_file(self, data, name=None):
        name = name or f"raw-{os.getpid()}-{next(self._names)}"
        self.daemon.shm.mkdir(parents=True, exist_ok=True)
        (self.daemon.shm / name).write_bytes(data)
        return name

    def register(self, name, size, owner="pytest raw client"):
        """The name-based gRPC RegisterArena (FAILED_PRECONDITION unless the
        daemon runs with allow_named_arenas)."""
        return self.stub.RegisterArena(
            self.pb2.RegisterArenaRequest(name=name, size_bytes=size, owner=owner),
            timeout=10).arena_id

    def tensor(self, fqn, shape, offsets=None, sizes=None, dtype="float32", nbytes=None):
        offsets = list(offsets) if offsets is not None else [0] * len(shape)
        sizes = list(sizes) if sizes is not None else list(shape)
        if nbytes is None:
            nbytes = sample_spec.numel(sizes) * sample_spec.ELEMENT_SIZE.get(dtype, 4)
        return self.pb2.Item(fqn=fqn, type=self.pb2.ITEM_TYPE_TENSOR, dtype=dtype,
                             global_shape=list(shape), chunk_offsets=offsets,
                             chunk_sizes=sizes, nbytes=nbytes)

    def extent(self, item, item_offset, arena_offset, length):
        return self.pb2.Extent(item=item, item_offset=item_offset, arena_offset=arena_offset,
                               length=length)

    def request(self, checkpoint_id, rank=0, world=1, items=(), extents=(), arena_id=0,
                sequence=0, last=True, overwrite=False, job=""):
        return self.pb2.SaveRequest(
            checkpoint_id=str(checkpoint_id), job=job, rank=rank, world_size=world,
            sequence=sequence, items=list(items), arena_id=arena_id, extents=list(extents),
            last=last, options=self.pb2.SaveOptions(overwrite=overwrite))

    def save(self, req, timeout=30):
        return self.stub.Save(req, timeout=timeout)

    def save_error(self, req, timeout=30):
        return rpc_error(self.stub.Save, req, timeout=timeout)

    def tensor_rank(self, checkpoint_id, fqn, shape, offsets, sizes, rank=0, world=1, seed=1,
                    **kw):
        """A complete, valid rank: one float32 chunk with the formula's
        values, in one batch. Returns the SaveRequest."""
        data = sample_spec.box_bytes("float32", shape, seed, offsets, sizes)
        arena_id = self.arena(data + b"\0" * 64)
        return self.request(checkpoint_id, rank, world,
                            items=[self.tensor(fqn, shape, offsets, sizes)],
                            extents=[self.extent(0, 0, 0, len(data))], arena_id=arena_id, **kw)

    def save_valid(self, checkpoint_id, timeout=60):
        """A normal 1-rank save through the raw protocol; asserts it commits
        and that `ckptctl verify` accepts the directory. Returns the dir."""
        resp = self.save(self.tensor_rank(checkpoint_id, "w", [6, 5], [0, 0], [6, 5]))
        assert state_name(resp.state) == "STAGED", resp
        st = self.daemon.wait_final(resp.checkpoint_id, timeout)
        assert state_name(st.state) == "COMMITTED", (st, self.daemon.log_tail())
        proc = run(bin_path("ckptctl"), "verify", resp.checkpoint_id, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return pathlib.Path(resp.checkpoint_id)


# ---------------------------------------------------------------------------
# The HTTP endpoint (http_listen; docs/metrics.md).

def flip_bytes(path, offset, n=16):
    """Inverts `n` bytes of file `path` at `offset` in place (a damaged
    payload)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        chunk = f.read(n)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in chunk))


def http_port_in_log(text):
    """The port in the daemon's start-up log line "http endpoint listening
    on HOST:PORT" (http_listen with port 0), or None before that line."""
    import re
    m = re.search(r"http endpoint listening on \S+:(\d+) ", text)
    return int(m.group(1)) if m else None


def http_port(daemon, timeout=10):
    """The port of a Daemon's HTTP endpoint (http_port_in_log)."""
    return poll(lambda: http_port_in_log(daemon.log_since_start()), timeout,
                "the daemon's http endpoint log line", on_timeout=daemon.log_tail)


def http_get(port, path, host="127.0.0.1", timeout=10):
    """GET http://host:port/path; returns (status, headers dict, body str)
    for every status (404 and 503 included)."""
    import http.client
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read().decode()
    finally:
        conn.close()


def parse_prometheus_text(text):
    """{(name, frozenset of (label, value))): float} of a text-format 0.0.4
    body (label values unescaped); comments skipped."""
    import re
    samples = {}
    line_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
    label_re = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?')
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = line_re.match(line)
        assert m, f"unparseable metrics line: {line!r}"
        labels = frozenset(
            (k, v.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\"))
            for k, v in label_re.findall(m.group(2) or ""))
        samples[(m.group(1), labels)] = float(m.group(3))
    return samples


def ckptd_help_keys(exe):
    """The option keys `ckptd --help` lists (its --key flags)."""
    import re
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    keys = set(re.findall(r"^\s+--([a-z0-9_]+)\s", out.stdout, re.M))
    assert {"socket", "checkpoint_roots", "peer_listen"} <= keys, out.stdout
    return keys


def parse_ckptd_config(text):
    """key -> value of a ckptd config file, as daemon/config.cc reads it."""
    out = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if "=" not in line:
            raise ValueError(f"config line {n}: expected 'key = value', got {line!r}")
        k, v = line.split("=", 1)
        out[k.strip().replace("-", "_")] = v.strip()
    return out
