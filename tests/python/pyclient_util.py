"""Helpers for the tests of the Python package (client/python/ckptd): makes
the package importable from the source tree with the freshly built native
library ($CKPTD_BUILD_DIR/client/libckptd_client.so), and runs worker
processes (pyclient_worker.py) with the same environment."""
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD_DIR = pathlib.Path(os.environ.get("CKPTD_BUILD_DIR", REPO / "build"))
PACKAGE_DIR = REPO / "client" / "python"
NATIVE_LIB = BUILD_DIR / "client" / "libckptd_client.so"
WORKER = pathlib.Path(__file__).resolve().parent / "pyclient_worker.py"


def asan_build():
    """Whether the native library is an ASan/UBSan build (CKPTD_BUILD_DIR=
    build-asan): Python itself is not instrumented, so the library cannot be
    dlopen'ed into it (the ASan runtime must come first). The release run
    covers these tests; the C ABI under them runs under ASan in ctest
    (c_reader_test, client_c_api_test)."""
    try:
        with open(NATIVE_LIB, "rb") as f:
            return b"__asan_init" in f.read()  # gcc and clang ASan builds
    except FileNotFoundError:
        return False


ASAN_SKIP_REASON = ("libckptd_client.so is an ASan build, which an uninstrumented Python cannot "
                    "load; the release run covers the Python client")


def env():
    """The environment for a process that imports ckptd from the tree."""
    e = dict(os.environ)
    e["CKPTD_CLIENT_LIB"] = str(NATIVE_LIB)
    e["PYTHONPATH"] = os.pathsep.join(
        [str(PACKAGE_DIR), str(WORKER.parent)] + ([e["PYTHONPATH"]] if e.get("PYTHONPATH") else []))
    return e


def setup_import():
    """Puts client/python on sys.path (ckptd loads the native library at
    first use, so importing it is always safe)."""
    if not NATIVE_LIB.exists():
        raise AssertionError(f"{NATIVE_LIB} is not built (build the project first)")
    os.environ["CKPTD_CLIENT_LIB"] = str(NATIVE_LIB)
    if str(PACKAGE_DIR) not in sys.path:
        sys.path.insert(0, str(PACKAGE_DIR))


def run_workers(args_per_rank, timeout=300):
    """Starts one pyclient_worker.py per argument list, waits for all, and
    raises with every worker's output if one fails."""
    procs = [subprocess.Popen([sys.executable, str(WORKER), *map(str, a)], env=env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              stdin=subprocess.DEVNULL)
             for a in args_per_rank]
    outs = []
    failed = False
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            out += f"\n<killed after {timeout}s>"
        outs.append(out)
        failed |= p.returncode != 0
    if failed:
        report = "\n".join(f"--- worker {i} (exit {p.returncode}) ---\n{o}"
                           for i, (p, o) in enumerate(zip(procs, outs)))
        raise AssertionError(f"a worker failed:\n{report}")
    return outs
