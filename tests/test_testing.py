"""The testing kit for model authors, used in-process on the installed shipping forecast plugin."""

import io
import json
import subprocess
import sys
import types
from typing import Any

import pytest
import shipping_forecast

import inference_server
from inference_server import testing


class JSONSerializer:
    CONTENT_TYPE = "application/json"

    def serialize(self, data: Any) -> str:
        return json.dumps(data)


class JSONDeserializer:
    ACCEPT = ("application/json",)

    def deserialize(self, stream: io.BytesIO, content_type: str) -> Any:
        assert content_type == "application/json"
        return json.load(stream)


def test_predict_with_sdk_style_serializers() -> None:
    """``predict`` serializes, runs every hook and deserializes, like the SageMaker SDK's Predictor."""
    prediction = testing.predict({"location": "Viking"}, serializer=JSONSerializer(), deserializer=JSONDeserializer())
    assert prediction["weather"] == "Thundery showers."


def test_predict_without_serializers_passes_bytes() -> None:
    """Without serializer and deserializer, bytes go in and come out."""
    assert testing.predict(b'{"location": "Forties"}').startswith(b'{"wind"')


def test_predict_raises_with_status_and_message() -> None:
    """A failing request raises AssertionError carrying the status and the server's message."""
    with pytest.raises(
        AssertionError, match=r"answered 500 Internal Server Error: input_fn raised JSONDecodeError; see"
    ):
        testing.predict(b"not json")


def test_post_invocations_returns_any_status() -> None:
    """``post_invocations`` returns the response whatever its status."""
    assert testing.post_invocations(data=b"{}", content_type="application/json").status_code == 500
    response = testing.post_invocations(json={"location": "Fisher"})
    assert (response.status_code, response.json["wind"][:5]) == (200, "South")


def test_client_serves_every_route() -> None:
    """``client()`` is a werkzeug test client of the whole app."""
    client = testing.client()
    assert client.get("/ping").status_code == 200
    assert client.get("/execution-parameters").json["BatchStrategy"] == "MultiRecord"


def test_registration_checks() -> None:
    """The plugin is registered and its hooks are valid; a stray function is not."""
    assert testing.plugin_is_registered(shipping_forecast)
    assert testing.hookimpl_is_valid(shipping_forecast.model_fn)
    assert not testing.hookimpl_is_valid(shipping_forecast._predict_weather)
    assert testing.plugin_manager() is testing.plugin_manager()


def test_an_async_hook_is_valid(only_plugin: Any) -> None:
    """hookimpl_is_valid knows a registered async def hook by the function it was written as."""
    plugin = types.ModuleType("async_plugin")

    @inference_server.plugin_hook
    async def predict_fn(data: Any, model: Any) -> Any:
        return data

    plugin.predict_fn = predict_fn  # type: ignore[attr-defined]
    only_plugin(plugin)
    assert testing.hookimpl_is_valid(predict_fn)
    assert testing.predict(b"x") == b"x"


def test_importable_without_pytest() -> None:
    """The kit imports in a process where pytest cannot be imported."""
    code = "import sys; sys.modules['pytest'] = None; import inference_server.testing as t; print(t.predict(b'x'))"
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={"INFERENCE_SERVER_PLUGINS": "", "PATH": ""},
        check=False,
    )
    assert result.stdout.strip() == "b'x'", result.stderr


def test_an_installed_plugin_of_the_users_cannot_hijack_the_tests(
    plugin_site: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With another plugin installed (on sys.path), the tests' selection keeps it out; unselected, it would win."""
    plugin_site.add(
        "hijacker",
        """
        import inference_server

        @inference_server.plugin_hook(tryfirst=True)
        def input_fn(input_data, content_type):
            raise RuntimeError("not yours")
        """,
    )
    monkeypatch.syspath_prepend(str(plugin_site.path))
    assert testing.post_invocations(json={"location": "Fisher"}).status_code == 200
    monkeypatch.setenv("INFERENCE_SERVER_PLUGINS", "shipping_forecast,hijacker")  # as if nothing were selected
    assert testing.post_invocations(json={"location": "Fisher"}).status_code == 500


class Constant:
    """A plugin whose model answers one constant, counting its model_fn calls."""

    def __init__(self, answer: bytes) -> None:
        self.answer, self.loads = answer, 0

    @inference_server.plugin_hook
    def model_fn(self, model_dir: str) -> Any:
        self.loads += 1
        return lambda data: self.answer


def test_an_unregistered_plugin_no_longer_serves_its_cached_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """After pm.unregister(plugin) the next request loads the model of the plugins still registered."""
    monkeypatch.setenv("INFERENCE_SERVER_PLUGINS", "")
    plugin = Constant(b"from the plugin")
    testing.plugin_manager().register(plugin)
    try:
        assert testing.predict(b"echo me") == b"from the plugin"
        assert testing.predict(b"echo me") == b"from the plugin"
        assert plugin.loads == 1
    finally:
        testing.plugin_manager().unregister(plugin)
    assert testing.predict(b"echo me") == b"echo me"


def test_reset_forgets_the_loaded_model(only_plugin: Any) -> None:
    """testing.reset() (1.x's inference_server._model.cache_clear()) makes the next request call model_fn again."""
    plugin = only_plugin(Constant(b"x"))
    testing.predict(b"")
    testing.predict(b"")
    assert plugin.loads == 1
    testing.reset()
    testing.predict(b"")
    assert plugin.loads == 2
    inference_server._model.cache_clear()
    testing.predict(b"")
    assert plugin.loads == 3
