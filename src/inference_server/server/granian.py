"""The granian backend: its WSGI interface, with the drain and worker replacement of :mod:`inference_server.server`.

This is the only module that touches granian's internals. Tested with granian 2.8 (the pin is ``>=2.8,<3``);
:data:`INTERNALS` lists what :class:`Server` relies on, :func:`check_internals` fails start-up loudly (and a test
fails) if any of it disappears:

- ``MPServer`` methods overridden: ``startup`` (to hear SIGUSR1), ``signal_handler_interrupt`` (SIGTERM drains),
  ``_respawn_workers`` and ``_spawn_worker`` (a replacement waits until its successor listens);
- ``granian._signals.set_main_signals`` (and ``set_loop_signals``, for the event-loop front's workers), wrapped in
  each worker so that a SIGTERM from outside (to the whole process group) does not stop it: the serving process
  drains, then stops it;
- ``MPServer`` attributes read or set: ``wrks`` (the workers; each one's ``idx``, ``inner.pid``, ``start``,
  ``terminate`` and ``is_alive``), ``respawned_wrks`` (granian's crash-loop memory), ``interrupt_children``
  (workers to replace), ``main_loop_interrupt`` (wakes the supervisor), ``interrupt_signal`` (stop),
  ``workers_kill_timeout``.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from granian import _signals as granian_signals
from granian.constants import HTTPModes, Interfaces
from granian.http import HTTP1Settings, HTTP2Settings
from granian.log import LogLevels
from granian.server.mp import MPServer, WorkerProcess

from inference_server import _logging, _plugins
from inference_server._settings import Settings
from inference_server.asgi import ASGI_BACKEND
from inference_server.server import (
    KEEPALIVE,
    SLOW_CLIENT_THREADS,
    _drain,
    _port,
    _preload,
    _state,
    load_model,
    server_threads,
)
from inference_server.wsgi._app import App, Backend
from inference_server.wsgi._asgi import AsgiFront
from inference_server.wsgi._body import Reading
from inference_server.wsgi._rsgi import RsgiFront

logger = logging.getLogger("inference_server")

#: Connections one worker holds at once (granian's ``backpressure``); more wait in the listen queue. Slow or idle
#: clients each hold one until ``--read-timeout``; /ping must still get through thousands of them.
MAX_CONNECTIONS = 8192
#: The listen queue (the kernel caps it at ``net.core.somaxconn``).
BACKLOG = 4096
#: Streams one HTTP/2 connection may have open at once (``--http2``).
MAX_HTTP2_STREAMS = 100
#: The most bytes an HTTP/1 connection's read buffer holds (granian's own default). hyper reads a body in reads of at
#: most this size, and a head must fit in it (else hyper answers 431 itself; a smaller head over
#: ``--max-header-bytes`` reaches the app, which answers 431). At 64 KiB, reading a 100 MB body took twice as long
#: (249 against 129 ms for a bare granian app, benchmarks/README.md, http_large).
READ_BUFFER = 417_792
#: Seconds a replaced worker goes on serving while its successor loads the model, at most.
_READY_WAIT = 120.0

#: granian's internals that this module relies on: ``(owner, attribute)``; MPServer's instance attributes are
#: checked on a constructed server.
INTERNALS: tuple[tuple[object, str], ...] = (
    (granian_signals, "set_main_signals"),
    (granian_signals, "set_loop_signals"),
    *((MPServer, name) for name in ("startup", "signal_handler_interrupt", "_respawn_workers", "_spawn_worker")),
    *((MPServer, name) for name in ("wrks", "respawned_wrks", "interrupt_children", "main_loop_interrupt")),
    *((MPServer, name) for name in ("interrupt_signal", "workers_kill_timeout")),
    *((WorkerProcess, name) for name in ("start", "is_alive", "terminate")),
)


def check_internals(server: MPServer) -> None:
    """Raise RuntimeError naming each granian internal this module relies on that ``server`` lacks."""
    missing = [
        f"{getattr(owner, '__name__', owner)}.{name}"
        for owner, name in INTERNALS
        if not hasattr(server if owner is MPServer else owner, name)
    ]
    if missing:
        import granian

        raise RuntimeError(
            f"granian {granian.__version__} lacks {', '.join(missing)}, which inference-server's drain and worker "
            "replacement rely on (tested with granian 2.8); install 'granian>=2.8,<3' or use --server gunicorn"
        )


#: granian joins a list answer's buffers itself, so the app hands it the arrays' own memory (no copy); its body
#: read, called from a thread of ours, would stall the whole worker while a client is slow to send; it cannot tell
#: the app that a chunked body was cut short (see ``Reading.verifies_chunked``).
BACKEND = Backend(
    bytes_only=False,
    closes_lists=False,
    read_on_server_thread=True,
    check_head=True,
    body=Reading(verifies_chunked=False),
)


#: What the app is told under an event-loop front (``--granian-interface rsgi|asgi``): its WSGI routes are called on
#: the front's bridge threads with the body already read into memory, as a PEP 3333 server would hand it over;
#: granian's RSGI interface cannot tell a chunked body cut short from a whole one, its ASGI interface can.
FRONT_BACKENDS = {
    "rsgi": Backend(check_head=True, body=Reading(verifies_chunked=False)),
    "asgi": ASGI_BACKEND,
}


def granian_rsgi_app() -> RsgiFront:
    """The app factory granian's workers call under ``--granian-interface rsgi``."""
    return RsgiFront(granian_app(FRONT_BACKENDS["rsgi"]))


def granian_asgi_app() -> AsgiFront:
    """The app factory granian's workers call under ``--granian-interface asgi``."""
    return AsgiFront(granian_app(FRONT_BACKENDS["asgi"]))


def granian_app(backend: Backend = BACKEND) -> App:
    """The app factory granian's workers call: the app from the environment (set by ``serve``), model loaded."""
    settings = Settings.from_env()
    app = App(settings, _preload.shared or _plugins.manager(), backend)  # (the preloaded model's plugins: its name)
    app.worker = _state.Worker.attach(_state.recycle_by_supervisor, settings.max_requests, settings.max_requests_jitter)
    if app.worker is not None:
        _stop_only_when_asked(app.worker)
        signal.signal(signal.SIGTERM, _while_loading(app.worker))
        if app.worker.stop_requested():  # (its SIGTERM came before this handler, to the serving process's: lost)
            logger.info("Worker %d: stopped as it started", os.getpid())
            _logging.flush()
            os._exit(0)
    if app.recorder is not None and app.worker is not None:
        app.recorder.start_flushing()
    load_model(app)
    if app.worker is not None:
        app.worker.mark_ready()
    threading.Thread(
        target=_cut_stalled_readers, args=(settings.port, settings.read_timeout), name="write-timeout", daemon=True
    ).start()
    return app


def _cut_stalled_readers(port: int, seconds: int) -> None:
    """granian has no write timeout: a client that stops reading a large answer would hold its connection and the
    answer's memory for ever. ``TCP_USER_TIMEOUT`` on the worker's listening socket, which the sockets it accepts
    inherit (Linux), makes the kernel drop a connection whose sent data has gone unacknowledged (a full window
    included) for ``seconds`` (``--read-timeout``), as gunicorn's ``SO_SNDTIMEO`` does; granian then frees the
    answer. A reader that is slow but steady is not cut. The socket is opened by granian once the model is loaded,
    so it is looked for until it is there."""
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if option is None or not os.path.isdir("/proc/self/fd"):
        return  # not Linux
    deadline = time.monotonic() + _READY_WAIT
    while time.monotonic() < deadline:
        for fd in _port.listening_fds(port):
            with socket.socket(fileno=os.dup(fd)) as listener:  # the same socket: setting it on the copy sets it
                listener.setsockopt(socket.IPPROTO_TCP, option, seconds * 1000)
            logger.info("Worker %d: clients that stop reading are cut after %d s", os.getpid(), seconds)
            return
        time.sleep(0.02)
    logger.warning("Worker %d: no listening socket found; clients that stop reading are not cut off", os.getpid())


def _while_loading(state: _state.Worker) -> Callable[[int, Any], None]:
    """The worker's SIGTERM handler until granian installs its own, once the model is loaded: the serving process's
    stop ends the worker at once (granian would only see it after the load, and then wait out its kill timeout);
    a SIGTERM to the whole process group is left to the serving process, which drains, then stops the worker."""

    def handler(signum: int, frame: Any) -> None:
        if state.stop_requested():
            logger.info("Worker %d: stopped while loading the model", os.getpid())
            _logging.flush()
            os._exit(0)

    return handler


def _stop_only_when_asked(state: _state.Worker) -> None:
    """Make the SIGTERM handler granian's worker is about to install ignore a SIGTERM that the serving process did
    not send (one to the whole process group): the serving process got it too and drains, then stops the worker."""
    install = granian_signals.set_main_signals

    def set_main_signals(interrupt_handler: Any, reload_handler: Any = None) -> None:
        def handler(signum: int, frame: Any) -> None:
            if signum == signal.SIGTERM and not state.stop_requested():
                logger.info(
                    "Worker %d: SIGTERM from outside; it serves until the serving process stops it", os.getpid()
                )
                return
            interrupt_handler(signum, frame)

        install(handler, reload_handler)  # type: ignore[no-untyped-call]

    install_on_loop = granian_signals.set_loop_signals

    def set_loop_signals(loop: Any) -> Any:  # (the event-loop front's workers: granian's handlers on its loop)
        stop = install_on_loop(loop)  # type: ignore[no-untyped-call]

        def handler(signum: int) -> None:
            if not state.stop_requested():  # SIGTERM or SIGINT to the whole group: the serving process handles it
                logger.info(
                    "Worker %d: signal %d from outside; it serves until the serving process stops it",
                    os.getpid(),
                    signum,
                )
                return
            stop.set()

        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, handler, signum)
        return stop

    granian_signals.set_main_signals = set_main_signals
    granian_signals.set_loop_signals = set_loop_signals


class _ThreadWarningFilter(logging.Filter):
    """Drop granian's warning about many Python threads: ours mostly wait (EXTRA_SERVER_THREADS)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Python threads" not in record.getMessage()


def serving(supervisor: _state.Supervisor, pid: int, port: int) -> bool:
    """True once worker ``pid`` has loaded the model and listens on ``port``.

    granian's workers on Linux each listen on their own SO_REUSEPORT socket, opened after the model is loaded: the
    socket is found through /proc (where there is no /proc, the model being loaded has to do).
    """
    if not supervisor.ready(pid):
        return False
    if not os.path.isdir(f"/proc/{pid}/fd"):
        return True
    return bool(_port.sockets_of(pid) & _port.listening_sockets(port))


class Server(MPServer):
    """granian's process supervisor, draining on SIGTERM and replacing workers that ask for it."""

    def __init__(self, settings: Settings, interface: str) -> None:
        self.drain = _drain.Drain(settings)
        self.port = settings.port
        #: Indexes of workers whose successor must be listening before they stop.
        self.replacing: set[int] = set()
        loop = interface != "wsgi"  # an event-loop front: requests on the worker's loop, not granian's threads
        super().__init__(
            f"{__name__}:{'granian_app' if not loop else f'granian_{interface}_app'}",
            address=settings.host,
            port=settings.port,
            interface={"wsgi": Interfaces.WSGI, "rsgi": Interfaces.RSGI, "asgi": Interfaces.ASGI}[interface],
            workers=settings.workers,
            blocking_threads=1 if loop else server_threads(settings) + SLOW_CLIENT_THREADS,
            backlog=BACKLOG,
            backpressure=MAX_CONNECTIONS,
            http=HTTPModes.auto if settings.http2 else HTTPModes.http1,
            http2_settings=HTTP2Settings(
                max_concurrent_streams=MAX_HTTP2_STREAMS, max_headers_size=settings.max_header_bytes
            ),
            http1_settings=HTTP1Settings(  # (hyper's one timer for idle keep-alive and slow headers: see KEEPALIVE)
                header_read_timeout=max(settings.read_timeout, KEEPALIVE) * 1000,
                keep_alive=True,
                max_buffer_size=max(READ_BUFFER, settings.max_header_bytes),
            ),
            factory=True,
            log_level=LogLevels(settings.log_level),
            log_dictconfig=_logging.dict_config(
                settings.log_level, ("_granian", "granian.access"), _logging.resolve_format(settings.log_format)
            ),
            respawn_failed_workers=True,
            workers_kill_timeout=settings.graceful_timeout,
        )

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
            time.sleep(_drain.POLL)
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
        if self.drain.deadline is not None:
            logger.info("Draining: worker(s) %s not replaced", ", ".join(str(idx + 1) for idx in workers))
            for worker in (self.wrks[idx] for idx in workers):  # what those that died held leaves the listings
                if worker.inner.pid and not worker.is_alive():
                    self.drain.supervisor.gone(worker.inner.pid, replaced=False)
            return
        pids = [self.wrks[idx].inner.pid for idx in workers]
        super()._respawn_workers(workers, spawn_target, target_loader, delay)
        for pid in pids:
            if pid:
                self.drain.supervisor.gone(pid, replaced=True)
        self._replace_workers()  # requests from workers that were starting meanwhile

    def _spawn_worker(self, idx: int, target: Any, callback_loader: Any) -> Any:  # type: ignore[override]
        worker: Any = super()._spawn_worker(idx, target, callback_loader)
        terminate = worker.terminate

        def mark_and_terminate() -> None:  # the worker stops on this SIGTERM: it is ours
            if worker.inner.pid:
                self.drain.supervisor.mark_stop(worker.inner.pid)
            terminate()

        worker.terminate = mark_and_terminate
        if idx in self.replacing:  # the old worker stops only once the new one serves (each has its socket)
            self.replacing.discard(idx)
            start = worker.start

            def start_and_wait() -> None:
                start()
                deadline = time.monotonic() + _READY_WAIT
                pid = worker.inner.pid
                while not serving(self.drain.supervisor, pid, self.port) and worker.is_alive():
                    if time.monotonic() > deadline:
                        break
                    time.sleep(_drain.POLL)

            worker.start = start_and_wait
        return worker


def interface_for(app: App) -> str:
    """granian's interface for ``app``: the one asked for, else (``auto``) the ASGI front when a hook is ``async def``
    (its calls are awaited on the loop, where granian's WSGI interface has a thread wait for each; and of the fronts,
    ASGI keeps every promise of the WSGI interface: docs/explanation/backends.md), else WSGI (the fastest for sync
    hooks)."""
    interface = app.settings.granian_interface
    if interface != "auto":
        return interface
    if app.pipeline.asynchronous:
        logger.info(
            "granian's ASGI interface (the event-loop front): a hook is async def, so requests run on each worker's "
            "event loop; --granian-interface wsgi to keep the WSGI interface"
        )
        return "asgi"
    return "wsgi"


def run(app: App) -> int:
    """Serve with granian until SIGTERM; return the exit status. ``app`` checked the plugins and settings."""
    server = Server(app.settings, interface_for(app))
    check_internals(server)
    logging.getLogger("_granian").addFilter(_ThreadWarningFilter())
    try:
        server.serve()
    finally:
        server.drain.supervisor.close()
    return 1 if server.drain.timed_out else 0
