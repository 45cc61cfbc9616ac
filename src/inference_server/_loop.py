"""The worker's event loop, where ``async def`` hooks run: one asyncio loop per process, on a daemon thread of its own.

This is the loop the event-loop request lifecycle (issue 39) will run requests on. For now a request is a WSGI call:
its sync hooks still run on the request's thread, and for an async one that thread waits here for the result
(:func:`run`). The loop is started by the first async hook call, never when no hook is async, and again in a child
after a fork (the parent's loop thread does not exist there). A hook's coroutine runs in a copy of the caller's
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
    """This process's loop and its thread."""

    def __init__(self) -> None:
        import asyncio  # only once a hook is async: a server of sync hooks never imports it for us

        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=THREAD_NAME, daemon=True)
        self.thread.start()


_running: _Running | None = None
_lock = threading.Lock()
#: The hooks already named for blocking the loop in this process.
_warned: set[str] = set()


def _forget() -> None:
    """In a child after a fork: no loop yet (the parent's thread is not here), no hook named, a lock nobody holds."""
    global _running, _lock
    _running, _lock = None, threading.Lock()
    _warned.clear()


os.register_at_fork(after_in_child=_forget)


def running() -> asyncio.AbstractEventLoop | None:
    """This process's loop if it was started, else None."""
    current = _running
    return current.loop if current is not None and current.pid == os.getpid() else None


def _started() -> _Running:
    global _running
    current = _running
    if current is None or current.pid != os.getpid():
        with _lock:
            current = _running
            if current is None or current.pid != os.getpid():
                _running = current = _Running()
    return current


def run(awaitable: Awaitable[_T], name: str) -> _T:
    """Run ``awaitable`` (hook ``name``'s) on the loop and wait for its result, on any thread but the loop's."""
    import asyncio

    current = _started()
    if threading.get_ident() == current.thread.ident:
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
    for variable, value in context.items():  # what the hook set, the caller's next hooks see
        if variable.get(_UNSET) is not value:
            variable.set(value)
    return result


_UNSET = object()


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
    there (its ``finally`` runs)."""

    __slots__ = ("_done", "_generator", "_name")

    def __init__(self, generator: AsyncGenerator[Any, None], name: str) -> None:
        self._generator, self._name = generator, name
        self._done = False

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        try:
            return run(self._generator.__anext__(), self._name)
        except StopAsyncIteration:
            self._done = True
            raise StopIteration from None
        except BaseException:
            self._done = True  # a generator that raised is finished
            raise

    def close(self) -> None:
        """Run the generator's ``aclose()`` on the loop, unless it is finished."""
        if not self._done:
            self._done = True
            run(self._generator.aclose(), self._name)


def synchronous(function: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``function`` itself when it is synchronous (nothing added); for an ``async def``, a function that runs it on
    the loop and returns its result; for an async generator function, one that returns its items as
    :class:`Items`. ``name`` names the hook in errors and the blocking warning."""
    if inspect.isasyncgenfunction(function):

        @functools.wraps(function)
        def iterate(*args: Any, **kwargs: Any) -> Items:
            return Items(function(*args, **kwargs), name)

        return iterate
    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            return run(function(*args, **kwargs), name)

        return call
    return function
