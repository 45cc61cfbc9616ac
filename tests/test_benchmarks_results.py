"""The benchmarks' results files (benchmarks/results/) and the performance page drawn from them
(scripts/benchmark_charts.py): each file has what the page needs, each chart has a bar per contender, and the page
shows every file as the script draws it now."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
FILES = sorted(path.stem for path in RESULTS.glob("*.json"))
SVG = "{http://www.w3.org/2000/svg}"


def _module(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


charts = _module("benchmark_charts", ROOT / "scripts" / "benchmark_charts.py")
results = _module("_results", ROOT / "benchmarks" / "_results.py")


def _bars(svg: str) -> list[str]:
    """The fill of every bar of a chart (the background is the one rect as wide as the chart)."""
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    rects = root.iter(f"{SVG}rect")
    return [rect.get("fill", "") for rect in rects if rect.get("width") != root.get("width")]


def test_there_are_results() -> None:
    """Every benchmark the page has a section for has a results file (the seeds transcribed from the README)."""
    assert {"http_small", "batching", "http_large", "codecs", "v2", "transform", "client"} <= set(FILES)


@pytest.mark.parametrize("name", FILES)
def test_a_results_file_has_what_the_page_needs(name: str) -> None:
    """A run: its benchmark, title, UTC date, source, CPUs; groups of named figures with ours among them; comparisons
    that name its contenders, with targets the page can judge."""
    run = json.loads((RESULTS / f"{name}.json").read_text())
    assert name == run["benchmark"] + (f"-{run['variant']}" if run["variant"] else "")
    assert run["title"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d(T\d\d:\d\dZ)?", run["date"]), run["date"]
    assert isinstance(run["machine"]["nproc"], int)
    assert run["setup"]
    if run["source"].startswith("transcribed"):
        assert run["source"].startswith(f"transcribed from benchmarks/README.md, run of {run['date'][:10]}")
        assert re.fullmatch(r"[0-9a-f]{7,40}", run["recorded_in"])
    else:
        assert run["source"].startswith(f"benchmarks/{run['benchmark']}.py")
    names = set()
    charted = [group for group in run["groups"] if group.get("chart", True)]
    assert charted
    for group in run["groups"]:
        assert group["name"]
        assert group["unit"]
        assert group["better"] in ("higher", "lower")
        assert group["contenders"]
        for contender in group["contenders"]:
            assert isinstance(contender["value"], (int, float))
            assert contender["value"] >= 0
            names.add(contender["name"])
    for group in charted:
        assert any(contender["ours"] for contender in group["contenders"]), group["name"]
    groups = {group["name"] for group in run["groups"]}
    for comparison in run["comparisons"]:
        assert comparison["group"] in groups
        assert comparison["ours"] in names
        assert comparison["other"] is None or comparison["other"] in names
        assert comparison["ratio"] > 0
        if "target" in comparison:
            charts.met(comparison["ratio"], comparison["target"])  # raises on a target it cannot read


@pytest.mark.parametrize("name", FILES)
def test_a_chart_has_one_bar_per_contender(name: str) -> None:
    """The chart of a results file is SVG with a bar per charted contender, ours in their own colour, dated."""
    run = json.loads((RESULTS / f"{name}.json").read_text())
    svg = charts.svg([run])
    contenders = [c for group in run["groups"] if group.get("chart", True) for c in group["contenders"]]
    assert _bars(svg) == [charts.OURS if c["ours"] else charts.OTHER for c in contenders]
    assert run["date"][:10] in ET.fromstring(svg).findtext(f"{SVG}title", "")


def test_a_run_written_by_a_benchmark_is_charted(tmp_path: Path) -> None:
    """What a benchmark script writes through benchmarks/_results.py is a file the chart script draws: a bar per
    contender, the ratios it printed, the date of the run; --results - writes nothing."""
    run = results.Run("http_small")
    run.group("POST /invocations", "requests/s", "higher", {"ours": 9000.0, "peer": 1000.0, "other": 3000.0}, ["ours"])
    run.group("GET /ping", "requests/s", "higher", {"ours": 20000.0, "peer": 2000.0}, ["ours"], chart=False)
    run.compare("POST /invocations", "ours", "peer", target=">= 5x")
    run.compare("POST /invocations", "ours", "other", target=">= 5x")
    path = run.write(str(tmp_path / "http_small.json"), "Small JSON requests (http_small.py)", "a setup")
    assert path is not None
    written = json.loads(path.read_text())
    assert written["date"] == run.started.strftime("%Y-%m-%dT%H:%MZ")
    assert written["machine"]["nproc"] >= 1
    assert written["comparisons"][0]["ratio"] == 9.0
    assert _bars(charts.svg([written])) == [charts.OURS, charts.OTHER, charts.OTHER]
    page = "<!-- results: http_small -->\n<!-- end results -->\n"
    drawn, svgs = charts.render(page, tmp_path)
    assert set(svgs) == {"http_small.svg"}
    assert "| ours / peer | 9,000/s vs 1,000/s | 9.00x | ≥ 5x: met |" in drawn
    assert "| ours / other | 9,000/s vs 3,000/s | 3.00x | ≥ 5x: **missed** |" in drawn
    assert written["date"].replace("T", " ").replace("Z", " UTC") in drawn
    assert run.write("-", "t", "s") is None


def test_targets_are_judged_as_the_page_rounds_them() -> None:
    """A ratio meets its target as shown (0.795 shows as 0.80x, which meets >= 0.8x); an unreadable target fails."""
    assert charts.met(6.69, ">= 5x")
    assert not charts.met(0.4546, ">= 0.8x")
    assert charts.met(0.795, ">= 0.8x")
    assert charts.met(1.043, "< 1.10")
    with pytest.raises(ValueError, match="not of the form"):
        charts.met(1.0, "about 5x")


def test_the_page_shows_every_results_file_as_drawn_now() -> None:
    """docs/explanation/performance.md has a block for every results file, and its blocks and the charts under
    docs/assets/benchmarks/ are what scripts/benchmark_charts.py draws from the files now."""
    page = charts.PAGE.read_text()
    shown = [name for match in charts.BLOCK.finditer(page) for name in match.group(1).split()]
    assert sorted(shown) == FILES, "every results file has one block on the page: <!-- results: NAME -->"
    drawn, svgs = charts.render(page)
    assert drawn == page, "docs/explanation/performance.md is out of date: run python scripts/benchmark_charts.py"
    on_disk = {path.name: path.read_text() for path in charts.CHARTS.glob("*.svg")}
    assert on_disk == svgs, "docs/assets/benchmarks/ is out of date: run python scripts/benchmark_charts.py"
    for name in svgs:
        assert f"](../assets/benchmarks/{name})" in page


def test_every_benchmark_writes_its_results() -> None:
    """Each benchmark script records its run through benchmarks/_results.py (and so takes --results)."""
    scripts = [path for path in (ROOT / "benchmarks").glob("*.py") if not path.name.startswith("_")]
    assert scripts
    silent = [path.name for path in scripts if ".write(" not in path.read_text() or "_results" not in path.read_text()]
    assert not silent, f"{silent} write no results file"
