"""The invocation lifecycle on the worker's event loop: drain admission, the body read with ``--read-timeout``, the
deadline checked on the loop, sync hooks on the model threads, async hooks on the loop, and streams.

The event-loop fronts (:mod:`inference_server.wsgi._rsgi`, :mod:`inference_server.wsgi._asgi`) and gunicorn
(:mod:`inference_server.wsgi._onloop`, its thread waiting) run every route that invokes the model through
:class:`AsyncLifecycle`; the sync :class:`~inference_server.wsgi._invoke.Lifecycle` still serves granian's WSGI
interface, and this one shares its settings, worker state and worker replacement.

- **The body** is read on the loop by the front's reader, bounded by ``--read-timeout`` (a 408: a client that
  stalls holds no thread) and by the body limit (413).
- **The deadline** (``--timeout``) bounds the whole invocation, checked on the loop every :data:`TICK`: at it the
  client is answered 504 at once. A sync hook still running finishes on its model thread and gives its slot back
  when it returns; one still running :data:`~inference_server.wsgi._invoke.RECYCLE_GRACE` seconds later has its
  worker replaced, as on the WSGI path. Work still waiting for a model thread is dropped without calling the model.
- **Sync hooks** run on the model threads (``--threads`` of them, one by default: two sync model calls never
  overlap), all three of an invocation in one hand-off; **async hooks** run on the loop
  (:meth:`Pipeline.ainvoke`).
- **Micro-batched requests** wait for their groups on the loop (:meth:`Batcher.apredict
  <inference_server.batching.Batcher.apredict>`): the groups are formed there and run on the model threads.
- **Streams**: a sync generator's chunks are made one at a time on the model threads; an async generator's records
  are awaited on the loop and their chunks made there, so a stream costs no thread while it waits. Closing the
  answer (the last chunk sent, or the client gone) closes the generator: its ``finally`` runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import heapq
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from inference_server import _deadlines, _loop, codecs
from inference_server._pipeline import Framing, Output, Stream
from inference_server.errors import GatewayTimeout, HookError, RequestTimeout, ServiceUnavailable
from inference_server.wsgi._invoke import (
    CLIENT_DEADLINE,
    MODEL,
    OWN_TIMEOUT,
    RECYCLE_GRACE,
    Lifecycle,
    StreamFailed,
    Target,
    stream_timeout,
)
from inference_server.wsgi._replies import Headers, Piecewise, Request

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment

logger = logging.getLogger("inference_server")

_T = TypeVar("_T")

#: Threads that wait on behalf of requests for what is not on the loop yet: a model loading on a multi-model
#: endpoint. Started only when needed.
HELPER_THREADS = 1024

#: How often the requests' deadlines are checked (seconds): a 408 or a 504 is answered at most about twice this late.
TICK = 0.05

#: The environ key under which a WSGI server's thread leaves when the server took the request (``time.monotonic()``),
#: where it can say (gunicorn): a request that arrived before a drain began is answered, not refused.
ARRIVED = "inference_server.arrived"

#: What a front reads the body with: ``read(limit)`` gives the whole body, refusing one over ``limit`` bytes (413).
Reader = Callable[[int | None], Awaitable[bytearray | bytes]]


class _Work:
    """What a request's work is doing now, for its deadline: its stage, and the model thread's future if any."""

    __slots__ = ("call", "future", "loop", "stage")

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        #: The loop the request runs on.
        self.loop = loop
        self.stage = _deadlines.READING
        self.future: concurrent.futures.Future[Any] | None = None
        #: A micro-batched request's call, which the batcher watches (it never runs a cancelled one).
        self.call: _deadlines.Call | None = None


#: What :attr:`_Expiry.fired` says when the client's deadline passed while the work waited.
CLIENT = "client"


class _Expiry:
    """A request's deadline. Set for the body's (``--read-timeout``); due then, it cancels the request's task (a 408).
    Due once the body is read, it is set again for the whole request's deadline, if any, and then cancels the task
    (a 504)."""

    __slots__ = ("client", "deadline", "fired", "reading", "slot", "task", "work")

    def __init__(self, deadline: float | None, task: asyncio.Task[Any] | None) -> None:
        self.task = task
        self.deadline = deadline
        self.reading = True
        self.fired: str | None = None
        self.slot = 0  # (its tick in :class:`_Deadlines`)
        #: A deadline the client set (the gRPC front's): due while the work still waits, it is answered (a 504)
        #: and the work never runs; once the work runs, only :attr:`deadline` bounds it.
        self.client: float | None = None
        self.work: _Work | None = None

    def due(self, deadlines: _Deadlines) -> None:
        if not self.reading:
            now = time.monotonic()
            if self.deadline is None or self.deadline > now:
                client = self.client
                if client is not None and client <= now:
                    work = self.work
                    running = work is not None and (
                        work.stage == _deadlines.RUNNING
                        or (work.call is not None and work.call.stage == _deadlines.RUNNING)
                    )
                    if not running:
                        self.fired = CLIENT
                        if self.task is not None:
                            self.task.cancel()
                        return
                    self.client = client = None
                upcoming = [when for when in (self.deadline, client) if when is not None]
                if upcoming:
                    deadlines.set(self, min(upcoming), deadlines.loop)
                return
        self.fired = _deadlines.READING if self.reading else _deadlines.RUNNING
        if self.task is not None:
            self.task.cancel()

    def forget(self) -> None:
        """The cancellation was ours and is answered: the task goes on as if it had not been cancelled."""
        uncancel = getattr(self.task, "uncancel", None)  # (Python 3.11+; 3.10 keeps no count)
        if uncancel is not None:
            uncancel()


class _Deadlines:
    """The deadlines of the requests on the loop, checked every :data:`TICK` by one loop timer (armed while any is
    set). Chosen over a loop timer per request, made and cancelled for each although nearly every request ends long
    before its deadline: setting and clearing one here is a set's add and discard."""

    __slots__ = ("_due", "_slots", "_timer", "loop")

    def __init__(self) -> None:
        self._slots: dict[int, set[_Expiry]] = {}  # by tick: the deadlines that fall in it
        self._due: list[int] = []  # (a heap of the ticks in _slots)
        self._timer: asyncio.TimerHandle | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def set(self, expiry: _Expiry, when: float, loop: asyncio.AbstractEventLoop | None) -> None:
        """Call ``expiry.due(self)`` at the first tick at or after ``when`` (on ``time.monotonic()``'s clock); ``loop``
        is the running loop."""
        if loop is not self.loop:  # (a new loop: what was set on another is gone with it)
            self._slots, self._due, self._timer, self.loop = {}, [], None, loop
        assert loop is not None
        slot = expiry.slot = int(when / TICK) + 1
        expiries = self._slots.get(slot)
        if expiries is None:
            expiries = self._slots[slot] = set()
            heapq.heappush(self._due, slot)
        expiries.add(expiry)
        if self._timer is None:
            self._timer = loop.call_later(TICK, self._tick)

    def clear(self, expiry: _Expiry) -> None:
        """``expiry`` is not due any more (its request is answered)."""
        expiries = self._slots.get(expiry.slot)
        if expiries is not None:
            expiries.discard(expiry)

    def _tick(self) -> None:
        now = int(time.monotonic() / TICK)
        while self._due and self._due[0] <= now:
            for expiry in self._slots.pop(heapq.heappop(self._due)):
                expiry.due(self)
        self._timer = self.loop.call_later(TICK, self._tick) if self._due and self.loop is not None else None


class AsyncLifecycle:
    """The life of an invocation on the event loop, for one app (see the module's text).

    A model whose sync invocations are known to be quick (:data:`~inference_server._deadlines.QUICK_STREAK` calls in
    a row under :data:`~inference_server._deadlines.QUICK` on the model threads) has them run inline on the loop
    while no model thread is busy (so two sync model calls still never overlap): a hand-off to a thread and back
    costs more than such a call. One inline call slower than :data:`~inference_server._deadlines.SLOW` sends them
    back to the threads (it held the loop that long, as any hook on the loop would).
    """

    def __init__(self, lifecycle: Lifecycle) -> None:
        self.lifecycle = lifecycle
        self.settings = settings = lifecycle.settings
        self._timeout = settings.timeout or None
        #: The model threads: sync hooks run here, ``--threads`` at once.
        self.models = concurrent.futures.ThreadPoolExecutor(settings.threads, "model")
        self._helpers = concurrent.futures.ThreadPoolExecutor(HELPER_THREADS, "helper")
        self._paces = _deadlines.Paces()
        self._deadlines = _Deadlines()
        #: Calls handed to the model threads and not finished (changed under the lock, from either side).
        self._busy = 0
        self._busy_lock = threading.Lock()
        self._helping = 0  # (calls on the helper threads, likewise)

    @property
    def busy(self) -> int:
        """Calls handed to the model threads and the helper threads (a model loading) and not finished, a hook
        still running past its request's 504 too."""
        return self._busy + self._helping

    def _on_helper(self, function: Callable[[], _T]) -> concurrent.futures.Future[_T]:
        """``function()`` on a helper thread, in a copy of this context, counted in :attr:`busy` until it ends."""
        with self._busy_lock:
            self._helping += 1
        try:
            future = self._helpers.submit(contextvars.copy_context().run, function)
        except BaseException:
            self._helped(None)
            raise
        future.add_done_callback(self._helped)
        return future

    def _helped(self, future: concurrent.futures.Future[Any] | None) -> None:
        with self._busy_lock:
            self._helping -= 1

    async def on_model_thread(self, function: Callable[..., _T], *args: Any, work: _Work | None = None) -> _T:
        """``function(*args)`` on a model thread, in a copy of this task's context; what it set there is set here."""
        context = contextvars.copy_context()
        with self._busy_lock:
            self._busy += 1
        future = self.models.submit(context.run, self._started, work, function, *args)
        if work is not None:
            work.future = future
        future.add_done_callback(self._finished)
        result = await asyncio.wrap_future(future, loop=work.loop if work is not None else None)
        _loop.carry(context)
        return result

    @staticmethod
    def _started(work: _Work | None, function: Callable[..., _T], *args: Any) -> _T:
        """On a model thread: the work is running now (what its 504 says), then ``function(*args)``."""
        if work is not None:
            work.stage = _deadlines.RUNNING
        return function(*args)

    def _spawn(self, function: Callable[[], None]) -> concurrent.futures.Future[None]:
        """On the loop: ``function()`` on a model thread, not waited for here (a micro-batch's group)."""
        with self._busy_lock:
            self._busy += 1
        try:
            future = self.models.submit(function)
        except BaseException:
            self._finished(None)
            raise
        future.add_done_callback(self._group_ended)
        return future

    def _group_ended(self, future: concurrent.futures.Future[Any]) -> None:
        """A micro-batch's group ended on a model thread: what escaped it (not an input's own error) is logged."""
        self._finished(future)
        error = None if future.cancelled() else future.exception()
        if error is not None:
            logger.error("Micro-batching: a group failed: %s", error, exc_info=error)

    def _finished(self, future: concurrent.futures.Future[Any] | None) -> None:
        with self._busy_lock:
            self._busy -= 1

    async def invoke(
        self,
        request: Request,
        target: Target,
        framing: Framing | None = None,
        *,
        read: Reader,
        started: float | None = None,
        entered: bool = False,
    ) -> Reply:
        """Answer one invocation of ``target``: 200 and the encoded prediction (its body a list of buffers, or
        :class:`Chunks` for a stream), or an exception for the app to answer (503 while draining, 408, 504, the
        hooks' own). ``started``: when the request's deadline began (``time.monotonic()``; now if None);
        ``entered``: the caller counts the request in flight for the drain (and leaves once it is answered)."""
        worker = None if entered else self.lifecycle.worker  # (counted here, else by the caller or not at all)
        if worker is not None:
            worker.enter()
        try:
            if self.refuses(request.environ):
                raise ServiceUnavailable("the server is shutting down; send the request again")
            status, headers, body = await self._bounded(request, target, read, framing, started)
        except BaseException:
            if worker is not None:
                worker.leave()
            raise
        if worker is not None:
            if isinstance(body, Chunks):
                body.leave = worker.leave
            else:
                worker.leave()
        return status, headers, body

    def refuses(self, environ: WSGIEnvironment) -> bool:
        """Whether the drain refuses this request: it has begun, and the request did not arrive before it (as far as
        the server says: :data:`ARRIVED`)."""
        worker = self.lifecycle.worker
        if worker is None or not worker.draining:
            return False
        arrived = environ.get(ARRIVED)
        return arrived is None or arrived >= worker.draining_since

    async def _bounded(
        self, request: Request, target: Target, read: Reader, framing: Framing | None, started: float | None
    ) -> Reply:
        """The invocation under one deadline: the body's (``--read-timeout``, within ``--timeout``: 408), then the
        whole's (``--timeout``: 504), both from ``started``. When it is due it cancels the request's task (what is
        awaited then is dropped: work still waiting for a model thread never runs), and the request is answered at
        once."""
        start = time.monotonic() if started is None else started
        environ = request.environ
        timeout = environ.get(OWN_TIMEOUT, self._timeout)
        read_timeout = min(timeout, self.settings.read_timeout) if timeout else self.settings.read_timeout
        # The front's loop, adopted (asking asyncio for the running loop costs a system call), when this is its thread
        loop = _loop.running() if _loop.on_loop() else None
        task = asyncio.current_task(loop) if loop is not None else None
        if task is None:  # (not the adopted loop)
            loop = asyncio.get_running_loop()
            task = asyncio.current_task(loop)
        expiry = _Expiry(start + timeout if timeout else None, task)
        deadlines = self._deadlines
        deadlines.set(expiry, start + read_timeout, loop)
        work = _Work(loop)
        client = environ.get(CLIENT_DEADLINE)
        try:
            body = await read(target.pipeline.max_body)
            expiry.reading = False
            if client is not None:
                expiry.client, expiry.work = client, work
                deadlines.clear(expiry)
                deadlines.set(expiry, client if expiry.deadline is None else min(client, expiry.deadline), loop)
            return await self._invoke(request, target, body, framing, work, start)
        except asyncio.CancelledError:
            if expiry.fired is None:
                raise
            expiry.forget()
        finally:
            deadlines.clear(expiry)
        if expiry.fired == _deadlines.READING:
            raise RequestTimeout(f"the request body did not arrive within {read_timeout} s")
        if expiry.fired == CLIENT:
            if work.call is not None:  # (the batcher leaves it out of its groups)
                work.call.cancel()
            raise GatewayTimeout(f"the client's deadline passed (while {work.stage})")
        if work.call is not None:  # the batcher leaves it out of its groups, or it is running in one
            work.stage = work.call.cancel()
        self._watch_stuck(work.future, request.request_id)
        raise GatewayTimeout(f"the request took longer than its timeout of {timeout} s (while {work.stage})")

    def _watch_stuck(self, future: concurrent.futures.Future[Any] | None, request_id: str) -> None:
        """Replace the worker if ``future``'s work is still running :data:`RECYCLE_GRACE` seconds from now."""
        if future is None or future.done():
            return

        def check() -> None:
            if future.running():  # (still queued for a model thread: behind other work, which is watched itself)
                self.lifecycle.recycle(request_id)

        asyncio.get_running_loop().call_later(RECYCLE_GRACE, check)

    async def _invoke(
        self,
        request: Request,
        target: Target,
        body: bytearray | bytes,
        framing: Framing | None,
        work: _Work,
        start: float,
    ) -> Reply:
        environ = request.environ
        pipeline = target.pipeline
        work.stage = _deadlines.WAITING
        if target.model == pipeline.model:
            model = pipeline.model()  # (loaded before the worker serves)
        else:  # a model of a multi-model endpoint, which may load now (on a helper thread: it may take long)
            model = target.at_hand() if target.at_hand is not None else None
            if model is None:
                model = await asyncio.wrap_future(self._on_helper(target.model))
        content_type = environ.get("CONTENT_TYPE") or (self.lifecycle.no_content_type() if framing is None else "")
        accept = environ.get("HTTP_ACCEPT") or "*/*"
        name = environ.get(MODEL, "")
        output: Output
        if target.batcher is not None:  # the batcher groups requests waiting here, and runs groups on model threads
            batcher = target.batcher
            work.call = call = _deadlines.Call()
            call.stage = _deadlines.WAITING
            with batcher.coming() as coming:

                async def predict(data: Any) -> Any:
                    return await batcher.apredict(
                        data, model, call, self._spawn, coming=coming, holder=work, loop=work.loop
                    )

                output = await pipeline.ainvoke(
                    body, content_type, accept, model, self._on_thread(work), framing, predict, work.loop, start, name
                )
        elif pipeline.asynchronous:
            output = await pipeline.ainvoke(
                body, content_type, accept, model, self._on_thread(work), framing, None, work.loop, start, name
            )
        else:
            invoke = functools.partial(
                pipeline.invoke, body, content_type, accept, model, None, True, framing, start, name
            )
            pace = self._paces.of(model)
            if pace.inline and not self._busy:
                work.stage = _deadlines.RUNNING
                output = pace.inline_call(invoke)
            else:
                output = await self.on_model_thread(pace.timed, invoke, work=work)
        captures = self.lifecycle.captures
        if captures is not None:
            captures.invocation(environ, body, output)
        if output.stream is not None:
            timeout = stream_timeout(self.settings, environ)
            deadline = start + timeout if timeout else None
            chunks = Chunks(output.buffers, output.stream, self, request, deadline)
            return 200, [("Content-Type", output.media_type), *output.headers], chunks
        headers = [("Content-Type", output.media_type), ("Content-Length", str(output.nbytes)), *output.headers]
        return 200, headers, output.buffers

    def _on_thread(self, work: _Work) -> Callable[..., Awaitable[Any]]:
        async def on_thread(function: Callable[..., Any], *args: Any) -> Any:
            return await self.on_model_thread(function, *args, work=work)

        return on_thread


#: What the event-loop lifecycle answers: status, headers, and the body as a list of buffers or :class:`Chunks`.
Reply = tuple[int, Headers, "list[codecs.Buffer] | Chunks"]


class Chunks(Piecewise):
    """A streamed answer's chunks, each made when the front asks for the next: a sync generator's on a model
    thread, an async generator's on the loop; with ``--stream-timeout``, the whole stream has a deadline
    (:class:`StreamFailed` past it). :meth:`aclose` (the last chunk sent, or the client gone) closes the model's
    iterator, so its ``finally`` runs, then leaves the drain's count."""

    def __init__(
        self,
        first: list[codecs.Buffer],
        stream: Stream,
        lifecycle: AsyncLifecycle,
        request: Request,
        deadline: float | None,
    ) -> None:
        self._first = first
        self._stream = stream
        self._lifecycle = lifecycle
        self._request = request
        self._deadline = deadline
        self._making: concurrent.futures.Future[Any] | None = None  # a chunk being made on a model thread
        self._closed = False
        #: Called once the stream is closed (the worker's count of requests in flight).
        self.leave: Callable[[], None] | None = None
        #: Bytes of chunks made so far.
        self.sent = 0

    def __aiter__(self) -> Chunks:
        return self

    async def __anext__(self) -> codecs.Buffer:
        if self._first:
            chunk = self._first.pop(0)
        else:
            made = await self._next()
            if made is None:
                raise StopAsyncIteration
            chunk = made
        self.sent += memoryview(chunk).nbytes
        return chunk

    async def _next(self) -> codecs.Buffer | None:
        if self._closed:
            return None
        stream = self._stream
        remaining = None if self._deadline is None else self._deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            await self._timed_out()
        work = _Work()
        if stream.records is not None:
            making: Awaitable[codecs.Buffer | None] = stream.anext()
        else:
            making = self._lifecycle.on_model_thread(stream.next, work=work)
        try:
            if remaining is None:
                return await making
            return await asyncio.wait_for(making, remaining)
        except asyncio.TimeoutError:
            self._making = work.future
            self._lifecycle._watch_stuck(work.future, self._request.request_id)
            await self._timed_out()
        except HookError as exc:
            environ = self._request.environ
            logger.error(
                "Request %s %s %s: %s; the stream is cut",
                self._request.request_id,
                environ["REQUEST_METHOD"],
                environ.get("PATH_INFO"),
                exc.summary,
                exc_info=exc.error,
            )
            await self.aclose()
            raise StreamFailed(
                "StreamBroken", f"{exc.summary}; see the server log for request {self._request.request_id}"
            ) from None
        raise AssertionError("not reached")

    async def _timed_out(self) -> None:
        timeout = stream_timeout(self._lifecycle.settings, self._request.environ)
        logger.error(
            "Request %s: the stream took longer than its stream timeout (%d s); it is cut",
            self._request.request_id,
            timeout,
        )
        await self.aclose()
        raise StreamFailed(
            "ModelInvocationTimeExceeded", f"the stream took longer than the server's stream timeout of {timeout} s"
        )

    async def aclose(self) -> None:
        """Close the model's iterator (once; after the chunk being made on a model thread, if one is), then leave."""
        if self._closed:
            return
        self._closed = True
        stream = self._stream
        try:
            if stream.records is not None:
                await stream.aclose()
            elif self._making is not None and not self._making.done():  # closed on a model thread once it is made
                lifecycle = self._lifecycle
                self._making.add_done_callback(lambda _: lifecycle.models.submit(self._close_quietly))
            else:
                await self._lifecycle.on_model_thread(self._close_quietly)
        except Exception:
            logger.exception("Request %s: closing the stream raised", self._request.request_id)
        finally:
            leave, self.leave = self.leave, None
            if leave is not None:
                leave()

    def _close_quietly(self) -> None:
        try:
            self._stream.close()
        except Exception:
            logger.exception("Request %s: closing the stream raised", self._request.request_id)
