"""What a route answers: a :data:`Reply` whose body is an iterable of buffers, :class:`Body` with its cleanup, and
the replies for JSON values and for exceptions."""

from __future__ import annotations

import gzip
import http
import logging
import traceback
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import orjson
import werkzeug.exceptions

from inference_server import codecs
from inference_server.errors import HookError, HTTPError

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment

    from inference_server._pipeline import Framing
    from inference_server.wsgi._invoke import Target

logger = logging.getLogger("inference_server")

Headers = list[tuple[str, str]]
#: What a route handler returns: status code, headers, and the body as an iterable of bytes-like buffers (a
#: :class:`Body` when something must happen once it is sent).
Reply = tuple[int, Headers, Iterable[codecs.Buffer]]

#: The most bytes of a whole answer handed to the server as one item. granian 2.8's WSGI interface reads a ``bytes``
#: item in place and any other buffer element by element (about 10 ns a byte: 13 ms for 960 KB), copies each item
#: into a buffer of its own, and holds at most 4 items of an answer given as an iterator; so an answer goes as
#: ``bytes``, and a large one in pieces copied as they are sent: a slow reader holds a few MiB, not a copy of the
#: whole answer. gunicorn sends each item with ``sendall``; the pieces spare it a whole copy too.
PIECE = 1 << 20
#: The largest whole answer handed to granian as a list (see :meth:`Body.prepare`): its list path saves about 60 us
#: of server CPU on a small answer, but costs about 2.6 ms more than an item of ``bytes`` on a 960 KB one.
HAND_OVER = 64 << 10

STATUS_LINES = {status.value: f"{status.value} {status.phrase}" for status in http.HTTPStatus}


class Request(NamedTuple):
    """One request as a route handler sees it."""

    environ: WSGIEnvironment
    #: The client's ``X-Request-Id`` when it is a sane one, else one made up; sent back and logged.
    request_id: str
    #: The values of the route's ``{name}`` segments.
    params: dict[str, str]


Handler = Callable[[Request], Reply]


class Piecewise(AsyncIterator[codecs.Buffer]):
    """An answer made as the event loop sends it: its chunks as they come, the bytes made so far, and :meth:`aclose`
    once the last is sent or the client is gone (what the front calls, whatever happened)."""

    sent = 0

    async def aclose(self) -> None:
        """Stop making the answer (once): its maker's cleanup runs."""


#: What an invoking route answers: a :data:`Reply`, or on the event loop one whose body is made as it is sent.
Answer = tuple[int, Headers, "Iterable[codecs.Buffer] | Piecewise"]


class Invoke(Protocol):
    """What an invoking route is handed: the lifecycle's invocation of ``target`` for its request (the body read,
    the deadline, drain, model slot, micro-batching). A protocol's ``framing`` decodes the body and encodes the
    answer in place of ``input_fn`` and ``output_fn``."""

    def __call__(self, target: Target, framing: Framing | None = None) -> Awaitable[Answer]: ...


class Invoking(NamedTuple):
    """A route that invokes the model, written once for both request paths: ``function(request, invoke)`` is a
    coroutine function that awaits nothing but ``invoke``. An event-loop front awaits it on the loop; the WSGI app
    runs it to its end at once (:func:`at_once`), its ``invoke`` being the thread's own, which never suspends."""

    function: Callable[[Request, Invoke], Coroutine[Any, Any, Answer]]
    #: For a route that answers what its invocation answers (:meth:`of`): the request's target, which the WSGI app
    #: invokes without a coroutine (their making and driving cost 4% of a small request's instructions there).
    target: Callable[[Request], Target] | None = None

    @classmethod
    def of(cls, target: Callable[[Request], Target]) -> Invoking:
        """The route that invokes ``target(request)`` and answers what the invocation answers."""

        async def function(request: Request, invoke: Invoke) -> Answer:
            return await invoke(target(request))

        return cls(function, target)


def at_once(coroutine: Coroutine[Any, Any, Answer]) -> Answer:
    """The answer of an invoking route's coroutine that finishes without suspending (under WSGI); a RuntimeError if
    it suspends (it awaited something other than its ``invoke``)."""
    try:
        coroutine.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coroutine.close()
    raise RuntimeError("an invoking route awaited something other than its invoke on the WSGI path")


class Body:
    """A response body whose cleanups run once when the server is done with it: WSGI servers call ``close()`` after
    the last byte, or when the client went away (PEP 3333; werkzeug's ``ClosingIterator`` relies on it, and so do
    gunicorn and granian). Iterating it is a list's iteration: no Python frame per item on the server's path."""

    __slots__ = ("_cleanups", "_items", "_source", "sent")

    def __init__(self, items: Iterable[codecs.Buffer], *cleanups: Callable[[], object]) -> None:
        self._items = self._source = items
        self._cleanups = list(cleanups)
        #: Bytes handed to the server so far, counted for an answer made as it is sent (see :meth:`prepare`).
        self.sent = 0

    def prepare(self, as_bytes: bool, hand_over: bool = False) -> Iterable[codecs.Buffer]:
        """What to give the server: every item ``bytes`` or a flat buffer, the kinds both servers send without a slow
        path (see :data:`PIECE`). A whole answer over :data:`PIECE` bytes is cut into pieces copied as they are sent;
        a smaller one is made ``bytes`` now (``as_bytes``: PEP 3333's servers, gunicorn), or, with ``hand_over`` and
        at most :data:`HAND_OVER` bytes, for a server that sends a list whole at once and never closes it (granian:
        a small ``list`` is its fast path), handed over as a list of flat buffers, its cleanups run now; else
        joined into one ``bytes``. Items made as the answer is sent become ``bytes`` as they come,
        counted in :attr:`sent`."""
        if not self.whole:
            self._items = self._counted(self._items)
            return self
        items = list(self._items)  # (a list or a tuple)
        size = sum(len(chunk) if type(chunk) is bytes else memoryview(chunk).nbytes for chunk in items)
        if size > PIECE:
            self._items = _pieces(items)
        elif as_bytes:
            self._items = [chunk if type(chunk) is bytes else bytes(chunk) for chunk in items]
        elif hand_over and size <= HAND_OVER:
            self.close()
            return [chunk if type(chunk) is bytes else _contiguous(chunk) for chunk in items]
        elif len(items) != 1 or type(items[0]) is not bytes:
            self._items = [b"".join(chunk if type(chunk) is bytes else _contiguous(chunk) for chunk in items)]
        return self

    def _counted(self, items: Iterable[codecs.Buffer]) -> Iterator[codecs.Buffer]:
        for chunk in items:
            chunk = chunk if type(chunk) is bytes else bytes(chunk)
            self.sent += len(chunk)
            yield chunk

    @property
    def whole(self) -> bool:
        """Every item is here already (a list), as opposed to made as the body is sent (an iterator)."""
        return type(self._source) in (list, tuple)

    def add(self, cleanup: Callable[[], object]) -> None:
        """Run ``cleanup`` too, after the others."""
        self._cleanups.append(cleanup)

    def __iter__(self) -> Iterator[codecs.Buffer]:
        return iter(self._items)

    def close(self) -> None:
        """Close the items if they can be, then run the cleanups (once, whoever calls first)."""
        cleanups, self._cleanups = self._cleanups, []
        close = getattr(self._source, "close", None)
        try:
            if cleanups and close is not None:
                close()
        finally:
            for cleanup in cleanups:
                cleanup()


def _pieces(items: Iterable[codecs.Buffer]) -> Iterator[bytes]:
    """A large answer's bytes in pieces of at most :data:`PIECE` bytes, each copied when the server asks for it."""
    for chunk in items:
        view = _contiguous(chunk)
        for start in range(0, view.nbytes, PIECE):
            yield view[start : start + PIECE].tobytes()


def _contiguous(chunk: codecs.Buffer) -> memoryview:
    """``chunk`` as a flat view of its bytes (a copy when it is strided)."""
    view = memoryview(chunk)
    return view.cast("B") if view.c_contiguous else memoryview(view.tobytes())


def close(body: Iterable[codecs.Buffer]) -> None:
    """Close a body that will not be sent (HEAD, or a body turned into another answer)."""
    close = getattr(body, "close", None)
    if close is not None:
        close()


#: Answers smaller than this are sent as they are, whatever ``Accept-Encoding`` allows: compressing them gains little.
COMPRESS_FROM = 1024
#: zlib's compression level for answers: its fastest (as web servers' defaults), a server's CPU being the model's.
#: JSON of numbers shrinks 3-5x at it.
_LEVEL = 1
#: The media types compressed when the client asks: text (JSON, CSV, JSON Lines, ...). Arrays in binary formats
#: (``.npy``, ``.npz``, Arrow, a v2 answer with binary tensors) shrink little for what compressing them costs.
_TEXTUAL = ("text/", "application/json", "application/jsonlines", "application/x-ndjson", "application/problem+json")


def compressed(environ: WSGIEnvironment, headers: list[tuple[str, str]], body: Any) -> Any:
    """``body`` gzip or deflate compressed, with ``headers`` changed to say so (``Content-Encoding``,
    ``Content-Length``, ``Vary``), when the client's ``Accept-Encoding`` allows it, the answer is text, whole (not a
    stream) and of at least :data:`COMPRESS_FROM` bytes; else ``body`` as it is."""
    if isinstance(body, Body):
        if not body.whole:
            return body
        items = body._source  # (this module's own)
    elif type(body) is list or type(body) is tuple:
        items = body
    else:
        return body
    coding = _coding(environ.get("HTTP_ACCEPT_ENCODING", ""))
    if coding is None:
        return body
    media_type, length_at = "", None
    for index, (name, value) in enumerate(headers):
        lowered = name.lower()
        if lowered == "content-encoding":
            return body
        if lowered == "content-type":
            media_type = value.partition(";")[0].strip().lower()
        elif lowered == "content-length":
            length_at = index
    if not media_type.startswith(_TEXTUAL):
        return body
    data = b"".join(items)
    if len(data) < COMPRESS_FROM:
        return body
    packed = gzip.compress(data, _LEVEL, mtime=0) if coding == "gzip" else zlib.compress(data, _LEVEL)
    if length_at is not None:
        headers[length_at] = ("Content-Length", str(len(packed)))
    headers += [("Content-Encoding", coding), ("Vary", "Accept-Encoding")]
    if isinstance(body, Body):  # (its cleanups stay)
        body._items = body._source = [packed]
        return body
    return [packed]


def _coding(accepted: str) -> str | None:
    """The coding to answer in, of those ``Accept-Encoding`` allows (``q`` above 0): gzip, else deflate; None."""
    allowed: dict[str, float] = {}
    for item in accepted.lower().split(","):
        name, _, parameters = item.partition(";")
        quality = 1.0
        for parameter in parameters.split(";"):
            key, _, value = parameter.partition("=")
            if key.strip() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        allowed[name.strip()] = quality
    for coding in ("gzip", "deflate"):
        if allowed.get(coding, allowed.get("*", 0.0)) > 0:
            return coding
    return None


def json_reply(status: int, value: Any, headers: Headers | None = None) -> Reply:
    body = orjson.dumps(value)
    return status, [("Content-Type", "application/json"), ("Content-Length", str(len(body))), *(headers or [])], [body]


class Problem(NamedTuple):
    """What went wrong with a request, before a protocol writes it: SageMaker's routes as JSON (:meth:`reply`),
    SageMaker Runtime as a 424 ``ModelError`` around that JSON, the Open Inference Protocol as ``{"error"}``."""

    status: int
    #: What went wrong (None only for a werkzeug exception made without a description).
    message: str | None
    request_id: str
    #: Headers the answer must carry whatever its protocol (405's ``Allow``, 503's ``Retry-After``).
    headers: Headers
    #: With ``--debug``, the traceback of a 500's cause.
    traceback: str | None = None

    def reply(self) -> Reply:
        """The problem as the SageMaker routes answer it: ``{"message", "request_id", "status"}`` (and
        ``"traceback"`` with ``--debug``)."""
        answer: dict[str, Any] = {"message": self.message, "request_id": self.request_id, "status": self.status}
        if self.traceback is not None:
            answer["traceback"] = self.traceback
        return json_reply(self.status, answer, list(self.headers))


def problem_for(exc: Exception, request_id: str, environ: WSGIEnvironment, debug: bool = False) -> Problem:
    """The problem an exception is: HTTP exceptions keep their status and message; anything else is a 500, logged
    in full.

    The 500's message names the failing hook and its exception's class, never the exception's message or traceback
    (they may hold request data) unless ``debug``.
    """
    if isinstance(exc, werkzeug.exceptions.HTTPException):  # werkzeug's own may carry headers (405's Allow)
        status = exc.code or 500
        headers = [(k, v) for k, v in exc.get_headers() if k.lower() != "content-type"]
        return Problem(status, exc.description, request_id, headers)
    if isinstance(exc, HTTPError):
        return Problem(exc.code or 500, exc.description, request_id, list(getattr(exc, "headers", ())))
    where = f"{environ['REQUEST_METHOD']} {environ.get('PATH_INFO')}"
    if isinstance(exc, HookError):
        logger.error("Request %s %s: %s", request_id, where, exc.summary, exc_info=exc.error)
        message, cause = f"{exc.summary}; see the server log for request {request_id}", exc.error
    else:
        logger.error("Request %s %s failed", request_id, where, exc_info=exc)
        message, cause = f"the server failed ({type(exc).__name__}); see the server log for request {request_id}", exc
    if not debug:
        return Problem(500, message, request_id, [])
    details = "".join(traceback.format_exception(cause))
    return Problem(500, f"{message}: {type(cause).__name__}: {cause}", request_id, [], details)


def error_for(exc: Exception, request_id: str, environ: WSGIEnvironment, debug: bool = False) -> Reply:
    """The SageMaker routes' reply for an exception (see :func:`problem_for`)."""
    return problem_for(exc, request_id, environ, debug).reply()
