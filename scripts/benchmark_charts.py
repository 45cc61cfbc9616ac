"""Draw the performance page from the benchmarks' results: a bar chart per run, ours and the peers side by side, and
the table of ratios beneath it.

Reads ``benchmarks/results/*.json`` (each benchmark script writes its run there, see ``benchmarks/_results.py``).
In ``docs/explanation/performance.md`` every block from ``<!-- results: NAME [NAME...] -->`` to
``<!-- end results -->`` is rewritten: the chart (``docs/assets/benchmarks/NAME.svg``, plain SVG written here with
the standard library), the run's date and machine, and the table (ours / each peer, the ratio, the target). Several
names draw several runs of one benchmark in one chart (soak runs one backend per invocation).

Run after a benchmark has written its results: ``.venv/bin/python scripts/benchmark_charts.py``;
``tests/test_benchmarks_results.py`` fails while the page or a chart differs from what this writes.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "explanation" / "performance.md"
CHARTS = ROOT / "docs" / "assets" / "benchmarks"
BLOCK = re.compile(r"<!-- results: ([\w\- ]+) -->\n.*?<!-- end results -->", re.DOTALL)
TARGET = re.compile(r"(<=|>=|<|>)\s*([\d.]+)x?")

OURS, OTHER, INK, MUTED = "#2563eb", "#9ca3af", "#111827", "#4b5563"
WIDTH, LABELS, BAR = 860, 250, 300  # the whole chart, the names' column, the longest bar
ROW, HEAD = 20, 26


def load(name: str, results: Path = RESULTS) -> dict[str, Any]:
    return json.loads((results / f"{name}.json").read_text())  # type: ignore[no-any-return]


# -- numbers as the page writes them ----------------------------------------------------------------------------------
def _plain(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:.3g} M"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def figure(value: float, unit: str) -> str:
    """A figure with its unit: microseconds past a thousand in ms, ratios to 3 decimals."""
    if unit == "us" and value >= 1000:
        value, unit = value / 1000, "ms"
    if unit == "x":
        return f"{value:.3f}x"
    if unit.startswith("x "):
        return f"{value:.2f}x"
    if unit.endswith("/s") and unit != "GB/s":
        return f"{_plain(value)}/s"
    return f"{_plain(value)} {unit}"


def ratio(value: float) -> str:
    if value >= 10:
        return f"{value:.1f}x"
    return f"{value:.2f}x" if value >= 0.1 else f"{value:.2g}x"


def _symbols(target: str) -> str:
    return target.replace(">=", "≥").replace("<=", "≤")


def met(value: float, target: str) -> bool:
    """Whether a ratio, as the page rounds it, meets a target such as ">= 5x" or "< 1.10"."""
    found = TARGET.fullmatch(target.strip())
    if found is None:
        raise ValueError(f"target {target!r} is not of the form '>= 5x' or '<= 1.10'")
    shown = float(ratio(value).removesuffix("x"))
    bound = float(found.group(2))
    return {"<=": shown <= bound, ">=": shown >= bound, "<": shown < bound, ">": shown > bound}[found.group(1)]


# -- the chart --------------------------------------------------------------------------------------------------------
def _charted(runs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]]:
    """(group, its contenders from every run, the comparisons on it) for each group the page shows, in order."""
    groups: dict[str, tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]] = {}
    for run in runs:
        for group in run["groups"]:
            if group.get("chart", True):
                groups.setdefault(group["name"], (group, [], []))[1].extend(group["contenders"])
        for comparison in run["comparisons"]:
            if comparison["group"] in groups:
                groups[comparison["group"]][2].append(comparison)
    return list(groups.values())


def _when(run: dict[str, Any]) -> str:
    date = run["date"].replace("T", " ").replace("Z", " UTC")
    return f"run of {date}" + (f", commit {run['commit']}" if run.get("commit") else "")


def _ratio_label(name: str, primary: str, comparisons: list[dict[str, Any]]) -> str:
    """The ratio a bar shows: the main one of ours (``primary``) over it, else it over another, else another of ours
    over it."""
    for comparison in comparisons:
        if (comparison["ours"], comparison["other"]) == (primary, name):
            break
    else:
        for comparison in comparisons:
            if comparison["ours"] == name != primary and comparison["other"] is not None:
                per = f" ({comparison['per']})" if comparison.get("per") else ""
                return f"   / {comparison['other']}: {ratio(comparison['ratio'])}{per}"
        for comparison in comparisons:
            if comparison["other"] == name and name != primary:
                break
        else:
            return ""
    per = f" ({comparison['per']})" if comparison.get("per") else ""
    return f"   {comparison['ours']} / it: {ratio(comparison['ratio'])}{per}"


def svg(runs: list[dict[str, Any]]) -> str:
    """A horizontal bar chart of every charted group of ``runs``: ours in blue, the others in grey, each bar labelled
    with its figure and the ratio of ours to it."""
    charted = _charted(runs)
    height = 58 + sum(HEAD + ROW * len(contenders) + 10 for _, contenders, _ in charted) + 24
    title = runs[0]["title"].split(" (")[0]
    dates = "; ".join(dict.fromkeys(_when(run) for run in runs))
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" '
        'font-family="system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif" font-size="12">',
        f"<title>{escape(title)}, {escape(dates)}</title>",
        f'<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>',
        f'<text x="12" y="22" font-size="16" font-weight="bold" fill="{INK}">{escape(title)}</text>',
        f'<text x="12" y="40" fill="{MUTED}">{escape(dates)}</text>',
    ]
    y = 58
    for group, contenders, comparisons in charted:
        values = [c["value"] for c in contenders if c["value"] > 0]
        log = bool(values) and max(values) / min(values) > 100
        low = 10 ** math.floor(math.log10(min(values))) if log else 0.0
        high = max(values, default=1.0)

        def scale(value: float, log: bool = log, low: float = low, high: float = high) -> float:
            if value <= 0:
                return 0.0
            if log:
                return BAR * max(math.log10(value / low), 0.02) / math.log10(high / low)
            return BAR * value / high

        primary = comparisons[0]["ours"] if comparisons else next((c["name"] for c in contenders if c["ours"]), "")
        sense = "higher is better" if group["better"] == "higher" else "lower is better"
        head = group["name"] + ("" if group["name"] == group["unit"] else f": {group['unit']}") + f", {sense}"
        head += ", log scale" if log else ""
        targets = {c["target"] for c in comparisons if c["other"] is None and c.get("target")}
        head += "".join(f", target {_symbols(target)}" for target in sorted(targets))
        out.append(f'<text x="12" y="{y + 16}" font-weight="bold" fill="{INK}">{escape(head)}</text>')
        y += HEAD
        for contender in contenders:
            width = scale(contender["value"])
            colour = OURS if contender["ours"] else OTHER
            label = figure(contender["value"], group["unit"])
            label += _ratio_label(contender["name"], primary, comparisons)
            name = escape(contender["name"])
            out += [
                f'<text x="{LABELS - 8}" y="{y + 14}" text-anchor="end" fill="{INK}">{name}</text>',
                f'<rect x="{LABELS}" y="{y + 3}" width="{width:.1f}" height="{ROW - 6}" fill="{colour}"/>',
                f'<text x="{LABELS + width + 6:.1f}" y="{y + 14}" fill="{INK}">{escape(label)}</text>',
            ]
            y += ROW
        y += 10
    key = "blue: ours; grey: the others; X / it: X's figure over that bar's (targets in the table beneath)"
    out.append(f'<text x="12" y="{y + 12}" font-size="11" fill="{MUTED}">{escape(key)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


# -- the block of the page --------------------------------------------------------------------------------------------
def chart_name(names: list[str], runs: list[dict[str, Any]]) -> str:
    benchmarks = {run["benchmark"] for run in runs}
    if len(names) > 1 and len(benchmarks) != 1:
        raise ValueError(f"one chart draws runs of one benchmark, not of {sorted(benchmarks)}")
    return names[0] if len(names) == 1 else runs[0]["benchmark"]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _verdict(comparison: dict[str, Any]) -> str:
    target = comparison["target"]
    return f"{_symbols(target)}: {'met' if met(comparison['ratio'], target) else '**missed**'}"


def _what(comparison: dict[str, Any]) -> str:
    ours, other = comparison["ours"], comparison["other"]
    return f"{ours} / {other}" if other is not None else ours


def _shown(comparison: dict[str, Any], unit: str) -> str:
    """A ratio (a figure when the target is on ours' own), with what it is of when not the group's unit."""
    value = ratio(comparison["ratio"]) if comparison["other"] is not None else figure(comparison["ratio"], unit)
    return value + (f" ({comparison['per']})" if comparison.get("per") else "")


def _rows(head: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(_cell(cell) for cell in head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(_cell(cell) for cell in row) + " |" for row in rows]


def _table(group: dict[str, Any], contenders: list[dict[str, Any]], comparisons: list[dict[str, Any]]) -> list[str]:
    """One case: a row per comparison with both figures, the ratio and the target."""
    values = {c["name"]: c["value"] for c in contenders}
    details = {c["name"]: c.get("detail", "") for c in contenders}
    rows = []
    for comparison in comparisons:
        ours, other = comparison["ours"], comparison["other"]
        shown = figure(values[ours], group["unit"]) if other is not None else details[ours]
        if other is not None and other in values:
            shown += " vs " + figure(values[other], group["unit"])
        verdict = _verdict(comparison) if comparison.get("target") else ""
        rows.append([_what(comparison), shown, _shown(comparison, group["unit"]), verdict])
    return _rows(["ours / it", "figures", "ratio", "target"], rows)


def _pivot(compared: list[tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]]) -> list[str]:
    """Several cases: a row per comparison, a column per case (the chart has the figures)."""
    keys = list(dict.fromkeys(_what(c) for _, _, comparisons in compared for c in comparisons))
    rows = []
    for key in keys:
        row, targets = [key], []
        for group, _, comparisons in compared:
            found = [c for c in comparisons if _what(c) == key]
            cell = _shown(found[0], group["unit"]) if found else ""
            if found and found[0].get("target"):
                targets.append(_symbols(found[0]["target"]))
                cell += ": met" if met(found[0]["ratio"], found[0]["target"]) else ": **missed**"
            row.append(cell)
        rows.append([*row, ", ".join(dict.fromkeys(targets))])
    return _rows(["ours / it", *(group["name"] for group, _, _ in compared), "target"], rows)


def block(names: list[str], results: Path = RESULTS) -> tuple[str, str, str]:
    """The page's block for ``names``, the chart's file name and the chart."""
    runs = [load(name, results) for name in names]
    name = chart_name(names, runs)
    title = runs[0]["title"].split(" (")[0]
    lines = [
        f"<!-- results: {' '.join(names)} -->",
        "",
        f"![{title}: ours and the others]({'../assets/benchmarks/'}{name}.svg)",
        "",
    ]
    for run in runs:
        machine = run["machine"]
        which = f"{run['variant']}, r" if len(runs) > 1 else "R"
        facts = [f"**{which}{_when(run)[1:]}**", f"{machine['nproc']} CPUs"]
        loads = [
            f"{machine[key]} {key.split('_')[1]}"
            for key in ("load_before", "load_after")
            if machine.get(key) is not None
        ]
        if loads:
            facts.append("load average " + ", ".join(loads))
        facts.append(run["setup"])
        if run.get("notes"):
            facts.append(run["notes"])
        facts.append(
            f"source: {run['source']}" + (f", recorded in {run['recorded_in']}" if run.get("recorded_in") else "")
        )
        lines.append(_cell("; ".join(str(fact) for fact in facts)) + ".")
        lines.append("")
    compared = [(group, contenders, comparisons) for group, contenders, comparisons in _charted(runs) if comparisons]
    table = _table(*compared[0]) if len(compared) == 1 else _pivot(compared) if compared else []
    lines += [*table, ""] if table else []
    lines.append("<!-- end results -->")
    return "\n".join(lines), name, svg(runs)


def render(page: str, results: Path = RESULTS) -> tuple[str, dict[str, str]]:
    """The page with every results block redrawn, and the charts by file name."""
    charts: dict[str, str] = {}

    def redraw(match: re.Match[str]) -> str:
        text, name, chart = block(match.group(1).split(), results)
        charts[f"{name}.svg"] = chart
        return text

    return BLOCK.sub(redraw, page), charts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page or a chart is out of date")
    args = parser.parse_args()
    page, charts = render(PAGE.read_text())
    current = {path.name: path.read_text() for path in CHARTS.glob("*.svg")}
    if args.check:
        stale = [str(PAGE)] if page != PAGE.read_text() else []
        stale += [name for name in set(charts) | set(current) if charts.get(name) != current.get(name)]
        if stale:
            print(f"out of date: {', '.join(sorted(stale))}: run python scripts/benchmark_charts.py", file=sys.stderr)
        return 1 if stale else 0
    PAGE.write_text(page)
    CHARTS.mkdir(parents=True, exist_ok=True)
    for name in set(current) - set(charts):
        (CHARTS / name).unlink()
    for name, chart in charts.items():
        (CHARTS / name).write_text(chart)
    return 0


if __name__ == "__main__":
    sys.exit(main())
