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

The event-loop contenders (issue 39), on uvloop unless ``--loop asyncio``:

- "ours asgi" and "ours rsgi": ours on granian with ``INFERENCE_SERVER_GRANIAN_INTERFACE=asgi`` / ``rsgi``
  (``POST /invocations`` on each worker's event loop), the same plugin. Our server passes granian no ``loop``, so
  granian's ``Loops.auto`` picks the loop: rloop, else uvloop, else asyncio, whichever the worker can import; with
  ``--loop uvloop`` uvloop is on their ``PYTHONPATH``, with ``--loop asyncio`` it is not (.venv has neither).
- "bare rsgi inline" (issue 39's floor of any Python design) and "bare rsgi executor": granian RSGI apps
  (``BARE_RSGI``) that read the body, decode it with orjson, call a trivial model (it returns its input), encode
  with orjson and answer; inline on the loop, or handed to a thread with ``loop.run_in_executor`` (the loop's
  default executor). granian's CLI with ``--loop uvloop`` (or ``asyncio``) and ``--http 1``, as ours runs.

uvloop is not a dependency of the project: ``--loop uvloop`` installs it on first use with pip into
``benchmarks/.venv-uvloop`` (a ``pip install --target`` folder, not a virtualenv), put on the ``PYTHONPATH`` of the
event-loop contenders only, so that .venv (the tests' install) stays as it is.

``--baseline REV`` adds "ours@REV" and "ours@REV gunicorn": ours on granian (its default interface then) and on
gunicorn from the tree of commit ``REV``,
exported with ``git archive`` into ``/tmp/inference-server-COMMIT/src`` (reused by later runs) and put first on
``PYTHONPATH``, ahead of .venv's editable install of today's tree (a plain path in a ``.pth`` file): today's
``main`` side by side with an old one, issue 39's ">= 1.0x" target. The script checks that the contender imports
``inference_server`` from that folder.

``--contenders "ours rsgi,bare rsgi inline"``: only those (names as printed; the peers start only when one of them
is chosen).

Run: ``.venv/bin/python benchmarks/http_small.py`` (about 8 minutes; ``--quick``: one short round, about 2 minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import platform
import subprocess
import tempfile
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

#: The floors of issue 39: the model (it returns its input) called inline on the loop, or on the loop's default
#: executor; ``GET /ping`` (any other method) answers an empty JSON object.
BARE_RSGI = """
    import asyncio

    import orjson

    HEADERS = [("content-type", "application/json")]


    def model(data):
        return data


    async def inline(scope, protocol):
        if scope.method != "POST":
            protocol.response_bytes(200, HEADERS, b"{}")
            return
        data = orjson.loads(await protocol())
        protocol.response_bytes(200, HEADERS, orjson.dumps(model(data)))


    async def executor(scope, protocol):
        if scope.method != "POST":
            protocol.response_bytes(200, HEADERS, b"{}")
            return
        data = orjson.loads(await protocol())
        prediction = await asyncio.get_running_loop().run_in_executor(None, model, data)
        protocol.response_bytes(200, HEADERS, orjson.dumps(prediction))
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
#: The setting that picks granian's interface for ours.
FRONT = "INFERENCE_SERVER_GRANIAN_INTERFACE"
#: name -> (POST path, wrk script, ping path) of the contenders that are not served as ours is.
ROUTES = {
    "bare gunicorn": ("/", POST, "/"),
    "bare granian": ("/", POST, "/"),
    "BentoML": ("/invocations", POST, "/readyz"),
    "MLServer /invocations": ("/invocations", POST, "/v2/health/ready"),
    "MLServer v2 infer": (f"/v2/models/{MODEL}/infer", V2_POST, "/v2/health/ready"),
}
PEERS = ("BentoML", "MLServer /invocations", "MLServer v2 infer")
#: Contenders that answer a fixed body, not the echo of theirs.
FIXED = ("bare gunicorn", "bare granian")
#: Ours on the event-loop fronts (issue 39), and the floor they are held to (>= 0.8x).
FRONTS = ("ours asgi", "ours rsgi")
FLOOR = "bare rsgi inline"
UVLOOP = "uvloop==0.23.0"
#: A ``pip install --target`` folder with uvloop, made on first use (ignored by git as ``benchmarks/.venv-*``).
UVLOOP_SITE = h.ROOT / "benchmarks" / ".venv-uvloop"


def uvloop_site() -> Path:
    """A folder with ``UVLOOP`` in it, for the ``PYTHONPATH`` of the event-loop contenders; pip installs it there
    on first use (uvloop is not a dependency of the project, and .venv is the tests' install)."""
    name, version = UVLOOP.split("==")
    if not (UVLOOP_SITE / f"{name}-{version}.dist-info").is_dir():
        print(f"installing {UVLOOP} into {UVLOOP_SITE} (pip install --target) for --loop uvloop ...", flush=True)
        command = [h.PYTHON, "-m", "pip", "install", "--quiet", "--upgrade", "--target", str(UVLOOP_SITE), UVLOOP]
        subprocess.run(command, check=True)
    return UVLOOP_SITE


def baseline_src(rev: str) -> Path:
    """The ``src`` folder of commit ``rev``, exported with ``git archive`` under the temporary folder (kept, and
    reused by later runs of the same commit)."""
    git = ["git", "-C", str(h.ROOT)]
    commit = subprocess.run(
        [*git, "rev-parse", "--verify", f"{rev}^{{commit}}"], capture_output=True, text=True, check=True
    ).stdout.strip()
    tree = Path(tempfile.gettempdir()) / f"inference-server-{commit[:12]}"
    if not (tree / "src" / "inference_server").is_dir():
        print(f"exporting src/ of {rev} ({commit[:12]}) into {tree} ...", flush=True)
        partial = Path(tempfile.mkdtemp(prefix=f"{tree.name}-", dir=tree.parent))
        archive = subprocess.run([*git, "archive", commit, "src"], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(partial)], input=archive, check=True)
        partial.rename(tree)  # whole or not at all: a run cut short leaves no half tree under the final name
    return tree / "src"


def imported_from(env: dict[str, str]) -> Path:
    """Where ``inference_server`` is imported from under ``env``."""
    code = "import inference_server; print(inference_server.__file__)"
    found = subprocess.run([h.PYTHON, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    return Path(found.strip()).parent


def contenders(
    site: str, threads: str, loop: str = "uvloop", baseline: str | None = None
) -> dict[str, tuple[str, dict[str, str], str]]:
    """name -> (command with {port}, environment, readiness path). ``loop``: the event-loop contenders' loop;
    ``baseline``: a commit whose tree is the contender "ours@BASELINE"."""
    env = h.base_env(PYTHONPATH=site, INFERENCE_SERVER_PLUGINS="json_echo", INFERENCE_SERVER_LOG_LEVEL="warning")
    bare_env = h.base_env(PYTHONPATH=site)
    loop_site = os.pathsep.join([site, str(uvloop_site())] if loop == "uvloop" else [site])
    ours = (
        f"{h.PYTHON} -m inference_server serve --host 127.0.0.1 --port {{port}} --workers {WORKERS} --threads {threads}"
    )
    legacy = f"{h.legacy_python()} -m gunicorn -b 127.0.0.1:{{port}} -w {WORKERS} -k sync --log-level warning"
    bare_rsgi = (
        f"{h.PYTHON} -m granian --interface rsgi --host 127.0.0.1 --port {{port}} --workers {WORKERS} --loop {loop} "
        "--http 1 --log-level warning bare_rsgi:"
    )
    chosen = {
        "ours gunicorn": (f"{ours} --server gunicorn", env, "/ping"),
        "ours granian": (f"{ours} --server granian", env, "/ping"),
        "ours granian timeout0": (f"{ours} --server granian --timeout 0", env, "/ping"),
        **{
            name: (f"{ours} --server granian", {**env, "PYTHONPATH": loop_site, FRONT: name.split()[1]}, "/ping")
            for name in FRONTS
        },
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
        "bare rsgi inline": (f"{bare_rsgi}inline", h.base_env(PYTHONPATH=loop_site), "/ping"),
        "bare rsgi executor": (f"{bare_rsgi}executor", h.base_env(PYTHONPATH=loop_site), "/ping"),
    }
    if baseline is not None:
        src = baseline_src(baseline)
        old = {**env, "PYTHONPATH": os.pathsep.join([str(src), site])}
        if (found := imported_from(old)) != src / "inference_server":
            raise RuntimeError(f"ours@{baseline} would import inference_server from {found}, not from {src}")
        chosen[f"ours@{baseline}"] = (f"{ours} --server granian", old, "/ping")
        chosen[f"ours@{baseline} gunicorn"] = (f"{ours} --server gunicorn", old, "/ping")
    return chosen


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
        "bare granian": contenders(site, threads, loop="asyncio")["bare granian"],
    }


def data_capture(site: str, threads: str) -> dict[str, tuple[str, dict[str, str], str]]:
    """``--data-capture``: ours on granian with and without data capture of every request (issue 42: <= 5% of
    throughput), to a directory of its own (removed when the run ends)."""
    default = observability(site, threads)["default"]
    capture = tempfile.mkdtemp(prefix="http-small-capture-")
    return {
        "default": default,
        "--data-capture": (f"{default[0]} --data-capture {capture} --data-capture-sampling 100", *default[1:]),
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
    """One request: a contender's answer is the echo of its body."""
    path, lua, _ = ROUTES.get(name, ("/invocations", POST, "/ping"))
    v2 = lua == V2_POST
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("POST", path, body=V2_BODY if v2 else BODY, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    answer = json.loads(response.read())
    connection.close()
    echoed, expected = (answer["outputs"][0]["data"], ROW) if v2 else (answer, json.loads(BODY))
    if response.status != 200 or echoed != expected:
        raise RuntimeError(f"{name}: {response.status} {answer!r} is not the echo of {expected}")


def bare_of(name: str) -> str:
    """The bare app on the same server as ours' contender ``name``."""
    return FLOOR if name in FRONTS else "bare gunicorn" if "gunicorn" in name else "bare granian"


def targets(results: dict[str, dict[str, list[float]]], baseline: str | None) -> list[tuple[str, str, str]]:
    """Issue 39's small-JSON targets among the contenders measured: (ours, other, target) for each."""
    found = []
    for name in ("ours granian", *FRONTS):
        for other, target in (
            ("1.3.3 gunicorn sync", ">= 5x"),
            (FLOOR, ">= 0.8x"),
            (f"ours@{baseline}" if baseline else None, ">= 1.0x"),
        ):
            if other is not None and name in results and other in results:
                found.append((name, other, target))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one round of 3 s per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--threads", default="1", help="threads per worker for the threaded servers")
    parser.add_argument(
        "--observability", action="store_true", help="the cost of the metrics and the access log, on granian"
    )
    parser.add_argument(
        "--data-capture", action="store_true", help="the cost of data capture at 100%% sampling, on granian"
    )
    parser.add_argument(
        "--loop",
        choices=("uvloop", "asyncio"),
        default="uvloop",
        help="the event loop of the event-loop contenders (ours asgi and rsgi, the bare RSGI apps; default: uvloop)",
    )
    parser.add_argument("--baseline", metavar="REV", help="also ours on granian from the tree of commit REV")
    parser.add_argument("--contenders", help="only these, comma-separated, as printed (default: all)")
    _results.add_argument(parser)
    args = parser.parse_args()
    kind = "observability" if args.observability else "data-capture" if args.data_capture else None
    run = _results.Run("http_small", kind or ("quick" if args.quick else None))
    rounds, seconds = (1, 3.0) if args.quick else (args.rounds, args.seconds)
    site = str(h.plugin_site({"json_echo": JSON_ECHO}))
    with open(os.path.join(site, "bare.py"), "w") as f:
        f.write(textwrap.dedent(BARE))
    with open(os.path.join(site, "bare_rsgi.py"), "w") as f:
        f.write(textwrap.dedent(BARE_RSGI))
    if args.observability:
        chosen = observability(site, args.threads)
    elif args.data_capture:
        chosen = data_capture(site, args.threads)
        args.observability = True  # (measured and printed the same way, against "default")
    else:
        chosen = contenders(site, args.threads, args.loop, args.baseline)
    names = list(chosen) + ([] if args.observability else list(PEERS))
    wanted = args.contenders.split(",") if args.contenders else names
    if unknown := set(wanted) - set(names):
        parser.error(f"unknown contenders {', '.join(sorted(unknown))}: choose among {', '.join(names)}")
    print(
        f"{platform.node()} {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}, threads per worker "
        f"{args.threads}, event-loop contenders on {args.loop}"
    )
    print(f"before: {h.load()}", flush=True)
    results: dict[str, dict[str, list[float]]] = {}
    about = ""
    with contextlib.ExitStack() as stack:
        servers = {}
        for name, (template, env, ready) in chosen.items():
            if name not in wanted:
                continue
            port = h.free_port()
            command = template.format(port=port).split()
            servers[name] = stack.enter_context(h.running(name, command, port, env, ready))
        if set(PEERS) & set(wanted):
            peers, about = start_peers(stack, site)
            print(about, flush=True)
            servers.update((name, server) for name, server in peers.items() if name in wanted)
        for name, server in servers.items():
            if name not in FIXED and not args.observability:
                check(name, server.port)
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
        versus = "default" if args.data_capture else "neither"
        base = h.median(results[versus]["invocations"])
        base_cpu = h.median(results[versus]["cpu_us"])
        print("throughput, and the server's CPU time per request (user + system, all its processes)")
        for name, measured in results.items():
            invocations = h.median(measured["invocations"])
            spread = h.spread(measured["invocations"])
            cpu = h.median(measured["cpu_us"])
            print(
                f"{name:<18} {invocations:>9.0f}/s ({spread}) {invocations / base - 1:+.1%} vs {versus}; "
                f"{cpu:6.1f} us CPU ({h.spread(measured['cpu_us'])}) {cpu / base_cpu - 1:+.1%}"
            )
        record(run, args.results, results, rounds, seconds, about, args.loop, args.baseline)
        return
    legacy = "1.3.3 gunicorn sync"
    columns = (
        ("POST /invocations", 18),
        ("(min-max)", 14),
        ("CPU/request", 12),
        ("GET /ping", 12),
        ("vs 1.3.3", 9),
        ("vs bare, same server", 21),
    )
    print(f"\n{'contender':<22}" + "".join(f" {title:>{width}}" for title, width in columns))
    for name, measured in results.items():
        invocations, ping = h.median(measured["invocations"]), h.median(measured["ping"])
        bare = bare_of(name)
        vs_bare = ""
        if name.startswith("ours") and bare in results:
            vs_bare = f"{invocations / h.median(results[bare]['invocations']):.2f}x"
        vs_legacy = f"{invocations / h.median(results[legacy]['invocations']):.2f}x" if legacy in results else ""
        spread = f"({h.spread(measured['invocations'])})"
        cpu = f"{h.median(measured['cpu_us']):.0f} us"
        print(f"{name:<22} {invocations:>16.0f}/s {spread:>14} {cpu:>12} {ping:>10.0f}/s {vs_legacy:>9} {vs_bare:>21}")
    peers = [peer for peer in PEERS if peer in results]
    if peers:
        print("\nours / peer, POST requests/s (ratio of the medians):")
        print(f"{'':<22}" + "".join(f" {peer:>22}" for peer in peers))
        for name in (name for name in results if name.startswith("ours")):
            ours = h.median(results[name]["invocations"])
            cells = (f"{ours / h.median(results[peer]['invocations']):.2f}x" for peer in peers)
            print(f"{name:<22}" + "".join(f" {cell:>22}" for cell in cells))
    if found := targets(results, args.baseline):
        print("\nissue 39's targets, POST requests/s (ratio of the medians):")
        for name, other, target in found:
            ratio = h.median(results[name]["invocations"]) / h.median(results[other]["invocations"])
            print(f"{name:<22} / {other:<22} {ratio:6.2f}x  (target {target})")
    record(run, args.results, results, rounds, seconds, about, args.loop, args.baseline)


def record(
    run: _results.Run,
    path: str | None,
    results: dict[str, dict[str, list[float]]],
    rounds: int,
    seconds: float,
    about: str,
    loop: str,
    baseline: str | None,
) -> None:
    """The printed medians and ratios, as ``benchmarks/results/http_small*.json``."""
    observability = run.variant in ("observability", "data-capture")
    ours = [name for name in results if name.startswith("ours") or (observability and name != "bare granian")]
    spreads = {name: f"{h.spread(measured['invocations'])}/s over the rounds" for name, measured in results.items()}
    for group, key, unit, better, chart in (
        ("POST /invocations", "invocations", "requests/s", "higher", True),
        ("server CPU per request", "cpu_us", "us", "lower", observability),
        ("GET /ping", "ping", "requests/s", "higher", False),
    ):
        medians = {name: h.median(measured[key]) for name, measured in results.items()}
        run.group(group, unit, better, medians, ours, spreads if key == "invocations" else None, chart)
    post = "POST /invocations"
    if run.variant == "data-capture":
        run.compare(post, "--data-capture", "default", target=">= 0.95x")
        run.compare("server CPU per request", "--data-capture", "default")
    elif observability:
        for name in ("default", "--no-metrics", "--no-access-log"):
            run.compare(post, name, "neither")
            run.compare("server CPU per request", name, "neither")
    else:
        pairs = [
            ("ours granian", "1.3.3 gunicorn sync", ">= 5x"),
            ("ours granian", "bare granian", ">= 0.6x"),
            ("ours granian", "ours granian timeout0", ">= 0.85x"),
            *(("ours granian", peer, ">= 1.0x") for peer in PEERS),
            *((name, other, target) for name, other, target in targets(results, baseline) if name != "ours granian"),
            ("ours gunicorn", "1.3.3 gunicorn sync", None),
            ("ours gunicorn", "bare gunicorn", None),
            ("bare rsgi executor", FLOOR, None),
        ]
        for name, other, target in pairs:
            if name in results and other in results:
                run.compare(post, name, other, target=target)
    setup = f"{WORKERS} workers each, wrk 16 keep-alive connections, medians of {rounds} round(s) of {seconds:g} s"
    if not observability and set((*FRONTS, FLOOR, "bare rsgi executor")) & set(results):
        setup += f"; the event-loop contenders on {loop}"
    notes = "; ".join(filter(None, (about, f"ours@{baseline}: ours from the tree of {baseline}" if baseline else "")))
    run.write(path, "Small JSON requests (http_small.py)", setup, notes or None)


if __name__ == "__main__":
    main()
