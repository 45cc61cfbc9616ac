"""One log format for our lines, the model's and the HTTP server backends' (granian's and gunicorn's), on stderr.

Two formats (``--log-format``): ``text`` for people at a terminal, and ``json``, one object per line, for the log
collectors of container platforms. A line logged while a request is handled carries the request's ids: the WSGI app
binds them to the request's context (:func:`bind`; the hooks' threads run in that context), and the formatters read
them when they format the line, in the thread that logged it (the standard handlers format at once). The access line
of a request (:func:`access`) carries its ids itself: it is written once the answer is sent, outside that context.

The access line is written on every request, so it skips what :meth:`logging.Logger.log` would spend finding the
caller's frame, and the JSON formatter writes with orjson and keeps each second's time stamp.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import logging
import multiprocessing.util
import os
import sys
import threading
import time
from typing import IO, Any, NamedTuple

import orjson

FORMAT = "%(asctime)s [%(process)d] [%(levelname)s] %(name)s: %(message)s"
#: Our logger: its lines (but the access lines of its child ``inference_server.access``) are written at once.
_OURS = "inference_server"
#: The backends' loggers named so write access lines of their own, which would repeat ours: only their warnings pass.
_BACKEND_ACCESS = ".access"


#: This process's id (``os.getpid()`` costs a system call on each line), kept current across forks.
_PID = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))


class RequestIds(NamedTuple):
    request_id: str
    inference_id: str | None


#: The request being handled in this context, ``(request ID, inference ID or None)``: its ids join the lines logged
#: while it is (model code's too). A plain tuple, set and reset by the app directly: it is set on every request.
REQUEST: contextvars.ContextVar[tuple[str, str | None] | None] = contextvars.ContextVar(
    "inference_server_request", default=None
)

access_logger = logging.getLogger("inference_server.access")


def bind(request_id: str, inference_id: str | None) -> contextvars.Token[tuple[str, str | None] | None]:
    """Lines logged in this context from now on belong to this request (until :func:`unbind`)."""
    return REQUEST.set((request_id, inference_id))


def unbind(token: contextvars.Token[tuple[str, str | None] | None]) -> None:
    REQUEST.reset(token)


def _ids(record: logging.LogRecord) -> tuple[str | None, str | None]:
    """The ids of the request ``record`` belongs to: its own (an access line's), else the context's."""
    fields = record.__dict__
    if "request_id" in fields:
        return fields["request_id"], fields.get("inference_id")
    bound = REQUEST.get()
    return (None, None) if bound is None else bound


class TextFormatter(logging.Formatter):
    """:data:`FORMAT`, and ``[request ID]`` (``[request ID, inference ID]``) after the message of a request's line."""

    def __init__(self, fmt: str = FORMAT, datefmt: str | None = None) -> None:
        super().__init__(fmt, datefmt)
        self._second = (-1, "")  # (a second since the epoch, its local time without the fraction)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        cached = self._second
        if cached[0] != second:
            cached = (second, time.strftime(self.default_time_format, self.converter(second)))
            self._second = cached
        return f"{cached[1]},{int(record.msecs):03d}"

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        request_id, inference_id = _ids(record)
        return _with_ids(line, request_id, inference_id)

    def access_line(self, level: int, created: float, message: str, ids: RequestIds, http: dict[str, Any]) -> str:
        """What :meth:`format` makes of an access line's record, made without one (:func:`access`)."""
        if self._fmt != FORMAT or self.datefmt is not None:
            raise _Unusual
        msecs = int((created - int(created)) * 1000)
        record_time = self.formatTime(_Created(created, msecs))  # type: ignore[arg-type]
        line = f"{record_time} [{_PID[0]}] [{logging.getLevelName(level)}] {access_logger.name}: {message}"
        return _with_ids(line, ids.request_id, ids.inference_id)


def _with_ids(line: str, request_id: str | None, inference_id: str | None) -> str:
    if request_id is None:
        return line
    if inference_id:
        return f"{line} [request {request_id}, inference {inference_id}]"
    return f"{line} [request {request_id}]"


class _Created(NamedTuple):
    """The two fields of a record that :meth:`TextFormatter.formatTime` reads."""

    created: float
    msecs: int


class _Unusual(Exception):
    """A formatter set up otherwise than ours are: the access line goes through a record after all."""


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (RFC 3339, UTC, milliseconds), ``level``, ``logger``, ``message``, ``pid``;
    ``request_id`` and ``inference_id`` on a request's lines; the HTTP fields on access lines; ``exc_info`` (the
    formatted traceback) and ``stack_info`` when the line has them."""

    def __init__(self) -> None:
        super().__init__()
        self._second = (-1, "")  # (a second since the epoch, its time stamp without the fraction)

    def _time(self, created: float) -> str:
        second = int(created)
        cached = self._second
        if cached[0] != second:
            cached = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
            self._second = cached  # one tuple, replaced whole: safe for threads without a lock
        return f"{cached[1]}.{int((created - second) * 1000):03d}Z"

    def access_line(self, level: int, created: float, message: str, ids: RequestIds, http: dict[str, Any]) -> str:
        """What :meth:`format` makes of an access line's record, made without one (:func:`access`)."""
        line: dict[str, Any] = {
            "time": self._time(created),
            "level": logging.getLevelName(level),
            "logger": access_logger.name,
            "message": message,
            "pid": _PID[0],
            "request_id": ids.request_id,
        }
        if ids.inference_id:
            line["inference_id"] = ids.inference_id
        line.update(http)
        return _dumps(line)

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": self._time(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        request_id, inference_id = _ids(record)
        if request_id is not None:
            line["request_id"] = request_id
            if inference_id:
                line["inference_id"] = inference_id
        http = record.__dict__.get("http")
        if http is not None:
            line.update(http)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exc_info"] = record.exc_text
        if record.stack_info:
            line["stack_info"] = self.formatStack(record.stack_info)
        return _dumps(line)


def _dumps(line: dict[str, Any]) -> str:
    try:
        return orjson.dumps(line).decode()
    except TypeError:  # a string that is not UTF-8 (a lone surrogate, from bytes decoded with surrogateescape)
        return orjson.dumps({key: _utf8(value) for key, value in line.items()}).decode()


def _utf8(value: Any) -> Any:
    return value.encode("utf-8", "backslashreplace").decode() if isinstance(value, str) else value


class Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler ``serve`` writes every line with (stderr), off the request path.

    A line is formatted on the thread that logs it (so it has that thread's request id) and handed to one writer
    thread per process, which writes what has gathered in one call: a request never waits for stderr to log at info
    or debug level (a write is a
    system call that lets other threads take the GIL, which a busy server then waits to get back: measured, an
    access line written on the request's thread cost 45% of small-request throughput). Lines keep their order;
    what is queued is written at exit (``flush``, called by :mod:`logging` at exit and by multiprocessing's
    finalizers in forked workers). :func:`access` hands its line straight to :meth:`put` while this handler is the
    only one on the way (no record made).
    """

    #: Seconds the writer lets lines gather before it writes them (warnings and errors are written at once).
    GATHER = 0.02

    def __init__(self, stream: IO[str] | None = None, background: bool = True) -> None:
        super().__init__(stream)
        #: Hand lines to the writer thread (``serve``); False: write each before returning (the other commands).
        self.background = background
        self._lines: collections.deque[str] = collections.deque()
        self._wake = threading.Event()
        self._writer_pid = 0
        self._start_lock = threading.Lock()
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        """In a forked child: the parent writes what it queued; this process starts its own writer."""
        self._lines = collections.deque()
        self._wake = threading.Event()
        self._writer_pid = 0
        self._start_lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        """Queue the record's line; a warning or worse, and the server's own lines (logger ``inference_server``: rare,
        and read by whoever watches it start or stop), are written before this returns, with what was queued before
        them, in order. What stays queued for up to :attr:`GATHER` s: access lines, and the model's own info and
        debug lines."""
        try:
            line = self.format(record)
        except Exception:
            self.handleError(record)
            return
        self.put(line)
        if record.levelno >= logging.WARNING or not self.background or record.name == _OURS:
            self.flush()

    def put(self, line: str) -> None:
        """Queue ``line`` for the writer thread."""
        self._lines.append(line + self.terminator)
        if not self.background:
            self.flush()
            return
        if self._writer_pid != _PID[0]:
            self._start_writer()
        if not self._wake.is_set():
            self._wake.set()

    def _start_writer(self) -> None:
        with self._start_lock:
            if self._writer_pid == os.getpid():
                return
            self._writer_pid = os.getpid()
            threading.Thread(target=self._write_forever, name="log-writer", daemon=True).start()
            multiprocessing.util.Finalize(self, self.flush, exitpriority=0)  # forked workers leave by os._exit

    def _write_forever(self) -> None:
        while True:
            self._wake.wait()
            time.sleep(self.GATHER)  # a busy server's lines go out together: one wake-up and one write per GATHER s
            self._wake.clear()
            self.flush()

    def flush(self) -> None:
        """Write every queued line now (lines are taken from the queue only with the lock held, so that whoever
        flushes writes them in order, and none is still on its way when this returns)."""
        with self.lock:  # type: ignore[union-attr]
            lines = self._lines
            if not lines:
                with contextlib.suppress(Exception):
                    self.stream.flush()
                return
            batch = "".join([lines.popleft() for _ in range(len(lines))])
            try:
                self.stream.write(batch)
                self.stream.flush()
            except Exception as exc:  # a closed or full stream: say so on stderr, as logging does, and go on
                if logging.raiseExceptions and sys.stderr is not None and sys.stderr is not self.stream:
                    sys.stderr.write(f"--- Logging error: {exc!r}\n")


def flush() -> None:
    """Write what the handlers hold now: before ``os._exit``, or before writing on stderr directly."""
    loggers = [logging.root, *(logger for logger in logging.root.manager.loggerDict.values())]
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):
            with contextlib.suppress(Exception):
                handler.flush()


#: ``--log-format`` -> the formatter that writes it.
FORMATTERS: dict[str, type[logging.Formatter]] = {"text": TextFormatter, "json": JsonFormatter}


def resolve_format(setting: str | None) -> str:
    """The log format: ``setting`` if given, else ``text`` when stderr is a terminal and ``json`` when it is not."""
    if setting is not None:
        return setting
    isatty = getattr(sys.stderr, "isatty", None)
    try:
        return "text" if isatty is not None and isatty() else "json"
    except ValueError:  # stderr closed
        return "json"


def formatter(fmt: str) -> logging.Formatter:
    """A formatter writing ``fmt`` (``text`` or ``json``)."""
    return FORMATTERS[fmt]()


def configure(level: int, fmt: str = "text", stream: IO[str] | None = None, background: bool = False) -> None:
    """Log every line (ours, the model's) in ``fmt`` on ``stream`` (stderr) at ``level``, unless logging is configured
    already; ``background``: through the writer thread (:class:`Handler`), as ``serve`` does.

    With ``json``, Python's warnings are logged too (logger ``py.warnings``): stderr then holds JSON lines only.
    """
    handler = Handler(sys.stderr if stream is None else stream, background)
    handler.setFormatter(formatter(fmt))
    logging.basicConfig(level=level, handlers=[handler])
    if fmt == "json":
        logging.captureWarnings(True)


def dict_config(level: str, loggers: tuple[str, ...], fmt: str = "text") -> dict[str, Any]:
    """A :func:`logging.config.dictConfig` that writes every line in ``fmt`` on stderr at ``level``: the backend's
    ``loggers`` and the root logger's (ours, the model's).

    The backends apply it in every worker they start too. The backends' access loggers only pass warnings: the app
    writes one access line per request itself (:func:`access`), and gunicorn would write a second.
    """
    level = level.upper()
    quieter = level if logging.getLevelName(level) >= logging.WARNING else "WARNING"
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"inference_server": {"()": FORMATTERS[fmt]}},
        "handlers": {
            "inference_server": {
                "class": f"{__name__}.Handler",
                "formatter": "inference_server",
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"handlers": ["inference_server"], "level": level},
        "loggers": {
            name: {
                "handlers": ["inference_server"],
                "level": quieter if name.endswith(_BACKEND_ACCESS) else level,
                "propagate": False,
            }
            for name in loggers
        },
    }


#: The message of an access line: method, path, status, duration, bytes received and sent.
_ACCESS = '"%s %s" %d %.1f ms, %d B in, %d B out'


def access(
    *,
    method: str,
    path: str,
    route: str,
    status: int,
    seconds: float,
    request_bytes: int,
    response_bytes: int,
    request_id: str,
    inference_id: str | None,
    quiet: bool,
    model: str = "",
    target_model: str | None = None,
) -> None:
    """The access-log line of one request (at debug level when ``quiet``); ``model``: the model of a multi-model
    endpoint it invoked (by name, or by SageMaker Runtime's ``TargetModel``); ``target_model``: the request's
    ``X-Amzn-SageMaker-Target-Model`` header."""
    level = logging.DEBUG if quiet else logging.INFO
    if not access_logger.isEnabledFor(level):
        return
    duration_ms = seconds * 1000
    http = {
        "method": method,
        "path": path,
        "route": route,
        "status": status,
        "duration_ms": round(duration_ms, 3),
        "request_bytes": request_bytes,
        "response_bytes": response_bytes,
    }
    if model:
        http["model"] = model
    if target_model:  # SageMaker's original TargetModel, which a multi-model endpoint's model name need not be
        http["target_model"] = target_model
    handler = _only_handler(level)
    if handler is not None:
        message = _ACCESS % (method, path, status, duration_ms, request_bytes, response_bytes)
        try:
            line = handler.formatter.access_line(  # type: ignore[union-attr]
                level, time.time(), message, RequestIds(request_id, inference_id), http
            )
        except _Unusual:  # a formatter set up otherwise: the standard way
            pass
        else:
            handler.put(line)
            return
    record = access_logger.makeRecord(
        access_logger.name,
        level,
        "",
        0,
        _ACCESS,
        (method, path, status, duration_ms, request_bytes, response_bytes),
        None,
    )
    record.request_id = request_id
    record.inference_id = inference_id
    record.http = http
    access_logger.handle(record)


def _only_handler(level: int) -> Handler | None:
    """Our :class:`Handler` on the root logger, when an access line at ``level`` would reach it and nothing else:
    no other handler, filter or logger on the way (as ``serve`` configures logging, until the user changes it)."""
    root = logging.root
    handlers = root.handlers
    if len(handlers) != 1 or root.filters:
        return None
    handler = handlers[0]
    if type(handler) is not Handler or handler.filters or level < handler.level:
        return None
    logger = access_logger
    while logger is not root:
        if logger.handlers or logger.filters or not logger.propagate:
            return None
        logger = logger.parent  # type: ignore[assignment]
    if type(handler.formatter) not in (TextFormatter, JsonFormatter):
        return None
    return handler
