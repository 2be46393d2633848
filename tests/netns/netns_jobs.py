"""Runs gloo jobs of netns_worker.py whose ranks sit in the nodes of a
NetnsCluster: rank r in node placement[r]'s namespace, talking to that
node's daemon, the process group meeting at node 0's address. torch 2.x
ranks run in a Debian root (NetnsCluster.run_torch2, the build's bundle for
the client library); root None: the host's /usr/bin/python3 (torch 1.13)."""
import os
import pathlib
import random
import signal
import subprocess
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
WORKER = HERE / "netns_worker.py"
SKIP_EXIT = 77
ROOTS = {"2.14": "/var/cache/ckptd/torch2-sid", "2.6": "/var/cache/ckptd/torch2-trixie"}


def root_status(version):
    """(root, None) where the Debian root of this torch version is ready,
    else (None, why)."""
    root = ROOTS[version]
    if not os.path.exists(f"{root}/.ckptd-ready"):
        return None, (f"no torch {version} root at {root} (make it: CKPTD_TORCH2_ROOT={root} "
                      "CKPTD_TORCH2_SUITE=... bash scripts/torch2_chroot.sh setup)")
    return root, None


def make_bundle(build_dir, dest):
    """The build's tools and client library with their libraries
    (run_on_gpu_machine.sh --make-bundle): what a Debian root can load."""
    r = subprocess.run(["bash", str(REPO / "tests/interop/run_on_gpu_machine.sh"),
                        "--make-bundle", str(build_dir), str(dest)],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise AssertionError(f"--make-bundle {build_dir} failed:\n{r.stdout}\n{r.stderr}")
    return pathlib.Path(dest)


class Job:
    def __init__(self, procs, logs, placement):
        self.procs, self.logs, self.placement = procs, logs, placement

    def outputs(self):
        return [p.read_text(errors="replace") for p in self.logs]


def start_job(c, cmd, placement, *, kind, base, refs, modes, logdir, root=None, client_lib,
              extra_env=None):
    logdir = pathlib.Path(logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    world = len(placement)
    port = random.randint(20000, 29999)
    procs, logs = [], []
    tag = f"{cmd}-{int(time.time() * 1000) % 100000}"
    for r, node in enumerate(placement):
        env = dict(c.trainer_env(node))
        env.update({
            "MASTER_PORT": port, "OMP_NUM_THREADS": 1, "PYTHONUNBUFFERED": 1, "USE_LIBUV": 0,
            "PYTHONPATH": f"{REPO / 'client' / 'python'}:{REPO / 'tests' / 'interop'}",
            "CKPTD_CLIENT_LIB": client_lib, "CKPTD_BUILD_DIR": c.build_dir,
            "LOCAL_RANK": placement[:r].count(node), "LOCAL_WORLD_SIZE": placement.count(node),
            **(extra_env or {})})
        argv = ["/usr/bin/python3", str(WORKER), cmd, "--rank", str(r), "--world", str(world),
                "--kind", kind, "--dir", str(base), "--refs", str(refs), "--modes",
                ",".join(modes), "--local-rank", str(placement[:r].count(node)),
                "--local-world", str(placement.count(node))]
        log = logdir / f"{tag}-rank{r}-node{node}.log"
        logs.append(log)
        with open(log, "wb") as f:
            if root is None:
                procs.append(c.popen(node, argv, env, stdout=f, stderr=subprocess.STDOUT))
            else:
                procs.append(c.run_torch2(node, argv, env, root=root, stdout=f,
                                          stderr=subprocess.STDOUT))
    return Job(procs, logs, placement)


def wait_job(c, job, timeout, what):
    """Waits for every rank; returns (outputs, skip reason or None). A rank
    that fails gets its peers killed 15 s later; past `timeout` every rank is
    killed. AssertionError with every rank's log and the daemons' log tails."""
    deadline = time.monotonic() + timeout
    first_fail = None
    killed = False
    while any(p.poll() is None for p in job.procs):
        now = time.monotonic()
        if first_fail is None and any(p.poll() not in (None, 0) for p in job.procs):
            first_fail = now
        if now > deadline or (first_fail is not None and now - first_fail > 15):
            for p in job.procs:
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            for p in job.procs:
                p.wait(30)
            killed = True
            break
        time.sleep(0.05)
    outs = job.outputs()
    codes = [p.returncode for p in job.procs]
    if all(rc in (0, SKIP_EXIT) for rc in codes) and SKIP_EXIT in codes and not killed:
        i = codes.index(SKIP_EXIT)
        reason = next((ln[6:] for ln in outs[i].splitlines() if ln.startswith("SKIP: ")), "?")
        return outs, reason
    if killed or any(rc != 0 for rc in codes):
        report = "\n".join(f"--- rank {r} on node {job.placement[r]} (exit {rc}) ---\n{o[-4000:]}"
                           for r, (rc, o) in enumerate(zip(codes, outs)))
        nodes = sorted(set(job.placement))
        tails = "\n".join(c.log_tail(n, 25) for n in nodes)
        raise AssertionError(f"{what}: {'killed after ' + str(timeout) + ' s' if killed else ''}"
                             f" exit codes {codes}\n{report}\n{tails}")
    return outs, None


def run_job(c, cmd, placement, timeout=200, what=None, **kw):
    job = start_job(c, cmd, placement, **kw)
    return wait_job(c, job, timeout, what or f"{cmd} on nodes {placement}")


def results(outs, prefix):
    """The RESULT / RESTORE lines of every rank."""
    return [ln for o in outs for ln in o.splitlines() if ln.startswith(prefix)]
