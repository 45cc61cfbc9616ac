"""A run passes only if every collected test reported a result: a check that silently does not run is a defect.

Under pytest-xdist, items that share a node id (as schemathesis's own ``parametrize`` once made them) are run once
or not at all, and the run still ended green with fewer results than items. tests/conftest.py imports these hooks;
on the xdist controller they count the results the workers send.
"""

from __future__ import annotations

import pytest

_started: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Count each item whose setup reported (passed, failed or skipped): every item that ran has one."""
    if report.when == "setup":
        _started.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail a green run whose reported items are fewer than its collected ones."""
    config = session.config
    if hasattr(config, "workerinput") or config.option.collectonly or exitstatus != pytest.ExitCode.OK:
        return  # a worker runs only its share; a stopped or failed run already says so
    if session.shouldstop or session.shouldfail:
        return
    if len(_started) != session.testscollected:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        message = (
            f"{session.testscollected} tests collected but {len(_started)} reported a result: "
            "some never ran (are two items' node ids the same?)"
        )
        if reporter is not None:
            reporter.write_line(f"ERROR: {message}", red=True, bold=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
