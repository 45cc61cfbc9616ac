"""The serving process's private run directory: what it and its worker processes share through files.

``serve`` makes it (:func:`create`) before anything else, names it in ``INFERENCE_SERVER_RUN_DIR`` for the workers,
and removes it at exit (:func:`remove`). :mod:`inference_server.server._state` keeps the drain flag and each
worker's requests in flight there; :mod:`inference_server.metrics` keeps the Prometheus client's multiprocess files
in its ``metrics`` directory. A leaf: it imports nothing of ours.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
from pathlib import Path

RUN_DIR_ENV = "INFERENCE_SERVER_RUN_DIR"
#: The serving process's pid, for its workers: one that starts after the serving process died knows it at once.
SERVING_PID_ENV = "INFERENCE_SERVER_SERVING_PID"


def create() -> Path:
    """A new run directory, named in the environment that worker processes inherit."""
    path = Path(tempfile.mkdtemp(prefix="inference-server-"))
    os.environ[RUN_DIR_ENV] = str(path)
    os.environ[SERVING_PID_ENV] = str(os.getpid())
    return path


def current() -> Path | None:
    """The run directory of the server this process belongs to (its serving process or a worker), else None."""
    path = os.environ.get(RUN_DIR_ENV)
    return Path(path) if path and os.path.isdir(path) else None


def own() -> Path | None:
    """The run directory this process made (it is the serving process), else None."""
    path = current()
    return path if path is not None and os.environ.get(SERVING_PID_ENV) == str(os.getpid()) else None


def remove(path: Path) -> None:
    """Remove the run directory ``path`` and forget it, with every environment variable that points into it."""
    os.environ.pop(SERVING_PID_ENV, None)
    inside = str(path)
    for name, value in list(os.environ.items()):
        if value == inside or value.startswith(inside + os.sep):
            del os.environ[name]
    shutil.rmtree(path, ignore_errors=True)


def map_file(path: Path, *, write: bool) -> mmap.mmap:
    """The whole file, memory-mapped."""
    with open(path, "r+b" if write else "rb") as file:
        return mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_WRITE if write else mmap.ACCESS_READ)
