"""One log format for our lines and the HTTP server backends' (granian's and gunicorn's), on stderr."""

from __future__ import annotations

import logging
from typing import Any

FORMAT = "%(asctime)s [%(process)d] [%(levelname)s] %(name)s: %(message)s"


def configure(level: int) -> None:
    """Log our lines (logger ``inference_server``) in :data:`FORMAT` at ``level``."""
    logging.basicConfig(level=level, format=FORMAT)


def dict_config(level: str, loggers: tuple[str, ...]) -> dict[str, Any]:
    """A :func:`logging.config.dictConfig` that writes the backend's ``loggers`` in :data:`FORMAT` on stderr."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"generic": {"format": FORMAT}, "access": {"format": FORMAT}},
        "handlers": {
            "console": {"class": "logging.StreamHandler", "formatter": "generic", "stream": "ext://sys.stderr"},
            "access": {"class": "logging.StreamHandler", "formatter": "access", "stream": "ext://sys.stderr"},
        },
        "loggers": {
            name: {"handlers": ["access" if name.endswith("access") else "console"], "level": level.upper(),
                   "propagate": False}
            for name in loggers
        },
    }  # fmt: skip
