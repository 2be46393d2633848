"""ckptd's reader against checkpoints that stock torch>=2.4 dcp.save wrote,
committed under tests/fixtures/dcp_torch<version>/<name>/ by
tests/interop/make_fixtures.py (run on a machine with torch 2.x; see
tests/fixtures/README.md).

Needs no torch: interop_tool lists and reads every tensor (full and
resharded boxes) and bytes item, and the sha256s / values must equal those
in each fixture's expected.json, which are themselves re-derived here from
the formula. Skips with a visible reason while no fixture is committed.
"""
import pathlib
import sys

import pytest

TESTS = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "interop"))

import fixture_check  # noqa: E402
import interop_common as ic  # noqa: E402

FIXTURES_ROOT = TESTS / "fixtures"
FIXTURES = sorted(p.parent for p in FIXTURES_ROOT.glob("*/*/expected.json"))


if ic.sanitizer_build():
    # The ASan pass reads the newest torch's sets (every format and layout);
    # the release pass reads them all (each takes ~8 s under ASan).
    newest = max((p.parent.name for p in FIXTURES),
                 key=lambda n: tuple(int(x) for x in n[len("dcp_torch"):].split(".")),
                 default=None)
    FIXTURES = [p for p in FIXTURES if p.parent.name == newest]


def fixture_id(p):
    return p if p is None else f"{p.parent.name}/{p.name}"


@pytest.mark.parametrize("fixture", FIXTURES or [None], ids=fixture_id)
def test_reader_matches_torch2_fixture(fixture):
    if fixture is None:
        pytest.skip("no torch 2.x fixtures committed yet (tests/fixtures/dcp_torch*/; "
                    "make them with tests/interop/make_fixtures.py on a torch>=2.4 machine)")
    exe = ic.tool_path("interop_tool")
    if not exe.exists():
        pytest.fail(f"helper tool {exe} not built (build the project first)")
    fixture_check.check_fixture(fixture)


def test_fixture_sets_are_complete():
    """Each committed version directory has its manifest and the fixtures
    make_fixtures.py always makes."""
    roots = sorted(p for p in FIXTURES_ROOT.glob("dcp_torch*") if p.is_dir())
    if not roots:
        pytest.skip("no torch 2.x fixtures committed yet")
    for root in roots:
        assert (root / "MANIFEST.json").is_file(), root
        names = {p.parent.name for p in root.glob("*/expected.json")}
        assert {"plain", "multi_file", "per_item_files", "dtensor_2ranks",
                "dtensor_4ranks"} <= names, (root, names)
