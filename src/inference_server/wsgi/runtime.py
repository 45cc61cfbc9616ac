"""SageMaker Runtime's front end, as boto3 and the SageMaker SDK call it (``InvokeEndpoint``):
``POST /endpoints/{name}/invocations`` for any endpoint name, where a container error becomes 424 ``ModelError``;
with ``TargetModel`` (the ``X-Amzn-SageMaker-Target-Model`` header) the model of that name under ``--model-root``,
loaded on first use as SageMaker's front end loads it from S3.

Serving it lets the real clients talk to a local server (``AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from inference_server import codecs
from inference_server.wsgi import _eventstream
from inference_server.wsgi._invoke import StreamFailed
from inference_server.wsgi._replies import (
    PIECE,
    Answer,
    Invoke,
    Invoking,
    Piecewise,
    Request,
    close,
    json_reply,
    problem_for,
)

if TYPE_CHECKING:
    from inference_server.wsgi._service import Service

logger = logging.getLogger("inference_server")


def register(app: Service) -> None:
    """Add the runtime's routes to ``app``."""

    async def invocations(request: Request, invoke: Invoke) -> Answer:
        """``/invocations`` as SageMaker Runtime answers it: a container error becomes 424 ``ModelError``; a
        ``TargetModel`` refused before any model is involved is SageMaker Runtime's own 400, as its ValidationError."""
        invoked = app.invoked(request)
        try:
            status, headers, body = await invoke(invoked)
        except Exception as exc:
            problem = problem_for(exc, request.request_id, request.environ, app.settings.debug)
        else:
            headers.append(("X-Amzn-Invoked-Production-Variant", "AllTraffic"))
            return status, headers, body
        # the container's answer, as SageMaker Runtime quotes it
        original = b"".join(bytes(chunk) for chunk in problem.reply()[2]).decode()
        kind = "client" if problem.status < 500 else "server"
        return json_reply(
            424,
            {
                "ErrorCode": f"{kind.upper()}_ERROR_FROM_MODEL",
                "OriginalStatusCode": problem.status,
                "OriginalMessage": original,
                "Message": f'Received {kind} error ({problem.status}) from model with message "{original}".',
            },
            [("x-amzn-ErrorType", "ModelError")],
        )

    async def response_stream(request: Request, invoke: Invoke) -> Answer:
        """``InvokeEndpointWithResponseStream``: the answer as SageMaker Runtime sends it, each chunk a ``PayloadPart``
        event of the ``application/vnd.amazon.eventstream`` framing (see :mod:`._eventstream`), the model's media
        type in ``X-Amzn-SageMaker-Content-Type``; a stream that fails goes on with a ``ModelStreamError`` event and
        ends. An error before the first chunk is the 424 ``ModelError`` of ``invocations``."""
        environ = request.environ
        # the model's answer's media type comes as X-Amzn-SageMaker-Accept (Accept is about the framing)
        environ["HTTP_ACCEPT"] = environ.get("HTTP_X_AMZN_SAGEMAKER_ACCEPT") or "*/*"
        status, headers, body = await invocations(request, invoke)
        if status >= 400:
            return status, headers, body
        media_type = next((value for key, value in headers if key == "Content-Type"), "application/octet-stream")
        kept = [(k, v) for k, v in headers if k not in ("Content-Type", "Content-Length")]
        framed = _EventStream(body, request.request_id)
        return (
            200,
            [("Content-Type", _eventstream.MEDIA_TYPE), ("X-Amzn-SageMaker-Content-Type", media_type), *kept],
            framed,
        )

    app.route("/endpoints/{name}/invocations", Invoking(invocations), "POST")
    app.route("/endpoints/{name}/invocations-response-stream", Invoking(response_stream), "POST")


class _EventStream(Piecewise):
    """A body's chunks as ``PayloadPart`` events, made one at a time as the server asks for them; a failed stream's
    end as a ``ModelStreamError`` event. Under WSGI an iterator whose ``close()`` closes the body; on the event loop
    a :class:`~inference_server.wsgi._replies.Piecewise` over a whole answer or a stream, an event of a chunk over
    :data:`~inference_server.wsgi._replies.PIECE` bytes framed on a helper thread (copying and checksumming 16 MiB
    would hold the loop)."""

    def __init__(self, body: Iterable[codecs.Buffer] | Piecewise, request_id: str) -> None:
        self._body = body
        self._request_id = request_id
        self._chunks: Iterator[codecs.Buffer] | None = None  # a whole answer's, on the loop
        self._events: Iterator[bytes] | None = None  # the events of the chunk being sent, on the loop
        self._large = False
        self._ended = False

    def __iter__(self) -> Iterator[bytes]:
        assert not isinstance(self._body, Piecewise)
        try:
            for chunk in self._body:
                yield from _eventstream.payload_parts(chunk)
        except Exception as exc:
            yield _failure(exc, self._request_id)

    def close(self) -> None:
        if not isinstance(self._body, Piecewise):
            close(self._body)

    async def __anext__(self) -> bytes:
        while not self._ended:
            events = self._events
            if events is not None:
                event = await asyncio.to_thread(next, events, None) if self._large else next(events, None)
                if event is not None:
                    self.sent += len(event)
                    return event
                self._events = None
            try:
                chunk = await self._next_chunk()
            except StopAsyncIteration:
                self._ended = True
                break
            except Exception as exc:
                self._ended = True
                event = _failure(exc, self._request_id)
                self.sent += len(event)
                return event
            self._large = memoryview(chunk).nbytes > PIECE
            self._events = _eventstream.payload_parts(chunk)
        raise StopAsyncIteration

    async def _next_chunk(self) -> codecs.Buffer:
        body = self._body
        if isinstance(body, Piecewise):
            return await body.__anext__()
        if self._chunks is None:
            self._chunks = iter(body)
        chunk = next(self._chunks, None)
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    async def aclose(self) -> None:
        if isinstance(self._body, Piecewise):
            await self._body.aclose()
        else:
            close(self._body)


def _failure(exc: Exception, request_id: str) -> bytes:
    """The event that ends a failed stream: the model's ``ModelStreamError``, or SageMaker Runtime's own failure."""
    if isinstance(exc, StreamFailed):
        return _eventstream.model_stream_error(exc.message, exc.code)
    logger.error("Request %s: the response stream failed", request_id, exc_info=exc)  # our bug
    return _eventstream.internal_stream_failure(f"the server failed; see the server log for request {request_id}")
