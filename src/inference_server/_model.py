"""inference-server 1.x's name for the loaded-model cache: tests written for 1.x call ``_model.cache_clear()``."""

from inference_server._models import cache_clear

__all__ = ["cache_clear"]
