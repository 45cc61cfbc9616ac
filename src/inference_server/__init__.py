"""Turn a model package into an HTTP inference service that speaks the Amazon SageMaker container contract.

``create_app``, ``warmup``, ``plugin_hook``, ``mapped`` and ``MIMEAccept`` are resolved on first use (as pluggy
resolves its ``__version__``), so that ``import inference_server.client`` or ``inference_server.codecs`` loads neither
the WSGI app nor pluggy nor the server.
"""

import importlib
import typing

from inference_server._settings import BatchStrategy
from inference_server._version import __version__

if typing.TYPE_CHECKING:
    from werkzeug.datastructures import MIMEAccept

    from inference_server._hookspecs import plugin_hook
    from inference_server._mapped import mapped
    from inference_server.wsgi._app import create_app, warmup

__all__ = ["BatchStrategy", "MIMEAccept", "__version__", "create_app", "mapped", "plugin_hook", "warmup"]

#: Public names defined elsewhere: name -> the module that defines it, imported on first use.
_LAZY = {
    "MIMEAccept": "werkzeug.datastructures",
    "create_app": "inference_server.wsgi._app",
    "mapped": "inference_server._mapped",
    "plugin_hook": "inference_server._hookspecs",
    "warmup": "inference_server.wsgi._app",
}


def __getattr__(name: str) -> object:
    if name == "_model":  # 1.x's tests call inference_server._model.cache_clear() without importing it
        return importlib.import_module("inference_server._model")
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # once resolved, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
