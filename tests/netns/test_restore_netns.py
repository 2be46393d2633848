"""Restore across nodes, N -> M: a checkpoint that 6 ranks on 3 nodes (each
in its own network namespace, own daemon) wrote restores into 4 ranks on 2
nodes, resharded (rows split 6 ways saved, 4 ways loaded), through the
daemons: each rank runs ckptd.load(via_daemon=True) against its own node's
daemon, the node's ranks forming one restore group.

Per node it measures, from the daemon's /metrics (ckptd_restore_bytes_total
by source, ckptd_restore_group_batches_total), what the daemon read against
what its local ranks need (the union of their boxes: each rank's rows of
the three row-sharded tensors, plus the replicated tensor once per node),
asserts storage <= 1.1 x need and one group batch per node, and that the
memory tier of each node served what that node wrote (its rows that it
restores again). The figures are printed (pytest -s, or the report).

The ranks use the host's torch 1.13 (ckptd.Shard boxes; no torch 2 API), so
this runs without the Debian roots.
"""
import pathlib
import sys

import pytest

import netns_jobs as nj

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import netns_worker as nw  # noqa: E402  (for the row split; torch 1.13 imports here)

ROW_BYTES = nw.BIG_COLS * 4 * len(nw.BIG_TENSORS)
REP_BYTES = nw.BIG_REPLICATED[0] * nw.BIG_REPLICATED[1] * 4
SOURCES = ("storage", "memory", "lent", "delivered")


def counters(c, i):
    out = {s: c.metric(i, "ckptd_restore_bytes_total", source=s) for s in SOURCES}
    out["batches"] = c.metric(i, "ckptd_restore_group_batches_total")
    return out


def union_rows(spans):
    """Rows covered by the [a, b) spans."""
    rows = set()
    for a, b in spans:
        rows.update(range(a, b))
    return rows


def test_three_nodes_restore_into_two(make_cluster, tmp_path):
    c = make_cluster(3, daemon_options={"memory_tier_bytes": "64M"})
    for i in range(3):
        c.start_daemon(i)
    lib = c.build_dir / "client" / "libckptd_client.so"
    base, refs = c.shared / "big", tmp_path / "refs"
    save_at = [0, 0, 1, 1, 2, 2]
    outs, skip = nj.run_job(c, "save", save_at, kind="big", base=base, refs=refs,
                            modes=["manager"], logdir=tmp_path / "logs", client_lib=lib,
                            timeout=150)
    assert skip is None, skip
    assert len(nj.results(outs, "RESULT save manager")) == 6, outs

    before = [counters(c, i) for i in range(2)]
    load_at = [0, 0, 1, 1]
    outs, skip = nj.run_job(c, "load", load_at, kind="big", base=base, refs=refs,
                            modes=["ckptd@manager"], logdir=tmp_path / "logs", client_lib=lib,
                            timeout=150)
    assert skip is None, skip
    after = [counters(c, i) for i in range(2)]

    figures = []
    for node in range(2):
        delta = {k: after[node][k] - before[node][k] for k in after[node]}
        loaders = [r for r, n in enumerate(load_at) if n == node]
        rows = union_rows(nw.rows_of(len(load_at), r) for r in loaders)
        need = len(rows) * ROW_BYTES + REP_BYTES
        writers = [r for r, n in enumerate(save_at) if n == node]
        written = union_rows(nw.rows_of(len(save_at), r) for r in writers)
        own = len(rows & written) * ROW_BYTES + (REP_BYTES if 0 in writers else 0)
        from_files = delta["storage"] - delta["memory"]
        figures.append(f"node {node}: ranks {loaders} need {need} B; daemon storage "
                       f"{delta['storage']:.0f} B ({delta['storage'] / need:.3f}x), of which "
                       f"memory tier {delta['memory']:.0f} B (this node wrote {own} B of what it "
                       f"restores), files {from_files:.0f} B, lent {delta['lent']:.0f} B, "
                       f"delivered {delta['delivered']:.0f} B, group batches "
                       f"{delta['batches']:.0f}")
        assert delta["batches"] == 1, figures[-1]
        assert need <= delta["storage"] + delta["lent"] <= 1.1 * need, figures[-1]
        assert delta["memory"] >= own, figures[-1]
        assert delta["delivered"] >= need, figures[-1]
    print("\n".join(["restore 3 nodes (6 ranks) -> 2 nodes (4 ranks):"] + figures))
    for ln in nj.results(outs, "RESTORE"):
        print(ln)
