"""Checks of the Kubernetes manifests in deploy/kubernetes.

Always run (PyYAML only):
  * every file parses, every document has apiVersion/kind/metadata.name;
  * project invariants (`invariant_errors`): the ckptd config in each
    ConfigMap uses only real daemon keys, the probes and Prometheus
    annotations point at http_listen's port and /healthz, /metrics, the peer
    port is the containerPort/hostPort and the advertised port, the token
    file is a mounted Secret key with no group/other bits and no fsGroup, the
    socket directory, shm_dir (hostPath or emptyDir medium Memory), state_dir
    and checkpoint roots are mounted, trainers get CKPTD_SOCKET and the same
    mounts, resources and securityContext are set;
  * each invariant is shown to catch a broken copy;
  * the ConfigMaps' config files start the real daemon (ckptd has no config
    dry-run flag: it is started with its paths redirected into tmp_path) and,
    when the build has http_listen, /healthz and /metrics answer.
Run when node and deploy/validate/node_modules are there (else skipped with
the reason; deploy/validate/install.sh installs them):
  * deploy/validate/validate.mjs: every document against its kind's
    Kubernetes OpenAPI schema, unknown fields and wrong types rejected — also
    shown on a broken copy.
"""
import copy
import os
import pathlib
import re
import shutil
import signal
import subprocess
import time
import urllib.request

import pytest

from daemon_util import ckptd_help_keys, http_port_in_log, parse_ckptd_config

yaml = pytest.importorskip("yaml", reason="PyYAML (python3-yaml) is required")

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD_DIR = pathlib.Path(os.environ.get("CKPTD_BUILD_DIR", REPO / "build"))
K8S = REPO / "deploy" / "kubernetes"
VALIDATE = REPO / "deploy" / "validate"
FILES = ["namespace.yaml", "configmap.yaml", "daemonset.yaml", "secret-example.yaml",
         "sidecar-example.yaml", "kustomization.yaml"]
# Keys the manifests use that another change adds to the daemon: accepted by
# the key check when missing from `ckptd --help` (that part then skips with
# the reason) and dropped from the config the daemon is started with.
PENDING_KEYS = {"http_listen": "the HTTP endpoint for /metrics and /healthz"}


# --- helpers ------------------------------------------------------------------------

def ckptd_binary():
    exe = BUILD_DIR / "bin" / "ckptd"
    if not exe.exists():
        pytest.fail(f"{exe} is not built (build the project first, or set CKPTD_BUILD_DIR)")
    return exe


_help_keys = {}


def help_keys():
    exe = ckptd_binary()
    if exe not in _help_keys:
        _help_keys[exe] = ckptd_help_keys(exe)
    return _help_keys[exe]


def load_docs():
    """{file name: [documents]} of deploy/kubernetes/*.yaml."""
    out = {}
    for path in sorted(K8S.glob("*.yaml")):
        out[path.name] = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return out


parse_config = parse_ckptd_config


def port_of(address):
    m = re.fullmatch(r"(.*):(\d+)", address or "")
    return int(m.group(2)) if m else None


def all_docs(docs):
    return [d for ds in docs.values() for d in ds]


def pod_templates(docs):
    """(file, workload, pod spec, pod metadata) of every workload."""
    for name, ds in docs.items():
        for d in ds:
            if d.get("kind") in ("DaemonSet", "Deployment", "StatefulSet", "Job"):
                tpl = d["spec"]["template"]
                yield name, d, tpl["spec"], tpl.get("metadata", {})
            elif d.get("kind") == "Pod":
                yield name, d, d["spec"], d.get("metadata", {})


def arg_value(args, flag):
    for i, a in enumerate(args):
        if a == f"--{flag}" and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(f"--{flag}="):
            return a.split("=", 1)[1]
    return None


def mount_for(container, path):
    """The volumeMount whose mountPath is `path` or the closest parent."""
    best = None
    for m in container.get("volumeMounts", []):
        mp = m["mountPath"].rstrip("/") or "/"
        if path == mp or path.startswith(mp + "/"):
            if best is None or len(mp) > len(best["mountPath"]):
                best = m
    return best


def resolve_port(container, port):
    if isinstance(port, int):
        return port
    for p in container.get("ports", []):
        if p.get("name") == port:
            return p["containerPort"]
    return None


# --- the invariants -----------------------------------------------------------------

def invariant_errors(docs):
    """Project-specific problems of the manifests (empty list: none)."""
    errors = []
    err = errors.append
    by_kind_name = {(d.get("kind"), d.get("metadata", {}).get("name")): d
                    for d in all_docs(docs)}
    secrets = [d for d in all_docs(docs) if d.get("kind") == "Secret"]
    workloads = list(pod_templates(docs))
    if {w[1]["kind"] for w in workloads} != {"DaemonSet", "Job"}:
        err(f"expected a DaemonSet and a Job, found {[w[1]['kind'] for w in workloads]}")

    for file, workload, spec, meta in workloads:
        where = f"{file} {workload['kind']}/{workload['metadata']['name']}"
        inits = spec.get("initContainers", [])
        containers = spec.get("containers", [])
        vols = {v["name"]: v for v in spec.get("volumes", [])}
        daemons = [c for c in inits + containers if c["name"] == "ckptd"]
        if len(daemons) != 1:
            err(f"{where}: expected one container named ckptd")
            continue
        c = daemons[0]
        args = [str(a) for a in c.get("args", [])]

        # Resources of every container.
        for x in inits + containers:
            res = x.get("resources", {})
            for kind, keys in (("requests", ("cpu", "memory")), ("limits", ("memory",))):
                for k in keys:
                    if k not in res.get(kind, {}):
                        err(f"{where}: container {x['name']} has no resources.{kind}.{k}")

        # The config file: --config names a key of a mounted ConfigMap.
        config_path = arg_value(args, "config")
        mount = mount_for(c, config_path or "")
        if not config_path or mount is None or "configMap" not in vols.get(mount["name"], {}):
            err(f"{where}: --config {config_path} is not in a mounted ConfigMap")
            continue
        cm_name = vols[mount["name"]]["configMap"]["name"]
        key = os.path.relpath(config_path, mount["mountPath"])
        cm = by_kind_name.get(("ConfigMap", cm_name))
        if cm is None or key not in cm.get("data", {}):
            err(f"{where}: ConfigMap {cm_name} with key {key} not found")
            continue
        try:
            conf = parse_config(cm["data"][key])
        except ValueError as e:
            err(f"{where}: ConfigMap {cm_name}: {e}")
            continue

        def mounted(path, what, writable=True):
            m = mount_for(c, path)
            if m is None:
                err(f"{where}: {what} {path} is not on a mounted volume")
            elif writable and m.get("readOnly"):
                err(f"{where}: {what} {path} is mounted read-only")
            return m

        # Socket, shm_dir, state_dir, checkpoint roots.
        socket_path = conf.get("socket", "/run/ckptd/ckptd.sock")
        sock_mount = mounted(os.path.dirname(socket_path), "socket directory")
        shm_dir = conf.get("shm_dir", "/dev/shm/ckptd")
        shm_mount = mounted(shm_dir, "shm_dir")
        if shm_mount is not None:
            v = vols.get(shm_mount["name"], {})
            memory = v.get("emptyDir", {}).get("medium") == "Memory"
            host_shm = v.get("hostPath", {}).get("path", "").startswith("/dev/shm")
            if not (memory or host_shm):
                err(f"{where}: shm_dir volume {shm_mount['name']} is neither emptyDir "
                    f"medium Memory nor a hostPath under /dev/shm")
        mounted(conf.get("state_dir", "/var/lib/ckptd/state"), "state_dir")
        for root in conf.get("checkpoint_roots", "/var/lib/ckptd/checkpoints").split(","):
            if root.strip():
                mounted(root.strip(), "checkpoint root")

        # HTTP: probes, ports and Prometheus annotations follow http_listen.
        http_port = port_of(conf.get("http_listen"))
        if http_port is None:
            err(f"{where}: config has no http_listen host:port (probes need /healthz)")
        else:
            if http_port not in [p.get("containerPort") for p in c.get("ports", [])]:
                err(f"{where}: http_listen port {http_port} is not a containerPort")
            for probe in ("readinessProbe", "livenessProbe"):
                if probe not in c:
                    err(f"{where}: ckptd has no {probe}")
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                if probe not in c:
                    continue
                get = c[probe].get("httpGet", {})
                if get.get("path") != "/healthz":
                    err(f"{where}: {probe} path {get.get('path')} is not /healthz")
                if resolve_port(c, get.get("port")) != http_port:
                    err(f"{where}: {probe} port {get.get('port')} is not http_listen's "
                        f"{http_port}")
            ann = meta.get("annotations", {})
            want = {"prometheus.io/scrape": "true", "prometheus.io/port": str(http_port),
                    "prometheus.io/path": "/metrics"}
            for k, v in want.items():
                if ann.get(k) != v:
                    err(f"{where}: annotation {k}={ann.get(k)!r}, expected {v!r}")

        # Peer port and token.
        peer_port = port_of(conf.get("peer_listen"))
        if conf.get("peer_listen") and peer_port is None:
            err(f"{where}: peer_listen {conf['peer_listen']!r} is not host:port")
        if peer_port is not None:
            ports = [p for p in c.get("ports", []) if p.get("containerPort") == peer_port]
            if not ports:
                err(f"{where}: peer_listen port {peer_port} is not a containerPort")
            elif workload["kind"] == "DaemonSet" and ports[0].get("hostPort") != peer_port:
                err(f"{where}: peer port {peer_port} is not a hostPort (other nodes reach it)")
            advertise = arg_value(args, "peer_advertise") or conf.get("peer_advertise")
            if advertise and port_of(advertise) != peer_port:
                err(f"{where}: peer_advertise {advertise} does not name port {peer_port}")
            token = conf.get("peer_token_file")
            tmount = mount_for(c, token or "")
            secret = vols.get(tmount["name"], {}).get("secret") if tmount else None
            if not token or secret is None:
                err(f"{where}: peer_token_file {token} is not in a mounted Secret")
            else:
                rel = os.path.relpath(token, tmount["mountPath"])
                items = secret.get("items")
                item = next((i for i in items if i["path"] == rel), None) if items else None
                secret_key = item["key"] if item else (None if items else rel)
                mode = (item or {}).get("mode", secret.get("defaultMode", 0o644))
                if secret_key is None:
                    err(f"{where}: no item of Secret volume maps to {rel}")
                if mode & 0o077:
                    err(f"{where}: token file mode {mode:o} is readable by group/others "
                        f"(ckptd refuses it)")
                if "fsGroup" in spec.get("securityContext", {}):
                    err(f"{where}: fsGroup makes the token file group-readable")
                match = [s for s in secrets
                         if s["metadata"]["name"] == secret["secretName"]
                         and secret_key in {**s.get("data", {}), **s.get("stringData", {})}]
                if not match:
                    err(f"{where}: no example Secret {secret['secretName']} with key "
                        f"{secret_key}")

        # Least privilege for the daemon container.
        sc = c.get("securityContext", {})
        caps = sc.get("capabilities", {})
        if sc.get("allowPrivilegeEscalation") is not False:
            err(f"{where}: ckptd allows privilege escalation")
        if sc.get("privileged"):
            err(f"{where}: ckptd is privileged")
        if sc.get("readOnlyRootFilesystem") is not True:
            err(f"{where}: ckptd root file system is writable")
        if "ALL" not in caps.get("drop", []) or "IPC_LOCK" not in caps.get("add", []):
            err(f"{where}: ckptd must drop ALL capabilities and add IPC_LOCK")

        # Trainers in the same pod: CKPTD_SOCKET and the same mounts.
        if c in inits and c.get("restartPolicy") != "Always":
            err(f"{where}: init container ckptd is not a native sidecar (restartPolicy)")
        trainers = [x for x in containers if x is not c]
        if workload["kind"] == "Job" and not trainers:
            err(f"{where}: no trainer container beside ckptd")
        for t in trainers:
            env = {e["name"]: e.get("value") for e in t.get("env", [])}
            if env.get("CKPTD_SOCKET") != socket_path:
                err(f"{where}: trainer {t['name']} CKPTD_SOCKET={env.get('CKPTD_SOCKET')!r}, "
                    f"daemon socket {socket_path}")
            for dmount, path, what in ((sock_mount, os.path.dirname(socket_path), "socket"),
                                       (shm_mount, shm_dir, "shm_dir")):
                tm = mount_for(t, path)
                if dmount is None or tm is None or tm["name"] != dmount["name"] or \
                        tm["mountPath"] != dmount["mountPath"]:
                    err(f"{where}: trainer {t['name']} does not mount the daemon's {what} "
                        f"volume at {path}")
            mode = int(conf.get("socket_mode", "0660"), 8)
            gid = sc.get("runAsGroup")
            groups = spec.get("securityContext", {}).get("supplementalGroups", [])
            if not mode & 0o006 and gid is not None and gid not in groups:
                err(f"{where}: socket_mode {mode:o} and group {gid}, but the trainer is not "
                    f"in group {gid}")
    return errors


# --- tests: always run ------------------------------------------------------------------

def test_manifest_files_parse():
    docs = load_docs()
    assert sorted(docs) == sorted(FILES)
    for name, ds in docs.items():
        assert ds, f"{name} has no documents"
        for d in ds:
            assert isinstance(d, dict) and d.get("apiVersion") and d.get("kind"), (name, d)
            if d["kind"] != "Kustomization":
                assert d.get("metadata", {}).get("name"), (name, d)


def test_kustomization():
    k = load_docs()["kustomization.yaml"][0]
    assert k["kind"] == "Kustomization"
    for r in k["resources"]:
        assert (K8S / r).is_file(), r
    # Never deploys the placeholder token, nor the example job.
    assert "secret-example.yaml" not in k["resources"]
    assert "sidecar-example.yaml" not in k["resources"]
    namespaced = [d for f in k["resources"] for d in load_docs()[f] if d["kind"] != "Namespace"]
    assert {d["metadata"].get("namespace") for d in namespaced} == {k["namespace"]}


def test_manifest_invariants():
    errors = invariant_errors(load_docs())
    assert not errors, "\n".join(errors)


def _daemonset_pod(docs):
    return next(d for d in docs["daemonset.yaml"] if d["kind"] == "DaemonSet")["spec"]["template"]


def _job_pod(docs):
    return next(d for d in docs["sidecar-example.yaml"] if d["kind"] == "Job")["spec"]["template"]


def _ckptd(pod):
    return next(c for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]
                if c["name"] == "ckptd")


def _volume(pod, name):
    return next(v for v in pod["spec"]["volumes"] if v["name"] == name)


def _set_config_line(docs, cm_file, key, value):
    cm = next(d for d in docs[cm_file] if d["kind"] == "ConfigMap")
    text = cm["data"]["ckptd.conf"]
    assert re.search(rf"^\s*{key}\s*=", text, re.M), key
    cm["data"]["ckptd.conf"] = re.sub(rf"^(\s*){key}\s*=.*$", rf"\g<1>{key} = {value}", text,
                                      count=1, flags=re.M)


MUTATIONS = {
    "probe port": (lambda d: _ckptd(_daemonset_pod(d))["livenessProbe"]["httpGet"]
                   .__setitem__("port", 8080), "livenessProbe port 8080"),
    "probe path": (lambda d: _ckptd(_job_pod(d))["readinessProbe"]["httpGet"]
                   .__setitem__("path", "/health"), "readinessProbe path /health"),
    "http_listen moved": (lambda d: _set_config_line(d, "configmap.yaml", "http_listen",
                                                     "0.0.0.0:9100"), "9100"),
    "scrape port": (lambda d: _daemonset_pod(d)["metadata"]["annotations"]
                    .__setitem__("prometheus.io/port", "9090"), "prometheus.io/port"),
    "token mode": (lambda d: _volume(_daemonset_pod(d), "peer-token")["secret"]
                   .__setitem__("defaultMode", 0o440), "readable by group"),
    "token path": (lambda d: _set_config_line(d, "configmap.yaml", "peer_token_file",
                                              "/etc/ckptd/peer-token/peer-token"),
                   "no item of Secret volume"),
    "fsGroup": (lambda d: _daemonset_pod(d)["spec"]["securityContext"]
                .__setitem__("fsGroup", 2000), "fsGroup"),
    "no hostPort": (lambda d: _ckptd(_daemonset_pod(d))["ports"][0].pop("hostPort"),
                    "not a hostPort"),
    "shm on disk": (lambda d: _volume(_job_pod(d), "ckptd-shm")["emptyDir"].pop("medium"),
                    "neither emptyDir medium Memory"),
    "socket env": (lambda d: _job_pod(d)["spec"]["containers"][0]["env"][0]
                   .__setitem__("value", "/tmp/ckptd.sock"), "CKPTD_SOCKET"),
    "trainer shm path": (lambda d: next(m for m in _job_pod(d)["spec"]["containers"][0]
                                        ["volumeMounts"] if m["name"] == "ckptd-shm")
                         .__setitem__("mountPath", "/dev/shm"), "shm_dir volume"),
    "no limits": (lambda d: _ckptd(_daemonset_pod(d))["resources"].pop("limits"),
                  "resources.limits.memory"),
    "state not mounted": (lambda d: _set_config_line(d, "configmap.yaml", "state_dir",
                                                     "/var/lib/other"), "state_dir"),
    "escalation": (lambda d: _ckptd(_job_pod(d))["securityContext"]
                   .__setitem__("allowPrivilegeEscalation", True), "privilege escalation"),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_invariants_catch_broken_copy(mutation):
    docs = copy.deepcopy(load_docs())
    mutate, expected = MUTATIONS[mutation]
    mutate(docs)
    errors = invariant_errors(docs)
    assert any(expected in e for e in errors), (
        f"mutation {mutation!r} not caught; errors: {errors}")


def configmap_configs():
    """(file, ConfigMap name, config text) of every ckptd ConfigMap."""
    out = []
    for name, ds in load_docs().items():
        for d in ds:
            if d["kind"] == "ConfigMap" and "ckptd.conf" in d.get("data", {}):
                out.append((name, d["metadata"]["name"], d["data"]["ckptd.conf"]))
    assert len(out) == 2, out
    return out


def test_config_keys_are_daemon_keys():
    known = help_keys()
    pending = set()
    for file, cm, text in configmap_configs():
        keys = set(parse_config(text))
        unknown = keys - known - set(PENDING_KEYS)
        assert not unknown, f"{file} {cm}: keys not in ckptd --help: {sorted(unknown)}"
        pending |= (keys & set(PENDING_KEYS)) - known
    if pending:
        pytest.skip("config keys not yet in this build's `ckptd --help`: " +
                    ", ".join(f"{k} ({PENDING_KEYS[k]})" for k in sorted(pending)) +
                    "; every other key is a real daemon key")


@pytest.mark.parametrize("file", ["configmap.yaml", "sidecar-example.yaml"])
def test_config_starts_daemon(file, tmp_path):
    """The ConfigMap's config (with the workload's other ckptd flags) starts
    the real daemon: paths redirected into tmp_path by flags, the peer port
    on 127.0.0.1:0 with a scratch token file. With http_listen in the build,
    /healthz and /metrics answer on it."""
    exe = ckptd_binary()
    known = help_keys()
    [(_, _, text)] = [c for c in configmap_configs() if c[0] == file]
    conf = parse_config(text)
    dropped = [k for k in conf if k in PENDING_KEYS and k not in known]
    lines = [ln for ln in text.splitlines()
             if parse_config(ln).keys().isdisjoint(dropped)]
    config = tmp_path / "ckptd.conf"
    config.write_text("\n".join(lines) + "\n")

    docs = load_docs()
    pod = _daemonset_pod(docs) if file == "configmap.yaml" else _job_pod(docs)
    args = [str(a) for a in _ckptd(pod).get("args", [])]
    cfg = arg_value(args, "config")
    args = [str(config) if a == cfg else a.replace("$(NODE_IP)", "127.0.0.1").replace(
        "$(POD_IP)", "127.0.0.1") for a in args]
    overrides = [f"--socket={tmp_path / 's.sock'}", f"--checkpoint_roots={tmp_path / 'ck'}",
                 f"--shm_dir={tmp_path / 'shm'}", f"--state_dir={tmp_path / 'state'}"]
    if conf.get("peer_listen"):
        token = tmp_path / "token"
        token.write_text("0123456789abcdef0123456789abcdef\n")
        token.chmod(0o600)
        overrides += ["--peer_listen=127.0.0.1:0", f"--peer_token_file={token}"]
    with_http = "http_listen" in conf and "http_listen" in known
    if with_http:
        overrides.append("--http_listen=127.0.0.1:0")

    log_path = tmp_path / "ckptd.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(exe), *args, *overrides], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while "serving ckptd.v1" not in log_path.read_text(errors="replace"):
            assert proc.poll() is None, (f"ckptd exited {proc.returncode} with {file}'s "
                                         f"config:\n{log_path.read_text()}")
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
        if with_http:
            http_port = http_port_in_log(log_path.read_text(errors="replace"))
            assert http_port is not None, log_path.read_text()
            for path in ("/healthz", "/metrics"):
                url = f"http://127.0.0.1:{http_port}{path}"
                for _ in range(100):
                    try:
                        with urllib.request.urlopen(url, timeout=5) as r:
                            assert r.status == 200, (url, r.status)
                            break
                    except OSError:
                        time.sleep(0.05)
                else:
                    raise AssertionError(f"{url} did not answer:\n{log_path.read_text()}")
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=120)
        assert rc == 0, f"ckptd exited {rc} after SIGTERM:\n{log_path.read_text()}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --- tests: the schema validator (node) ----------------------------------------------------

def validator():
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (Debian package `nodejs`, in scripts/setup.sh): "
                    "manifests not checked against the Kubernetes schemas")
    if not (VALIDATE / "node_modules" / "kubernetes-models").is_dir():
        pytest.skip("deploy/validate/node_modules is missing (run deploy/validate/install.sh; "
                    "needs npm and the npm registry): manifests not checked against the "
                    "Kubernetes schemas")
    return [node, str(VALIDATE / "validate.mjs")]


def test_schema_validator_accepts_manifests():
    cmd = validator()
    proc = subprocess.run([*cmd, str(K8S)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    n = sum(len(ds) for ds in load_docs().values())
    assert f"{n} of {n} documents valid" in proc.stdout, proc.stdout


@pytest.mark.parametrize("case,old,new,message", [
    ("unknown field", "              path: /healthz\n", "              paht: /healthz\n",
     'unknown field "paht"'),
    ("wrong type", "containerPort: 7070", 'containerPort: "7070"', "must be integer"),
    ("bad quantity", "memory: 8Gi", "memory: 8 gigabytes", "quantity"),
    ("unknown kind", "kind: DaemonSet\n", "kind: DaemonSett\n", "no schema"),
    ("duplicate key", "  selector:\n", "  selector: {}\n  selector:\n", "Map keys must be unique"),
])
def test_schema_validator_rejects_broken_copy(tmp_path, case, old, new, message):
    cmd = validator()
    text = (K8S / "daemonset.yaml").read_text()
    assert old in text, case
    broken = tmp_path / "daemonset.yaml"
    broken.write_text(text.replace(old, new, 1))
    proc = subprocess.run([*cmd, str(broken)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, f"{case} accepted:\n{proc.stdout}{proc.stderr}"
    assert message in proc.stdout, proc.stdout
