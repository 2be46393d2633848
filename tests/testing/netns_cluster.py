#!/usr/bin/env python3
"""A cluster of ckptd nodes on one machine, each in its own network namespace.

Every node gets its own network stack: a namespace with `lo` and one
interface `eth0` (10.X.Y.<i+1>/24), the other end of whose veth pair sits
on one bridge in the root namespace. Nodes reach each other only through
that bridge, so `link_down(i)` (the bridge-side end of node i's veth pair
set down) is a real partition of node i: its daemon and trainers keep
running and see their own address, but no packet crosses. Each node has its
own daemon (`build/bin/ckptd` run with `ip netns exec`), state, shm and
socket directories and config file; all nodes share ONE checkpoint
directory (`<workdir>/shared`, the same host directory, as NFS would be)
and one peer token file (mode 0600).

Needs root and `ip netns` (iproute2). `skip_reason()` says why not, for a
test's skip. Python 3 standard library only. Names carry a random instance
id (`ckn<6 hex>`: bridge `ckn<id>b`, veth ends `ckn<id>h<i>` / `...p<i>`,
namespaces `ckn<id>-<i>`), so parallel runs never collide; everything is
removed on `close()` (also from `with`, and at exit), and
`python3 netns_cluster.py down` removes what a killed run left behind.

API (the whole of it):

    from netns_cluster import NetnsCluster, skip_reason
    with NetnsCluster(3, workdir, build_dir, daemon_options={"peer_timeout": "2s"},
                      node_options={2: {"write_rate_limit": "64K"}}) as c:
        c.start_daemon(i)            # ckptd in node i's namespace; waits until healthy
        c.stop_daemon(i, sig=signal.SIGTERM, timeout=60)  # -> exit status
        c.kill(i); c.sigstop(i); c.sigcont(i)   # the daemon's process
        c.link_down(i); c.link_up(i)  # partition / heal node i
        c.node_ip(i); c.socket(i); c.peer_address(i); c.node_dir(i); c.shared
        c.popen(i, argv, env=None, **popen_kwargs)   # a command in node i's namespace
        c.run_torch2(i, argv, env=None, root=None, **popen_kwargs)
            # argv inside node i's namespace AND a torch 2.x Debian root
            # (scripts/torch2_chroot.sh run; root defaults to
            # $CKPTD_TORCH2_ROOT or /var/cache/ckptd/torch2-sid); the repo
            # and /tmp are at their own paths there, so workdir must be
            # under /tmp or the repository
        c.wait_healthy(i, timeout=30)   # GET /healthz on the node's own loopback
        c.metrics(i) -> str; c.metric(i, name, **labels) -> float   # GET /metrics
        c.trainer_env(i) -> {"CKPTD_SOCKET":..., "GLOO_SOCKET_IFNAME": "eth0", ...}
        c.log(i) -> the daemon's log

`daemon_options` are ckptd config keys for every node (docs/configuration.md;
defaults: DEFAULT_OPTIONS, short test timeouts), `node_options` per node
overrides; `c.set_option(i, key, value)` changes one for the next start. The
daemon's HTTP endpoint listens on 127.0.0.1:9400 in each namespace (every
namespace has its own loopback, so the port is the same on every node), the
peer service on <node ip>:7070.

CLI (JSON on stdout; for shell scripts and C++ tests through system()):

    netns_cluster.py up N --workdir DIR [--build B] [--opt KEY=VALUE ...] [--start]
        # state in DIR/cluster.json; nothing is removed when the command exits
    netns_cluster.py info|down --state DIR/cluster.json
    netns_cluster.py start|stop|kill|sigstop|sigcont|link-down|link-up --state F I
    netns_cluster.py exec --state F I -- CMD...    # exit status of CMD
    netns_cluster.py down [--all]     # leftovers of dead owners (all: every ckn*)
    netns_cluster.py check            # self-test: ping via the bridge, a cut, cleanup
"""
import argparse
import atexit
import json
import os
import pathlib
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time

PREFIX = "ckn"
REGISTRY = pathlib.Path("/run/ckptd-netns")
REPO = pathlib.Path(__file__).resolve().parents[2]
PEER_PORT = 7070
HTTP_PORT = 9400
DEFAULT_TORCH2_ROOT = "/var/cache/ckptd/torch2-sid"
# Short timeouts for tests; a test overrides any of them.
DEFAULT_OPTIONS = {
    "peer_timeout": "3s", "peer_heartbeat": "200ms", "stage_timeout": "30s",
    "commit_timeout": "15s", "shutdown_grace": "5s", "cuda": "off",
    "staging_budget": "256M", "restore_gather_timeout": "3s",
}

_SKIP = None


def _ip(*args, check=True, timeout=20):
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def skip_reason():
    """None where clusters can be made here, else why not (for pytest.skip)."""
    global _SKIP
    if _SKIP is not None:
        return _SKIP or None
    reason = ""
    if os.geteuid() != 0:
        reason = "network namespaces need root (not root here)"
    elif shutil.which("ip") is None:
        reason = "no `ip` (iproute2) on PATH"
    else:
        probe = f"{PREFIX}probe{os.getpid() % 100000}"
        r = _ip("netns", "add", probe, check=False)
        if r.returncode != 0:
            reason = f"`ip netns add` fails here: {r.stderr.strip()}"
        else:
            v = _ip("-n", probe, "link", "add", "v0", "type", "veth", "peer", "name", "v1",
                    check=False)
            if v.returncode != 0:
                reason = f"veth pairs cannot be made here: {v.stderr.strip()}"
            _ip("netns", "delete", probe, check=False)
    _SKIP = reason
    return reason or None


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _ns_pids(ns):
    r = _ip("netns", "pids", ns, check=False)
    return [int(p) for p in r.stdout.split()] if r.returncode == 0 else []


def _remove_instance(cid):
    """Kills every process in the instance's namespaces, deletes its links and
    namespaces and its registry entry. Returns what it removed."""
    removed = []
    nss = [n for n in _ip("netns", "list", check=False).stdout.split()
           if n.startswith(f"{PREFIX}{cid}-")]
    for ns in nss:
        pids = _ns_pids(ns)
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while any(_pid_alive(p) and not _is_zombie(p) for p in pids) and \
                time.monotonic() < deadline:
            time.sleep(0.02)
    links = re.findall(rf"^\d+: ({PREFIX}{cid}[a-z0-9]*)[@:]",
                       _ip("-o", "link", "show", check=False).stdout, re.M)
    for link in sorted(set(links), key=lambda s: s.endswith("b")):  # veths, then bridge
        if _ip("link", "delete", link, check=False).returncode == 0:
            removed.append(link)
    for ns in nss:
        if _ip("netns", "delete", ns, check=False).returncode == 0:
            removed.append(ns)
    try:
        (REGISTRY / f"{cid}.json").unlink()
    except FileNotFoundError:
        pass
    return removed


def _is_zombie(pid):
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] == "Z"
    except (FileNotFoundError, IndexError):
        return True


def _instances():
    """Instance ids with a namespace, link or registry entry here."""
    ids = set(re.findall(rf"^{PREFIX}([0-9a-f]{{6}})-\d+",
                         _ip("netns", "list", check=False).stdout, re.M))
    ids |= set(re.findall(rf"^\d+: {PREFIX}([0-9a-f]{{6}})[bhp]",
                          _ip("-o", "link", "show", check=False).stdout, re.M))
    if REGISTRY.is_dir():
        ids |= {p.stem for p in REGISTRY.glob("*.json")}
    return sorted(ids)


def cleanup_leftovers(everything=False):
    """Removes the instances whose owner process is gone (everything: all)."""
    removed = {}
    for cid in _instances():
        owner = None
        try:
            owner = json.loads((REGISTRY / f"{cid}.json").read_text()).get("owner")
        except (FileNotFoundError, ValueError):
            pass
        if everything or owner is None or not _pid_alive(owner):
            removed[cid] = _remove_instance(cid)
    return removed


class NetnsCluster:
    """n nodes, each in its own network namespace (module docstring)."""

    def __init__(self, n, workdir, build_dir=None, daemon_options=None, node_options=None,
                 keep=False, _state=None):
        reason = skip_reason()
        if reason:
            raise RuntimeError(f"cannot make a namespace cluster: {reason}")
        self.n = n
        self.workdir = pathlib.Path(workdir).resolve()
        self.build_dir = pathlib.Path(build_dir or os.environ.get("CKPTD_BUILD_DIR")
                                      or REPO / "build").resolve()
        self.shared = self.workdir / "shared"
        self.procs = {}  # node -> Popen of its daemon (this process's starts)
        self.others = []  # popen()/run_torch2() processes, killed on close
        self._closed = False
        if _state is not None:  # attach (CLI)
            self.id = _state["id"]
            self.subnet = _state["subnet"]
            self.options = [dict(o) for o in _state["options"]]
            return
        self.id = secrets.token_hex(3)
        rnd = int(self.id, 16)
        self.subnet = f"10.{200 + rnd % 50}.{(rnd >> 8) % 256}"
        base = dict(DEFAULT_OPTIONS, **(daemon_options or {}))
        self.options = [dict(base, **(node_options or {}).get(i, {})) for i in range(n)]
        REGISTRY.mkdir(parents=True, exist_ok=True)
        (REGISTRY / f"{self.id}.json").write_text(json.dumps(
            {"owner": None if keep else os.getpid(), "workdir": str(self.workdir)}))
        if not keep:
            atexit.register(self.close)
        try:
            self._make_dirs()
            self._make_network()
        except BaseException:
            self.close()
            raise
        self._save_state()

    # -- names and paths ------------------------------------------------------

    @property
    def bridge(self):
        return f"{PREFIX}{self.id}b"

    def ns(self, i):
        return f"{PREFIX}{self.id}-{i}"

    def host_if(self, i):
        return f"{PREFIX}{self.id}h{i}"

    def node_ip(self, i):
        return f"{self.subnet}.{i + 1}"

    def peer_address(self, i):
        return f"{self.node_ip(i)}:{PEER_PORT}"

    def node_dir(self, i):
        return self.workdir / f"node{i}"

    def socket(self, i):
        return self.node_dir(i) / "ckptd.sock"

    def config_path(self, i):
        return self.node_dir(i) / "ckptd.conf"

    def log_path(self, i):
        return self.node_dir(i) / "ckptd.log"

    def log(self, i):
        p = self.log_path(i)
        return p.read_text(errors="replace") if p.exists() else ""

    def trainer_env(self, i):
        """What a trainer on node i needs: its daemon's socket, gloo on eth0."""
        return {"CKPTD_SOCKET": str(self.socket(i)), "GLOO_SOCKET_IFNAME": "eth0",
                "MASTER_ADDR": self.node_ip(0)}

    # -- set-up ---------------------------------------------------------------

    def _make_dirs(self):
        if len(str(self.socket(0))) > 100:
            raise ValueError(f"workdir {self.workdir} is too long for a unix socket path")
        self.shared.mkdir(parents=True, exist_ok=True)
        token = self.workdir / "peer_token"
        token.write_text(secrets.token_hex(16) + "\n")
        os.chmod(token, 0o600)
        for i in range(self.n):
            for sub in ("state", "shm"):
                (self.node_dir(i) / sub).mkdir(parents=True, exist_ok=True)

    def _make_network(self):
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")
        for i in range(self.n):
            ns, h, p = self.ns(i), self.host_if(i), f"{PREFIX}{self.id}p{i}"
            _ip("netns", "add", ns)
            _ip("link", "add", h, "type", "veth", "peer", "name", p)
            _ip("link", "set", h, "master", self.bridge)
            _ip("link", "set", h, "up")
            _ip("link", "set", p, "netns", ns)
            _ip("-n", ns, "link", "set", p, "name", "eth0")
            _ip("-n", ns, "addr", "add", f"{self.node_ip(i)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def _save_state(self):
        (self.workdir / "cluster.json").write_text(json.dumps(self.describe(), indent=1))

    def describe(self):
        return {"id": self.id, "n": self.n, "subnet": self.subnet, "bridge": self.bridge,
                "workdir": str(self.workdir), "shared": str(self.shared),
                "build_dir": str(self.build_dir), "options": self.options,
                "nodes": [{"ns": self.ns(i), "ip": self.node_ip(i),
                           "peer_address": self.peer_address(i),
                           "socket": str(self.socket(i)), "dir": str(self.node_dir(i)),
                           "http": f"127.0.0.1:{HTTP_PORT}", "pid": self.daemon_pid(i)}
                          for i in range(self.n)]}

    @classmethod
    def attach(cls, state_file):
        """The cluster that `up` described in state_file (cluster.json)."""
        st = json.loads(pathlib.Path(state_file).read_text())
        return cls(st["n"], st["workdir"], st["build_dir"], _state=st)

    # -- daemons ----------------------------------------------------------------

    def set_option(self, i, key, value=None):
        """Sets (value None: removes) node i's daemon option for its next start."""
        if value is None:
            self.options[i].pop(key, None)
        else:
            self.options[i][key] = value
        self._save_state()

    def _write_config(self, i):
        d = self.node_dir(i)
        conf = {"socket": self.socket(i), "checkpoint_roots": self.shared,
                "shm_dir": d / "shm", "state_dir": d / "state",
                "peer_listen": self.peer_address(i), "peer_advertise": self.peer_address(i),
                "peer_token_file": self.workdir / "peer_token",
                "http_listen": f"127.0.0.1:{HTTP_PORT}", **self.options[i]}
        self.config_path(i).write_text("".join(f"{k} = {v}\n" for k, v in conf.items()))

    def _pid_file(self, i):
        return self.node_dir(i) / "ckptd.pid"

    def daemon_pid(self, i):
        p = self.procs.get(i)
        if p is not None:
            return p.pid if p.poll() is None else None
        try:
            pid = int(self._pid_file(i).read_text())
        except (FileNotFoundError, ValueError):
            return None
        return pid if _pid_alive(pid) and not _is_zombie(pid) else None

    def start_daemon(self, i, timeout=30, wait=True):
        if self.daemon_pid(i) is not None:
            raise RuntimeError(f"node {i}'s daemon is already running (pid {self.daemon_pid(i)})")
        exe = self.build_dir / "bin" / "ckptd"
        if not exe.exists():
            raise FileNotFoundError(f"{exe} is not built")
        self._write_config(i)
        log = open(self.log_path(i), "ab")
        log.write(f"=== harness: start {time.strftime('%H:%M:%S')} ===\n".encode())
        log.flush()
        # `ip netns exec` execs ckptd itself: the Popen's pid is the daemon's.
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns(i), str(exe),
                                 "--config", str(self.config_path(i))],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        log.close()
        self.procs[i] = proc
        self._pid_file(i).write_text(str(proc.pid))
        self._save_state()
        if wait:
            self.wait_healthy(i, timeout)
        return proc.pid

    def _wait_exit(self, i, pid, timeout):
        p = self.procs.get(i)
        if p is not None and p.pid == pid:
            try:
                return p.wait(timeout)
            except subprocess.TimeoutExpired:
                return None
        deadline = time.monotonic() + timeout
        while _pid_alive(pid) and not _is_zombie(pid):
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)
        return -1  # not our child: status unknown

    def stop_daemon(self, i, sig=signal.SIGTERM, timeout=60):
        """Sends sig to node i's daemon and waits for it to exit; returns its
        exit status (negative: killed by a signal). TimeoutError names it."""
        pid = self.daemon_pid(i)
        if pid is None:
            raise RuntimeError(f"node {i}'s daemon is not running\n{self.log_tail(i)}")
        os.kill(pid, sig)
        if sig == signal.SIGTERM:
            os.kill(pid, signal.SIGCONT)  # a stopped daemon must see its SIGTERM
        rc = self._wait_exit(i, pid, timeout)
        if rc is None:
            raise TimeoutError(f"node {i}'s daemon (pid {pid}) did not exit within {timeout}s "
                               f"of signal {sig}\n{self.log_tail(i)}")
        self._pid_file(i).unlink(missing_ok=True)
        return rc

    def kill(self, i):
        return self.stop_daemon(i, signal.SIGKILL, timeout=30)

    def _signal(self, i, sig):
        pid = self.daemon_pid(i)
        if pid is None:
            raise RuntimeError(f"node {i}'s daemon is not running")
        os.kill(pid, sig)

    def sigstop(self, i):
        self._signal(i, signal.SIGSTOP)

    def sigcont(self, i):
        self._signal(i, signal.SIGCONT)

    def log_tail(self, i, n=40):
        return f"--- node {i} ckptd log (tail) ---\n" + "\n".join(self.log(i).splitlines()[-n:])

    # -- the network -------------------------------------------------------------

    def link_down(self, i):
        """Partitions node i: the bridge-side end of its veth pair goes down."""
        _ip("link", "set", self.host_if(i), "down")

    def link_up(self, i):
        _ip("link", "set", self.host_if(i), "up")

    # -- commands in a node ------------------------------------------------------

    def _env(self, env):
        e = dict(os.environ)
        e.update({k: str(v) for k, v in (env or {}).items()})
        return e

    def popen(self, i, argv, env=None, **kwargs):
        """subprocess.Popen of argv inside node i's namespace (its own session;
        killed on close)."""
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        kwargs.setdefault("start_new_session", True)
        p = subprocess.Popen(["ip", "netns", "exec", self.ns(i), *map(str, argv)],
                             env=self._env(env), **kwargs)
        self.others.append(p)
        return p

    def run_torch2(self, i, argv, env=None, root=None, **kwargs):
        """argv inside node i's namespace and a torch 2.x Debian root
        (scripts/torch2_chroot.sh run, whose mounts stay private to this
        command: `ip netns exec` gives it its own mount namespace). Only the
        variables in env (and HOME, PATH, LANG, TMPDIR) reach argv."""
        root = str(root or os.environ.get("CKPTD_TORCH2_ROOT") or DEFAULT_TORCH2_ROOT)
        script_env = {"CKPTD_TORCH2_ROOT": root, "CKPTD_TORCH2_SUITE": "x"}
        inner = ["env", *(f"{k}={v}" for k, v in (env or {}).items()), *map(str, argv)]
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        kwargs.setdefault("start_new_session", True)
        p = subprocess.Popen(["ip", "netns", "exec", self.ns(i), "bash",
                              str(REPO / "scripts" / "torch2_chroot.sh"), "run", *inner],
                             env=self._env(script_env), **kwargs)
        self.others.append(p)
        return p

    def _http(self, i, path, timeout):
        code = ("import sys,urllib.request\n"
                f"print(urllib.request.urlopen('http://127.0.0.1:{HTTP_PORT}{path}',"
                f"timeout={timeout}).read().decode(),end='')")
        r = subprocess.run(["ip", "netns", "exec", self.ns(i), sys.executable, "-c", code],
                           capture_output=True, text=True, timeout=timeout + 10)
        if r.returncode != 0:
            raise RuntimeError(f"GET {path} on node {i} failed: {r.stderr.strip()[-400:]}")
        return r.stdout

    def wait_healthy(self, i, timeout=30):
        """Waits until node i's daemon answers GET /healthz with 200 (one
        poller inside the namespace); RuntimeError with its log otherwise."""
        code = ("import sys,time,urllib.request\n"
                f"d=time.monotonic()+{timeout}\n"
                "while True:\n"
                "  try:\n"
                f"    urllib.request.urlopen('http://127.0.0.1:{HTTP_PORT}/healthz',timeout=2)"
                ".read(); sys.exit(0)\n"
                "  except Exception as e:\n"
                "    if time.monotonic()>d: print(e); sys.exit(1)\n"
                "    time.sleep(0.05)\n")
        poller = subprocess.Popen(["ip", "netns", "exec", self.ns(i), sys.executable, "-c", code],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + timeout + 10
        while poller.poll() is None:
            if self.daemon_pid(i) is None or time.monotonic() > deadline:
                poller.kill()
                break
            time.sleep(0.05)
        out = poller.communicate()[0]
        if poller.returncode != 0:
            raise RuntimeError(f"node {i}'s daemon not healthy within {timeout}s "
                               f"(GET /healthz: {out.strip()[-300:]})\n{self.log_tail(i)}")

    def metrics(self, i, timeout=10):
        """The text of node i's GET /metrics."""
        return self._http(i, "/metrics", timeout)

    def metric(self, i, name, **labels):
        """The sum of node i's samples of metric `name` whose labels include
        `labels` (0.0 if none)."""
        total = 0.0
        for line in self.metrics(i).splitlines():
            m = re.match(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)", line)
            if not m or m.group(1) != name:
                continue
            have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            if all(have.get(k) == str(v) for k, v in labels.items()):
                total += float(m.group(3))
        return total

    # -- teardown ----------------------------------------------------------------

    def close(self):
        """Kills every process of the cluster; removes namespaces, links and
        the registry entry (the workdir stays: it is the caller's)."""
        if self._closed:
            return
        self._closed = True
        for p in self.others:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        _remove_instance(self.id)
        for p in [*self.others, *self.procs.values()]:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        try:
            atexit.unregister(self.close)
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---------------------------------------------------------------------------
# Self-test and CLI.

def _reach(c, i, j, port=5999, wait=1.0):
    """True if a TCP exchange from node i to a listener on node j works
    within `wait` seconds (no ping here: a real connection, both ways)."""
    srv = c.popen(j, [sys.executable, "-c",
                      "import socket,sys\n"
                      f"s=socket.create_server(('{c.node_ip(j)}',{port}));s.settimeout(8)\n"
                      "print('listening',flush=True)\n"
                      "try:\n  k,_=s.accept();k.sendall(b'pong')\nexcept OSError: pass\n"],
                  stdout=subprocess.PIPE, text=True)
    assert srv.stdout.readline().strip() == "listening"
    cli = c.popen(i, [sys.executable, "-c",
                      "import socket,sys\n"
                      f"try:\n  k=socket.create_connection(('{c.node_ip(j)}',{port}),{wait})\n"
                      f"  k.settimeout({wait});sys.exit(0 if k.recv(4)==b'pong' else 1)\n"
                      "except OSError as e: print(e); sys.exit(2)\n"],
                  stdout=subprocess.DEVNULL)
    ok = cli.wait(wait + 10) == 0
    srv.kill()
    srv.wait(10)
    return ok


def self_check(workdir):
    """Two nodes ping each other through the bridge only; link_down cuts;
    close leaves nothing. Returns a dict of what was seen; raises on failure."""
    seen = {}
    c = NetnsCluster(2, workdir)
    try:
        cid = c.id
        routes = _ip("-n", c.ns(0), "route", "show").stdout
        seen["routes_node0"] = routes.strip().splitlines()
        assert "default" not in routes, routes
        seen["tcp_0_to_1"] = _reach(c, 0, 1)
        assert seen["tcp_0_to_1"], "node 0 cannot reach node 1"
        seen["tcp_1_to_0"] = _reach(c, 1, 0)
        assert seen["tcp_1_to_0"], "node 1 cannot reach node 0"
        # Not through the root namespace: it has no address or route on the bridge.
        seen["root_route_to_1"] = _ip("route", "get", c.node_ip(1)).stdout.strip()
        assert f"dev {c.bridge}" not in seen["root_route_to_1"]
        assert "inet " not in _ip("addr", "show", "dev", c.bridge).stdout
        c.link_down(1)
        seen["tcp_after_link_down"] = _reach(c, 0, 1)
        assert not seen["tcp_after_link_down"], "link_down(1) did not cut node 1 off"
        c.link_up(1)
        seen["tcp_after_link_up"] = _reach(c, 0, 1, wait=3)
        assert seen["tcp_after_link_up"], "link_up(1) did not heal"
    finally:
        c.close()
    left = [x for x in _ip("netns", "list").stdout.split() + _ip("-o", "link").stdout.split()
            if cid in x]
    seen["left_after_close"] = left
    assert not left, f"left behind: {left}"
    return seen


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up")
    up.add_argument("n", type=int)
    up.add_argument("--workdir", required=True)
    up.add_argument("--build")
    up.add_argument("--opt", action="append", default=[], help="KEY=VALUE daemon option")
    up.add_argument("--start", action="store_true", help="start every node's daemon")
    down = sub.add_parser("down")
    down.add_argument("--state")
    down.add_argument("--all", action="store_true")
    sub.add_parser("check").add_argument("--workdir", default=None)
    sub.add_parser("info").add_argument("--state", required=True)
    for name in ("start", "stop", "kill", "sigstop", "sigcont", "link-down", "link-up"):
        p = sub.add_parser(name)
        p.add_argument("--state", required=True)
        p.add_argument("i", type=int)
    ex = sub.add_parser("exec")
    ex.add_argument("--state", required=True)
    ex.add_argument("i", type=int)
    ex.add_argument("argv", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)

    if a.cmd == "check":
        import tempfile
        wd = a.workdir or tempfile.mkdtemp(prefix="ckn-check-")
        reason = skip_reason()
        if reason:
            print(json.dumps({"skipped": reason}))
            return 0
        print(json.dumps(self_check(wd)))
        return 0
    if a.cmd == "up":
        opts = dict(kv.split("=", 1) for kv in a.opt)
        c = NetnsCluster(a.n, a.workdir, a.build, daemon_options=opts, keep=True)
        if a.start:
            for i in range(a.n):
                c.start_daemon(i)
        print(json.dumps(c.describe()))
        return 0
    if a.cmd == "down":
        if a.state:
            c = NetnsCluster.attach(a.state)
            print(json.dumps({"removed": {c.id: _remove_instance(c.id)}}))
        else:
            print(json.dumps({"removed": cleanup_leftovers(everything=a.all)}))
        return 0
    c = NetnsCluster.attach(a.state)
    if a.cmd == "info":
        print(json.dumps(c.describe()))
        return 0
    if a.cmd == "exec":
        args = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
        return subprocess.call(["ip", "netns", "exec", c.ns(a.i), *args])
    act = {"start": c.start_daemon, "stop": c.stop_daemon, "kill": c.kill,
           "sigstop": c.sigstop, "sigcont": c.sigcont, "link-down": c.link_down,
           "link-up": c.link_up}[a.cmd]
    r = act(a.i)
    print(json.dumps({"cmd": a.cmd, "node": a.i, "result": r}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
