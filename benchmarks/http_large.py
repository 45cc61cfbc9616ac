"""Large bodies: 1, 10 and 100 MB float32 ``.npy`` echoed through ``/invocations`` by ours, BentoML and MLServer,
against a raw-socket echo ceiling.

Each contender is one worker process (so its peak RSS is one process's); the client sends the body with a
Content-Length (and, for 100 MB, also ``Transfer-Encoding: chunked``) on a fresh connection and reads the answer
into a buffer allocated (and so faulted in) once per size before the rounds and reused by every round: a fresh
100 MB buffer per round costs 25,600 page faults in the client, counted against every contender alike, which held
the ceiling at half the machine's limit until 2026-12-05 (benchmarks/README.md). Throughput = payload / round-trip
time (upload + download), the same definition for the ceiling. Ours runs without a body limit
(``SAGEMAKER_MAX_PAYLOAD_IN_MB=0``), as the peers do, and once more on granian with a 128 MB limit (SageMaker always
sets one), which refuses a chunked upload (411: granian cannot tell the app whether a chunked body arrived whole).
Every server echoes 1 MB once before its idle RSS is read and the repeats start (which checks the echo's length, and
loads what a first request loads).

The peers, each from PyPI in its own virtualenv (``_peers.py``), echo the same ``.npy`` bytes in the same run, on
``POST /invocations``:

- BentoML (``workers=1``, access log off): a ``@bentoml.api`` whose input is the request's body as it came (an
  ``IODescriptor`` reading ``await request.body()``: BentoML parses only JSON, multipart forms and its own pickle, and
  its ``np.ndarray`` input and output are JSON lists) and whose answer is a starlette ``Response`` of those bytes.
- MLServer (``parallel_workers: 1``, its inference pool): a custom handler of the echo runtime in ``_peers.py``
  (``@custom_handler(rest_path="/invocations")``), which FastAPI hands the body as ``bytes`` and which answers them
  as ``application/x-npy``; with the pool, MLServer pickles them to its worker process and back. Not its v2 path:
  its REST server refuses Triton's binary tensor extension (HTTP 422, see ``v2.py``), and a 100 MB array as v2 JSON
  tensors is 26 million numbers as text.

Run: ``.venv/bin/python benchmarks/http_large.py`` (about 2 minutes; ``--quick``: 3 repeats, under a minute).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import _harness as h
import _peers
import _results
import numpy as np

from inference_server import codecs

SIZES_MB = (1, 10, 100)
MiB = 1 << 20
PEERS = ("BentoML", "MLServer")
LIMITED = "ours granian 128 MB limit"
#: The same on granian's RSGI interface (the event-loop front, a preview).
RSGI_LIMITED = "ours rsgi 128 MB limit"

BENTOML_ECHO = """
    import os

    import bentoml
    from starlette.responses import Response


    class Body(bentoml.IODescriptor):
        body: bytes

        @classmethod
        async def from_http_request(cls, request, serde):
            return cls.model_construct(body=await request.body())


    @bentoml.service(workers=int(os.environ["BENCH_WORKERS"]), logging={"access": {"enabled": False}})
    class Echo:
        @bentoml.api(route="/invocations", input_spec=Body)
        def invocations(self, body: bytes):
            return Response(body, media_type="application/x-npy")
"""


def _chunks(body: bytes, size: int = MiB) -> Iterator[memoryview]:
    view = memoryview(body)
    for start in range(0, len(view), size):
        yield view[start : start + size]


def round_trip(port: int, body: bytes, chunked: bool, answer: bytearray) -> float:
    """Seconds for one echo of ``body`` on a fresh connection, read into ``answer`` (as long as ``body``, allocated
    once by the caller); checks the answer's length."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Content-Type": "application/x-npy", "Accept": "application/x-npy"}
    started = time.perf_counter()
    if chunked:
        connection.request("POST", "/invocations", body=_chunks(body), headers=headers, encode_chunked=True)
    else:
        connection.request("POST", "/invocations", body=body, headers=headers)
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"{response.status}: {response.read()[:200]!r}")
    length = response.length or 0
    if length != len(body) or len(answer) != len(body):
        raise RuntimeError(f"echo returned {length} bytes for {len(body)}")
    view, position = memoryview(answer), 0
    while position < length:
        count = response.readinto(view[position : position + 4 * MiB])
        if not count:
            raise RuntimeError(f"echo cut short at {position} of {length} bytes")
        position += count
    elapsed = time.perf_counter() - started
    connection.close()
    return elapsed


def start_peers(stack: contextlib.ExitStack) -> tuple[dict[str, h.Server], str]:
    """BentoML and MLServer with one worker each: their servers, and what they are."""
    site = Path(tempfile.mkdtemp(prefix="bench-bentoml-"))
    (site / "bentoml_echo.py").write_text(textwrap.dedent(BENTOML_ECHO))
    bentoml = stack.enter_context(_peers.bentoml(site, "bentoml_echo:Echo", 1, h.base_env()))
    models = {"bench_echo": {"name": "bench_echo", "implementation": "echo_model.Echo"}}
    mlserver, note = _peers.start_mlserver(stack, models, {"echo_model": _peers.MLSERVER_ECHO}, 1, h.base_env())
    about = (
        f"BentoML: {_peers.versions(_peers.bentoml_python(), 'bentoml', 'uvloop')}, workers=1; "
        f"MLServer: {_peers.versions(_peers.mlserver_python(), 'mlserver', 'uvloop')}, {note}"
    )
    return {"BentoML": bentoml, "MLServer": mlserver}, about


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    _results.add_argument(parser)
    args = parser.parse_args()
    run = _results.Run("http_large", "quick" if args.quick else None)
    repeats = 3 if args.quick else 9
    # No body limit, as the peers have none; with one, ours on granian refuses chunked bodies (411: granian cannot
    # tell the app whether one arrived whole, see wsgi/_body.py) and reads them with its whole-body read without.
    # The target is with a limit (SageMaker always sets one): LIMITED, Content-Length bodies only.
    env = h.base_env(INFERENCE_SERVER_PLUGINS="", SAGEMAKER_MAX_PAYLOAD_IN_MB="0", INFERENCE_SERVER_LOG_LEVEL="warning")
    limited = {**env, "SAGEMAKER_MAX_PAYLOAD_IN_MB": "128"}

    def ours(server: str) -> list[str]:
        return [h.PYTHON, "-m", "inference_server", "serve", "--host", "127.0.0.1", "--workers", "1",
                "--server", server]  # fmt: skip

    contenders = {
        "raw-socket ceiling": ([h.PYTHON, os.path.join(os.path.dirname(__file__), "_echo_server.py")], env),
        "ours gunicorn": (ours("gunicorn"), env),
        "ours granian": (ours("granian"), env),
        LIMITED: (ours("granian"), limited),
        RSGI_LIMITED: ([*ours("granian"), "--granian-interface", "rsgi"], limited),
    }
    bodies = {mb: codecs.dumps(np.ones(mb * MiB // 4, dtype=np.float32), "application/x-npy") for mb in SIZES_MB}
    answers = {mb: bytearray(len(body)) for mb, body in bodies.items()}  # zeroed: their pages are in before round 1
    print(
        f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}, {repeats} repeats, "
        "median GB/s (payload / round trip)"
    )
    print(f"before: {h.load()}", flush=True)
    results: dict[tuple[str, str], list[float]] = {}
    peaks: dict[str, int] = {}
    with contextlib.ExitStack() as stack:
        servers = {}
        for name, (command, command_env) in contenders.items():
            port = h.free_port()
            command = [*command, str(port)] if name.startswith("raw") else [*command, "--port", str(port)]
            servers[name] = stack.enter_context(h.running(name, command, port, command_env, ready_path="/ping"))
        peers, about = start_peers(stack)
        print(about, flush=True)
        servers.update(peers)
        for server in servers.values():
            round_trip(server.port, bodies[1], False, answers[1])  # warm-up; checks the echo's length
        idle = {name: server.rss() for name, server in servers.items()}
        cases = [(mb, False) for mb in SIZES_MB] + [(100, True)]
        names = list(servers)
        for i in range(repeats):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                for mb, chunked in cases:
                    if chunked and (name.startswith("raw") or name in (LIMITED, RSGI_LIMITED)):
                        continue
                    key = (name, f"{mb} MB{' chunked' if chunked else ''}")
                    seconds = round_trip(servers[name].port, bodies[mb], chunked, answers[mb])
                    results.setdefault(key, []).append(len(bodies[mb]) / seconds / 1e9)
        for name, server in servers.items():
            peaks[name] = server.peak_above(idle[name])
    labels = [f"{mb} MB" for mb in SIZES_MB] + ["100 MB chunked"]
    print(f"after: {h.load()}")
    print(f"\n{'contender':<26}" + "".join(f"{label:>16}" for label in labels) + f"{'peak RSS rise':>18}")
    ceiling = {label: h.median(results[("raw-socket ceiling", label)]) for label in labels[:-1]}
    ceiling["100 MB chunked"] = ceiling["100 MB"]
    for name in servers:
        cells = []
        for label in labels:
            if (name, label) not in results:
                cells.append(f"{'-':>16}")
                continue
            value = h.median(results[(name, label)])
            cells.append(f"{value:>7.2f} ({value / ceiling[label]:.2f}x)")
        rise = f"{peaks[name] / MiB:.0f} MiB ({peaks[name] / len(bodies[100]):.1f}x)"
        print(f"{name:<26}" + "".join(f"{c:>16}" for c in cells) + f"{rise:>18}")
    print("\nmin-max of the repeats, GB/s:")
    for name in servers:
        print(
            f"{name:<26}"
            + "".join(
                f"{h.spread(results[(name, label)]) if (name, label) in results else '-':>16}" for label in labels
            )
        )
    print("\nours / peer, GB/s (ratio of the medians):")
    print(f"{'':<40}" + "".join(f"{label:>16}" for label in labels))
    for name in (name for name in servers if name.startswith("ours")):
        for peer in PEERS:
            ratios = [
                f"{h.median(results[(name, label)]) / h.median(results[(peer, label)]):>15.2f}x"
                if (name, label) in results
                else f"{'-':>16}"
                for label in labels
            ]
            print(f"{name + ' / ' + peer:<40}" + "".join(ratios))
    ours = [name for name in servers if name.startswith("ours")]
    for label in labels:
        medians = {name: h.median(results[(name, label)]) for name in servers if (name, label) in results}
        run.group(label, "GB/s", "higher", medians, ours, {n: f"{h.spread(results[(n, label)])} GB/s" for n in medians})
        for name in (name for name in ours if name in medians):
            run.compare(label, name, "raw-socket ceiling", medians[name] / ceiling[label], "GB/s",
                        ">= 0.5x" if label.startswith("100 MB") else None)  # fmt: skip
        for peer in PEERS:
            run.compare(label, "ours granian", peer)
    run.group("peak RSS rise", "MiB", "lower", {name: peak / MiB for name, peak in peaks.items()}, ours)
    setup = (
        f"one worker each, {repeats} repeats in a rotating order, medians of payload / round trip; ours without a body "
        "limit and on granian with a 128 MB one; the answer read into a buffer allocated once per size"
    )
    run.write(args.results, "Large bodies echoed (http_large.py)", setup, about)


if __name__ == "__main__":
    main()
