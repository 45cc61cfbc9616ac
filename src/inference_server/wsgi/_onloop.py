"""The event-loop lifecycle under a WSGI server: the server's thread waits while the invocation runs on the worker's
event loop (:class:`~inference_server.wsgi._async.AsyncLifecycle`), as under the event-loop fronts.

gunicorn keeps its own HTTP parser (what the strict backend is for: a chunked body cut short is a 400, heads and
slow headers bounded) and its thread per request, and gets what the loop gives an invocation: the 504 at the
deadline while a sync hook still runs (its model slot given back when it returns, the worker replaced when it is
stuck), async hooks and async generators on the loop, micro-batched requests grouped there.

- **The body** is read on the server's thread (the only one that may read its socket), when the lifecycle asks for
  it: after admission, within ``--read-timeout`` (due on the loop, which answers 408 and ends the read with the
  server's ``abort``), so 413s, 411s and ``100 Continue`` come when they did.
- **The answer** is handed back to the thread; a stream's chunks are made on the loop one at a time as the server
  asks for the next (:class:`Pulled`), and closing it closes the model's generator there.

The cost is the hops between the thread and the loop (two per request at least, where the WSGI lifecycle has none):
measured in benchmarks/README.md.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from inference_server import _loop, codecs
from inference_server.errors import RequestTimeout
from inference_server.wsgi._async import ARRIVED, AsyncLifecycle
from inference_server.wsgi._body import Reading, read_body
from inference_server.wsgi._replies import Invoking, Piecewise, Reply, Request

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment

#: What the loop asks of the server's thread: read the body (within the limit) into the future, or (None) the answer
#: is ready.
_Ask = tuple[int | None, "asyncio.Future[bytearray | bytes]"] | None


class OnLoop:
    """Invoking routes of a WSGI app run on the worker's loop while the server's thread waits (see the module's
    text). ``arrival``: when the server took the request, asked on its thread (a drain answers what came before)."""

    def __init__(
        self,
        lifecycle: AsyncLifecycle,
        reading: Reading,
        read_timeout: float,
        arrival: Callable[[WSGIEnvironment], float | None] | None = None,
    ) -> None:
        self.lifecycle = lifecycle
        self._reading = reading
        self._read_timeout = read_timeout
        self._arrival = arrival

    def dispatch(self, handler: Invoking, request: Request) -> Reply:
        """On the server's thread: the route's answer, its coroutine run on the loop (a stream: :class:`Pulled`)."""
        environ = request.environ
        if self._arrival is not None:
            environ[ARRIVED] = self._arrival(environ)
        loop = _loop.started()
        asks: queue.SimpleQueue[_Ask] = queue.SimpleQueue()
        reading: list[bool] = []  # (non-empty while this thread reads the body)

        async def read(limit: int | None) -> bytearray | bytes:
            wanted: asyncio.Future[bytearray | bytes] = loop.create_future()
            asks.put((limit, wanted))
            return await wanted

        def invoke(target: Any, framing: Any = None) -> Any:
            return self.lifecycle.invoke(request, target, framing, read=read)

        done = asyncio.run_coroutine_threadsafe(handler.function(request, invoke), loop)

        def answered(_: object) -> None:  # (on the loop) the answer is ready: a read still going on is ended
            if reading and self._reading.abort is not None:
                self._reading.abort(environ)
            asks.put(None)

        done.add_done_callback(answered)
        while (ask := asks.get()) is not None:
            limit, wanted = ask
            reading.append(True)
            try:
                body: bytearray | bytes | None = read_body(environ, limit, self._reading)
                error: BaseException | None = None
            except OSError:  # the server's receive timeout (gunicorn's, --read-timeout), or the read ended
                body, error = None, RequestTimeout(f"the request body did not arrive within {self._read_timeout} s")
            except BaseException as exc:
                body, error = None, exc
            finally:
                reading.clear()
            loop.call_soon_threadsafe(_settle, wanted, body, error)
        status, headers, answer = done.result()
        if isinstance(answer, Piecewise):
            return status, headers, Pulled(answer, loop)
        return status, headers, answer


def _settle(wanted: asyncio.Future[Any], body: bytearray | bytes | None, error: BaseException | None) -> None:
    """On the loop: hand the body read on the server's thread (or its error) to the lifecycle, if it still waits."""
    if wanted.done():  # (the request was answered meanwhile: a 408, or its client's task cancelled)
        return
    if error is not None:
        wanted.set_exception(error)
    else:
        wanted.set_result(body)


class Pulled(Iterator[codecs.Buffer]):
    """A stream made on the loop, as the WSGI server iterates it: each chunk made there when the server asks for it
    (its errors raised here: :class:`~inference_server.wsgi._invoke.StreamFailed` ends the connection without the
    last chunk); :meth:`close` closes the model's generator there (its ``finally`` runs)."""

    def __init__(self, stream: Piecewise, loop: asyncio.AbstractEventLoop) -> None:
        self._stream = stream
        self._loop = loop

    def __iter__(self) -> Pulled:
        return self

    def __next__(self) -> codecs.Buffer:
        try:
            return asyncio.run_coroutine_threadsafe(_next(self._stream), self._loop).result()
        except StopAsyncIteration:
            raise StopIteration from None

    @property
    def sent(self) -> int:
        return self._stream.sent

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stream.aclose(), self._loop).result()


async def _next(stream: Piecewise) -> codecs.Buffer:
    return await stream.__anext__()
