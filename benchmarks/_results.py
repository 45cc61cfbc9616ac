"""What every benchmark leaves besides its printout: its figures as a small JSON file, ``benchmarks/results/NAME.json``
(``NAME-VARIANT.json`` for a ``--quick`` run or another mode), from which ``scripts/benchmark_charts.py`` draws the
charts and tables of the performance page (docs/explanation/performance.md).

A file holds one run: when (UTC), on which commit, on what machine (CPUs, load average before and after), how it was
set up, and for each case (a *group*) every contender's figure; then the *comparisons* the script prints (ours / a
peer, with the issue's target where there is one). ``--results PATH`` writes elsewhere; ``--results -`` nowhere.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--results",
        metavar="PATH",
        help="where to write this run's figures as JSON (default: benchmarks/results/NAME.json; '-': nowhere)",
    )


def _commit() -> str | None:
    """The commit measured, with ``+changes`` when the tree differs from it; None outside a git checkout."""
    root = RESULTS.parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
        status = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=root, capture_output=True, text=True)
    except OSError:
        return None
    if head.returncode:
        return None
    return head.stdout.strip() + ("+changes" if status.stdout.strip() else "")


class Run:
    """One run's figures, started when the benchmark starts (its date and the load before it)."""

    def __init__(self, benchmark: str, variant: str | None = None) -> None:
        self.benchmark, self.variant = benchmark, variant
        self.started = datetime.now(timezone.utc)
        self.load_before = os.getloadavg()[0]
        self.groups: list[dict[str, Any]] = []
        self.comparisons: list[dict[str, Any]] = []

    def group(
        self,
        name: str,
        unit: str,
        better: str,
        values: dict[str, float],
        ours: tuple[str, ...] | list[str] = (),
        details: dict[str, str] | None = None,
        chart: bool = True,
    ) -> None:
        """A case: each contender's figure in ``unit`` (``better``: "higher" or "lower"); ``ours`` names ours;
        ``details`` a short note per contender (spread, latency); ``chart`` False keeps it off the page."""
        assert better in ("higher", "lower"), better
        contenders = []
        for contender, value in values.items():
            entry: dict[str, Any] = {"name": contender, "value": value, "ours": contender in ours}
            if details and contender in details:
                entry["detail"] = details[contender]
            contenders.append(entry)
        group: dict[str, Any] = {"name": name, "unit": unit, "better": better, "contenders": contenders}
        if not chart:
            group["chart"] = False
        self.groups.append(group)

    def compare(
        self,
        group: str,
        ours: str,
        other: str | None,
        ratio: float | None = None,
        per: str | None = None,
        target: str | None = None,
    ) -> None:
        """A ratio the script prints: ``ours`` / ``other`` of ``group``'s figures unless ``ratio`` is given (then
        ``per`` says of what, as "requests/s" for a ratio of throughputs measured as times). ``other`` None: a
        target on ours' own figure. ``target``: as ">= 5x" or "<= 1.10"."""
        if ratio is None:
            values = {c["name"]: c["value"] for g in self.groups if g["name"] == group for c in g["contenders"]}
            ratio = values[ours] / values[other] if other is not None else values[ours]
        entry: dict[str, Any] = {"group": group, "ours": ours, "other": other, "ratio": ratio}
        if per is not None:
            entry["per"] = per
        if target is not None:
            entry["target"] = target
        self.comparisons.append(entry)

    def write(self, path: str | None, title: str, setup: str, notes: str | None = None) -> Path | None:
        """Write the run to ``path`` (None: the default name under benchmarks/results/, '-': nowhere)."""
        if path == "-":
            return None
        name = self.benchmark + (f"-{self.variant}" if self.variant else "")
        target = Path(path) if path else RESULTS / f"{name}.json"
        record = {
            "benchmark": self.benchmark,
            "variant": self.variant,
            "title": title,
            "date": self.started.strftime("%Y-%m-%dT%H:%MZ"),
            "commit": _commit(),
            "source": f"benchmarks/{self.benchmark}.py {' '.join(sys.argv[1:])}".strip(),
            "machine": {
                "nproc": os.cpu_count(),
                "load_before": round(self.load_before, 2),
                "load_after": round(os.getloadavg()[0], 2),
                "python": platform.python_version(),
            },
            "setup": setup,
            "notes": notes,
            "groups": self.groups,
            "comparisons": self.comparisons,
        }
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(record, indent=1) + "\n")
        print(f"figures written to {target}: python scripts/benchmark_charts.py redraws the page", file=sys.stderr)
        return target
