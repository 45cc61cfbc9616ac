"""The gunicorn backend: its threaded worker, with the drain and worker recycling of :mod:`inference_server.server`.

What of gunicorn is subclassed or replaced (tested with gunicorn 27):

- the arbiter, for the drain: ``handle_term``, ``handle_int``, ``wait_for_signals``, ``manage_workers``,
  ``kill_worker``, ``stop``, ``kill_workers``, ``WORKERS``;
- the threaded worker: ``handle_exit`` (SIGTERM), ``handle`` (socket timeouts), ``handle_error`` (error bodies,
  rewriting the page ``gunicorn.util.write_error`` writes), ``enqueue_req`` and ``handle_request`` (when a request
  arrived, so that one waiting for a thread when a drain begins is answered);
- the request class, installed as ``RequestParser.mesg_class``: ``max_buffer_headers`` (the whole header section
  bounded) and ``_expected_100_continue`` (``100 Continue`` left to the app);
- ``post_worker_init`` loads the model while telling the arbiter the worker is alive.
"""

from __future__ import annotations

import contextlib
import html
import json
import logging
import os
import random
import re
import signal
import socket
import struct
import threading
import time
from typing import Any

import gunicorn.http.errors
import gunicorn.http.message
import gunicorn.http.parser
import gunicorn.util
from gunicorn import glogging
from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter
from gunicorn.errors import HaltServer
from gunicorn.workers.gthread import ThreadWorker

from inference_server import _logging
from inference_server.server import KEEPALIVE, SLOW_CLIENT_THREADS, _drain, _state, load_model, server_threads
from inference_server.wsgi._app import App, Backend
from inference_server.wsgi._body import Reading

logger = logging.getLogger("inference_server")

#: Connections one worker holds at once (kept-alive ones included); more wait in the listen queue.
WORKER_CONNECTIONS = 4096


def _child_exit(arbiter: _Arbiter, worker: Any) -> None:
    """A worker exited: account for it (replaced, unless the server is stopping)."""
    arbiter.drain.supervisor.gone(worker.pid, replaced=arbiter.drain.deadline is None)


def _post_worker_init(worker: Any) -> None:
    """Join the serving process's state, then load the model, telling the arbiter it is alive while it loads."""
    app: App = worker.wsgi
    app.worker = _state.Worker.attach(_state.recycle_self)  # gunicorn counts --max-requests itself
    if app.recorder is not None and app.worker is not None:
        app.recorder.start_flushing()
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

    def handle(self, conn: Any) -> Any:
        """Serve a connection whose client cannot hold a thread forever by not reading (or not sending).

        ``SO_SNDTIMEO`` / ``SO_RCVTIMEO`` of ``--read-timeout``: a send or a receive that makes no progress for that
        long fails and gunicorn closes the connection; a client that reads slowly but steadily is not cut off.
        """
        if not getattr(conn, "timeouts_set", False):
            seconds = self.wsgi.settings.read_timeout
            timeval = struct.pack("ll", seconds, 0)
            with contextlib.suppress(OSError):
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
            conn.timeouts_set = True
        keepalive = super().handle(conn)
        if keepalive is False:
            _close_here(conn)
        return keepalive

    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        """gunicorn's own refusals (a request it cannot parse, headers over the limits) in our JSON error shape.

        gunicorn decides the status and logs as usual; its HTML page is captured and rewritten.
        """
        page = _Captured()
        super().handle_error(req, page, addr, exc)
        head, _, html_page = bytes(page.data).decode("latin-1").partition("\r\n\r\n")
        parts = head.split(" ", 2)
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 500
        reason = parts[2].split("\r\n", 1)[0] if len(parts) > 2 else "Error"
        found = re.search(r"</h1>(.*)</body>", html_page, re.S)
        message = html.unescape(found.group(1)).strip() if found else ""
        if status >= 500:
            message = "the server failed to handle the request; see its log"
        request_id = f"{random.getrandbits(128):032x}"
        body = json.dumps({"message": message or reason, "request_id": request_id, "status": status}).encode()
        head = (
            f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nX-Request-Id: {request_id}\r\n\r\n"
        )
        with contextlib.suppress(OSError):
            gunicorn.util.write_nonblock(client, head.encode("latin-1") + body)

    def enqueue_req(self, conn: Any) -> None:
        """Note when the connection was accepted, or became readable again, before it waits for a thread."""
        conn.arrived = time.monotonic()
        super().enqueue_req(conn)

    def handle_request(self, req: Any, conn: Any) -> Any:
        _arrivals.at = getattr(conn, "arrived", None)
        try:
            return super().handle_request(req, conn)
        finally:
            state = self.wsgi.worker
            if not self.alive and self.max_requests and self.nr >= self.max_requests and state is not None:
                state.note_exit("max-requests")  # gunicorn counts --max-requests itself, then exits

    def run(self) -> None:
        """gunicorn's loop; once its graceful period is over, a request still running (its hooks stuck past the
        deadline: they run on the server's threads) would keep the process alive for ever, its thread joined at
        exit. The worker exits then, as a SIGKILL would, so that its connections close and its successor serves."""
        super().run()
        if self.nr_conns > 0:
            logger.warning("Worker %d: exiting with %d request(s) still running", self.pid, self.nr_conns)
            _logging.flush()
            os._exit(0)

    def handle_exit(self, sig: int, frame: Any) -> None:
        state = getattr(self.wsgi, "worker", None)
        if state is not None and not state.stop_requested():
            logger.info("Worker %d: SIGTERM from outside; it serves until the serving process stops it", self.pid)
            return
        super().handle_exit(sig, frame)


class _Request(gunicorn.http.message.Request):  # type: ignore[misc]
    """gunicorn's request, whose header section may not exceed ``--max-header-bytes`` in all (gunicorn's own bound
    is 100 times the size of one field, and it searches the whole buffer again after each read)."""

    limit = 65536

    @property
    def max_buffer_headers(self) -> int:
        return self.limit

    @max_buffer_headers.setter
    def max_buffer_headers(self, value: int) -> None:
        pass  # gunicorn's own bound, replaced by ours

    @property
    def _expected_100_continue(self) -> bool:
        return False  # the app sends 100 Continue itself, once it wants the body (never before a 413)

    @_expected_100_continue.setter
    def _expected_100_continue(self, value: bool) -> None:
        pass


def _close_here(conn: Any) -> None:
    """Close a connection that is not kept alive on this request's thread, not on the worker's event loop.

    gunicorn 27 closes such a connection gracefully (RFC 9112 9.6: send FIN, then read what the client still sends,
    up to 2 s, until it closes) from its one event-loop thread: a client that stopped reading, or never closes, held
    the whole worker 2 s per connection (12 such clients: /ping unanswered for 20 s). Closed here, the event loop's
    own close finds nothing left to do."""
    conn.close(graceful=True)
    conn.close = _closed


def _closed(graceful: bool = False) -> None:
    """A connection's ``close`` once :func:`_close_here` has closed it."""


#: When the request being handled on this thread reached the worker (see ``Worker.enqueue_req``).
_arrivals = threading.local()


def _arrival(environ: Any) -> float | None:
    return getattr(_arrivals, "at", None)


def _send_continue(environ: Any) -> None:
    """``100 Continue`` on the client's socket, before the app reads the body it announced."""
    with contextlib.suppress(OSError):
        environ["gunicorn.socket"].sendall(b"HTTP/1.1 100 Continue\r\n\r\n")


def _end_the_read(environ: Any) -> None:
    """End a body read blocked on the client's socket (``recv`` returns 0): the client is answered 408."""
    with contextlib.suppress(OSError, KeyError):
        environ["gunicorn.socket"].shutdown(socket.SHUT_RD)


#: gunicorn bounds the head too (``_Request``); the Host checks are the point of ``check_head``.
BACKEND = Backend(
    check_head=True,
    body=Reading(send_continue=_send_continue, client_errors=(gunicorn.http.errors.NoMoreData,), abort=_end_the_read),
    arrival=_arrival,
)


class _Logger(glogging.Logger):  # type: ignore[misc]
    """gunicorn's logger without its access line: the app writes one per request (``_logging.access``), and
    gunicorn would build its own (about 18 us per request) only to drop it."""

    def access(self, resp: Any, req: Any, environ: Any, request_time: Any) -> None:
        return None


class _Captured:
    """A stand-in for a client socket that keeps what gunicorn writes to it."""

    def __init__(self) -> None:
        self.data = bytearray()

    def gettimeout(self) -> float:
        return 0.0

    def sendall(self, data: bytes) -> None:
        self.data += data


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
            "threads": server_threads(settings) + SLOW_CLIENT_THREADS,
            "worker_connections": WORKER_CONNECTIONS,  # above the threads, or gunicorn turns keep-alive off
            # the heartbeat: a worker whose main loop is frozen (a hook holding the GIL) is killed and replaced
            "timeout": settings.timeout + 30 if settings.timeout else 0,
            "graceful_timeout": settings.graceful_timeout,
            "keepalive": KEEPALIVE,
            "max_requests": settings.max_requests,
            "max_requests_jitter": settings.max_requests_jitter,
            "limit_request_line": min(settings.max_header_bytes, 8190),
            "limit_request_field_size": settings.max_header_bytes,
            "loglevel": settings.log_level,
            "logger_class": _Logger,
            "logconfig_dict": _logging.dict_config(
                settings.log_level, ("gunicorn.error", "gunicorn.access"), _logging.resolve_format(settings.log_format)
            ),
            "proc_name": "inference-server",
            "post_worker_init": _post_worker_init,
            "child_exit": _child_exit,
            "control_socket_disable": True,  # one fixed path shared by every server on the machine
        }.items():
            self.cfg.set(key, value)

    def load(self) -> App:
        return self.app


def run(app: App) -> int:
    """Serve with gunicorn until SIGTERM; gunicorn's arbiter exits the process itself with the status."""
    _Request.limit = app.settings.max_header_bytes
    gunicorn.http.parser.RequestParser.mesg_class = _Request
    _Arbiter(GunicornServer(app)).run()
    return 0
