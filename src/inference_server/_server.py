"""The HTTP server backends: gunicorn's threaded worker or granian's WSGI interface, with our process lifecycle.

Either runs in the process that ``inference-server serve`` started (no wrapper process), with the worker processes
as its children; each worker loads the model before it accepts traffic. On top of each backend's own supervisor:

- SIGTERM drains: workers answer ``/ping`` and new invocations 503 while requests in flight finish (at most
  ``graceful_timeout`` seconds), then the backend stops as usual and the process exits 0 (1 if time ran out).
  A second SIGTERM, or SIGINT, kills the workers and exits at once with 128 + the signal number.
- A worker that dies is replaced; one that asks to be replaced (``--max-requests``, work stuck past its timeout)
  finishes its requests in flight while a new one takes over.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter
from gunicorn.errors import HaltServer

from inference_server import _lifecycle, _model
from inference_server._app import App
from inference_server._settings import Settings

logger = logging.getLogger("inference_server")

#: Keep idle client connections open longer than the usual 60 s idle timeout of load balancers.
KEEPALIVE = 65
#: Server threads per worker beyond the model's own (``--threads``): /ping and requests waiting for the model must
#: not queue inside the server, where they could neither be answered quickly nor be counted while draining.
EXTRA_SERVER_THREADS = 32
#: How often the serving process checks whether a drain has finished or a new worker is ready.
_DRAIN_POLL = 0.05
#: Seconds a replaced worker goes on serving while its successor loads the model, at most.
_READY_WAIT = 120.0


def server_threads(settings: Settings) -> int:
    """Threads each worker's HTTP server runs requests on."""
    return settings.threads + EXTRA_SERVER_THREADS


def _load_model(app: App) -> None:
    with contextlib.suppress(_model.ModelLoadError):  # logged with its traceback; /ping answers 503
        app.model()


class _Drain:
    """The serving process's side of a graceful stop, shared by both backends."""

    def __init__(self, settings: Settings) -> None:
        self.supervisor = _lifecycle.Supervisor()
        self.grace = settings.graceful_timeout
        self.deadline: float | None = None
        self.timed_out = False

    def start(self) -> None:
        logger.info("SIGTERM: draining; requests in flight get up to %s s to finish", self.grace)
        self.deadline = time.monotonic() + self.grace
        self.supervisor.start_drain()

    def finished(self, pids: list[int]) -> bool:
        """True when the workers ``pids`` have no request in flight, or the grace period is over."""
        busy = self.supervisor.in_flight(pids)
        if not busy:
            logger.info("Drained: no request in flight")
            return True
        if self.deadline is not None and time.monotonic() >= self.deadline:
            logger.error("Grace period of %s s over with %d request(s) in flight; stopping anyway", self.grace, busy)
            self.timed_out = True
            return True
        return False

    def force_exit(self, signum: int, pids: list[int]) -> NoReturn:
        logger.warning("%s: stopping at once", signal.Signals(signum).name)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        self.supervisor.close()
        os._exit(128 + signum)


# gunicorn


def _post_worker_init(worker: Any) -> None:
    """Join the serving process's state, then load the model, telling the arbiter it is alive while it loads."""
    app: App = worker.wsgi
    app.worker = _lifecycle.Worker.attach(_lifecycle.recycle_self)  # gunicorn counts --max-requests itself
    loader = threading.Thread(target=_load_model, args=(app,), name="model-loader", daemon=True)
    loader.start()
    while loader.is_alive() and worker.alive:
        worker.notify()
        loader.join(1.0)


class _Arbiter(Arbiter):  # type: ignore[misc]
    """gunicorn's arbiter, draining on SIGTERM."""

    def __init__(self, app: GunicornServer) -> None:
        super().__init__(app)
        self.drain = _Drain(app.app.settings)

    def handle_term(self) -> None:
        if self.drain.deadline is not None:
            self.drain.force_exit(signal.SIGTERM, list(self.WORKERS))
        self.drain.start()

    def handle_int(self) -> None:
        self.drain.force_exit(signal.SIGINT, list(self.WORKERS))

    def wait_for_signals(self, timeout: float = 1.0) -> list[int]:
        return super().wait_for_signals(_DRAIN_POLL if self.drain.deadline is not None else timeout)  # type: ignore[no-any-return]

    def manage_workers(self) -> None:
        if self.drain.deadline is not None and self.drain.finished(list(self.WORKERS)):
            if self.drain.timed_out:  # the grace period is spent: no second one for the busy workers
                self.kill_workers(signal.SIGKILL)
                raise HaltServer("requests were still in flight at the end of the grace period", 1)
            raise StopIteration
        super().manage_workers()

    def halt(self, reason: str | None = None, exit_status: int = 0) -> None:
        self.drain.supervisor.close()
        super().halt(reason, exit_status)


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
            "errorlog": "-",
            "proc_name": "inference-server",
            "post_worker_init": _post_worker_init,
            "control_socket_disable": True,  # one fixed path shared by every server on the machine
        }.items():
            self.cfg.set(key, value)

    def load(self) -> App:
        return self.app

    def run(self) -> None:
        _Arbiter(self).run()


# granian


def granian_app() -> App:
    """The app factory granian's workers call: the app from the environment (set by ``serve``), model loaded.

    granian writes any bytes-like body item, so the app hands it the arrays' own memory (no copy)."""
    from inference_server import _plugins

    settings = Settings.from_env()
    app = App(settings, _plugins.manager(), bytes_only=False)
    app.worker = _lifecycle.Worker.attach(
        _lifecycle.recycle_by_supervisor, settings.max_requests, settings.max_requests_jitter
    )
    _load_model(app)
    if app.worker is not None:
        app.worker.mark_ready()
    return app


class _ThreadWarningFilter(logging.Filter):
    """Drop granian's warning about many Python threads: ours mostly wait (EXTRA_SERVER_THREADS)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Python threads" not in record.getMessage()


def _serving(supervisor: _lifecycle.Supervisor, pid: int, port: int) -> bool:
    """True once worker ``pid`` has loaded the model and listens on ``port``.

    granian's workers on Linux each listen on their own SO_REUSEPORT socket, opened after the model is loaded: the
    socket is found through /proc (where there is no /proc, the model being loaded has to do).
    """
    if not supervisor.ready(pid):
        return False
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return True
    sockets = set()
    for fd in fds:
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                sockets.add(target[8:-1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port and inode in sockets:  # 0A: LISTEN
                    return True
    return False


def run_granian(app: App) -> int:
    """Serve with granian until SIGTERM; return the exit status. ``app`` checked the plugins and settings."""
    from granian.constants import Interfaces
    from granian.http import HTTP1Settings
    from granian.log import LogLevels
    from granian.server.mp import MPServer

    class Server(MPServer):
        """granian's process supervisor, draining on SIGTERM and replacing workers that ask for it."""

        drain = _Drain(app.settings)
        replacing: set[int] = set()  # noqa: RUF012  (one server per process)

        def _pids(self) -> list[int]:
            return [worker.inner.pid for worker in self.wrks if worker.inner.pid]

        def startup(self, spawn_target: Any, target_loader: Any) -> None:
            super().startup(spawn_target, target_loader)  # type: ignore[no-untyped-call]
            signal.signal(signal.SIGUSR1, self._replace_workers)

        def signal_handler_interrupt(self, signum: int = signal.SIGINT, frame: Any = None) -> None:
            if signum != signal.SIGTERM or self.drain.deadline is not None:
                self.drain.force_exit(signum, self._pids())
            self.drain.start()
            threading.Thread(target=self._wait_for_drain, name="drain", daemon=True).start()

        def _wait_for_drain(self) -> None:
            while not self.drain.finished(self._pids()):
                time.sleep(_DRAIN_POLL)
            if self.drain.timed_out:  # the grace period is spent: busy workers get 1 s more, then SIGKILL
                self.workers_kill_timeout = 1
            self.interrupt_signal = True
            self.main_loop_interrupt.set()

        def _replace_workers(self, signum: int = signal.SIGUSR1, frame: Any = None) -> None:
            if self.drain.deadline is not None:
                return  # every worker stops soon anyway
            asked = self.drain.supervisor.recycle_requests(self._pids())
            for worker in self.wrks:
                if worker.inner.pid in asked:
                    # granian's own path for a failed worker: start a new one, then stop the old one gracefully
                    self.respawned_wrks.pop(worker.idx, None)  # a requested replacement is not a crash loop
                    self.replacing.add(worker.idx)
                    self.interrupt_children.append(worker.idx)
            if asked:
                self.main_loop_interrupt.set()

        def _respawn_workers(self, workers: Any, spawn_target: Any, target_loader: Any, delay: float = 0) -> None:
            super()._respawn_workers(workers, spawn_target, target_loader, delay)
            self._replace_workers()  # requests from workers that were starting meanwhile

        def _spawn_worker(self, idx: int, target: Any, callback_loader: Any) -> Any:  # type: ignore[override]
            worker: Any = super()._spawn_worker(idx, target, callback_loader)
            if idx in self.replacing:  # the old worker stops only once the new one serves (each has its socket)
                self.replacing.discard(idx)
                start = worker.start

                def start_and_wait() -> None:
                    start()
                    deadline = time.monotonic() + _READY_WAIT
                    pid = worker.inner.pid
                    while not _serving(self.drain.supervisor, pid, settings.port) and worker.is_alive():
                        if time.monotonic() > deadline:
                            break
                        time.sleep(_DRAIN_POLL)

                worker.start = start_and_wait
            return worker

    settings = app.settings
    server = Server(
        f"{__name__}:granian_app",
        address=settings.host,
        port=settings.port,
        interface=Interfaces.WSGI,
        workers=settings.workers,
        blocking_threads=server_threads(settings),
        http1_settings=HTTP1Settings(
            header_read_timeout=min(settings.read_timeout, 60) * 1000,
            keep_alive=True,
            max_buffer_size=settings.max_header_bytes,
        ),
        factory=True,
        log_level=LogLevels(settings.log_level),
        respawn_failed_workers=True,
        workers_kill_timeout=settings.graceful_timeout,
    )
    logging.getLogger("_granian").addFilter(_ThreadWarningFilter())
    try:
        server.serve()
    finally:
        server.drain.supervisor.close()
    return 1 if server.drain.timed_out else 0
