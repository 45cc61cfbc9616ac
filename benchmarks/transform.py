"""Batch Transform: records/s and peak RSS of ``inference-server transform`` against what users write today and
against a minimal loop that does only what the job must.

A CSV of 100-byte lines through a cheap model (an echo of its bytes), at each ``--sizes`` (MB). Contenders, in a
rotating order each round: the local engine in-process (MultiRecord, 6 MB requests), ``--endpoint`` against our
server (granian, 2 workers), ``--engine dask`` (a LocalCluster of 2 workers: one file is one task, so one worker
works), ``--engine ray`` (a local Ray of 2 CPUs, when Ray is installed); the minimal loop (one Python process that
reads the file, cuts 6 MB requests at their last newline with ``rfind``, counts records with ``bytes.count``,
upper-cases each request as its model and writes it: the floor of any runner in Python); and a naive loop posting
each line with ``requests`` to the same server (run on the first ``--naive-lines`` lines, its rate extrapolated: at a
few thousand lines a second a 1 GB file would take an hour). Every contender is a whole process, start-up included;
the local engine's start-up alone (the same job over a one-line file: the interpreter, the imports, the model) is
measured too, and its rate net of it printed. Peak RSS is the largest of the job's processes (``ru_maxrss`` of the
children it waited for). Medians of ``--rounds`` rounds.
Run: ``.venv/bin/python benchmarks/transform.py --sizes 100`` (``--sizes 10,100,1000`` for the full table).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import _harness as h
import _results

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
#: The minimal loop: read, cut 6 MB requests at the last newline, count, a model (upper-case), write.
MINIMAL = """
import sys

LIMIT = 6 << 20
records = 0
with open(sys.argv[1], "rb") as source, open(sys.argv[2], "wb") as out:
    rest = b""
    while True:
        data = rest + source.read(LIMIT - len(rest))
        if not data:
            break
        cut = len(data) if len(data) < LIMIT else data.rfind(b"\\n") + 1
        if cut == 0:
            sys.exit("a record over the limit")
        body, rest = data[:cut], data[cut:]
        records += body.count(b"\\n") + (not body.endswith(b"\\n"))
        out.write(body.upper())
print(records)
"""
LINE = b"%09d," + b"0.12345," * 11 + b"x"  # 100 bytes with its newline
OPTIONS = ["--content-type", "text/csv", "--split-type", "Line", "--batch-strategy", "MultiRecord"]
OPTIONS += ["--max-payload-in-mb", "6", "--quiet"]
LOCAL, MINIMAL_LOOP, NAIVE, STARTUP = "local in-process", "minimal loop", "naive requests loop", "local start-up"


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


def _contenders(work: Path, source: Path, megabytes: int, port: int) -> dict[str, list[str]]:
    """Each contender's command, writing to ``work/out-<key>-<megabytes>``."""
    transform = [h.PYTHON, "-m", "inference_server", "transform", str(source)]

    def out(key: str) -> str:
        return str(work / f"out-{key}-{megabytes}")

    contenders = {
        LOCAL: [*transform, out("local"), *OPTIONS],
        "--endpoint (granian x2)": [*transform, out("endpoint"), *OPTIONS, "--endpoint", f"http://127.0.0.1:{port}"],
        "dask LocalCluster x2": [*transform, out("dask"), *OPTIONS, "--engine", "dask", "--workers", "2"],
    }
    if importlib.util.find_spec("ray") is not None:
        contenders["ray local x2"] = [*transform, out("ray"), *OPTIONS, "--engine", "ray", "--workers", "2"]
    contenders[MINIMAL_LOOP] = [h.PYTHON, "-c", MINIMAL, str(source / "data.csv"), out("minimal")]
    return contenders


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="10,100", help="input sizes in MB, comma-separated")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (medians are printed)")
    parser.add_argument("--naive-lines", type=int, default=5000, help="lines the naive loop posts (rate measured)")
    _results.add_argument(parser)
    args = parser.parse_args()
    run = _results.Run("transform")
    print(f"{platform.node()} {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}; before: {h.load()}")
    site = h.plugin_site({"bench_echo": ECHO})
    env = h.base_env(PYTHONPATH=str(site), INFERENCE_SERVER_PLUGINS="bench_echo", INFERENCE_SERVER_LOG_LEVEL="warning")
    work = Path(tempfile.mkdtemp(prefix="bench-transform-"))
    one_line = work / "one-line"
    one_line.mkdir()
    (one_line / "data.csv").write_bytes(LINE % 0 + b"\n")
    port = h.free_port()
    serve = [h.PYTHON, "-m", "inference_server", "serve", "--host", "127.0.0.1", "--port", str(port)]
    serve += ["--workers", "2"]
    #: (MB, contender) -> (records/s, seconds, peak RSS) of each round
    results: dict[tuple[int, str], list[tuple[float, float, int]]] = {}
    loads: list[str] = []
    try:
        with h.running("ours granian", serve, port, {**env, "SAGEMAKER_MAX_PAYLOAD_IN_MB": "6"}):
            for megabytes in (int(size) for size in args.sizes.split(",")):
                source, lines = _data(work, megabytes)
                contenders = _contenders(work, source, megabytes, port)
                contenders[STARTUP] = [h.PYTHON, "-m", "inference_server", "transform", str(one_line)]
                contenders[STARTUP] += [str(work / "out-startup"), *OPTIONS]
                expected = (source / "data.csv").read_bytes()
                for round_ in range(args.rounds):
                    order = list(contenders)
                    shift = (megabytes + round_) % len(order)
                    for name in order[shift:] + order[:shift]:
                        seconds, peak = _job(contenders[name], env)
                        count = 1 if name == STARTUP else lines
                        results.setdefault((megabytes, name), []).append((count / seconds, seconds, peak))
                        shutil.rmtree(work / "out-startup", ignore_errors=True)
                    naive_lines = min(lines, args.naive_lines)
                    seconds, peak = _naive(port, source, naive_lines, env)
                    results.setdefault((megabytes, NAIVE), []).append((naive_lines / seconds, seconds, peak))
                    for key in ("local", "endpoint", "dask", "ray", "minimal"):  # every output, then removed
                        out = work / f"out-{key}-{megabytes}"
                        written = out if key == "minimal" else out / "data.csv.out"
                        if written.exists():
                            assert written.read_bytes() == (expected.upper() if key == "minimal" else expected), key
                            written.unlink()
                    loads.append(h.load())
                shutil.rmtree(source, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(site, ignore_errors=True)
    print(f"after: {h.load()}; {args.rounds} rounds, medians (load after each round: {' / '.join(loads)})\n")
    print(
        f"{'MB':>6}  {'contender':<26}{'records/s':>12}  {'seconds':>8}  {'vs minimal':>10}  {'vs naive':>9}  ", end=""
    )
    print(f"{'peak RSS':>10}")
    for megabytes in sorted({key[0] for key in results}):

        def median(name: str, field: int, size: int = megabytes) -> float:
            return h.median([run[field] for run in results[size, name]])

        minimal, naive = median(MINIMAL_LOOP, 0), median(NAIVE, 0)
        for (size, name), runs in results.items():
            if size != megabytes or name == STARTUP:
                continue
            rate, seconds, peak = median(name, 0), median(name, 1), max(run[2] for run in runs)
            print(f"{megabytes:>6}  {name:<26}{rate:>12.0f}  {seconds:>8.2f}  {rate / minimal:>9.2f}x  ", end="")
            print(f"{rate / naive:>8.1f}x  {peak / 2**20:>8.0f} MB")
        startup, local = median(STARTUP, 1), median(LOCAL, 1)
        net = megabytes * 10_000 / (local - startup)
        print(
            f"{megabytes:>6}  local start-up alone {startup:.2f} s (a one-line file); the local engine net of it: ",
            end="",
        )
        print(f"{net:.0f} records/s, {net / minimal:.2f}x the minimal loop (whole process)")
        case = f"{megabytes} MB CSV"
        rates = {name: median(name, 0) for (size, name) in results if size == megabytes and name != STARTUP}
        peaks = {name: f"peak RSS {max(r[2] for r in results[megabytes, name]) / 2**20:.0f} MB" for name in rates}
        run.group(case, "records/s", "higher", rates, [n for n in rates if n not in (MINIMAL_LOOP, NAIVE)], peaks)
        for name in rates:
            if name not in (MINIMAL_LOOP, NAIVE):
                run.compare(case, name, MINIMAL_LOOP, target=">= 0.5x" if name == LOCAL else None)
        run.compare(case, LOCAL, NAIVE)
    setup = f"CSV of 100-byte lines, an echo model, MultiRecord 6 MB requests; medians of {args.rounds} rounds"
    run.write(args.results, "Batch Transform (transform.py)", setup)


if __name__ == "__main__":
    main()
