"""The HTTP server backends: gunicorn's threaded worker or granian's WSGI interface.

Either runs in the process that ``inference-server serve`` started (no wrapper process), with the worker processes
as its children; each worker loads the model before it accepts traffic.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from gunicorn.app.base import BaseApplication

from inference_server import _model
from inference_server._app import App

logger = logging.getLogger("inference_server")

#: Seconds workers get to finish requests after SIGTERM; SageMaker sends SIGKILL 30 s after SIGTERM.
GRACEFUL_TIMEOUT = 25
#: Keep idle client connections open longer than the usual 60 s idle timeout of load balancers.
KEEPALIVE = 65


def _load_model(app: App) -> None:
    with contextlib.suppress(_model.ModelLoadError):  # logged with its traceback; /ping answers 503
        app.model()


def _post_worker_init(worker: Any) -> None:
    """Load the model before the worker accepts traffic, telling the arbiter it is alive while a slow model loads."""
    loader = threading.Thread(target=_load_model, args=(worker.wsgi,), name="model-loader", daemon=True)
    loader.start()
    while loader.is_alive() and worker.alive:
        worker.notify()
        loader.join(1.0)


class GunicornServer(BaseApplication):  # type: ignore[misc]
    """gunicorn configured from our settings; ``run()`` serves until SIGTERM and exits the process."""

    def __init__(self, app: App) -> None:
        self.app = app
        super().__init__()

    def load_config(self) -> None:
        settings = self.app.settings
        host = f"[{settings.host}]" if ":" in settings.host else settings.host
        for key, value in {
            "bind": [f"{host}:{settings.port}"],
            "workers": settings.workers,
            "worker_class": "gthread",
            "threads": settings.threads,
            "timeout": settings.timeout,
            "graceful_timeout": GRACEFUL_TIMEOUT,
            "keepalive": KEEPALIVE,
            "loglevel": settings.log_level,
            "errorlog": "-",
            "proc_name": "inference-server",
            "post_worker_init": _post_worker_init,
            "control_socket_disable": True,  # gunicorn 24+: one fixed path shared by every server on the machine
        }.items():
            if key in self.cfg.settings:  # options newer than the oldest gunicorn we support
                self.cfg.set(key, value)

    def load(self) -> App:
        return self.app


def granian_app() -> App:
    """The app factory granian's workers call: the app from the environment (set by ``serve``), model loaded.

    granian writes any bytes-like body item, so the app hands it the arrays' own memory (no copy)."""
    from inference_server import _plugins
    from inference_server._settings import Settings

    app = App(Settings.from_env(), _plugins.manager(), bytes_only=False)
    _load_model(app)
    return app


def run_granian(app: App) -> None:
    """Serve with granian until SIGTERM; ``app`` was built in this process to check the plugins and settings."""
    from granian import Granian
    from granian.constants import Interfaces
    from granian.log import LogLevels

    settings = app.settings
    Granian(
        f"{__name__}:granian_app",
        address=settings.host,
        port=settings.port,
        interface=Interfaces.WSGI,
        workers=settings.workers,
        blocking_threads=settings.threads,
        factory=True,
        log_level=LogLevels(settings.log_level),
        workers_kill_timeout=GRACEFUL_TIMEOUT,
    ).serve()
