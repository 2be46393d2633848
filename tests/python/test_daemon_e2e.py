"""End-to-end saves through a real daemon (build/bin/ckptd) and real trainer
rank processes (build/tools/ckptd_trainer), each checkpoint checked payload
by payload with torch 1.13's torch.load (daemon_util.verify_checkpoint):
several world sizes, dtypes and layouts, deduplication of replicated items,
streaming through a staging budget smaller than a rank, retention, the
overwrite rule and a daemon restart.
"""
import json
import re

import pytest

import daemon_util as du
import sample_spec
from daemon_util import TrainerSpec, assert_committed, run_ranks, state_name, verify_checkpoint


def test_expected_values_match_sample_spec(torch):
    """The vectorized formula used to check payloads agrees with
    sample_spec's pure-Python one (so the checks below cannot be vacuous)."""
    for dtype in ["float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8",
                  "uint8", "bool"]:
        for shape, offsets, sizes in [([5, 7], [1, 2], [3, 4]), ([9], [0], [9]), ([], [], []),
                                      ([2, 3, 4], [1, 0, 2], [1, 3, 2])]:
            got = du.expected_box(torch, dtype, shape, 3, offsets, sizes)
            assert str(got.dtype) == f"torch.{dtype}"
            assert list(got.shape) == sizes
            assert sample_spec.torch_bytes(got) == \
                sample_spec.box_bytes(dtype, shape, 3, offsets, sizes), (dtype, shape)


CASES = {
    "1rank": (1, dict(mb=1, dtype="float32,bfloat16")),
    "2ranks-cols-strided": (2, dict(mb=1, dtype="float16,int64,float32,bfloat16", layout="cols",
                                    strided=True, extra_items=2)),
    "4ranks-dedup-lowest": (4, dict(mb=0.25, dtype="int32,float64", dedup_lowest=True)),
    "8ranks": (8, dict(mb=0.5, dtype="float32,bfloat16,int64", extra_items=3)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_save_commits_and_verifies(make_daemon, torch, tmp_path, case):
    world, flags = CASES[case]
    d = make_daemon()
    results = run_ranks(d, world, "jobA/step1", **flags)
    assert_committed(results, d)
    ckdir = d.root / "jobA" / "step1"
    assert {r["last"]["checkpoint"] for r in results} == {str(ckdir)}
    spec = TrainerSpec.of(world, **flags)
    items = verify_checkpoint(ckdir, spec, torch, workdir=tmp_path)

    # Dedup: the replicated tensor and bytes item were given by every rank
    # and are stored once (one chunk / one storage entry in .metadata).
    assert len(items["embed"]["chunks"]) == 1, items["embed"]
    entries = du.storage_entries(items)
    assert sum(1 for fqn, _ in entries if fqn == "step") == 1
    distinct = sum(len({(tuple(o), tuple(s)) for _, o, s in t.chunks}) for t in spec.tensor_specs())
    assert len(entries) == distinct + len(spec.object_specs())
    if flags.get("dedup_lowest"):
        assert items["embed"]["chunks"][0]["storage"]["file"] == "__0_0.distcp"
        assert items["step"]["storage"]["file"] == "__0_0.distcp"

    # The daemon's account of it (ckptctl status --json).
    st = json.loads(d.ckptctl("status", str(ckdir), "--json").stdout)
    files = sorted(ckdir.glob("__*.distcp"))
    assert st["state"] == "COMMITTED" and st["error"] == ""
    assert (st["world_size"], st["ranks_staged"]) == (world, world)
    assert st["total_bytes"] == st["staged_bytes"] == sum(r["last"]["bytes"] for r in results)
    assert st["items"] == sum(spec.items_per_rank(r) for r in range(world))
    assert st["files"] == len(files)
    assert st["file_bytes"] == st["written_bytes"] == sum(f.stat().st_size for f in files)
    assert st["created_unix_ms"] <= st["staged_unix_ms"] <= st["finished_unix_ms"]


def test_streaming_through_a_small_staging_budget(make_daemon, torch, tmp_path):
    """Ranks of ~16 MiB through a 4 MiB budget (2 MiB batches)."""
    d = make_daemon(staging_budget="4M")
    info = d.info()
    assert (info.staging_budget_bytes, info.max_batch_bytes) == (4 << 20, 2 << 20)
    flags = dict(mb=16)
    results = run_ranks(d, 2, "stream/step1", **flags)
    assert_committed(results, d)
    for r in results:
        assert r["last"]["bytes"] > 16 << 20
        assert r["last"]["batches"] >= 9, r["last"]  # > 16 MiB in <= 2 MiB batches
    # No arena larger than a batch was registered: the bytes really streamed.
    sizes = [int(s) for s in re.findall(r"arena \d+ registered: '[^']*' (\d+) bytes", d.log())]
    assert len(sizes) == 2 and max(sizes) <= 2 << 20, sizes
    verify_checkpoint(d.root / "stream" / "step1", TrainerSpec.of(2, **flags), torch,
                      workdir=tmp_path)


def test_retention_keeps_the_last_n(make_daemon, torch, tmp_path):
    d = make_daemon(keep_last_n=2)
    for step in range(1, 5):
        assert_committed(run_ranks(d, 2, f"ret/step{step}", mb=0.25, step=step, job="ret"), d)
    job_dir = d.root / "ret"
    # Retention runs right after each commit (the trainers may see the commit
    # a moment before the deletion, and the listing may show a deletion a
    # moment before the daemon logs it).
    deleted = [f"retention (keep_last_n=2): deleted {job_dir}/step{step}" for step in (1, 2)]
    du.poll(lambda: sorted(p.name for p in job_dir.iterdir()) == ["step3", "step4"]
            and all(line in d.log() for line in deleted), 30,
            "retention to leave step3 and step4 and log the deletions of step1 and step2",
            on_timeout=lambda: f"{sorted(job_dir.iterdir())}\n{d.log_tail()}")
    for step in (3, 4):
        verify_checkpoint(job_dir / f"step{step}", TrainerSpec.of(2, mb=0.25, step=step), torch,
                          workdir=tmp_path)
    # The retained history survives a restart: the disk listing of the job
    # shows exactly the two kept checkpoints.
    d.restart()
    listed = json.loads(d.ckptctl("list", "--json", "--include-disk", "--job", "ret").stdout)
    assert [(c["checkpoint_id"], c["state"]) for c in listed] == \
        [(str(job_dir / "step3"), "COMMITTED"), (str(job_dir / "step4"), "COMMITTED")]


def test_second_save_to_the_same_path_needs_overwrite(make_daemon, torch, tmp_path):
    d = make_daemon()
    ckdir = d.root / "ow" / "ck"
    assert_committed(run_ranks(d, 2, "ow/ck", mb=0.25, step=1), d)
    before = {p.name: p.read_bytes() for p in ckdir.iterdir()}

    results = run_ranks(d, 2, "ow/ck", mb=0.25, step=2)
    for r in results:
        last = r["last"]
        assert r["rc"] == 1, r
        # Refused either on the Save call or (after "staged") by the commit.
        code = last.get("code", last.get("error_code"))
        msg = last.get("save_error", last.get("error", ""))
        assert code == du.CODE["FAILED_PRECONDITION"], r
        assert "already holds a committed checkpoint" in msg and "overwrite" in msg, r
    st = d.status(ckdir)
    assert state_name(st.state) == "FAILED"
    assert st.error_code == du.CODE["FAILED_PRECONDITION"] and "overwrite" in st.error
    # The committed checkpoint is untouched.
    assert {p.name: p.read_bytes() for p in ckdir.iterdir()} == before
    verify_checkpoint(ckdir, TrainerSpec.of(2, mb=0.25, step=1), torch, workdir=tmp_path)

    assert_committed(run_ranks(d, 2, "ow/ck", mb=0.25, step=2, overwrite=True), d)
    verify_checkpoint(ckdir, TrainerSpec.of(2, mb=0.25, step=2), torch, workdir=tmp_path)


def test_restart_keeps_serving_and_lists_earlier_commits(make_daemon, torch, tmp_path):
    d = make_daemon()
    assert_committed(run_ranks(d, 2, "rs/a", mb=0.25, job="rs"), d)
    d.restart()  # SIGTERM (exit 0 asserted), start again on the same directories
    assert "recovery: 0 unfinished checkpoints removed, 0 found committed, 0 errors" in \
        d.log_since_start()
    assert_committed(run_ranks(d, 2, "rs/b", mb=0.25, job="rs", step=8), d)
    a, b = str(d.root / "rs" / "a"), str(d.root / "rs" / "b")

    with_disk = json.loads(d.ckptctl("list", "--json", "--include-disk").stdout)
    assert [(c["checkpoint_id"], c["job"], c["state"]) for c in with_disk] == \
        [(a, "rs", "COMMITTED"), (b, "rs", "COMMITTED")]
    memory_only = json.loads(d.ckptctl("list", "--json").stdout)
    assert [c["checkpoint_id"] for c in memory_only] == [b]
    assert json.loads(d.ckptctl("list", "--json", "--include-disk", "--job", "other").stdout) == []
    # The same through the protocol.
    assert [c.checkpoint_id for c in d.list(job="rs", include_disk=True)] == [a, b]

    verify_checkpoint(a, TrainerSpec.of(2, mb=0.25), torch, workdir=tmp_path)
    verify_checkpoint(b, TrainerSpec.of(2, mb=0.25, step=8), torch, workdir=tmp_path)
    d.stop()


def test_many_items_per_rank(make_daemon, torch, tmp_path):
    flags = dict(mb=0.25, extra_items=300, tensors=2)
    d = make_daemon()
    assert_committed(run_ranks(d, 2, "many/ck", **flags), d)
    items = verify_checkpoint(d.root / "many" / "ck", TrainerSpec.of(2, **flags), torch,
                              convert=False)
    assert len(items) == 2 + 1 + 2 * 300 + 1 + 2


def test_progress_reports_written_bytes_during_the_write(make_daemon):
    d = make_daemon(write_rate_limit="8M")
    ckdir = d.root / "progress" / "ck"
    d.trainer("progress/ck", 0, 1, mb=16)
    du.poll(lambda: du.data_bytes(ckdir) >= 2 << 20, 60, "2 MiB in the data file")
    st = d.status(ckdir)
    assert state_name(st.state) == "WRITING", st
    if st.written_bytes == 0:
        raise AssertionError(f"{du.data_bytes(ckdir)} bytes in the file, but written_bytes is 0")


def test_edge_shapes_through_the_raw_protocol(make_daemon, torch):
    """A 0-d tensor, an empty tensor (no bytes, no extent), a tensor whose
    bytes come in two extents, and a rank whose only item is deduplicated
    away."""
    d = make_daemon()
    raw = du.RawClient(d)
    specs = [("scalar", [], 5), ("empty", [0, 5], 6), ("split", [7, 3], 7), ("repl", [4], 8)]
    blobs = {fqn: sample_spec.box_bytes("float32", shape, seed) for fqn, shape, seed in specs}
    # Rank 0: everything; "split" in two extents, placed out of arena order.
    arena = blobs["scalar"] + blobs["split"][40:] + blobs["split"][:40] + blobs["repl"]
    a0 = raw.arena(arena)
    s = len(blobs["scalar"])
    rest = len(blobs["split"]) - 40
    extents = [raw.extent(0, 0, 0, s), raw.extent(2, 0, s + rest, 40), raw.extent(2, 40, s, rest),
               raw.extent(3, 0, s + rest + 40, len(blobs["repl"]))]
    r0 = raw.request("edge/ck", 0, 2, items=[raw.tensor(f, sh) for f, sh, _ in specs],
                     extents=extents, arena_id=a0)
    # Rank 1: only the replicated tensor.
    r1 = raw.tensor_rank("edge/ck", "repl", [4], [0], [4], rank=1, world=2, seed=8)
    for req in (r1, r0):
        req.options.dedup_save_to_lowest_rank = True  # "repl" goes to rank 0
        assert state_name(raw.save(req).state) == "STAGED"
    st = d.wait_final("edge/ck")
    assert state_name(st.state) == "COMMITTED", st
    ckdir = d.root / "edge" / "ck"
    assert du.run(du.bin_path("ckptctl"), "verify", ckdir, check=False).returncode == 0
    items = du.list_items(ckdir)
    assert sorted(items) == sorted(f for f, _, _ in specs)
    for fqn, shape, seed in specs:
        (chunk,) = items[fqn]["chunks"]
        v = du.torch_load_payload(torch, du.payload_slice(ckdir, chunk["storage"]))
        assert list(v.shape) == shape and v.dtype == torch.float32, (fqn, v)
        assert sample_spec.torch_bytes(v) == blobs[fqn], fqn
    assert items["repl"]["chunks"][0]["storage"]["file"] == "__0_0.distcp"
    # Rank 1 keeps an empty file of its own (stock DCP writes one too).
    assert sorted(p.name for p in ckdir.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert (ckdir / "__1_0.distcp").stat().st_size == 0
    assert (st.files, st.items) == (2, 5)
