"""ckptctl gc ROOT on real checkpoints and a real daemon: retention by step
(--keep-last, --keep-every, never the newest), unfinished directories
removed only when no daemon writes them and they are older than --min-age,
files that are not a checkpoint's left alone, --dry-run and --json."""
import json
import os
import subprocess
import time

import daemon_util as du

BUILD_DIR = du.BUILD_DIR


def demo(path):
    subprocess.run([str(BUILD_DIR / "bin" / "ckptd_demo"), "--dir", str(path), "--size-mb", "1",
                    "--save-ranks", "2", "--load-ranks", "1"], check=True, capture_output=True)


def gc(*args, check=True):
    proc = subprocess.run([str(BUILD_DIR / "bin" / "ckptctl"), "gc", *map(str, args)],
                          capture_output=True, text=True)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def age(path, seconds):
    t = time.time() - seconds
    for p in [path, *path.iterdir()]:
        os.utime(p, (t, t))


def test_retention_unfinished_and_dry_run(tmp_path):
    root = tmp_path / "root"
    for s in (100, 200, 300, 400, 500):
        demo(root / "run" / f"step_{s}")
    demo(root / "other" / "final")       # alone in its directory: the newest
    stale = root / "run" / "step_600"     # a crashed save: data, no .metadata
    stale.mkdir()
    (stale / "__0_0.distcp").write_bytes(b"x" * 1000)
    (stale / ".metadata.tmp").write_bytes(b"y")
    age(stale, 3 * 3600)
    fresh = root / "run" / "step_700"     # being written somewhere right now
    fresh.mkdir()
    (fresh / "__1_0.distcp").write_bytes(b"z")
    mixed = root / "mixed" / "step_1"     # a crashed save that holds a user file
    mixed.mkdir(parents=True)
    (mixed / "__0_0.distcp").write_bytes(b"x")
    (mixed / "notes.txt").write_text("mine")
    age(mixed, 2 * 3600)
    (root / "notes").mkdir()
    (root / "notes" / "readme.txt").write_text("not a checkpoint")
    nosock = ["--socket", str(tmp_path / "no.sock")]

    out = gc(root, "--keep-last", "2", "--keep-every", "200", "--dry-run", *nosock).stdout
    assert "no daemon answered" in out
    plan = {e["dir"]: e for e in json.loads(
        gc(root, "--keep-last", "2", "--keep-every", "200", "--dry-run", "--json",
           *nosock).stdout)}
    run = str((root / "run").resolve())
    want_removed = {f"{run}/step_100", f"{run}/step_300", f"{run}/step_600",
                    str(mixed.resolve())}
    assert {d for d, e in plan.items() if e["action"] == "remove"} == want_removed, plan
    assert "multiple of --keep-every 200" in plan[f"{run}/step_200"]["reason"]
    assert "newest committed" in plan[f"{run}/step_500"]["reason"]
    assert "within --min-age" in plan[f"{run}/step_700"]["reason"]
    assert plan[str((root / "other" / "final").resolve())]["action"] == "keep"
    assert all((root / "run" / f"step_{s}").exists() for s in (100, 300, 600))  # dry run

    gc(root, "--keep-last", "2", "--keep-every", "200", *nosock)
    left = sorted(p.name for p in (root / "run").iterdir())
    assert left == ["step_200", "step_400", "step_500", "step_700"], left
    assert (root / "notes" / "readme.txt").exists()
    assert sorted(p.name for p in mixed.iterdir()) == ["notes.txt"]  # only ckpt files go
    for s in ("step_200", "step_400", "step_500"):
        assert subprocess.run([str(BUILD_DIR / "bin" / "ckptctl"), "verify",
                               str(root / "run" / s)], capture_output=True).returncode == 0
    # Without --keep-last only unfinished directories are candidates.
    out = gc(root, "--min-age", "0s", "--dry-run", *nosock).stdout
    assert "would remove" in out and "step_700" in out and "step_400" not in \
        [line for line in out.splitlines() if line.startswith("would remove")]


def test_bad_arguments(tmp_path):
    assert gc(tmp_path / "missing", check=False).returncode == 3
    assert gc(tmp_path, "--keep-every", "5", check=False).returncode == 2
    assert gc(tmp_path, "--min-age", "soon", check=False).returncode == 2


def test_a_checkpoint_the_daemon_is_writing_is_kept(make_daemon, tmp_path):
    d = make_daemon(write_rate_limit="2M")
    ckdir = d.root / "gc" / "ck"
    trainers = [d.trainer("gc/ck", r, 2, mb=16) for r in range(2)]
    d.wait_state(ckdir, "WRITING")
    du.poll(lambda: du.data_bytes(ckdir) > 0, 30, "data in the files")
    plan = {e["dir"]: e for e in json.loads(
        gc(d.root, "--min-age", "0s", "--json", "--socket", d.socket).stdout)}
    entry = plan[str(ckdir.resolve())]
    assert entry["action"] == "keep" and entry["reason"] == "the daemon is writing it", entry
    assert ckdir.exists()
    d.ckptctl("cancel", str(ckdir))
    for t in trainers:
        t.wait(60)
