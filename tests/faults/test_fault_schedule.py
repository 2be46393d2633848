"""The fault schedule (fault_schedule.py) as a pytest: the fault table
(every failpoint x fault kind x role) and a randomized schedule of at least
CKPTD_FAULTS (default 200) faults with a fixed seed (CKPTD_FAULT_SEED,
default 1; printed) within CKPTD_FAULT_TIME_LIMIT (260 s), each on a
3-node cluster of network namespaces (two side by side). Needs
root and `ip netns`; skipped with the reason elsewhere. Run by
`scripts/test.sh --faults` and the full run's fault phase."""
import json
import os
import pathlib
import sys

import pytest

# Here, not in tests/netns/: the namespace suites' phase (`tests/netns`)
# does not run the fault schedule a second time.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "netns"))
import fault_schedule  # noqa: E402
import netns_cluster  # noqa: E402  (fault_schedule put tests/testing on the path)


def test_fault_table_and_random_schedule(tmp_path, capsys):
    reason = netns_cluster.skip_reason()
    if reason:
        pytest.skip(reason)
    seed = os.environ.get("CKPTD_FAULT_SEED", "1")
    faults = os.environ.get("CKPTD_FAULTS", "200")
    limit = os.environ.get("CKPTD_FAULT_TIME_LIMIT", "260")
    out = tmp_path / "report.json"
    rc = fault_schedule.main(["--seed", seed, "--faults", faults, "--time-limit", limit,
                              "--workdir", str(tmp_path / "cluster"), "--json", str(out)])
    report = json.loads(out.read_text()) if out.exists() else {}
    with capsys.disabled():
        r = report.get("random", {})
        print(f"\nfault schedule: seed {seed}, {r.get('faults')} random faults in "
              f"{r.get('rounds')} saves ({r.get('seconds')} s), {len(report.get('table', []))} "
              f"table cells, {report.get('committed')} checkpoints committed, "
              f"{report.get('lost')} lost, longest wait {report.get('longest')}, "
              f"{len(report.get('imprecise_errors', []))} imprecise errors, "
              f"violations: {report.get('violations')}, {report.get('seconds')} s")
    assert rc == 0, f"violations: {report.get('violations')}"
    assert report["random"]["faults"] >= int(faults), (
        f"only {report['random']['faults']} faults within the time limit {limit}s")
    assert report["lost"] == 0
