"""The serving process's side of a graceful stop on SIGTERM, shared by both backends.

The first SIGTERM sets the drain flag that every worker reads (:mod:`._state`); the backend's supervisor then asks
:meth:`Drain.finished` every :data:`POLL` seconds until no worker has a request in flight or the grace period is
over, and stops as usual. A second SIGTERM, or SIGINT, is :meth:`Drain.force_exit`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from typing import NoReturn

from inference_server import _logging
from inference_server._settings import Settings
from inference_server.server import _state

logger = logging.getLogger("inference_server")

#: How often the serving process checks whether a drain has finished or a new worker is ready.
POLL = 0.05
#: Seconds to wait for killed workers to exit before exiting anyway.
REAP_WAIT = 2.0


class Drain:
    """One server's graceful stop: the shared state with its workers, and the grace period once started."""

    def __init__(self, settings: Settings) -> None:
        self.supervisor = _state.Supervisor()
        self.grace = settings.graceful_timeout
        #: ``time.monotonic()`` at which the grace period ends; None until SIGTERM.
        self.deadline: float | None = None
        self.timed_out = False

    def start(self) -> None:
        """SIGTERM: tell the workers to refuse new work, and start the grace period."""
        logger.info("SIGTERM: draining; requests in flight get up to %s s to finish", self.grace)
        self.deadline = time.monotonic() + self.grace
        self.supervisor.start_drain()

    def finished(self, pids: list[int]) -> bool:
        """True when the workers ``pids`` have no request in flight, or the grace period is over."""
        busy = self.supervisor.in_flight(pids)
        if not busy:
            logger.info("Drained: no request in flight")
            return True
        if self.deadline is not None and time.monotonic() >= self.deadline:
            logger.error("Grace period of %s s over with %d request(s) in flight; stopping anyway", self.grace, busy)
            self.timed_out = True
            return True
        return False

    def force_exit(self, signum: int, pids: list[int]) -> NoReturn:
        """Kill the workers ``pids`` and exit at once with 128 + ``signum``; the workers' deaths are not errors, so
        nothing is logged after the one line that says so (the backend would report them as unexpected exits)."""
        level = logging.INFO if signum == signal.SIGINT else logging.WARNING  # Ctrl-C is how one stops a server
        logger.log(level, "%s: stopping at once", signal.Signals(signum).name)
        _logging.flush()
        logging.disable(logging.CRITICAL)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        _reap(pids, time.monotonic() + REAP_WAIT)  # gone when we exit, not shortly after
        self.supervisor.close()
        os._exit(128 + signum)


def _reap(pids: list[int], deadline: float) -> None:
    """Wait until the killed children ``pids`` have exited (and reap them), or ``deadline`` passes."""
    waiting = set(pids)
    while waiting and time.monotonic() < deadline:
        for pid in list(waiting):
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    waiting.discard(pid)
            except ChildProcessError:  # not ours, or reaped already
                waiting.discard(pid)
        if waiting:
            time.sleep(0.01)
