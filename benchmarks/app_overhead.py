"""In-process cost of one small JSON request through the WSGI app, without any server.

Contenders, all with the same JSON echo hooks: our app (with its default request deadline, and with ``--timeout 0``,
which runs the hooks on the calling thread instead of handing them to a helper); the same pipeline written with
werkzeug's ``Request`` and ``Response`` objects (as inference-server 1.x does); a bare WSGI echo (the floor).
Alternating rounds, medians.
Run: ``.venv/bin/python benchmarks/app_overhead.py``.

``--instructions`` counts instead of timing: the instructions the CPU runs per request, ours with granian's backend
(callgrind, Debian package ``valgrind``), as the difference between a run of 6,000 requests and one of 1,000, each
in a process of its own after the same warm-up. Unlike time on a shared machine, the count is the same from one run
to the next (within about 1%), so it can judge a change of a few percent. Ours runs as in a worker of ``serve`` at
``--log-level warning`` (the setting of ``http_small.py``): its state shared with the serving process attached, the
metrics recorded (their flush is not counted: it runs on its own thread every 0.1 s of real time, which callgrind
slows about fifty times). The environ of every contender is built in the loop, as a server does: that is most of
what "bare" counts.
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import _results
import orjson
import werkzeug
import werkzeug.exceptions

from inference_server import _logging, _plugins, metrics, plugin_hook
from inference_server._settings import Settings
from inference_server.wsgi._app import App

BODY = b'{"instances": [[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]]}'
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class JSONEcho:
    @plugin_hook
    def input_fn(self, input_data: bytes, content_type: str) -> Any:
        return orjson.loads(input_data)

    @plugin_hook
    def predict_fn(self, data: Any, model: Any) -> Any:
        return data

    @plugin_hook
    def output_fn(self, prediction: Any, accept: Any) -> tuple[bytes, str]:
        return orjson.dumps(prediction), "application/json"


def werkzeug_app() -> WSGIApp:
    """The 1.x request path: werkzeug Request and Response objects around the same hooks."""
    pm = _plugins.build_manager([], [JSONEcho()])
    model = pm.hook.model_fn(model_dir="/nonexistent")

    @werkzeug.Request.application  # type: ignore[arg-type]
    def app(request: werkzeug.Request) -> werkzeug.Response:
        if (request.method, request.path) != ("POST", "/invocations"):
            raise werkzeug.exceptions.NotFound()
        data = pm.hook.input_fn(input_data=request.get_data(), content_type=request.content_type)
        prediction = pm.hook.predict_fn(data=data, model=model)
        body, content_type = pm.hook.output_fn(prediction=prediction, accept=request.accept_mimetypes)
        return werkzeug.Response(body, mimetype=content_type)

    return app  # type: ignore[return-value]


def bare_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    body = environ["wsgi.input"].read(int(environ["CONTENT_LENGTH"]))
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]


def environ() -> dict[str, Any]:
    return {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/invocations",
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8080",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "HTTP_HOST": "127.0.0.1:8080",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(BODY)),
        "HTTP_ACCEPT": "application/json",
        "wsgi.input": io.BytesIO(BODY),
        "wsgi.url_scheme": "http",
        "wsgi.errors": io.StringIO(),
    }


def per_request(app: WSGIApp, count: int) -> float:
    """Seconds per request, the environ built fresh each time (as a server does)."""

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        pass

    started = time.perf_counter()
    for _ in range(count):
        body = app(environ(), start_response)
        b"".join(body)
        close = getattr(body, "close", None)
        if close is not None:  # as every server does: the metrics and the access log are recorded then
            close()
    return (time.perf_counter() - started) / count


def ours(**settings: Any) -> App:
    app = App(Settings(model_dir="/nonexistent", **settings), _plugins.build_manager([], [JSONEcho()]))
    app.model()
    return app


def main(results: str | None) -> None:
    run = _results.Run("app_overhead")
    # the access log as serve writes it (JSON lines), to /dev/null: its cost, not the terminal's
    _logging.configure(logging.INFO, "json", stream=open(os.devnull, "w"), background=True)  # noqa: SIM115
    metrics.recorder.start_flushing()  # as in a worker of serve: what is recorded is counted every 0.1 s
    apps: dict[str, WSGIApp] = {
        "ours": ours(),  # type: ignore[dict-item]
        "ours --no-metrics": ours(metrics=False),  # type: ignore[dict-item]
        "ours --no-access-log": ours(access_log=False),  # type: ignore[dict-item]
        "ours --no-metrics --no-access-log": ours(metrics=False, access_log=False),  # type: ignore[dict-item]
        "ours --timeout 0": ours(timeout=0),  # type: ignore[dict-item]
        "werkzeug Request/Response": werkzeug_app(),
        "bare": bare_app,
    }
    samples: dict[str, list[float]] = {name: [] for name in apps}
    for round_ in range(16):
        shift = round_ % len(apps)
        for name in list(apps)[shift:] + list(apps)[:shift]:
            samples[name].append(per_request(apps[name], 5000))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    print(f"{'app':<36} {'us/request':>11} {'requests/s':>11}")
    for name, seconds in medians.items():
        print(f"{name:<36} {seconds * 1e6:>11.2f} {1 / seconds:>11.0f}")
    neither = medians["ours --no-metrics --no-access-log"]
    for name, what in (("ours --no-access-log", "the metrics"), ("ours --no-metrics", "the access log")):
        cost = medians[name] - neither
        print(f"{what} cost {cost * 1e6:.2f} us per request, {cost / neither:.1%} of a request without either")
    werkzeug_path = medians["werkzeug Request/Response"]
    for name in ("ours", "ours --timeout 0"):
        print(f"\n{name} costs {medians[name] / werkzeug_path:.2f}x the werkzeug path's time, ", end="")
        print(f"{(medians[name] - medians['bare']) * 1e6:.2f} us per request above bare")
    mine = [name for name in apps if name.startswith("ours")]
    run.group("time per request", "us", "lower", {name: seconds * 1e6 for name, seconds in medians.items()}, mine)
    for name in ("ours --timeout 0", "werkzeug Request/Response", "bare"):
        run.compare("time per request", "ours", name)
    run.write(results, "In-process request path (app_overhead.py)", "one small JSON request, no server; 16 rounds")


#: The contenders ``--instructions`` counts, by name: how to make each.
COUNTED: dict[str, Callable[[], WSGIApp]] = {
    "ours on granian": lambda: ours_on_granian(),  # type: ignore[dict-item,return-value]
    "ours on granian --timeout 0": lambda: ours_on_granian(timeout=0),  # type: ignore[dict-item,return-value]
    "werkzeug Request/Response": lambda: werkzeug_app(),
    "bare": lambda: bare_app,
}
#: Requests of the two counted runs; the first is also the warm-up of each.
COUNTS = (1000, 6000)


def ours_on_granian(**settings: Any) -> App:
    """Ours as granian's workers run it (granian's backend: its head checks, its way with lists and bodies)."""
    from inference_server.server.granian import BACKEND

    app = App(Settings(model_dir="/nonexistent", **settings), _plugins.build_manager([], [JSONEcho()]), BACKEND)
    app.model()
    return app


def run_counted(name: str, count: int) -> None:
    """One contender's requests, in the process callgrind counts (``--one``)."""
    _logging.configure(logging.WARNING, "json", stream=open(os.devnull, "w"), background=True)  # noqa: SIM115
    app = COUNTED[name]()
    supervisor = None
    if isinstance(app, App):  # as in a worker of serve: the drain's count of requests in flight
        from inference_server.server import _state

        supervisor = _state.Supervisor()
        app.worker = _state.Worker(supervisor.path, lambda reason: None)
    try:
        per_request(app, COUNTS[0])  # the warm-up
        per_request(app, count)
    finally:
        if supervisor is not None:
            supervisor.close()


def instructions(name: str, count: int) -> int:
    """The instructions a process running ``count`` requests of ``name`` (after the warm-up) ran in all."""
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__]
    result = subprocess.run([*command, "--one", name, "--count", str(count)], capture_output=True, text=True)
    found = re.search(r"Collected : (\d+)", result.stderr)
    if result.returncode or found is None:
        sys.exit(f"callgrind failed for {name}: {result.stderr[-2000:]}")
    return int(found.group(1))


def count_instructions(results: str | None) -> None:
    if shutil.which("valgrind") is None:
        sys.exit("--instructions needs valgrind (Debian package valgrind)")
    run = _results.Run("app_overhead", "instructions")
    counted = {}
    print(f"{'app':<36} {'instructions/request':>21}")
    for name in COUNTED:
        few, many = (instructions(name, count) for count in COUNTS)
        counted[name] = (many - few) / (COUNTS[1] - COUNTS[0])
        print(f"{name:<36} {counted[name]:>21,.0f}")
    ours = [name for name in counted if name.startswith("ours")]
    run.group("instructions per request", "instructions", "lower", counted, ours)
    for name in ("ours on granian --timeout 0", "werkzeug Request/Response", "bare"):
        run.compare("instructions per request", "ours on granian", name)
    run.write(results, "In-process request path, instructions (app_overhead.py --instructions)", "callgrind")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--instructions", action="store_true", help="count instructions per request (callgrind)")
    parser.add_argument("--one", choices=list(COUNTED), help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=COUNTS[0], help=argparse.SUPPRESS)
    _results.add_argument(parser)
    args = parser.parse_args()
    if args.one:
        run_counted(args.one, args.count)
    elif args.instructions:
        count_instructions(args.results)
    else:
        main(args.results)
