"""The installed distribution's version, read once from its metadata.

A leaf that imports nothing of ours: the modules that name the version (the package's face, the CLI, v2's server
metadata, the tracer's scope) take it from here rather than from ``inference_server``, whose lazy names lead up to
the app.
"""

import importlib.metadata

__all__ = ["__version__"]

__version__ = importlib.metadata.version("inference-server")
