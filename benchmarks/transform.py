"""Batch Transform: records/s and peak RSS of ``inference-server transform`` against what users write today.

A CSV of 100-byte lines through a cheap model (an echo of its bytes), at each ``--sizes`` (MB). Contenders, in a
rotating order: the local engine in-process (MultiRecord, 6 MB requests), ``--endpoint`` against our server
(granian, 2 workers), ``--engine dask`` (a LocalCluster of 2 workers: one file is one task, so one worker works),
and a naive loop posting each line with ``requests`` to the same server (run on the first ``--naive-lines`` lines,
its rate extrapolated: at a few thousand lines a second a 1 GB file would take an hour). Peak RSS is the largest of
the job's processes (``ru_maxrss`` of the children it waited for).
Run: ``.venv/bin/python benchmarks/transform.py`` (``--sizes 10,100,1000`` for the issue's full table).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import _harness as h

ECHO = """
    import inference_server

    @inference_server.plugin_hook
    def input_fn(input_data, content_type):
        return bytes(input_data)

    @inference_server.plugin_hook
    def predict_fn(data, model):
        return data

    @inference_server.plugin_hook
    def output_fn(prediction, accept):
        return prediction, "application/octet-stream"
"""
LINE = b"%09d," + b"0.12345," * 11 + b"x"  # 100 bytes with its newline
OPTIONS = ["--content-type", "text/csv", "--split-type", "Line", "--batch-strategy", "MultiRecord"]
OPTIONS += ["--max-payload-in-mb", "6", "--quiet"]


def _data(directory: Path, megabytes: int) -> tuple[Path, int]:
    lines = megabytes * 10_000
    path = directory / f"in-{megabytes}" / "data.csv"
    path.parent.mkdir(parents=True)
    with path.open("wb") as out:
        for start in range(0, lines, 100_000):
            out.write(b"".join(LINE % i + b"\n" for i in range(start, min(lines, start + 100_000))))
    return path.parent, lines


#: Runs a command and prints the peak RSS (KiB) of the processes it waited for: a fresh measure per job.
_MEASURED = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL, "
    "stderr=subprocess.DEVNULL); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def _job(command: list[str], env: dict[str, str]) -> tuple[float, int]:
    """Seconds and peak RSS (bytes) of one run of ``command``."""
    started = time.perf_counter()
    done = subprocess.run([h.PYTHON, "-c", _MEASURED, *command], env=env, check=True, capture_output=True, text=True)
    return time.perf_counter() - started, int(done.stdout.split()[-1]) * 1024


def _naive(port: int, source: Path, lines: int, env: dict[str, str]) -> tuple[float, int]:
    script = f"""
import requests, sys
session = requests.Session()
with open({str(source / "data.csv")!r}, "rb") as lines, open(sys.argv[1], "wb") as out:
    for number, line in enumerate(lines):
        if number >= {lines}:
            break
        answer = session.post("http://127.0.0.1:{port}/invocations", data=line.rstrip(b"\\n"),
                              headers={{"Content-Type": "text/csv"}})
        answer.raise_for_status()
        out.write(answer.content + b"\\n")
"""
    with tempfile.NamedTemporaryFile(suffix=".out") as out:
        return _job([h.PYTHON, "-c", script, out.name], env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="10,100", help="input sizes in MB, comma-separated")
    parser.add_argument("--naive-lines", type=int, default=5000, help="lines the naive loop posts (rate measured)")
    args = parser.parse_args()
    print(f"{platform.node()} {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}; before: {h.load()}")
    site = h.plugin_site({"bench_echo": ECHO})
    env = h.base_env(PYTHONPATH=str(site), INFERENCE_SERVER_PLUGINS="bench_echo", INFERENCE_SERVER_LOG_LEVEL="warning")
    work = Path(tempfile.mkdtemp(prefix="bench-transform-"))
    port = h.free_port()
    serve = [h.PYTHON, "-m", "inference_server", "serve", "--host", "127.0.0.1", "--port", str(port)]
    serve += ["--workers", "2"]
    results: list[tuple[int, str, float, int]] = []
    try:
        with h.running("ours granian", serve, port, {**env, "SAGEMAKER_MAX_PAYLOAD_IN_MB": "6"}):
            for megabytes in (int(size) for size in args.sizes.split(",")):
                source, lines = _data(work, megabytes)
                transform = [h.PYTHON, "-m", "inference_server", "transform", str(source)]
                contenders = {
                    "local in-process": [*transform, str(work / f"out-local-{megabytes}"), *OPTIONS],
                    "--endpoint (granian x2)": [
                        *transform,
                        str(work / f"out-endpoint-{megabytes}"),
                        *OPTIONS,
                        "--endpoint",
                        f"http://127.0.0.1:{port}",
                    ],
                    "dask LocalCluster x2": [
                        *transform,
                        str(work / f"out-dask-{megabytes}"),
                        *OPTIONS,
                        "--engine",
                        "dask",
                        "--workers",
                        "2",
                    ],
                }
                order = list(contenders)
                shift = megabytes % len(order)
                for name in order[shift:] + order[:shift]:
                    seconds, peak = _job(contenders[name], env)
                    results.append((megabytes, name, lines / seconds, peak))
                naive_lines = min(lines, args.naive_lines)
                seconds, peak = _naive(port, source, naive_lines, env)
                results.append((megabytes, "naive requests loop", naive_lines / seconds, peak))
                expected = (source / "data.csv").read_bytes()
                for name in ("local", "endpoint", "dask"):
                    assert (work / f"out-{name}-{megabytes}" / "data.csv.out").read_bytes() == expected, name
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(site, ignore_errors=True)
    print(f"after: {h.load()}; one run each\n")
    print(f"{'MB':>6}  {'contender':<26}{'records/s':>12}  {'vs naive':>9}  {'peak RSS':>10}")
    for megabytes in sorted({row[0] for row in results}):
        rows = [row for row in results if row[0] == megabytes]
        naive = next(rate for _, name, rate, _ in rows if name.startswith("naive"))
        for _, name, rate, peak in rows:
            print(f"{megabytes:>6}  {name:<26}{rate:>12.0f}  {rate / naive:>8.1f}x  {peak / 2**20:>8.0f} MB")


if __name__ == "__main__":
    main()
