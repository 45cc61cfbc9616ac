"""The Dask engine: a transform job on a ``dask.distributed`` cluster, each input file, or each part of a large one,
one task.

``--engine dask`` runs on the cluster at ``--engine-address`` (``tcp://...``), else on a ``LocalCluster`` of
``--workers`` processes on this machine. Each Dask worker process loads the model once, through the installed hooks,
and keeps it for every task it runs; within a task the file is transformed exactly as the local engine does it (the
same splitting, packing, ``MaxConcurrentTransforms`` requests at once, outputs renamed into place), so the outputs
are byte for byte the local engine's. Inputs and outputs must be reachable from the workers: the same machine, a
shared file system, or an object store (``s3://``).

Needs the extra: ``pip install 'inference-server[dask]'``.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from pathlib import Path
from typing import Any

from inference_server._settings import BatchStrategy
from inference_server.errors import TransformError
from inference_server.transform import TransformOptions, TransformSummary
from inference_server.transform.tasks import Task, finish, kept_predictor, prepare, run_task

EXTRA = "pip install 'inference-server[dask]'"


def _client(address: str | None, workers: int | None, dashboard: str | None = None, quiet: bool = False) -> Any:
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise TransformError(f"--engine dask needs dask.distributed: {EXTRA}") from None
    # Dask's own lines: a cluster of our own says at INFO what it does (~30 lines a job) and where a dashboard would
    # be, so INFO only when the dashboard was asked for; WARNING (a worker restarted, a result recomputed) unless
    # --quiet, which leaves ERROR
    level = logging.INFO if dashboard else logging.ERROR if quiet else logging.WARNING
    logging.getLogger("distributed").setLevel(level)  # this process's: the client, and the LocalCluster's scheduler
    for name in ("distributed.client", "distributed.gc"):  # WARNING in Dask's logging config, whatever their parent's
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
    if address:
        return Client(address), None  # type: ignore[no-untyped-call]
    if dashboard and importlib.util.find_spec("bokeh") is None:
        raise TransformError("--dask-dashboard needs bokeh, which Dask's dashboard is drawn with: pip install bokeh")
    cluster = LocalCluster(  # type: ignore[no-untyped-call]
        n_workers=workers or 2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=dashboard,
        silence_logs=logging.ERROR if quiet else logging.WARNING,  # the worker processes' (Dask's default: WARNING)
    )
    return Client(cluster), cluster  # type: ignore[no-untyped-call]


def run(
    root: str | Path,
    output: str | Path,
    options: TransformOptions,
    *,
    address: str | None = None,
    workers: int | None = None,
    dashboard: str | None = None,
) -> TransformSummary:
    """Transform every input file under ``root`` into ``output`` on a Dask cluster (see the module's text); a
    LocalCluster of the job's own serves its dashboard at ``dashboard`` (``HOST:PORT``) only if given."""
    try:
        from distributed import as_completed
    except ImportError:
        raise TransformError(f"--engine dask needs dask.distributed: {EXTRA}") from None
    started = time.monotonic()
    files, options, tasks = prepare(str(root), str(output), options)
    if not tasks:  # nothing left to do (--resume): no cluster, no model
        return finish(str(output), files, tasks, {})
    results: dict[Task, TransformSummary] = {}
    client, cluster = _client(address, workers, dashboard, options.quiet)
    try:
        futures = {
            client.submit(
                run_task, str(root), str(output), task, options, pure=False, key=f"{task.name}-{task.part}"
            ): task
            for task in tasks
        }
        for future in as_completed(futures):  # type: ignore[no-untyped-call]
            task = futures[future]
            try:
                part: TransformSummary = future.result()
            except Exception as exc:  # the task itself failed: a worker died, or the model could not load
                part = TransformSummary(failed=[(task.name, f"{task.name}: {type(exc).__name__}: {exc}")])
            results[task] = part
            if part.failed and options.fail_fast:
                for other in futures:
                    other.cancel()
                break
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    summary = finish(str(output), files, tasks, results)
    summary.seconds = time.monotonic() - started
    return summary


def map_partitions(
    frame: Any,
    meta: Any,
    *,
    content_type: str = "text/csv",
    accept: str | None = None,
    batch_strategy: str = "MultiRecord",
    max_payload_in_mb: int = 6,
    model_dir: str | None = None,
    endpoint: str | None = None,
) -> Any:
    """The predictions for the rows of a Dask DataFrame, as a Dask DataFrame of the same partitions and index: for
    people already on Dask, the transform of each partition is a step of their own graph.

    Each partition is written as records of ``content_type`` (``text/csv`` without header, or
    ``application/jsonlines``), packed into requests as a transform job packs lines (``batch_strategy``,
    ``max_payload_in_mb``) and run through the installed hooks, the model loaded once per Dask worker (or sent to
    ``endpoint``); the answers, in ``accept`` (default: ``content_type``) with one line per row, are read back with
    the columns and dtypes of ``meta`` (as Dask's ``meta``: the answer's shape is not guessed by calling the model)::

        import dask.dataframe as dd
        from inference_server.transform.dask import map_partitions

        features = dd.read_parquet("s3://bucket/features/")
        scores = map_partitions(features, meta={"score": "f8"})
        scores.to_parquet("s3://bucket/scores/")
    """
    try:
        from dask.dataframe.utils import make_meta  # type: ignore[attr-defined]
    except ImportError:
        raise TransformError(f"map_partitions needs dask.dataframe: {EXTRA}") from None
    options = TransformOptions(
        content_type=content_type,
        accept=accept or content_type,
        split_type="Line",
        batch_strategy=BatchStrategy.parse(batch_strategy),
        max_payload_in_mb=max_payload_in_mb,
        max_concurrent_transforms=1,
        model_dir=model_dir,
        endpoint=endpoint,
    )
    for media_type in (options.content_type, options.accept):
        if media_type not in _TABLES:
            raise TransformError(f"map_partitions reads and writes {' or '.join(_TABLES)}, not {media_type}")
    empty = make_meta(meta)  # type: ignore[no-untyped-call]
    return frame.map_partitions(predict_partition, options, empty, meta=empty)


#: The media types a partition is written in, and answers read from.
_TABLES = ("text/csv", "application/jsonlines")


def predict_partition(partition: Any, options: TransformOptions, meta: Any) -> Any:
    """The predictions for one pandas DataFrame, with its index and ``meta``'s columns and dtypes (see
    :func:`map_partitions`)."""
    import io

    import pandas

    if not len(partition):
        return meta
    if options.content_type == "text/csv":
        text = partition.to_csv(header=False, index=False).encode()
    else:
        text = partition.to_json(orient="records", lines=True).encode()
    strategy = options.batch_strategy
    assert strategy is not None
    answers = kept_predictor(options).predict_records(
        text.splitlines(),
        options.content_type,
        options.accept,
        batch_strategy=strategy.value,
        max_payload_in_mb=options.max_payload_in_mb or 0,
    )
    body = io.BytesIO(b"".join(answer if answer.endswith(b"\n") else answer + b"\n" for answer in answers if answer))
    if options.accept == "text/csv":
        answer = pandas.read_csv(body, header=None, names=list(meta.columns))
    else:
        answer = pandas.read_json(body, lines=True)
    if len(answer) != len(partition):
        raise TransformError(f"the model answered {len(answer)} rows for a partition of {len(partition)}")
    answer.index = partition.index
    return answer[list(meta.columns)].astype(meta.dtypes.to_dict())
