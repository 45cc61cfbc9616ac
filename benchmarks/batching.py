"""Micro-batching: ours against batching off and against BentoML's and MLServer's adaptive batching, the same model in
all.

The model costs 5 ms per call plus 20 us per row: ``sleep`` (the GIL is free) or ``cpu`` (numpy burning the CPU for
that long). Each client sends a (1, 16) float32 array over keep-alive connections (wrk, 1 to 128 connections): as
``.npy`` to ours, as JSON to BentoML (its API takes arrays as JSON), as a v2 JSON tensor to MLServer. Every contender
runs 1 or 2 worker processes (MLServer: ``parallel_workers``, its inference pool, behind its one REST process); ours,
BentoML and MLServer batch up to 32 requests per call. BentoML waits adaptively (``max_latency_ms`` at its default);
MLServer waits for a full batch at most ``max_batch_time``, here 5 ms, ours' default ``max_batch_delay``. Printed:
requests/s, p50 and p99 latency (wrk's), and the mean batch (rows per model call, from the model's own log), medians
over rounds in a rotating order, the server's CPU time per request (all its processes), and the ratios of ours to
batching off, to BentoML, to MLServer, to the event-loop ceiling and to the model's own capacity (``predict_fn`` on
full groups of 32, back to back, in one process, no HTTP).

The event-loop ceiling (``loop``, see ``LOOP``) is not a server: a few lines of asyncio on granian's RSGI interface
with our ``.npy`` codec and no deadlines, metrics or logs, measuring what the worker's time per request could be
without a thread per request.

``ours-asgi`` and ``ours-rsgi`` are ours on granian's ASGI and RSGI interfaces
(``INFERENCE_SERVER_GRANIAN_INTERFACE``: ``/invocations`` on the worker's event loop), the same flags as ours; each
is held to issue 39's targets: >= 0.6x the model's capacity at 32 clients and >= 0.85x at 128, server CPU per request
<= 1.3x the event-loop ceiling's, and its 1-client p50 and p99 beside ours' on granian's WSGI interface (recorded as
ratios, no target: the same run's noise decides them).

BentoML and MLServer run from PyPI, each in its own virtualenv (``_peers.py``, made on first use).
Run: ``.venv/bin/python benchmarks/batching.py`` (about 25 minutes; ``--quick``: one short round, fewer cases;
``--contenders ours,ours-asgi,ours-rsgi,loop``: only those).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import _harness as h
import _peers
import _results
import numpy as np

MAX_BATCH = 32
#: Seconds MLServer waits for a batch to fill: ours' default ``max_batch_delay`` (5 ms).
MLSERVER_BATCH_TIME = 0.005
MODEL = "bench"
#: Every contender: batching off, ours (on granian's WSGI and ASGI interfaces), BentoML, MLServer, and the event-loop
#: ceiling (``LOOP``).
NAMES = ("off", "ours", "ours-asgi", "ours-rsgi", "bentoml", "mlserver", "loop")
#: Ours on the event-loop fronts (issue 39's targets).
FRONTS = ("ours-asgi", "ours-rsgi")
#: Ours' contenders, and what the tables call each contender.
MINE = ("ours", *FRONTS)
TITLES = {
    "off": "off",
    "ours": "ours",
    "ours-asgi": "ours asgi",
    "ours-rsgi": "ours rsgi",
    "bentoml": "BentoML",
    "mlserver": "MLServer",
    "loop": "loop ceiling",
}
#: Seconds to wait after each case: when wrk stops, up to 128 requests per worker may still be queued (0.7 s of work
#: with batching off), which would otherwise be the next case's first latencies.
SETTLE = 2.0

#: The cost of one call, shared by every contender's model.
COST = """
    import os
    import time

    import numpy as np

    PER_CALL, PER_ROW = 0.005, 20e-6
    CPU = os.environ.get("BENCH_VARIANT") == "cpu"
    LOG = os.environ["BENCH_CALLS"]
    _matrix = np.random.default_rng(0).random((64, 64))


    def run(data):
        seconds = PER_CALL + PER_ROW * len(data)
        if CPU:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                _matrix @ _matrix
        else:
            time.sleep(seconds)
        with open(LOG, "a") as log:
            log.write(f"{len(data)}\\n")
        return data * 2
"""

OURS = """
    import inference_server

    import bench_cost

    @inference_server.plugin_hook
    def predict_fn(data, model):
        return bench_cost.run(data)
"""

SERVICE = f"""
    import os

    import bentoml
    import numpy as np

    import bench_cost


    @bentoml.service(workers=int(os.environ["BENCH_WORKERS"]), logging={{"access": {{"enabled": False}}}})
    class Model:
        @bentoml.api(batchable=True, max_batch_size={MAX_BATCH})
        def predict(self, data: np.ndarray) -> np.ndarray:
            return bench_cost.run(data)
"""


#: MLServer's runtime: a v2 request's one input, decoded by ``NumpyCodec`` (a batch: the inputs of several requests
#: joined along axis 0 by MLServer), through the model. The call blocks the process's event loop, as MLServer's own
#: runtimes' ``predict`` does: with the pool, each worker process runs one call at a time.
MLSERVER_MODEL = """
    from mlserver import MLModel
    from mlserver.codecs import NumpyCodec
    from mlserver.types import InferenceRequest, InferenceResponse

    import bench_cost


    class Model(MLModel):
        async def load(self) -> bool:
            return True

        async def predict(self, payload: InferenceRequest) -> InferenceResponse:
            data = NumpyCodec.decode_input(payload.inputs[0])
            output = NumpyCodec.encode_output("y", bench_cost.run(data))
            return InferenceResponse(model_name=self.name, outputs=[output])
"""


#: The event-loop ceiling: no thread per request. One asyncio loop per worker process, on granian's RSGI interface,
#: decodes and encodes with our ``.npy`` codec and groups requests in a few lines: when the model frees, it waits (at
#: most ``max_batch_delay``) until as many are queued as it just answered and had queued (capped at 32), and a
#: request that finds the model idle goes at once. The model runs on one thread beside the loop. No deadlines,
#: metrics, logs or error handling: a measure of what the worker's time per request could be without granian's
#: WSGI threads, not a server.
LOOP = f"""
    import asyncio

    import numpy as np

    import bench_cost
    from inference_server.codecs import npy

    MAX, DELAY = {MAX_BATCH}, 0.005
    queue = []
    state = {{"running": False, "arrived": None}}


    async def groups():
        loop = asyncio.get_running_loop()
        arrived = state["arrived"]
        expected = 0  # answered by the last group, and queued then: they usually send again at once
        while True:
            deadline = loop.time() + DELAY
            while len(queue) < min(MAX, expected) and deadline > loop.time():
                arrived.clear()
                try:
                    await asyncio.wait_for(arrived.wait(), deadline - loop.time())
                except TimeoutError:
                    break
            if not queue:
                break
            group = queue[:MAX]
            del queue[:MAX]
            prediction = await loop.run_in_executor(None, bench_cost.run, np.concatenate([data for data, _ in group]))
            start = 0
            for data, future in group:
                future.set_result(prediction[start : start + len(data)])
                start += len(data)
            expected = len(group) + len(queue)
        state["running"] = False


    async def app(scope, protocol):
        if scope.method != "POST":
            protocol.response_bytes(200, [], b"ok")
            return
        if state["arrived"] is None:
            state["arrived"] = asyncio.Event()
        data = npy.decode_npy(await protocol())
        future = asyncio.get_running_loop().create_future()
        queue.append((data, future))
        state["arrived"].set()
        if not state["running"]:
            state["running"] = True
            asyncio.ensure_future(groups())
        body = b"".join(npy.encode_npy(await future))
        protocol.response_bytes(200, [("content-type", "application/x-npy")], body)
"""


def _npy_lua(array: np.ndarray) -> str:
    buffer = io.BytesIO()
    np.save(buffer, array)
    body = "".join(f"\\{byte}" for byte in buffer.getvalue())  # Lua decimal escapes: any byte
    return (
        f'wrk.method = "POST"\nwrk.body = "{body}"\n'
        'wrk.headers["Content-Type"] = "application/x-npy"\nwrk.headers["Accept"] = "application/x-npy"\n'
    )


ROW = np.linspace(0, 1, 16, dtype="f4").reshape(1, 16)
NPY = _npy_lua(ROW)
JSON = (
    'wrk.method = "POST"\n'
    f"wrk.body = '{{\"data\": {ROW.tolist()}}}'\n"
    'wrk.headers["Content-Type"] = "application/json"\n'
)
_V2_BODY = {"inputs": [{"name": "x", "shape": list(ROW.shape), "datatype": "FP32", "data": ROW[0].tolist()}]}
V2_JSON = f"""wrk.method = "POST"
wrk.body = '{json.dumps(_V2_BODY)}'
wrk.headers["Content-Type"] = "application/json"
"""


def _seconds(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}[unit]


def wrk(url: str, lua: str, connections: int, seconds: int) -> tuple[float, float, float]:
    """Requests/s, p50 and p99 in ms, from ``wrk --latency``; error answers fail the run.

    wrk's timeout is 30 s, not its 2 s: an overloaded contender (batching off at 128 clients) answers late, which
    its latency shows, rather than failing.
    """
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(lua)
    threads = min(2, connections)
    command = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--timeout", "30s", "--latency"]
    command += ["-s", script.name, url]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    if "Non-2xx" in output or "Socket errors" in output:
        raise RuntimeError(f"{url}: errors under load:\n{output}")
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
    p50 = _seconds(re.search(r"\s50%\s+(\S+)", output).group(1))  # type: ignore[union-attr]
    p99 = _seconds(re.search(r"\s99%\s+(\S+)", output).group(1))  # type: ignore[union-attr]
    return rate, p50 * 1000, p99 * 1000


def capacity(site: Path, variant: str, seconds: float = 2.0) -> float:
    """The model's own batched capacity, rows/s: ``run`` called back to back with full groups of ``MAX_BATCH`` rows
    in one process, no HTTP (what one worker's model could do if every group were full)."""
    code = (
        "import time, numpy as np, bench_cost\n"
        f"rows = np.zeros(({MAX_BATCH}, 16), 'f4'); bench_cost.run(rows); calls = 0; start = time.perf_counter()\n"
        f"while time.perf_counter() - start < {seconds}: bench_cost.run(rows); calls += 1\n"
        f"print(calls * {MAX_BATCH} / (time.perf_counter() - start))\n"
    )
    env = h.base_env(PYTHONPATH=str(site), BENCH_VARIANT=variant, BENCH_CALLS=os.devnull)
    result = subprocess.run([h.PYTHON, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(result.stdout)


@contextlib.contextmanager
def contender(
    name: str, site: Path, variant: str, workers: int, calls: Path
) -> Iterator[tuple[str, str, str, h.Server]]:
    """Start ``name``; yield its URL, the wrk script for it, a note on how it runs and the server."""
    env = h.base_env(
        PYTHONPATH=str(site),
        BENCH_VARIANT=variant,
        BENCH_CALLS=str(calls),
        INFERENCE_SERVER_PLUGINS="bench_ours",
        INFERENCE_SERVER_LOG_LEVEL="warning",
    )
    if name == "bentoml":
        with _peers.bentoml(site, "service:Model", workers, env) as server:
            yield f"http://127.0.0.1:{server.port}/predict", JSON, f"workers={workers}", server
        return
    if name == "mlserver":
        settings: dict[str, object] = {"name": MODEL, "implementation": "bench_mlserver.Model"}
        settings.update(max_batch_size=MAX_BATCH, max_batch_time=MLSERVER_BATCH_TIME)
        with contextlib.ExitStack() as stack:
            runtimes = {"bench_mlserver": MLSERVER_MODEL}
            server, note = _peers.start_mlserver(stack, {MODEL: settings}, runtimes, workers, env)
            yield f"http://127.0.0.1:{server.port}/v2/models/{MODEL}/infer", V2_JSON, note, server
        return
    port = h.free_port()
    if name == "loop":
        command = [h.PYTHON, "-m", "granian", "--interface", "rsgi", "--host", "127.0.0.1", "--port", str(port)]
        command += ["--workers", str(workers), "--log-level", "warning", "bench_loop:app"]
        with h.running(name, command, port, env) as server:
            yield f"http://127.0.0.1:{port}/", NPY, f"--workers {workers}", server
        return
    command = [h.PYTHON, "-m", "inference_server", "serve", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--workers", str(workers)]
    if name in MINE:
        command += ["--max-batch-size", str(MAX_BATCH)]
    if name in FRONTS:
        env["INFERENCE_SERVER_GRANIAN_INTERFACE"] = name.split("-")[1]
    with h.running(name, command, port, env) as server:
        yield f"http://127.0.0.1:{port}/invocations", NPY, f"--workers {workers}", server


def capacity_target(name: str, clients: int) -> str | None:
    """The target of ours' contender ``name`` against the model's capacity at ``clients``: issue 39's for the
    event-loop front, the earlier 0.8x at 32 clients for ours on granian's WSGI interface."""
    if name in FRONTS:
        return {32: ">= 0.6x", 128: ">= 0.85x"}.get(clients)
    return ">= 0.8x" if name == "ours" and clients == 32 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one round of 3 s, sleep variant, 1 worker")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--contenders", default=",".join(NAMES), help=f"some of {','.join(NAMES)} (default: all)")
    _results.add_argument(parser)
    args = parser.parse_args()
    run = _results.Run("batching", "quick" if args.quick else None)
    if shutil.which("wrk") is None:
        sys.exit("wrk is needed (Debian package wrk)")
    rounds, seconds = (1, 3) if args.quick else (args.rounds, args.seconds)
    variants = ["sleep"] if args.quick else ["sleep", "cpu"]
    worker_counts = [1] if args.quick else [1, 2]
    levels = [1, 8, 32, 128]
    names = args.contenders.split(",")
    if unknown := set(names) - set(NAMES):
        parser.error(f"unknown contenders {', '.join(sorted(unknown))}: choose among {', '.join(NAMES)}")
    site = h.plugin_site({"bench_ours": OURS})
    (site / "bench_cost.py").write_text(textwrap.dedent(COST))
    (site / "bench_loop.py").write_text(textwrap.dedent(LOOP))
    (site / "service.py").write_text(textwrap.dedent(SERVICE))
    calls = site / "calls.log"
    peers = []
    if "bentoml" in names:
        peers.append(f"BentoML: {_peers.versions(_peers.bentoml_python(), 'bentoml', 'uvloop')}")
    if "mlserver" in names:
        peers.append(
            f"MLServer: {_peers.versions(_peers.mlserver_python(), 'mlserver', 'uvloop')}, "
            f"max_batch_time {MLSERVER_BATCH_TIME * 1000:g} ms"
        )
    print("; ".join([f"Python {platform.python_version()}, {h.load()}", *peers]), flush=True)
    capacities = {variant: capacity(site, variant) for variant in variants}
    for variant, rate in capacities.items():
        print(f"the {variant} model's own capacity, full groups of {MAX_BATCH} back to back: {rate:.0f} rows/s")
    results: dict[tuple[str, int, int, str], list[tuple[float, float, float, float]]] = {}
    notes: dict[str, set[str]] = {name: set() for name in names}
    turn = round_ = 0
    for variant in variants:
        for workers in worker_counts:
            for _ in range(rounds):
                for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                    with contender(name, site, variant, workers, calls) as (url, lua, note, server):
                        notes[name].add(note)
                        wrk(url, lua, 8, 1)  # warm-up: models loaded, threads started
                        for clients in levels[turn % 4 :] + levels[: turn % 4]:
                            calls.write_text("")
                            cpu = server.cpu_seconds()
                            rate, p50, p99 = wrk(url, lua, clients, seconds)
                            cpu_us = (server.cpu_seconds() - cpu) / (rate * seconds) * 1e6
                            time.sleep(SETTLE)
                            rows = [int(line) for line in calls.read_text().split()]
                            batch = sum(rows) / len(rows) if rows else 0.0
                            measured = (rate, p50, p99, batch, cpu_us)
                            results.setdefault((variant, workers, clients, name), []).append(measured)
                            print(
                                f"  {variant} w{workers} c{clients:<3} {name:9} {rate:8.0f}/s p50 {p50:7.2f} ms "
                                f"p99 {p99:7.2f} ms batch {batch:5.1f} server CPU {cpu_us:4.0f} us/request",
                                flush=True,
                            )
                    turn += 1
                round_ += 1
    print(f"\n{h.load()}")
    for name in ("bentoml", "mlserver"):
        if name in names:
            print(f"{name}: {'; '.join(sorted(notes[name]))}")
    ours_names = [name for name in MINE if name in names]
    #: ours' contender -> the contenders it is compared with (ours asgi with ours too: the WSGI front beside it)
    ratios = {
        mine: [name for name in ("off", "ours", "bentoml", "mlserver", "loop") if name in names and name != mine]
        for mine in ours_names
    }
    print("\nEach cell: req/s, p50, p99, mean batch, server CPU per request.\n")
    head = ["model", "workers", "clients", *(TITLES[name] for name in names)]
    for mine in ours_names:
        head += [f"{TITLES[mine]}/{TITLES[name]}" for name in ratios[mine]] + [f"{TITLES[mine]}/capacity"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for variant in variants:
        for workers in worker_counts:
            for clients in levels:
                cells = {}
                for name in names:
                    runs = results[variant, workers, clients, name]
                    cells[name] = [h.median([one[i] for one in runs]) for i in range(5)]
                row = [variant, str(workers), str(clients)]
                row += [
                    f"{cells[name][0]:.0f}/s, {cells[name][1]:.2f} ms, {cells[name][2]:.2f} ms, {cells[name][3]:.1f}, "
                    f"{cells[name][4]:.0f} us"
                    for name in names
                ]
                for mine in ours_names:
                    row += [f"{cells[mine][0] / cells[name][0]:.2f}x" for name in ratios[mine]]
                    row.append(f"{cells[mine][0] / capacities[variant]:.2f}x")
                print("| " + " | ".join(row) + " |")
                case = f"{variant} model, {workers} worker{'s' * (workers > 1)}, {clients} clients"
                values = {TITLES[name]: cells[name][0] for name in names}
                values["model capacity"] = capacities[variant]
                details = {
                    TITLES[name]: f"p50 {cells[name][1]:.2f} ms, p99 {cells[name][2]:.2f} ms, "
                    f"batch {cells[name][3]:.1f}, {cells[name][4]:.0f} us CPU/request"
                    for name in names
                }
                charted = clients == 32 or (args.quick and clients > 1)
                ours_titles = [TITLES[mine] for mine in ours_names]
                run.group(case, "requests/s", "higher", values, ours_titles, details, chart=charted)
                for mine in ours_names:
                    for name in ratios[mine]:
                        run.compare(case, TITLES[mine], TITLES[name])
                for name in (*ours_names, "loop"):
                    if name in names:
                        run.compare(case, TITLES[name], "model capacity", target=capacity_target(name, clients))
                fronts = [front for front in FRONTS if front in names]
                if fronts:
                    cpu = f"{case}: server CPU per request"
                    values = {TITLES[name]: cells[name][4] for name in names}
                    run.group(cpu, "us", "lower", values, ours_titles, chart=False)
                    if clients == 1 and "ours" in names:
                        latencies = {figure: f"{case}: {figure}" for figure in ("p50", "p99")}
                        for i, figure in ((1, "p50"), (2, "p99")):
                            values = {TITLES[name]: cells[name][i] for name in names}
                            run.group(latencies[figure], "ms", "lower", values, ours_titles, chart=False)
                for front in fronts:
                    if "loop" in names:  # issue 39: <= 1.3x the event-loop ceiling's
                        run.compare(cpu, TITLES[front], TITLES["loop"], target="<= 1.3x")
                    if clients == 1 and "ours" in names:  # issue 39: no worse than today's at 1 client
                        for latency in latencies.values():
                            run.compare(latency, TITLES[front], TITLES["ours"])
    setup = f"model: 5 ms per call + 20 us per row; (1, 16) float32 requests; wrk; {rounds} round(s) of {seconds} s"
    run.write(args.results, "Micro-batching (batching.py)", setup, "; ".join(peers) or None)


if __name__ == "__main__":
    main()
