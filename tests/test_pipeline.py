"""One invocation without HTTP: the hooks in order, their output as buffers, and per-app codec settings."""

from __future__ import annotations

import contextvars
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import werkzeug.exceptions
import werkzeug.test

from inference_server import _pipeline, _plugins, codecs, plugin_hook
from inference_server._settings import Settings
from inference_server.errors import DecodeError, HookError, UnsupportedMediaType

NPY = "application/x-npy"
NPZ = "application/x-npz"
JSON = "application/json"


class _Payload:
    """A model whose MaxPayloadInMB is ``mb``."""

    def __init__(self, mb: int) -> None:
        self.mb = mb

    @plugin_hook
    def max_payload_in_mb(self) -> int:
        return self.mb


def _pipeline_with(*plugins: object, **settings: Any) -> _pipeline.Pipeline:
    return _pipeline.Pipeline(Settings(model_dir="/nonexistent", **settings), _plugins.build_manager([], plugins))


def test_invoke_runs_the_default_hooks_and_returns_buffers() -> None:
    """An npy body is decoded, echoed by the default model and encoded back, as buffers of the array's memory."""
    pipeline = _pipeline_with()
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    output = pipeline.invoke(codecs.dumps(array, NPY), NPY, "*/*", pipeline.model())
    assert (output.media_type, output.headers) == (NPY, [])
    body = b"".join(bytes(buffer) for buffer in output.buffers)
    assert output.nbytes == len(body)
    assert np.array_equal(codecs.loads(body, NPY), array)


def test_invoke_passes_output_fn_headers_and_str_bodies() -> None:
    """``output_fn``'s optional third item becomes headers; a str body is sent as UTF-8."""

    class Greeting:
        @plugin_hook
        def output_fn(self, prediction: Any, accept: Any) -> Any:
            return "héllo", "text/plain", {"X-Amzn-SageMaker-Custom-Attributes": "a=1"}

    pipeline = _pipeline_with(Greeting())
    output = pipeline.invoke(b"", "application/octet-stream", "*/*", pipeline.model())
    assert output[:3] == ([b"h\xc3\xa9llo"], "text/plain", [("X-Amzn-SageMaker-Custom-Attributes", "a=1")])
    assert output.stream is None


def test_output_fn_returning_something_else_is_a_hook_error() -> None:
    """An ``output_fn`` that returns neither a pair nor a triple is the plugin's bug, named as such."""

    class Bad:
        @plugin_hook
        def output_fn(self, prediction: Any, accept: Any) -> Any:
            return b"body only"

    pipeline = _pipeline_with(Bad())
    with pytest.raises(HookError, match=r"output_fn returned a bytes, not \(body, content_type\)") as caught:
        pipeline.invoke(b"x", "application/octet-stream", "*/*", pipeline.model())
    assert isinstance(caught.value.error, TypeError)


def test_a_hook_raising_is_named_and_http_errors_pass_through() -> None:
    """Whatever a hook raises comes out as HookError naming that hook; an HTTP exception keeps its status."""

    class Failing:
        @plugin_hook
        def predict_fn(self, data: Any, model: Any) -> Any:
            if bytes(data) == b"teapot":
                raise werkzeug.exceptions.ImATeapot("short and stout")
            raise ValueError("secret patient data")

    pipeline = _pipeline_with(Failing())
    with pytest.raises(HookError) as caught:
        pipeline.invoke(b"x", "application/octet-stream", "*/*", pipeline.model())
    assert (caught.value.hook, caught.value.summary) == ("predict_fn", "predict_fn raised ValueError")
    assert "secret" not in str(caught.value)
    with pytest.raises(werkzeug.exceptions.ImATeapot):
        pipeline.invoke(b"teapot", "application/octet-stream", "*/*", pipeline.model())


def test_bytes_for_want_of_a_codec_that_the_model_fails_on_are_a_415() -> None:
    """A body whose Content-Type no codec knows reaches the model as bytes; if the model fails on them, the client's
    type is the likely mistake: a 415 naming it, caused by the model's exception."""

    class Strict:
        @plugin_hook
        def predict_fn(self, data: Any, model: Any) -> Any:
            return data["location"]

    pipeline = _pipeline_with(Strict())
    with pytest.raises(UnsupportedMediaType) as caught:
        pipeline.invoke(b'{"location": "Fair Isle"}', "application/jsn", "*/*", pipeline.model())
    assert caught.value.description.startswith("the Content-Type application/jsn matches no codec")
    assert isinstance(caught.value.__cause__, TypeError)
    with pytest.raises(HookError):  # a known type that the model fails on is the model's error
        pipeline.invoke(b'{"location": 1}', "application/octet-stream", "*/*", pipeline.model())


def test_a_model_that_takes_bytes_and_fails_otherwise_is_a_500() -> None:
    """A body of a type no codec knows (an image) whose model fails in a way that says nothing of the data's kind
    (out of memory): the model's error, a 500, not a 415 blaming the client."""

    class ImageModel:
        @plugin_hook
        def predict_fn(self, data: Any, model: Any) -> Any:
            raise RuntimeError("CUDA out of memory")

    pipeline = _pipeline_with(ImageModel())
    with pytest.raises(HookError, match="predict_fn raised RuntimeError"):
        pipeline.invoke(b"\xff\xd8\xff", "image/jpeg", "*/*", pipeline.model())


def test_accept_reaches_output_fn_parsed_once() -> None:
    """``output_fn`` gets werkzeug's MIMEAccept, the same object for the same header (parsed once, not per call)."""
    seen: list[Any] = []

    class Recorder:
        @plugin_hook
        def output_fn(self, prediction: Any, accept: Any) -> Any:
            seen.append(accept)
            return b"", "application/octet-stream"

    pipeline = _pipeline_with(Recorder())
    for _ in range(2):
        pipeline.invoke(b"", "application/octet-stream", "application/json;q=0.5, text/csv", pipeline.model())
    assert seen[0] is seen[1]
    assert (seen[0].best, seen[0]["application/json"]) == ("text/csv", 0.5)


def test_codec_limits_are_per_pipeline(npz_bomb: Callable[..., bytes]) -> None:
    """Two pipelines in one process keep their own MaxPayloadInMB's decoding limits, whichever ran last."""
    body = npz_bomb(1, declared=1500 << 20)  # declares 1.5 GiB: over 60 MiB (6 MB payload), under 2 GB (200 MB)
    small, large = _pipeline_with(), _pipeline_with(_Payload(200))
    for pipeline, message in [(large, "inflates to fewer bytes"), (small, "at most 62914560"), (large, "fewer")]:
        with pytest.raises(DecodeError, match=message):
            pipeline.invoke(body, NPZ, "*/*", pipeline.model())


class _Counter:
    """A model answering an array whatever it is sent."""

    @plugin_hook
    def predict_fn(self, data: Any, model: Any) -> Any:
        return np.arange(len(data))


def test_default_accept_is_per_pipeline() -> None:
    """Each pipeline's ``default_accept`` picks its response type under ``*/*`` (when the request's type cannot)."""
    as_json, as_npy = _pipeline_with(_Counter(), default_accept=JSON), _pipeline_with(_Counter())
    assert as_json.invoke(b"abc", "text/plain", "*/*", as_json.model()).media_type == JSON
    assert as_npy.invoke(b"abc", "text/plain", "*/*", as_npy.model()).media_type == NPY


def test_the_request_type_wins_over_the_default_accept() -> None:
    """Under ``*/*`` a JSON request is answered in JSON even when the default type is npy; an explicit Accept wins."""
    pipeline = _pipeline_with(_Counter(), default_accept=NPY)
    assert pipeline.invoke(b"[1, 2]", JSON, "*/*", pipeline.model()).media_type == JSON
    assert pipeline.invoke(b"[1, 2]", JSON, NPY, pipeline.model()).media_type == NPY


def test_unhealthy_follows_ping_fn_and_the_model() -> None:
    """``unhealthy()`` is None when ping_fn says yes, else why not: a failing model_fn or a raising ping_fn is a
    reason, not an error."""

    class Sick:
        @plugin_hook
        def ping_fn(self, model: Any) -> bool:
            return False

    class Raising:
        @plugin_hook
        def ping_fn(self, model: Any) -> bool:
            raise RuntimeError("probe failed")

    class Broken:
        @plugin_hook
        def model_fn(self, model_dir: str) -> Any:
            raise OSError("weights missing")

    assert _pipeline_with().unhealthy() is None
    reasons = [_pipeline_with(plugin).unhealthy() for plugin in (Sick(), Raising(), Broken())]
    assert reasons[:2] == ["ping_fn returned False", "ping_fn raised RuntimeError; see the server log"]
    assert str(reasons[2]).startswith("the model failed to load: ")


def test_execution_parameters_and_body_limit_come_from_the_hooks() -> None:
    """MaxPayloadInMB from the hook sets the body limit in bytes; 0 means none."""
    assert _pipeline_with(_Payload(12)).max_body == 12 << 20
    assert _pipeline_with(_Payload(0)).max_body is None
    assert _pipeline_with(_Payload(12)).execution_parameters["MaxPayloadInMB"] == 12


SCRIPT = """
    def model_fn(model_dir):
        return {name!r}

    def predict_fn(data, model):
        return model

    def output_fn(prediction, accept):
        return prediction, "text/plain"
"""


def _script_pipeline(tmp_path: Path, shared: Any, name: str) -> _pipeline.Pipeline:
    (tmp_path / name).mkdir()
    script = tmp_path / name / "inference.py"
    script.write_text(textwrap.dedent(SCRIPT.format(name=name)))
    return _pipeline.Pipeline(Settings(model_dir=str(tmp_path), script=str(script)), shared)


@pytest.mark.parametrize("order", ["ab", "ba"])
def test_two_pipelines_with_two_scripts_keep_their_own_hooks_and_models(tmp_path: Path, order: str) -> None:
    """Building a second pipeline with another script (same plugins, same model directory) changes nothing of the
    first: each loads and answers with its own model, whichever was built and loaded first."""
    shared = _plugins.build_manager([])
    pipelines = {}
    for name in order:
        pipelines[name] = _script_pipeline(tmp_path, shared, name)
        assert pipelines[name].model() == name
    for name, pipeline in pipelines.items():
        assert pipeline.model() == name
        output = pipeline.invoke(b"", "application/octet-stream", "*/*", pipeline.model())
        assert output.buffers == [name.encode()]
    assert not [name for name, _ in shared.list_name_plugin() if name.startswith("script:")]


_seen: contextvars.ContextVar[str] = contextvars.ContextVar("test_seen")


class _ContextPlugin:
    """input_fn sets a context variable from the body (unless the body is empty); the later hooks report it."""

    @plugin_hook
    def input_fn(self, input_data: Any, content_type: str) -> Any:
        if input_data:
            _seen.set(bytes(input_data).decode())
        return b""

    @plugin_hook
    def predict_fn(self, data: Any, model: Any) -> Any:
        return _seen.get("unset")

    @plugin_hook
    def output_fn(self, prediction: Any, accept: Any) -> Any:
        return f"{prediction} {_seen.get('unset')}", "text/plain"


def test_a_context_variable_set_in_input_fn_is_seen_by_that_invocation_only() -> None:
    """What input_fn sets is seen by predict_fn and output_fn of the same invocation, never by the next one on the
    same thread, nor by the caller."""
    pipeline = _pipeline_with(_ContextPlugin())
    model = pipeline.model()
    assert pipeline.invoke(b"first", "text/plain", "*/*", model).buffers == [b"first first"]
    assert pipeline.invoke(b"", "text/plain", "*/*", model).buffers == [b"unset unset"]
    assert _seen.get("unset") == "unset"


def test_the_hooks_see_the_requests_context_on_the_servers_helper_threads() -> None:
    """Through the WSGI app, whose hooks run on reused helper threads (a deadline): each request's hooks see the
    caller's context variables, and nothing one request set reaches the next."""
    from inference_server.wsgi._app import App

    app = App(Settings(model_dir="/nonexistent", timeout=30), _plugins.build_manager([], [_ContextPlugin()]))
    client = werkzeug.test.Client(app)
    assert client.post("/invocations", data=b"first").get_data() == b"first first"
    assert client.post("/invocations", data=b"").get_data() == b"unset unset"
    token = _seen.set("caller")
    try:
        assert client.post("/invocations", data=b"").get_data() == b"caller caller"
    finally:
        _seen.reset(token)
