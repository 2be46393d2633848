#!/usr/bin/env python3
"""Partitions and node loss at every step of the multi-node save/commit
protocol, Jepsen-style, on a 3-node cluster of network namespaces
(tests/testing/netns_cluster.py).

Every daemon runs with all the protocol's failpoints armed as `pause`
(common/failpoint.h; DEVELOPERS.md "Failpoints") and every `.release` file
present, so nothing stops until a scenario removes one point's `.release`
on one node. One trainer rank per node (build/bin/ckptd_trainer, inside the
node's namespace) saves one 3-rank checkpoint through its own daemon.

  table      every failpoint x fault kind (link down on the node's veth,
             SIGSTOP of its daemon, SIGKILL of its daemon, then a restart)
             x the faulted node's role (the coordinator, another node): arm
             the point, save, on `<point>.hit` apply the fault, release,
             heal after a delay, check
  random     a randomized schedule: each round one save with 1-3 faults
             (distinct nodes, a random kind, at a random failpoint or a
             random moment, healed after a random delay); --seed (printed),
             --faults, --time-limit

Checked after every save (a violation fails the run):
  * all or nothing: `.metadata` exists and `ckptctl verify` accepts the
    checkpoint and no live node's trainer says anything but COMMITTED (a
    trainer whose own daemon was killed may fail), or there is no
    `.metadata` (nor `.metadata.tmp`) and every trainer failed with an
    error naming a node or the coordinator;
  * no trainer waited past the documented bound: from the fault, the heal
    delay + max(stage_timeout, commit_timeout + peer_timeout) + slack
    (docs/multi-node.md "Failures");
  * no daemon died that was not killed;
  * once healed, the next checkpoint commits (a clean save after every
    round that did not commit);
  * at the end every checkpoint that committed still verifies (no data
    lost).

Usage (root):
  tests/netns/fault_schedule.py [--table] [--random] [--seed N] [--faults N]
      [--time-limit S] [--workdir DIR] [--json OUT] [--build DIR]
With neither --table nor --random: both. Exit status 1 on any violation.
"""
import argparse
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "testing"))
import netns_cluster  # noqa: E402

NODES = 3
# Short timeouts (seconds) so that ~250 faults fit in CI's budget; the
# configuration constraint peer_timeout >= 2 x peer_heartbeat holds.
TIMEOUTS = {"peer_timeout": 0.8, "peer_heartbeat": 0.2, "stage_timeout": 1.2,
            "commit_timeout": 1.0}
SLACK = 1.5  # scheduling noise on a loaded 2-core machine
MB = 0.05    # per rank: 3 sharded tensors + small items, ~50 KiB
NODE_POINTS = ["node.staging", "node.before_plan", "node.plan_arrived",
               "node.before_prepare", "node.after_prepare"]
COORDINATOR_POINTS = ["coordinator.plan_round", "coordinator.all_prepared",
                      "coordinator.before_rename", "coordinator.after_rename"]
POINTS = NODE_POINTS + COORDINATOR_POINTS
KINDS = ["link", "sigstop", "sigkill"]
ROLES = ["coordinator", "other"]
ENV_LOCK = threading.Lock()


def documented_bound(heal_s):
    """The longest a trainer may wait after a fault (docs/multi-node.md):
    a node that is not durable aborts after peer_timeout of silence (or
    stage_timeout while indexes are missing); a prepared node waits up to
    commit_timeout + peer_timeout for the decision; a stopped daemon only
    starts counting once it runs again."""
    t = TIMEOUTS
    return heal_s + max(t["stage_timeout"], t["commit_timeout"] + t["peer_timeout"]) + SLACK


class Trainer:
    """One ckptd_trainer rank in its node's namespace; its answer and when."""

    def __init__(self, cluster, node, checkpoint, build, timeout):
        self.node = node
        self.started = time.monotonic()
        self.ended = None
        argv = [build / "tools" / "ckptd_trainer", "--socket", cluster.socket(node),
                "--checkpoint", checkpoint, "--rank", node, "--world", NODES,
                "--mb", MB, "--coordinator", cluster.peer_address(0),
                "--local-ranks", node, "--num-nodes", NODES, "--timeout", timeout]
        with ENV_LOCK:  # popen copies os.environ, which starts change
            self.proc = cluster.popen(node, argv, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
        self.out = self.err = ""
        self._t = threading.Thread(target=self._collect, daemon=True)
        self._t.start()

    def _collect(self):
        self.out, self.err = self.proc.communicate()
        self.ended = time.monotonic()

    def wait(self, timeout):
        self._t.join(timeout)
        if self._t.is_alive():
            self.proc.kill()
            self._t.join(10)
            return False
        return True

    def last(self):
        for line in reversed(self.out.splitlines()):
            try:
                return json.loads(line)
            except ValueError:
                continue
        return {}

    def state(self):
        last = self.last()
        if last.get("state"):
            return last["state"]
        return "ERROR"

    def error(self):
        last = self.last()
        return (last.get("error") or last.get("wait_error") or last.get("save_error")
                or self.err.strip()[-300:] or f"exit {self.proc.returncode}, no output")


class FaultCluster:
    """The namespace cluster with every failpoint armed on every daemon."""

    def __init__(self, workdir, build):
        self.build = build
        opts = {k: f"{int(v * 1000)}ms" for k, v in TIMEOUTS.items()}
        opts.update({"fsync": "true", "log_level": "info"})
        self.c = netns_cluster.NetnsCluster(NODES, workdir, build, daemon_options=opts)
        self.fp_dirs = [self.c.node_dir(i) / "failpoints" for i in range(NODES)]
        self.killed = set()  # nodes killed by the schedule, not yet restarted
        for i in range(NODES):
            self.fp_dirs[i].mkdir(parents=True, exist_ok=True)
            for p in POINTS:
                self.release(i, p)
            self.start(i)

    def start(self, i):
        # The daemon inherits this process's environment (netns_cluster);
        # the lock keeps another cluster's thread from changing it meanwhile.
        with ENV_LOCK:
            saved = {k: os.environ.get(k) for k in
                     ("CKPTD_FAILPOINTS", "CKPTD_FAILPOINT_DIR", "CKPTD_FAILPOINT_TIMEOUT_MS")}
            os.environ["CKPTD_FAILPOINTS"] = ",".join(f"{p}=pause" for p in POINTS)
            os.environ["CKPTD_FAILPOINT_DIR"] = str(self.fp_dirs[i])
            os.environ["CKPTD_FAILPOINT_TIMEOUT_MS"] = "20000"
            try:
                self.c.start_daemon(i, timeout=30, wait=False)
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
        self.c.wait_healthy(i, timeout=30)
        self.killed.discard(i)

    def arm(self, i, point):
        (self.fp_dirs[i] / f"{point}.hit").unlink(missing_ok=True)
        (self.fp_dirs[i] / f"{point}.release").unlink(missing_ok=True)

    def release(self, i, point):
        (self.fp_dirs[i] / f"{point}.release").touch()

    def hit(self, i, point):
        return (self.fp_dirs[i] / f"{point}.hit").exists()

    def fault(self, kind, i):
        if kind == "link":
            self.c.link_down(i)
        elif kind == "sigstop":
            self.c.sigstop(i)
        else:
            self.c.kill(i)
            self.killed.add(i)

    def heal(self, kind, i):
        if kind == "link":
            self.c.link_up(i)
        elif kind == "sigstop":
            self.c.sigcont(i)
        else:
            self.start(i)

    def save(self, checkpoint, timeout):
        return [Trainer(self.c, i, checkpoint, self.build, timeout) for i in range(NODES)]

    def alive(self, i):
        return self.c.daemon_pid(i) is not None

    def verify(self, directory):
        r = subprocess.run([self.build / "bin" / "ckptctl", "verify", str(directory)],
                           capture_output=True, text=True, timeout=60)
        return r.returncode == 0, (r.stdout + r.stderr).strip()[-400:]

    def close(self):
        self.c.close()


class Runner:
    def __init__(self, fc, log):
        self.fc = fc
        self.log = log
        self.committed = []  # checkpoint dirs that committed
        self.aborted = []  # and those that did not
        self.imprecise = []  # aborted with an error that names no node
        self.violations = []
        self.longest = (0.0, 1.0, "")  # the wait nearest its bound: (wait, bound, what)
        self.saves = 0

    def violation(self, what):
        self.violations.append(what)
        self.log(f"VIOLATION: {what}")

    def run_save(self, name, faults):
        """One save with `faults`, each a dict: node (faulted), kind, point
        and on (the fault is applied when `point` is hit on node `on`,
        which is then released) or at (seconds after the start), heal
        (seconds from the fault to its heal). Returns the save's record."""
        fc = self.fc
        trainer_timeout = documented_bound(max([f["heal"] for f in faults] or [0])) + 10
        for f in faults:
            if f.get("point"):
                fc.arm(f["on"], f["point"])
        t0 = time.monotonic()
        trainers = fc.save(name, trainer_timeout)
        self.saves += 1
        pending = list(faults)
        healing = []  # (when, node, kind)
        applied = []  # (node, kind, point, fault_time, heal_s)
        healed = []  # when each heal was done (a restart: healthy again)
        faulted_at = {}  # node -> when its fault began
        cuts = []  # how long each link was down
        deadline = t0 + trainer_timeout + 15
        while time.monotonic() < deadline:
            now = time.monotonic()
            done = all(t.ended is not None for t in trainers)
            for f in list(pending):
                point = f.get("point")
                if (fc.hit(f["on"], point) if point else now - t0 >= f["at"]):
                    fc.fault(f["kind"], f["node"])
                    if point:
                        fc.release(f["on"], point)
                    applied.append((f["node"], f["kind"], point, time.monotonic(), f["heal"]))
                    faulted_at[f["node"]] = time.monotonic()
                    healing.append((time.monotonic() + f["heal"], f["node"], f["kind"]))
                    pending.remove(f)
                elif done or now - t0 > trainer_timeout:
                    if point:  # never reached: this save went another way
                        fc.release(f["on"], point)
                    pending.remove(f)
            for h in list(healing):
                # Healed when due, or once every trainer has its answer
                # (the fault did what it could to this save).
                if time.monotonic() >= h[0] or done:
                    self.heal(name, h[2], h[1])
                    healed.append(time.monotonic())
                    if h[2] == "link":
                        cuts.append(time.monotonic() - faulted_at[h[1]])
                    healing.remove(h)
            if done and not pending and not healing:
                break
            time.sleep(0.005)
        for t in trainers:
            if not t.wait(max(1, deadline - time.monotonic())):
                self.violation(f"{name}: node {t.node}'s trainer still waiting after "
                               f"{trainer_timeout + 15:.0f}s")
        for f in pending:
            if f.get("point"):
                fc.release(f["on"], f["point"])
        for _, node, kind in healing:  # (only after a violation above)
            self.heal(name, kind, node)
            healed.append(time.monotonic())
        r = self.check(name, trainers, applied, healed, t0)
        # A connection that carried calls into a cut link resumes at TCP's
        # next retransmission: up to the retransmission timeout (~1 s on a
        # young connection) plus about the cut's length after the heal
        # (gRPC's keepalive closes a stuck one after 30 s), longer than these
        # test timeouts. The clean save after the round waits that much.
        r["tcp_grace"] = round(min(max(cuts) + 1.0, 3.0), 2) if cuts else 0
        return r

    def heal(self, name, kind, node):
        try:
            self.fc.heal(kind, node)
        except (RuntimeError, TimeoutError, OSError) as e:
            self.violation(f"{name}: healing {kind} of node {node} failed: {e}")

    def check(self, name, trainers, applied, healed, t0):
        fc = self.fc
        directory = fc.c.shared / name
        metadata = (directory / ".metadata").exists()
        killed_nodes = {a[0] for a in applied if a[1] == "sigkill"}
        states = {t.node: t.state() for t in trainers}
        errors = {t.node: t.error() for t in trainers if t.state() != "COMMITTED"}
        outcome = "committed" if metadata else "aborted"
        if metadata:
            ok, out = fc.verify(directory)
            if not ok:
                self.violation(f"{name}: .metadata present but ckptctl verify fails: {out}")
            for t in trainers:
                if states[t.node] != "COMMITTED" and t.node not in killed_nodes:
                    self.violation(f"{name}: committed, but node {t.node} (not killed) "
                                   f"says {states[t.node]}: {errors[t.node]}")
            if ok:
                self.committed.append(directory)
        else:
            self.aborted.append(directory)
            for t in trainers:
                if states[t.node] == "COMMITTED":
                    self.violation(f"{name}: node {t.node} says COMMITTED, no .metadata")
                elif t.node not in killed_nodes and not any(
                        w in errors[t.node] for w in ("node ", "coordinator")):
                    # Known (DEVELOPERS.md): a node stopped with its plan in
                    # hand writes into the directory the others' cleanup
                    # removed, and reports that I/O error, not the abort.
                    if "No such file or directory" in errors[t.node]:
                        self.imprecise.append(f"{name}: node {t.node}: {errors[t.node]}")
                        self.log(f"imprecise error: {self.imprecise[-1]}")
                    else:
                        self.violation(f"{name}: node {t.node}'s error names no node: "
                                       f"{errors[t.node]}")
        # Waits: each trainer from the first fault (or the start) to its answer.
        first_fault = min([a[3] for a in applied] or [t0])
        bound = documented_bound(max([h - first_fault for h in healed] or [0]))
        waits = {}
        for t in trainers:
            if t.ended is None:
                continue
            w = t.ended - first_fault
            waits[t.node] = round(w, 2)
            if w > bound:
                self.violation(f"{name}: node {t.node}'s trainer waited {w:.1f}s after "
                               f"the fault, bound {bound:.1f}s")
            if w / bound > self.longest[0] / self.longest[1]:
                self.longest = (w, bound, f"{name} node {t.node}")
        for i in range(NODES):
            if i not in fc.killed and not fc.alive(i):
                self.violation(f"{name}: node {i}'s daemon died (not killed by the "
                               f"schedule)\n{fc.c.log_tail(i)}")
                fc.start(i)
        return {"name": name, "outcome": outcome, "states": states, "errors": errors,
                "applied": [(a[0], a[1], a[2]) for a in applied], "waits": waits,
                "bound": round(bound, 2),
                "longest_wait": max(waits.values()) if waits else None}

    def clean_save(self, name, after=None):
        if after:
            time.sleep(after.get("tcp_grace", 0))
        r = self.run_save(name, [])
        if r["outcome"] != "committed" or any(s != "COMMITTED" for s in r["states"].values()):
            self.violation(f"{name}: the save after healing did not commit: {r['errors']}")
        return r

    def leftovers(self):
        """Aborted checkpoints' files still there at the end (every node's
        cleanup, or its restart's recovery, removes its own)."""
        left = {}
        for d in self.aborted:
            try:
                files = [p.name for p in d.iterdir()
                         if p.name.endswith(".distcp") or p.name.startswith(".metadata")]
            except FileNotFoundError:
                continue
            if files:
                left[str(d)] = sorted(files)
        return left

    def reverify(self):
        lost = 0
        for d in self.committed:
            ok, out = self.fc.verify(d)
            if not ok:
                lost += 1
                self.violation(f"committed checkpoint {d} no longer verifies: {out}")
        return lost


def run_table(runner, heal_s, log):
    """Every point x kind x role: the point is armed on the node that runs
    it (the coordinator's points on node 0, a node's on the faulted node);
    at its hit the faulted node (role coordinator: node 0, other: node 1)
    gets the fault."""
    rows = []
    for point in POINTS:
        for kind in KINDS:
            for role in ROLES:
                target = 0 if role == "coordinator" else 1
                on = 0 if point.startswith("coordinator.") else target
                name = f"table/{point}.{kind}.{role}"
                r = runner.run_save(name, [{"node": target, "kind": kind, "point": point,
                                            "on": on, "heal": heal_s}])
                r.update(point=point, kind=kind, role=role)
                rows.append(r)
                log(f"{name}: {r['outcome']} applied={r['applied']} waits={r['waits']} "
                    f"bound={r['bound']} errors={short_errors(r['errors'])}")
                if r["outcome"] != "committed" or kind == "sigkill":
                    runner.clean_save(f"table-next/{point}.{kind}.{role}", after=r)
    return rows


def run_stale_connection(runner, log):
    """The coordinator restarts while node 2 is cut off: node 2's TCP
    connection to it dies unseen (no FIN crosses a down link), so its next
    call is written to a dead connection and reset. Once healed, the next
    save must still commit (it did not before the peer client resent a
    Plan failed by its transport)."""
    fc = runner.fc
    fc.c.link_down(2)
    fc.fault("sigkill", 0)
    fc.heal("sigkill", 0)
    t = time.monotonic()
    fc.c.link_up(2)
    r = runner.clean_save("table/stale-connection",
                          after={"tcp_grace": time.monotonic() - t + 1.0})
    log(f"table/stale-connection: {r['outcome']} waits={r['waits']} "
        f"errors={short_errors(r['errors'])}")
    return r


def short_errors(errors):
    return {k: v[:160] for k, v in errors.items()}


def run_random(runner, seed, faults_wanted, time_limit, log):
    rng = random.Random(seed)
    start = time.monotonic()
    applied = 0
    rounds = 0
    outcomes = {"committed": 0, "aborted": 0}
    while applied < faults_wanted and time.monotonic() - start < time_limit:
        n = rng.choice([2, 3, 3, 3])
        nodes = rng.sample(range(NODES), n)
        faults = []
        for node in nodes:
            f = {"node": node, "kind": rng.choice(KINDS),
                 "heal": rng.choice([0.05, 0.2, 0.5, 1.0, 1.5, 2.5])}  # 2.5 > commit + peer
            if rng.random() < 0.6:
                f["on"] = rng.randrange(NODES)
                f["point"] = rng.choice(POINTS if f["on"] == 0 else NODE_POINTS)
            else:
                f["at"] = rng.uniform(0, 0.3)
            faults.append(f)
        name = f"random/{seed}-{rounds}"
        r = runner.run_save(name, faults)
        rounds += 1
        applied += len(r["applied"])
        outcomes[r["outcome"]] += 1
        log(f"{name}: {r['outcome']} applied={r['applied']} waits={r['waits']} "
            f"bound={r['bound']} errors={short_errors(r['errors'])}")
        if r["outcome"] != "committed" or any(a[1] == "sigkill" for a in r["applied"]):
            runner.clean_save(f"random-next/{seed}-{rounds}", after=r)
    return {"seed": seed, "faults": applied, "rounds": rounds, "outcomes": outcomes,
            "seconds": round(time.monotonic() - start, 1)}


def table_markdown(rows):
    """points x kinds: per role the outcome, the longest wait / bound."""
    out = ["| point | kind | role | reached | outcome | data lost | longest wait / bound |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['point']} | {r['kind']} | {r['role']} | "
                   f"{'yes' if r['applied'] else 'no'} | {r['outcome']} | "
                   f"{r.get('lost', 0)} | {r['longest_wait']} s / {r['bound']} s |")
    return "\n".join(out)


def matrix_markdown(rows):
    """points x kinds, each cell `coordinator / other`: the outcome
    (C committed, A aborted, - point not reached) and the longest wait."""
    cell = {(r["point"], r["kind"], r["role"]): r for r in rows}
    out = ["| point | " + " | ".join(KINDS) + " |", "|---|" + "---|" * len(KINDS)]
    for point in POINTS:
        parts = []
        for kind in KINDS:
            txt = []
            for role in ROLES:
                r = cell.get((point, kind, role))
                if r is None:
                    txt.append("?")
                    continue
                o = ("C" if r["outcome"] == "committed" else "A") if r["applied"] else "-"
                txt.append(f"{o} {r['longest_wait']}s")
            parts.append(" / ".join(txt))
        out.append(f"| {point} | " + " | ".join(parts) + " |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--random", action="store_true")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--faults", type=int, default=200)
    ap.add_argument("--time-limit", type=float, default=240)
    ap.add_argument("--heal", type=float, default=1.0,
                    help="table: seconds from the fault to its heal (> peer_timeout)")
    ap.add_argument("--stale", action="store_true",
                    help="only the stale-connection scenario (also run with --table)")
    ap.add_argument("--workdir")
    ap.add_argument("--json")
    ap.add_argument("--build", default=os.environ.get("CKPTD_BUILD_DIR", str(REPO / "build")))
    a = ap.parse_args(argv)
    if not a.table and not a.random and not a.stale:
        a.table = a.random = True
    reason = netns_cluster.skip_reason()
    if reason:
        print(f"SKIPPED: {reason}")
        return 0
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1 << 31)
    workdir = pathlib.Path(a.workdir or tempfile.mkdtemp(prefix="ckptd-faults-", dir="/tmp"))
    t_start = time.monotonic()

    def log(msg):
        print(f"[{time.monotonic() - t_start:7.1f}s] {msg}", flush=True)

    log(f"fault schedule: seed {seed} (--seed to replay), workdir {workdir}, "
        f"timeouts {TIMEOUTS}")
    report = {"seed": seed, "timeouts": TIMEOUTS}
    runners = []

    def phase(tag, body):
        """One cluster of its own for `body(runner)`; every committed
        checkpoint of it re-verified before it goes."""
        def plog(msg):
            log(f"{tag}: {msg}")
        fc = FaultCluster(workdir / tag, pathlib.Path(a.build))
        runner = Runner(fc, plog)
        runners.append(runner)
        try:
            runner.clean_save("warmup/0")
            body(runner, plog)
            runner.clean_save("final/0")
            report.setdefault("lost", 0)
            report["lost"] += runner.reverify()
            time.sleep(TIMEOUTS["commit_timeout"] + TIMEOUTS["peer_timeout"])
            left = runner.leftovers()
            report.setdefault("leftovers", {}).update(left)
            if left:
                plog(f"files of aborted checkpoints left: {left}")
        except Exception as e:  # noqa: BLE001  (reported, the run fails)
            runner.violation(f"{tag} phase stopped: {e!r}")
        finally:
            fc.close()

    def table_phase(runner, plog):
        report["stale_connection"] = run_stale_connection(runner, plog)["outcome"]
        if a.table:
            report["table"] = run_table(runner, a.heal, plog)

    def random_phase(runner, plog):
        report["random"] = run_random(runner, seed, a.faults, a.time_limit, plog)
        plog(f"random schedule: {report['random']}")

    # The table and the randomized schedule on two clusters side by side:
    # both mostly wait out timeouts.
    threads = []
    if a.table or a.stale:
        threads.append(threading.Thread(target=phase, args=("table", table_phase)))
    if a.random:
        threads.append(threading.Thread(target=phase, args=("random", random_phase)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    violations = [v for r in runners for v in r.violations]
    longest = max((r.longest for r in runners), key=lambda w: w[0] / w[1])
    report["violations"] = violations
    report["imprecise_errors"] = [v for r in runners for v in r.imprecise]
    report["committed"] = sum(len(r.committed) for r in runners)
    report["saves"] = sum(r.saves for r in runners)
    report["longest"] = {"wait_s": round(longest[0], 2), "bound_s": round(longest[1], 2),
                         "where": longest[2]}
    report["seconds"] = round(time.monotonic() - t_start, 1)
    if a.table and "table" in report:
        print(table_markdown(report["table"]))
        print(matrix_markdown(report["table"]))
    log(f"{report['saves']} saves, {report['committed']} committed and re-verified "
        f"({report.get('lost')} lost), longest wait {report['longest']}, "
        f"{len(violations)} violations, {len(report['imprecise_errors'])} imprecise errors, "
        f"{report['seconds']}s")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(report, indent=1, default=str))
    if not violations and not a.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
