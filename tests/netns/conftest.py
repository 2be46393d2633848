"""Host-side suites on tests/testing/netns_cluster.py: every node in its own
network namespace, its own daemon; trainers in the nodes' namespaces (torch
2.x through the Debian roots). Run as root: `scripts/test.sh --netns`, or
`/usr/bin/python3 -m pytest tests/netns -rs`. Everything here skips with the
reason where namespaces cannot be made (not root, no `ip netns`)."""
import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
for sub in ("tests/testing", "tests/interop", "tests/python"):
    p = str(REPO / sub)
    if p not in sys.path:
        sys.path.insert(0, p)

import netns_cluster  # noqa: E402


@pytest.fixture
def make_cluster(tmp_path):
    """make_cluster(n, **kw) -> a NetnsCluster under tmp_path, closed after the
    test (namespaces, links and processes removed even when it fails)."""
    reason = netns_cluster.skip_reason()
    if reason:
        pytest.skip(reason)
    made = []

    def make(n, **kw):
        c = netns_cluster.NetnsCluster(n, tmp_path / f"c{len(made)}", **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()
