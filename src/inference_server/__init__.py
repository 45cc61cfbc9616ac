"""Turn a model package into an HTTP inference service that speaks the Amazon SageMaker container contract."""

from __future__ import annotations

import importlib.metadata
from typing import Any

from werkzeug.datastructures import MIMEAccept

from inference_server._app import App
from inference_server._plugins import manager as _manager
from inference_server._plugins import plugin_hook
from inference_server._settings import BatchStrategy, Settings

__all__ = ["BatchStrategy", "MIMEAccept", "__version__", "create_app", "plugin_hook", "warmup"]

__version__ = importlib.metadata.version("inference-server")


def create_app(*, model_dir: str | None = None) -> App:
    """Return the WSGI application, configured from the environment (``model_dir`` overrides it)."""
    return App(Settings.from_env(model_dir=model_dir), _manager())


def warmup(*, model_dir: str | None = None) -> Any:
    """Load the model now (once per process) instead of on the first request; return it."""
    return create_app(model_dir=model_dir).model()
