"""Soak: many requests at 32 keep-alive connections, valid and malformed mixed, then checks; exit 1 if one fails.

The server is ours (``inference-server serve``, default backend, 2 workers, the default plugins: an echo model).
A fixed mix of bodies: npy, npz and JSON arrays (answered 200 with the same bytes every time) and malformed ones
(truncated npy, corrupt npz, broken JSON, an unknown media type, an Accept nobody serves: each must get its 4xx).
Checks: no connection error, every valid answer byte-identical to the first, every malformed one its 4xx, and the
server's resident memory (all its processes) at the end within 10% of that after the first tenth of the requests.
A warm-up (2,000 requests, not counted) comes first. Run: ``.venv/bin/python benchmarks/soak.py`` (100,000 requests;
``--requests N`` for fewer, ``--server gunicorn`` for the other backend).
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import os
import sys
import threading
import time

import _harness as h
import _results
import numpy as np

from inference_server import codecs

CONNECTIONS = 32
NPY, NPZ, JSON = "application/x-npy", "application/x-npz", "application/json"


def mix() -> list[tuple[str, bytes, dict[str, str], int | None]]:
    """(name, body, headers, expected status; None: 200 with the same bytes as the first answer)."""
    rng = np.random.default_rng(7)
    array = rng.standard_normal((64, 16))
    npy = codecs.dumps(array, NPY)
    npz = codecs.dumps({"features": array, "ids": np.arange(64)}, NPZ)
    json = codecs.dumps(array[:8], JSON)
    return [
        ("npy", npy, {"Content-Type": NPY, "Accept": NPY}, None),
        ("npz", npz, {"Content-Type": NPZ, "Accept": NPZ}, None),
        ("json", json, {"Content-Type": JSON, "Accept": JSON}, None),
        ("npy truncated", npy[: len(npy) // 2], {"Content-Type": NPY, "Accept": NPY}, 400),
        ("npz corrupt", npz[:40] + bytes(200) + npz[240:], {"Content-Type": NPZ, "Accept": NPZ}, 400),
        ("json broken", json[:-7], {"Content-Type": JSON, "Accept": JSON}, 400),
        ("npy sent as JSON", npy, {"Content-Type": JSON, "Accept": JSON}, 400),
        ("npz of pickles", _object_npz(), {"Content-Type": NPZ, "Accept": NPZ}, 400),
        ("accept nothing", npy, {"Content-Type": NPY, "Accept": "image/png"}, 406),
    ]


def _object_npz() -> bytes:
    """An npz whose member declares Python objects (dtype ``|O``, what a pickle would fill): it must be refused."""
    import io
    import zipfile

    member = io.BytesIO()
    np.lib.format.write_array_header_1_0(member, {"descr": "|O", "fortran_order": False, "shape": (1,)})
    member.write(b"\x80\x04\x95 not a real pickle, and never loaded")
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("x.npy", member.getvalue())
    return archive.getvalue()


class Soak:
    """Sends ``total`` requests over CONNECTIONS threads, each with one keep-alive connection."""

    def __init__(self, server: h.Server, total: int) -> None:
        self.server, self.total = server, total
        self.bodies = mix()
        self.sent = itertools.count()
        self.lock = threading.Lock()
        self.done = 0
        self.errors: list[str] = []
        self.wrong: list[str] = []
        self.reference: dict[str, bytes] = {}
        self.rss_first: int | None = None
        self.rss_last: int | None = None

    def rss(self) -> int:
        return sum(self.server.rss().values())

    def client(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
        while (index := next(self.sent)) < self.total:
            name, body, headers, expected = self.bodies[index % len(self.bodies)]
            try:
                connection.request("POST", "/invocations", body=body, headers=headers)
                response = connection.getresponse()
                status, content = response.status, response.read()
            except (OSError, http.client.HTTPException) as exc:
                with self.lock:
                    self.errors.append(f"{name}: {exc!r}")
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
                continue
            self.check(name, expected, status, content)
            with self.lock:
                self.done += 1
                if self.done == self.total // 10:
                    self.rss_first = self.rss()
                elif self.done == self.total:
                    self.rss_last = self.rss()
        connection.close()

    def check(self, name: str, expected: int | None, status: int, content: bytes) -> None:
        if expected is not None:
            if status != expected:
                self.wrong.append(f"{name}: {status} instead of {expected}: {content[:200]!r}")
            return
        reference = self.reference.setdefault(name, content)
        if status != 200 or content != reference:
            self.wrong.append(f"{name}: {status}, {len(content)} bytes differing from the first answer")

    def run(self) -> float:
        """Send the requests; return the seconds they took."""
        threads = [threading.Thread(target=self.client) for _ in range(CONNECTIONS)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--server", default="granian", choices=["granian", "gunicorn"])
    parser.add_argument("--warmup", type=int, default=2_000, help="requests sent first and not counted")
    _results.add_argument(parser)
    args = parser.parse_args()
    run = _results.Run("soak", args.server)
    port = h.free_port()
    command = [h.PYTHON, "-m", "inference_server", "serve", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--workers", "2", "--server", args.server]
    env = h.base_env(INFERENCE_SERVER_PLUGINS="", INFERENCE_SERVER_LOG_LEVEL="warning")
    with h.running(f"ours-{args.server}", command, port, env) as server:
        soak = Soak(server, args.requests)
        # each valid body's first answer is checked to decode to what was sent; later answers must equal it
        for name, body, headers, expected in soak.bodies:
            if expected is None:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                connection.request("POST", "/invocations", body=body, headers=headers)
                content = connection.getresponse().read()
                connection.close()
                sent, answered = codecs.loads(body, headers["Content-Type"]), codecs.loads(content, headers["Accept"])
                same = {k: np.array_equal(sent[k], answered[k]) for k in sent} if isinstance(sent, dict) else {}
                assert all(same.values()) if same else np.array_equal(np.asarray(sent), np.asarray(answered)), name
                soak.reference[name] = content
        warmup = Soak(server, args.warmup)  # server threads and allocator arenas settle before RSS is compared
        warmup.reference = soak.reference
        warmup.run()
        seconds = soak.run()
        alive = server.process.poll() is None
    first, last = soak.rss_first or 0, soak.rss_last or 0
    growth = (last - first) / first if first else float("inf")
    print(
        f"soak: {soak.done:,} of {args.requests:,} requests answered in {seconds:.1f} s ({soak.done / seconds:,.0f}/s)"
    )
    print(f"  {CONNECTIONS} connections, server {args.server} with 2 workers, {os.cpu_count()} CPUs")
    print(f"  connection errors: {len(soak.errors)}; wrong answers: {len(soak.wrong)}; server alive: {alive}")
    print(f"  server RSS after 10%: {first / 2**20:.1f} MiB, at the end: {last / 2**20:.1f} MiB ({growth:+.1%})")
    for problem in (soak.errors + soak.wrong)[:10]:
        print(f"  ! {problem}")
    ok = not soak.errors and not soak.wrong and alive and soak.done == args.requests and growth < 0.10
    print("soak: PASS" if ok else "soak: FAIL")
    name, problems = f"ours {args.server}", f"{len(soak.errors)} connection errors, {len(soak.wrong)} wrong answers"
    run.group("requests/s", "requests/s", "higher", {name: soak.done / seconds}, [name], {name: problems})
    rss = f"{first / 2**20:.1f} MiB after 10% of the requests, {last / 2**20:.1f} MiB at the end"
    run.group("RSS at the end / after 10%", "x", "lower", {name: 1 + growth if first else 0.0}, [name], {name: rss})
    run.compare("RSS at the end / after 10%", name, None, target="< 1.10")
    setup = f"{soak.done:,} of {args.requests:,} requests answered, 32 keep-alive connections, 2 workers"
    run.write(args.results, "Soak (soak.py)", setup, "soak: PASS" if ok else "soak: FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
