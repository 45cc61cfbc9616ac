"""OpenTelemetry traces (``_tracing.py``): a server span per request with the hooks' spans under it, parented to the
caller's ``traceparent``; off, and nothing imported, unless the ``OTEL_*`` variables ask for it; a real server's
spans through the console exporter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
import werkzeug.test

from inference_server import _plugins, _tracing, plugin_hook
from inference_server._settings import Settings
from inference_server.errors import ConfigurationError, UnsupportedMediaType
from inference_server.wsgi._app import App

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
STAGES = ["input_fn", "predict_fn", "output_fn"]


@pytest.fixture(autouse=True)
def _no_otel_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``OTEL_*`` variable of the environment the tests run in reaches them."""
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)


class Echo:
    """Echoes the body's bytes; ``boom`` makes ``predict_fn`` raise, an image body ``input_fn`` (a 415)."""

    @plugin_hook
    def input_fn(self, input_data: Any, content_type: str) -> bytes:
        if content_type.startswith("image/"):
            raise UnsupportedMediaType("no images, please")
        return bytes(input_data)

    @plugin_hook
    def predict_fn(self, data: bytes, model: Any) -> bytes:
        if data == b"boom":
            raise RuntimeError("the model exploded")
        return data.upper()

    @plugin_hook
    def output_fn(self, prediction: bytes, accept: Any) -> Any:
        if prediction == b"BARE":  # (not the (body, content_type) pair output_fn must return)
            return prediction
        return prediction, "application/octet-stream"


class AsyncPredict:
    """An async generator ``predict_fn`` (run on the event loop), failing before its first record on ``boom``."""

    @plugin_hook
    async def predict_fn(self, data: bytes, model: Any) -> Any:
        if data == b"boom":
            raise RuntimeError("no first record")
        yield bytes(data)


class AsyncOutput:
    """An ``async def output_fn`` (run on the event loop) answering ``BARE`` with bytes alone, not what it must."""

    @plugin_hook
    async def output_fn(self, prediction: bytes, accept: Any) -> Any:
        if prediction == b"BARE":
            return prediction
        return prediction, "application/octet-stream"


class Traced:
    """An app whose tracing writes to an in-memory exporter (the global tracer provider is never set here: it can be
    set once per process)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *plugins: Any, backend: Any = None, **settings: Any) -> None:
        pytest.importorskip("opentelemetry.sdk")
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracing = _tracing.OpenTelemetry(provider)
        monkeypatch.setattr(_tracing, "create", lambda: self.tracing)
        pm = _plugins.build_manager([], [*plugins] or [Echo()])
        self.app = App(Settings(model_dir="/nonexistent", **settings), pm, *([backend] if backend else []))
        self.client = werkzeug.test.Client(self.app)  # type: ignore[arg-type]

    def request(self, method: str, path: str, body: bytes = b"", **headers: str) -> tuple[int, bytes]:
        """Send one request and close its answer (which ends its span)."""
        response = self.client.open(path, method=method, data=body, headers=headers)
        try:
            return response.status_code, response.get_data()
        finally:
            response.close()

    def spans(self) -> list[Any]:
        return list(self.exporter.get_finished_spans())


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> Traced:
    return Traced(monkeypatch)


def _server_span(spans: list[Any]) -> Any:
    from opentelemetry.trace import SpanKind

    (server,) = [span for span in spans if span.kind is SpanKind.SERVER]
    return server


@pytest.mark.parametrize("timeout", [60, 0], ids=["hooks-on-a-helper-thread", "hooks-on-the-calling-thread"])
def test_server_span_and_the_three_hooks_under_the_callers_traceparent(
    monkeypatch: pytest.MonkeyPatch, timeout: int
) -> None:
    """One SERVER span per invocation, child of the sent ``traceparent`` (same trace, the sender's span as parent,
    its ``tracestate`` kept), with ``input_fn``, ``predict_fn`` and ``output_fn`` under it, in order."""
    from opentelemetry.trace import SpanKind, StatusCode

    traced = Traced(monkeypatch, timeout=timeout)
    status, body = traced.request(
        "POST", "/invocations", b"hello", traceparent=TRACEPARENT, tracestate="congo=t61rcWkgMzE"
    )
    assert (status, body) == (200, b"HELLO")
    spans = traced.spans()
    assert [span.name for span in spans] == [*STAGES, "POST /invocations"]
    server = _server_span(spans)
    assert server.kind is SpanKind.SERVER
    assert format(server.context.trace_id, "032x") == TRACE_ID
    assert format(server.parent.span_id, "016x") == PARENT_ID
    assert server.parent.is_remote
    assert server.context.trace_state.get("congo") == "t61rcWkgMzE"
    assert server.status.status_code is StatusCode.UNSET
    stages = spans[:3]
    for stage in stages:
        assert stage.kind is SpanKind.INTERNAL
        assert stage.context.trace_id == server.context.trace_id
        assert stage.parent.span_id == server.context.span_id
        assert stage.status.status_code is StatusCode.UNSET
        assert server.start_time <= stage.start_time <= stage.end_time <= server.end_time
    assert [stage.start_time for stage in stages] == sorted(stage.start_time for stage in stages)
    assert stages[0].end_time <= stages[1].start_time
    assert stages[1].end_time <= stages[2].start_time


def test_server_span_attributes(traced: Traced) -> None:
    """The HTTP semantic conventions' attributes: method, route (the pattern, not the path), path, query, status,
    body sizes; and the request's ids (``X-Request-Id``, SageMaker's inference id)."""
    headers = {"X-Request-Id": "req-42", "User-Agent": "tests/1", "X-Amzn-SageMaker-Inference-Id": "inf-7"}
    status, body = traced.request("POST", "/endpoints/my-model/invocations?verbose=1", b"a body", **headers)
    assert (status, body) == (200, b"A BODY")
    server = _server_span(traced.spans())
    assert server.name == "POST /endpoints/{name}/invocations"
    attributes = dict(server.attributes)
    assert attributes == {
        **attributes,
        "http.request.method": "POST",
        "http.route": "/endpoints/{name}/invocations",
        "url.path": "/endpoints/my-model/invocations",
        "url.scheme": "http",
        "url.query": "verbose=1",
        "http.response.status_code": 200,
        "http.request.body.size": 6,
        "http.response.body.size": 6,
        "inference_server.request_id": "req-42",
        "inference_server.inference_id": "inf-7",
        "user_agent.original": "tests/1",
        "network.protocol.version": "1.1",
    }
    assert "error.type" not in attributes


def test_request_id_made_by_the_app_is_the_spans(traced: Traced) -> None:
    """Without an ``X-Request-Id`` the span carries the id the app made, the one its answer and log lines carry."""
    response = traced.client.post("/invocations", data=b"x")
    response.close()
    (server,) = [span for span in traced.spans() if span.name == "POST /invocations"]
    assert server.attributes["inference_server.request_id"] == response.headers["X-Request-Id"]


def test_without_traceparent_the_server_span_is_a_root(traced: Traced) -> None:
    """No ``traceparent``: a new trace, the server span its root."""
    traced.request("POST", "/invocations", b"x")
    traced.request("POST", "/invocations", b"y")
    servers = [span for span in traced.spans() if span.name == "POST /invocations"]
    assert [server.parent for server in servers] == [None, None]
    assert servers[0].context.trace_id != servers[1].context.trace_id


def test_a_hook_exception_is_recorded_on_its_stage_span(traced: Traced) -> None:
    """``predict_fn`` raising: its span holds the exception, status ERROR; no ``output_fn`` span; the server span
    is a 500 with status ERROR. The exception still reaches the app (re-raised), which answers 500."""
    from opentelemetry.trace import StatusCode

    status, _ = traced.request("POST", "/invocations", b"boom", traceparent=TRACEPARENT)
    assert status == 500
    spans = traced.spans()
    assert [span.name for span in spans] == ["input_fn", "predict_fn", "POST /invocations"]
    predict = spans[1]
    assert predict.status.status_code is StatusCode.ERROR
    assert predict.status.description == "RuntimeError: the model exploded"
    (event,) = predict.events
    assert event.name == "exception"
    assert event.attributes["exception.type"] == "RuntimeError"
    assert event.attributes["exception.message"] == "the model exploded"
    assert "the model exploded" in event.attributes["exception.stacktrace"]
    assert spans[0].status.status_code is StatusCode.UNSET
    server = spans[2]
    assert server.status.status_code is StatusCode.ERROR
    assert server.attributes["http.response.status_code"] == 500
    assert server.attributes["error.type"] == "500"
    assert format(server.context.trace_id, "032x") == TRACE_ID


def test_output_fns_wrong_answer_is_recorded_on_its_span(traced: Traced) -> None:
    """An ``output_fn`` that returns bytes alone, not ``(body, content_type)``: the check of its answer fails within
    its span, which holds the exception with status ERROR."""
    from opentelemetry.trace import StatusCode

    status, _ = traced.request("POST", "/invocations", b"bare")
    assert status == 500
    spans = traced.spans()
    assert [span.name for span in spans] == [*STAGES, "POST /invocations"]
    assert spans[2].status.status_code is StatusCode.ERROR
    assert spans[2].events[0].attributes["exception.type"] == "inference_server.errors.HookError"


@pytest.mark.parametrize(
    ("plugin", "body", "stage", "error"),
    [
        (AsyncPredict, b"boom", "predict_fn", "RuntimeError"),
        (AsyncOutput, b"bare", "output_fn", "inference_server.errors.HookError"),
    ],
)
def test_async_hooks_failures_are_recorded_on_their_spans_on_the_loop(
    monkeypatch: pytest.MonkeyPatch, plugin: type, body: bytes, stage: str, error: str
) -> None:
    """On the event loop: an async generator ``predict_fn`` failing before its first record, and an async
    ``output_fn`` whose answer is not ``(body, content_type)``, each fail within their own span (status ERROR, the
    exception recorded)."""
    from opentelemetry.trace import StatusCode

    from inference_server.wsgi._invoke import Backend

    traced = Traced(monkeypatch, Echo(), plugin(), backend=Backend(on_loop=True))
    status, _ = traced.request("POST", "/invocations", body)
    assert status == 500
    (failed,) = [span for span in traced.spans() if span.name == stage]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.events[0].attributes["exception.type"] == error


def test_a_client_error_raised_by_a_hook_is_recorded_but_not_an_error(traced: Traced) -> None:
    """A hook's HTTP error of status 4xx (the client sent what the model cannot take) is recorded on its span, whose
    status stays unset, as the server span's does for a 4xx."""
    from opentelemetry.trace import StatusCode

    status, _ = traced.request("POST", "/invocations", b"GIF89a", **{"Content-Type": "image/gif"})
    assert status == 415
    stage, server = traced.spans()
    assert stage.name == "input_fn"
    assert stage.events[0].attributes["exception.type"] == "inference_server.errors.UnsupportedMediaType"
    assert stage.status.status_code is StatusCode.UNSET
    assert (server.attributes["http.response.status_code"], server.status.status_code) == (415, StatusCode.UNSET)


def test_client_errors_and_unknown_paths(traced: Traced) -> None:
    """A 4xx is not an error of the server span; a path matching no route has no ``http.route`` and is named by its
    method alone (the semantic conventions' rule, which keeps span names few)."""
    from opentelemetry.trace import StatusCode

    assert traced.request("GET", "/no/such/path")[0] == 404
    assert traced.request("GET", "/invocations")[0] == 405
    unknown, wrong_method = traced.spans()
    assert unknown.name == "GET"
    assert "http.route" not in unknown.attributes
    assert unknown.attributes["url.path"] == "/no/such/path"
    assert unknown.attributes["http.response.status_code"] == 404
    assert wrong_method.name == "GET /invocations"
    assert wrong_method.attributes["http.response.status_code"] == 405
    assert {span.status.status_code for span in (unknown, wrong_method)} == {StatusCode.UNSET}


def test_health_checks_and_scrapes_are_not_traced(traced: Traced) -> None:
    """``/ping`` and ``/metrics`` make no span by default: a health check every few seconds would flood the traces."""
    assert traced.request("GET", "/ping")[0] == 200
    traced.request("GET", "/metrics")
    assert traced.spans() == []


def test_excluded_urls_variable_replaces_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """``OTEL_PYTHON_EXCLUDED_URLS`` (regular expressions searched in the path) replaces the default; empty, every
    path is traced."""
    monkeypatch.setenv("OTEL_PYTHON_EXCLUDED_URLS", "")
    traced = Traced(monkeypatch)
    traced.request("GET", "/ping")
    assert [span.name for span in traced.spans()] == ["GET /ping"]
    monkeypatch.setenv("OTEL_PYTHON_EXCLUDED_URLS", "^/execution-parameters$, openapi")
    traced = Traced(monkeypatch)
    for path in ("/execution-parameters", "/openapi.json", "/ping"):
        traced.request("GET", path)
    assert [span.name for span in traced.spans()] == ["GET /ping"]


def test_nonstandard_method(traced: Traced) -> None:
    """A method the semantic conventions do not know is ``_OTHER``, its span named ``HTTP``."""
    traced.request("BREW", "/invocations")
    (server,) = traced.spans()
    assert server.name == "HTTP /invocations"
    assert server.attributes["http.request.method"] == "_OTHER"
    assert server.attributes["http.request.method_original"] == "BREW"


def test_stage_is_usable_alone(traced: Traced) -> None:
    """``stage()`` outside a request: a root span; an exception passes through it."""
    with pytest.raises(KeyError), traced.tracing.stage("predict_fn"):
        raise KeyError("k")
    (span,) = traced.spans()
    assert (span.name, span.parent, span.events[0].attributes["exception.type"]) == ("predict_fn", None, "KeyError")


# The rule: off without the variables, configured from them, the user's provider honoured -------------------------


def _python(code: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (the global tracer provider and ``sys.modules`` are per process)."""
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "INFERENCE_SERVER_", "SAGEMAKER_"))
    }
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _json(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_off_without_the_variables_and_nothing_imported() -> None:
    """``create()`` is None and no module of OpenTelemetry is imported (not even by an app answering a request)
    unless ``OTEL_TRACES_EXPORTER`` names an exporter; ``OTEL_SDK_DISABLED=true`` turns it off whatever is set."""
    done = _python(
        """
        import json, os, sys
        import werkzeug.test
        from inference_server import _plugins, _tracing
        from inference_server._settings import Settings
        from inference_server.wsgi._app import App

        results = {}
        for case in ({}, {"OTEL_TRACES_EXPORTER": ""}, {"OTEL_TRACES_EXPORTER": " None "},
                     {"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "TRUE"},
                     {"OTEL_SERVICE_NAME": "x", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:4317"}):
            for name in [name for name in os.environ if name.startswith("OTEL_")]:
                del os.environ[name]
            os.environ.update(case)
            results[json.dumps(case)] = _tracing.create() is None
        app = App(Settings(model_dir="/nonexistent"), _plugins.build_manager([], []))
        werkzeug.test.Client(app).post("/invocations", data=b"x").close()
        results["app"] = app._tracing is None
        results["imported"] = sorted(name for name in sys.modules if name.startswith("opentelemetry"))
        print(json.dumps(results))
        """
    )
    results = _json(done)
    assert results.pop("imported") == []
    assert all(results.values()), results


_BLOCK = """
    import sys

    class Missing:
        \"\"\"Imports of {blocked} fail, as if it were not installed.\"\"\"

        def find_spec(self, name, path=None, target=None):
            if name == {blocked!r} or name.startswith({blocked!r} + "."):
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None

    sys.meta_path.insert(0, Missing())
"""


@pytest.mark.parametrize("blocked", ["opentelemetry.sdk", "opentelemetry"])
def test_asked_for_without_the_sdk_is_a_configuration_error(blocked: str) -> None:
    """``OTEL_TRACES_EXPORTER`` set but the SDK (or all of OpenTelemetry) missing: a ConfigurationError naming the
    variable and the extra to install."""
    done = _python(
        _BLOCK.format(blocked=blocked)
        + """
    import json
    from inference_server import _tracing
    from inference_server.errors import ConfigurationError, UnsupportedMediaType
    try:
        _tracing.create()
    except ConfigurationError as exc:
        print(json.dumps(str(exc)))
    """,
        {"OTEL_TRACES_EXPORTER": "console"},
    )
    message = _json(done)
    assert "OTEL_TRACES_EXPORTER=console" in message
    assert "pip install 'inference-server[otel]'" in message
    assert blocked in message


def test_server_without_the_sdk_does_not_start(servers: Any, plugin_site: Any) -> None:
    """``inference-server serve`` with ``OTEL_TRACES_EXPORTER`` and no SDK stops at start-up with that message."""
    (plugin_site.path / "sitecustomize.py").write_text(textwrap.dedent(_BLOCK.format(blocked="opentelemetry.sdk")))
    server = servers.start(plugins=[], env={"OTEL_TRACES_EXPORTER": "console"}, wait=False)
    assert server.process.wait(30) == 1
    assert "inference-server: error: OTEL_TRACES_EXPORTER=console asks for traces" in server.output()
    assert "pip install 'inference-server[otel]'" in server.output()


def test_unknown_exporter_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """An exporter name no installed package provides: a ConfigurationError naming it and what is installed, and no
    provider installed."""
    pytest.importorskip("opentelemetry.sdk")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console,nosuch")
    with pytest.raises(ConfigurationError, match=r"'nosuch'.*installed: console"):
        _tracing.create()
    from opentelemetry import trace

    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)  # nothing was installed


def test_otlp_without_its_package_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """``otlp`` needs an exporter package, which the error names."""
    pytest.importorskip("opentelemetry.sdk")
    from importlib.metadata import entry_points

    if list(entry_points(group=_tracing.EXPORTERS_GROUP, name="otlp_proto_grpc")):
        pytest.skip("an OTLP exporter is installed")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    with pytest.raises(ConfigurationError, match="pip install opentelemetry-exporter-otlp"):
        _tracing.create()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "carrier-pigeon")
    with pytest.raises(ConfigurationError, match="unknown OTLP protocol 'carrier-pigeon'"):
        _tracing.create()


def test_sdk_configured_from_the_variables() -> None:
    """``OTEL_TRACES_EXPORTER=console``: the SDK's provider installed globally, one BatchSpanProcessor per exporter,
    ``service.name`` ``inference-server`` unless the variables name one; every app of the process shares it."""
    pytest.importorskip("opentelemetry.sdk")
    code = """
        import json
        from opentelemetry import trace
        from inference_server import _tracing

        first, second = _tracing.create(), _tracing.create()
        provider = trace.get_tracer_provider()
        processors = provider._active_span_processor._span_processors
        print(json.dumps({
            "shared": first.tracer.resource is second.tracer.resource is provider.resource,
            "service": provider.resource.attributes["service.name"],
            "processors": [(type(p).__name__, type(p._batch_processor._exporter).__name__) for p in processors],
        }))
    """
    default = _json(_python(code, {"OTEL_TRACES_EXPORTER": "console"}))
    assert default == {
        "shared": True,
        "service": "inference-server",
        "processors": [["BatchSpanProcessor", "ConsoleSpanExporter"]],
    }
    named = _json(_python(code, {"OTEL_TRACES_EXPORTER": "Console", "OTEL_SERVICE_NAME": "forecaster"}))
    assert named["service"] == "forecaster"
    attributes = _json(_python(code, {"OTEL_TRACES_EXPORTER": "console", "OTEL_RESOURCE_ATTRIBUTES": "service.name=a"}))
    assert attributes["service"] == "a"


def test_a_provider_the_user_installed_is_honoured() -> None:
    """A tracer provider the plugin installed globally is used as it is, with no ``OTEL_*`` variable, and a span the
    model's own code makes is a child of ``predict_fn``'s."""
    pytest.importorskip("opentelemetry.sdk")
    done = _python(
        """
        import json
        import werkzeug.test
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from inference_server import _plugins, plugin_hook
        from inference_server._settings import Settings
        from inference_server.wsgi._app import App

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)  # as a plugin's module would, at import

        class Model:
            @plugin_hook
            def predict_fn(self, data, model):
                with trace.get_tracer("my_model").start_as_current_span("my-own-span"):
                    return data

        app = App(Settings(model_dir="/nonexistent"), _plugins.build_manager([], [Model()]))
        werkzeug.test.Client(app).post("/invocations", data=b"x").close()
        spans = exporter.get_finished_spans()
        ids = {span.context.span_id: span.name for span in spans}
        print(json.dumps([(span.name, ids.get(span.parent.span_id) if span.parent else None) for span in spans]))
        """
    )
    assert _json(done) == [
        ["input_fn", "POST /invocations"],
        ["my-own-span", "predict_fn"],
        ["predict_fn", "POST /invocations"],
        ["output_fn", "POST /invocations"],
        ["POST /invocations", None],
    ]


# A real server with the console exporter ----------------------------------------------------------------------------


def _console_spans(output: str) -> Iterator[dict[str, Any]]:
    """The spans the console exporter printed (indented JSON objects) among the server's JSON log lines."""
    decoder = json.JSONDecoder()
    position = 0
    while (start := output.find("{\n", position)) != -1:
        try:
            value, position = decoder.raw_decode(output, start)
        except json.JSONDecodeError:
            position = start + 1
            continue
        if isinstance(value, dict) and "context" in value and "kind" in value:
            yield value


@pytest.mark.parametrize("backend", ["granian", "gunicorn"])
def test_real_server_with_the_console_exporter(servers: Any, backend: str) -> None:
    """``serve`` with ``OTEL_TRACES_EXPORTER=console``: one request with a ``traceparent`` gives its server span and
    the three hooks' spans, all in the sender's trace, in the server's output; the spans still queued (the batch
    processor exports every 5 s) are exported when the server stops."""
    pytest.importorskip("opentelemetry.sdk")
    server = servers.start(
        "--server",
        backend,
        plugins=["shipping_forecast"],
        env={"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "shipping-forecast"},
    )
    reply = server.request(
        "POST",
        "/invocations",
        b'{"location": "Fair Isle"}',
        {"Content-Type": "application/json", "traceparent": TRACEPARENT, "X-Request-Id": "e2e-1"},
    )
    assert reply.status == 200
    assert server.stop() == 0
    spans = [span for span in _console_spans(server.output()) if span["context"]["trace_id"] == f"0x{TRACE_ID}"]
    assert [span["name"] for span in spans] == [*STAGES, "POST /invocations"], server.output()[-5000:]
    root = spans[-1]
    assert (root["kind"], root["parent_id"]) == ("SpanKind.SERVER", f"0x{PARENT_ID}")
    assert root["attributes"]["http.route"] == "/invocations"
    assert root["attributes"]["http.response.status_code"] == 200
    assert root["attributes"]["inference_server.request_id"] == "e2e-1"
    assert root["resource"]["attributes"]["service.name"] == "shipping-forecast"
    assert {span["parent_id"] for span in spans[:3]} == {root["context"]["span_id"]}
