"""Small JSON requests: our server on each backend against inference-server 1.3.3, a bare WSGI app, BentoML and
MLServer.

Every contender runs 2 worker processes; load comes from wrk (16 keep-alive connections, 2 threads) on
``POST /invocations`` with ``{"instances": [[10 floats]]}`` through a JSON echo model, and on ``GET /ping``.
Contenders alternate, in a rotating order, for several rounds; medians are printed with ratios. "timeout0" is
ours with ``--timeout 0``: requests run on the server's threads instead of a helper thread, without a 504 deadline.

The peers, each from PyPI in its own virtualenv (``_peers.py``), echo the same body in the same run:

- BentoML (``workers=2``, access log off as ours is at warning): a ``@bentoml.api`` at ``/invocations`` taking
  ``instances: list[list[float]]`` and returning ``{"instances": instances}``; its ping is ``GET /readyz``.
- MLServer (``parallel_workers: 2``, its inference pool; its REST server is one process): the echo runtime of
  ``_peers.py``, on ``POST /invocations`` (a custom handler taking and returning the same JSON body) and on its v2
  path, ``POST /v2/models/bench_echo/infer`` with the same 10 floats as one JSON tensor (``[1, 10]`` FP64) echoed
  back as an output; its ping is ``GET /v2/health/ready``.

Run: ``.venv/bin/python benchmarks/http_small.py`` (about 5 minutes; ``--quick``: one short round, about 1 minute).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import platform
import textwrap
import time
from pathlib import Path

import _harness as h
import _peers
import _results

JSON_ECHO = """
    import orjson
    import inference_server

    @inference_server.plugin_hook
    def input_fn(input_data, content_type):
        return orjson.loads(input_data)

    @inference_server.plugin_hook
    def predict_fn(data, model):
        return data

    @inference_server.plugin_hook
    def output_fn(prediction, accept):
        return orjson.dumps(prediction), "application/json"
"""

BARE = """
    def app(environ, start_response):
        length = int(environ.get("CONTENT_LENGTH") or 0)
        if length:
            environ["wsgi.input"].read(length)
        body = b'{"hello": "world"}'
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]
"""

BENTOML_ECHO = """
    import os

    import bentoml


    @bentoml.service(workers=int(os.environ["BENCH_WORKERS"]), logging={"access": {"enabled": False}})
    class Echo:
        @bentoml.api(route="/invocations")
        def invocations(self, instances: list[list[float]]) -> dict:
            return {"instances": instances}
"""

MODEL = "bench_echo"
ROW = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
BODY = json.dumps({"instances": [ROW]})
V2_BODY = json.dumps({"inputs": [{"name": "instances", "shape": [1, len(ROW)], "datatype": "FP64", "data": ROW}]})


def _post(body: str) -> str:
    return f"""
wrk.method = "POST"
wrk.body = '{body}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "application/json"
"""


POST, V2_POST = _post(BODY), _post(V2_BODY)
WORKERS = "2"
#: name -> (POST path, wrk script, ping path) of the contenders that are not served as ours is.
ROUTES = {
    "bare gunicorn": ("/", POST, "/"),
    "bare granian": ("/", POST, "/"),
    "BentoML": ("/invocations", POST, "/readyz"),
    "MLServer /invocations": ("/invocations", POST, "/v2/health/ready"),
    "MLServer v2 infer": (f"/v2/models/{MODEL}/infer", V2_POST, "/v2/health/ready"),
}
PEERS = ("BentoML", "MLServer /invocations", "MLServer v2 infer")


def contenders(site: str, threads: str) -> dict[str, tuple[str, dict[str, str], str]]:
    """name -> (command with {port}, environment, readiness path)."""
    env = h.base_env(PYTHONPATH=site, INFERENCE_SERVER_PLUGINS="json_echo", INFERENCE_SERVER_LOG_LEVEL="warning")
    bare_env = h.base_env(PYTHONPATH=site)
    ours = (
        f"{h.PYTHON} -m inference_server serve --host 127.0.0.1 --port {{port}} --workers {WORKERS} --threads {threads}"
    )
    legacy = f"{h.legacy_python()} -m gunicorn -b 127.0.0.1:{{port}} -w {WORKERS} -k sync --log-level warning"
    return {
        "ours gunicorn": (f"{ours} --server gunicorn", env, "/ping"),
        "ours granian": (f"{ours} --server granian", env, "/ping"),
        "ours granian timeout0": (f"{ours} --server granian --timeout 0", env, "/ping"),
        "1.3.3 gunicorn sync": (f"{legacy} inference_server:create_app()", h.base_env(PYTHONPATH=site), "/ping"),
        "bare gunicorn": (
            f"{h.PYTHON} -m gunicorn -b 127.0.0.1:{{port}} -w {WORKERS} -k gthread --threads {threads} "
            "--keep-alive 65 --log-level warning bare:app",
            bare_env,
            "/",
        ),
        "bare granian": (
            f"{h.PYTHON} -m granian --interface wsgi --host 127.0.0.1 --port {{port}} --workers {WORKERS} "
            f"--blocking-threads {threads} --log-level warning bare:app",
            bare_env,
            "/",
        ),
    }


def observability(site: str, threads: str) -> dict[str, tuple[str, dict[str, str], str]]:
    """``--observability``: ours on granian with the metrics and the access log (at info, JSON lines into a file, as
    a container's log collector reads them) each on and off."""
    env = h.base_env(PYTHONPATH=site, INFERENCE_SERVER_PLUGINS="json_echo", INFERENCE_SERVER_LOG_FORMAT="json")
    ours = (
        f"{h.PYTHON} -m inference_server serve --host 127.0.0.1 --port {{port}} --workers {WORKERS} --threads {threads}"
    )
    return {
        "default": (ours, env, "/ping"),
        "--no-metrics": (f"{ours} --no-metrics", env, "/ping"),
        "--no-access-log": (f"{ours} --no-access-log", env, "/ping"),
        "neither": (f"{ours} --no-metrics --no-access-log", env, "/ping"),
        "bare granian": contenders(site, threads)["bare granian"],
    }


def start_peers(stack: contextlib.ExitStack, site: str) -> tuple[dict[str, h.Server], str]:
    """BentoML and MLServer with ``WORKERS`` workers each: their servers by contender name, and what they are."""
    (Path(site) / "bentoml_echo.py").write_text(textwrap.dedent(BENTOML_ECHO))
    bentoml = stack.enter_context(_peers.bentoml(Path(site), "bentoml_echo:Echo", int(WORKERS), h.base_env()))
    models = {MODEL: {"name": MODEL, "implementation": "echo_model.Echo"}}
    runtimes = {"echo_model": _peers.MLSERVER_ECHO}
    mlserver, note = _peers.start_mlserver(stack, models, runtimes, int(WORKERS), h.base_env())
    about = (
        f"BentoML: {_peers.versions(_peers.bentoml_python(), 'bentoml', 'uvloop')}, workers={WORKERS}; "
        f"MLServer: {_peers.versions(_peers.mlserver_python(), 'mlserver', 'uvloop')}, {note}"
    )
    return {"BentoML": bentoml, "MLServer /invocations": mlserver, "MLServer v2 infer": mlserver}, about


def check(name: str, port: int) -> None:
    """One request: a peer's answer is the echo of its body."""
    path, lua, _ = ROUTES[name]
    v2 = lua == V2_POST
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("POST", path, body=V2_BODY if v2 else BODY, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    answer = json.loads(response.read())
    connection.close()
    echoed, expected = (answer["outputs"][0]["data"], ROW) if v2 else (answer, json.loads(BODY))
    if response.status != 200 or echoed != expected:
        raise RuntimeError(f"{name}: {response.status} {answer!r} is not the echo of {expected}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one round of 3 s per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--threads", default="1", help="threads per worker for the threaded servers")
    parser.add_argument(
        "--observability", action="store_true", help="the cost of the metrics and the access log, on granian"
    )
    _results.add_argument(parser)
    args = parser.parse_args()
    run = _results.Run("http_small", "observability" if args.observability else "quick" if args.quick else None)
    rounds, seconds = (1, 3.0) if args.quick else (args.rounds, args.seconds)
    site = str(h.plugin_site({"json_echo": JSON_ECHO}))
    with open(os.path.join(site, "bare.py"), "w") as f:
        f.write(textwrap.dedent(BARE))
    print(
        f"{platform.node()} {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}, threads per worker {args.threads}"
    )
    print(f"before: {h.load()}", flush=True)
    results: dict[str, dict[str, list[float]]] = {}
    about = ""
    with contextlib.ExitStack() as stack:
        servers = {}
        chosen = observability if args.observability else contenders
        for name, (template, env, ready) in chosen(site, args.threads).items():
            port = h.free_port()
            command = template.format(port=port).split()
            servers[name] = stack.enter_context(h.running(name, command, port, env, ready))
        if not args.observability:
            peers, about = start_peers(stack, site)
            print(about, flush=True)
            for name, server in peers.items():
                check(name, server.port)
            servers.update(peers)
        results = {name: {"invocations": [], "ping": [], "cpu_us": []} for name in servers}
        names = list(servers)
        for round_ in range(rounds):
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in order:
                port = servers[name].port
                path, lua, ping_path = ROUTES.get(name, ("/invocations", POST, "/ping"))
                cpu = servers[name].cpu_seconds()
                rate = h.wrk(f"http://127.0.0.1:{port}{path}", seconds, 16, lua)
                results[name]["invocations"].append(rate)
                results[name]["cpu_us"].append((servers[name].cpu_seconds() - cpu) / (rate * round(seconds)) * 1e6)
                results[name]["ping"].append(h.wrk(f"http://127.0.0.1:{port}{ping_path}", seconds, 16))
    print(f"after: {h.load()}; medians of {rounds} round(s) of {seconds} s, min-max of the rounds in brackets")
    if args.observability:
        base = h.median(results["neither"]["invocations"])
        base_cpu = h.median(results["neither"]["cpu_us"])
        print("throughput, and the server's CPU time per request (user + system, all its processes)")
        for name, measured in results.items():
            invocations = h.median(measured["invocations"])
            spread = h.spread(measured["invocations"])
            cpu = h.median(measured["cpu_us"])
            print(
                f"{name:<18} {invocations:>9.0f}/s ({spread}) {invocations / base - 1:+.1%} vs neither; "
                f"{cpu:6.1f} us CPU ({h.spread(measured['cpu_us'])}) {cpu / base_cpu - 1:+.1%}"
            )
        record(run, args.results, results, rounds, seconds, about)
        return
    legacy = h.median(results["1.3.3 gunicorn sync"]["invocations"])
    columns = (
        ("POST /invocations", 18),
        ("(min-max)", 14),
        ("GET /ping", 12),
        ("vs 1.3.3", 9),
        ("vs bare, same server", 21),
    )
    print(f"\n{'contender':<22}" + "".join(f" {title:>{width}}" for title, width in columns))
    for name, measured in results.items():
        invocations, ping = h.median(measured["invocations"]), h.median(measured["ping"])
        bare = "bare granian" if "granian" in name else "bare gunicorn"
        vs_bare = f"{invocations / h.median(results[bare]['invocations']):.2f}x" if name.startswith("ours") else ""
        spread = f"({h.spread(measured['invocations'])})"
        print(
            f"{name:<22} {invocations:>16.0f}/s {spread:>14} {ping:>10.0f}/s "
            f"{invocations / legacy:>8.2f}x {vs_bare:>21}"
        )
    print("\nours / peer, POST requests/s (ratio of the medians):")
    print(f"{'':<22}" + "".join(f" {peer:>22}" for peer in PEERS))
    for name in (name for name in results if name.startswith("ours")):
        ours = h.median(results[name]["invocations"])
        cells = (f"{ours / h.median(results[peer]['invocations']):.2f}x" for peer in PEERS)
        print(f"{name:<22}" + "".join(f" {cell:>22}" for cell in cells))
    record(run, args.results, results, rounds, seconds, about)


def record(
    run: _results.Run,
    path: str | None,
    results: dict[str, dict[str, list[float]]],
    rounds: int,
    seconds: float,
    about: str,
) -> None:
    """The printed medians and ratios, as ``benchmarks/results/http_small*.json``."""
    observability = run.variant == "observability"
    ours = [name for name in results if name.startswith("ours") or (observability and name != "bare granian")]
    spreads = {name: f"{h.spread(measured['invocations'])}/s over the rounds" for name, measured in results.items()}
    for group, key, unit, better, chart in (
        ("POST /invocations", "invocations", "requests/s", "higher", True),
        ("server CPU per request", "cpu_us", "us", "lower", observability),
        ("GET /ping", "ping", "requests/s", "higher", False),
    ):
        medians = {name: h.median(measured[key]) for name, measured in results.items()}
        run.group(group, unit, better, medians, ours, spreads if key == "invocations" else None, chart)
    if observability:
        for name in ("default", "--no-metrics", "--no-access-log"):
            run.compare("POST /invocations", name, "neither")
            run.compare("server CPU per request", name, "neither")
    else:
        post = "POST /invocations"
        run.compare(post, "ours granian", "1.3.3 gunicorn sync", target=">= 5x")
        run.compare(post, "ours granian", "bare granian", target=">= 0.6x")
        run.compare(post, "ours granian", "ours granian timeout0", target=">= 0.85x")
        for peer in PEERS:
            run.compare(post, "ours granian", peer, target=">= 1.0x")
        run.compare(post, "ours gunicorn", "1.3.3 gunicorn sync")
        run.compare(post, "ours gunicorn", "bare gunicorn")
    setup = f"{WORKERS} workers each, wrk 16 keep-alive connections, medians of {rounds} round(s) of {seconds:g} s"
    run.write(path, "Small JSON requests (http_small.py)", setup, about or None)


if __name__ == "__main__":
    main()
