"""Deadlines for a request's work: it runs on a helper thread, so that the request can be answered when it overruns.

A hook stuck in ``time.sleep`` or in native code cannot be interrupted on the thread that runs it, so the thread the
HTTP server gave the request waits for the work with a deadline and answers 408 or 504 itself. Helper threads are
kept and reused; one that overran is abandoned and rejoins the pool when its work ends. Work is never interrupted
from outside (``PyThreadState_SetAsyncExc`` can leave a model half-updated, and slows every thread while its target
sits in native code): a call that was answered stops itself at its next stage, and work that does not end is
contained by replacing the worker process. The work runs in a copy of the caller's ``contextvars`` context, so the
request's context variables reach the hooks and nothing the work sets stays on the reused thread.
"""

from __future__ import annotations

import contextvars
import functools
import threading
import time
from collections.abc import Callable
from typing import Any

#: The stages of a call, in order; a timeout says which one overran.
READING, WAITING, RUNNING = "reading the request body", "waiting for the model", "running the hooks"


class Cancelled(BaseException):
    """Raised in a helper thread, at its next stage, when its request was already answered (408 or 504)."""


class Call:
    """One request's work in progress, shared by the waiting request thread and the helper thread."""

    __slots__ = ("_lock", "_slot", "cancelled", "stage")

    def __init__(self) -> None:
        self.stage = READING
        self.cancelled = False
        self._slot: threading.Semaphore | None = None
        self._lock = threading.Lock()

    def enter(self, stage: str) -> None:
        """Move on to ``stage``; stop here (raise :class:`Cancelled`) when the request was answered already."""
        if self.cancelled:
            raise Cancelled
        self.stage = stage

    def take_slot(self, slots: threading.Semaphore) -> None:
        """Wait for a model slot, then run the hooks (stage RUNNING); :meth:`give_back` returns the slot."""
        self.enter(WAITING)
        slots.acquire()
        with self._lock:
            if self.cancelled:
                slots.release()
                raise Cancelled
            self._slot = slots
            self.stage = RUNNING

    def give_back(self) -> None:
        """Give back the model slot if this call still holds it (idempotent; either thread may call it)."""
        with self._lock:
            slot, self._slot = self._slot, None
        if slot is not None:
            slot.release()

    def cancel(self) -> str:
        """Mark the call answered, give back its slot (the overrunning work goes on without it); return its stage."""
        with self._lock:
            self.cancelled = True
            stage = self.stage
        self.give_back()
        return stage


class TimedOut(Exception):
    """The work overran its deadline; ``helper`` still runs it."""

    def __init__(self, helper: _Helper) -> None:
        super().__init__("the work overran its deadline")
        self.helper = helper


class _Helper:
    """One daemon thread running one piece of work at a time."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.work: Callable[[], Any] | None = None
        self.result: Any = None
        self.error: BaseException | None = None
        self.abandoned = False
        self._go = threading.Lock()
        self._go.acquire()
        self.done = threading.Lock()
        self.done.acquire()
        self.thread = threading.Thread(target=self._loop, name=f"{pool.name}-{pool.size}", daemon=True)
        self.thread.start()

    def start(self, work: Callable[[], Any]) -> None:
        self.work = work
        self._go.release()

    def _loop(self) -> None:
        while True:
            self._go.acquire()
            try:
                self.result = self.work() if self.work is not None else None
            except BaseException as exc:  # Cancelled included: the waiting thread re-raises what it cares about
                self.error = exc
            self._finish()

    def _finish(self) -> None:
        with self.pool.lock:
            if not self.abandoned:
                self.done.release()
                return
            self.abandoned = False  # nobody waits for this result: clean up and serve again
            self.pool.overrunning -= 1
            self.work = self.result = self.error = None
            self.pool.idle.append(self)


class Pool:
    """Helper threads, created as needed and reused."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.Lock()
        self.idle: list[_Helper] = []
        self.size = 0
        #: Helpers still running work whose deadline passed.
        self.overrunning = 0

    def _take(self) -> _Helper:
        with self.lock:
            if self.idle:
                return self.idle.pop()
            self.size += 1
        return _Helper(self)

    def run(self, work: Callable[[], Any], deadline: Callable[[], float]) -> Any:
        """Run ``work`` on a helper thread; return its result or raise its exception.

        ``deadline()`` gives the ``time.monotonic()`` by which the work must end; it is asked again whenever the
        wait ends, so it may move (a read deadline first, then the request's). Past it, :class:`TimedOut` is raised
        and the helper is abandoned: it rejoins the pool when its work ends.
        """
        helper = self._take()
        helper.start(functools.partial(contextvars.copy_context().run, work))
        while not helper.done.acquire(timeout=max(0.0, deadline() - time.monotonic())):
            if deadline() > time.monotonic():
                continue  # the deadline moved on while we waited
            with self.lock:
                if not helper.done.acquire(blocking=False):  # still running: abandon it
                    helper.abandoned = True
                    self.overrunning += 1
                    raise TimedOut(helper)
            break
        result, error = helper.result, helper.error
        helper.work = helper.result = helper.error = None
        with self.lock:
            self.idle.append(helper)
        if error is not None:
            raise error
        return result
