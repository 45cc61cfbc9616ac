"""The gunicorn backend: its threaded worker, with the drain and worker recycling of :mod:`inference_server.server`.

What of gunicorn is subclassed or replaced (tested with gunicorn 27):

- the arbiter, for the drain: ``handle_term``, ``handle_int``, ``wait_for_signals``, ``manage_workers``,
  ``kill_worker``, ``stop``, ``kill_workers``, ``WORKERS``;
- the threaded worker: ``handle_exit`` (SIGTERM), ``handle`` (socket timeouts), ``handle_error`` (error bodies,
  rewriting the page ``gunicorn.util.write_error`` writes), ``enqueue_req`` and ``handle_request`` (when a request
  arrived, so that one waiting for a thread when a drain begins is answered); ``accept``,
  ``on_client_socket_readable``, ``finish_request`` and ``murder_pending``, so that a request's head is read on the
  worker's event loop, not on a thread (gunicorn gives a connection a thread as soon as a byte arrives: 2,000 slow
  clients held all 1,025), handed over through ``TConn.data_ready`` and the parser's ``unreader``;
- the request class, installed as ``RequestParser.mesg_class``: ``max_buffer_headers`` (the whole header section
  bounded), ``_expected_100_continue`` (``100 Continue`` left to the app) and ``set_body_reader`` (a
  ``ChunkedReader`` whose ``parse_chunk_size`` refuses at once what gunicorn's waits on);
- ``post_worker_init`` loads the model while telling the arbiter the worker is alive.
"""

from __future__ import annotations

import contextlib
import errno
import html
import http
import json
import logging
import os
import random
import re
import selectors
import signal
import socket
import struct
import threading
import time
from functools import partial
from typing import Any

import gunicorn.http.body
import gunicorn.http.errors
import gunicorn.http.message
import gunicorn.http.parser
import gunicorn.util
from gunicorn import glogging
from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter
from gunicorn.errors import HaltServer
from gunicorn.workers.gthread import STOP_KEEPALIVE_LINGER, TConn, ThreadWorker

from inference_server import _logging
from inference_server.server import KEEPALIVE, SLOW_CLIENT_THREADS, _drain, _state, load_model, server_threads
from inference_server.wsgi._app import App, Backend
from inference_server.wsgi._body import Reading, unsupported_coding

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
    if app.worker is not None and app.worker.stop_requested():  # (its SIGTERM came before its handlers: lost)
        logger.info("Worker %d: stopped as it started", os.getpid())
        worker.alive = False
        return
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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Connections whose head is being read on the event loop, in the order their deadlines fall.
        self.heading: dict[Any, float] = {}
        self.stopping_since: float | None = None

    def accept(self, listener: Any) -> None:
        """A new connection: its head is read on the event loop (see :meth:`read_head`), not on a thread."""
        try:
            sock, address = listener.accept()
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        self.start_head(TConn(self.cfg, sock, address, listener.getsockname()), b"")  # (TConn: non-blocking)

    def on_client_socket_readable(self, conn: Any, client: Any) -> None:
        """A kept-alive connection's next request begins: its head too is read on the event loop."""
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        self.start_head(conn, b"")

    def finish_request(self, conn: Any, fs: Any) -> None:
        """gunicorn's, except that a kept-alive connection that already holds the beginning of its next request
        (pipelined) but not the whole head reads the rest on the event loop too."""
        if self.alive and not fs.cancelled() and fs.exception() is None and fs.result() is True:
            buffered = conn.parser.unreader.take_buffered()
            if buffered and _head_state(buffered, _Request.limit) is None:
                conn.sock.setblocking(False)
                self.start_head(conn, buffered)
                return
            conn.parser.unreader.unread(buffered)
        super().finish_request(conn, fs)

    def start_head(self, conn: Any, data: bytes) -> None:
        """Read a request's head on the event loop until it is whole (or refused), then hand the connection to a
        thread. A slow client (one header byte a second: slowloris) holds a socket, not one of the threads, and
        its head must be whole within ``max(--read-timeout, keep-alive)`` seconds, as on granian."""
        conn.head, conn.head_scanned, conn.head_error = bytearray(data), 0, None
        self.heading[conn] = time.monotonic() + max(self.wsgi.settings.read_timeout, KEEPALIVE)
        self.read_head(conn, None)  # (usually there already: no round through the poller)
        if conn in self.heading:
            self.poller.register(conn.sock, selectors.EVENT_READ, partial(self.read_head, conn))

    def read_head(self, conn: Any, client: Any) -> None:
        """What the client sent of its head so far; a whole head (or one that can only be refused) goes to a
        thread, with what followed it."""
        try:
            data = conn.sock.recv(_HEAD_READ)
        except (BlockingIOError, InterruptedError):
            data = None
        except OSError:
            data = b""
        if data == b"":  # the client left
            self.drop_head(conn)
            return
        conn.head += data or b""
        state = _head_state(conn.head, _Request.limit, conn.head_scanned)
        conn.head_scanned = max(0, len(conn.head) - 3)
        if state is None:
            return
        if isinstance(state, Exception):
            conn.head_error = state
        del self.heading[conn]
        if client is not None:
            self.poller.unregister(conn.sock)
        conn.data_ready = True  # (gunicorn then does not wait for the socket to be readable)
        self.enqueue_req(conn)

    def drop_head(self, conn: Any) -> None:
        """Close a connection whose client left, or whose head did not arrive in time, before it was served."""
        with contextlib.suppress(OSError, KeyError, ValueError):
            self.poller.unregister(conn.sock)
        self.heading.pop(conn, None)
        self.nr_conns -= 1
        conn.close()

    def murder_pending(self) -> None:
        """gunicorn's, and the connections whose head did not arrive in time (all of them within 2 s of the
        worker's stop, as gunicorn does with kept-alive ones)."""
        super().murder_pending()
        now = time.monotonic()
        if not self.alive and self.stopping_since is None:
            self.stopping_since = now
        stopped = self.stopping_since is not None and now - self.stopping_since >= STOP_KEEPALIVE_LINGER
        for conn, deadline in list(self.heading.items()):
            if deadline > now and not stopped:
                break
            self.drop_head(conn)

    def handle(self, conn: Any) -> Any:
        """Serve a connection whose client cannot hold a thread forever by not reading (or not sending).

        ``SO_SNDTIMEO`` / ``SO_RCVTIMEO`` of ``--read-timeout``: a send or a receive that makes no progress for that
        long fails and gunicorn closes the connection; a client that reads slowly but steadily is not cut off.
        ``TCP_USER_TIMEOUT`` of the same: an answer that fits in the socket's buffers is sent whole at once, and
        the connection kept alive; the kernel drops it once its data has gone unacknowledged (the client's window
        full) for that long, as on granian.
        """
        if not getattr(conn, "timeouts_set", False):
            seconds = self.wsgi.settings.read_timeout
            timeval = struct.pack("ll", seconds, 0)
            with contextlib.suppress(OSError):
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
                if hasattr(socket, "TCP_USER_TIMEOUT"):  # (Linux)
                    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, seconds * 1000)
            conn.timeouts_set = True
        head = getattr(conn, "head", None)
        if head is not None:  # read on the event loop: the parser reads it first
            conn.head = None
            conn.sock.setblocking(True)
            conn.init()
            conn.parser.unreader.unread(bytes(head))
            if conn.head_error is not None:
                self.handle_error(None, conn.sock, conn.client, conn.head_error)
                _close_here(conn)
                return False
        keepalive = super().handle(conn)
        if keepalive is False:
            _close_here(conn)
        return keepalive

    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        """gunicorn's own refusals (a request it cannot parse, headers over the limits) in our JSON error shape.

        gunicorn decides the status and logs as usual; its HTML page is captured and rewritten. The refusals of
        this module (:class:`_Refused`), and a transfer coding gunicorn does not know (its 501, whose page blamed
        the server), say what was wrong with the request themselves.
        """
        if isinstance(exc, _ChunkRefused):
            exc = _Refused(exc.status, exc.message)
        elif isinstance(exc, gunicorn.http.errors.UnsupportedTransferCoding):
            exc = _Refused(400, unsupported_coding(exc.hdr))
        elif isinstance(exc, gunicorn.http.errors.InvalidHeader) and exc.hdr == "TRANSFER-ENCODING" and exc.req:
            codings = ", ".join(value for name, value in exc.req.headers if name == "TRANSFER-ENCODING")
            exc = _Refused(400, unsupported_coding(codings))
        if isinstance(exc, _Refused):
            self.log.warning("Invalid request from ip=%s: %s", (addr or ("",))[0], exc.message)
            _write_error(client, exc.status, exc.message)
            return
        page = _Captured()
        super().handle_error(req, page, addr, exc)
        head, _, html_page = bytes(page.data).decode("latin-1").partition("\r\n\r\n")
        parts = head.split(" ", 2)
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 500
        found = re.search(r"</h1>(.*)</body>", html_page, re.S)
        message = html.unescape(found.group(1)).strip() if found else ""
        if status >= 500:
            message = "the server failed to handle the request; see its log"
        _write_error(client, status, message)

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
        """gunicorn's loop; once it ends (its requests answered, or its graceful period over), a request still
        running or a hook still running on a model thread (stuck past its deadline, its request answered 504) would
        keep the process alive for ever, its thread joined at exit. The worker exits then, as a SIGKILL would, so
        that its connections close and its successor serves."""
        super().run()
        running = self.wsgi.loop_lifecycle.busy
        if self.nr_conns > 0 or running:
            logger.warning(
                "Worker %d: exiting with %d request(s) and %d model call(s) still running",
                self.pid,
                self.nr_conns,
                running,
            )
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

    def set_body_reader(self) -> None:
        super().set_body_reader()
        if isinstance(self.body.reader, gunicorn.http.body.ChunkedReader):
            self.body.reader = _ChunkedReader(self, self.unreader)


class _ChunkedReader(gunicorn.http.body.ChunkedReader):  # type: ignore[misc]
    """gunicorn's chunked body reader, which refuses at once what it would otherwise wait on until the read timeout
    (a 408 after ``--read-timeout``): a chunk size line ended by a bare LF (it waits for a CRLF that never comes),
    and a chunk size larger than any body can be (``2**80``: it waits for the data)."""

    #: The largest body accepted (``MaxPayloadInMB``), set by :func:`run`; None: no limit.
    limit: int | None = None

    def parse_chunk_size(self, unreader: Any, data: bytes | None = None) -> tuple[int, bytes | None]:
        buf = bytearray(data) if data else bytearray()
        searched = 0
        while (end := buf.find(b"\r\n", searched)) < 0 and len(buf) <= self.limit_chunk_size_line:
            if b"\n" in buf:
                break
            searched = max(0, len(buf) - 1)
            self.read_into(unreader, buf)
        if b"\n" in (buf if end < 0 else buf[:end]):
            raise _ChunkRefused("a chunk size line ends in a bare LF; chunked framing ends each line with CRLF")
        digits = bytes(buf[: max(end, 0)]).split(b";", 1)[0].rstrip(b" \t").lstrip(b"0")
        if len(digits) >= 16 and _HEX.fullmatch(digits) and int(digits, 16) >= 1 << 63:
            raise _ChunkRefused(
                f"chunk size 0x{digits[:40].decode('latin-1')} is larger than any body can be (2**63 - 1 bytes)"
            )
        size, rest = super().parse_chunk_size(unreader, bytes(buf))
        if self.limit is not None and size > self.limit:
            raise _ChunkRefused(
                f"a chunk of {size} bytes is larger than the whole body may be: the limit (MaxPayloadInMB) is "
                f"{self.limit} bytes",
                413,
            )
        return size, rest


class _ChunkRefused(gunicorn.http.errors.InvalidChunkSize):  # type: ignore[misc]
    """A chunk size refused by :class:`_ChunkedReader`: 400, or 413 for one larger than the body limit."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message.encode())
        self.message, self.status = message, status

    def __str__(self) -> str:
        return self.message


class _Refused(Exception):
    """A request refused before the app sees it, with the status and the message its answer gives."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


#: Bytes read from a client's socket at once while its head arrives.
_HEAD_READ = 65536
_BARE_LF = re.compile(rb"(?<!\r)\n")
_HEX = re.compile(rb"[0-9A-Fa-f]+")


def _head_state(data: bytes | bytearray, limit: int, scanned: int = 0) -> bool | _Refused | None:
    """Whether ``data``, the beginning of a request, holds its whole head: None while it does not (and still may),
    True once it does, a :class:`_Refused` once it can only be refused: a head of more than ``limit`` bytes (the
    request line, the header lines and the empty line that ends them: 431) or one with a line that ends in a
    bare LF (400, RFC 9112 section 2.2). ``scanned``: how much of ``data`` was looked at already."""
    start = 2 if data[:2] == b"\r\n" else 0  # one empty line before the request line is allowed (RFC 9112 2.2)
    end = data.find(b"\r\n\r\n", max(start, scanned))
    stop = len(data) if end < 0 else end + 4
    if _BARE_LF.search(data, max(start, scanned - 1), stop):
        return _Refused(400, "a line of the request's head ends in a bare LF; HTTP/1.1 ends each line with CRLF")
    if stop - start > limit or (end < 0 and stop - start >= limit):
        return _Refused(431, f"the request line and headers are larger than {limit} bytes (--max-header-bytes)")
    return None if end < 0 else True


def _write_error(client: Any, status: int, message: str) -> None:
    """Our JSON error answer, written to a client's socket before the app saw the request (the connection closes)."""
    reason = _REASONS.get(status, "Error")
    request_id = f"{random.getrandbits(128):032x}"
    body = json.dumps({"message": message or reason, "request_id": request_id, "status": status}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nX-Request-Id: {request_id}\r\n\r\n"
    )
    with contextlib.suppress(OSError):
        gunicorn.util.write_nonblock(client, head.encode("latin-1") + body)


_REASONS = {status.value: status.phrase for status in http.HTTPStatus}


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
    on_loop=True,
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
    _ChunkedReader.limit = app.pipeline.max_body
    gunicorn.http.parser.RequestParser.mesg_class = _Request
    _Arbiter(GunicornServer(app)).run()
    return 0
