"""The local engine: a transform job in this process, ``MaxConcurrentTransforms`` requests at a time.

Files are transformed side by side and the requests of one file too, but each output keeps its input's order, and at
most twice ``MaxConcurrentTransforms`` request bodies are held at once (with SageMaker's bound on concurrency times
payload, at most 200 MB). Each output is written under a temporary name (``x.out.incomplete``) and renamed when
complete, so that no crash leaves a file that looks finished.
"""

from __future__ import annotations

import concurrent.futures
import logging
import multiprocessing
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inference_server.errors import TransformError
from inference_server.transform import TransformSummary, storage
from inference_server.transform.job import Job, done
from inference_server.transform.tasks import STOPPED, finish, predictor_for, prepare, run_task

if TYPE_CHECKING:
    from inference_server.transform import Predictor, TransformOptions
    from inference_server.transform.job import Task

logger = logging.getLogger("inference_server")


def _in_processes(root: str, output: str, options: TransformOptions, workers: int) -> TransformSummary:
    """The job's tasks in ``workers`` processes (spawned: each loads the model once, through the hooks)."""
    started = time.monotonic()
    files, options, tasks = prepare(root, output, options)
    source = storage.store(root)
    sizes = {task: source.size(task.path) // task.parts for task in tasks}
    bar = progress_bar(options, sum(sizes.values()))  # advanced task by task
    results: dict[Task, TransformSummary] = {}
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = {pool.submit(run_task, root, output, task, options): task for task in tasks}
        for future in concurrent.futures.as_completed(futures):
            task = futures[future]
            try:
                part = future.result()
            except concurrent.futures.CancelledError:
                continue
            except Exception as exc:  # the process died, or the model could not load there
                part = TransformSummary(failed=[(task.name, f"{task.name}: {type(exc).__name__}: {exc}")])
            results[task] = part
            if bar is not None:
                bar.update(sizes[task])
                bar.set_postfix_str(f"{sum(done.records for done in results.values())} records", refresh=False)
            if part.failed and options.fail_fast:
                for other in futures:
                    other.cancel()
    if bar is not None:
        bar.close()
    summary = finish(output, files, tasks, results)
    summary.seconds = time.monotonic() - started
    return summary


def run(
    root: str | Path,
    output: str | Path,
    options: TransformOptions,
    predictor: Predictor | None = None,
    *,
    workers: int | None = None,
) -> TransformSummary:
    """Transform every input file under ``root`` into ``output`` (paths, or fsspec URLs such as ``s3://``); a
    failed file is reported and the others go on (all stop at the first failure with ``fail_fast``). With
    ``workers`` above 1, files are shared among that many processes, each with its own model."""
    if workers is not None and workers > 1 and predictor is None:
        return _in_processes(str(root), str(output), options, workers)
    source, target = storage.store(str(root)), storage.store(str(output))
    files = source.inputs()
    if predictor is None:
        own = predictor_for(options)
        try:
            return run(root, output, options, own)
        finally:
            close = getattr(own, "close", None)
            if close is not None:
                close()
    options = options.resolved(predictor.execution_parameters)
    job = Job(options, predictor, source, target)
    job.summary.files = len(files)
    if options.resume and all(done(source, target, path, name) for path, name in files):
        job.summary.skipped = len(files)  # nothing left to do: the model is not even loaded
        return job.summary
    predictor.ready()  # the model loaded (or the container healthy) before any request; a failure stops the job
    job.bar = progress_bar(options, sum(source.size(path) for path, _ in files))
    concurrency = options.max_concurrent_transforms or 1
    with job.requests, concurrent.futures.ThreadPoolExecutor(concurrency, thread_name_prefix="transform-file") as pool:
        futures = {pool.submit(job.file, path, name): name for path, name in files}
        for future in concurrent.futures.as_completed(futures):
            name = futures[future]
            try:
                future.result()
            except TransformError as exc:
                job.summary.failed.append((name, str(exc)))
                if not options.quiet:
                    logger.error("Transform: %s", exc)
                if options.fail_fast:
                    job.stop.set()
                    for other in futures:
                        other.cancel()
            except concurrent.futures.CancelledError:
                job.summary.failed.append((name, STOPPED))
    if job.bar is not None:
        job.bar.close()
    job.summary.failed.sort()
    job.summary.seconds = time.monotonic() - job.started
    return job.summary


def progress_bar(options: TransformOptions, total: int) -> Any:
    """A progress bar on stderr (bytes sent of the inputs' total, records, rate, ETA) when stderr is a terminal and
    the job is not quiet; else None, and the job logs a line every
    :data:`~inference_server.transform.job.PROGRESS_EVERY` seconds instead.

    tqdm: one small pure-Python package, which draws on any terminal and writes nothing when stderr is a file."""
    if options.quiet or not sys.stderr.isatty():
        return None
    from tqdm import tqdm  # type: ignore[import-untyped]

    size = shutil.get_terminal_size()  # 80 x 24 where the terminal says 0 x 0 (tqdm would then draw nothing)
    return tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc="transform",
        file=sys.stderr,
        ncols=size.columns,
        nrows=size.lines,
    )
