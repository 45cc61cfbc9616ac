"""What the serving process and its workers share: the drain flag, each worker's requests in flight, recycling.

``serve`` makes a private run directory and names it in ``INFERENCE_SERVER_RUN_DIR`` before the workers start. It
holds ``control``, whose first byte says "draining" (bytes 8 to 15: since when), and one 8-byte file per worker,
``worker-PID``, counting that worker's requests in flight. Both are memory-mapped: a request reads the flag and
updates its count without a system call. A worker that must be replaced (too many requests served, work stuck past
its timeout) asks for it through ``recycle`` (set by the server backend).

A SIGTERM reaches a worker from the serving process (stopping it, after writing ``stop-PID``), from the worker
itself (recycling) or from outside: systemd, ``timeout`` and some init systems signal the whole process group. Only
the first two stop it; from outside, the serving process got the same signal and drains, and the worker takes part
in that drain instead of dying (:meth:`Worker.stop_requested`). A worker also exits when the serving process is gone.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import signal
import struct
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from inference_server import _logging, _registry, _rundir, metrics
from inference_server._rundir import RUN_DIR_ENV, SERVING_PID_ENV, map_file

logger = logging.getLogger("inference_server")

__all__ = ["RUN_DIR_ENV", "SERVING_PID_ENV", "Supervisor", "Worker"]
#: Seconds between a worker's checks that the serving process is still its parent.
PARENT_POLL = 0.5
#: Seconds after the serving process asked a worker to stop before the worker's SIGTERM is sent again.
STOP_AGAIN = 2.0
_COUNT = struct.Struct("<q")
#: The control file: the drain flag in byte 0, when the drain started (a double) in bytes 8 to 15.
_SINCE = struct.Struct("<d")
_CONTROL_SIZE = 16


class Supervisor:
    """The serving process's side: start draining, count the workers' requests in flight, hear recycle requests."""

    def __init__(self) -> None:
        #: The run directory ``serve`` made at start-up, else a new one.
        self.path = _rundir.own() or _rundir.create()
        (self.path / "control").write_bytes(bytes(_CONTROL_SIZE))
        self._control = map_file(self.path / "control", write=True)

    @property
    def draining(self) -> bool:
        """True once :meth:`start_drain` was called."""
        return self._control[0] == 1

    def start_drain(self) -> None:
        """Tell every worker to answer ``/ping`` and new invocations with 503 from now on."""
        _SINCE.pack_into(self._control, 8, time.monotonic())
        self._control[0] = 1

    def in_flight(self, pids: Iterable[int]) -> int:
        """Requests the workers ``pids`` are handling now (a worker not yet serving counts none)."""
        total = 0
        for pid in pids:
            with contextlib.suppress(OSError, struct.error):
                total += _COUNT.unpack((self.path / f"worker-{pid}").read_bytes())[0]
        return total

    def ready(self, pid: int) -> bool:
        """True once worker ``pid`` has loaded the model and serves."""
        return (self.path / f"ready-{pid}").exists()

    def mark_stop(self, pid: int) -> None:
        """Say that the SIGTERM worker ``pid`` is about to get comes from us: it stops, instead of ignoring it."""
        with contextlib.suppress(OSError):
            (self.path / f"stop-{pid}").touch()

    def recycle_requests(self, pids: Iterable[int]) -> list[int]:
        """Those of the workers ``pids`` that asked to be replaced since the last call (others' requests wait)."""
        asked = []
        for pid in pids:
            with contextlib.suppress(OSError):
                (self.path / f"recycle-{pid}").unlink()
                asked.append(pid)
        return asked

    def gone(self, pid: int, replaced: bool) -> None:
        """Worker ``pid`` exited: its live metrics leave the scrape; ``replaced`` (not stopped with the server): count
        the restart, by the reason the worker left (:meth:`Worker.note_exit`), else as a crash."""
        note = self.path / f"exit-{pid}"
        try:
            reason = note.read_text().strip() or "crash"
            note.unlink()
        except OSError:
            reason = "crash"
        if (self.path / "models").is_dir():  # a multi-model endpoint: what it paid for its models leaves the listing
            _registry.Registry(self.path / "models").forget_worker(pid)
        try:
            metrics.process_dead(pid)
            if replaced:
                metrics.worker_restarted(reason)
        except Exception:  # the metrics never stop the server from replacing its workers
            logger.warning("Metrics: could not account for worker %d's exit", pid, exc_info=True)

    def close(self) -> None:
        """Remove the run directory (again: nothing happens)."""
        if self._control.closed:
            return
        self._control.close()
        _rundir.remove(self.path)


class Worker:
    """A worker process's side: the drain flag, its own requests in flight, and asking to be replaced."""

    def __init__(self, path: Path, recycle: Callable[[str], None], max_requests: int = 0, jitter: int = 0) -> None:
        self._path = path
        self._control = map_file(path / "control", write=False)
        own = path / f"worker-{os.getpid()}"
        own.write_bytes(bytes(_COUNT.size))
        self._count = map_file(own, write=True)
        self._lock = threading.Lock()
        self._in_flight = 0
        self._served = 0
        #: Ask to be replaced after this many requests (0: never); the jitter spreads workers' restarts apart.
        self.max_requests = max_requests + random.randint(0, jitter) if max_requests else 0
        self._recycle = recycle
        self.recycling = False
        self._ready = path / f"ready-{os.getpid()}"
        self._stop = path / f"stop-{os.getpid()}"
        # the serving process as it named itself: os.getppid() here would be init's pid if it died before now
        self._parent = int(os.environ.get(SERVING_PID_ENV) or os.getppid())
        if self._parent != os.getpid():  # a worker in the serving process itself (tests) has no parent to watch
            threading.Thread(target=self._watch_parent, name="parent-watch", daemon=True).start()

    @classmethod
    def attach(cls, recycle: Callable[[str], None], max_requests: int = 0, jitter: int = 0) -> Worker | None:
        """The worker state of this process when ``serve`` runs it, else None (the app in another server)."""
        path = os.environ.get(RUN_DIR_ENV)
        if not path or not os.path.isdir(path):
            return None
        return cls(Path(path), recycle, max_requests, jitter)

    def _watch_parent(self) -> None:
        """Exit within a second of the serving process's death, however it died (kill -9 included); and once the
        serving process has asked this worker to stop, send the worker's SIGTERM again after :data:`STOP_AGAIN`
        seconds, once: one that came while the worker's handlers were being replaced (granian's, as it starts
        serving) can be lost, and the worker would then wait out the graceful timeout (a second one is harmless:
        each handler only begins the stop it has begun)."""
        asked: float | None = None
        while os.getppid() == self._parent:
            time.sleep(PARENT_POLL)
            if asked is None and self._stop.exists():
                asked = time.monotonic()
            elif asked is not None and time.monotonic() - asked >= STOP_AGAIN:
                asked = math.inf
                logger.info("Worker %d: still running %.0f s after it was asked to stop: SIGTERM again",
                            os.getpid(), STOP_AGAIN)  # fmt: skip
                os.kill(os.getpid(), signal.SIGTERM)
        logger.error("Worker %d: the serving process %d is gone; exiting", os.getpid(), self._parent)
        _logging.flush()
        os._exit(1)

    def stop_requested(self) -> bool:
        """Whether a SIGTERM reaching this worker now was sent by the serving process, or by the worker itself."""
        return self.recycling or self._stop.exists()

    def mark_ready(self) -> None:
        """Tell the serving process that this worker has loaded the model."""
        self._ready.touch()

    @property
    def draining(self) -> bool:
        """True once the server was asked to stop: new work is refused while work in flight finishes."""
        return self._control[0] == 1

    @property
    def draining_since(self) -> float:
        """When the drain started (``time.monotonic()``, the same clock in every process); only while draining."""
        return _SINCE.unpack_from(self._control, 8)[0]  # type: ignore[no-any-return]

    def enter(self) -> None:
        """A request started."""
        lock = self._lock  # (acquired and released by hand: twice per request, a with block costs more)
        lock.acquire()
        self._in_flight += 1
        _COUNT.pack_into(self._count, 0, self._in_flight)
        lock.release()

    def leave(self) -> None:
        """A request ended (answered); may ask for this worker to be replaced after ``max_requests``."""
        lock = self._lock
        lock.acquire()
        self._in_flight -= 1
        _COUNT.pack_into(self._count, 0, self._in_flight)
        self._served += 1
        served = self._served
        lock.release()
        if self.max_requests and served >= self.max_requests:
            self.request_recycle(f"it has served {served} requests (--max-requests)", "max-requests")

    def note_exit(self, kind: str) -> None:
        """Say why this worker is about to exit (``max-requests``, ``stuck``), for the serving process's metrics."""
        with contextlib.suppress(OSError):
            (self._path / f"exit-{os.getpid()}").write_text(kind)

    def request_recycle(self, reason: str, kind: str = "stuck") -> None:
        """Ask (once) for this worker to be replaced: it finishes its requests in flight, a new one takes over.
        ``kind`` is the reason's name in the metrics: ``stuck`` or ``max-requests``."""
        if self.recycling:
            return
        self.recycling = True
        self.note_exit(kind)
        logger.warning("Worker %d asks to be replaced: %s", os.getpid(), reason)
        self._recycle(reason)


def recycle_by_supervisor(reason: str) -> None:
    """Ask the serving process (our parent) to replace this worker: leave a note, then signal it (SIGUSR1)."""
    path = Path(os.environ[RUN_DIR_ENV]) / f"recycle-{os.getpid()}"
    path.write_text(reason)
    os.kill(os.getppid(), signal.SIGUSR1)


def recycle_self(reason: str) -> None:
    """Stop this worker gracefully (SIGTERM to itself); the serving process starts a new one."""
    os.kill(os.getpid(), signal.SIGTERM)
