"""The daemon's HTTP endpoint (http_listen; docs/metrics.md) on a real ckptd:
/metrics after real saves, checked by Prometheus' own `promtool check
metrics` and, where the `prometheus` server is installed, scraped by a real
Prometheus server and queried through its HTTP API; /healthz (200, and 503
with a reason when the state directory goes away); 404 for other paths; a
port in use fails start-up with a clear error.
"""
import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

import daemon_util as du
from daemon_util import RawClient, assert_committed, run_ranks


def value(samples, name, **labels):
    key = (name, frozenset(labels.items()))
    assert key in samples, f"no sample {name}{labels}; have " + ", ".join(
        sorted({n for n, _ in samples}))
    return samples[key]


def scrape(port):
    status, headers, body = du.http_get(port, "/metrics")
    assert status == 200, (status, body)
    ctype = {k.lower(): v for k, v in headers.items()}["content-type"]
    assert ctype.startswith("text/plain; version=0.0.4"), ctype
    return body


def test_metrics_healthz_and_promtool(make_daemon, tmp_path):
    d = make_daemon(http_listen="127.0.0.1:0", staging_budget="64M")
    port = du.http_port(d)
    assert "serving ckptd.v1" not in next(
        ln for ln in d.log().splitlines() if "http endpoint listening" in ln)

    # Serving: /healthz is 200 (the trainer service starts right after the
    # HTTP endpoint; poll for it).
    du.poll(lambda: du.http_get(port, "/healthz")[0] == 200, 10, "/healthz 200")
    status, _, body = du.http_get(port, "/healthz")
    assert (status, body) == (200, "ok\n")
    status, _, body = du.http_get(port, "/no/such/path")
    assert status == 404, (status, body)

    before = du.parse_prometheus_text(scrape(port))
    assert value(before, "ckptd_bytes_written_total") == 0
    assert value(before, "ckptd_serving") == 1

    # Real saves: two trainer ranks, one raw 1-rank save, one rejected call.
    results = run_ranks(d, 2, "jobM/step1", mb=1)
    assert_committed(results, d)
    raw = RawClient(d)
    raw.save_valid("jobM/step2")
    code, _ = raw.save_error(raw.tensor_rank("jobM/bad", "w", [4], [0], [2], rank=3, world=2))

    text = scrape(port)
    (tmp_path / "metrics.txt").write_text(text)
    s = du.parse_prometheus_text(text)
    assert value(s, "ckptd_build_info", version=d.info().version) == 1
    assert value(s, "ckptd_process_start_time_seconds") > time.time() - 3600
    assert value(s, "ckptd_checkpoints_finished_total", outcome="committed") == 2
    assert value(s, "ckptd_checkpoints_finished_total", outcome="failed") == 0
    assert value(s, "ckptd_checkpoints", state="committed") == 2
    assert value(s, "ckptd_checkpoints", state="writing") == 0
    data_bytes = du.data_bytes(d.root / "jobM" / "step1") + du.data_bytes(d.root / "jobM" / "step2")
    assert value(s, "ckptd_bytes_written_total") == data_bytes > 0
    assert value(s, "ckptd_bytes_staged_total") > 0
    assert value(s, "ckptd_trainer_stall_seconds_count") == 2
    assert value(s, "ckptd_trainer_stall_seconds_bucket", le="+Inf") == 2
    assert value(s, "ckptd_commit_latency_seconds_count") == 2
    assert value(s, "ckptd_checkpoint_latency_seconds_count") == 2
    assert value(s, "ckptd_checkpoint_latency_seconds_sum") > 0
    assert value(s, "ckptd_errors_total", code=code, stage="validation") == 1
    assert value(s, "ckptd_staging_budget_bytes") == 64 << 20
    assert value(s, "ckptd_staged_bytes_in_use") == 0
    assert value(s, "ckptd_arenas_registered") >= 1  # the raw client's arenas
    assert value(s, "ckptd_recovered_checkpoints_total", result="removed") == 0

    # Prometheus' own linter and parser.
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian package `prometheus`, "
                    "scripts/setup.sh); the format was checked by the parser above only")
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 0 and proc.stdout.strip() == "" and proc.stderr.strip() == "", (
        f"promtool check metrics exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")

    # /healthz says why when the state directory goes away.
    moved = d.state.with_name("state.moved")
    d.state.rename(moved)
    try:
        status, _, body = du.http_get(port, "/healthz")
        assert status == 503 and "state_dir" in body, (status, body)
    finally:
        moved.rename(d.state)
    assert du.http_get(port, "/healthz")[0] == 200
    d.stop()


def test_real_prometheus_scrapes_the_daemon(make_daemon, tmp_path):
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip("the prometheus server is not installed (Debian package `prometheus`)")
    d = make_daemon(http_listen="127.0.0.1:0")
    port = du.http_port(d)
    RawClient(d).save_valid("jobP/step1")

    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n"
        "  - job_name: ckptd\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{port}']\n")
    log = open(tmp_path / "prometheus.log", "wb")
    proc = du.spawn([prometheus, f"--config.file={config}",
                     f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                     "--web.listen-address=127.0.0.1:0"],
                    stdout=log, stderr=subprocess.STDOUT)

    def query(q):
        url = f"http://127.0.0.1:{web}/api/v1/query?" + urllib.parse.urlencode({"query": q})
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                doc = json.load(r)
        except (OSError, ValueError):
            return None  # not up yet
        assert doc["status"] == "success", doc
        return doc["data"]["result"]

    def prom_log():
        return (tmp_path / "prometheus.log").read_text(errors="replace")[-4000:]

    try:
        # Prometheus's port (port 0 above): it logs the address it listens on.
        web = int(du.poll(
            lambda: re.search(r'msg="Listening on" address=\S+:(\d+)',
                              (tmp_path / "prometheus.log").read_text(errors="replace")),
            20, "prometheus's listening address in its log",
            on_timeout=lambda: f"prometheus exit {proc.poll()}\n{prom_log()}").group(1))
        up = du.poll(lambda: proc.poll() is None and query('up{job="ckptd"}'), 20,
                     "prometheus to scrape the daemon",
                     on_timeout=lambda: f"prometheus exit {proc.poll()}\n{prom_log()}")
        assert up[0]["value"][1] == "1", up
        assert up[0]["metric"]["instance"] == f"127.0.0.1:{port}"
        written = du.poll(lambda: query("ckptd_bytes_written_total"), 10,
                          "ckptd_bytes_written_total in prometheus", on_timeout=prom_log)
        assert float(written[0]["value"][1]) > 0, written
        committed = query('ckptd_checkpoints_finished_total{outcome="committed"}')
        assert float(committed[0]["value"][1]) == 1, committed
        stall = query("histogram_quantile(0.5, ckptd_trainer_stall_seconds_bucket)")
        assert stall and float(stall[0]["value"][1]) > 0, stall
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()
    d.stop()


def test_port_in_use_fails_start_up(make_daemon):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        d = make_daemon(start=False, http_listen=f"127.0.0.1:{port}")
        proc = subprocess.run(d.argv(), capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0, proc.stderr
    assert f"http_listen 127.0.0.1:{port}: cannot listen" in proc.stderr, proc.stderr


def test_malformed_http_listen_is_rejected(make_daemon):
    d = make_daemon(start=False, http_listen="localhost")
    proc = subprocess.run(d.argv(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "http_listen" in proc.stderr, proc.stderr
