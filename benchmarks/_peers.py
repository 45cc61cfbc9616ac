"""The peers the benchmarks run beside ours: BentoML, MLServer, Triton and KServe, each from PyPI in a virtualenv of its
own (made on first use, brought up to the pinned versions when an older run made it with others), and how each is
started.

Triton is the ``tritonserver`` that PyTriton's wheel bundles, run directly with its Python backend (a model
repository of a ``config.pbtxt`` and a ``model.py``): PyTriton's own model wrapper fails on Python 3.11.7 here
(``'_thread.RLock' object has no attribute '_recursion_count'`` in multiprocessing's resource tracker). CUDA and NVML
warnings in its log are harmless on a CPU machine. KServe is its Python model server (``kserve.ModelServer``).

MLServer's inference pool is its worker count (``parallel_workers``; its REST server is one process either way). The
pool's worker processes call ``asyncio.get_event_loop()`` before any loop exists, which uvloop 0.22 and later refuse
("There is no current event loop"), so the pool never starts with the uvloop that ``pip install mlserver==1.7.1``
picks today; its virtualenv pins uvloop 0.21.0, the last release before that change. When a pool still fails to
start, MLServer runs in-process (``parallel_workers: 0``) and the note returned with the server says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path

import _harness as h

BENTOML_VENV = h.ROOT / "benchmarks" / ".venv-bentoml"
BENTOML = ("bentoml==1.4.40",)
MLSERVER_VENV = h.ROOT / "benchmarks" / ".venv-mlserver"
MLSERVER = ("mlserver==1.7.1", "uvloop==0.21.0")
TRITON_VENV = h.ROOT / "benchmarks" / ".venv-triton"
#: PyTriton's wheel bundles ``tritonserver`` (2.51) with its Python backend and a backend stub per Python version.
TRITON = ("nvidia-pytriton==0.7.0",)
KSERVE_VENV = h.ROOT / "benchmarks" / ".venv-kserve"
KSERVE = ("kserve==0.21.0",)

#: A Triton Python-backend model echoing each input as the output of the same name (``{site}``: the virtualenv's
#: site-packages, which the backend stub, an embedded Python with the system's ``libpython``, lacks on its path).
TRITON_ECHO = """
    import sys

    sys.path.insert(0, {site!r})

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                outputs = [pb_utils.Tensor(tensor.name(), tensor.as_numpy()) for tensor in request.inputs()]
                responses.append(pb_utils.InferenceResponse(outputs))
            return responses
"""

#: A KServe model echoing each input as the output of the same name, binary (or raw, over gRPC) when the request
#: asks, through KServe's ``ModelServer`` (``--http_port``, ``--grpc_port``, ``--workers`` on its command line).
KSERVE_ECHO = """
    from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer, model_server


    class Echo(Model):
        def __init__(self, name):
            super().__init__(name)
            self.ready = True

        def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
            binary = payload.use_binary_outputs
            outputs = []
            for tensor in payload.inputs:
                output = InferOutput(tensor.name, list(tensor.shape), tensor.datatype)
                output.set_data_from_numpy(tensor.as_numpy(), binary_data=binary)
                outputs.append(output)
            requested = payload.request_outputs
            return InferResponse(
                payload.id or "", self.name, outputs, use_binary_outputs=binary, requested_outputs=requested
            )


    if __name__ == "__main__":
        model_server.parser.parse_args()
        ModelServer().start([Echo({name!r})])
"""

#: Triton's names for v2 datatypes in ``config.pbtxt``.
_TRITON_TYPES = {"FP64": "TYPE_FP64", "FP32": "TYPE_FP32", "INT32": "TYPE_INT32", "INT64": "TYPE_INT64"}

#: An MLServer runtime echoing what it gets: v2 tensors through ``predict`` (decoded and encoded back by
#: ``NumpyCodec``), and on ``POST /invocations`` (a custom handler on its REST server) a JSON body as JSON, any other
#: body as the same bytes in ``application/x-npy``, the semantics of ours' echo. FastAPI parses a JSON body
#: (``Content-Type: application/json``) and hands any other as ``bytes``; the handler takes no ``Request`` so that
#: the pool can run it (MLServer pickles a custom handler's arguments to a worker).
MLSERVER_ECHO = """
    from typing import Any

    from fastapi import Body
    from fastapi.responses import Response
    from mlserver import MLModel
    from mlserver.codecs import NumpyCodec
    from mlserver.handlers import custom_handler
    from mlserver.types import InferenceRequest, InferenceResponse


    class Echo(MLModel):
        async def load(self) -> bool:
            return True

        async def predict(self, payload: InferenceRequest) -> InferenceResponse:
            outputs = [
                NumpyCodec.encode_output(tensor.name, NumpyCodec.decode_input(tensor)) for tensor in payload.inputs
            ]
            return InferenceResponse(model_name=self.name, outputs=outputs)

        @custom_handler(rest_path="/invocations")
        async def invocations(self, payload: Any = Body()) -> Any:
            if isinstance(payload, bytes):
                return Response(payload, media_type="application/x-npy")
            return payload
"""


def venv_python(venv: Path, requirements: tuple[str, ...]) -> Path:
    """The Python of ``venv`` with ``requirements`` (``name==version`` each) installed."""
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"creating {venv} with {' '.join(requirements)} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    wanted = dict(requirement.split("==") for requirement in requirements)
    if installed(python, *wanted) != wanted:
        print(f"installing {' '.join(requirements)} into {venv} ...", flush=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *requirements], check=True)
    return python


def installed(python: Path, *names: str) -> dict[str, str]:
    """The versions of ``names`` installed for ``python`` ("-" for one that is not)."""
    code = (
        "import importlib.metadata as m, sys\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n        print(name, m.version(name))\n"
        "    except m.PackageNotFoundError:\n        print(name, '-')\n"
    )
    output = subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True, check=True).stdout
    return dict(line.split() for line in output.splitlines())


def versions(python: Path, *names: str) -> str:
    """``name version`` (or ``no name``) for each of ``names``, for a run's header."""
    found = installed(python, *names).items()
    return ", ".join(f"{name} {version}" if version != "-" else f"no {name}" for name, version in found)


def triton_python() -> Path:
    return venv_python(TRITON_VENV, TRITON)


def kserve_python() -> Path:
    return venv_python(KSERVE_VENV, KSERVE)


@contextlib.contextmanager
def triton(
    name: str, tensors: Mapping[str, tuple[str, int]], instances: int, env: dict[str, str]
) -> Iterator[h.Server]:
    """Triton serving the echo model ``name`` with Python-backend instances (``instances``, in processes of their
    own), its inputs and outputs ``tensors`` (name -> (v2 datatype, dimensions, each of any size)), over HTTP on the
    server's port and gRPC on its ``grpc_port``. The backend directory is composed from the wheel (its Python backend
    and the stub for this Python), as PyTriton does."""
    python = triton_python()
    site = Path(subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                               capture_output=True, text=True, check=True).stdout.strip())  # fmt: skip
    bundled = site / "pytriton" / "tritonserver"
    root = Path(tempfile.mkdtemp(prefix="bench-triton-"))
    backend = root / "backends" / "python"
    backend.mkdir(parents=True)
    for source in (bundled / "backends" / "python").glob("*.*"):
        (backend / source.name).symlink_to(source)
    stub = bundled / "python_backend_stubs" / f"{sys.version_info.major}.{sys.version_info.minor}"
    (backend / "triton_python_backend_stub").symlink_to(stub / "triton_python_backend_stub")
    model = root / "models" / name
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(textwrap.dedent(TRITON_ECHO.format(site=str(site))))
    dims = ", ".join(
        f'{{ name: "{tensor}", data_type: {_TRITON_TYPES[datatype]}, dims: [ {", ".join(["-1"] * rank)} ] }}'
        for tensor, (datatype, rank) in tensors.items()
    )
    config = (f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\ninput [ {dims} ]\noutput [ {dims} ]\n'
              f"instance_group [ {{ count: {instances}, kind: KIND_CPU }} ]\n")  # fmt: skip
    (model / "config.pbtxt").write_text(config)
    port, grpc_port = h.free_port(), h.free_port()
    command = [str(bundled / "bin" / "tritonserver"), "--model-repository", str(root / "models"),
               "--backend-directory", str(root / "backends"), "--http-port", str(port), "--grpc-port", str(grpc_port),
               "--allow-metrics", "false", "--log-info", "false"]  # fmt: skip
    env = {**env, "LD_LIBRARY_PATH": str(site / "nvidia_pytriton.libs")}
    with h.running("triton", command, port, env, "/v2/health/live") as server:
        h.ready(server, f"/v2/models/{name}/ready")
        server.grpc_port = grpc_port  # type: ignore[attr-defined]
        yield server


@contextlib.contextmanager
def kserve(name: str, workers: int, env: dict[str, str]) -> Iterator[h.Server]:
    """KServe's Python model server (``ModelServer``) serving the echo model ``name`` with ``workers`` processes,
    over HTTP on the server's port and gRPC on its ``grpc_port``, its per-request latency log off."""
    python = kserve_python()
    code = Path(tempfile.mkdtemp(prefix="bench-kserve-")) / "echo_model.py"
    code.write_text(textwrap.dedent(KSERVE_ECHO.format(name=name)))
    port, grpc_port = h.free_port(), h.free_port()
    command = [str(python), str(code), "--http_port", str(port), "--grpc_port", str(grpc_port), "--workers",
               str(workers), "--enable_latency_logging", "false", "--configure_logging", "false"]  # fmt: skip
    with h.running("kserve", command, port, env, "/v2/health/live") as server:
        h.ready(server, f"/v2/models/{name}/ready")
        server.grpc_port = grpc_port  # type: ignore[attr-defined]
        yield server


def bentoml_python() -> Path:
    return venv_python(BENTOML_VENV, BENTOML)


def mlserver_python() -> Path:
    return venv_python(MLSERVER_VENV, MLSERVER)


@contextlib.contextmanager
def bentoml(site: Path, service: str, workers: int, env: dict[str, str]) -> Iterator[h.Server]:
    """``bentoml serve service`` from the folder ``site`` on a free loopback port; the service reads its worker count
    from ``BENCH_WORKERS``."""
    port = h.free_port()
    command = [str(bentoml_python()), "-m", "bentoml", "serve", service, "--host", "127.0.0.1"]
    command += ["--port", str(port), "--working-dir", str(site)]
    env = {**env, "BENCH_WORKERS": str(workers), "BENTOML_DO_NOT_TRACK": "true"}
    with h.running("bentoml", command, port, env, "/readyz") as server:
        yield server


def mlserver_repository(models: Mapping[str, Mapping[str, object]], parallel_workers: int) -> tuple[Path, int]:
    """A model repository for MLServer: server settings on free loopback ports, and a folder per model with its
    ``model-settings.json`` (``models``: name -> settings, the name and ``implementation`` among them)."""
    root = Path(tempfile.mkdtemp(prefix="bench-mlserver-"))
    port = h.free_port()
    settings = {
        "debug": False,  # no access log (ours logs at warning)
        "host": "127.0.0.1",
        "http_port": port,
        "grpc_port": h.free_port(),
        "metrics_port": h.free_port(),
        "parallel_workers": parallel_workers,
        "environments_dir": str(root / ".envs"),  # (by default in the working directory)
        "metrics_dir": str(root / ".metrics"),
    }
    (root / "settings.json").write_text(json.dumps(settings))
    for name, model_settings in models.items():
        (root / name).mkdir()
        (root / name / "model-settings.json").write_text(json.dumps(model_settings))
    return root, port


def start_mlserver(
    stack: contextlib.ExitStack,
    models: Mapping[str, Mapping[str, object]],
    runtimes: dict[str, str],
    parallel_workers: int,
    env: dict[str, str],
) -> tuple[h.Server, str]:
    """MLServer serving ``models`` with an inference pool of ``parallel_workers`` processes, else (when the pool fails
    to start) in-process; and a note saying which. ``runtimes``: module name -> source, importable by the server
    (before ``env``'s ``PYTHONPATH``). Returns when every model answers ready."""
    mlserver = str(mlserver_python().parent / "mlserver")
    code = Path(tempfile.mkdtemp(prefix="bench-mlserver-runtimes-"))
    for module, source in runtimes.items():
        (code / f"{module}.py").write_text(textwrap.dedent(source))
    env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, (str(code), env.get("PYTHONPATH"))))}
    note = f"parallel_workers {parallel_workers}" + (" (its inference pool)" if parallel_workers else " (in-process)")
    for workers in dict.fromkeys((parallel_workers, 0)):
        root, port = mlserver_repository(models, workers)
        server = stack.enter_context(h.running("mlserver", [mlserver, "start", str(root)], port, env, "/v2"))
        try:
            for name in models:
                h.ready(server, f"/v2/models/{name}/ready")
        except RuntimeError as exc:
            server.stop()
            if workers == 0:
                raise
            errors = re.findall(r"^\w+Error: .*$", Path(server.log.name).read_text(), re.MULTILINE)
            reason = errors[0] if errors else str(exc).splitlines()[0]  # the first: the cause
            note = f"parallel_workers 0 (in-process: its pool of {parallel_workers} failed to start: {reason})"
            continue
        server.grpc_port = json.loads((root / "settings.json").read_text())["grpc_port"]  # type: ignore[attr-defined]
        return server, note
    raise AssertionError("unreachable")
