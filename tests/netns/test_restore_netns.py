"""Restore across nodes, N -> M: a checkpoint that 6 ranks on 3 nodes (each
in its own network namespace, own daemon) wrote restores into 5 ranks on 2
nodes (3 + 2), resharded (rows split 6 ways saved, 5 ways loaded: node 0's
rows end inside a saved record), through the
daemons: each rank runs ckptd.load(via_daemon=True) against its own node's
daemon, the node's ranks forming one restore group.

Per node it measures, from the daemon's /metrics (ckptd_restore_bytes_total
by source: "files", the bytes read from the checkpoint's data files on
storage, reads and CRC checks, not what the memory tier served; "peer",
the bytes fetched from other daemons' memory: every daemon, the third
node's included, still holds what its node wrote, and peer_restore=prefer
reads those records from there; ckptd_restore_group_batches_total), what
the daemon read against what its local ranks need (the union of their
boxes: each rank's rows of the three row-sharded tensors, plus the
replicated tensor once per node), asserts files + peer <= 1.1 x need and
one group batch per node, that the memory tier of each node served what
that node wrote (its rows that it restores again) and that the rest came
from outside the node (files or peers). The figures also give that against
the part other nodes wrote. The figures are printed (pytest -s).

The ranks use the host's torch 1.13 (ckptd.Shard boxes; no torch 2 API), so
this runs without the Debian roots.
"""
import pathlib
import sys

import netns_jobs as nj

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import netns_worker as nw  # noqa: E402  (for the row split; torch 1.13 imports here)

ROW_BYTES = nw.BIG_COLS * 4 * len(nw.BIG_TENSORS)  # a row of every sharded tensor
REP_BYTES = nw.BIG_REPLICATED[0] * nw.BIG_REPLICATED[1] * 4
SOURCES = ("storage", "memory", "lent", "delivered", "files", "peer")


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


def saved_records(save_world, rows):
    """The saved ranks whose row records the rows touch."""
    return [r for r in range(save_world)
            if rows & set(range(*nw.rows_of(save_world, r)))]


SAVE_AT = [0, 0, 1, 1, 2, 2]


def test_three_nodes_restore_into_two(make_cluster, tmp_path):
    """3 nodes (2 ranks each, memory tiers on) save a 6-rank checkpoint
    through CheckpointManager(cluster="auto"); it restores into 2 nodes
    twice. 4 ranks (2 + 2): each node's rows are whole saved records, which
    its ranks split across (rank 1 needs parts of two saved records, read
    once for the node). 5 ranks (3 + 2): node 0's rows end inside a saved
    record, whose CRC check reads it whole."""
    c = make_cluster(3, daemon_options={"memory_tier_bytes": "128M"})
    for i in range(3):
        c.start_daemon(i)
    kw = dict(kind="big", base=c.shared / "big", refs=tmp_path / "refs",
              logdir=tmp_path / "logs", client_lib=c.build_dir / "client" / "libckptd_client.so")
    outs, skip = nj.run_job(c, "save", SAVE_AT, modes=["manager"], timeout=150, **kw)
    assert skip is None, skip
    assert len(nj.results(outs, "RESULT save manager")) == len(SAVE_AT), outs
    for load_at in ([0, 0, 1, 1], [0, 0, 0, 1, 1]):
        restore_and_measure(c, kw, load_at)


def restore_and_measure(c, kw, load_at):
    before = [counters(c, i) for i in range(2)]
    outs, skip = nj.run_job(c, "load", load_at, modes=["ckptd@manager"], timeout=150, **kw)
    assert skip is None, skip
    after = [counters(c, i) for i in range(2)]
    figures, checks = [], []
    for node in range(2):
        delta = {k: after[node][k] - before[node][k] for k in after[node]}
        loaders = [r for r, n in enumerate(load_at) if n == node]
        rows = union_rows(nw.rows_of(len(load_at), r) for r in loaders)
        need = len(rows) * ROW_BYTES + REP_BYTES
        writers = [r for r, n in enumerate(SAVE_AT) if n == node]
        written = union_rows(nw.rows_of(len(SAVE_AT), r) for r in writers)
        own = len(rows & written) * ROW_BYTES + (REP_BYTES if 0 in writers else 0)
        # Others' saved records that the node's rows touch, read whole.
        touched = sum(len(range(*nw.rows_of(len(SAVE_AT), r))) * ROW_BYTES
                      for r in saved_records(len(SAVE_AT), rows) if r not in writers)
        touched += 0 if 0 in writers else REP_BYTES
        # What the node read from outside itself: the data files, and the
        # other daemons' memory (each holds what its node wrote:
        # peer_restore=prefer reads those records from there).
        outside = delta["files"] + delta["peer"]
        figures.append(f"node {node}: ranks {loaders} need {need} B, {need - own} B of it "
                       f"written by other nodes ({touched} B in the records touched); read "
                       f"from the data files {delta['files']:.0f} B and other daemons' "
                       f"memory {delta['peer']:.0f} B = "
                       f"{outside / max(1, need - own):.3f}x the others' part, "
                       f"{outside / need:.3f}x need; memory tier served "
                       f"{delta['memory']:.0f} B (this node wrote {own} B of it); storage "
                       f"{delta['storage']:.0f} B, lent {delta['lent']:.0f} B, delivered "
                       f"{delta['delivered']:.0f} B, group batches {delta['batches']:.0f}")
        checks.append((figures[-1], dict(delta, outside=outside), need, own, touched))
    print("\n".join([f"restore 3 nodes (6 ranks) -> 2 nodes ({len(load_at)} ranks):"] + figures))
    for fig, delta, need, own, touched in checks:
        assert delta["batches"] == 1, fig  # one group batch: the node read once
        # What the node's ranks need, against what its daemon read from the
        # files: the goal. Sharper: the other nodes' records its boxes touch,
        # each read once (a record needed in part is read whole for its CRC
        # check; ~3 x 64 KiB of archive headers a record).
        assert delta["outside"] <= 1.1 * need, fig
        assert delta["outside"] <= 1.1 * touched, fig
        # The others' bytes came from outside the node: the files, or the
        # memory of the daemons that wrote them.
        assert delta["outside"] >= need - own, fig
        # What the node wrote, from its memory tier: served from it, or lent
        # (ranks copy whole held records straight out of the tier's file).
        assert delta["memory"] + delta["lent"] >= own > 0, fig
        assert delta["delivered"] >= need, fig
