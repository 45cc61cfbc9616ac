"""Deadlines for a request's work, served on the HTTP server's own thread while one watchdog thread per process
keeps the time.

A hook stuck in ``time.sleep`` or in native code cannot be interrupted on the thread that runs it, and interrupting
it from outside (``PyThreadState_SetAsyncExc``) can leave a model half-updated and slows every thread while its
target sits in native code. So work is never interrupted: the :class:`Watchdog` marks a call that overran its
deadline answered (:meth:`Call.cancel`), and work on the server's thread stops itself at its next stage, raising
:class:`Cancelled` (the request is answered 504, or 408 for a body that did not arrive in time, whose read the
watchdog aborts). Work still running ``grace`` seconds after its deadline is reported stuck, and its worker process
is replaced.

The hooks of a model not known to be quick run on a :class:`Pool` helper (a model thread), which keeps the model
slot (:meth:`Call.hand_over`) until they return, while the server's thread waits until the deadline and answers 504
at it. A quick model's calls (:class:`Pace`) run inline instead: a hand-off costs two thread switches, about half of
a small request's throughput; the price is that such a call, should it hang, is answered when it returns.

Helpers also run what must be answered at its deadline whatever the work does: ``ping_fn`` (``/ping`` answers within
2 s) and the chunks of a stream under ``--stream-timeout``. Helpers are kept and reused; one that overran is
abandoned and rejoins the pool when its work ends. The work runs in a copy of the caller's ``contextvars`` context,
so the request's context variables reach the hooks and nothing the work sets stays on the reused thread.
"""

from __future__ import annotations

import _thread
import contextvars
import functools
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

logger = logging.getLogger("inference_server")

_T = TypeVar("_T")

#: The stages of a call, in order; a timeout says which one overran.
READING, WAITING, RUNNING = "reading the request body", "waiting for the model", "running the hooks"

#: A sync invocation this quick (seconds, handed to a model thread) counts towards running the model's calls inline
#: (on the thread or loop that serves the request): :data:`QUICK_STREAK` such calls in a row.
QUICK = 0.001
QUICK_STREAK = 32
#: An inline call slower than this (seconds) on an event loop sends the model's calls back to the model threads (it
#: held the loop, and every request on it, that long).
SLOW = 0.005
#: Both on a thread of the server's own (granian's WSGI interface), where an inline call holds up no other request
#: and the hand-off serves only the deadline: a call under this counts as quick, one over it sends the calls back.
#: A hand-off costs about 30 us, nothing beside such a call; and a wall time stretched by a loaded machine (the thread
#: descheduled meanwhile) does not send a quick model's calls back.
ON_THREAD = 0.1


#: The model slots of a worker: a ``threading.Lock`` for one (C-level: a tenth of a ``BoundedSemaphore``'s cost per
#: request), else a ``threading.BoundedSemaphore``; both raise when released more often than acquired.
Slots = threading.Semaphore | _thread.LockType


def model_slots(count: int) -> Slots:
    """``count`` model slots."""
    return threading.Lock() if count == 1 else threading.BoundedSemaphore(count)


class Pace:
    """How quick one model's sync invocations are: whether they run inline, where a hand-off to a model thread and
    back would cost more than the call (see :data:`QUICK`)."""

    __slots__ = ("inline", "quick", "slow", "streak")

    def __init__(self, quick: float = QUICK, slow: float = SLOW) -> None:
        self.inline = False
        self.streak = 0  # quick calls in a row on the model threads
        #: A call on a model thread quicker than this (seconds) counts towards running the calls inline.
        self.quick = quick
        #: An inline call slower than this (seconds) sends the calls back to the model threads.
        self.slow = slow

    def timed(self, function: Callable[[], _T]) -> _T:
        """On a model thread: ``function()``, counted quick or not."""
        began = time.perf_counter()
        try:
            return function()
        finally:
            if time.perf_counter() - began < self.quick:
                self.streak += 1
                if self.streak >= QUICK_STREAK:
                    self.inline = True
            else:
                self.streak = 0

    def inline_call(self, function: Callable[[], _T]) -> _T:
        """``function()`` inline; one slower than :attr:`slow` sends the model's next calls back to the threads."""
        began = time.perf_counter()
        try:
            return function()
        finally:
            self.ended_inline(began)

    def ended_inline(self, began: float) -> None:
        """An inline call that began at ``began`` (``time.perf_counter()``) ended: one slower than :attr:`slow`
        sends the model's next calls back to the threads."""
        if time.perf_counter() - began > self.slow:
            self.inline, self.streak = False, 0


class Paces(dict[int, Pace]):
    """The :class:`Pace` of each model, by the model object's identity (``get(id(model))``, a lookup, on the hot
    path), forgotten in bulk past 10,000 (models come and go on a multi-model endpoint)."""

    __slots__ = ("_quick", "_slow")

    def __init__(self, quick: float = QUICK, slow: float = SLOW) -> None:
        super().__init__()
        self._quick, self._slow = quick, slow

    def of(self, model: Any) -> Pace:
        """``model``'s pace, made on first use."""
        pace = self.get(id(model))
        if pace is None:
            if len(self) >= 10_000:
                self.clear()
            pace = self[id(model)] = Pace(self._quick, self._slow)
        return pace


class Cancelled(BaseException):
    """Raised in a helper thread, at its next stage, when its request was already answered (408 or 504)."""


class Call:
    """One request's work in progress, shared by the thread that runs it and the :class:`Watchdog`.

    ``read_deadline`` and ``deadline`` are ``time.monotonic()`` values (``inf``: none): past the first while the body
    is still being read, ``abort(context)`` is called (it ends the read); past the second the call is cancelled, and
    ``stuck(context)`` is called if the work is still running ``grace`` seconds later."""

    __slots__ = ("_lock", "_slot", "abort", "after_wait", "cancelled", "context", "deadline", "overran",
                 "read_deadline", "stage", "stuck", "stuck_at")  # fmt: skip

    def __init__(
        self,
        read_deadline: float = math.inf,
        deadline: float = math.inf,
        abort: Callable[[Any], object] | None = None,
        stuck: Callable[[Any], object] | None = None,
        context: Any = None,
    ) -> None:
        self.stage = READING
        self.cancelled = False
        #: The stage the call was in when it was cancelled.
        self.overran = READING
        self.read_deadline, self.deadline = read_deadline, deadline
        self.abort, self.stuck, self.context = abort, stuck, context
        self.stuck_at = math.inf
        #: The deadline and stuck callback from the moment the hooks run, when they differ from the wait's (a
        #: client's deadline bounds the wait; once the model runs, only the server's timeout does).
        self.after_wait: tuple[float, Callable[[Any], object] | None] | None = None
        self._slot: Slots | None = None
        self._lock = threading.Lock()

    def enter(self, stage: str) -> None:
        """Move on to ``stage``; stop here (raise :class:`Cancelled`) when the request was answered already."""
        if self.cancelled:
            raise Cancelled
        self.stage = stage

    def take_slot(self, slots: Slots) -> None:
        """Wait for a model slot (until the deadline), then run the hooks (stage RUNNING); :meth:`give_back` returns
        the slot."""
        if self.cancelled:
            raise Cancelled
        self.stage = WAITING
        if slots.acquire(False):
            pass  # (a free slot: no timed wait, the common case)
        elif self.deadline == math.inf:
            slots.acquire()
        elif not slots.acquire(timeout=max(0.0, self.deadline - time.monotonic())):
            self.cancel()
            raise Cancelled
        lock = self._lock  # (acquired and released by hand: a with block costs more on every request)
        lock.acquire()
        if self.cancelled:
            lock.release()
            slots.release()
            raise Cancelled
        self._slot = slots
        self.run()
        lock.release()

    def run(self) -> None:
        """The hooks run from now on (stage RUNNING), under :attr:`after_wait`'s deadline if there is one."""
        after_wait = self.after_wait
        if after_wait is not None:
            self.deadline, self.stuck = after_wait
        self.stage = RUNNING

    def hand_over(self) -> Slots:
        """The model slot, taken (:meth:`take_slot`), now the caller's to give back: work that runs on past the
        call's 504 keeps it until it ends. :class:`Cancelled` if the call was answered meanwhile (its slot given
        back by :meth:`cancel`)."""
        with self._lock:
            slot = self._slot
            if self.cancelled or slot is None:
                raise Cancelled
            self._slot = None
        return slot

    def give_back(self) -> None:
        """Give back the model slot if this call still holds it (idempotent; either thread may call it)."""
        lock = self._lock
        lock.acquire()
        slot = self._slot
        self._slot = None
        lock.release()
        if slot is not None:
            slot.release()

    def read(self) -> bool:
        """The body is read: move on to WAITING, unless the call was cancelled meanwhile (False: the watchdog ended
        the read, or is about to, and the request is answered 408). One step under the lock, which the watchdog's
        end of a read takes too."""
        with self._lock:
            if self.cancelled:
                return False
            self.stage = WAITING
            return True

    def _cancel_reading(self) -> bool:
        """Cancel the call if its body is still being read (True: end the read)."""
        with self._lock:
            if self.cancelled or self.stage != READING:
                return False
            self.cancelled = True
            self.overran = READING
        self.give_back()
        return True

    def cancel(self) -> str:
        """Mark the call answered, give back its slot (the overrunning work goes on without it); return its stage."""
        with self._lock:
            if not self.cancelled:
                self.cancelled = True
                self.overran = self.stage
            stage = self.overran
        self.give_back()
        return stage

    def check(self, now: float, grace: float) -> None:
        """What the watchdog does for this call at ``now``."""
        if self.cancelled:
            if now >= self.stuck_at:
                self.stuck_at = math.inf
                if self.stuck is not None:
                    self.stuck(self.context)
        elif self.stage == READING and now >= self.read_deadline:
            if self._cancel_reading() and self.abort is not None:
                self.abort(self.context)
        elif now >= self.deadline and self.cancel() == RUNNING:
            self.stuck_at = now + grace


class Watchdog:
    """One thread per process that checks the calls it watches every ``period`` seconds (see :meth:`Call.check`);
    started with the first call. Watching and unwatching are a set's add and discard: no lock, no thread switch."""

    def __init__(self, grace: float, period: float = 0.05) -> None:
        self.grace = grace
        self.period = period
        self._calls: set[Call] = set()
        self._started = False
        self._lock = threading.Lock()

    def watch(self, call: Call) -> None:
        self._calls.add(call)
        if not self._started:
            with self._lock:
                if not self._started:
                    threading.Thread(target=self._loop, name="watchdog", daemon=True).start()
                    self._started = True

    def unwatch(self, call: Call) -> None:
        self._calls.discard(call)

    def _loop(self) -> None:
        while True:
            time.sleep(self.period)
            now = time.monotonic()
            for call in list(self._calls):  # (a copy made in one step: the set may change meanwhile)
                try:
                    call.check(now, self.grace)
                except Exception:  # an abort or stuck callback failed: the watchdog must go on
                    logger.exception("Watchdog: checking a request's deadline failed")


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
        #: Work started by :meth:`Pool.spawn`: nobody waits for it.
        self.detached = False
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
            if not (self.abandoned or self.detached):
                self.done.release()
                return
            if self.abandoned:
                self.pool.overrunning -= 1
            self.abandoned = self.detached = False  # nobody waits for this result: clean up and serve again
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

    def spawn(self, work: Callable[[], Any]) -> None:
        """Start ``work`` on a helper thread, in a copy of this thread's context, and return: nobody waits for it
        (what it raises is dropped), and the helper rejoins the pool when it ends."""
        helper = self._take()
        helper.detached = True
        helper.start(functools.partial(contextvars.copy_context().run, work))

    def run(
        self, work: Callable[[], Any], deadline: Callable[[], float], context: contextvars.Context | None = None
    ) -> Any:
        """Run ``work`` on a helper thread, in ``context`` (else a copy of this thread's); return its result or raise
        its exception.

        ``deadline()`` gives the ``time.monotonic()`` by which the work must end; it is asked again whenever the
        wait ends, so it may move (a read deadline first, then the request's). Past it, :class:`TimedOut` is raised
        and the helper is abandoned: it rejoins the pool when its work ends.
        """
        helper = self._take()
        helper.start(functools.partial((context or contextvars.copy_context()).run, work))
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
