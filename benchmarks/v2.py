"""The Open Inference Protocol (v2): the seed array echoed as binary tensors, as JSON tensors, as ``.npy`` and over
gRPC, by ours, MLServer, Triton and KServe.

The seed array, ``np.random.default_rng(0).standard_normal((10000, 3, 4))`` float64 (960 KB), goes through an echo
model, one worker per server:

- ours (``--workers 1``, ``--server`` granian by default) on ``/invocations``, ``.npy`` both ways (the client writes
  the body with ``np.save`` and reads the answer with ``np.load``, over ``http.client``); on
  ``/v2/models/bench_echo/infer`` with binary tensors both ways through our own ``V2Client`` (``http.client`` and
  our codec, like for like with the ``.npy`` client: the target's comparison), over gRPC on ``--grpc-port``
  through ``tritonclient.grpc`` (raw tensor contents both ways), and with binary and JSON tensors
  both ways through ``tritonclient.http``, what most v2 users run (``InferInput.set_data_from_numpy(binary_data=...)``,
  ``InferRequestedOutput(binary_data=...)``, ``InferenceServerClient.infer``, ``InferResult.as_numpy``). The model
  is a plugin whose ``predict_fn`` returns its input (a dict of arrays on v2, an array from the built-in ``.npy``
  codec on ``/invocations``).
- MLServer (PyPI, in ``benchmarks/.venv-mlserver``, made on first use) with the same echo as a custom runtime, an
  ``MLModel`` whose ``predict`` decodes each input with ``NumpyCodec`` and encodes it back as an output, through the
  same tritonclient calls. Its REST server does not implement Triton's binary tensor extension (it answers 422): the
  script tries binary first and, when it is refused, measures JSON tensors and says so. Its inference pool
  (``parallel_workers: 1``, its default) is tried first; when it fails to start (its virtualenv pins uvloop 0.21.0:
  with 0.22 and later its worker process dies in ``asyncio.get_event_loop()``, see ``_peers.py``), MLServer runs
  with ``parallel_workers: 0`` (inference in the server's own process), and the output says which. Its gRPC server
  is measured through the same ``tritonclient.grpc`` calls as ours.
- Triton (``tritonserver`` 2.51 from PyTriton's wheel, in ``benchmarks/.venv-triton``) with the echo as a Python
  backend model of one instance, and KServe (``kserve`` 0.21, in ``benchmarks/.venv-kserve``) with the echo as a
  ``kserve.Model`` in one worker: each over HTTP binary and gRPC through the same tritonclient calls
  (``_peers.py`` says how they are started).

One client, sequential requests over one kept-alive connection per contender (a latency measurement: on 2 cores
concurrent Python clients would measure the client); the timing of each request includes the client's encoding and
decoding. Contenders alternate, in a rotating order, for several rounds of a few seconds after a warm-up request that
checks the echo (equal to the seed, and sent the way its name says); medians of the rounds are printed with their
min-max, the servers' CPU time per request (user + system, all their processes; counted in 10 ms ticks, so coarse
for the slow JSON contenders in short rounds), and the issue's targets: binary v2 (``V2Client``) within 1.2x of
``.npy`` per request, ours (binary v2) >= 1.0x MLServer's throughput, ours over gRPC within 1.2x of ours over HTTP
binary (tritonclient both) per request, ours >= 1.0x MLServer's and KServe's throughput and >= 0.8x Triton's, over
HTTP binary and gRPC.
Run: ``.venv/bin/python benchmarks/v2.py`` (about 4 minutes, the first run a few more to make the peers'
virtualenvs; ``--quick``: 2 rounds of 1 s).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import importlib.metadata
import io
import os
import platform
import time
from collections.abc import Callable

import _harness as h
import _peers
import _results
import numpy as np
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from inference_server.client import InferenceResponse, V2Client

MODEL = "bench_echo"
SEED = np.random.default_rng(0).standard_normal((10000, 3, 4))

OURS = """
    import inference_server

    @inference_server.plugin_hook
    def model_fn(model_dir):
        return "echo"

    @inference_server.plugin_hook
    def predict_fn(data, model):
        return data
"""


# -- clients: each sends the seed and returns the decoded echo -------------------------------------------------------
class NpyClient:
    """``.npy`` on ``/invocations`` over one kept-alive ``http.client`` connection."""

    def __init__(self, port: int) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def __call__(self, array: np.ndarray) -> np.ndarray:
        buffer = io.BytesIO()
        np.save(buffer, array)
        headers = {"Content-Type": "application/x-npy", "Accept": "application/x-npy"}
        self.connection.request("POST", "/invocations", body=buffer.getbuffer(), headers=headers)
        response = self.connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {body[:200]!r}")
        return np.load(io.BytesIO(body))

    def transport(self) -> str:
        return "npy"

    def close(self) -> None:
        self.connection.close()


class OurV2Client:
    """v2 with binary tensors both ways through ``inference_server.client.V2Client`` (``http.client`` and our codec,
    as ``NpyClient``: the like-for-like client of the ``.npy`` contender)."""

    def __init__(self, port: int) -> None:
        self.client = V2Client(f"http://127.0.0.1:{port}", MODEL)
        self.last: InferenceResponse | None = None

    def __call__(self, array: np.ndarray) -> np.ndarray:
        self.last = self.client.infer({"x": array})
        return self.last.outputs["x"]

    def transport(self) -> str:
        return "binary"  # (V2Client asks for binary outputs; decode_response would refuse JSON data it did not get)

    def close(self) -> None:
        self.client.close()


class TritonClient:
    """v2 through ``tritonclient.http`` (one kept-alive connection), binary or JSON tensors both ways."""

    def __init__(self, port: int, binary: bool) -> None:
        self.client = triton.InferenceServerClient(f"127.0.0.1:{port}", connection_timeout=60, network_timeout=60)
        self.binary = binary
        self.last: triton.InferResult | None = None

    def __call__(self, array: np.ndarray) -> np.ndarray:
        given = triton.InferInput("x", list(array.shape), "FP64")
        given.set_data_from_numpy(array, binary_data=self.binary)
        wanted = triton.InferRequestedOutput("x", binary_data=self.binary)
        self.last = self.client.infer(MODEL, [given], outputs=[wanted])
        return self.last.as_numpy("x")

    def transport(self) -> str:
        """How the last answer's output came: binary (``binary_data_size``) or JSON (``data``)."""
        assert self.last is not None
        output = self.last.get_output("x")
        return "binary" if "binary_data_size" in (output.get("parameters") or {}) else "JSON"

    def close(self) -> None:
        self.client.close()


class GrpcClient:
    """The Open Inference Protocol over gRPC through ``tritonclient.grpc`` (one channel): raw tensor contents both
    ways, as it always sends them."""

    def __init__(self, port: int) -> None:
        self.client = triton_grpc.InferenceServerClient(f"127.0.0.1:{port}")

    def __call__(self, array: np.ndarray) -> np.ndarray:
        given = triton_grpc.InferInput("x", list(array.shape), "FP64")
        given.set_data_from_numpy(array)
        result = self.client.infer(MODEL, [given], outputs=[triton_grpc.InferRequestedOutput("x")])
        return result.as_numpy("x")  # type: ignore[no-any-return]

    def transport(self) -> str:
        return "gRPC"

    def close(self) -> None:
        self.client.close()


Client = NpyClient | OurV2Client | TritonClient | GrpcClient


def check(name: str, client: Client, expected: str) -> None:
    """One request (the warm-up): the echo equals the seed and came back as ``expected``."""
    echoed = client(SEED)
    if echoed.dtype != SEED.dtype or not np.array_equal(echoed, SEED):
        raise RuntimeError(f"{name}: the echo differs from the seed ({echoed.dtype} {echoed.shape})")
    if client.transport() != expected:
        raise RuntimeError(f"{name}: the answer came as {client.transport()}, not {expected}")


def timed(client: Callable[[np.ndarray], np.ndarray], seconds: float, at_least: int = 3) -> tuple[int, float]:
    """Sequential requests for ``seconds`` (and at least ``at_least``): their count and the time they took."""
    count, started = 0, time.perf_counter()
    end = started + seconds
    while count < at_least or time.perf_counter() < end:
        client(SEED)
        count += 1
    return count, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of 1 s")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=3)
    parser.add_argument("--server", choices=("granian", "gunicorn"), default="granian", help="our HTTP server")
    _results.add_argument(parser)
    args = parser.parse_args()
    run = _results.Run("v2", "quick" if args.quick else None if args.server == "granian" else args.server)
    rounds, seconds = (2, 1.0) if args.quick else (args.rounds, args.seconds)
    python = _peers.mlserver_python()
    site = h.plugin_site({MODEL: OURS})
    env = h.base_env(
        PYTHONPATH=str(site),
        INFERENCE_SERVER_PLUGINS=MODEL,
        INFERENCE_SERVER_LOG_LEVEL="warning",
        SAGEMAKER_MAX_PAYLOAD_IN_MB="64",  # (the JSON request is about 2.5 MB, under the default 6 too)
    )
    print(
        f"{platform.node()} {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}, "
        f"Python {platform.python_version()}, numpy {np.__version__}, "
        f"tritonclient {importlib.metadata.version('tritonclient')}"
    )
    print(
        f"seed {SEED.shape} {SEED.dtype} ({SEED.nbytes // 1000} KB) echoed; one client, sequential requests over one "
        "kept-alive connection per contender, the client's encode and decode timed"
    )
    print(f"before: {h.load()}", flush=True)
    results: dict[str, dict[str, list[float]]] = {}
    with contextlib.ExitStack() as stack:
        port = h.free_port()
        command = [h.PYTHON, "-m", "inference_server", "serve", "--host", "127.0.0.1", "--port", str(port)]
        grpc_port = h.free_port()
        command += ["--workers", "1", "--server", args.server, "--grpc-port", str(grpc_port)]
        ours = stack.enter_context(h.running("ours", command, port, env, f"/v2/models/{MODEL}/ready"))
        h.ready(ours, f"/v2/models/{MODEL}/ready")
        models = {MODEL: {"name": MODEL, "implementation": "echo_model.Echo"}}
        mlserver, mlserver_note = _peers.start_mlserver(
            stack, models, {"echo_model": _peers.MLSERVER_ECHO}, 1, h.base_env()
        )
        triton_server = stack.enter_context(_peers.triton(MODEL, {"x": ("FP64", SEED.ndim)}, 1, h.base_env()))
        kserve_server = stack.enter_context(_peers.kserve(MODEL, 1, h.base_env()))
        print(
            f"ours: --server {args.server}, --workers 1; MLServer: {_peers.versions(python, 'mlserver', 'uvloop')}, "
            f"{mlserver_note}; Triton: {_peers.versions(_peers.triton_python(), 'nvidia-pytriton')} (tritonserver "
            f"2.51, Python backend, 1 instance); KServe: {_peers.versions(_peers.kserve_python(), 'kserve')} "
            "(ModelServer, 1 worker)"
        )

        mlserver_binary = TritonClient(mlserver.port, binary=True)
        try:
            check("MLServer v2 binary", mlserver_binary, "binary")
            mlserver_name, mlserver_client = "MLServer v2 binary", mlserver_binary
        except InferenceServerException as exc:
            answer = next((line for line in str(exc).splitlines() if line.startswith("response: ")), str(exc))
            answer = answer.removeprefix("response: ")[:200]
            print(
                f"MLServer refuses Triton's binary tensors (HTTP {exc.status()}: {answer}): "
                "it is measured with JSON tensors both ways"
            )
            mlserver_binary.close()
            mlserver_name, mlserver_client = "MLServer v2 JSON", TritonClient(mlserver.port, binary=False)
        contenders: dict[str, tuple[h.Server, Client, str]] = {
            "ours /invocations npy": (ours, NpyClient(ours.port), "npy"),
            "ours v2 binary V2Client": (ours, OurV2Client(ours.port), "binary"),
            "ours v2 binary": (ours, TritonClient(ours.port, binary=True), "binary"),
            "ours v2 JSON": (ours, TritonClient(ours.port, binary=False), "JSON"),
            "ours gRPC": (ours, GrpcClient(grpc_port), "gRPC"),
            mlserver_name: (mlserver, mlserver_client, mlserver_name.rsplit(" ", 1)[1]),
            "MLServer gRPC": (mlserver, GrpcClient(mlserver.grpc_port), "gRPC"),  # type: ignore[attr-defined]
            "Triton v2 binary": (triton_server, TritonClient(triton_server.port, binary=True), "binary"),
            "Triton gRPC": (triton_server, GrpcClient(triton_server.grpc_port), "gRPC"),  # type: ignore[attr-defined]
            "KServe v2 binary": (kserve_server, TritonClient(kserve_server.port, binary=True), "binary"),
            "KServe gRPC": (kserve_server, GrpcClient(kserve_server.grpc_port), "gRPC"),  # type: ignore[attr-defined]
        }
        for name, (_, client, expected) in contenders.items():
            stack.callback(client.close)
            check(name, client, expected)
            results[name] = {"ms": [], "cpu_ms": []}
        names = list(contenders)
        for round_ in range(rounds):
            for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                server, client, _ = contenders[name]
                cpu = server.cpu_seconds()
                count, elapsed = timed(client, seconds)
                results[name]["ms"].append(elapsed / count * 1000)
                results[name]["cpu_ms"].append((server.cpu_seconds() - cpu) / count * 1000)
    print(f"after: {h.load()}; medians of {rounds} round(s) of {seconds:g} s, min-max of the rounds in brackets\n")
    print(
        f"{'contender':<26}{'requests/s':>12}{'(min-max)':>16}{'ms/request':>12}{'(min-max)':>16}"
        f"{'server CPU ms/req':>19}"
    )
    for name, measured in results.items():
        ms = measured["ms"]
        rates = [1000 / value for value in ms]
        print(
            f"{name:<26}{h.median(rates):>12.1f}{'(' + h.spread(rates) + ')':>16}{h.median(ms):>12.2f}"
            f"{'(' + h.spread(ms) + ')':>16}{h.median(measured['cpu_ms']):>19.2f}"
        )

    def ratio(numerator: str, denominator: str, per: str) -> str:
        """The ratio of the medians, and the min-max of the rounds' own ratios (each round ran both)."""
        top, bottom = results[numerator]["ms"], results[denominator]["ms"]
        if per == "time":
            rounds_ = [a / b for a, b in zip(top, bottom, strict=True)]
            value = h.median(top) / h.median(bottom)
        else:  # throughput: the inverse
            rounds_ = [b / a for a, b in zip(top, bottom, strict=True)]
            value = h.median(bottom) / h.median(top)
        return f"{value:.2f}x (rounds {min(rounds_):.2f}-{max(rounds_):.2f})"

    print("\ntargets:")
    print(f"  ours v2 binary (V2Client) / ours npy, time per request: "
          f"{ratio('ours v2 binary V2Client', 'ours /invocations npy', 'time')} (target <= 1.2x)")  # fmt: skip
    print(f"  ours v2 binary (tritonclient) / ours npy, time per request: "
          f"{ratio('ours v2 binary', 'ours /invocations npy', 'time')}")  # fmt: skip
    print(f"  ours v2 binary / {mlserver_name}, requests/s: {ratio('ours v2 binary', mlserver_name, 'throughput')}"
          " (target >= 1.0x)")  # fmt: skip
    print(f"  ours gRPC / ours v2 binary (tritonclient), time per request: "
          f"{ratio('ours gRPC', 'ours v2 binary', 'time')} (target <= 1.2x)")  # fmt: skip
    for peer, target in (("MLServer", ">= 1.0x"), ("KServe", ">= 1.0x"), ("Triton", ">= 0.8x")):
        if peer != "MLServer":
            print(f"  ours v2 binary / {peer} v2 binary, requests/s: "
                  f"{ratio('ours v2 binary', f'{peer} v2 binary', 'throughput')} (target {target})")  # fmt: skip
        print(f"  ours gRPC / {peer} gRPC, requests/s: {ratio('ours gRPC', f'{peer} gRPC', 'throughput')}"
              f" (target {target})")  # fmt: skip
    if mlserver_name.endswith("JSON"):
        print(f"  like for like, ours v2 JSON / {mlserver_name}, requests/s: "
              f"{ratio('ours v2 JSON', mlserver_name, 'throughput')}")  # fmt: skip
    ours = [name for name in results if name.startswith("ours")]
    spreads = {name: f"{h.spread(measured['ms'])} ms over the rounds" for name, measured in results.items()}
    medians = {name: h.median(measured["ms"]) for name, measured in results.items()}
    run.group("time per request", "ms", "lower", medians, ours, spreads)
    cpu = {name: h.median(measured["cpu_ms"]) for name, measured in results.items()}
    run.group("server CPU per request", "ms", "lower", cpu, ours, chart=False)
    run.compare("time per request", "ours v2 binary V2Client", "ours /invocations npy", target="<= 1.2x")
    run.compare("time per request", "ours v2 binary", "ours /invocations npy")
    run.compare("time per request", "ours gRPC", "ours v2 binary", target="<= 1.2x")
    for ours_name, theirs_name, target in (
        ("ours gRPC", "MLServer gRPC", ">= 1.0x"),
        ("ours v2 binary", "KServe v2 binary", ">= 1.0x"),
        ("ours gRPC", "KServe gRPC", ">= 1.0x"),
        ("ours v2 binary", "Triton v2 binary", ">= 0.8x"),
        ("ours gRPC", "Triton gRPC", ">= 0.8x"),
    ):
        ratio_ = medians[theirs_name] / medians[ours_name]
        run.compare("time per request", ours_name, theirs_name, ratio_, "requests/s", target)
    for name in ("ours v2 binary", "ours v2 JSON"):
        mine, theirs = medians[name], medians[mlserver_name]
        target = ">= 1.0x" if name == "ours v2 binary" else None
        run.compare("time per request", name, mlserver_name, theirs / mine, "requests/s", target)
    setup = f"seed array echoed, one worker each, one sequential client; medians of {rounds} round(s) of {seconds:g} s"
    run.write(
        args.results, "Open Inference Protocol v2 (v2.py)", setup, f"ours: --server {args.server}; {mlserver_note}"
    )


if __name__ == "__main__":
    main()
