"""Multi-model memory: each worker's resident memory with 1, 10 and 50 models loaded, and after unloading them all.

``inference-server serve --multi-model --workers N`` (N = 1, then 2; the default backend) with a plugin whose
``model_fn`` allocates a known size (``--model-mb``, 8 MB of numpy by default, every page touched). Each model is
loaded through ``POST /models`` and invoked until every worker holds it (concurrent requests on new connections until
its ``privateBytesByWorker`` names every worker), so that each worker holds every model. Worker RSS (VmRSS of
``/proc/PID/status``) is read for: the empty server after a warm-up (a model loaded, used by every worker, unloaded:
what serving itself takes), 1, 10 and 50 models, and after unloading all of them (each worker drops them within a
quarter of a second; the script waits 2 s). The goal (issue 26): after/empty within 10%. Then what ``GET /models``
reported per model (the private memory each worker's load made resident), against the allocation.
``--mmap-threshold BYTES`` sets glibc's ``MALLOC_MMAP_THRESHOLD_`` for the server, which fixes the threshold (glibc
otherwise raises it, up to 32 MiB, each time a block above it is freed, after which such blocks come from heaps that
``malloc_trim`` does not shrink wholly).
Run: ``.venv/bin/python benchmarks/multi_model_memory.py`` (about 20 s; ``--workers 2`` for one count).
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import _harness as h
import _results
import orjson

PLUGIN = """
    import os

    import numpy as np

    import inference_server

    @inference_server.plugin_hook
    def model_fn(model_dir):
        size_mb = int(open(os.path.join(model_dir, "size_mb")).read())
        return np.ones(size_mb << 17)  # size_mb MB of float64, every page touched

    @inference_server.plugin_hook
    def predict_fn(data, model):
        return {"pid": os.getpid(), "sum": float(model[:8].sum())}
"""
#: The numbers of models loaded at which memory is read.
STEPS = (1, 10, 50)
#: Seconds given to every worker to drop unloaded models (they look every 0.25 s) before memory is read.
SETTLE = 2.0
MB = 1 << 20


def request(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        data = None if body is None else orjson.dumps(body)
        connection.request(method, path, data, {"Content-Type": "application/json"} if data else {})
        response = connection.getresponse()
        answer = response.read()
        return response.status, orjson.loads(answer) if answer else None
    finally:
        connection.close()


def vm_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


class Bench:
    """One server with ``workers`` workers and a directory of models of ``model_mb`` MB each."""

    def __init__(self, port: int, workers: int, root: Path, model_mb: int) -> None:
        self.port, self.workers, self.root, self.model_mb = port, workers, root, model_mb
        self.pool = ThreadPoolExecutor(8)

    def load_and_use(self, name: str) -> dict[str, int]:
        """Load ``name``, invoke it until every worker holds it; return its ``privateBytesByWorker``."""
        directory = self.root / name
        directory.mkdir(exist_ok=True)
        (directory / "size_mb").write_text(str(self.model_mb))
        status, answer = request(self.port, "POST", "/models", {"model_name": name, "url": str(directory)})
        if status != 200:
            raise RuntimeError(f"loading {name}: {status} {answer}")
        for _ in range(100):
            replies = list(self.pool.map(lambda _: request(self.port, "POST", f"/models/{name}/invoke", [1]), range(8)))
            if any(status != 200 for status, _ in replies):
                raise RuntimeError(f"invoking {name}: {replies}")
            costs: dict[str, int] = request(self.port, "GET", f"/models/{name}")[1]["privateBytesByWorker"]
            if len(costs) == self.workers:
                return costs
        raise RuntimeError(f"{name} did not reach all {self.workers} workers: {costs}")

    def unload(self, name: str) -> None:
        status, answer = request(self.port, "DELETE", f"/models/{name}")
        if status != 200:
            raise RuntimeError(f"unloading {name}: {status} {answer}")


def run(workers: int, model_mb: int, mmap_threshold: int | None, record: _results.Run) -> None:
    site = h.plugin_site({"mm_bench": PLUGIN})
    env = h.base_env(PYTHONPATH=str(site), INFERENCE_SERVER_PLUGINS="mm_bench", INFERENCE_SERVER_LOG_LEVEL="warning")
    if mmap_threshold is not None:
        env["MALLOC_MMAP_THRESHOLD_"] = str(mmap_threshold)
    port = h.free_port()
    command = [h.PYTHON, "-m", "inference_server", "serve", "--multi-model", "--workers", str(workers)]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    with (
        tempfile.TemporaryDirectory(prefix="bench-models-") as directory,
        h.running("server", [*command, "--allow-model-dir", directory], port, env),
    ):
        bench = Bench(port, workers, Path(directory), model_mb)
        pids = sorted(int(pid) for pid in bench.load_and_use("warm-up"))
        started = {pid: vm_rss(pid) for pid in pids}  # with the warm-up model held
        bench.unload("warm-up")
        time.sleep(SETTLE)
        readings = {"empty": {pid: vm_rss(pid) for pid in pids}}
        reported: list[dict[str, int]] = []
        names = [f"model-{i:02d}" for i in range(max(STEPS))]
        for i, name in enumerate(names, 1):
            reported.append(bench.load_and_use(name))
            if i in STEPS:
                time.sleep(0.5)
                readings[f"{i} model{'s' if i > 1 else ''}"] = {pid: vm_rss(pid) for pid in pids}
        for name in names:
            bench.unload(name)
        time.sleep(SETTLE)
        readings["after unloading all"] = {pid: vm_rss(pid) for pid in pids}
        status, listing = request(port, "GET", "/models")
        assert (status, listing) == (200, {"models": []}), listing
        bench.pool.shutdown()

    malloc = f", MALLOC_MMAP_THRESHOLD_={mmap_threshold}" if mmap_threshold is not None else ""
    print(f"\n--workers {workers}, {model_mb} MB per model{malloc} ({h.load()})")
    print(f"warm-up model held: {', '.join(f'{rss / MB:.1f} MB' for rss in started.values())}")
    header = "| stage | " + " | ".join(f"worker {n} RSS" for n in range(1, workers + 1)) + " | growth per model |"
    print(header)
    print("|---" * (workers + 2) + "|")
    empty = readings["empty"]
    for stage, rss in readings.items():
        count = int(stage.split()[0]) if stage[0].isdigit() else 0
        per_model = f"{statistics.mean((rss[pid] - empty[pid]) / count for pid in pids) / MB:.2f} MB" if count else ""
        print(f"| {stage} | " + " | ".join(f"{rss[pid] / MB:.1f} MB" for pid in pids) + f" | {per_model} |")
    after = readings["after unloading all"]
    ratios = [after[pid] / empty[pid] for pid in pids]
    verdict = "met" if all(ratio <= 1.10 for ratio in ratios) else "NOT met"
    print(f"after/empty: {', '.join(f'{ratio:.3f}' for ratio in ratios)} (goal: within 10%: {verdict})")
    case = f"--workers {workers}: RSS after unloading all / empty"
    names = [f"worker {n}" for n in range(1, workers + 1)]
    details = {
        name: f"{empty[pid] / MB:.1f} MB empty, {after[pid] / MB:.1f} MB after"
        for name, pid in zip(names, pids, strict=True)
    }
    record.group(case, "x", "lower", dict(zip(names, ratios, strict=True)), names, details)
    for name in names:
        record.compare(case, name, None, target="<= 1.10")
    costs = [cost for model in reported for cost in model.values()]
    print(
        f"GET /models privateBytesByWorker over {len(reported)} models x {workers} workers: median "
        f"{statistics.median(costs) / MB:.2f} MB, min {min(costs) / MB:.2f}, max {max(costs) / MB:.2f} "
        f"(allocated: {model_mb:.2f} MB each; {statistics.median(costs) / (model_mb * MB):.3f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts to run (default 1 2)")
    parser.add_argument("--model-mb", type=int, default=8, help="MB each model allocates (default 8)")
    parser.add_argument("--mmap-threshold", type=int, help="the server's MALLOC_MMAP_THRESHOLD_ (default: glibc's)")
    _results.add_argument(parser)
    arguments = parser.parse_args()
    record = _results.Run("multi_model_memory")
    for workers in arguments.workers:
        run(workers, arguments.model_mb, arguments.mmap_threshold, record)
    setup = f"serve --multi-model, {arguments.model_mb} MB per model, 50 models loaded, used by every worker, unloaded"
    record.write(arguments.results, "Multi-model memory (multi_model_memory.py)", setup)


if __name__ == "__main__":
    main()
