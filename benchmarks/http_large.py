"""Large bodies: 1, 10 and 100 MB float32 ``.npy`` echoed through ``/invocations``, against a raw-socket echo ceiling.

Each contender is one worker process (so its peak RSS is one process's); the client sends the body with a
Content-Length (and, for 100 MB, also ``Transfer-Encoding: chunked``) and reads the answer into one preallocated
buffer. Throughput = payload / round-trip time (upload + download), the same definition for the ceiling.
Run: ``.venv/bin/python benchmarks/http_large.py`` (``--quick``: fewer repeats).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import time
from collections.abc import Iterator

import _harness as h
import numpy as np

from inference_server import codecs

SIZES_MB = (1, 10, 100)
MiB = 1 << 20


def _chunks(body: bytes, size: int = MiB) -> Iterator[memoryview]:
    view = memoryview(body)
    for start in range(0, len(view), size):
        yield view[start : start + size]


def round_trip(port: int, body: bytes, chunked: bool) -> float:
    """Seconds for one echo of ``body`` on a fresh connection; checks the answer's length."""
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
    buffer = bytearray(response.length or 0)
    view, position = memoryview(buffer), 0
    while position < len(buffer):
        position += response.readinto(view[position : position + 4 * MiB])
    elapsed = time.perf_counter() - started
    connection.close()
    if len(buffer) != len(body):
        raise RuntimeError(f"echo returned {len(buffer)} bytes for {len(body)}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    repeats = 3 if args.quick else 9
    env = h.base_env(
        INFERENCE_SERVER_PLUGINS="", SAGEMAKER_MAX_PAYLOAD_IN_MB="256", INFERENCE_SERVER_LOG_LEVEL="warning"
    )

    def ours(server: str) -> list[str]:
        return [h.PYTHON, "-m", "inference_server", "serve", "--host", "127.0.0.1", "--workers", "1",
                "--server", server]  # fmt: skip

    contenders = {
        "raw-socket ceiling": [h.PYTHON, os.path.join(os.path.dirname(__file__), "_echo_server.py")],
        "ours gunicorn": ours("gunicorn"),
        "ours granian": ours("granian"),
    }
    bodies = {mb: codecs.dumps(np.ones(mb * MiB // 4, dtype=np.float32), "application/x-npy") for mb in SIZES_MB}
    print(
        f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}, {repeats} repeats, "
        "median GB/s (payload / round trip)"
    )
    print(f"before: {h.load()}")
    results: dict[tuple[str, str], list[float]] = {}
    peaks: dict[str, int] = {}
    with contextlib.ExitStack() as stack:
        servers = {}
        for name, command in contenders.items():
            port = h.free_port()
            command = [*command, str(port)] if name.startswith("raw") else [*command, "--port", str(port)]
            servers[name] = stack.enter_context(h.running(name, command, port, env, ready_path="/ping"))
        idle = {name: server.rss() for name, server in servers.items()}
        cases = [(mb, False) for mb in SIZES_MB] + [(100, True)]
        for i in range(repeats):
            for name in list(servers)[i % 3 :] + list(servers)[: i % 3]:
                for mb, chunked in cases:
                    if chunked and name.startswith("raw"):
                        continue
                    key = (name, f"{mb} MB{' chunked' if chunked else ''}")
                    seconds = round_trip(servers[name].port, bodies[mb], chunked)
                    results.setdefault(key, []).append(len(bodies[mb]) / seconds / 1e9)
        for name, server in servers.items():
            peaks[name] = server.peak_above(idle[name])
    labels = [f"{mb} MB" for mb in SIZES_MB] + ["100 MB chunked"]
    print(f"after: {h.load()}")
    print(f"\n{'contender':<20}" + "".join(f"{label:>16}" for label in labels) + f"{'peak RSS rise':>16}")
    ceiling = {label: h.median(results[("raw-socket ceiling", label)]) for label in labels[:-1]}
    ceiling["100 MB chunked"] = ceiling["100 MB"]
    for name in contenders:
        cells = []
        for label in labels:
            if (name, label) not in results:
                cells.append(f"{'-':>16}")
                continue
            value = h.median(results[(name, label)])
            cells.append(f"{value:>7.2f} ({value / ceiling[label]:.2f}x)")
        print(f"{name:<20}" + "".join(f"{c:>16}" for c in cells) + f"{peaks[name] / MiB:>14.0f} MiB")
    print("\nmin-max of the repeats, GB/s:")
    for name in contenders:
        print(
            f"{name:<20}"
            + "".join(
                f"{h.spread(results[(name, label)]) if (name, label) in results else '-':>16}" for label in labels
            )
        )


if __name__ == "__main__":
    main()
