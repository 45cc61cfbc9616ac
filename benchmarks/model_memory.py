"""One model's memory on one machine: what a 400 MB model costs served by 1, 2 and 4 workers, ours against MLServer and
BentoML on the same model, and small-request throughput with and without the model shared.

The model is a float64 array of ``--model-mb`` MB (400) that this script writes with ``numpy.save`` into a temporary
folder (made here; nothing is downloaded). Each contender loads it with ``numpy.load`` in its load hook and answers
``{"sum": ...}`` of its first 8 values to ``POST /invocations`` with ``{"instances": [1]}``:

- "ours": ``inference-server serve --workers N`` (the model loaded once, in the serving process, before the workers
  fork from it: ``--preload``, the default); "ours --no-preload": each worker loads its own (as before issue 40);
- MLServer (``parallel_workers: N``, its inference pool; the model in ``MLModel.load``, answered by a custom
  ``/invocations`` handler); BentoML (``workers=N``; the model in the service's ``__init__``), each from PyPI in its
  own virtualenv (``_peers.py``).

What is read, from ``/proc/PID/smaps_rollup`` of every process of the server's tree once it is ready and has
answered 64 invocations, 8 at once on new connections (so that every worker has been asked: BentoML's load the model
on their first request): each process's PSS (proportional set size: a page shared by k processes counts 1/k in
each), and each worker's shared and private memory. Two figures per contender, in units of the model's size:

- **the workers' PSS**: the sum over the worker processes (ours: the serving process's children) of their PSS, over
  the model's size: issue 40's target for ours with 4 workers is <= 1.2x (before it, about 4x: a copy each);
- **copies**: what the model costs the machine, all of the server's processes together: (the sum of PSS over the
  whole tree with the model - the same with a 1-value model) / the model's size; 1.0 is one copy per machine.

Throughput (``--workers 2`` only): wrk, 16 connections for 3 s on ``POST /invocations``, ours and ours
``--no-preload`` alternating for ``--rounds`` rounds (rotating order); medians, with the ratio (target: unchanged).

``--multi-model``: models loaded after the workers start, where ``fork`` cannot share them: ``--models`` (20) models
of ``--model-mb`` MB (use 50), each loaded through ``POST /models`` of ``serve --multi-model --workers N`` (the
first of ``--workers``; use 4) and invoked until every worker has answered it (each invocation sums the whole array:
every page read), ours with ``model_fn`` returning ``inference_server.mapped(path)`` (the file's pages, shared
through the page cache), ``joblib.load(path, mmap_mode="r")`` (the same array dumped with joblib, uncompressed: joblib
maps its arrays; it unpickles the rest, which a model's own ``model_fn`` may do with a file it trusts) and
``numpy.load(path)`` (a copy per worker), each also against what ``GET /models`` says the models cost the machine
(``memoryBytes`` summed: issue 40's accounting); MLServer with the same models in its
repository, each loaded at start by every worker of its pool (BentoML has no multi-model endpoint). *Copies*: the
growth of PSS over every process / the models' total size (issue 40's target for ours: <= 1.3; MLServer's growth is
measured against the same repository of 1-value models).

Run: ``.venv/bin/python benchmarks/model_memory.py`` (about 6 minutes; ``--no-peers`` for ours alone,
``--workers 4`` for one count); ``--multi-model --workers 4 --model-mb 50`` (a minute or two).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import _harness as h
import _peers
import _results
import joblib
import numpy as np

MB = 1 << 20
#: How ours' multi-model plugin loads each model, by the name the results give it.
LOADERS = {"ours, inference_server.mapped": "mapped", "ours, joblib mmap_mode=r": "joblib", "ours, numpy.load": "numpy"}
BODY = json.dumps({"instances": [1]})
POST = f"""
wrk.method = "POST"
wrk.body = '{BODY}'
wrk.headers["Content-Type"] = "application/json"
"""

OURS = """
    import os

    import numpy as np

    import inference_server

    @inference_server.plugin_hook
    def model_fn(model_dir):
        return np.load(os.path.join(model_dir, "weights.npy"))

    @inference_server.plugin_hook
    def predict_fn(data, model):
        return {"sum": float(model[:8].sum())}
"""

MLSERVER = """
    import os
    from typing import Any

    import numpy as np
    from fastapi import Body
    from mlserver import MLModel
    from mlserver.handlers import custom_handler


    class Weights(MLModel):
        async def load(self) -> bool:
            parameters = self.settings.parameters
            directory = parameters.uri if parameters and parameters.uri else os.environ["BENCH_MODEL_DIR"]
            self.weights = np.load(os.path.join(directory, "weights.npy"))
            return True

        @custom_handler(rest_path="/invocations")
        async def invocations(self, payload: Any = Body()) -> Any:
            return {"sum": float(self.weights[:8].sum())}
"""

BENTOML = """
    import os

    import bentoml
    import numpy as np


    @bentoml.service(workers=int(os.environ["BENCH_WORKERS"]), logging={"access": {"enabled": False}})
    class Weights:
        def __init__(self) -> None:
            self.weights = np.load(os.path.join(os.environ["BENCH_MODEL_DIR"], "weights.npy"))

        @bentoml.api(route="/invocations")
        def invocations(self, instances: list) -> dict:
            return {"sum": float(self.weights[:8].sum())}
"""


MULTI_OURS = """
    import os

    import numpy as np

    import inference_server

    @inference_server.plugin_hook
    def model_fn(model_dir):
        loader = os.environ["BENCH_LOADER"]
        if loader == "joblib":  # (a file this script wrote: the trust joblib's unpickling needs)
            import joblib

            return joblib.load(os.path.join(model_dir, "weights.joblib"), mmap_mode="r")
        path = os.path.join(model_dir, "weights.npy")
        return inference_server.mapped(path) if loader == "mapped" else np.load(path)

    @inference_server.plugin_hook
    def predict_fn(data, model):
        return {"pid": os.getpid(), "sum": float(model.sum())}  # (every page read: a mapped one becomes resident)
"""


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants now."""
    found = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            for child in (task / "children").read_text().split():
                found += tree(int(child))
    return found


def smaps(pid: int) -> dict[str, int]:
    """``/proc/PID/smaps_rollup``'s fields, in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value, *_ = line.split()
        fields[name.rstrip(":")] = int(value) * 1024
    return fields


def shared(fields: dict[str, int]) -> int:
    return fields["Shared_Clean"] + fields["Shared_Dirty"]


def private(fields: dict[str, int]) -> int:
    return fields["Private_Clean"] + fields["Private_Dirty"]


def answer(port: int) -> None:
    """One invocation on a new connection, checked."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("POST", "/invocations", BODY, {"Content-Type": "application/json"})
    response = connection.getresponse()
    body = response.read()
    connection.close()
    if response.status != 200 or "sum" not in json.loads(body):
        raise RuntimeError(f"{response.status} {body[:200]!r}")


def answers(port: int, count: int = 64) -> None:
    """``count`` invocations, 8 at once on new connections, so that every worker is asked (BentoML's workers load
    the model on their first request)."""
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: answer(port), range(count)))


Starter = Callable[[contextlib.ExitStack, Path, int], tuple[h.Server, Callable[[], list[int]]]]


def ours(*options: str) -> Starter:
    """Ours with ``options``; its workers are the serving process's children."""

    def start(stack: contextlib.ExitStack, model_dir: Path, workers: int) -> tuple[h.Server, Callable[[], list[int]]]:
        site = h.plugin_site({"weights_model": OURS})
        env = h.base_env(
            PYTHONPATH=str(site), INFERENCE_SERVER_PLUGINS="weights_model", INFERENCE_SERVER_LOG_LEVEL="warning"
        )
        port = h.free_port()
        command = [h.PYTHON, "-m", "inference_server", "serve", "--host", "127.0.0.1", "--port", str(port)]
        command += ["--workers", str(workers), "--model-dir", str(model_dir), *options]
        server = stack.enter_context(h.running("ours", command, port, env))
        return server, lambda: tree(server.process.pid)[1:]

    return start


def mlserver(stack: contextlib.ExitStack, model_dir: Path, workers: int) -> tuple[h.Server, Callable[[], list[int]]]:
    models = {"weights": {"name": "weights", "implementation": "weights_model.Weights"}}
    env = h.base_env(BENCH_MODEL_DIR=str(model_dir))
    server, note = _peers.start_mlserver(stack, models, {"weights_model": MLSERVER}, workers, env)
    if not note.startswith(f"parallel_workers {workers}"):
        raise RuntimeError(f"MLServer: {note}")
    return server, lambda: tree(server.process.pid)[1:]


def bentoml(stack: contextlib.ExitStack, model_dir: Path, workers: int) -> tuple[h.Server, Callable[[], list[int]]]:
    site = Path(tempfile.mkdtemp(prefix="bench-bentoml-"))
    (site / "weights_service.py").write_text(textwrap.dedent(BENTOML))
    env = h.base_env(BENCH_MODEL_DIR=str(model_dir))
    server = stack.enter_context(_peers.bentoml(site, "weights_service:Weights", workers, env))
    return server, lambda: tree(server.process.pid)[1:]


@contextlib.contextmanager
def model(mb: float) -> Iterator[Path]:
    """A model directory whose ``weights.npy`` is ``mb`` MB of float64 (at least one value)."""
    with tempfile.TemporaryDirectory(prefix="bench-weights-") as directory:
        values = max(1, int(mb * MB) // 8)
        np.save(Path(directory) / "weights.npy", np.arange(values, dtype=np.float64))
        yield Path(directory)


def measure(start: Starter, model_dir: Path, workers: int) -> tuple[int, int, list[dict[str, int]]]:
    """The sum of PSS over the server's whole tree, over its workers, and each worker's smaps fields."""
    with contextlib.ExitStack() as stack:
        server, worker_pids = start(stack, model_dir, workers)
        answers(server.port)
        everyone = tree(server.process.pid)
        chosen = worker_pids()
        total = sum(smaps(pid)["Pss"] for pid in everyone)
        each = [smaps(pid) for pid in chosen]
        return total, sum(fields["Pss"] for fields in each), each


def post(port: int, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        connection.request("POST", path, body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def multi_ours(root: Path, names: list[str], workers: int, loader: str) -> tuple[float, float]:
    """Ours' PSS growth (bytes, every process) from the empty multi-model server to every model loaded (by
    ``loader``: mapped, numpy or joblib) through ``POST /models`` and invoked on every worker; and what ``GET
    /models`` says the models cost the machine (``memoryBytes`` summed)."""
    site = h.plugin_site({"weights_models": MULTI_OURS})
    env = h.base_env(
        PYTHONPATH=str(site), INFERENCE_SERVER_PLUGINS="weights_models", INFERENCE_SERVER_LOG_LEVEL="warning"
    )
    env["BENCH_LOADER"] = loader
    port = h.free_port()
    command = [h.PYTHON, "-m", "inference_server", "serve", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--multi-model", "--workers", str(workers), "--allow-model-dir", str(root)]
    with h.running("ours", command, port, env) as server, ThreadPoolExecutor(8) as pool:
        empty = sum(smaps(pid)["Pss"] for pid in tree(server.process.pid))
        for name in names:
            status, answer = post(port, "/models", json.dumps({"model_name": name, "url": str(root / name)}).encode())
            if status != 200:
                raise RuntimeError(f"loading {name}: {status} {answer}")
            seen: set[int] = set()
            for _ in range(50):
                path = f"/models/{name}/invoke"
                replies = list(pool.map(post, [port] * 8, [path] * 8, [b"[1]"] * 8))
                seen |= {answer["pid"] for status, answer in replies if status == 200}
                if len(seen) == workers:
                    break
            else:
                raise RuntimeError(f"{name} did not reach all {workers} workers: {seen}")
        grown = sum(smaps(pid)["Pss"] for pid in tree(server.process.pid)) - empty
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        connection.request("GET", f"/models?page_size={len(names)}")
        listing = json.loads(connection.getresponse().read())["models"]
        connection.close()
        return grown, float(sum(model["memoryBytes"] for model in listing))


def multi_mlserver(root: Path, tiny: Path, names: list[str], workers: int) -> float:
    """MLServer's PSS growth (bytes, every process) between its repository of tiny models and of the real ones, each
    loaded at start by every worker of its inference pool."""
    totals = []
    for directory in (tiny, root):
        models = {
            name: {
                "name": name,
                "implementation": "weights_model.Weights",
                "parameters": {"uri": str(directory / name)},
            }
            for name in names
        }
        with contextlib.ExitStack() as stack:
            server, note = _peers.start_mlserver(stack, models, {"weights_model": MLSERVER}, workers, h.base_env())
            if not note.startswith(f"parallel_workers {workers}"):
                raise RuntimeError(f"MLServer: {note}")
            totals.append(sum(smaps(pid)["Pss"] for pid in tree(server.process.pid)))
    return totals[1] - totals[0]


def multi_model(arguments: argparse.Namespace) -> None:
    """The multi-model case: ``--models`` models of ``--model-mb`` MB each on ``--workers`` workers (the first)."""
    workers, count, mb = arguments.workers[0], arguments.models, arguments.model_mb
    record = _results.Run("model_memory", "multi")
    names = [f"m{i:02d}" for i in range(count)]
    total = count * mb * MB
    print(f"{count} models of {mb:g} MB on {workers} workers; {h.load()}")
    with tempfile.TemporaryDirectory(prefix="bench-models-") as directory:
        root, tiny = Path(directory) / "models", Path(directory) / "tiny"
        for i, name in enumerate(names):
            for where, values in ((root, int(mb * MB) // 8), (tiny, 1)):
                (where / name).mkdir(parents=True)
                np.save(where / name / "weights.npy", np.arange(values, dtype=np.float64) + i)
            joblib.dump(np.arange(int(mb * MB) // 8, dtype=np.float64) + i, root / name / "weights.joblib")
        copies, reported = {}, {}
        for name, loader in LOADERS.items():
            grown, said = multi_ours(root, names, workers, loader)
            copies[name], reported[name] = grown / total, said / total
            print(f"| {name} | {copies[name]:.2f} copies (PSS) | GET /models: {reported[name]:.2f} |", flush=True)
        if not arguments.no_peers:
            copies["MLServer"] = multi_mlserver(root, tiny, names, workers) / total
    for name, value in copies.items():
        print(f"| {name} | {value:.2f} copies |", flush=True)
    case = f"{count} models of {mb:g} MB, {workers} workers: copies of the models on the machine"
    record.group(case, "copies", "lower", copies, list(LOADERS))
    for name in ("ours, inference_server.mapped", "ours, joblib mmap_mode=r"):
        record.compare(case, name, None, target="<= 1.3")
    for other in ("ours, numpy.load", "MLServer"):
        if other in copies:
            record.compare(case, "ours, inference_server.mapped", other)
    told = f"{count} models of {mb:g} MB, {workers} workers: what GET /models says they cost the machine, in copies"
    record.group(told, "copies", "lower", reported, list(LOADERS))
    print(h.load())
    setup = (
        f"{count} models of {mb:g} MB (float64 .npy, and the same array dumped with joblib, uncompressed), serve "
        f"--multi-model --workers {workers}: each loaded through POST /models and invoked on every worker (its whole "
        "array summed); MLServer: parallel_workers, every model in its repository, loaded at start by each worker; "
        "copies: PSS growth of every process / the models' size; GET /models: its memoryBytes summed / that size"
    )
    record.write(arguments.results, "Multi-model memory, shared (model_memory.py --multi-model)", setup)


def throughput(model_dir: Path, rounds: int) -> dict[str, list[float]]:
    """Requests/s of ours and ours --no-preload with 2 workers, alternating."""
    names = {"ours": ours(), "ours --no-preload": ours("--no-preload")}
    results: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(rounds):
        order = list(names)[round_ % 2 :] + list(names)[: round_ % 2]
        for name in order:
            with contextlib.ExitStack() as stack:
                server, _ = names[name](stack, model_dir, 2)
                answers(server.port)
                h.wrk(f"http://127.0.0.1:{server.port}/invocations", 1, 16, POST)  # warm-up
                results[name].append(h.wrk(f"http://127.0.0.1:{server.port}/invocations", 3, 16, POST))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4], help="worker counts (default 1 2 4)")
    parser.add_argument("--model-mb", type=float, default=400, help="the model's size in MB (default 400)")
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds (default 3)")
    parser.add_argument("--no-peers", action="store_true", help="ours alone, without MLServer and BentoML")
    parser.add_argument(
        "--multi-model", action="store_true", help="the multi-model case (--models of --model-mb on --workers)"
    )
    parser.add_argument("--models", type=int, default=20, help="models of the multi-model case (default 20)")
    _results.add_argument(parser)
    arguments = parser.parse_args()
    if arguments.multi_model:
        multi_model(arguments)
        return
    record = _results.Run("model_memory")
    contenders: dict[str, Starter] = {"ours": ours(), "ours --no-preload": ours("--no-preload")}
    about = ""
    if not arguments.no_peers:
        contenders |= {"MLServer": mlserver, "BentoML": bentoml}
        about = (
            f"; MLServer: {_peers.versions(_peers.mlserver_python(), 'mlserver')}, parallel_workers N; "
            f"BentoML: {_peers.versions(_peers.bentoml_python(), 'bentoml')}, workers=N"
        )
    size = arguments.model_mb * MB
    print(f"{arguments.model_mb:g} MB model; {h.load()}{about}")
    print("| workers | contender | workers' PSS / model | copies | PSS, all processes | each worker: shared, private |")
    print("|---|---|---|---|---|---|")
    with model(arguments.model_mb) as large, model(0) as tiny:
        for workers in arguments.workers:
            pss_share: dict[str, float] = {}
            copies: dict[str, float] = {}
            details: dict[str, str] = {}
            for name, start in contenders.items():
                total, workers_pss, each = measure(start, large, workers)
                empty, _, _ = measure(start, tiny, workers)
                pss_share[name], copies[name] = workers_pss / size, (total - empty) / size
                memory = ", ".join(f"{shared(f) / MB:.0f}/{private(f) / MB:.0f} MB" for f in each)
                details[name] = f"{total / MB:.0f} MB in all; shared/private per worker: {memory}"
                row = f"{pss_share[name]:.2f}x | {copies[name]:.2f} | {total / MB:.0f} MB | {memory}"
                print(f"| {workers} | {name} | {row} |", flush=True)
            case = f"{workers} worker(s): the model's copies on the machine"
            record.group(case, "copies", "lower", copies, ["ours"], details)
            share = f"{workers} worker(s): the workers' PSS over the model's size"
            record.group(share, "x", "lower", pss_share, ["ours"])
            if workers == 4:
                record.compare(share, "ours", None, target="<= 1.2")
            for peer in ("ours --no-preload", "MLServer", "BentoML"):
                if peer in copies:
                    record.compare(case, "ours", peer)
        if 2 in arguments.workers:
            rates = throughput(large, arguments.rounds)
            medians = {name: h.median(values) for name, values in rates.items()}
            for name, values in rates.items():
                print(f"{name}: {medians[name]:.0f} requests/s ({h.spread(values)}), 2 workers")
            ratio = medians["ours"] / medians["ours --no-preload"]
            print(f"ours / ours --no-preload: {ratio:.2f}x (target: unchanged)")
            spreads = {name: h.spread(values) for name, values in rates.items()}
            record.group("2 workers: POST /invocations", "requests/s", "higher", medians, ["ours"], spreads)
            record.compare("2 workers: POST /invocations", "ours", "ours --no-preload")
    print(h.load())
    setup = (
        f"a {arguments.model_mb:g} MB float64 array loaded with numpy.load; PSS from /proc/PID/smaps_rollup after 64 "
        "invocations, 8 at once; copies: (PSS of every process with the model - with a 1-value model) / its size"
    )
    record.write(arguments.results, "One model's memory (model_memory.py)", setup)


if __name__ == "__main__":
    main()
