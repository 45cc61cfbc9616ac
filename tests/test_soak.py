"""A shortened soak (benchmarks/soak.py with 5,000 requests) on each backend: no errors, right answers, flat memory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parent.parent / "benchmarks" / "soak.py"


@pytest.mark.parametrize("backend", ["granian", "gunicorn"])
def test_short_soak_passes(backend: str) -> None:
    """5,000 mixed valid and malformed requests at 32 connections: every check of the soak passes."""
    run = subprocess.run(
        # (--results -: a test never writes the recorded figures in benchmarks/results, which the docs page shows)
        [sys.executable, str(SOAK), "--requests", "5000", "--warmup", "1000", "--server", backend, "--results", "-"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "connection errors: 0; wrong answers: 0; server alive: True" in run.stdout
    assert "soak: PASS" in run.stdout
