"""bench/dcp_bench.py (ckptd against stock DCP on host tensors) runs end to
end on a small state: its own interop checks (stock dcp.load of ckptd's
checkpoint, ckptd.load of dcp.save's, both equal to the state) pass and it
prints every figure. Targets are not judged at this size (a benchmark, not
a timed test: docs/benchmarks.md has the figures)."""
import json
import os
import subprocess
import sys

import pytest

import interop_common as ic

torch, _REASON = ic.torch_status()
pytestmark = pytest.mark.skipif(torch is None, reason=_REASON or "")


def test_dcp_bench_small(tmp_path):
    if not ic.bin_path("ckptd").exists():
        pytest.fail(f"{ic.bin_path('ckptd')} not built")
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(ic.REPO / "bench" / "dcp_bench.py"), "--gib", "0.03",
         "--tensors", "8", "--reps", "1", "--json", str(out), "--dir", str(tmp_path / "w")],
        capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr  # 2: an error
    assert "interop: stock dcp.load of ckptd's checkpoint == state" in proc.stdout, proc.stdout
    doc = json.loads(out.read_text())
    names = {r["workload"] for r in doc["results"]}
    assert {"memcpy", "stall", "stall_memcpy", "durable", "async_durable", "load",
            "stock_async_save_snapshot", "writer_stall", "writer_durable"} <= names, names
