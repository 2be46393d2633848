"""How scripts/test.sh's full run splits the pytest suites between its passes.

The ASan pass runs first and writes the node id of every test that passed
to $CKPTD_PYTEST_PASSED_OUT. The release pass then gets that file as
$CKPTD_PYTEST_PASSED_IN and leaves those tests out: each test runs once,
under ASan where it can. The release pass runs what the ASan pass could not
run (the tests of the Python client library, which an uninstrumented Python
cannot load from an ASan build; the `once` suites; what skipped there).

Neither variable set (every other way of running pytest): nothing changes.
"""
import os


def pytest_collection_modifyitems(config, items):
    path = os.environ.get("CKPTD_PYTEST_PASSED_IN")
    if not path:
        return
    with open(path, encoding="utf-8") as f:
        passed = {line.rstrip("\n") for line in f if line.strip()}
    keep, drop = [], []
    for item in items:
        if item.nodeid in passed:
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"ckptd: {len(drop)} tests left out, which passed in the "
                            f"ASan pass ({path}); {len(keep)} run here")


def pytest_runtest_logreport(report):
    path = os.environ.get("CKPTD_PYTEST_PASSED_OUT")
    if path and report.when == "call" and report.passed:
        with open(path, "a", encoding="utf-8") as f:
            f.write(report.nodeid + "\n")
