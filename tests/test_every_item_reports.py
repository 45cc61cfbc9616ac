"""The suite's own guard: a run in which a collected test gave no result fails, even if all that ran passed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CONFTEST = """
import importlib.util

import pytest

_spec = importlib.util.spec_from_file_location("_every_item_reports", {module!r})
_guard = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_guard)
pytest_runtest_logreport = _guard.pytest_runtest_logreport
pytest_sessionfinish = _guard.pytest_sessionfinish


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    # An item handled without a report, as xdist does with an item whose node id another item has.
    return True if item.name == "test_silent" and {silent} else None
"""

TESTS = """
def test_runs():
    pass


def test_silent():
    pass
"""


def _run(tmp_path: Path, *, silent: bool, args: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(
        textwrap.dedent(CONFTEST.format(silent=silent, module=str(ROOT / "tests" / "_every_item_reports.py")))
    )
    (tmp_path / "test_sample.py").write_text(textwrap.dedent(TESTS))
    environment = dict(os.environ)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--rootdir", str(tmp_path), *args]
    return subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args", [(), ("-n", "2", "--dist", "loadfile")], ids=["one process", "xdist"])
def test_a_collected_test_without_a_result_fails_the_run(tmp_path: Path, args: tuple[str, ...]) -> None:
    """2 collected, 1 reported: the run exits 1 and says how many never ran, though every test that ran passed."""
    result = _run(tmp_path, silent=True, args=args)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "2 tests collected but 1 reported a result" in result.stdout


@pytest.mark.parametrize("args", [(), ("-n", "2", "--dist", "loadfile"), ("--co",)], ids=["one process", "xdist", "co"])
def test_a_run_where_every_test_reports_passes(tmp_path: Path, args: tuple[str, ...]) -> None:
    """Every collected test reported (or only collected with --co): the guard stays silent and the run is green."""
    result = _run(tmp_path, silent=False, args=args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "reported a result" not in result.stdout
