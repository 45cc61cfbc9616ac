"""The Open Inference Protocol with small requests under load: ours, Triton, KServe and MLServer, two workers each,
over HTTP JSON, HTTP binary and gRPC.

The request is tritonclient's "simple" example's: two INT32 ``[1, 16]`` inputs, ``INPUT0`` and ``INPUT1``, echoed
back as outputs of the same names by each server's echo model (ours a plugin returning its input; Triton a Python
backend model; KServe a ``kserve.Model``; MLServer an ``MLModel``; ``_peers.py`` starts them). Each server runs two
workers: ours ``--workers 2``, Triton two model instances, KServe ``--workers 2``, MLServer ``parallel_workers: 2``
(in-process when its pool cannot start: the output says so).

- HTTP JSON and HTTP binary (Triton's binary tensor extension both ways: ``binary_data_output``) are driven by wrk,
  2 threads and 16 connections, the bodies made here once; a server that refuses binary tensors (MLServer: 422) is
  left out of that row, and the output says so.
- gRPC is driven by a Python load generator in a process of its own (``grpc.aio``, 8 channels on connections of
  their own, 2 calls in flight on each: 16 at once), sending the ``ModelInferRequest`` serialised once, as raw
  tensor contents; its answers are read but not decoded. On 2 cores the generator shares the machine with the
  server, as wrk does, and it is the same for every server.

Two more gRPC contenders are the floor of any Python server on grpcio: ``bare grpcio sync`` (grpcio's thread-pool
server, as ours runs) and ``bare grpcio aio`` (``grpc.aio``, as KServe and MLServer run), two processes each on the
port, answering every ModelInfer with the echo's response serialised once: no decoding, no model, no app.

Every contender's first answer is checked (the echo equals the request, over each transport). Rounds alternate the
contenders in a rotating order after a warm-up; medians of the rounds are printed with their min-max, and the
issue's targets: ours >= 1.0x KServe and MLServer, and >= 1.3x Triton's Python backend, on every transport. The
servers' CPU time per request (all their processes, from ``/proc``) says where a difference comes from: the server,
or the load generator sharing the 2 cores.
Run: ``.venv/bin/python benchmarks/v2_small.py`` (about 4 minutes; ``--quick``: 2 rounds of 2 s).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _harness as h
import _peers
import _results
import numpy as np
import orjson
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton
import v2
from tritonclient.grpc import service_pb2

MODEL = "simple"
INPUTS = {"INPUT0": np.arange(16, dtype=np.int32).reshape(1, 16), "INPUT1": np.ones((1, 16), dtype=np.int32)}
WORKERS = 2
CONNECTIONS = 16

#: Ours: the same echo plugin as v2.py's (a predict_fn that returns its input).
OURS = v2.OURS

#: The gRPC load generator: ``python - PORT SECONDS`` with the serialised request on stdin; prints requests/s.
GRPC_LOAD = """
    import asyncio
    import sys
    import time

    import grpc

    CHANNELS, IN_FLIGHT = 8, 2


    async def main(port, seconds, request):
        options = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own for each channel
        channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) for _ in range(CHANNELS)]
        calls = [channel.unary_unary("/inference.GRPCInferenceService/ModelInfer") for channel in channels]
        for call in calls:
            await call(request)
        count, end = 0, time.monotonic() + seconds

        async def run(call):
            nonlocal count
            while time.monotonic() < end:
                await call(request)
                count += 1

        started = time.monotonic()
        await asyncio.gather(*(run(call) for call in calls for _ in range(IN_FLIGHT)))
        print(count / (time.monotonic() - started))
        for channel in channels:
            await channel.close()


    asyncio.run(main(int(sys.argv[1]), float(sys.argv[2]), sys.stdin.buffer.read()))
"""


def json_body() -> bytes:
    inputs = [{"name": name, "shape": [1, 16], "datatype": "INT32", "data": array.ravel().tolist()}
              for name, array in INPUTS.items()]  # fmt: skip
    return orjson.dumps({"inputs": inputs})


def binary_body() -> tuple[bytes, int]:
    """Triton's binary tensor data: the JSON header (asking for binary outputs), then each input's bytes."""
    inputs = [{"name": name, "shape": [1, 16], "datatype": "INT32", "parameters": {"binary_data_size": array.nbytes}}
              for name, array in INPUTS.items()]  # fmt: skip
    header = orjson.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}})
    return header + b"".join(array.tobytes() for array in INPUTS.values()), len(header)


def grpc_request() -> bytes:
    """tritonclient's "simple" ModelInferRequest, serialised, its tensors as raw contents."""
    request = service_pb2.ModelInferRequest(model_name=MODEL)
    return _with_inputs(request, request.inputs, request.raw_input_contents)


def _with_inputs(message: Any, tensors: Any, raw: Any) -> bytes:
    """``message`` serialised once :data:`INPUTS` are added to its ``tensors`` and their bytes to its ``raw``."""
    for name, array in INPUTS.items():
        tensors.add(name=name, datatype="INT32", shape=[1, 16])
        raw.append(array.tobytes())
    return message.SerializeToString()  # type: ignore[no-any-return]


def lua(body: bytes, header_length: int | None) -> str:
    """A wrk script POSTing ``body`` (every byte escaped: binary data too)."""
    escaped = "".join(f"\\{byte}" for byte in body)
    extra = f'wrk.headers["Inference-Header-Content-Length"] = "{header_length}"\n' if header_length is not None else ""
    content_type = "application/octet-stream" if header_length is not None else "application/json"
    return f'wrk.method = "POST"\nwrk.body = "{escaped}"\nwrk.headers["Content-Type"] = "{content_type}"\n{extra}'


#: The floor of any server on grpcio: ``python - HTTP_PORT GRPC_PORT KIND`` runs ``WORKERS`` processes of a bare grpcio
#: server (``sync``: grpcio's thread-pool server, as ours runs; ``aio``: ``grpc.aio``, as KServe and MLServer run)
#: on the gRPC port (SO_REUSEPORT, grpcio's default), each answering every ModelInfer with the echo's response
#: serialised once (the hex on stdin), no decoding, no model; the HTTP port answers the harness's readiness check.
BARE_GRPC = """
    import asyncio
    import concurrent.futures
    import http.server
    import multiprocessing
    import signal
    import sys

    import grpc

    http_port, grpc_port, kind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    answer = bytes.fromhex(sys.stdin.read())
    SERVICE = "inference.GRPCInferenceService"


    def handler():
        method = grpc.unary_unary_rpc_method_handler(answer_aio if kind == "aio" else answer_sync)
        return grpc.method_handlers_generic_handler(SERVICE, {"ModelInfer": method})


    def answer_sync(request, context):
        return answer


    async def answer_aio(request, context):
        return answer


    async def serve_aio():
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((handler(),))
        server.add_insecure_port(f"127.0.0.1:{grpc_port}")
        await server.start()
        await server.wait_for_termination()


    def serve():
        if kind == "aio":
            asyncio.run(serve_aio())
            return
        server = grpc.server(concurrent.futures.ThreadPoolExecutor(61))  # as ours: --threads 1 + 60
        server.add_generic_rpc_handlers((handler(),))
        server.add_insecure_port(f"127.0.0.1:{grpc_port}")
        server.start()
        server.wait_for_termination()


    class Ready(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass


    if __name__ == "__main__":
        workers = [multiprocessing.Process(target=serve, daemon=True) for _ in range(WORKERS)]
        for worker in workers:
            worker.start()
        # SIGTERM (the harness's stop) exits normally, and multiprocessing then stops the daemonic workers
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        http.server.HTTPServer(("127.0.0.1", http_port), Ready).serve_forever()
"""


@contextlib.contextmanager
def bare_grpc(kind: str) -> Iterator[h.Server]:
    """A bare grpcio server of ``kind`` (see :data:`BARE_GRPC`), its processes stopped on leaving."""
    port, grpc_port = h.free_port(), h.free_port()
    code = textwrap.dedent(BARE_GRPC).replace("WORKERS", str(WORKERS))
    with tempfile.TemporaryDirectory() as directory:
        script = Path(directory) / "bare_grpc.py"
        script.write_text(code)
        with tempfile.TemporaryFile() as answer:
            answer.write(echo_response().hex().encode())
            answer.seek(0)
            command = [sys.executable, str(script), str(port), str(grpc_port), kind]
            with h.running(f"bare grpcio {kind}", command, port, h.base_env(), "/", stdin=answer) as server:
                server.grpc_port = grpc_port  # type: ignore[attr-defined]
                yield server


def echo_response() -> bytes:
    """The ModelInferResponse of the echo of :func:`grpc_request`, serialised."""
    response = service_pb2.ModelInferResponse(model_name=MODEL)
    return _with_inputs(response, response.outputs, response.raw_output_contents)


def check(name: str, port: int, grpc_port: int, binary: bool) -> None:
    """One request over each transport (binary if ``binary``): the echo equals the inputs."""
    client = triton.InferenceServerClient(f"127.0.0.1:{port}")
    over_grpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    try:
        for module, sender, modes in (
            (triton, client, [False, *([True] if binary else [])]),
            (triton_grpc, over_grpc, [True]),
        ):
            for as_binary in modes:
                inputs = []
                for input_name, array in INPUTS.items():
                    given = module.InferInput(input_name, [1, 16], "INT32")
                    if module is triton:
                        given.set_data_from_numpy(array, binary_data=as_binary)
                    else:
                        given.set_data_from_numpy(array)
                    inputs.append(given)
                if module is triton:
                    wanted = [triton.InferRequestedOutput(output, binary_data=as_binary) for output in INPUTS]
                    # (KServe takes a body without Content-Type for binary data; tritonclient sends none)
                    headers = None if as_binary else {"Content-Type": "application/json"}
                    result = sender.infer(MODEL, inputs, outputs=wanted, headers=headers)
                else:
                    result = sender.infer(MODEL, inputs)
                for input_name, array in INPUTS.items():
                    if not np.array_equal(result.as_numpy(input_name), array):
                        raise RuntimeError(f"{name}: the echo of {input_name} differs")
    finally:
        client.close()
        over_grpc.close()


def grpc_load(port: int, seconds: float, request: bytes) -> float:
    code = textwrap.dedent(GRPC_LOAD)
    done = subprocess.run([sys.executable, "-c", code, str(port), str(seconds)], input=request,
                          capture_output=True, check=True)  # fmt: skip
    return float(done.stdout.decode().strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of 2 s")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5)
    _results.add_argument(parser)
    args = parser.parse_args()
    run = _results.Run("v2_small", "quick" if args.quick else None)
    rounds, seconds = (2, 2.0) if args.quick else (args.rounds, args.seconds)
    site = h.plugin_site({MODEL: OURS})
    env = h.base_env(PYTHONPATH=str(site), INFERENCE_SERVER_PLUGINS=MODEL, INFERENCE_SERVER_LOG_LEVEL="warning")
    when = time.strftime("%Y-%m-%d %H:%M")
    print(f"{platform.node()} {os.cpu_count()} CPUs, {when}, Python {platform.python_version()}")
    print(f"two INT32 [1, 16] inputs echoed; {WORKERS} workers each; wrk -t2 -c{CONNECTIONS} for HTTP, a Python "
          f"grpc.aio generator ({CONNECTIONS} calls in flight on 8 connections) for gRPC")  # fmt: skip
    print(f"before: {h.load()}", flush=True)
    tensors = {name: ("INT32", 2) for name in INPUTS}
    json_lua, (body, header_length) = lua(json_body(), None), binary_body()
    binary_lua, request = lua(body, header_length), grpc_request()
    results: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    notes: list[str] = []
    with contextlib.ExitStack() as stack:
        port, grpc_port = h.free_port(), h.free_port()
        command = [h.PYTHON, "-m", "inference_server", "serve", "--host", "127.0.0.1", "--port", str(port),
                   "--workers", str(WORKERS), "--grpc-port", str(grpc_port)]  # fmt: skip
        ours = stack.enter_context(h.running("ours", command, port, env, f"/v2/models/{MODEL}/ready"))
        h.ready(ours, f"/v2/models/{MODEL}/ready")
        ours.grpc_port = grpc_port  # type: ignore[attr-defined]
        triton_server = stack.enter_context(_peers.triton(MODEL, tensors, WORKERS, h.base_env()))
        kserve_server = stack.enter_context(_peers.kserve(MODEL, WORKERS, h.base_env()))
        models = {MODEL: {"name": MODEL, "implementation": "echo_model.Echo"}}
        mlserver, mlserver_note = _peers.start_mlserver(
            stack, models, {"echo_model": _peers.MLSERVER_ECHO}, WORKERS, h.base_env()
        )
        notes.append(f"MLServer {mlserver_note}")
        servers = {"ours": ours, "Triton": triton_server, "KServe": kserve_server, "MLServer": mlserver}
        contenders: dict[str, tuple[str, h.Server]] = {}
        for name, server in servers.items():
            binary = name != "MLServer"
            check(name, server.port, server.grpc_port, binary)  # type: ignore[attr-defined]
            contenders[f"{name} HTTP JSON"] = ("json", server)
            if binary:
                contenders[f"{name} HTTP binary"] = ("binary", server)
            contenders[f"{name} gRPC"] = ("grpc", server)
        for kind in ("sync", "aio"):
            contenders[f"bare grpcio {kind} gRPC"] = ("grpc", stack.enter_context(bare_grpc(kind)))
        notes.append("MLServer refuses Triton's binary tensors (HTTP 422): no HTTP binary row for it")
        print("; ".join(notes), flush=True)
        url_path = f"/v2/models/{MODEL}/infer"
        names = list(contenders)
        for name in names:
            results[name], cpu[name] = [], []
        for round_ in range(rounds):
            for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                transport, server = contenders[name]
                used = server.cpu_seconds()
                if transport == "grpc":
                    rate = grpc_load(server.grpc_port, seconds, request)  # type: ignore[attr-defined]
                else:
                    script = json_lua if transport == "json" else binary_lua
                    rate = h.wrk(f"http://127.0.0.1:{server.port}{url_path}", seconds, CONNECTIONS, script)
                results[name].append(rate)
                cpu[name].append((server.cpu_seconds() - used) / (rate * seconds) * 1e6)
    print(f"after: {h.load()}; medians of {rounds} round(s) of {seconds:g} s, min-max of the rounds in brackets\n")
    print(f"{'contender':<24}{'requests/s':>12}{'(min-max)':>18}{'server CPU us/req':>20}")
    for name, rates in results.items():
        print(f"{name:<24}{h.median(rates):>12.0f}{'(' + h.spread(rates) + ')':>18}{h.median(cpu[name]):>20.0f}")
    medians = {name: h.median(rates) for name, rates in results.items()}
    spreads = {name: f"{h.spread(rates)} over the rounds" for name, rates in results.items()}
    ours = [name for name in medians if name.startswith("ours")]
    run.group("requests/s", "requests/s", "higher", medians, ours, spreads)
    cpu_medians = {name: h.median(values) for name, values in cpu.items()}
    run.group("server CPU per request", "us", "lower", cpu_medians, ours, chart=False)
    print("\ntargets (ours / it, requests/s; min-max of the rounds' own ratios):")
    for transport in ("HTTP JSON", "HTTP binary", "gRPC"):
        for peer, target in (("Triton", 1.3), ("KServe", 1.0), ("MLServer", 1.0)):
            theirs = f"{peer} {transport}"
            if theirs not in results:
                continue
            mine = results[f"ours {transport}"]
            rounds_ = [a / b for a, b in zip(mine, results[theirs], strict=True)]
            value = h.median(mine) / h.median(results[theirs])
            print(
                f"  ours / {theirs}: {value:.2f}x (rounds {min(rounds_):.2f}-{max(rounds_):.2f}) (target >= {target}x)"
            )
            run.compare("requests/s", f"ours {transport}", theirs, target=f">= {target}x")
    floors = [f"{name} {cpu_medians[name]:.0f} us" for name in cpu_medians if name.startswith("bare grpcio")]
    if floors and "Triton gRPC" in cpu_medians:
        theirs, mine = cpu_medians["Triton gRPC"], cpu_medians["ours gRPC"]
        print(f"\nthe grpcio floor, server CPU per request (no decoding, no model): {', '.join(floors)}; "
              f"Triton's whole gRPC request {theirs:.0f} us, ours {mine:.0f} us")  # fmt: skip
    setup = (f"two INT32 [1, 16] inputs echoed, {WORKERS} workers each, 16 requests in flight; medians of {rounds} "
             f"round(s) of {seconds:g} s")  # fmt: skip
    run.write(args.results, "The Open Inference Protocol, small requests (v2_small.py)", setup, "; ".join(notes))


if __name__ == "__main__":
    main()
