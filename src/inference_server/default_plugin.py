"""The built-in hooks: they run last, after every installed plugin has returned ``None``."""

from __future__ import annotations

from typing import Any

import orjson
from werkzeug.datastructures import MIMEAccept

from inference_server import _settings
from inference_server._plugins import plugin_hook
from inference_server.errors import NotAcceptable


def _identity(data: Any) -> Any:
    return data


@plugin_hook(trylast=True)
def model_fn(model_dir: str) -> Any:
    """A model that returns its input (an echo server until a plugin says otherwise)."""
    return _identity


@plugin_hook(trylast=True)
def input_fn(input_data: bytes, content_type: str) -> Any:
    """Pass the body through unchanged."""
    return input_data


@plugin_hook(trylast=True)
def predict_fn(data: Any, model: Any) -> Any:
    """Call the model with the data."""
    return model(data)


@plugin_hook(trylast=True)
def output_fn(prediction: Any, accept: MIMEAccept) -> tuple[Any, str]:
    """Bytes pass through as ``application/octet-stream``; anything else is sent as JSON."""
    if isinstance(prediction, (bytes, bytearray, memoryview)):
        return prediction, "application/octet-stream"
    if accept.accept_json:
        return orjson.dumps(prediction, option=orjson.OPT_SERIALIZE_NUMPY), "application/json"
    raise NotAcceptable(f"can only send application/json for a {type(prediction).__name__} prediction")


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
