"""The Ray engine: a transform job on a pool of Ray actors, each input file, or each part of a large one, one task.

``--engine ray`` joins the cluster at ``--engine-address`` (``ray://...`` or ``auto``), else starts a local Ray of
``--workers`` CPUs (2) on 127.0.0.1, and runs a pool of ``--workers`` actors (2). Each actor loads the model once,
through the installed hooks, and transforms the tasks it is given exactly as the local engine does, so the outputs are
byte for byte the local engine's. A task that kills its actor's process fails its file, and a new actor takes the
dead one's place. Inputs and outputs must be reachable from the actors (this machine, a shared file system, or
``s3://``).

``FileTransformer`` is the same as a Ray Data UDF, for people already on Ray::

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

import time
from pathlib import Path
from typing import Any

from inference_server import _ray
from inference_server.errors import TransformError
from inference_server.transform import TransformOptions, TransformSummary
from inference_server.transform.tasks import Task, finish, kept_predictor, prepare, run_task

EXTRA = "pip install 'inference-server[ray]'"
_COUNTS = ("skipped", "records", "requests", "bytes_in", "bytes_out")


class FileTransformer:
    """A Ray Data callable class: rows with ``path`` and ``name`` (and for a part of a file, ``part`` and ``parts``)
    in, one row each out (its counts, ``failed``: the reason, or ``""``). The model is loaded when the actor starts
    and kept; the options left unset are the hooks' execution parameters, as in a job."""

    def __init__(self, root: str, output: str, options: TransformOptions) -> None:
        predictor = kept_predictor(options)  # this actor's model, the same per-process cache as the other engines
        self.root, self.output, self.options = root, output, options.resolved(predictor.execution_parameters)

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


class _Worker:
    """One actor of the engine's pool: transforms the tasks it is given, loading the model with the first (so that a
    model that fails to load fails each file with the reason, as on the other engines) and keeping it."""

    def __init__(self, root: str, output: str, options: TransformOptions) -> None:
        self.root, self.output, self.options = root, output, options

    def transform(self, task: Task) -> TransformSummary:
        return run_task(self.root, self.output, task, self.options)


def _start(address: str | None, workers: int | None, quiet: bool) -> tuple[Any, bool]:
    try:
        import ray  # noqa: F401
    except ImportError:
        raise TransformError(f"--engine ray needs Ray: {EXTRA}") from None
    return _ray.start(address, workers or 2, quiet=quiet)


def run(
    root: str | Path,
    output: str | Path,
    options: TransformOptions,
    *,
    address: str | None = None,
    workers: int | None = None,
) -> TransformSummary:
    """Transform every input file under ``root`` into ``output`` with a pool of Ray actors (see the module's text)."""
    files, options, tasks = prepare(str(root), str(output), options)
    if not tasks:  # nothing left to do (--resume): no cluster, no model
        return finish(str(output), files, tasks, {})
    ray, started_here = _start(address, workers, options.quiet)
    began = time.monotonic()
    results: dict[Task, TransformSummary] = {}
    # Ray's default for an actor: no restarts, no task retries. A file whose task kills its actor's process (a crash in
    # the model, the OOM killer) fails with the reason and a new actor takes the dead one's place; retried, it would
    # kill actor after actor (Ray Data's actor pools restart and retry without end).
    actor = ray.remote(num_cpus=1)(_Worker)
    size = min(workers or 2, len(tasks))  # no actor without a task
    waiting, idle = list(reversed(tasks)), [actor.remote(str(root), str(output), options) for _ in range(size)]
    running: dict[Any, tuple[Task, Any]] = {}
    try:
        while waiting or running:
            while idle and waiting:
                handle, task = idle.pop(), waiting.pop()
                running[handle.transform.remote(task)] = (task, handle)
            (ref,), _ = ray.wait(list(running), num_returns=1)
            task, handle = running.pop(ref)
            try:
                part: TransformSummary = ray.get(ref)
                idle.append(handle)
            except ray.exceptions.RayActorError as exc:  # its process died: a new actor for the pool
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                part = TransformSummary(failed=[(task.name, f"{task.name}: its Ray actor died: {first}")])
                idle.append(actor.remote(str(root), str(output), options))
            except ray.exceptions.RayTaskError as exc:  # the task raised: the model could not load
                cause = exc.cause if isinstance(exc.cause, BaseException) else exc
                part = TransformSummary(failed=[(task.name, f"{task.name}: {type(cause).__name__}: {cause}")])
                idle.append(handle)
            results[task] = part
            if part.failed and options.fail_fast:
                break
    finally:
        for handle in [*idle, *(handle for _, handle in running.values())]:
            ray.kill(handle)
        if started_here:
            _ray.stop(ray)
    summary = finish(str(output), files, tasks, results)
    summary.seconds = time.monotonic() - began
    return summary
