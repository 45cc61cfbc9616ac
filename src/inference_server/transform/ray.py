"""The Ray engine: a transform job as a Ray Data ``map_batches`` over the input files (and parts of large ones),
with an actor pool.

``--engine ray`` joins the cluster at ``--engine-address`` (``ray://...`` or ``auto``), else starts a local Ray of
``--workers`` CPUs (2) on 127.0.0.1. Each actor loads the model once, through the installed hooks, and transforms
the files it is given exactly as the local engine does, so the outputs are byte for byte the local engine's. Inputs
and outputs must be reachable from the actors (this machine, a shared file system, or ``s3://``).

``FileTransformer`` is also the Ray Data UDF for people already on Ray::

    import ray
    from inference_server.transform import TransformOptions
    from inference_server.transform.ray import FileTransformer

    files = ray.data.from_items([{"path": "/data/in/a.csv", "name": "a.csv"}])
    options = TransformOptions(content_type="text/csv", split_type="Line")
    done = files.map_batches(
        FileTransformer,
        fn_constructor_args=("/data/in", "/data/out", options),
        batch_size=1,
        compute=ray.data.ActorPoolStrategy(size=4),
    ).take_all()  # one row a file: its counts, and why it failed if it did

Needs the extra: ``pip install 'inference-server[ray]'``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from inference_server.errors import TransformError
from inference_server.transform import TransformOptions, TransformSummary
from inference_server.transform.tasks import Task, finish, kept_predictor, prepare, run_task

EXTRA = "pip install 'inference-server[ray]'"
_COUNTS = ("skipped", "records", "requests", "bytes_in", "bytes_out")


class FileTransformer:
    """A Ray Data callable class: rows with ``path`` and ``name`` (and for a part of a file, ``part`` and ``parts``)
    in, one row each out (its counts, ``failed``: the reason, or ``""``). The model is loaded when the actor starts
    and kept."""

    def __init__(self, root: str, output: str, options: TransformOptions) -> None:
        self.root, self.output, self.options = root, output, options
        kept_predictor(options)  # this actor's model, the same per-process cache as the other engines

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        rows: dict[str, list[Any]] = {"name": [], "part": [], "failed": [], **{count: [] for count in _COUNTS}}
        size = len(batch["path"])
        parts, of = batch.get("part", [0] * size), batch.get("parts", [1] * size)
        for path, name, part, total in zip(batch["path"], batch["name"], parts, of, strict=True):
            task = Task(str(path), str(name), int(part), int(total))
            done = run_task(self.root, self.output, task, self.options)
            rows["name"].append(task.name)
            rows["part"].append(task.part)
            rows["failed"].append(done.failed[0][1] if done.failed else "")
            for count in _COUNTS:
                rows[count].append(getattr(done, count))
        return rows


def _start(address: str | None, workers: int | None) -> tuple[Any, bool]:
    try:
        import ray
        import ray.data
    except ImportError:
        raise TransformError(f"--engine ray needs Ray Data: {EXTRA}") from None
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # never phone home from a job
    started = not ray.is_initialized()
    if started:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=workers or 2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    ray.data.DataContext.get_current().enable_progress_bars = False
    return ray, started


def run(
    root: str | Path,
    output: str | Path,
    options: TransformOptions,
    *,
    address: str | None = None,
    workers: int | None = None,
) -> TransformSummary:
    """Transform every input file under ``root`` into ``output`` with Ray Data (see the module's text)."""
    files, options, tasks = prepare(str(root), str(output), options)
    if not tasks:  # nothing left to do (--resume): no cluster, no model
        return finish(str(output), files, tasks, {})
    ray, started_here = _start(address, workers)
    began = time.monotonic()
    results: dict[Task, TransformSummary] = {}
    by_key = {(task.name, task.part): task for task in tasks}
    try:
        rows = [{"path": task.path, "name": task.name, "part": task.part, "parts": task.parts} for task in tasks]
        dataset = ray.data.from_items(rows).map_batches(
            FileTransformer,
            fn_constructor_args=(str(root), str(output), options),
            batch_size=1,
            compute=ray.data.ActorPoolStrategy(size=workers or 2),  # one model per actor, a fixed pool
        )
        for row in dataset.iter_rows():  # as the tasks finish: --fail-fast stops the rest
            part = TransformSummary(failed=[(row["name"], row["failed"])] if row["failed"] else [])
            for count in _COUNTS:
                setattr(part, count, int(row[count]))
            results[by_key[row["name"], int(row["part"])]] = part
            if part.failed and options.fail_fast:
                break
    finally:
        if started_here:
            ray.shutdown()
    summary = finish(str(output), files, tasks, results)
    summary.seconds = time.monotonic() - began
    return summary
