"""The built-in hooks: they run last, after every installed plugin has returned ``None``."""

from __future__ import annotations

import contextvars
import dataclasses
import io
import os
from collections.abc import Iterator
from typing import Any

from werkzeug.datastructures import MIMEAccept

from inference_server import _settings, codecs
from inference_server._hookspecs import plugin_hook
from inference_server.codecs import streams
from inference_server.errors import HookError, NotAcceptable


@dataclasses.dataclass(frozen=True)
class Defaults:
    """What the built-in hooks take from the app that runs them: its decoding limits and default response type."""

    limits: codecs.Limits = dataclasses.field(default_factory=codecs.Limits)
    #: The media type to send when the client accepts anything (``SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT``).
    default_accept: str | None = None
    #: How JSON answers write NaN and infinities: ``null``, ``literal`` or ``error`` (``INFERENCE_SERVER_JSON_NAN``).
    json_nan: str = "null"
    #: ``--default-hooks passthrough``: input_fn and output_fn pass bytes through, as inference-server 1.x's did.
    passthrough: bool = False


#: The running invocation: its app's :class:`Defaults` and the request's media type, set by the pipeline around
#: each invocation (per app, not per process).
current: contextvars.ContextVar[tuple[Defaults, str | None]] = contextvars.ContextVar("inference_server_invocation")


def _invocation() -> tuple[Defaults, str | None]:
    """The running invocation; outside one, the default limits and the environment's defaults."""
    invocation = current.get(None)
    if invocation is None:
        defaults = Defaults(
            default_accept=os.environ.get("SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT") or None,
            passthrough=os.environ.get(_settings.DEFAULT_HOOKS_ENV, "").strip().lower() == "passthrough",
        )
        return defaults, None
    return invocation


def _identity(data: Any) -> Any:
    return data


@plugin_hook(trylast=True)
def model_fn(model_dir: str) -> Any:
    """A model that returns its input (an echo server until a plugin says otherwise)."""
    return _identity


@plugin_hook(trylast=True)
def input_fn(input_data: bytes, content_type: str) -> Any:
    """Decode the body with the codec for its media type; a type no codec knows passes through as bytes.

    With ``--default-hooks passthrough`` the body is passed on as ``bytes`` whatever its type, as in 1.x.
    """
    defaults = _invocation()[0]
    if defaults.passthrough:
        return input_data if isinstance(input_data, bytes) else bytes(input_data)
    if codecs.lookup(content_type) is None:
        return input_data
    return codecs.loads(input_data, content_type, defaults.limits)


@plugin_hook(trylast=True)
def predict_fn(data: Any, model: Any) -> Any:
    """Call the model with the data: ``model(data)``, or ``model.predict(data)`` (scikit-learn, XGBoost, LightGBM)."""
    if callable(model):
        return model(data)
    predict = getattr(model, "predict", None)
    if callable(predict):
        return predict(data)
    message = (
        f"the model, a {type(model).__name__}, is not callable and has no predict method: implement the predict_fn "
        "hook (@inference_server.plugin_hook def predict_fn(data, model): ...) to say how to run it"
    )
    raise HookError("predict_fn", TypeError(message), summary=message)


@plugin_hook(trylast=True)
def output_fn(prediction: Any, accept: MIMEAccept) -> tuple[Any, str]:
    """Encode with the best codec ``accept`` allows for the prediction; bytes pass through as octet-stream.

    When the client accepts anything, the request's own media type wins if it can encode the prediction (JSON in,
    JSON out), then the app's default type (``SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT``), then the prediction's natural
    format: ndarray -> npy, dict of arrays -> npz, Arrow table -> Arrow stream, else JSON. With ``--default-hooks
    passthrough`` the prediction is sent as it is (bytes or str) as ``application/octet-stream``, as in 1.x.
    """
    if isinstance(prediction, (bytes, bytearray, memoryview)):
        return prediction, "application/octet-stream"
    defaults, request = _invocation()
    if defaults.passthrough:
        return prediction, "application/octet-stream"
    if isinstance(prediction, Iterator) and not isinstance(prediction, io.IOBase):
        return _streamed(prediction, accept, defaults.json_nan)
    codec = codecs.negotiate(accept, prediction, default=defaults.default_accept, request=request)
    if defaults.json_nan != "null" and isinstance(codec, (codecs.JSONCodec, codecs.JSONLinesCodec)):
        return codec.encode(prediction, defaults.json_nan), codec.media_type
    return codec.encode(prediction), codec.media_type


def _streamed(prediction: Iterator[Any], accept: MIMEAccept, nan: str) -> tuple[Iterator[Any], str]:
    """A prediction made as an iterator, encoded record by record as it is made (see
    :mod:`inference_server.codecs.streams`): JSON Lines unless the client asks for server-sent events, a JSON array
    or text; records that are bytes are sent as they are. The first record is made here: it decides."""
    try:
        first = next(prediction)
    except StopIteration:
        return iter(()), streams.JSON_LINES
    rest = prediction
    if isinstance(first, (bytes, bytearray, memoryview)):
        return streams.raw(first, rest), "application/octet-stream"
    offered = streams.MEDIA_TYPES if isinstance(first, str) else streams.MEDIA_TYPES[:-1]
    media_type = accept.best_match(offered)
    if media_type is None:
        close = getattr(prediction, "close", None)
        if close is not None:
            close()
        raise NotAcceptable(
            f"the model streams its answer; it can be sent as {', '.join(offered)}, which the Accept header "
            f"({accept}) does not allow"
        )
    return streams.encode(media_type, first, rest, nan), media_type


@plugin_hook(trylast=True)
def model_unload_fn(model: Any) -> None:
    """Nothing: the model is dropped, and Python frees what it holds once nothing else does."""


@plugin_hook(trylast=True)
def model_metadata(model: Any) -> dict[str, Any] | None:
    """No signature: the Open Inference Protocol's metadata lists no tensors, and requests are not checked."""
    return None


@plugin_hook(trylast=True)
def ping_fn(model: Any) -> bool:
    """Healthy once the model is loaded."""
    return True


@plugin_hook(trylast=True)
def batch_strategy() -> _settings.BatchStrategy:
    """``SAGEMAKER_BATCH_STRATEGY``, else MultiRecord."""
    return _settings.env_batch_strategy()


@plugin_hook(trylast=True)
def max_concurrent_transforms() -> int:
    """``SAGEMAKER_MAX_CONCURRENT_TRANSFORMS``, else 1."""
    return _settings.env_max_concurrent_transforms()


@plugin_hook(trylast=True)
def max_payload_in_mb() -> int:
    """``SAGEMAKER_MAX_PAYLOAD_IN_MB``, else 6."""
    return _settings.env_max_payload_in_mb()


@plugin_hook(trylast=True)
def batching() -> dict[str, int] | None:
    """No preference: the options and variables decide (off by default)."""
    return None


@plugin_hook(trylast=True)
def predict_batch_fn(data: list[Any], model: Any) -> list[Any] | None:
    """Leave grouping to the built-in batching."""
    return None
