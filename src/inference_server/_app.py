"""The WSGI application: routing, one request's life (body, deadline, model slot), and exceptions as responses.

The hooks themselves run in :mod:`inference_server._pipeline`, which knows nothing of HTTP.
"""

from __future__ import annotations

import functools
import http
import importlib.resources
import logging
import random
import re
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

import orjson
import pluggy
import werkzeug.exceptions

from inference_server import _deadlines, _plugins, batching, codecs
from inference_server._pipeline import Pipeline
from inference_server._settings import Settings
from inference_server.errors import (
    BadRequest,
    GatewayTimeout,
    HookError,
    HTTPError,
    PayloadTooLarge,
    RequestTimeout,
    ServiceUnavailable,
    URITooLong,
)

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

logger = logging.getLogger("inference_server")

Headers = list[tuple[str, str]]
#: What a route handler returns: status code, headers, body as a list of bytes-like buffers.
Reply = tuple[int, Headers, list[codecs.Buffer]]
Handler = Callable[["WSGIEnvironment", str], Reply]

_STATUS_LINES = {status.value: f"{status.value} {status.phrase}" for status in http.HTTPStatus}
_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,200}")
_READ_BLOCK = 1 << 20
_MB = 1 << 20
#: How the operator raises the body limit, said in every 413.
_RAISE = "; the server's operator can raise it with SAGEMAKER_MAX_PAYLOAD_IN_MB or the max_payload_in_mb hook"
_EMPTY = (("Content-Type", "text/plain"), ("Content-Length", "0"))
CUSTOM_ATTRIBUTES = "X-Amzn-SageMaker-Custom-Attributes"
#: Seconds ``ping_fn`` (and the model check) may take before /ping answers 503; SageMaker waits 2 s in all.
PING_TIMEOUT = 1.0
#: Seconds an overrunning request's work may go on after its 504 before the worker is replaced.
RECYCLE_GRACE = 2.0
#: Bytes of path and query string a request may have (414 beyond).
MAX_URL_BYTES = 8192


class WorkerState(Protocol):
    """What the app needs of the serving process's shared state (``server._state.Worker`` when ``serve`` runs it)."""

    @property
    def draining(self) -> bool: ...

    @property
    def draining_since(self) -> float: ...

    def enter(self) -> None: ...

    def leave(self) -> None: ...

    def request_recycle(self, reason: str) -> None: ...


class App:
    """The inference-server WSGI application for one set of settings and plugins."""

    def __init__(
        self,
        settings: Settings,
        pm: pluggy.PluginManager,
        *,
        bytes_only: bool = True,
        read_on_server_thread: bool = False,
        check_head: bool = False,
    ) -> None:
        self.settings = settings
        self.pm = pm
        #: Copy body buffers to ``bytes`` as PEP 3333 requires; False hands servers the arrays' own memory.
        self.bytes_only = bytes_only
        #: Read the body on the server's own thread, not on the helper that has a deadline (granian: its body read,
        #: called from a thread of ours, stalls the whole worker while the client is slow to send). The body then has
        #: no deadline of ours (no 408) and ``--timeout`` counts from its arrival.
        self.read_on_server_thread = read_on_server_thread
        #: Check the head here as RFC 9112 asks, for servers that do not: one Host header (none at all is an error
        #: in HTTP/1.1), and a header section within ``--max-header-bytes`` (granian's own bound is loose: a head
        #: that arrives in one large read passes up to about twice the size).
        self.check_head = check_head
        #: Sends ``100 Continue`` when the server leaves it to the app (gunicorn: only once the body is wanted).
        self.send_continue: Callable[[WSGIEnvironment], None] | None = None
        #: When the request reached the server (``time.monotonic()``), for servers that can say (gunicorn): one that
        #: was waiting for a server thread when the drain began is answered, not refused.
        self.arrival: Callable[[WSGIEnvironment], float | None] | None = None
        self.pipeline = Pipeline(settings, pm)
        self.execution_parameters = self.pipeline.execution_parameters
        self._routes: dict[str, dict[str, Handler]] = {
            "/ping": {"GET": self._ping},
            "/invocations": {"POST": self._invocations},
            "/execution-parameters": {"GET": self._execution_parameters},
            "/openapi.json": {"GET": self._openapi},
        }
        #: This process's share of the server's state when ``serve`` runs it (drain flag, requests in flight).
        self.worker: WorkerState | None = None
        self._timeout = settings.timeout or None
        self._model_slots = threading.BoundedSemaphore(settings.threads)
        names = {"max_batch_size": "max_batch_size", "max_batch_delay": "max_batch_delay_ms", "max_queue": "max_queue"}
        given = {key: getattr(settings, name) for name, key in names.items()}
        chosen = frozenset(names[name] for name in settings.given if name in names)
        #: Micro-batching (off unless asked for): then ``predict_fn`` runs in groups, ``--threads`` at once.
        self.batching = batching.options(given, chosen, pm.hook.batching(), settings.threads)
        self.batcher = (
            batching.Batcher.for_hooks(self.batching, pm, self.pipeline.predict) if self.batching.enabled else None
        )
        self._helpers = _deadlines.Pool("request")
        self._pings = _deadlines.Pool("ping")
        self._told_no_content_type = False

    def model(self) -> Any:
        """The loaded model (loading it now if needed)."""
        return self.pipeline.model()

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[codecs.Buffer]:
        """Answer one request; with ``bytes_only=False`` the body items are buffers (an array's own memory)."""
        request_id = environ.get("HTTP_X_REQUEST_ID", "")
        if not _REQUEST_ID.fullmatch(request_id):
            request_id = f"{random.getrandbits(128):032x}"  # unique enough for logs; cheaper than uuid4
        method = environ["REQUEST_METHOD"]
        try:
            status, headers, body = self._dispatch(environ, method, request_id)
        except Exception as exc:
            status, headers, body = _error_for(exc, request_id, environ, self.settings.debug)
        headers.append(("X-Request-Id", request_id))
        custom_attributes = environ.get("HTTP_X_AMZN_SAGEMAKER_CUSTOM_ATTRIBUTES")
        if custom_attributes and not any(k.lower() == CUSTOM_ATTRIBUTES.lower() for k, _ in headers):
            headers.append((CUSTOM_ATTRIBUTES, custom_attributes))
        start_response(_STATUS_LINES.get(status, f"{status} Unknown"), headers)
        if method == "HEAD":
            return []
        if self.bytes_only:
            return [chunk if isinstance(chunk, bytes) else bytes(chunk) for chunk in body]
        return body

    def _dispatch(self, environ: WSGIEnvironment, method: str, request_id: str) -> Reply:
        path = environ.get("PATH_INFO") or "/"
        if len(path) + len(environ.get("QUERY_STRING", "")) > MAX_URL_BYTES:
            raise URITooLong(f"the path and query are longer than {MAX_URL_BYTES} bytes")
        if self.check_head:
            host = environ.get("HTTP_HOST")
            if host is None and environ.get("SERVER_PROTOCOL") == "HTTP/1.1":
                raise BadRequest("an HTTP/1.1 request must have a Host header (RFC 9112, section 3.2)")
            if host is not None and "," in host:  # granian joins repeated headers with commas
                raise BadRequest("a request must have one Host header, not several (RFC 9112, section 3.2)")
            size = sum([len(k) + len(v) for k, v in environ.items() if k[:5] == "HTTP_"])  # ~ the header section
            if size > self.settings.max_header_bytes:
                raise werkzeug.exceptions.RequestHeaderFieldsTooLarge(
                    f"the headers are larger than {self.settings.max_header_bytes} bytes (--max-header-bytes)"
                )
        methods = self._routes.get(path)
        if methods is None and path.startswith("/endpoints/") and path.endswith("/invocations"):
            methods = {"POST": self._runtime_invocations}  # SageMaker Runtime's InvokeEndpoint, any endpoint name
        if methods is None:
            raise werkzeug.exceptions.NotFound(f"no such path: the routes are {', '.join(self._routes)}")
        handler = methods.get("GET" if method == "HEAD" else method)
        if handler is None:
            allowed = sorted({*methods, *(["HEAD"] if "GET" in methods else [])})
            raise werkzeug.exceptions.MethodNotAllowed(allowed, f"{method} is not allowed here")
        return handler(environ, request_id)

    def _ping(self, environ: WSGIEnvironment, request_id: str) -> Reply:
        """200 when the model is loaded, ``ping_fn`` says yes within PING_TIMEOUT and the server is not draining."""
        if self.worker is not None and self.worker.draining:
            return 503, list(_EMPTY), []
        if self._pings.overrunning:
            logger.warning("Ping: an earlier check has been running for over %s s; answering 503", PING_TIMEOUT)
            return 503, list(_EMPTY), []
        deadline = time.monotonic() + PING_TIMEOUT
        try:
            healthy = self._pings.run(self.pipeline.healthy, lambda: deadline)
        except _deadlines.TimedOut:
            logger.warning("Ping: the model check took longer than %s s; answering 503", PING_TIMEOUT)
            healthy = False
        return (200 if healthy else 503), list(_EMPTY), []

    def _openapi(self, environ: WSGIEnvironment, request_id: str) -> Reply:
        body = _openapi_document()
        return 200, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))], [body]

    def _execution_parameters(self, environ: WSGIEnvironment, request_id: str) -> Reply:
        return _json_reply(200, self.execution_parameters)

    def _runtime_invocations(self, environ: WSGIEnvironment, request_id: str) -> Reply:
        """``/invocations`` as SageMaker Runtime answers it: a container error becomes 424 ``ModelError``."""
        try:
            status, headers, body = self._invocations(environ, request_id)
        except Exception as exc:
            status, headers, body = _error_for(exc, request_id, environ, self.settings.debug)
        if status < 400:
            headers.append(("X-Amzn-Invoked-Production-Variant", "AllTraffic"))
            return status, headers, body
        original = b"".join(bytes(chunk) for chunk in body).decode(errors="replace")
        kind = "client" if status < 500 else "server"
        return _json_reply(
            424,
            {
                "ErrorCode": f"{kind.upper()}_ERROR_FROM_MODEL",
                "OriginalStatusCode": status,
                "OriginalMessage": original,
                "Message": f'Received {kind} error ({status}) from model with message "{original}".',
            },
            [("x-amzn-ErrorType", "ModelError")],
        )

    def _invocations(self, environ: WSGIEnvironment, request_id: str) -> Reply:
        worker = self.worker
        if worker is None:
            return self._bounded(environ, request_id)
        worker.enter()
        try:
            if worker.draining and not self._arrived_before(worker.draining_since, environ):
                raise ServiceUnavailable("the server is shutting down; send the request again")
            return self._bounded(environ, request_id)
        finally:
            worker.leave()

    def _arrived_before(self, moment: float, environ: WSGIEnvironment) -> bool:
        """Whether the request had reached the server before ``moment`` (then a drain answers it), as far as the
        server says (``arrival``); without it, requests that reach the app after the drain began are refused."""
        arrived = self.arrival(environ) if self.arrival is not None else None
        return arrived is not None and arrived < moment

    def _bounded(self, environ: WSGIEnvironment, request_id: str) -> Reply:
        """Invoke on a helper thread and answer 408 or 504 if it overruns ``--read-timeout`` or ``--timeout``."""
        if self._timeout is None:
            return self._invoke(environ, None)
        body = read_body(environ, self.pipeline.max_body, self.send_continue) if self.read_on_server_thread else None
        call = _deadlines.Call()
        start = time.monotonic()
        limit = min(self._timeout, self.settings.read_timeout)
        read_deadline, deadline = start + limit, start + self._timeout
        if body is not None:
            read_deadline = deadline  # read already

        def current_deadline() -> float:
            return read_deadline if call.stage == _deadlines.READING else deadline

        try:
            return self._helpers.run(functools.partial(self._invoke, environ, call, body), current_deadline)  # type: ignore[no-any-return]
        except _deadlines.TimedOut as exc:
            stage = call.cancel()
            if stage == _deadlines.READING:
                raise RequestTimeout(f"the request body did not arrive within {limit} s") from None
            if stage == _deadlines.RUNNING:  # replace the worker if the work goes on much longer
                timer = threading.Timer(RECYCLE_GRACE, self._recycle_if_stuck, (exc.helper, request_id))
                timer.daemon = True
                timer.start()
            raise GatewayTimeout(
                f"the request took longer than the server's timeout of {self._timeout} s (while {stage})"
            ) from None

    def _recycle_if_stuck(self, helper: Any, request_id: str) -> None:
        if not helper.abandoned:
            return
        reason = f"request {request_id} was still running {RECYCLE_GRACE} s after its timeout"
        if self.worker is not None:
            self.worker.request_recycle(reason)
        else:
            logger.error("%s; this process cannot be replaced (it was not started by inference-server serve)", reason)

    def _invoke(self, environ: WSGIEnvironment, call: _deadlines.Call | None, body: bytearray | None = None) -> Reply:
        if body is None:
            body = read_body(environ, self.pipeline.max_body, self.send_continue)
        model = self.model()
        content_type = environ.get("CONTENT_TYPE")
        if not content_type:
            content_type = "application/octet-stream"
            if not self._told_no_content_type:  # once per worker: a hint, not a complaint per request
                self._told_no_content_type = True
                logger.info(
                    "A request came without Content-Type, so the model receives its body as bytes (as %s); "
                    "known types: %s",
                    content_type,
                    ", ".join(codecs.media_types()),
                )
        accept = environ.get("HTTP_ACCEPT") or "*/*"
        if self.batcher is not None:
            output = self._batched(self.batcher, body, content_type, accept, model, call)
        elif call is None:
            with self._model_slots:
                output = self.pipeline.invoke(body, content_type, accept, model)
        else:
            call.take_slot(self._model_slots)
            try:
                output = self.pipeline.invoke(body, content_type, accept, model)
            finally:
                call.give_back()
        headers = [("Content-Type", output.media_type), ("Content-Length", str(output.nbytes)), *output.headers]
        return 200, headers, output.buffers

    def _batched(
        self,
        batcher: batching.Batcher,
        body: bytearray,
        content_type: str,
        accept: str,
        model: Any,
        call: _deadlines.Call | None,
    ) -> Any:
        """The hooks with ``predict_fn`` run by the batcher: ``input_fn`` and ``output_fn`` on this thread."""
        batcher.coming()
        sent = False

        def predict(data: Any) -> Any:
            nonlocal sent
            sent = True
            return batcher.predict(data, model, call, coming=True)

        try:
            return self.pipeline.invoke(body, content_type, accept, model, predict)
        finally:
            if not sent:
                batcher.gone()


@functools.cache
def _openapi_document() -> bytes:
    """The OpenAPI description of the HTTP interface (``docs/openapi.yaml``, shipped as JSON)."""
    return importlib.resources.files("inference_server").joinpath("openapi.json").read_bytes()


def _json_reply(status: int, value: Any, headers: Headers | None = None) -> Reply:
    body = orjson.dumps(value)
    return status, [("Content-Type", "application/json"), ("Content-Length", str(len(body))), *(headers or [])], [body]


def _error_for(exc: Exception, request_id: str, environ: WSGIEnvironment, debug: bool = False) -> Reply:
    """The reply for an exception: HTTP exceptions keep their status; anything else is a 500, logged in full.

    The 500's message names the failing hook and its exception's class, never the exception's message or traceback
    (they may hold request data) unless ``debug``.
    """
    if isinstance(exc, (HTTPError, werkzeug.exceptions.HTTPException)):
        return _error_reply(exc, request_id)
    where = f"{environ['REQUEST_METHOD']} {environ.get('PATH_INFO')}"
    if isinstance(exc, HookError):
        hint = f"; {exc.hint}" if exc.hint else ""
        logger.error("Request %s %s: %s%s", request_id, where, exc.summary, hint, exc_info=exc.error)
        message, cause = f"{exc.summary}; see the server log for request {request_id}{hint}", exc.error
    else:
        logger.error("Request %s %s failed", request_id, where, exc_info=exc)
        message, cause = f"the server failed ({type(exc).__name__}); see the server log for request {request_id}", exc
    answer: dict[str, Any] = {"message": message, "request_id": request_id, "status": 500}
    if debug:
        answer["message"] = f"{message}: {type(cause).__name__}: {cause}"
        answer["traceback"] = "".join(traceback.format_exception(cause))
    return _json_reply(500, answer)


def _error_reply(exc: HTTPError | werkzeug.exceptions.HTTPException, request_id: str) -> Reply:
    status = exc.code or 500
    _, headers, body = _json_reply(status, {"message": exc.description, "request_id": request_id, "status": status})
    if isinstance(exc, werkzeug.exceptions.HTTPException):  # werkzeug's own may carry headers (405's Allow)
        headers.extend((k, v) for k, v in exc.get_headers() if k.lower() != "content-type")
    else:
        headers.extend(getattr(exc, "headers", ()))
    return status, headers, body


def read_body(
    environ: WSGIEnvironment,
    limit: int | None,
    send_continue: Callable[[WSGIEnvironment], None] | None = None,
) -> bytearray:
    """Read the request body into one buffer, refusing bodies over ``limit`` bytes with 413.

    With a ``Content-Length`` the buffer is allocated once and a body over the limit is refused before any of it is
    read; a chunked body grows in large steps and is refused as soon as it passes the limit. ``send_continue`` is
    called, for a client that sent ``Expect: 100-continue``, once the body is going to be read (not before a 413).
    """
    stream = environ["wsgi.input"]
    if send_continue is not None and environ.get("HTTP_EXPECT", "").lower() == "100-continue":
        length_header = environ.get("CONTENT_LENGTH")
        if not (limit is not None and length_header and length_header.isdigit() and int(length_header) > limit):
            send_continue(environ)
    length_header = environ.get("CONTENT_LENGTH")
    if length_header:
        try:
            length = int(length_header)
            if length < 0:
                raise ValueError
        except ValueError:
            raise BadRequest(f"Content-Length {length_header!r} is not a byte count") from None
        if limit is not None and length > limit:
            raise PayloadTooLarge(f"the body is {length} bytes; the limit (MaxPayloadInMB) is {limit} bytes{_RAISE}")
        buffer = bytearray(length)
        view = memoryview(buffer)
        readinto = getattr(stream, "readinto", None)
        position = 0
        while position < length:
            end = min(length, position + _READ_BLOCK)
            if readinto is not None:
                count = readinto(view[position:end])
            else:
                chunk = stream.read(end - position)
                count = len(chunk)
                view[position : position + count] = chunk
            if not count:
                raise BadRequest(f"the body ended after {position} of {length} bytes (Content-Length)")
            position += count
        return buffer
    chunked = "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()
    if not (chunked or environ.get("wsgi.input_terminated")):
        return bytearray()  # no length and no framing: WSGI says there is no body to read
    buffer = bytearray()
    while chunk := _read(stream, _READ_BLOCK):
        buffer += chunk
        if limit is not None and len(buffer) > limit:
            raise PayloadTooLarge(f"the chunked body passed the limit (MaxPayloadInMB) of {limit} bytes{_RAISE}")
    return buffer


def _read(stream: Any, size: int) -> bytes:
    """``stream.read(size)``, where the server's own parse errors (a malformed chunk: its size, extension,
    terminator or trailer) are the client's fault, a 400, not a 500."""
    try:
        return stream.read(size)  # type: ignore[no-any-return]
    except OSError:
        raise
    except Exception as exc:
        raise BadRequest(f"the chunked body is malformed: {type(exc).__name__}: {exc}"[:300]) from None


def create_app(*, model_dir: str | None = None) -> App:
    """Return the WSGI application, configured from the environment (``model_dir`` overrides it)."""
    return App(Settings.from_env(model_dir=model_dir), _plugins.manager())


def warmup(*, model_dir: str | None = None) -> None:
    """Load the model now (once per process) instead of on the first request; returns None, as in 1.x."""
    create_app(model_dir=model_dir).model()
