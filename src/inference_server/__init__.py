"""Turn a model package into an HTTP inference service that speaks the Amazon SageMaker container contract."""

import importlib.metadata

from werkzeug.datastructures import MIMEAccept

from inference_server._app import create_app, warmup
from inference_server._plugins import plugin_hook
from inference_server._settings import BatchStrategy

__all__ = ["BatchStrategy", "MIMEAccept", "__version__", "create_app", "plugin_hook", "warmup"]

__version__ = importlib.metadata.version("inference-server")
