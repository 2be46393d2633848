"""pytest setup for the PyTorch >= 2.4 interop suite (tests/interop).

Every test module here gates itself on `interop_common.torch_status()`:
`pytestmark = pytest.mark.skipif(torch is None, reason=...)`, so where
torch >= 2.4 is not importable (Debian's /usr/bin/python3 has torch 1.13)
each test is reported SKIPPED with the reason "needs torch>=2.4 (found
1.13...)". Nothing imports torch.distributed.checkpoint unless torch is new
enough, so collection never errors, and `pytest tests/interop` exits 0 on
its own as well as combined with tests/python.

The C++ executables are found under $CKPTD_BUILD_DIR (default <repo>/build):
tools/interop_tool, bin/ckptd_demo and (optional) bin/ckptctl.
"""
import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import interop_common  # noqa: E402


def pytest_report_header(config):
    torch, reason = interop_common.torch_status()
    if torch is None:
        return f"ckptd interop: {reason}"
    return (f"ckptd interop: torch {torch.__version__}, build dir "
            f"{interop_common.build_dir()}")


@pytest.fixture(scope="session")
def sample_dir(tmp_path_factory):
    """interop_tool's 4-rank sample checkpoint, written once per session."""
    d = tmp_path_factory.mktemp("ckptd_sample") / "ckpt"
    interop_common.write_sample(d)
    return d


@pytest.fixture(scope="session")
def sample_items(sample_dir):
    return interop_common.list_items(sample_dir)
