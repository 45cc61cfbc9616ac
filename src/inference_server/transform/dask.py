"""The Dask engine: a transform job on a ``dask.distributed`` cluster, each input file one task.

``--engine dask`` runs on the cluster at ``--engine-address`` (``tcp://...``), else on a ``LocalCluster`` of
``--workers`` processes on this machine. Each Dask worker process loads the model once, through the installed hooks,
and keeps it for every task it runs; within a task the file is transformed exactly as the local engine does it (the
same splitting, packing, ``MaxConcurrentTransforms`` requests at once, outputs renamed into place), so the outputs
are byte for byte the local engine's. Inputs and outputs must be reachable from the workers: the same machine, a
shared file system, or an object store (``s3://``).

Needs the extra: ``pip install 'inference-server[dask]'``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from inference_server.errors import TransformError
from inference_server.transform import TransformOptions, TransformSummary, local, storage

EXTRA = "pip install 'inference-server[dask]'"


def _client(address: str | None, workers: int | None) -> Any:
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise TransformError(f"--engine dask needs dask.distributed: {EXTRA}") from None
    if address:
        return Client(address), None  # type: ignore[no-untyped-call]
    cluster = LocalCluster(  # type: ignore[no-untyped-call]
        n_workers=workers or 2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
    )
    return Client(cluster), cluster  # type: ignore[no-untyped-call]


def run(
    root: str | Path,
    output: str | Path,
    options: TransformOptions,
    *,
    address: str | None = None,
    workers: int | None = None,
) -> TransformSummary:
    """Transform every input file under ``root`` into ``output`` on a Dask cluster (see the module's text)."""
    try:
        from distributed import as_completed
    except ImportError:
        raise TransformError(f"--engine dask needs dask.distributed: {EXTRA}") from None
    source = storage.store(str(root))
    files = source.inputs()
    options = local.resolved_elsewhere(options)
    started = time.monotonic()
    summary = TransformSummary(files=len(files))
    client, cluster = _client(address, workers)
    try:
        futures = [
            client.submit(
                local.transform_file, str(root), str(output), path, name, options, pure=False, key=f"file-{name}"
            )
            for path, name in files
        ]
        names = dict(zip((future.key for future in futures), (name for _, name in files), strict=True))
        finished: set[str] = set()
        for future in as_completed(futures):  # type: ignore[no-untyped-call]
            name = names[future.key]
            finished.add(name)
            try:
                part: TransformSummary = future.result()
            except Exception as exc:  # the task itself failed: a worker died, or the model could not load
                part = TransformSummary(failed=[(name, f"{name}: {type(exc).__name__}: {exc}")])
            summary.add(part)
            if part.failed and options.fail_fast:
                for other in futures:
                    other.cancel()
                stopped = "not started: another file failed (--fail-fast)"
                summary.failed += [(name, stopped) for _, name in files if name not in finished]
                break
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    summary.failed.sort()
    summary.seconds = time.monotonic() - started
    return summary
