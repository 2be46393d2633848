"""The fault schedule (fault_schedule.py) as a pytest: the fault table
(every failpoint x fault kind x role) and a randomized schedule of at least
CKPTD_FAULTS (default 200) faults with a fixed seed (CKPTD_FAULT_SEED,
default 1; printed), over a 3-node cluster of network namespaces. Needs
root and `ip netns`; skipped with the reason elsewhere. Run by
`scripts/test.sh --faults` and the full run's fault phase."""
import os
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
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
    with capsys.disabled():
        print(out.read_text()[-4000:] if out.exists() else "(no report)")
    assert rc == 0, "violations: see the report above"
    import json
    report = json.loads(out.read_text())
    assert report["random"]["faults"] >= int(faults), (
        f"only {report['random']['faults']} faults within the time limit {limit}s")
    assert report["lost"] == 0
