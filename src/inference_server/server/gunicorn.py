"""The gunicorn backend: its threaded worker, with the drain and worker recycling of :mod:`inference_server.server`.

gunicorn's own arbiter is subclassed for the drain (``handle_term``, ``handle_int``, ``wait_for_signals``,
``manage_workers``, ``kill_worker``, ``stop``, ``kill_workers``, ``WORKERS``) and its threaded worker for SIGTERM
(``handle_exit``); ``post_worker_init`` loads the model while telling the arbiter the worker is alive. Tested with
gunicorn 27.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter
from gunicorn.errors import HaltServer
from gunicorn.workers.gthread import ThreadWorker

from inference_server import _logging
from inference_server._app import App
from inference_server.server import KEEPALIVE, _drain, _state, load_model, server_threads

logger = logging.getLogger("inference_server")


def _post_worker_init(worker: Any) -> None:
    """Join the serving process's state, then load the model, telling the arbiter it is alive while it loads."""
    app: App = worker.wsgi
    app.worker = _state.Worker.attach(_state.recycle_self)  # gunicorn counts --max-requests itself
    loader = threading.Thread(target=load_model, args=(app,), name="model-loader", daemon=True)
    loader.start()
    while loader.is_alive() and worker.alive:
        worker.notify()
        loader.join(1.0)


class Worker(ThreadWorker):  # type: ignore[misc]
    """gunicorn's threaded worker that stops on SIGTERM only when the arbiter or the worker itself sent it.

    A SIGTERM to the whole process group reaches the arbiter too, which drains; the worker goes on serving its
    requests in flight (new ones get 503) until the arbiter stops it.
    """

    def handle_exit(self, sig: int, frame: Any) -> None:
        state = getattr(self.wsgi, "worker", None)
        if state is not None and not state.stop_requested():
            logger.info("Worker %d: SIGTERM from outside; it serves until the serving process stops it", self.pid)
            return
        super().handle_exit(sig, frame)


class _Arbiter(Arbiter):  # type: ignore[misc]
    """gunicorn's arbiter, draining on SIGTERM."""

    def __init__(self, app: GunicornServer) -> None:
        super().__init__(app)
        self.drain = _drain.Drain(app.app.settings)

    def handle_term(self) -> None:
        if self.drain.deadline is not None:
            self.drain.force_exit(signal.SIGTERM, list(self.WORKERS))
        self.drain.start()

    def handle_int(self) -> None:
        self.drain.force_exit(signal.SIGINT, list(self.WORKERS))

    def wait_for_signals(self, timeout: float = 1.0) -> list[int]:
        return super().wait_for_signals(_drain.POLL if self.drain.deadline is not None else timeout)  # type: ignore[no-any-return]

    def manage_workers(self) -> None:
        if self.drain.deadline is None:
            super().manage_workers()
            return
        if self.drain.finished(list(self.WORKERS)):  # while draining, a worker that exits is not replaced
            if self.drain.timed_out:  # the grace period is spent: no second one for the busy workers
                self.kill_workers(signal.SIGKILL)
                raise HaltServer("requests were still in flight at the end of the grace period", 1)
            raise StopIteration

    def kill_worker(self, pid: int, sig: int) -> None:
        if sig == signal.SIGTERM:
            self.drain.supervisor.mark_stop(pid)
        super().kill_worker(pid, sig)

    def stop(self, graceful: bool = True) -> None:
        super().stop(graceful)  # SIGTERMs the workers (kill_worker marks them), waits, SIGKILLs the rest
        self.drain.supervisor.close()


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
            "worker_class": Worker,
            "threads": server_threads(settings),
            # the heartbeat: a worker whose main loop is frozen (a hook holding the GIL) is killed and replaced
            "timeout": settings.timeout + 30 if settings.timeout else 0,
            "graceful_timeout": settings.graceful_timeout,
            "keepalive": KEEPALIVE,
            "max_requests": settings.max_requests,
            "max_requests_jitter": settings.max_requests_jitter,
            "limit_request_line": min(settings.max_header_bytes, 8190),
            "limit_request_field_size": settings.max_header_bytes,
            "loglevel": settings.log_level,
            "logconfig_dict": _logging.dict_config(settings.log_level, ("gunicorn.error", "gunicorn.access")),
            "proc_name": "inference-server",
            "post_worker_init": _post_worker_init,
            "control_socket_disable": True,  # one fixed path shared by every server on the machine
        }.items():
            self.cfg.set(key, value)

    def load(self) -> App:
        return self.app


def run(app: App) -> int:
    """Serve with gunicorn until SIGTERM; gunicorn's arbiter exits the process itself with the status."""
    _Arbiter(GunicornServer(app)).run()
    return 0
