"""The worker's event loop, where ``async def`` hooks run: one asyncio loop per process, on a daemon thread of its own.

Under a WSGI front a request is a blocking call: its sync hooks run on the request's thread, and for an async one that
thread waits here for the result (:func:`run`); the loop is started by the first async hook call, never when no hook
is async, and again in a child after a fork (the parent's loop thread does not exist there). Under the event-loop
front (granian's RSGI interface) the server's own loop is adopted (:func:`adopt`): requests and async hooks share it,
and a sync caller on a model thread waits for an async hook there. A hook's coroutine runs in a copy of the caller's
``contextvars`` context, and what it sets there is set in the caller's afterwards, as for a sync hook.

An async generator becomes a sync iterator (:class:`Items`) whose items are each awaited on the loop; its
``close()`` runs the generator's ``aclose()`` there, so its ``finally`` runs (one dropped unclosed is closed by
asyncio's own finalizer, on the loop).

A hook that blocks the loop (an ``async def`` calling ``time.sleep``) is named in one WARNING per hook per process,
saying how long it held the loop: each step of its coroutine (from a resume to its next suspension) is timed with
two ``perf_counter`` reads (:class:`_Steps`). Chosen over a watchdog timer on the loop thread, which costs a wake-up
even when every hook is quick and could name the hook only by reading the loop thread's stack; and over asyncio's
debug mode (``slow_callback_duration``), which slows every callback and names the task's step, not the hook.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import os
import threading
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import asyncio

logger = logging.getLogger("inference_server")

_T = TypeVar("_T")

#: A step of a hook's coroutine longer than this (seconds) held the loop: its hook is named in a WARNING.
BLOCKING = 0.1
#: The loop thread's name.
THREAD_NAME = "inference-server-loop"


class _Running:
    """This process's loop and the ident of the thread that runs it (a daemon thread of ours, or the server's)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.pid = _pid
        self.ident: int | None
        if loop is not None:
            self.loop, self.ident = loop, threading.get_ident()
            return
        import asyncio  # only once a hook is async: a server of sync hooks never imports it for us

        self.loop = asyncio.new_event_loop()
        thread = threading.Thread(target=self.loop.run_forever, name=THREAD_NAME, daemon=True)
        thread.start()
        self.ident = thread.ident


_running: _Running | None = None
_lock = threading.Lock()
#: This process's id, kept current across forks (``os.getpid()`` is a system call, and :func:`on_loop` is asked on
#: every request of the event-loop fronts).
_pid = os.getpid()
#: The hooks already named for blocking the loop in this process.
_warned: set[str] = set()


def _forget() -> None:
    """In a child after a fork: no loop yet (the parent's thread is not here), no hook named, a lock nobody holds."""
    global _running, _lock, _pid
    _running, _lock, _pid = None, threading.Lock(), os.getpid()
    _warned.clear()


os.register_at_fork(after_in_child=_forget)


def running() -> asyncio.AbstractEventLoop | None:
    """This process's loop if it was started, else None."""
    current = _running
    return current.loop if current is not None and current.pid == _pid else None


def adopt(loop: asyncio.AbstractEventLoop) -> None:
    """Make ``loop``, running on this thread (an event-loop server's), this process's loop: async hooks run on it."""
    global _running
    with _lock:
        _running = _Running(loop)


def on_loop() -> bool:
    """Whether this thread runs this process's loop."""
    current = _running
    return current is not None and current.pid == _pid and current.ident == threading.get_ident()


def _started() -> _Running:
    global _running
    current = _running
    if current is None or current.pid != _pid:
        with _lock:
            current = _running
            if current is None or current.pid != _pid:
                _running = current = _Running()
    return current


def started() -> asyncio.AbstractEventLoop:
    """This process's loop, started now (on a daemon thread of its own) if it is not yet."""
    return _started().loop


def run(awaitable: Awaitable[_T], name: str) -> _T:
    """Run ``awaitable`` (hook ``name``'s) on the loop and wait for its result, on any thread but the loop's."""
    import asyncio

    current = _started()
    if threading.get_ident() == current.ident:
        close = getattr(awaitable, "close", None)
        if close is not None:
            close()  # never to be awaited
        raise RuntimeError(f"{name} was called from the event loop's own thread, where waiting for it would never end")
    future = asyncio.run_coroutine_threadsafe(_within(awaitable, name), current.loop)
    try:
        result, context = future.result()
    except BaseException:
        future.cancel()  # the caller gave up (its own exception): the hook is cancelled at its next await
        raise
    carry(context)  # what the hook set, the caller's next hooks see
    return result


_UNSET = object()


def carry(context: contextvars.Context) -> None:
    """Set here what differs in ``context`` (a copy of this context that code elsewhere ran in)."""
    for variable, value in context.items():
        if variable.get(_UNSET) is not value:
            variable.set(value)


async def _within(awaitable: Awaitable[_T], name: str) -> tuple[_T, contextvars.Context]:
    """``awaitable``'s result and the context it left (the task's copy of the caller's)."""
    return await _Steps(awaitable, name), contextvars.copy_context()


class _Steps:
    """``awaitable`` driven step by step, each step timed: one over :data:`BLOCKING` held the loop."""

    __slots__ = ("_awaitable", "_name")

    def __init__(self, awaitable: Awaitable[Any], name: str) -> None:
        self._awaitable, self._name = awaitable, name

    def __await__(self) -> Generator[Any, Any, Any]:
        steps: Any = self._awaitable.__await__()
        resume: Callable[[Any], Any] = steps.send
        message: Any = None
        while True:
            started = time.perf_counter()
            try:
                suspended = resume(message)
            except StopIteration as done:
                return done.value
            finally:
                held = time.perf_counter() - started
                if held >= BLOCKING:
                    _blocked(self._name, held)
            try:
                message, resume = (yield suspended), steps.send
            except GeneratorExit:
                steps.close()
                raise
            except BaseException as exc:  # the task's cancellation (or a thrown error) goes to the hook
                message, resume = exc, steps.throw


def _blocked(name: str, held: float) -> None:
    if name not in _warned:
        _warned.add(name)
        logger.warning(
            "%s held the event loop for %.2f s without awaiting (a blocking call in an async hook: await an "
            "asynchronous equivalent, or make the hook a plain def); said once per process",
            name,
            held,
        )


class Items(Iterator[Any]):
    """An async generator's items as a sync iterator: each awaited on the loop; ``close()`` runs its ``aclose()``
    there (its ``finally`` runs).

    On the loop itself nothing can wait: there the event-loop lifecycle awaits the next item first
    (:meth:`prefetch`), and ``next()`` hands it over; a ``next()`` on the loop with no item fetched (an
    ``output_fn`` taking several records of an async stream per chunk) is a :class:`RuntimeError` saying so."""

    __slots__ = ("_done", "_ended", "_generator", "_name", "_ready", "taken")

    def __init__(self, generator: AsyncGenerator[Any, None], name: str) -> None:
        self._generator, self._name = generator, name
        self._done = False
        self._ended = False  # the generator said it is finished (to a prefetch)
        self._ready: list[Any] = []
        #: Items handed out so far.
        self.taken = 0

    def __next__(self) -> Any:
        if self._ready:
            self.taken += 1
            return self._ready.pop()
        if self._done or self._ended:
            self._done = True
            raise StopIteration
        if on_loop():
            self._done = True
            raise RuntimeError(
                f"{self._name}: a record of the async generator was asked for on the event loop before it was "
                "fetched (an output_fn that takes several records per chunk of an async stream); make output_fn "
                "yield one chunk per record"
            )
        try:
            item = run(self._generator.__anext__(), self._name)
        except StopAsyncIteration:
            self._done = True
            raise StopIteration from None
        except BaseException:
            self._done = True  # a generator that raised is finished
            raise
        self.taken += 1
        return item

    async def prefetch(self) -> None:
        """On the loop: await the next item, for the next ``next()`` to hand over (nothing once finished)."""
        if self._ready or self._done or self._ended:
            return
        try:
            self._ready.append(await _Steps(self._generator.__anext__(), self._name))
        except StopAsyncIteration:
            self._ended = True
        except BaseException:
            self._done = True
            raise

    async def aclose(self) -> None:
        """On the loop: run the generator's ``aclose()``, unless it is finished."""
        if not self._done:
            self._done = True
            await self._generator.aclose()

    def close(self) -> None:
        """Run the generator's ``aclose()`` on the loop, unless it is finished (from the loop itself, as a task)."""
        if not self._done:
            self._done = True
            if on_loop():
                current = _running
                assert current is not None
                current.loop.create_task(self._generator.aclose())
            else:
                run(self._generator.aclose(), self._name)


def synchronous(function: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``function`` itself when it is synchronous (nothing added); for an ``async def``, a function that runs it on
    the loop and returns its result; for an async generator function, one that returns its items as
    :class:`Items`. ``name`` names the hook in errors and the blocking warning."""
    if inspect.isasyncgenfunction(function):

        @functools.wraps(function)
        def iterate(*args: Any, **kwargs: Any) -> Items:
            return Items(function(*args, **kwargs), name)

        iterate.asynchronous = _generating(function, name)  # type: ignore[attr-defined]
        return iterate
    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            return run(function(*args, **kwargs), name)

        call.asynchronous = Steps(function, name)  # type: ignore[attr-defined]
        return call
    return function


class Steps:
    """An ``async def`` hook awaited on the loop itself, each step timed as :func:`run` does (what the event-loop
    lifecycle calls in place of the sync function :func:`synchronous` made of it)."""

    __slots__ = ("function", "name")

    def __init__(self, function: Callable[..., Awaitable[Any]], name: str) -> None:
        self.function, self.name = function, name

    def __call__(self, *args: Any, **kwargs: Any) -> Awaitable[Any]:
        return _Steps(self.function(*args, **kwargs), self.name)


def _generating(function: Callable[..., AsyncGenerator[Any, None]], name: str) -> Callable[..., Awaitable[Items]]:
    """An async generator function as the event-loop lifecycle calls it: a coroutine giving its :class:`Items`."""

    async def generate(*args: Any, **kwargs: Any) -> Items:
        return Items(function(*args, **kwargs), name)

    return generate


def asynchronous(function: Callable[..., Any]) -> Callable[..., Awaitable[Any]] | None:
    """The ``async def`` a function of :func:`synchronous` runs, to be awaited on the loop; None for a sync one."""
    return getattr(function, "asynchronous", None)
