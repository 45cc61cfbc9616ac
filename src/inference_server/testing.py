"""Helpers for testing a model plugin in-process, without starting a server (no pytest needed).

The serializers and deserializers follow the SageMaker Python SDK's interface: a serializer has
``serialize(data)`` and ``CONTENT_TYPE``; a deserializer has ``deserialize(stream, content_type)`` and ``ACCEPT``.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

import orjson
import pluggy
import werkzeug.test

import inference_server
from inference_server import _models, _plugins

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIApplication

    from inference_server.transform import BatchPredictor

__all__ = [
    "batch_predictor",
    "client",
    "hookimpl_is_valid",
    "plugin_is_registered",
    "plugin_manager",
    "post_invocations",
    "predict",
    "reset",
]


class Serializer(Protocol):
    """What :func:`predict` needs of a serializer (any SageMaker SDK serializer fits)."""

    CONTENT_TYPE: str

    def serialize(self, data: Any) -> Any: ...


class Deserializer(Protocol):
    """What :func:`predict` needs of a deserializer (any SageMaker SDK deserializer fits)."""

    ACCEPT: str | Sequence[str]

    def deserialize(self, stream: Any, content_type: str) -> Any: ...


def client(*, model_dir: str | None = None) -> werkzeug.test.Client:
    """A :class:`werkzeug.test.Client` for the inference-server app, with the installed plugins."""
    app = inference_server.create_app(model_dir=model_dir)  # bytes_only: its body items are bytes, as PEP 3333 says
    return werkzeug.test.Client(cast("WSGIApplication", app))


def post_invocations(*, model_dir: str | None = None, **request_kwargs: Any) -> werkzeug.test.TestResponse:
    """POST to ``/invocations`` and return the response, whatever its status.

    ``request_kwargs`` go to :meth:`werkzeug.test.Client.post` (``data=``, ``json=``, ``content_type=``,
    ``headers=``, ...).
    """
    return client(model_dir=model_dir).post("/invocations", **request_kwargs)


def predict(
    data: Any,
    *,
    serializer: Serializer | None = None,
    deserializer: Deserializer | None = None,
    model_dir: str | None = None,
) -> Any:
    """Send ``data`` through the whole pipeline (``input_fn`` to ``output_fn``) and return the deserialized answer.

    Without a serializer ``data`` must be bytes and is sent as ``application/octet-stream``; without a deserializer
    the response body is returned as bytes. A response other than 200 raises :class:`AssertionError` with the
    status and the server's message.
    """
    if serializer is None:
        body, content_type = data, "application/octet-stream"
    else:
        body, content_type = serializer.serialize(data), serializer.CONTENT_TYPE
    accept = "*/*"
    if deserializer is not None:
        accept = deserializer.ACCEPT if isinstance(deserializer.ACCEPT, str) else ", ".join(deserializer.ACCEPT)
    response = post_invocations(model_dir=model_dir, data=body, content_type=content_type, headers={"Accept": accept})
    if response.status_code != 200:
        raise AssertionError(f"POST /invocations answered {response.status}: {_message(response.data)}")
    if deserializer is None:
        return response.data
    return deserializer.deserialize(io.BytesIO(response.data), response.content_type or "")


def batch_predictor(*, model_dir: str | None = None) -> BatchPredictor:
    """The installed plugins as a Batch Transform job runs them, without HTTP: ``predict(body, content_type,
    accept)`` for one request, ``predict_records(lines, ...)`` for lines packed into requests as a job packs them
    (SingleRecord or MultiRecord up to MaxPayloadInMB). Hook failures raise as they are, for the test to see."""
    from inference_server.transform import BatchPredictor

    return BatchPredictor(model_dir=model_dir)


def _message(body: bytes) -> str:
    try:
        return str(orjson.loads(body)["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return body.decode(errors="replace")


def reset() -> None:
    """Forget every loaded model, so that the next request calls ``model_fn`` again (1.x's
    ``inference_server._model.cache_clear()``). Registering or unregistering a plugin does this for its manager."""
    _models.cache_clear()


def plugin_manager() -> pluggy.PluginManager:
    """The plugin manager the server uses, with the built-in defaults and the installed plugins."""
    return _plugins.manager()


def plugin_is_registered(plugin: object) -> bool:
    """Whether ``plugin`` (usually a module) is registered, i.e. its entry point is installed."""
    return plugin_manager().is_registered(plugin)


def hookimpl_is_valid(function: Callable[..., Any]) -> bool:
    """Whether ``function`` is a registered implementation of the inference-server hook of the same name."""
    hook = getattr(plugin_manager().hook, function.__name__, None)
    if hook is None or hook.spec is None:
        return False
    # an async def one is registered wrapped (see _plugins._synchronize), the function it was written as __wrapped__
    return any(
        impl.function is function or getattr(impl.function, "__wrapped__", None) is function
        for impl in hook.get_hookimpls()
    )
