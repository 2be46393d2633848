"""Shared pytest fixtures for ckptd's Python-side tests.

These tests run under Debian's /usr/bin/python3 with torch 1.13 (CPU). They
drive helper executables built from tests/tools/*.cc, found under
$CKPTD_BUILD_DIR/tools (default: <repo>/build/tools).
"""
import os
import pathlib
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD_DIR = pathlib.Path(os.environ.get("CKPTD_BUILD_DIR", REPO / "build"))


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "once: a long multi-process suite (soak, kill -9 points, ENOSPC on a real "
        "file system) that scripts/test.sh runs in the release pass only, not "
        "again under ASan")


def tool_path(name: str) -> pathlib.Path:
    return BUILD_DIR / "tools" / name


def bin_path(name: str) -> pathlib.Path:
    return BUILD_DIR / "bin" / name


@pytest.fixture
def tool():
    """tool(name, *args, check=True, input=None) runs a helper tool and
    returns the CompletedProcess (text mode)."""

    def run(name, *args, check=True, input=None):
        exe = tool_path(name)
        if not exe.exists():
            pytest.fail(f"helper tool {exe} not built (build the project first)")
        proc = subprocess.run([str(exe), *map(str, args)], capture_output=True,
                              text=True, input=input)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{name} {' '.join(map(str, args))} exited {proc.returncode}:\n"
                f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
        return proc

    return run


@pytest.fixture
def ckptctl():
    def run(*args, check=True):
        exe = bin_path("ckptctl")
        if not exe.exists():
            pytest.fail(f"{exe} not built")
        proc = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"ckptctl {' '.join(map(str, args))} exited {proc.returncode}:\n"
                f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
        return proc

    return run


@pytest.fixture
def torch():
    """Debian's torch 1.13. CI sets CKPTD_REQUIRE_TORCH=1, where a missing
    torch is a failure rather than a skip."""
    if os.environ.get("CKPTD_REQUIRE_TORCH") == "1":
        import torch as t  # noqa: F401  (ImportError fails the test)
        return t
    return pytest.importorskip("torch")


@pytest.fixture
def make_daemon(tmp_path):
    """make_daemon(name="d", start=True, **flags) returns a daemon_util.Daemon
    (a real build/bin/ckptd) whose socket, checkpoint root, shm and state
    directories live under tmp_path/name; flags become --key=value. Every
    daemon made, and every trainer process spawned through one, is killed at
    teardown, also when the test failed; then any sanitizer report in their
    output fails the test."""
    import daemon_util

    made = []

    def make(name="d", start=True, **flags):
        d = daemon_util.Daemon(tmp_path / name, **flags)
        made.append(d)
        if start:
            d.start()
        return d

    yield make
    failures = []
    for d in made:
        try:
            d.close()
        except Exception as e:  # noqa: BLE001  (close the others anyway)
            failures.append(f"closing {d.base}: {e!r}")
    assert not failures, failures
    reports = [r for d in made for r in d.sanitizer_reports()]
    assert not reports, "sanitizer reports:\n" + "\n".join(reports[:20])
