"""Streams: N clients at once, each reading a streamed answer of 20 records made 100 ms apart, from one worker: ours
with a sync generator against the event-loop ceiling, a minimal granian RSGI app.

Every client (asyncio raw sockets in this process, no third-party client) connects at the same moment, POSTs a small
JSON body to ``/invocations`` with ``Accept: application/jsonlines`` and reads the chunked answer to its end: 20 JSON
Lines records (``" token0"`` ... ``" token19"``), each made 100 ms after the one before, so a stream is 2 s of work.
Per run: the wall time until every client is done, the time to each client's first record (p50, p99, counted from
the client's own connect), the streams read whole (status 200, every record, in order), the errors by kind, and the
peak thread count of the worker (``Threads:`` of ``/proc/PID/status`` of each of the server's processes, sampled
every 20 ms while the clients run; the worker is the process with the most).

The contenders, each one worker, started afresh for every run:

- ``ceiling``: a granian RSGI app of a few lines (``CEILING``) that reads the body, then sends each record after an
  ``asyncio.sleep``; granian's CLI with the backlog and backpressure ours gives granian, so that both take in as many
  connections at once (granian's default backpressure, 1,024 per worker, would run 2,000 streams in two waves).
  Not a server: what one worker could do without a thread per stream.
- ``ours-sync-64``: ``inference-server serve --server granian --workers 1 --threads 64`` with a plugin whose
  ``predict_fn`` returns a generator that yields each record after ``time.sleep(0.1)`` (``PLUGIN``), everything else
  at its default.
- ``ours-sync-1000``: the same with ``--threads 1000`` (issue 39's measurement).
- ``ours-async-1000``: ours with an async generator (``async def predict_fn`` yielding each record after
  ``asyncio.sleep(0.1)``, ``PLUGIN_ASYNC``) and ``--threads 1000`` on granian's WSGI interface (asked for: by
  default such a model gets the ASGI front): the contender issue 39's first target was measured on (wall time <=
  1.3x the ceiling at 2,000 clients). Each of its items is awaited on the worker's loop while the stream's server
  thread waits: a thread per stream.
- ``ours-asgi-async-1``, ``ours-asgi-async-1000`` and ``ours-asgi-sync-64``: the same plugins on granian's ASGI
  interface (``INFERENCE_SERVER_GRANIAN_INTERFACE=asgi``: ``/invocations`` on the worker's event loop), with
  ``--threads`` 1 (the default), 1000 and 64: an async generator's records awaited on the loop, a sync generator's
  made one at a time on the model threads. Issue 39's targets: the async generator within 1.3x the ceiling's wall
  time, the sync one with ``--threads 64`` completing every stream with the worker under 64 + 40 threads.

``--contenders`` takes any ``ours[-asgi|-rsgi|-auto]-sync|async-THREADS`` besides these (``ours-rsgi-async-1``:
granian's RSGI interface; ``ours-auto-async-1``: the interface a model gets by default, ``--granian-interface auto``,
the ASGI front for an async generator). A contender without one runs granian's WSGI interface, named so.

The clients share the machine with the server (one process, one event loop): on a small machine they take a share
of its CPU, the same for every contender. Rotating order across rounds, medians, ratios to the ceiling's wall time.
Run: ``.venv/bin/python benchmarks/streams.py`` (2,000 clients, 3 rounds: about 8 minutes, as each ``--threads 64``
contender needs at least 2,000 x 2 s / 64 = 62.5 s of model slots per run); ``--quick``: 200 clients, one round.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import http.client
import json
import math
import os
import platform
import re
import resource
import signal
import subprocess
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import _harness as h
import _results
import granian

from inference_server.server.granian import BACKLOG, MAX_CONNECTIONS

RECORDS, PAUSE = 20, 0.1
#: What every client reads: the records as ours' default ``output_fn`` writes JSON Lines (orjson, a newline each).
CHUNKS = [json.dumps(f" token{i}").encode() + b"\n" for i in range(RECORDS)]
EXPECTED = b"".join(CHUNKS)
BODY = b'{"prompt": "fair isle"}'
#: The contenders run by default; ``ours-sync-N`` is ours with a sync generator and ``--threads N``, ``ours-async-N``
#: with an async one, ``ours-asgi-...`` the same on granian's ASGI interface (``ours-rsgi-...``: its RSGI one).
NAMES = (
    "ceiling",
    "ours-sync-64",
    "ours-sync-1000",
    "ours-async-1000",
    "ours-asgi-async-1",
    "ours-asgi-async-1000",
    "ours-asgi-sync-64",
)
#: Ours: the front (granian's interface, WSGI when absent), the generator, the threads.
OURS = re.compile(r"ours(?:-(asgi|rsgi|auto))?-(sync|async)-(\d+)")
#: Issue 39's target for a sync generator with ``--threads 64``: the worker's threads stay under --threads + 40.
THREADS_MARGIN = 40
#: Seconds between two samples of the server's thread counts.
SAMPLE = 0.02
#: Seconds a server may take to answer its first request, and to exit after SIGTERM before it is killed.
START_WAIT, STOP_WAIT = 60.0, 30.0

PLUGIN = f"""
    import time

    import inference_server

    RECORDS, PAUSE = {RECORDS}, {PAUSE}


    @inference_server.plugin_hook
    def predict_fn(data, model):
        return _records()


    def _records():
        for i in range(RECORDS):
            time.sleep(PAUSE)  # a model's work for the next record
            yield f" token{{i}}"
"""

PLUGIN_ASYNC = f"""
    import asyncio

    import inference_server

    RECORDS, PAUSE = {RECORDS}, {PAUSE}


    @inference_server.plugin_hook
    async def predict_fn(data, model):
        for i in range(RECORDS):
            await asyncio.sleep(PAUSE)  # a model's asynchronous work for the next record
            yield f" token{{i}}"
"""

#: The event-loop ceiling: no thread per stream, the records made on the loop.
CEILING = f"""
    import asyncio

    CHUNKS = {CHUNKS!r}
    PAUSE = {PAUSE}


    async def app(scope, protocol):
        if scope.method != "POST":
            protocol.response_bytes(200, [], b"ok")
            return
        await protocol()
        transport = protocol.response_stream(200, [("content-type", "application/jsonlines")])
        for chunk in CHUNKS:
            await asyncio.sleep(PAUSE)
            await transport.send_bytes(chunk)
"""


def title(name: str) -> str:
    """How the table names contender ``name``."""
    if name == "ceiling":
        return "granian RSGI ceiling (asyncio.sleep)"
    front, kind, threads = OURS.fullmatch(name).groups()  # type: ignore[union-attr]
    on = " by default" if front == "auto" else f" on granian's {(front or 'wsgi').upper()} interface"
    return f"ours{on}, {kind} generator, --threads {threads}"


@dataclass
class Outcome:
    """One run of N clients: wall time, each client's seconds to its first record, streams read whole, errors."""

    wall: float
    firsts: list[float] = field(default_factory=list)
    completed: int = 0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    threads: int = 0
    idle_threads: int = 0


def _request(port: int) -> bytes:
    head = (
        f"POST /invocations HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: application/jsonlines\r\nContent-Length: {len(BODY)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + BODY


async def _stream(port: int, request: bytes, firsts: list[float]) -> str | None:
    """One client: None when it read the whole answer, else what went wrong; the seconds to its first record, from
    its connect, go to ``firsts`` as soon as it has one (a client cut off later still counts there)."""
    start = time.perf_counter()
    writer = None
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        status = head.split(b" ", 2)[1].decode()
        if status != "200":
            return f"status {status}"
        if b"\r\ntransfer-encoding: chunked\r\n" not in head.lower():
            return "answer not chunked"
        body = bytearray()
        for _ in range(10 * RECORDS + 1):  # bounded: a server may cut records anywhere, not into bytes
            size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            if b"\n" in chunk[:-2] and b"\n" not in body:
                firsts.append(time.perf_counter() - start)
            body += chunk[:-2]
        else:
            return "too many chunks"
        return None if body == EXPECTED else "wrong records"
    except asyncio.IncompleteReadError:
        return "closed early"
    except (OSError, asyncio.LimitOverrunError, ValueError, IndexError) as exc:
        return type(exc).__name__
    finally:
        if writer is not None:
            writer.close()


async def _clients(port: int, clients: int, limit: float) -> Outcome:
    """``clients`` streams at once; those not done within ``limit`` seconds are cancelled and counted as timeouts."""
    request = _request(port)
    outcome = Outcome(wall=limit)
    ends: list[float] = []

    async def client() -> str | None:
        try:
            return await _stream(port, request, outcome.firsts)
        finally:
            ends.append(time.perf_counter())

    start = time.perf_counter()
    tasks = [asyncio.ensure_future(client()) for _ in range(clients)]
    done, pending = await asyncio.wait(tasks, timeout=limit)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    if not pending:
        outcome.wall = max(ends) - start
    outcome.errors["timeout"] = len(pending)
    for task in done:
        error = task.result()
        if error is None:
            outcome.completed += 1
        else:
            outcome.errors[error] += 1
    outcome.errors += collections.Counter()  # drops zero counts
    return outcome


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants now, from each process's parent in /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(stat.parent.name))
    pids, todo = [], [pid]
    while todo:
        pids.append(todo.pop())
        todo.extend(children.get(pids[-1], ()))
    return pids


def _threads(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


class ThreadPeak:
    """The peak thread count of each of ``pids``, sampled in a thread of its own until ``stop``."""

    def __init__(self, pids: list[int]) -> None:
        self.peaks = dict.fromkeys(pids, 0)
        self._done = threading.Event()
        self._sample()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        for pid in self.peaks:
            self.peaks[pid] = max(self.peaks[pid], _threads(pid))

    def _run(self) -> None:
        while not self._done.wait(SAMPLE):
            self._sample()

    def stop(self) -> int:
        """The peak of the process with the most threads (the worker)."""
        self._done.set()
        self._thread.join()
        self._sample()
        return max(self.peaks.values())


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server (its leader stops its workers, as a container runtime's stop does), then SIGKILL to
    whatever is left of its process group after it exits or ``STOP_WAIT`` seconds."""
    process.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(STOP_WAIT)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # the group's stragglers too, should its leader have gone first
    process.wait()


@contextlib.contextmanager
def serving(name: str, site: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """Start contender ``name`` in a process group of its own on a free port; yield it and its port once it
    answers."""
    port = h.free_port()
    env = h.base_env(PYTHONPATH=str(site), INFERENCE_SERVER_LOG_LEVEL="warning")
    if name == "ceiling":
        command = [h.PYTHON, "-m", "granian", "--interface", "rsgi", "--host", "127.0.0.1", "--port", str(port)]
        command += ["--workers", "1", "--backlog", str(BACKLOG), "--backpressure", str(MAX_CONNECTIONS)]
        command += ["--log-level", "warning", "bench_ceiling:app"]
    else:
        front, kind, threads = OURS.fullmatch(name).groups()  # type: ignore[union-attr]
        env["INFERENCE_SERVER_PLUGINS"] = "bench_streams_async" if kind == "async" else "bench_streams"
        env["INFERENCE_SERVER_GRANIAN_INTERFACE"] = front or "wsgi"  # (auto: what a model gets by default)
        command = [h.PYTHON, "-m", "inference_server", "serve", "--server", "granian", "--host", "127.0.0.1"]
        command += ["--port", str(port), "--workers", "1", "--threads", threads]
    with tempfile.NamedTemporaryFile(prefix=f"bench-streams-{name}-", suffix=".log") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + START_WAIT
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited with status {process.returncode} before it answered")
                with contextlib.suppress(OSError):
                    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                    connection.request("GET", "/ping")
                    connection.getresponse().read()
                    connection.close()
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not answer within {START_WAIT:g} s")
                time.sleep(0.1)
            yield process, port
        except BaseException:
            print(f"{name}'s log ends:\n{Path(log.name).read_text()[-2000:]}", flush=True)
            raise
        finally:
            _stop(process)


def measure(name: str, site: Path, clients: int, limit: float) -> Outcome:
    """One run: start ``name``, check one stream, then ``clients`` at once while its threads are sampled."""
    with serving(name, site) as (process, port):
        warm = asyncio.run(_clients(port, 1, START_WAIT))
        if warm.completed != 1:
            raise RuntimeError(f"{name}: one stream alone failed: {dict(warm.errors)}")
        pids = _tree(process.pid)
        idle = max(_threads(pid) for pid in pids)
        peak = ThreadPeak(pids)
        try:
            outcome = asyncio.run(_clients(port, clients, limit))
        finally:
            outcome_threads = peak.stop()
    outcome.threads, outcome.idle_threads = outcome_threads, idle
    return outcome


def _percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (``q`` from 0 to 1); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _raise_file_limit(clients: int) -> None:
    """Open files for every client's socket (and the servers, which inherit it), up to the hard limit."""
    need = clients + 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        soft = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft < clients + 64:
        print(f"warning: {soft} open files at most (hard limit {hard}): too few for {clients} clients", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=2000, help="concurrent streams (default: 2000)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="200 clients, one round")
    parser.add_argument("--limit", type=float, default=300.0, help="seconds a run may take; clients left then fail")
    parser.add_argument(
        "--contenders",
        default=",".join(NAMES),
        help=f"some of {','.join(NAMES)} (default: all), or ours[-asgi|-rsgi|-auto]-sync|async-THREADS",
    )
    _results.add_argument(parser)
    args = parser.parse_args()
    clients, rounds = (200, 1) if args.quick else (args.clients, args.rounds)
    names = args.contenders.split(",")
    if unknown := {name for name in names if name != "ceiling" and not OURS.fullmatch(name)}:
        parser.error(f"unknown contenders {', '.join(sorted(unknown))}: choose among {', '.join(NAMES)}")
    variant = "quick" if args.quick else (None if clients == 2000 else f"{clients}-clients")
    run = _results.Run("streams", variant)
    _raise_file_limit(clients)
    site = h.plugin_site({"bench_streams": PLUGIN, "bench_streams_async": PLUGIN_ASYNC})
    (site / "bench_ceiling.py").write_text(textwrap.dedent(CEILING))
    print(
        f"Python {platform.python_version()}, granian {granian.__version__}, {h.load()}; {clients} clients, "
        f"{RECORDS} records {PAUSE * 1000:g} ms apart, 1 worker, {rounds} round(s)",
        flush=True,
    )
    results: dict[str, list[Outcome]] = {name: [] for name in names}
    for round_ in range(rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            outcome = measure(name, site, clients, args.limit)
            results[name].append(outcome)
            errors = ", ".join(f"{kind} {count}" for kind, count in outcome.errors.most_common()) or "none"
            print(
                f"  round {round_ + 1} {name:20} wall {outcome.wall:7.2f} s  first record p50 "
                f"{_percentile(outcome.firsts, 0.5):6.2f} s p99 {_percentile(outcome.firsts, 0.99):6.2f} s "
                f"({len(outcome.firsts)} clients got one)  "
                f"completed {outcome.completed}/{clients}  errors: {errors}  worker threads {outcome.idle_threads} "
                f"idle, {outcome.threads} peak",
                flush=True,
            )
    print(f"\n{h.load()}\n")
    medians: dict[str, dict[str, float]] = {}
    for name in names:
        outcomes = results[name]
        medians[name] = {
            "wall": h.median([o.wall for o in outcomes]),
            "p50": h.median([_percentile(o.firsts, 0.5) for o in outcomes]),
            "p99": h.median([_percentile(o.firsts, 0.99) for o in outcomes]),
            "completed": h.median([o.completed for o in outcomes]),
            "errors": h.median([sum(o.errors.values()) for o in outcomes]),
            "threads": h.median([o.threads for o in outcomes]),
        }
    head = ["contender", "wall time (min-max)", "first record p50", "p99", "completed", "errors", "peak threads"]
    if "ceiling" in names:
        head.append("wall / ceiling")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name in names:
        m = medians[name]
        row = [title(name), f"{m['wall']:.2f} s ({h.spread([o.wall for o in results[name]])})"]
        row += [f"{m['p50']:.2f} s", f"{m['p99']:.2f} s", f"{m['completed']:.0f}/{clients}", f"{m['errors']:.0f}"]
        row.append(f"{m['threads']:.0f}")
        if "ceiling" in names:
            row.append(f"{m['wall'] / medians['ceiling']['wall']:.2f}x")
        print("| " + " | ".join(row) + " |")
    ours = [name for name in names if name.startswith("ours")]
    case = f"{clients:,} streams of {RECORDS} records {PAUSE * 1000:g} ms apart, 1 worker"
    details = {
        name: f"first record p50 {m['p50']:.2f} s, p99 {m['p99']:.2f} s; completed {m['completed']:.0f}/{clients}; "
        f"{m['threads']:.0f} threads at peak"
        for name, m in medians.items()
    }
    run.group(f"{case}: wall time", "s", "lower", {n: medians[n]["wall"] for n in names}, ours, details)
    for figure in ("p50", "p99"):  # a contender no client got a record from has none
        values = {n: medians[n][figure] for n in names if not math.isnan(medians[n][figure])}
        run.group(f"{case}: first record {figure}", "s", "lower", values, ours, chart=False)
    completed = f"{case}: streams completed"
    run.group(completed, "streams", "higher", {n: medians[n]["completed"] for n in names}, ours, chart=False)
    threads = f"{case}: worker's peak threads"
    run.group(threads, "threads", "lower", {n: medians[n]["threads"] for n in names}, ours, chart=False)
    for name in ours:
        _, kind, count = OURS.fullmatch(name).groups()  # type: ignore[union-attr]
        if "ceiling" in names:  # issue 39's target is for an async generator
            run.compare(f"{case}: wall time", name, "ceiling", target="<= 1.3x" if kind == "async" else None)
        if kind == "sync" and count == "64":  # issue 39's targets for a sync generator with --threads 64
            run.compare(completed, name, None, target=f">= {clients}")
            run.compare(threads, name, None, target=f"< {64 + THREADS_MARGIN}")
    setup = (
        f"{clients} concurrent clients (asyncio raw sockets, in the benchmark's process), each POST /invocations "
        f"reading {RECORDS} JSON Lines records made {PAUSE * 1000:g} ms apart; 1 worker; {rounds} round(s) in a "
        "rotating order, medians; peak threads of the worker from /proc"
    )
    notes = (
        "ours-sync-N and ours-async-N: granian's WSGI front, a server thread per stream whatever the generator; "
        "ours-asgi-...: granian's ASGI front, /invocations on the worker's event loop (issue 39)"
    )
    run.write(args.results, "Concurrent streams (streams.py)", setup, notes)


if __name__ == "__main__":
    main()
