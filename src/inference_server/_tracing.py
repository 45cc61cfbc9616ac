"""OpenTelemetry traces (the ``otel`` extra): a server span per request, a child span per hook.

**When.** :func:`create` decides once per app, from the standard OpenTelemetry environment:

1. ``OTEL_SDK_DISABLED=true`` (any case): off, whatever else is set.
2. A tracer provider the user's code already installed globally (``opentelemetry.trace.set_tracer_provider`` in a
   plugin's module, ``opentelemetry-instrument``, a ``sitecustomize``) before the app is made: on, with that provider
   as it is (its exporters, sampler and resource are the user's; the ``OTEL_*`` variables are not read again). This
   is looked for only if ``opentelemetry.trace`` is already imported, so it imports nothing.
3. ``OTEL_TRACES_EXPORTER`` names one or more exporters (comma-separated; unset, empty or ``none``: none): on. The
   SDK is configured from the standard variables (see :func:`_configure`) and installed as the global provider, so
   that spans the model's own code makes nest inside the hooks' spans. Without ``opentelemetry-sdk`` that is a
   :class:`~inference_server.errors.ConfigurationError` naming the extra.
4. Otherwise: off. :func:`create` returns None, nothing of OpenTelemetry is imported and a request pays nothing.

**What.** Per request, a span of kind SERVER named ``"{method} {route}"`` (the method alone until the route is known
and for paths that match no route), child of the context the request's headers carry (W3C ``traceparent`` and
``tracestate`` with the default propagators; whatever ``OTEL_PROPAGATORS`` chooses), with the attributes of the
HTTP semantic conventions and ``inference_server.request_id``; status ERROR for a 5xx answer. Each hook of an
invocation (``input_fn``, ``predict_fn``, ``output_fn``) is a child span of it, which records an exception the hook
raises, with status ERROR unless the exception is an HTTP error of status 4xx (the client's error, such as a body
that does not decode: recorded, the status left unset, as the server span's is for a 4xx). Health checks and
scrapes (``/ping``, ``/metrics``) are not traced unless ``OTEL_PYTHON_EXCLUDED_URLS`` says otherwise
(comma-separated regular expressions searched in the path; set, it replaces that default; empty, every path is
traced).
"""

from __future__ import annotations

import os
import re
import sys
import threading
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from inference_server._version import __version__
from inference_server.errors import ConfigurationError

if TYPE_CHECKING:
    from contextvars import Token
    from types import TracebackType

    from _typeshed.wsgi import WSGIEnvironment
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, TracerProvider

__all__ = ["EXTRA", "OpenTelemetry", "RequestSpan", "Tracing", "create", "exporter_names"]

#: What to install for traces.
EXTRA = "pip install 'inference-server[otel]'"
#: The ``service.name`` of the resource when neither ``OTEL_SERVICE_NAME`` nor ``OTEL_RESOURCE_ATTRIBUTES`` names one.
SERVICE_NAME = "inference-server"
#: The instrumentation scope of the spans.
SCOPE = "inference_server"
#: Where the SDK finds exporters by the names ``OTEL_TRACES_EXPORTER`` gives.
EXPORTERS_GROUP = "opentelemetry_traces_exporter"
#: Paths not traced unless ``OTEL_PYTHON_EXCLUDED_URLS`` is set: health checks and scrapes would flood the traces.
UNTRACED = frozenset(("/ping", "/metrics"))
#: The methods the HTTP semantic conventions know; any other is ``_OTHER``.
METHODS = frozenset(("CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"))
#: The OTLP exporters' entry points by ``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL``, as the SDK's own configurator has it.
_OTLP_BY_PROTOCOL = {"grpc": "otlp_proto_grpc", "http/protobuf": "otlp_proto_http"}


class RequestSpan(Protocol):
    def detach(self) -> None: ...

    def end(self, route: str, status: int, request_bytes: int, response_bytes: int) -> None: ...


class Tracing(Protocol):
    def request(self, environ: WSGIEnvironment, request_id: str) -> RequestSpan: ...

    def stage(self, name: str) -> AbstractContextManager[Any]: ...


def exporter_names(environ: Any = os.environ) -> list[str]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names (none when it is unset, empty or ``none``)."""
    value = environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if value.lower() == "none":
        return []
    return [name.strip().lower() for name in value.split(",") if name.strip()]


def create() -> Tracing | None:
    """The app's tracing, or None when tracing is not asked for (the rule is in this module's docstring)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    provider = _installed_provider()
    if provider is None:
        names = exporter_names()
        if not names:
            return None
        provider = _configure(names)
    _flush_at_exit(provider)
    return OpenTelemetry(provider)


def _installed_provider() -> TracerProvider | None:
    """The global tracer provider, if one was installed (by the user's code or by :func:`_configure`); looked for
    only when ``opentelemetry.trace`` is already imported, so that this imports nothing."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    provider: TracerProvider = trace.get_tracer_provider()
    return None if isinstance(provider, trace.ProxyTracerProvider) else provider


_configuring = threading.Lock()
#: The provider :func:`_configure` installed in this process (or the one it was forked from).
_ours: TracerProvider | None = None
#: ``(pid, id(provider))`` of the providers this process flushes at exit.
_flushed_at_exit: set[tuple[int, int]] = set()


def _flush_at_exit(provider: TracerProvider) -> None:
    """Export what is still queued when this process exits: ours is shut down, the user's flushed.

    The SDK's provider shuts down at exit (``atexit``), but a forked multiprocessing child (granian's workers) leaves
    through ``os._exit`` after running multiprocessing's finalizers only, its registry emptied at the fork: the spans
    of its last seconds would be lost. So each process that makes an app registers a finalizer of its own.
    """
    import multiprocessing.util

    key = (os.getpid(), id(provider))
    if key in _flushed_at_exit:
        return
    _flushed_at_exit.add(key)
    flush = getattr(provider, "shutdown" if provider is _ours else "force_flush", None)
    if flush is not None:
        multiprocessing.util.Finalize(None, flush, exitpriority=10)


def _configure(names: list[str]) -> TracerProvider:
    """The SDK's tracer provider, made from the standard variables and installed globally: the exporters that
    ``names`` name (entry points of :data:`EXPORTERS_GROUP`, ``otlp`` by its protocol variable), each behind a
    BatchSpanProcessor (``OTEL_BSP_*``); the resource from ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``
    (``service.name`` :data:`SERVICE_NAME` when neither names one); the sampler from ``OTEL_TRACES_SAMPLER``."""
    variable = f"OTEL_TRACES_EXPORTER={os.environ.get('OTEL_TRACES_EXPORTER', '')}"
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider as SDKTracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
    except ImportError as exc:
        raise ConfigurationError(
            f"{variable} asks for traces, but {exc.name or 'opentelemetry-sdk'} cannot be imported: {EXTRA} "
            "(or unset OTEL_TRACES_EXPORTER)"
        ) from None
    with _configuring:
        provider = _installed_provider()
        if provider is not None:  # made meanwhile by another thread, or in the process this one was forked from
            return provider
        exporters = [_exporter(name, variable, SpanExporter) for name in names]
        resource = Resource.create()
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
        sdk_provider = SDKTracerProvider(resource=resource)
        for exporter in exporters:
            sdk_provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(sdk_provider)
        global _ours
        _ours = sdk_provider
        return sdk_provider


def _exporter(name: str, variable: str, base: type[Any]) -> Any:
    """The exporter ``OTEL_TRACES_EXPORTER`` calls ``name``, made with its own variables."""
    from importlib.metadata import entry_points

    entry = name
    if name == "otlp":
        protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        entry = _OTLP_BY_PROTOCOL.get((protocol or "grpc").strip(), "")
        if not entry:
            raise ConfigurationError(f"unknown OTLP protocol {protocol!r}: one of {', '.join(_OTLP_BY_PROTOCOL)}")
    found = list(entry_points(group=EXPORTERS_GROUP, name=entry))
    if not found:
        known = sorted({point.name for point in entry_points(group=EXPORTERS_GROUP)})
        hint = "; pip install opentelemetry-exporter-otlp" if name.startswith("otlp") else ""
        raise ConfigurationError(
            f"{variable}: no installed package provides the trace exporter {name!r} (entry point {entry!r} of "
            f"{EXPORTERS_GROUP}; installed: {', '.join(known) or 'none'}){hint}"
        )
    try:
        cls = found[0].load()
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise TypeError(f"{found[0].value} is not a SpanExporter")
        return cls()
    except Exception as exc:
        raise ConfigurationError(f"{variable}: the trace exporter {name!r} could not be made: {exc}") from exc


def _excluded() -> Any:
    """What tells a path not to trace: ``OTEL_PYTHON_EXCLUDED_URLS``'s patterns, or :data:`UNTRACED`."""
    value = os.environ.get("OTEL_PYTHON_EXCLUDED_URLS")
    if value is None:
        return UNTRACED.__contains__
    patterns = [pattern.strip() for pattern in value.split(",") if pattern.strip()]
    if not patterns:
        return lambda path: False
    try:
        return re.compile("|".join(f"(?:{pattern})" for pattern in patterns)).search
    except re.error as exc:
        raise ConfigurationError(f"OTEL_PYTHON_EXCLUDED_URLS={value}: not regular expressions: {exc}") from None


class _EnvironGetter:
    """The propagators' getter over a WSGI environ: header ``traceparent`` is key ``HTTP_TRACEPARENT``."""

    def get(self, carrier: WSGIEnvironment, key: str) -> list[str] | None:
        value = carrier.get("HTTP_" + key.upper().replace("-", "_"))
        return None if value is None else [value]

    def keys(self, carrier: WSGIEnvironment) -> list[str]:
        return [key[5:].lower().replace("_", "-") for key in carrier if key[:5] == "HTTP_"]


class OpenTelemetry:
    """:class:`Tracing` through the OpenTelemetry API, with the spans made by ``provider``'s tracer."""

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry import context, propagate, trace
        from opentelemetry.trace import SpanKind, Status, StatusCode

        self.tracer = provider.get_tracer(SCOPE, __version__)
        self._excluded = _excluded()
        self._getter = _EnvironGetter()
        self._extract = propagate.extract
        self._attach = context.attach
        self._detach = context.detach
        self._in_context = trace.set_span_in_context
        self._server = SpanKind.SERVER
        self._error = Status(StatusCode.ERROR)
        self._error_code = StatusCode.ERROR
        self._status = Status

    def request(self, environ: WSGIEnvironment, request_id: str) -> RequestSpan:
        """Start the request's server span, child of the context its headers carry, and make it current here."""
        path = environ.get("PATH_INFO") or "/"
        if self._excluded(path):
            return _UNTRACED
        method = environ["REQUEST_METHOD"]
        attributes: dict[str, Any] = {
            "http.request.method": method,
            "url.path": path,
            "url.scheme": environ.get("wsgi.url_scheme", "http"),
            "inference_server.request_id": request_id,
        }
        if method not in METHODS:
            attributes["http.request.method"] = "_OTHER"
            attributes["http.request.method_original"] = method
            method = "HTTP"
        for key, attribute in _OPTIONAL:
            value = environ.get(key)
            if value:
                attributes[attribute] = value
        protocol = environ.get("SERVER_PROTOCOL", "")
        if protocol[:5] == "HTTP/":
            attributes["network.protocol.version"] = protocol[5:]
        parent = self._extract(environ, getter=self._getter)  # type: ignore[arg-type]
        span = self.tracer.start_span(method, parent, self._server, attributes)
        return _RequestSpan(self, span, method, self._attach(self._in_context(span, parent)))

    def stage(self, name: str) -> _Stage:
        """A child span of the current one, current while the ``with`` block runs; records what it raises."""
        return _Stage(self, name)


#: Request variables copied as attributes when present: ``(environ key, attribute)``.
_OPTIONAL = (
    ("QUERY_STRING", "url.query"),
    ("REMOTE_ADDR", "client.address"),
    ("HTTP_USER_AGENT", "user_agent.original"),
    ("HTTP_X_AMZN_SAGEMAKER_INFERENCE_ID", "inference_server.inference_id"),
)


class _RequestSpan:
    __slots__ = ("_method", "_span", "_token", "_tracing")

    def __init__(self, tracing: OpenTelemetry, span: Span, method: str, token: Token[Context]) -> None:
        self._tracing = tracing
        self._span = span
        self._method = method
        self._token = token

    def detach(self) -> None:
        """The span is no longer current in the context that :meth:`OpenTelemetry.request` made it current in."""
        self._tracing._detach(self._token)

    def end(self, route: str, status: int, request_bytes: int, response_bytes: int) -> None:
        """The answer was sent: note what it was and end the span (from any thread)."""
        span = self._span
        attributes: dict[str, Any] = {
            "http.response.status_code": status,
            "http.request.body.size": request_bytes,
            "http.response.body.size": response_bytes,
        }
        if route[:1] == "/":  # a route's pattern; ``other`` when no route matched
            attributes["http.route"] = route
            span.update_name(f"{self._method} {route}")
        if status >= 500:
            attributes["error.type"] = str(status)
            span.set_status(self._tracing._error)
        span.set_attributes(attributes)
        span.end()


class _Untraced:
    """The request span of a path that is not traced."""

    __slots__ = ()

    def detach(self) -> None:
        pass

    def end(self, route: str, status: int, request_bytes: int, response_bytes: int) -> None:
        pass


_UNTRACED = _Untraced()


class _Stage:
    __slots__ = ("_name", "_span", "_token", "_tracing")

    def __init__(self, tracing: OpenTelemetry, name: str) -> None:
        self._tracing = tracing
        self._name = name

    def __enter__(self) -> Span:
        tracing = self._tracing
        self._span = span = tracing.tracer.start_span(self._name)
        self._token = tracing._attach(tracing._in_context(span))
        return span

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        tracing, span = self._tracing, self._span
        tracing._detach(self._token)
        if exc is not None:
            span.record_exception(exc, escaped=True)
            code = getattr(exc, "code", None)
            if not (isinstance(code, int) and 400 <= code < 500):  # a 4xx is the client's error, not the hook's
                span.set_status(tracing._status(tracing._error_code, f"{type(exc).__name__}: {exc}"))
        span.end()
