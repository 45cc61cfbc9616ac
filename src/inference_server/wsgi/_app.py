"""The WSGI application: the request id, the route table, and exceptions turned into replies.

Each protocol module registers its routes (``register(app)``); what a request's invocation goes through lives in
:mod:`inference_server.wsgi._invoke`, and the hooks themselves run in :mod:`inference_server._pipeline`.
"""

from __future__ import annotations

import atexit
import functools
import logging
import multiprocessing.util
import random
import re
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

import pluggy
import werkzeug.exceptions

from inference_server import _logging, _plugins, _tracing, batching, codecs, metrics
from inference_server._pipeline import Pipeline
from inference_server._settings import Settings
from inference_server.errors import BadRequest, URITooLong
from inference_server.wsgi import async_invocations, models, prometheus, runtime, sagemaker, v2
from inference_server.wsgi._async import AsyncLifecycle
from inference_server.wsgi._body import BODY_BYTES, read_body, read_json_object, unsupported_coding
from inference_server.wsgi._invoke import (
    MODEL,
    Backend,
    Health,
    Lifecycle,
    ModelTargets,
    Target,
    WorkerState,
    target_model,
    target_model_header,
)
from inference_server.wsgi._onloop import OnLoop
from inference_server.wsgi._replies import (
    STATUS_LINES,
    Body,
    Handler,
    Invoking,
    Reply,
    Request,
    at_once,
    close,
    compressed,
    error_for,
)

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

    from inference_server._capture import Capture
    from inference_server._multimodel import MultiModel
    from inference_server._pipeline import Framing

__all__ = ["App", "Backend", "create_app", "warmup"]

_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,200}")
#: SageMaker's InvokeEndpoint ``TargetModel``: 1 to 1024 printable ASCII characters, the first not a space.
_TARGET_MODEL = re.compile(r"[\x21-\x7e][\x20-\x7e]{0,1023}")
CUSTOM_ATTRIBUTES = "X-Amzn-SageMaker-Custom-Attributes"
#: Bytes of path and query string a request may have (414 beyond).
MAX_URL_BYTES = 8192
#: The protocols every app serves, each a module with ``register(app)``.
PROTOCOLS = (sagemaker, runtime, async_invocations, models, v2, prometheus)
INFERENCE_ID = "HTTP_X_AMZN_SAGEMAKER_INFERENCE_ID"
#: The environ key under which the app notes the route (pattern) a request matched.
ROUTE = "inference_server.route"
#: The size of the request's head as its client wrote it, where the front measured it.
HEAD_BYTES = "inference_server.head_bytes"
#: The headers a WSGI environ has without the ``HTTP_`` prefix.
_BODY_HEADERS = frozenset(("CONTENT_TYPE", "CONTENT_LENGTH"))
#: Routes whose access-log lines are at debug level: health checks and scrapes would flood the log.
QUIET_ROUTES = frozenset(("/ping", "/metrics"))
_new_request: Callable[[type[Request], tuple[Any, ...]], Request] = tuple.__new__


#: A route's handler: a plain one (on a thread), or one that invokes the model (on the event loop on a front).
Route = Handler | Invoking


class _Pattern(NamedTuple):
    """A path with ``{name}`` segments, split once: where its literal segments are, and where its names are."""

    path: str
    literals: tuple[tuple[int, str], ...]
    names: tuple[tuple[int, str], ...]
    methods: dict[str, Route]


class Routes:
    """Method handlers by path: exact paths, and patterns whose ``{name}`` segments match one non-empty segment."""

    def __init__(self) -> None:
        self._exact: dict[str, dict[str, Route]] = {}
        #: The patterns by their number of segments, each list in the order they were added.
        self._patterns: dict[int, list[_Pattern]] = {}
        self._order: list[str] = []

    def add(self, path: str, handler: Route, method: str) -> None:
        if "{" not in path:
            self._exact.setdefault(path, {})[method] = handler
            return
        segments = path.split("/")
        same_length = self._patterns.setdefault(len(segments), [])
        for pattern in same_length:
            if pattern.path == path:
                pattern.methods[method] = handler
                return
        is_name = [segment[:1] == "{" and segment[-1:] == "}" for segment in segments]
        literals = tuple((i, segment) for i, segment in enumerate(segments) if not is_name[i])
        names = tuple((i, segment[1:-1]) for i, segment in enumerate(segments) if is_name[i])
        same_length.append(_Pattern(path, literals, names, {method: handler}))
        self._order.append(path)

    def match(self, path: str) -> tuple[str, dict[str, Route], dict[str, str]] | None:
        """The route (``path`` or the pattern it matches), its handlers by method and the values of its pattern's
        segments, or None."""
        methods = self._exact.get(path)
        if methods is not None:
            return path, methods, {}
        parts = path.split("/")
        for pattern in self._patterns.get(len(parts), ()):
            for index, literal in pattern.literals:
                if parts[index] != literal:
                    break
            else:
                if all(parts[index] for index, _ in pattern.names):  # (each name matches a non-empty segment)
                    return pattern.path, pattern.methods, {name: parts[index] for index, name in pattern.names}
        return None

    def paths(self) -> list[str]:
        """Every path and pattern, in the order they were added."""
        return [*self._exact, *self._order]


class App:
    """The inference-server WSGI application for one set of settings and plugins."""

    def __init__(self, settings: Settings, pm: pluggy.PluginManager, backend: Backend | None = None) -> None:
        self.settings = settings
        self.backend = backend or Backend()
        self._tracing = tracing = _tracing.create()
        #: Where requests are counted (``--metrics``), else None.
        self.recorder = recorder = metrics.recorder if settings.metrics else None
        self.pipeline = Pipeline(
            settings,
            pm,
            stage=tracing.stage if tracing is not None else None,
            timed=recorder.timed if recorder is not None else None,
        )
        #: The model that ``/invocations`` serves.
        self.target = Target.serving(self.pipeline, settings)
        self.lifecycle = Lifecycle(settings, self.backend)
        if settings.data_capture is not None:
            self.lifecycle.captures = _capturing(settings, recorder)
        self._loop_lifecycle: AsyncLifecycle | None = None
        self._on_loop = (
            OnLoop(self.loop_lifecycle, lambda: self.pipeline.max_body, self.backend.arrival)
            if self.backend.on_loop
            else None
        )
        #: The models of a multi-model endpoint (``--multi-model``, ``--model-root``), else None.
        self.multi_model = _multi_model(self.pipeline, settings)
        models = self.multi_model
        self._model_targets = None if models is None else ModelTargets(self.pipeline, models, self.target.batcher)
        if recorder is not None:
            recorder.max_models = settings.metrics_max_models
        self._access_log = settings.access_log
        self._edge = self.recorder is not None or settings.access_log or self._tracing is not None
        #: Whether the server can take requests (``/ping``, and the Open Inference Protocol's readiness).
        self.health = Health(self.lifecycle, self.pipeline, settings)
        self.routes = Routes()
        for protocol in PROTOCOLS:
            protocol.register(self)

    @property
    def loop_lifecycle(self) -> AsyncLifecycle:
        """The invocations' lifecycle on the worker's event loop (the fronts', and gunicorn's: ``Backend.on_loop``)."""
        if self._loop_lifecycle is None:
            self._loop_lifecycle = AsyncLifecycle(self.lifecycle)
        return self._loop_lifecycle

    @property
    def pm(self) -> pluggy.PluginManager:
        """The plugins whose hooks the app runs (the script's first, if it serves one)."""
        return self.pipeline.pm

    @property
    def batching(self) -> batching.Options:
        """How ``/invocations`` is micro-batched (off unless asked for)."""
        return self.target.batcher.options if self.target.batcher is not None else batching.Options()

    @property
    def execution_parameters(self) -> dict[str, Any]:
        return self.pipeline.execution_parameters

    @property
    def worker(self) -> WorkerState | None:
        """This process's share of the server's state when ``serve`` runs it (drain flag, requests in flight)."""
        return self.lifecycle.worker

    @worker.setter
    def worker(self, worker: WorkerState | None) -> None:
        self.lifecycle.worker = worker

    def route(self, path: str, handler: Route, method: str = "GET") -> None:
        """Answer ``method`` requests for ``path`` (``{name}`` segments match any one segment) with ``handler``;
        GET routes answer HEAD too. A handler that invokes the model is an :class:`Invoking` (on the event loop on a
        front)."""
        self.routes.add(path, handler, method)
        if type(handler) is Invoking and self.recorder is not None:
            self.recorder.invocation_routes.add(path)

    def read_json(
        self, environ: WSGIEnvironment, limit: int, example: str = "", empty_ok: bool = False
    ) -> dict[str, Any]:
        """A control route's body (at most ``limit`` bytes) as a JSON object, else a 400 saying what is wrong
        (``example``: what the object looks like); an empty body is ``{}`` when ``empty_ok``."""
        return read_json_object(environ, limit, self.backend.body, example, empty_ok)

    def read_body(self, environ: WSGIEnvironment, limit: int) -> bytearray | bytes:
        """A control route's body, at most ``limit`` bytes (else 413)."""
        return read_body(environ, limit, self.backend.body)

    def model(self) -> Any:
        """The loaded model (loading it now if needed)."""
        return self.pipeline.model()

    def model_target(self, name: str, target_model: bool = False) -> Target:
        """What an invocation of the multi-model endpoint's model ``name`` runs (see :class:`ModelTargets`)."""
        assert self._model_targets is not None
        return self._model_targets.get(name, target_model)

    def invoked(self, request: Request) -> Target:
        """What ``/invocations`` (and SageMaker Runtime's route) runs: the app's model, or the request's ``TargetModel``
        under ``--model-root``. A ``TargetModel`` is never ignored: one that SageMaker's InvokeEndpoint would refuse
        is a 400, and so is any on a server of one model (SageMaker refuses it for an endpoint of one model).
        granian hands the app a header value that is not visible ASCII as an empty one; both are refused alike."""
        name = target_model_header(request.environ)
        if name is None:
            return self.target
        if not _TARGET_MODEL.fullmatch(name):
            raise BadRequest(
                "the TargetModel (X-Amzn-SageMaker-Target-Model) must be 1 to 1024 printable ASCII characters, the "
                "first not a space, as SageMaker's InvokeEndpoint requires"
            )
        if self.multi_model is None:
            raise BadRequest(
                f"TargetModel {name!r} was given, but this server serves one model (SageMaker refuses a TargetModel "
                "for an endpoint of one model): start it with --model-root DIR (DIR/<TargetModel> holds each model) "
                "to serve a multi-model endpoint"
            )
        request.environ[MODEL] = name
        return self.model_target(name, target_model=True)

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[codecs.Buffer]:
        """Answer one request; with ``bytes_only=False`` the body items are buffers (an array's own memory).

        The edge: what is measured of every request (metrics, the access-log line, the trace's span) is recorded by
        :meth:`finish` once the answer is handed to the server: when this returns, or, for an answer made as it is
        sent (an iterator), when the server closes it.
        """
        started = time.perf_counter()
        request_id = request_id_of(environ)
        method = environ["REQUEST_METHOD"]
        bound = _logging.REQUEST.set((request_id, environ.get(INFERENCE_ID)))  # (_logging.bind, without its call)
        span = self._tracing.request(environ, request_id) if self._tracing is not None else None
        try:
            try:
                status, headers, body = self._dispatch(environ, method, request_id)
            except Exception as exc:
                status, headers, body = error_for(exc, request_id, environ, self.settings.debug)
            answered(headers, environ, request_id)
            if "HTTP_ACCEPT_ENCODING" in environ:
                body = compressed(environ, headers, body)
            start_response(STATUS_LINES.get(status) or f"{status} Unknown", headers)
        finally:
            _logging.REQUEST.reset(bound)
            if span is not None:
                span.detach()
        if self._edge:
            record = self.record(environ, method, status, headers, started)
            kind = type(body)
            if kind is list or kind is tuple or (isinstance(body, Body) and body.whole):
                self.finish(record, environ, request_id, span)  # the whole answer is handed to the server now
            else:  # an answer made as it is sent: done when the server closes it
                body = body if isinstance(body, Body) else Body(body)
                body.add(functools.partial(self._finish_sent, record, body, environ, request_id, span))
        if method == "HEAD":
            close(body)
            return []
        kind = type(body)
        if kind is list or kind is tuple:
            if self.backend.bytes_only:
                return [chunk if isinstance(chunk, bytes) else bytes(chunk) for chunk in body]
            return body
        body = body if isinstance(body, Body) else Body(body)  # (made as it is sent: converted as it comes)
        return body.prepare(self.backend.bytes_only, hand_over=not self.backend.closes_lists)

    @property
    def edge(self) -> bool:
        """Whether what is measured of every request is recorded (metrics, access log or tracing)."""
        return self._edge

    @property
    def tracing(self) -> _tracing.Tracing | None:
        return self._tracing

    def record(
        self,
        environ: WSGIEnvironment,
        method: str,
        status: int,
        headers: list[tuple[str, str]],
        started: float,
        sent: int | None = None,
    ) -> tuple[Any, ...]:
        """What :meth:`finish` records of a request: its answer's size is ``sent``, or its ``Content-Length``."""
        if sent is None:
            sent = 0
            for name, value in headers:
                if name == "Content-Length":
                    sent = int(value)
                    break
        route = environ.get(ROUTE, metrics.OTHER)
        return (route, method, status, started, environ.get(BODY_BYTES, 0), sent, environ.get(MODEL, ""))

    def refused(self, environ: WSGIEnvironment, status: int, started: float) -> None:
        """A request a front answered ``status`` without calling the app (a gRPC message that does not parse):
        counted and logged as the app's own refusals before a route are (route ``other``), its body's size from its
        ``CONTENT_LENGTH``. ``started``: ``time.perf_counter()`` when it arrived."""
        if not self._edge:
            return
        request_id = request_id_of(environ)
        environ[BODY_BYTES] = int(environ.get("CONTENT_LENGTH") or 0)
        bound = _logging.REQUEST.set((request_id, environ.get(INFERENCE_ID)))
        span = self._tracing.request(environ, request_id) if self._tracing is not None else None
        try:
            record = self.record(environ, environ["REQUEST_METHOD"], status, [], started, 0)
            self.finish(record, environ, request_id, span)
        finally:
            _logging.REQUEST.reset(bound)
            if span is not None:
                span.detach()

    def _finish_sent(
        self,
        record: tuple[Any, ...],
        body: Body,
        environ: WSGIEnvironment,
        request_id: str,
        span: _tracing.RequestSpan | None,
    ) -> None:
        """:meth:`finish` for an answer made as it was sent: its size is what was sent."""
        self.finish((*record[:5], record[5] or body.sent, record[6]), environ, request_id, span)

    def finish(
        self, record: tuple[Any, ...], environ: WSGIEnvironment, request_id: str, span: _tracing.RequestSpan | None
    ) -> None:
        """A request's answer was handed to the server (or, for one made as it is sent, the server closed it): count
        it, log its line, end its span."""
        ended = time.perf_counter()
        route, method, status, started, received, sent, model = record
        recorder = self.recorder
        if recorder is not None:
            number = recorder.kinds.get((route, method, status, model))  # (kind()'s lookup, without its call)
            if number is None:
                number = recorder.kind(route, method, status, model)
            recorder.ended((number, started, ended, received, sent))
        quiet = route in QUIET_ROUTES
        if self._access_log and _logging.access_logger.isEnabledFor(logging.DEBUG if quiet else logging.INFO):
            _logging.access(
                method=method,
                path=environ.get("PATH_INFO") or "/",
                route=route,
                status=status,
                seconds=ended - started,
                request_bytes=received,
                response_bytes=sent,
                request_id=request_id,
                inference_id=environ.get(INFERENCE_ID),
                quiet=quiet,
                model=model,
                target_model=target_model(environ),
            )
        if span is not None:
            span.end(route, status, received, sent)

    def _dispatch(self, environ: WSGIEnvironment, method: str, request_id: str) -> Reply:
        handler, params = self.resolve(environ, method)
        request = _new_request(Request, (environ, request_id, params))  # (Request(...) without its frame)
        if type(handler) is not Invoking:
            return handler(request)  # type: ignore[operator]
        if self._on_loop is not None:
            return self._on_loop.dispatch(handler, request)
        if handler.target is not None:
            return self.lifecycle.invoke(request, handler.target(request))
        status, headers, body = at_once(handler.function(request, functools.partial(self._invoke_now, request)))
        if type(body) is not list and not isinstance(body, Iterable):  # (a Piecewise may be both: Runtime's)
            raise TypeError("an invoking route answered with an event loop's stream on the WSGI path")
        return status, headers, body

    async def _invoke_now(self, request: Request, target: Target, framing: Framing | None = None) -> Reply:
        """An invoking route's ``invoke`` on the WSGI path: on this thread, returning without suspending."""
        return self.lifecycle.invoke(request, target, framing)

    def resolve(
        self, environ: WSGIEnvironment, method: str, found: tuple[str, dict[str, Route], dict[str, str]] | None = None
    ) -> tuple[Route, dict[str, str]]:
        """The handler of the request's route and its pattern's values, once the head is checked (the route noted
        in ``environ``, the request counted in flight); else an HTTP exception (414, 400, 431, 404, 405).
        ``found``: what :meth:`Routes.match` gave for the path already (a front's dispatch), not looked up again."""
        path = environ.get("PATH_INFO") or "/"
        if len(path) + len(environ.get("QUERY_STRING", "")) > MAX_URL_BYTES:
            raise URITooLong(f"the path and query are longer than {MAX_URL_BYTES} bytes")
        if self.backend.check_head:
            self._check_head(environ)
        if found is None:
            found = self.routes.match(path)
        if found is None:
            raise werkzeug.exceptions.NotFound(f"no such path: the routes are {', '.join(self.routes.paths())}")
        route, methods, params = found
        environ[ROUTE] = route
        if self.recorder is not None and route != metrics.ROUTE:
            self.recorder.arrived(None)  # in flight until counted finished (a scrape is not)
        handler = methods.get("GET" if method == "HEAD" else method)
        if handler is None:
            allowed = sorted({*methods, *(["HEAD"] if "GET" in methods else [])})
            raise werkzeug.exceptions.MethodNotAllowed(allowed, f"{method} is not allowed here")
        return handler, params

    def _check_head(self, environ: WSGIEnvironment) -> None:
        host = environ.get("HTTP_HOST")
        if host is None and environ.get("SERVER_PROTOCOL") == "HTTP/1.1":
            raise BadRequest("an HTTP/1.1 request must have a Host header (RFC 9112, section 3.2)")
        if host is not None and "," in host:  # granian joins repeated headers with commas
            raise BadRequest("a request must have one Host header, not several (RFC 9112, section 3.2)")
        codings = environ.get("HTTP_TRANSFER_ENCODING")
        if codings is not None and codings.strip().lower() != "chunked":  # (granian reads "gzip, chunked" as chunked)
            raise BadRequest(unsupported_coding(codings))
        size = environ.get(HEAD_BYTES)  # (measured by an event-loop front)
        if size is None:
            size, headers = _head_bytes(environ)
            if not headers:  # (an environ that does not end with the headers: its server measures the head)
                return
        if size > self.settings.max_header_bytes:
            raise werkzeug.exceptions.RequestHeaderFieldsTooLarge(
                f"the request line and headers are larger than {self.settings.max_header_bytes} bytes "
                "(--max-header-bytes)"
            )


def _head_bytes(environ: WSGIEnvironment) -> tuple[int, int]:
    """The size of the request's head and its number of headers, from a WSGI server's environ."""
    # The head as a client writes it: "METHOD target VERSION", "Name: value" lines, each with its CRLF, and the empty
    # line: exact for such a head (the server bounds what the environ cannot tell: spaces around values, escapes).
    # granian's environ ends with the headers; a server whose environ does not (gunicorn) measures the head itself,
    # exactly.
    size = len(environ.get("REQUEST_METHOD", "")) + len(environ.get("SERVER_PROTOCOL", "")) + 6
    if "RAW_URI" in environ:
        size += len(environ["RAW_URI"])
    else:
        query = environ.get("QUERY_STRING", "")
        size += len(environ.get("PATH_INFO", "")) + (len(query) + 1 if query else 0)
    headers = 0
    for key in reversed(environ):  # granian adds the headers last, after a copy of os.environ and the CGI keys
        if key[:5] == "HTTP_":
            size += len(key) - 1 + len(environ[key])  # (the name is 5 shorter than the key, ": " and CRLF)
            headers += 1
        elif key in _BODY_HEADERS:
            size += len(key) + 4 + len(environ[key])
        else:
            break
    return size, headers


def request_id_of(environ: WSGIEnvironment) -> str:
    """The client's ``X-Request-Id`` when it is a sane one, else a new one."""
    request_id = environ.get("HTTP_X_REQUEST_ID")
    if request_id is None or not _REQUEST_ID.fullmatch(request_id):
        request_id = f"{random.getrandbits(128):032x}"  # unique enough for logs; cheaper than uuid4
    return str(request_id)


def answered(headers: list[tuple[str, str]], environ: WSGIEnvironment, request_id: str) -> None:
    """Add what every answer carries: ``X-Request-Id``, and the client's SageMaker custom attributes echoed unless
    the model set its own."""
    headers.append(("X-Request-Id", request_id))
    custom_attributes = environ.get("HTTP_X_AMZN_SAGEMAKER_CUSTOM_ATTRIBUTES")
    if custom_attributes and not any(k.lower() == CUSTOM_ATTRIBUTES.lower() for k, _ in headers):
        headers.append((CUSTOM_ATTRIBUTES, custom_attributes))


def _multi_model(pipeline: Pipeline, settings: Settings) -> MultiModel | None:
    """A worker's models of a multi-model endpoint, registered in the server's run directory (shared by its workers),
    or in a private one outside ``serve``."""
    if not (settings.multi_model or settings.model_root):
        return None
    from inference_server import _multimodel, _registry, _rundir

    run_dir = _rundir.current()
    registry = _registry.Registry(run_dir / "models" if run_dir is not None else None)
    return _multimodel.MultiModel(pipeline, settings, registry, run_dir / "unpacked" if run_dir is not None else None)


def _capturing(settings: Settings, recorder: metrics.Recorder | None) -> Capture:
    """Data capture as the settings ask (``--data-capture``): what is buffered is written when the process exits
    (a worker that drains on SIGTERM included), its counts reported with the metrics."""
    from inference_server._capture import Capture

    assert settings.data_capture is not None
    capture = Capture(
        settings.data_capture,
        sampling=settings.data_capture_sampling,
        mode=settings.data_capture_mode,
        csv_types=settings.data_capture_csv_types,
        json_types=settings.data_capture_json_types,
        endpoint=settings.data_capture_endpoint,
        variant=settings.data_capture_variant,
        flush_seconds=settings.data_capture_flush_seconds,
    )
    atexit.register(capture.close)
    multiprocessing.util.Finalize(capture, capture.close, exitpriority=10)  # (a multiprocessing worker: granian's)
    if recorder is not None:
        recorder.flushing.append(
            metrics.capture_reporter(
                lambda: {"captured": capture.captured, "dropped": capture.dropped, "written": capture.written}
            )
        )
    return capture


def create_app(*, model_dir: str | None = None) -> App:
    """Return the WSGI application, configured from the environment (``model_dir`` overrides it)."""
    return App(Settings.from_env(model_dir=model_dir), _plugins.manager())


def warmup(*, model_dir: str | None = None) -> None:
    """Load the model now (once per process) instead of on the first request; returns None, as in 1.x."""
    create_app(model_dir=model_dir).model()
