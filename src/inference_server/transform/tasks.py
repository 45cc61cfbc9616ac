"""A transform job shared among processes, whichever engine runs it (``--workers``, Dask, Ray): the job cut into
tasks (a whole file, or a part of a large one), each task run in a worker process by a predictor kept there, and the
tasks' results joined into the job's outputs and summary."""

from __future__ import annotations

import dataclasses
import shutil
import threading
from typing import TYPE_CHECKING, NamedTuple

from inference_server.errors import TransformError
from inference_server.transform import BatchPredictor, TransformSummary, storage
from inference_server.transform.job import Job, Task, done

if TYPE_CHECKING:
    from inference_server.transform import Predictor, TransformOptions
    from inference_server.transform.storage import Store

__all__ = [
    "STOPPED",
    "Planned",
    "Task",
    "done",
    "finish",
    "kept_predictor",
    "plan",
    "predictor_for",
    "prepare",
    "resolved_elsewhere",
    "run_task",
]


def plan(source: Store, output: Store, files: list[tuple[str, str]], options: TransformOptions) -> list[Task]:
    """The tasks of a job run by several processes: a task per file, and a task per part of a file larger than
    the part size (records starting in ``[k * size, (k + 1) * size)`` make part ``k``: a 10 GB file keeps a whole
    cluster busy). With ``resume``, files already done get no task."""
    tasks: list[Task] = []
    size = options.part_size
    for path, name in files:
        if options.resume and done(source, output, path, name):
            continue
        parts = max(1, -(-source.size(path) // size)) if size else 1
        tasks.extend(Task(path, name, part, parts) for part in range(parts))
    return tasks


class Planned(NamedTuple):
    """A job about to be shared among processes: its input files, its options completed, and its tasks."""

    files: list[tuple[str, str]]
    options: TransformOptions
    tasks: list[Task]


def prepare(root: str, output: str, options: TransformOptions) -> Planned:
    """What every engine does first with a job it shares among processes: list the input files under ``root``,
    complete the options from the execution parameters (see :func:`resolved_elsewhere`), and plan the tasks."""
    source = storage.store(root)
    files = source.inputs()
    options = resolved_elsewhere(options)
    return Planned(files, options, plan(source, storage.store(output), files, options))


STOPPED = "stopped: another file failed first (--fail-fast)"


def finish(
    output: str, files: list[tuple[str, str]], tasks: list[Task], results: dict[Task, TransformSummary]
) -> TransformSummary:
    """The job's summary from what its tasks did (a task missing from ``results`` never ran): files whose parts all
    succeeded are joined into their ``.out`` and their part files removed; those of failed files are removed too."""
    store = storage.store(output)
    summary = TransformSummary(files=len(files))
    by_file: dict[str, list[Task]] = {}
    for task in tasks:
        by_file.setdefault(task.name, []).append(task)
    summary.skipped = len(files) - len(by_file)
    for name, parts in by_file.items():
        ran = [results[task] for task in parts if task in results]
        for part in ran:
            summary.add(dataclasses.replace(part, failed=[]))
        reasons = [reason for part in ran for _, reason in part.failed]
        failed = reasons[0] if reasons else STOPPED if len(ran) < len(parts) else ""
        try:
            if not failed and len(parts) > 1:
                with store.writing(store.target(name)) as sink:
                    for task in parts:
                        with store.open(task.target(store)) as piece:
                            shutil.copyfileobj(piece, sink, 1 << 20)
        except OSError as exc:
            failed = f"{name}: joining its parts: {exc}"
        finally:
            if len(parts) > 1:
                for task in parts:
                    store.remove(task.target(store))
        if failed:
            summary.failed.append((name, failed))
    summary.failed.sort()
    return summary


def predictor_for(options: TransformOptions) -> Predictor:
    """The installed hooks, or the container at ``options.endpoint``."""
    if options.endpoint is None:
        return BatchPredictor(model_dir=options.model_dir)
    from inference_server.transform.endpoint import EndpointPredictor

    return EndpointPredictor(
        options.endpoint,
        timeout=options.invocations_timeout_in_seconds,
        retries=options.invocations_max_retries,
        chunked=options.max_payload_in_mb == 0,
    )


#: This process's predictors, by model directory and endpoint, when it runs files for another process (``--workers``
#: processes, Dask workers): loaded by the first file, kept for the rest.
_predictors: dict[tuple[str | None, str | None], Predictor] = {}
_predictors_lock = threading.Lock()


def kept_predictor(options: TransformOptions) -> Predictor:
    """This process's predictor for ``options``, made ready by the first caller and kept."""
    key = (options.model_dir, options.endpoint)
    with _predictors_lock:
        predictor = _predictors.get(key)
        if predictor is None:
            predictor = predictor_for(options)
            predictor.ready()
            _predictors[key] = predictor
    return predictor


def resolved_elsewhere(options: TransformOptions) -> TransformOptions:
    """The options completed from the hooks' (or the container's) execution parameters, for a job whose files run in
    other processes: the model is not loaded here."""
    parameters = predictor_for(options)
    try:
        return options.resolved(parameters.execution_parameters)
    finally:
        close = getattr(parameters, "close", None)
        if close is not None:
            close()


def run_task(root: str, output: str, task: Task, options: TransformOptions) -> TransformSummary:
    """One task, in a worker process: its counts, and in ``failed`` its failure if it failed."""
    job = Job(options, kept_predictor(options), storage.store(root), storage.store(output))
    with job.requests:
        try:
            job.task(task)
        except TransformError as exc:
            job.summary.failed.append((task.name, str(exc)))
    return job.summary
